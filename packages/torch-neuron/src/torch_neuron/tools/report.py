"""A captured device timeline as one self-contained HTML file: inline CSS, an inline SVG timeline (one row per
track of each device: aten ops, ranges, every engine and DMA queue) with each slice's name and times on hover, a
little inline JS to zoom the timeline, and the per-engine and per-op tables. Nothing is fetched from the network.
"""

from __future__ import annotations

import html
from collections import defaultdict

from .summary import DeviceSummary

MAX_SLICES = 20000  # beyond this the longest slices are drawn (the tables count every one)
WIDTH, ROW, LABEL = 1400, 18, 110
COLORS = {"op": "#4e79a7", "range": "#59a14f", "tensor": "#e15759", "vector": "#f28e2b", "scalar": "#edc948",
          "gpsimd": "#b07aa1", "dma": "#76b7b2"}

CSS = """body{font:13px system-ui,sans-serif;margin:20px;color:#222}table{border-collapse:collapse;margin:8px 0 20px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}
svg{border:1px solid #ddd;background:#fff}text{font-size:11px}#wrap{overflow-x:auto}.note{color:#777}"""

JS = """document.querySelectorAll('button[data-zoom]').forEach(b=>b.onclick=()=>{const s=document.getElementById('tl');
const w=parseFloat(s.getAttribute('width'))*parseFloat(b.dataset.zoom);s.setAttribute('width',Math.max(400,w));});"""


def _tracks(trace: dict) -> tuple[list[tuple[int, int, str]], list[dict]]:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    keys = sorted({(e["pid"], e["tid"]) for e in slices}, key=lambda k: (k[0], -k[1] if k[1] >= 1000 else k[1]))
    return [(p, t, names.get((p, t), f"track {t}")) for p, t in keys], slices


def _color(e: dict, track: str) -> str:
    if e.get("cat") in ("op", "range"):
        return COLORS[e["cat"]]
    return COLORS.get(track, COLORS["dma"] if track.startswith("dma") else "#999")


def timeline_svg(trace: dict) -> tuple[str, int, int]:
    """The SVG, slices drawn, slices in the trace."""
    tracks, slices = _tracks(trace)
    if not slices:
        return "<p class='note'>no slices</p>", 0, 0
    t0 = min(e["ts"] for e in slices)
    span = max(e["ts"] + e["dur"] for e in slices) - t0 or 1.0
    row = {(p, t): i for i, (p, t, _) in enumerate(tracks)}
    drawn = sorted(slices, key=lambda e: -e["dur"])[:MAX_SLICES]
    scale = (WIDTH - LABEL) / span
    parts = [f'<svg id="tl" width="{WIDTH}" height="{ROW * len(tracks) + 20}" '
             f'viewBox="0 0 {WIDTH} {ROW * len(tracks) + 20}" preserveAspectRatio="none">']
    for i, (p, _, name) in enumerate(tracks):
        parts.append(f'<text x="2" y="{i * ROW + 13}">{html.escape(f"NC{p} {name}")}</text>')
    by_track = defaultdict(list)
    for e in drawn:
        by_track[(e["pid"], e["tid"])].append(e)
    for key, events in by_track.items():
        track = tracks[row[key]][2]
        for e in events:
            x = LABEL + (e["ts"] - t0) * scale
            tip = html.escape(f"{e['name']} {e['ts']:.3f}-{e['ts'] + e['dur']:.3f} us ({e['dur']:.3f} us)")
            parts.append(f'<rect x="{x:.2f}" y="{row[key] * ROW + 2}" width="{max(e["dur"] * scale, 0.5):.2f}" '
                         f'height="{ROW - 4}" fill="{_color(e, track)}"><title>{tip}</title></rect>')
    parts.append(f'<text x="{LABEL}" y="{ROW * len(tracks) + 15}">0 us</text>'
                 f'<text x="{WIDTH - 80}" y="{ROW * len(tracks) + 15}">{span:.1f} us</text></svg>')
    return "".join(parts), len(drawn), len(slices)


def _tables(summaries: list[DeviceSummary], top: int) -> str:
    out = []
    for d in summaries:
        out.append(f"<h2>NeuronCore {d.device}: {d.device_ns / 1e3:.2f} us device time, {d.programs} programs</h2>")
        rows = "".join(f"<tr><td>{html.escape(e)}</td><td>{ns / 1e3:.2f}</td><td>{d.utilization()[e]:.1%}</td>"
                       f"<td>{d.engine_instructions[e]}</td></tr>" for e, ns in d.engine_busy_ns.items())
        out.append("<table><tr><th>engine</th><th>busy us</th><th>utilization</th><th>instructions</th></tr>"
                   f"{rows}</table>")
        rows = "".join(f"<tr><td>{html.escape(op)}</td><td>{ns / 1e3:.2f}</td><td>{ns / (d.device_ns or 1):.1%}</td>"
                       f"<td>{n}</td></tr>" for op, (ns, n) in list(d.ops.items())[:top])
        out.append("<table><tr><th>op</th><th>device us</th><th>share</th><th>programs</th></tr>"
                   f"{rows}</table>")
    return "".join(out)


def html_report(trace: dict, summaries: list[DeviceSummary], title: str, top: int = 20) -> str:
    svg, drawn, total = timeline_svg(trace)
    note = "" if drawn == total else f" ({drawn} longest of {total} slices drawn)"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>device timeline{note}; hover a slice for its name and times. "
            "<button data-zoom='2'>zoom in</button> <button data-zoom='0.5'>zoom out</button></p>"
            f"<div id='wrap'>{svg}</div>{_tables(summaries, top)}<script>{JS}</script></body></html>")
