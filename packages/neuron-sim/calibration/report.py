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
    s = stats(results, tolerance)
    rows = ["| case | hardware | statistic | published (us) | simulated (us) | ratio | bound | DMA GB/s |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r.case.measurement
        flag = "" if m.kind == "measured" else " (threshold)"
        rows.append(f"| {r.case.id} | {m.hardware} | {m.statistic}{flag} | {m.value_us:.2f} | {r.simulated_us:.2f} | "
                    f"{r.ratio:.3f} | {r.bound} | {r.dma_gbps:.1f} |")
    fam = ["| family | order | published slowest/fastest | simulated | error |", "|---|---|---|---|---|"]
    for name, rs in sorted(families(results).items()):
        c = family_check(rs)
        fam.append(f"| {name} | {'same' if c['order_ok'] else 'differs'} | {c['published_spread']:.2f}x | "
                   f"{c['simulated_spread']:.2f}x | {100 * c['spread_error']:+.1f}% |")
    skip = [f"- {c.id}: {c.differs}" for c in skipped]
    return "\n".join([
        f"{s['within']} of {s['cases']} measured cases within +-{100 * tolerance:.0f}%, median absolute error "
        f"{100 * s['median_abs_error']:.1f}%.", "", *rows, "", *fam, "",
        *(["Not expressible in the kernel language:", *skip, ""] if skip else [])])


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
