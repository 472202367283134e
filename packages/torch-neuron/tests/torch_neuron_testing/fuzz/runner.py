"""Driving hypothesis: one search over an op (or a whole family), counting verdicts, keeping the first case
of each CPU-wrong class and the shrunk, minimal case of each failure class.

A failure class is (op, kind, what failed: the error type and where it was raised, or the input dtype of a
mismatch). While a search shrinks a failure, cases failing in another class count as passing, so the
reproducer stays an example of the failure first seen; later searches (new seeds) count cases of an
already-recorded class without stopping on them, so they look for new classes.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException
from hypothesis.internal.conjecture import engine

from . import compare
from .known import known_defect
from .spec import Case, T, numel


class Found(AssertionError):
    """Raised inside a search on a failing case (hypothesis then shrinks it)."""


@dataclass
class Record:
    op: str
    case: Case
    verdict: compare.Verdict
    known: str | None = None  # the known, reported defect this is an instance of


@dataclass
class Stats:
    """Everything a run saw, per op."""

    counts: dict = field(default_factory=dict)  # op -> Counter of statuses
    failures: dict = field(default_factory=dict)  # class -> Record (minimal case)
    cpu_wrong: dict = field(default_factory=dict)  # class -> Record (smallest case seen)
    nearer: dict = field(default_factory=dict)  # class -> Record (smallest case seen): both off, the device nearer
    fallbacks: dict = field(default_factory=dict)  # op -> set of aten ops that took the CPU path
    excluded: Counter = field(default_factory=Counter)  # known defect -> cases not run (fast profile)

    def count(self, op: str, status: str) -> None:
        self.counts.setdefault(op, Counter())[status] += 1

    def note(self, op, case, v) -> None:
        """Keep the smallest case of each (op, dtype) the float64 arbiter vindicated the device in."""
        table = self.cpu_wrong if v.status == "cpu_wrong" else self.nearer
        key = (op.name, _first_dtype(case))
        old = table.get(key)
        if old is None or numel(case) < numel(old.case):
            table[key] = Record(op.name, case, v)


def _first_dtype(case: Case) -> str:
    for t in case.tensors:
        if isinstance(t, T):
            return str(t.dtype).removeprefix("torch.")
        if hasattr(t, "dtype"):
            return str(t.dtype).removeprefix("torch.")
    return ""


def failure_class(op, case: Case, v: compare.Verdict) -> tuple:
    what = v.detail.split(":", 1)[0] if v.kind != "mismatch" else _first_dtype(case)
    where = v.detail.rsplit("[", 1)[-1].rstrip("]") if v.detail.endswith("]") else ""
    return op.name, v.kind, what, where


def _search_settings(examples: int) -> settings:
    return settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
                    phases=(Phase.explicit, Phase.generate, Phase.shrink))


def pairs(ops, cap: int) -> st.SearchStrategy:
    """(op, case) draws: one op's cases, or any op of a list (simplest, first listed, first)."""
    if len(ops) == 1:
        return ops[0].strategy(cap).map(lambda c: (ops[0], c))
    return st.sampled_from(ops).flatmap(lambda op: op.strategy(cap).map(lambda c, op=op: (op, c)))


def search(ops, cap: int, examples: int, seed_value: int, stats: Stats, exclude: bool,
           shrink_seconds: float = 60) -> Record | None:
    """One hypothesis search of ``examples`` cases over ``ops``; returns the new failure class's minimal
    record, if one was found. ``exclude``: cases of a known defect are not run (the fast profile)."""
    state: dict = {"first": None, "last": None}

    def check(pair):
        op, case = pair
        defect = known_defect(op.name, case)
        if defect and exclude:
            if state["first"] is None:
                stats.excluded[defect] += 1
            return
        try:
            v = compare.run(op, case)
        except Exception as e:  # a defect of the fuzzer itself: reported as a class of its own, the run goes on
            v = compare.Verdict("fail", "harness", compare.describe(e))
        shrinking = state["first"] is not None
        if not shrinking:
            _tally(stats, op, case, v)
        if not v.failed:
            return
        cls = failure_class(op, case, v)
        if cls in stats.failures or (shrinking and cls != state["first"]):
            return  # a class already recorded, or another class while shrinking this one
        state["first"] = state["first"] or cls
        state["last"] = Record(op.name, case, v, defect)
        raise Found(f"{op.name}: {v.kind}: {v.detail}")

    test = seed(seed_value)(_search_settings(examples)(given(pairs(ops, cap))(check)))
    saved, engine.MAX_SHRINKING_SECONDS = engine.MAX_SHRINKING_SECONDS, shrink_seconds  # bounded shrinking
    try:
        test()
    except Found:
        pass
    except HypothesisException as e:  # a failure that did not replay (nondeterminism), or the search itself
        v = compare.Verdict("fail", "search", compare.describe(e))
        state["first"] = state["first"] or (ops[0].name if len(ops) == 1 else "family", "search", type(e).__name__, "")
        state["last"] = state["last"] or Record(ops[0].name, Case(()), v)
    finally:
        engine.MAX_SHRINKING_SECONDS = saved
    record = state["last"]
    if record is not None:
        stats.failures[state["first"]] = record
    return record


def _tally(stats: Stats, op, case: Case, v: compare.Verdict) -> None:
    stats.count(op.name, v.status)
    if v.fallbacks:
        stats.fallbacks.setdefault(op.name, set()).update(v.fallbacks)
    if v.status in ("cpu_wrong", "nearer"):
        stats.note(op, case, v)


def explore(op, cap: int, seconds: float, seed_value: int, stats: Stats, chunk: int = 10,
            min_examples: int = 10) -> None:
    """Searches of ``chunk`` cases with successive seeds until ``seconds`` have passed (at least
    ``min_examples`` cases)."""
    start, i = time.perf_counter(), 0
    while i * chunk < min_examples or time.perf_counter() - start < seconds:
        search([op], cap, chunk, seed_value * 1000003 + i, stats, exclude=False)
        i += 1


def replay(op, case: Case) -> compare.Verdict:
    """The verdict of one case (a reproducer from a report)."""
    return compare.run(op, case)

