"""Chrome / Perfetto JSON traces of a timed execution.

One process per device, one track (tid) per compute engine and per DMA queue used, one complete ("X")
slice per instruction. Timestamps are microseconds (floats) rounded to whole nanoseconds, so slices on a
track never overlap after a viewer converts them back to integer nanoseconds.

A DMA queue keeps several DMAs in flight (it issues the next while earlier ones transfer; completions are
in order), so a DMA's slice on its queue track starts at max(its issue, the previous DMA's completion) and
ends at its completion; the unclipped issue time is in the slice's args.
"""

from __future__ import annotations

import numpy as np

from .plan import N_COMPUTE, OPCODE_NAMES, TimingPlan, TimingResult, stream_name


def chrome_trace(program, plan: TimingPlan, result: TimingResult, device: int = 0) -> dict:
    """{"traceEvents": [...], "displayTimeUnit": "ns"} for ``result`` (needs ``want_events=True``)."""
    if result.start is None or result.end is None:
        raise ValueError("chrome_trace needs per-instruction events: call run_timing(plan, ..., want_events=True)")
    n = plan.n
    start, end, track = result.start, result.end, plan.stream
    shown = start.copy()
    # Clip DMA slices to the previous completion on their queue (completions are in order per queue).
    for s in range(N_COMPUTE, plan.n_streams):
        idx = plan.stream_instr[plan.stream_ptr[s]:plan.stream_ptr[s + 1]]
        if idx.size > 1:
            shown[idx[1:]] = np.maximum(start[idx[1:]], end[idx[:-1]])
    a = np.rint(shown).astype(np.int64)
    b = np.maximum(np.rint(end).astype(np.int64), a)
    ts = (a / 1000.0).tolist()
    dur = ((b - a) / 1000.0).tolist()
    names = [OPCODE_NAMES[k] for k in plan.opcode.tolist()]
    tracks = track.tolist()
    starts, ends = start.tolist(), end.tolist()
    is_dma = (plan.engine == 4).tolist()
    nbytes = plan.dma_bytes.tolist()
    cycles = plan.cycles.tolist()

    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": f"NeuronCore {device}"}},
        {"ph": "M", "name": "process_sort_index", "pid": device, "tid": 0, "args": {"sort_index": device}},
    ]
    for s in sorted(set(tracks)):
        events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": s, "args": {"name": stream_name(s)}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": device, "tid": s, "args": {"sort_index": s}})
    for i in range(n):
        args = {"index": i, "line": program.listing_line(i), "start_ns": starts[i], "end_ns": ends[i]}
        if is_dma[i]:
            args["bytes"] = nbytes[i]
        else:
            args["cycles"] = cycles[i]
        events.append({"ph": "X", "name": names[i], "cat": stream_name(tracks[i]).split()[0], "pid": device,
                       "tid": tracks[i], "ts": ts[i], "dur": dur[i], "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns"}
