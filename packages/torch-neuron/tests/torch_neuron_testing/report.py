"""Collecting the database tests' outcomes (across pytest workers) into summary lines and exclusions."""

from __future__ import annotations

from collections import Counter, defaultdict

from . import exclusions

PROPERTY = "neuron_db_outcome"


def record(record_property, section: str, key: str, status: str, reason: str, sample, samples: int,
           fallbacks, seconds: float) -> None:
    """Attach an outcome to the test's report (plain data, so it crosses pytest-xdist workers)."""
    record_property(PROPERTY, {"section": section, "key": key, "status": status, "reason": reason,
                               "sample": sample, "samples": samples, "fallbacks": sorted(fallbacks),
                               "seconds": round(seconds, 3)})


# Test functions of the databases and their sections; a test id is "<dtype>-<key>", its section
# "<db>.<dtype>" (see :func:`param_id`), so a test that left no outcome (a crashed worker) is still known.
DB_TESTS = {"test_op_db": "op_db", "test_module_db": "module_db", "test_optim_db": "optim_db"}
CRASH = "the test process crashed (e.g. a segmentation fault) while running it; run it alone to see where"


def param_id(dname: str, key: str) -> str:
    return f"{dname}-{key}"


def from_nodeid(nodeid: str) -> tuple[str, str] | None:
    """(section, key) of a database test's node id, or None for other tests."""
    name, _, param = nodeid.rpartition("::")[2].partition("[")
    if name not in DB_TESTS or not param.endswith("]"):
        return None
    dname, _, key = param[:-1].partition("-")
    return f"{DB_TESTS[name]}.{dname}", key


def crash_outcome(nodeid: str) -> dict | None:
    where = from_nodeid(nodeid)
    if where is None:
        return None
    return {"section": where[0], "key": where[1], "status": "fail", "reason": CRASH, "sample": None,
            "samples": 0, "fallbacks": [], "seconds": 0.0}


def outcomes(reports) -> list[dict]:
    seen = {}
    for rep in reports:
        for name, value in getattr(rep, "user_properties", ()):
            if name == PROPERTY:
                seen[(value["section"], value["key"])] = value
    return list(seen.values())


def summary(results: list[dict]) -> list[str]:
    """One line per section: ops passing all their samples, compared, native; then the aten ops whose
    fallback stops the most database entries from running natively."""
    by_section = defaultdict(list)
    for r in results:
        by_section[r["section"]].append(r)
    lines = []
    for section in sorted(by_section):
        rs = by_section[section]
        n = len(rs)
        st = Counter(r["status"] for r in rs)
        native = sum(1 for r in rs if not r["fallbacks"])
        compared = n - st["skip"]
        once = sum(1 for r in rs if r["status"] == "pass" and "rounded once" in r["reason"])
        rounded = f"{once} matching float32 rounded once rather than the CPU's bf16 steps, " if once else ""
        lines.append(f"{section}: {st['pass']}/{n} pass all samples run ({_pct(st['pass'], n)}; "
                     f"{st['pass']}/{compared} of those compared, {st['skip']} not comparable, {st['fail']} fail), "
                     f"native {native}/{n} ({_pct(native, n)}), {rounded}{sum(r['samples'] for r in rs)} samples, "
                     f"{sum(r['seconds'] for r in rs):.0f} s")
        missing = Counter(op for r in rs for op in r["fallbacks"])
        if missing:
            top = ", ".join(f"{op} ({k})" for op, k in missing.most_common(12))
            lines.append(f"  {section} fallbacks (aten op: entries affected): {top}")
    return lines


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def update(results: list[dict]):
    """Write the exclusions file from these outcomes; returns (entries before, after)."""
    table = defaultdict(dict)
    for r in results:
        failed = r["status"] == "fail"
        table[r["section"]][r["key"]] = exclusions.Known(r["reason"], r["sample"]) if failed else None
    return exclusions.write(table)


def run_entry(record_property, section: str, key: str, runner) -> None:
    """A database test: ``runner(extra)`` gives the Outcome (``extra``: sample indices to run besides the
    subsample, i.e. the failing sample an exclusion recorded); it is recorded, then settled."""
    known = exclusions.lookup(section, key)
    extra = (known.sample,) if known and known.sample is not None else ()
    out = runner(extra)
    record(record_property, section, key, out.status, out.reason, out.sample, out.samples, out.fallbacks, out.seconds)
    exclusions.settle(section, key, out.status, out.reason, known)
