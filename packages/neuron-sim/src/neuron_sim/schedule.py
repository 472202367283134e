"""Instruction scheduling of a merged program: a compiled graph's kernels as one program.

Merged in launch order, each engine runs the kernels' instructions in launch order: an instruction waiting for
its data (a bias-gradient sum waiting for its load) holds back every later kernel's work on that engine and DMA
queue, though that work does not depend on it. As a graph compiler's scheduler does, the whole program is
reordered along its exact dependency graph (``prepare_timing(..., exact=True)``: every pair of accesses to
overlapping memory where one writes, an engine's own instructions included, nothing left to in-order
execution), so every order emitted here computes the same bytes as the launch order. Candidates: list
schedules by critical path (bottom level), with and without modelling the engines and queues as resources;
the timing model picks the fastest, the launch order included (never worse than merging alone).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass

import numba
import numpy as np

from neuron_hal.cache import cache_dir, sources_digest, write_atomic
from neuron_hal.profiles import Profile
from neuron_hal.program import Program

from . import costs
from .deps import successors
from .plan import ENGINE_NAMES, TimingPlan, TimingResult
from .timing import prepare_timing, run_timing

# The exact dependency pass keeps per-tensor state for every instruction (each its own stream): programs beyond
# this many (instructions x tensors) keep their launch order rather than take that memory (an implementation
# limit, not a hardware number; ~128 MB at the limit).
EXACT_STATE_MAX = 1 << 23


def schedule(program: Program, profile: Profile, key: str | None = None) -> tuple[Program, TimingPlan]:
    """The fastest of ``program`` and its list-scheduled reorderings, with its timing plan. ``key``: the program's
    content address; the chosen order and its timing are kept under it in the cache directory
    (``neuron_hal.cache``), so another process loading the same graph skips the search (and, through
    :func:`stored`, the program)."""
    path = _stored(key, profile)
    entry = _load(path, len(program.instructions))
    if entry is not None:
        return in_order(program, entry.order, profile)
    if len(program.instructions) * max(len(program.args), 1) > EXACT_STATE_MAX:
        best = (program, prepare_timing(program, profile), np.arange(len(program.instructions)))
    else:
        best = _search(program, profile)
    if path is not None:
        _save(path, best[2], run_timing(best[1]))
    return best[0], best[1]


def _search(program: Program, profile: Profile) -> tuple[Program, TimingPlan, np.ndarray]:
    plan = prepare_timing(program, profile, exact=True)
    best = (run_timing(plan).end_ns, program, plan, np.arange(plan.n))
    for order in candidate_orders(plan, profile):
        if _is_identity(order):
            continue
        candidate = reordered(program, order)
        candidate_plan = prepare_timing(candidate, profile)
        ns = run_timing(candidate_plan).end_ns
        if ns < best[0]:
            best = (ns, candidate, candidate_plan, order)
    return best[1:]


@dataclass(frozen=True)
class Stored:
    """What the cache keeps of a scheduled program: its instruction order and the timing of one run."""

    order: np.ndarray
    duration_ns: float
    engine_busy_ns: dict[str, float]
    engine_instructions: dict[str, int]
    dma_bytes: int

    def timing(self, start_ns: float) -> TimingResult:
        """The run starting at ``start_ns`` (timing is shift-invariant: see ``run_timing``)."""
        return TimingResult(float(start_ns), float(start_ns) + self.duration_ns, dict(self.engine_busy_ns),
                            dict(self.engine_instructions), self.dma_bytes)


def stored(key: str | None, profile: Profile, instructions: int) -> Stored | None:
    """The kept schedule and timing of the ``instructions``-long program with content address ``key``, if an
    earlier :func:`schedule` (in any process) kept them."""
    return _load(_stored(key, profile), instructions)


def in_order(program: Program, order: np.ndarray, profile: Profile) -> tuple[Program, TimingPlan]:
    """``program`` in a kept order (:attr:`Stored.order`), with its timing plan."""
    program = program if _is_identity(order) else reordered(program, order)
    return program, prepare_timing(program, profile)


def _is_identity(order: np.ndarray) -> bool:
    return bool(np.array_equal(order, np.arange(order.size)))


def _stored(key: str | None, profile: Profile):
    """Where the schedule of the program with content address ``key`` is kept (the scheduler's and the timing
    model's sources are part of the address: the choice and the timing depend on them), or None without a cache
    directory."""
    root = cache_dir()
    if key is None or root is None:
        return None
    code = sources_digest("neuron_hal", "neuron_sim")
    name = hashlib.sha256(repr((key, profile.fingerprint, code)).encode()).hexdigest()[:40]
    return root / "schedules" / f"{name}.npz"


_TRACKS = (*ENGINE_NAMES, "dma")  # the order of the stored per-engine figures


def _load(path, n: int) -> Stored | None:
    """A kept entry, if there is one, its order is a permutation of the program's ``n`` instructions and its
    figures are whole (a torn or foreign file is a miss: it is computed and written again)."""
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            order, figures, counts = f["order"], f["figures"], f["counts"]
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    if (order.shape != (n,) or order.dtype.kind != "i" or not np.array_equal(np.sort(order), np.arange(n))
            or figures.shape != (len(_TRACKS) + 1,) or counts.shape != (len(_TRACKS) + 1,)):
        return None
    return Stored(order.astype(np.int64), float(figures[0]), dict(zip(_TRACKS, map(float, figures[1:]))),
                  dict(zip(_TRACKS, map(int, counts[1:]))), int(counts[0]))


def _save(path, order: np.ndarray, timing: TimingResult) -> None:
    figures = [timing.device_ns, *(timing.engine_busy_ns[t] for t in _TRACKS)]
    counts = [timing.dma_bytes, *(timing.engine_instructions[t] for t in _TRACKS)]
    buf = io.BytesIO()
    np.savez(buf, order=np.asarray(order, np.int32), figures=np.array(figures, np.float64),
             counts=np.array(counts, np.int64))
    try:
        write_atomic(path, buf.getvalue())
    except OSError:  # a read-only or full cache directory costs the search again, nothing else
        pass


def candidate_orders(plan: TimingPlan, profile: Profile) -> list[np.ndarray]:
    """Orders of the instructions of a plan prepared with ``exact=True``, each keeping every dependency."""
    if plan.n < 2:
        return []
    succ_ptr, succ_idx, _ = successors(plan.n, *plan.exact)
    latency, occupancy = costs.dma_estimates(plan, profile)
    priority = _bottom_level(latency, succ_ptr, succ_idx)
    return [_by_priority(plan, priority, succ_ptr, succ_idx),
            _with_resources(plan, priority, latency, occupancy, succ_ptr, succ_idx)]


def reordered(program: Program, order) -> Program:
    return Program(program.name, program.args, tuple(program.instructions[i] for i in order), dict(program.meta))


@numba.njit(cache=True)
def _bottom_level(latency, succ_ptr, succ_idx):
    """Each instruction's longest latency path to the end of the program (itself included)."""
    level = latency.copy()
    for i in range(latency.size - 1, -1, -1):
        longest = 0.0
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            longest = max(longest, level[succ_idx[k]])
        level[i] += longest
    return level


def _by_priority(plan: TimingPlan, priority, succ_ptr, succ_idx) -> np.ndarray:
    """Topological order taking the ready instruction with the longest path to the end first (ties: program
    order)."""
    return _priority_order(np.diff(plan.exact[0]).astype(np.int64), priority, succ_ptr, succ_idx)


@numba.njit(cache=True)
def _priority_order(waiting, priority, succ_ptr, succ_idx):
    n = waiting.size
    heap = np.empty(n, np.int64)  # binary max-heap of ready instructions by (priority, -index)
    size = 0
    order = np.empty(n, np.int64)
    for i in range(n):
        if waiting[i] == 0:
            heap[size] = i
            size = _sift_up(heap, size, priority)
    for step in range(n):
        i = heap[0]
        order[step] = i
        size -= 1
        heap[0] = heap[size]
        _sift_down(heap, size, priority)
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            waiting[j] -= 1
            if waiting[j] == 0:
                heap[size] = j
                size = _sift_up(heap, size, priority)
    return order


@numba.njit(cache=True, inline="always")
def _before(a, b, priority):
    return priority[a] > priority[b] or (priority[a] == priority[b] and a < b)


@numba.njit(cache=True)
def _sift_up(heap, last, priority):
    """Restore the heap after heap[last] was added; returns the new size."""
    c = last
    while c > 0:
        parent = (c - 1) // 2
        if not _before(heap[c], heap[parent], priority):
            break
        heap[c], heap[parent] = heap[parent], heap[c]
        c = parent
    return last + 1


@numba.njit(cache=True)
def _sift_down(heap, size, priority):
    c = 0
    while True:
        best, left = c, 2 * c + 1
        if left < size and _before(heap[left], heap[best], priority):
            best = left
        if left + 1 < size and _before(heap[left + 1], heap[best], priority):
            best = left + 1
        if best == c:
            return
        heap[c], heap[best] = heap[best], heap[c]
        c = best


def _with_resources(plan: TimingPlan, priority, latency, occupancy, succ_ptr, succ_idx) -> np.ndarray:
    """List schedule over the engines and DMA queues: the stream that can start something soonest takes, among
    its instructions whose inputs are ready by then, the one with the longest path to the end. Emitted in
    order of start (ties: decision order), which keeps every dependency."""
    start, decided = _list_schedule(plan.stream.astype(np.int64), np.diff(plan.exact[0]).astype(np.int64),
                                    priority, latency, occupancy, succ_ptr, succ_idx)
    return np.lexsort((decided, start))


@numba.njit(cache=True)
def _list_schedule(stream, waiting, priority, latency, occupancy, succ_ptr, succ_idx):
    n = stream.size
    n_streams = stream.max() + 1
    cand = np.empty((n_streams, n), np.int64)  # each stream's instructions whose dependencies are scheduled
    count = np.zeros(n_streams, np.int64)
    for i in range(n):
        if waiting[i] == 0:
            cand[stream[i], count[stream[i]]] = i
            count[stream[i]] += 1
    ready_at = np.zeros(n)
    free = np.zeros(n_streams)
    start = np.zeros(n)
    decided = np.zeros(n, np.int64)
    for step in range(n):
        s, t = -1, np.inf  # the stream that can start an instruction soonest, and when
        for q in range(n_streams):
            if count[q]:
                first = np.inf
                for c in range(count[q]):
                    first = min(first, ready_at[cand[q, c]])
                if max(free[q], first) < t:
                    s, t = q, max(free[q], first)
        pick = -1  # its ready instruction with the longest path to the end (ties: program order)
        for c in range(count[s]):
            j = cand[s, c]
            if ready_at[j] <= t and (pick < 0 or priority[j] > priority[cand[s, pick]]
                                     or (priority[j] == priority[cand[s, pick]] and j < cand[s, pick])):
                pick = c
        i = cand[s, pick]
        count[s] -= 1
        cand[s, pick] = cand[s, count[s]]
        start[i], decided[i], free[s] = t, step, t + occupancy[i]
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            ready_at[j] = max(ready_at[j], t + latency[i])
            waiting[j] -= 1
            if waiting[j] == 0:
                cand[stream[j], count[stream[j]]] = j
                count[stream[j]] += 1
    return start, decided
