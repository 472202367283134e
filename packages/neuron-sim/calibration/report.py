"""Lines, family comparisons and the fidelity table of a calibration run."""

from __future__ import annotations

import statistics
from collections import defaultdict

from .suite import Result


def line(r: Result) -> str:
    m = r.case.measurement
    return (f"calibrate {r.case.id} [{m.hardware}, {m.statistic}{', bound' if m.kind == 'threshold' else ''}]: "
            f"published {m.value_us:.2f} us, simulated {r.simulated_us:.2f} us, ratio {r.ratio:.3f}; "
            f"bound {r.bound}, DMA {r.dma_gbps:.1f} GB/s")


def families(results: list[Result]) -> dict[str, list[Result]]:
    out = defaultdict(list)
    for r in results:
        if r.case.measurement.kind == "measured":
            out[r.case.family].append(r)
    return {f: rs for f, rs in out.items() if len(rs) > 1}


def family_check(rs: list[Result]) -> dict:
    """Order of the variants (slowest first) published vs simulated, and the slowest/fastest ratios."""
    pub = sorted(rs, key=lambda r: -r.case.measurement.value_us)
    sim = sorted(rs, key=lambda r: -r.simulated_us)
    pub_spread = pub[0].case.measurement.value_us / pub[-1].case.measurement.value_us
    sim_spread = rs_max(rs) / rs_min(rs)
    return {"order_ok": [r.case.name for r in pub] == [r.case.name for r in sim],
            "published_order": [r.case.name for r in pub], "simulated_order": [r.case.name for r in sim],
            "published_spread": pub_spread, "simulated_spread": sim_spread,
            "spread_error": sim_spread / pub_spread - 1.0}


def rs_max(rs):
    return max(r.simulated_us for r in rs)


def rs_min(rs):
    return min(r.simulated_us for r in rs)


def stats(results: list[Result], tolerance: float) -> dict:
    measured = [r for r in results if r.case.measurement.kind == "measured"]
    errs = [abs(r.error) for r in measured]
    bounds = [r for r in results if r.case.measurement.kind == "threshold"]
    return {"cases": len(measured), "within": sum(e <= tolerance for e in errs),
            "median_abs_error": statistics.median(errs) if errs else float("nan"),
            "thresholds": len(bounds), "thresholds_met": sum(r.ratio <= 1.0 for r in bounds)}


def summary(results: list[Result], skipped, tolerance: float) -> list[str]:
    out = []
    for fam, rs in sorted(families(results).items()):
        c = family_check(rs)
        out.append(f"family {fam}: order {'ok' if c['order_ok'] else 'WRONG'} "
                   f"(published {' > '.join(c['published_order'])}; simulated {' > '.join(c['simulated_order'])}), "
                   f"slowest/fastest published {c['published_spread']:.2f}x, simulated {c['simulated_spread']:.2f}x "
                   f"({100 * c['spread_error']:+.1f}%)")
    s = stats(results, tolerance)
    out.append(f"summary: {s['within']}/{s['cases']} measured cases within +-{100 * tolerance:.0f}%, "
               f"median absolute error {100 * s['median_abs_error']:.1f}%; "
               f"{s['thresholds_met']}/{s['thresholds']} test thresholds met; {len(skipped)} not expressible")
    return out


def markdown(results: list[Result], skipped, tolerance: float) -> str:
    """The fidelity table: the summary per hardware, every case, the families, the sources, what is not expressible."""
    s = stats(results, tolerance)
    out = [f"{s['within']} of {s['cases']} measured cases within +-{100 * tolerance:.0f}% of their published figure, "
           f"median absolute error {100 * s['median_abs_error']:.1f}%; {s['thresholds_met']} of {s['thresholds']} "
           f"test thresholds met; {len(skipped)} cases not expressible.", ""]
    out += ["| hardware | measured cases | within +-15% | median abs. error |", "|---|---|---|---|"]
    for hw in sorted({r.case.measurement.hardware for r in results}):
        h = stats([r for r in results if r.case.measurement.hardware == hw], tolerance)
        if h["cases"]:
            out.append(f"| {hw} | {h['cases']} | {h['within']} | {100 * h['median_abs_error']:.1f}% |")
    out += ["", "| case | hw | statistic | published (us) | simulated (us) | ratio | busiest | DMA GB/s |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r.case.measurement
        flag = "" if m.kind == "measured" else ", bound"
        out.append(f"| {r.case.id} | {m.hardware} | {m.statistic}{flag} | {m.value_us:.2f} | {r.simulated_us:.2f} | "
                   f"{r.ratio:.3f} | {r.bound} | {r.dma_gbps:.1f} |")
    out += ["", "| family | order | published slowest/fastest | simulated | error |", "|---|---|---|---|---|"]
    for name, rs in sorted(families(results).items()):
        c = family_check(rs)
        out.append(f"| {name} | {'same' if c['order_ok'] else 'differs'} | {c['published_spread']:.2f}x | "
                   f"{c['simulated_spread']:.2f}x | {100 * c['spread_error']:+.1f}% |")
    out += ["", "| family | hardware | source | published |", "|---|---|---|---|"]
    seen = {}
    for c in [r.case for r in results] + list(skipped):
        seen.setdefault(c.family, c)
    for fam, c in sorted(seen.items()):
        m = c.measurement
        out.append(f"| {fam} | {m.hardware} | {m.source} | {m.published} |")
    if skipped:
        out += ["", "Not expressible in the kernel language (reported, not timed):", ""]
        out += [f"- {c.id} ({c.measurement.value_us:.2f} us): {c.differs}" for c in skipped]
    return "\n".join(out)


BEGIN, END = "<!-- calibration table: begin (written by calibration/run.py) -->", "<!-- calibration table: end -->"


def write(path, table: str) -> None:
    """Put ``table`` between the markers of ``path`` (the rest of the document is kept), else append them."""
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    path.write_text(text)
