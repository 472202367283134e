"""The event loop: when each instruction of a timing plan runs, given its dependencies and the resources it
shares (its engine or DMA queue, the descriptor generators, the DMA engines).

A list scheduler compiled with Numba; memory is O(instructions), independent of the simulated time.
"""

from __future__ import annotations

import numba
import numpy as np

from .plan import ENGINE_NAMES, N_COMPUTE, TimingPlan, TimingResult


@numba.njit(cache=True, error_model="numpy")
def _schedule(n, n_streams, stream_ptr, stream_instr, dur, dma_bytes, dma_engines, dma_bw, pred_count, succ_ptr,
              succ_idx, start_ns, issue_ns, fixed_ns, n_dge, n_dma, want, out_start, out_end):
    """List-schedule the program in time order; returns (end_ns, total DMA-engine busy ns).

    Each step starts, among the streams whose next instruction has all its dependencies done, the one
    that can start earliest (ties: program order). Compute streams run one instruction at a time. A DMA
    queue issues one DMA at a time on a free DGE unit (dma_issue_ns), its data starts dma_fixed_ns later
    and is split evenly over FIFO DMA engines taken round-robin; a queue completes in order.
    """
    remaining = pred_count.copy()
    ready_at = np.full(n, start_ns)
    head = stream_ptr[:n_streams].copy()
    stream_free = np.full(n_streams, start_ns)
    queue_done = np.full(n_streams, start_ns)
    dge_free = np.full(max(n_dge, 1), start_ns)
    engine_free = np.full(max(n_dma, 1), start_ns)
    active = np.empty(n_streams, np.int64)
    n_active = 0
    for s in range(n_streams):
        if stream_ptr[s + 1] > stream_ptr[s]:
            active[n_active] = s
            n_active += 1
    rr = 0
    end_max = start_ns
    dma_busy = 0.0
    for _ in range(n):
        dge_u = 0
        for u in range(1, n_dge):
            if dge_free[u] < dge_free[dge_u]:
                dge_u = u
        best_k, best_i, best_t = -1, n, np.inf
        for k in range(n_active):
            s = active[k]
            i = stream_instr[head[s]]
            if remaining[i] != 0:
                continue
            t = max(stream_free[s], ready_at[i])
            if s >= N_COMPUTE:
                t = max(t, dge_free[dge_u])
            if t < best_t or (t == best_t and i < best_i):
                best_k, best_i, best_t = k, i, t
        if best_k < 0:
            return -1.0, 0.0  # unreachable for a program-ordered graph
        s = active[best_k]
        i = best_i
        t = best_t
        if s < N_COMPUTE:
            e = t + dur[i]
            stream_free[s] = e
        else:
            issued = t + issue_ns
            dge_free[dge_u] = issued
            stream_free[s] = issued
            data = issued + fixed_ns
            parts = dma_engines[i]
            chunk = dma_bytes[i] / parts / dma_bw[i]
            e = data
            for j in range(parts):
                eng = (rr + j) % n_dma
                c_end = max(data, engine_free[eng]) + chunk
                engine_free[eng] = c_end
                e = max(e, c_end)
            rr = (rr + parts) % n_dma
            dma_busy += chunk * parts
            e = max(e, queue_done[s])
            queue_done[s] = e
        if want:
            out_start[i] = t
            out_end[i] = e
        end_max = max(end_max, e)
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            remaining[j] -= 1
            if ready_at[j] < e:
                ready_at[j] = e
        head[s] += 1
        if head[s] == stream_ptr[s + 1]:
            n_active -= 1
            active[best_k] = active[n_active]
    return end_max, dma_busy


def run(plan: TimingPlan, start_ns: float = 0.0, want_events: bool = False) -> TimingResult:
    """Time one execution of a prepared program starting at device time ``start_ns``."""
    if want_events:
        return _run(plan, start_ns, True)
    if plan.untraced is None:
        first = _run(plan, 0.0, False)
        plan.untraced = (first.end_ns, first.engine_busy_ns, first.engine_instructions)
    duration, busy, counts = plan.untraced
    return TimingResult(float(start_ns), float(start_ns) + duration, dict(busy), dict(counts), plan.total_dma_bytes)


def _run(plan: TimingPlan, start_ns: float, want_events: bool) -> TimingResult:
    p = plan.profile
    n = plan.n
    out_start = np.empty(n if want_events else 0, np.float64)
    out_end = np.empty(n if want_events else 0, np.float64)
    end_ns, dma_busy = _schedule(n, plan.n_streams, plan.stream_ptr, plan.stream_instr, plan.dur_ns,
                                 plan.dma_bytes, plan.dma_engines, plan.dma_bw, plan.pred_count, plan.succ_ptr,
                                 plan.succ_idx, float(start_ns), float(p.dma_issue_ns), float(p.dma_fixed_ns),
                                 int(p.dma_dge_units), int(p.dma_engines), want_events, out_start, out_end)
    if end_ns < start_ns:
        raise RuntimeError("timing: scheduler found no runnable instruction (dependency cycle)")
    busy = {name: float(plan.busy_ns[k]) for k, name in enumerate(ENGINE_NAMES)}
    busy["dma"] = dma_busy / p.dma_engines
    counts = {name: int(plan.counts[k]) for k, name in enumerate(ENGINE_NAMES)}
    counts["dma"] = int(plan.counts[4])
    result = TimingResult(float(start_ns), float(end_ns), busy, counts, plan.total_dma_bytes)
    if want_events:
        result.start, result.end, result.track = out_start, out_end, plan.stream
    return result
