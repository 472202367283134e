"""The event loop: when each instruction of a timing plan runs, given its dependencies and the resources it
shares (its engine or DMA queue, the descriptor generators, the DMA engines and each queue's HBM read window).

A list scheduler compiled with Numba; memory is O(instructions), independent of the simulated time. Every
program execution pays the runtime's start-up before its first instruction and tear-down after its last
(``launch_pre_ns``, ``launch_post_ns``). The DMA model is described in the package README ("DMA").
"""

from __future__ import annotations

import numba
import numpy as np

from neuron_hal.profiles import Profile

from .plan import ENGINE_NAMES, N_COMPUTE, TimingPlan, TimingResult


def dma_params(p: Profile) -> np.ndarray:
    """The profile's DMA figures the event loop uses, as one array (see _schedule for their order)."""
    rate = p.dma_read_window_bytes / p.dma_fixed_ns if p.dma_read_window_bytes > 0 and p.dma_fixed_ns > 0 else 0.0
    return np.array([p.dma_issue_ns, p.dma_issue_desc_ns, p.dma_fixed_ns, p.dma_dge_units, p.dma_engines,
                     p.dma_partitions_per_engine, p.dma_run_min_ns, rate], np.float64)


@numba.njit(cache=True, error_model="numpy")
def _schedule(n, n_streams, stream_ptr, stream_instr, dur, producer, drain, dma_bytes, dma_p0, dma_parts, dma_runs,
              dma_bw, dma_read, pred_count, succ_ptr, succ_idx, start_ns, prm, want, out_start, out_end):
    """List-schedule the program in time order; returns (end_ns, total DMA-engine busy ns).

    Each step starts, among the streams whose next instruction has all its dependencies done, the one that can
    start earliest (ties: program order). Compute streams run one instruction at a time; one that reads what an
    earlier instruction of its engine wrote (``producer``) also waits ``drain`` after that one's end.

    A DMA (``prm``: issue ns, issue ns per descriptor, fixed latency ns, DGE units, DMA engines, partitions per
    engine, minimum ns per run, HBM read bytes/ns per queue and engine) occupies its queue, and one of the DGE
    units if the core has them, while its descriptors are generated (issue + per descriptor); engine j of the
    engines it spans gets its descriptors after (j + 1) / engines of that time. Data starts ``fixed`` after the
    trigger. Each engine serves the partitions it owns (partition p: engine p // partitions-per-engine; a DMA
    with no on-chip side, or on a profile without partition affinity, spreads its rows over every engine),
    first come first served, each contiguous run taking
    max(minimum ns, run bytes / bandwidth); HBM reads also pass through the queue's read window on that engine
    (bytes in flight over the latency). A queue completes its DMAs in order.
    """
    issue_ns, desc_ns, fixed_ns = prm[0], prm[1], prm[2]
    n_dge, n_dma, ppe = int(prm[3]), int(prm[4]), int(prm[5])
    run_min, read_rate = prm[6], prm[7]
    remaining = pred_count.copy()
    ready_at = np.full(n, start_ns)
    end_at = np.empty(n)
    head = stream_ptr[:n_streams].copy()
    stream_free = np.full(n_streams, start_ns)
    queue_done = np.full(n_streams, start_ns)
    dge_free = np.full(max(n_dge, 1), start_ns)
    engine_free = np.full(max(n_dma, 1), start_ns)
    pipe_free = np.full((n_streams, max(n_dma, 1)), start_ns)
    active = np.empty(n_streams, np.int64)
    n_active = 0
    for s in range(n_streams):
        if stream_ptr[s + 1] > stream_ptr[s]:
            active[n_active] = s
            n_active += 1
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
            if producer[i] >= 0:
                t = max(t, end_at[producer[i]] + drain[i])
            if s >= N_COMPUTE and n_dge > 0:
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
            parts = dma_parts[i]
            p0 = dma_p0[i]
            if p0 >= 0:
                e_first, e_last = p0 // ppe, (p0 + parts - 1) // ppe
            else:
                e_first, e_last = 0, n_dma - 1
            span = e_last - e_first + 1
            descs = parts * dma_runs[i]
            issue = issue_ns + desc_ns * descs
            stream_free[s] = t + issue
            if n_dge > 0:
                dge_free[dge_u] = t + issue
            bpp = dma_bytes[i] / max(parts, 1)  # bytes per partition (row)
            run_t = max(run_min, bpp / max(dma_runs[i], 1) / dma_bw[i])
            e = t + fixed_ns
            for j in range(span):
                eng = e_first + j
                if p0 >= 0:
                    lo = max(p0, eng * ppe)
                    hi = min(p0 + parts, (eng + 1) * ppe)
                    own = hi - lo
                    rows = float(own)
                else:  # rows spread evenly over every engine
                    rows = parts / n_dma
                busy = rows * dma_runs[i] * run_t
                data = max(t + fixed_ns, t + issue * (j + 1) / span)
                c_start = max(data, engine_free[eng])
                c_end = c_start + busy
                engine_free[eng] = c_end
                if dma_read[i] and read_rate > 0.0:
                    p_start = max(t, pipe_free[s, eng])
                    p_end = p_start + rows * bpp / read_rate
                    pipe_free[s, eng] = p_end
                    c_end = max(c_end, p_end)
                dma_busy += busy
                e = max(e, c_end)
            e = max(e, queue_done[s])
            queue_done[s] = e
        end_at[i] = e
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


def run(plan: TimingPlan, start_ns: float = 0.0, want_events: bool = False, profile: Profile | None = None
        ) -> TimingResult:
    """Time one execution of a prepared program starting at device time ``start_ns``. ``profile`` times it with
    another profile's DMA and launch figures (the calibration's fits; nothing is cached then)."""
    if want_events or profile is not None:
        return _run(plan, start_ns, want_events, profile or plan.profile)
    if plan.untraced is None:
        first = _run(plan, 0.0, False, plan.profile)
        plan.untraced = (first.end_ns, first.engine_busy_ns, first.engine_instructions)
    duration, busy, counts = plan.untraced
    return TimingResult(float(start_ns), float(start_ns) + duration, dict(busy), dict(counts), plan.total_dma_bytes)


def _run(plan: TimingPlan, start_ns: float, want_events: bool, p: Profile) -> TimingResult:
    n = plan.n
    out_start = np.empty(n if want_events else 0, np.float64)
    out_end = np.empty(n if want_events else 0, np.float64)
    first = float(start_ns) + p.launch_pre_ns  # the runtime's start-up precedes the first instruction
    end_ns, dma_busy = _schedule(n, plan.n_streams, plan.stream_ptr, plan.stream_instr, plan.dur_ns,
                                 plan.producer, plan.drain_ns, plan.dma_bytes, plan.dma_p0, plan.dma_parts,
                                 plan.dma_runs, plan.dma_bw, plan.dma_read, plan.pred_count, plan.succ_ptr,
                                 plan.succ_idx, first, dma_params(p), want_events, out_start, out_end)
    if end_ns < first:
        raise RuntimeError("timing: scheduler found no runnable instruction (dependency cycle)")
    busy = {name: float(plan.busy_ns[k]) for k, name in enumerate(ENGINE_NAMES)}
    busy["dma"] = dma_busy / p.dma_engines
    counts = {name: int(plan.counts[k]) for k, name in enumerate(ENGINE_NAMES)}
    counts["dma"] = int(plan.counts[4])
    result = TimingResult(float(start_ns), end_ns + p.launch_post_ns, busy, counts, plan.total_dma_bytes)
    if want_events:
        result.start, result.end, result.track = out_start, out_end, plan.stream
    return result
