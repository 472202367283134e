"""The timing half of the simulator: when each instruction of a program runs on a NeuronCore.

``prepare_timing`` encodes a program once (at load): what each instruction is and costs (:mod:`.encode`,
:mod:`.costs`) and what it waits for (:mod:`.deps`), into a :class:`~.plan.TimingPlan` of numpy arrays.
``run_timing`` replays the plan through the event loop (:mod:`.events`). The model is described in the
package README ("Timing model"); every hardware number comes from the :class:`~neuron_hal.Profile`.
"""

from __future__ import annotations

import gc

import numpy as np

from neuron_hal.profiles import Profile

from . import costs, events
from .deps import Geometry, successors
from .encode import encode
from .plan import N_COMPUTE, TimingPlan, TimingResult


def prepare_timing(program, profile: Profile, exact: bool = False) -> TimingPlan:
    """Encode ``program`` for :func:`run_timing` (once per program; the plan does not change between runs).
    ``exact``: also its full dependency graph (``TimingPlan.exact``)."""
    enabled = gc.isenabled()
    gc.disable()  # the encoder builds millions of short-lived objects with no cycles
    try:
        return _prepare(program, profile, exact)
    finally:
        if enabled:
            gc.enable()


def _prepare(program, profile: Profile, exact: bool) -> TimingPlan:
    enc = encode(program, profile)
    n = enc.n
    geometry = Geometry(program, profile, enc)
    pred_ptr, preds, producer = geometry.dependencies(enc.stream, enc.n_streams)
    # every instruction its own (DMA-like) stream: no edge is left to program order, none pruned by it
    full = geometry.dependencies(np.arange(N_COMPUTE, N_COMPUTE + n), N_COMPUTE + n)[:2] if exact else None

    cycles = costs.load_stationary(enc.cycles, enc.ls_cycles, enc.te, enc.te_mm, enc.te_key)
    dur_ns = costs.durations_ns(cycles, enc.engine, costs.act_table_loads(enc.engine, enc.act_func, profile), profile)

    succ_ptr, succ_idx, pred_count = successors(n, pred_ptr, preds)
    stream_counts = np.bincount(enc.stream, minlength=enc.n_streams)
    stream_ptr = np.concatenate(([0], np.cumsum(stream_counts))).astype(np.int64)
    stream_instr = np.argsort(enc.stream, kind="stable").astype(np.int32)
    busy = np.bincount(enc.engine, weights=dur_ns, minlength=5)[:4].astype(np.float64)
    counts = np.bincount(enc.engine, minlength=5).astype(np.int64)
    d = enc.dma
    drain = np.where(producer >= 0, costs.drain_ns(enc.engine, profile), 0.0)
    return TimingPlan(profile, n, enc.opcode, enc.engine, enc.stream, cycles, dur_ns, producer, drain, d.nbytes, d.p0,
                      d.parts, d.runs, d.bw, d.read, pred_count, succ_ptr, succ_idx, enc.n_streams, stream_ptr,
                      stream_instr, busy, counts, int(d.nbytes.sum()), geometry.hbm_block_bytes, exact=full)


def run_timing(plan: TimingPlan, start_ns: float = 0.0, want_events: bool = False) -> TimingResult:
    """Time one execution of a prepared program starting at device time ``start_ns``."""
    return events.run(plan, start_ns, want_events)
