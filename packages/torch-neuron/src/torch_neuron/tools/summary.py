"""What a captured device timeline adds up to, read back from its Perfetto (Chrome JSON) trace.

The trace is torch.neuron.profiler's: per device (``pid``), a track of programs labelled by aten op (``cat: op``;
their durations are the device time), ``record_function`` ranges, CPU-fallback markers, and the driver's
per-instruction tracks, one per engine (tensor, vector, scalar, gpsimd) and per DMA queue (``dma q<n>``), whose
slices never overlap within a track. An engine's busy time is the sum of its slices; its utilization is that over
the device's device time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from neuron_hal.isa import Engine

PROFILER_CATEGORIES = ("op", "range", "fallback")
ENGINES = tuple(e.value for e in Engine if e is not Engine.SYNC)  # the compute engines, in ISA order


def _track_order(track: str) -> tuple:
    """Compute engines in the ISA's order, then DMA queues by number, then anything else."""
    if track in ENGINES:
        return (0, ENGINES.index(track), "")
    if track.startswith("dma q") and track[5:].isdigit():
        return (1, int(track[5:]), "")
    return (2, 0, track)


@dataclass
class DeviceSummary:
    device: int
    device_ns: float = 0.0
    programs: int = 0
    engine_busy_ns: dict[str, float] = field(default_factory=dict)
    engine_instructions: dict[str, int] = field(default_factory=dict)
    ops: dict[str, list] = field(default_factory=dict)  # op -> [device ns, programs]

    def utilization(self) -> dict[str, float]:
        span = self.device_ns or 1.0
        return {e: busy / span for e, busy in self.engine_busy_ns.items()}


def summarize(trace: dict) -> list[DeviceSummary]:
    """Per device (engines, then DMA queues): device time, programs, engine busy time and instructions, ops."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("not a Chrome/Perfetto trace: no 'traceEvents' list")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices: dict[int, DeviceSummary] = {}
    busy = defaultdict(lambda: defaultdict(float))
    count = defaultdict(lambda: defaultdict(int))
    for e in events:
        if e.get("ph") != "X":
            continue
        pid = e["pid"]
        d = devices.setdefault(pid, DeviceSummary(pid))
        ns = e["dur"] * 1e3
        if e.get("cat") == "op":
            d.device_ns += ns
            d.programs += 1
            op = d.ops.setdefault(e["name"], [0.0, 0])
            op[0] += ns
            op[1] += 1
        elif e.get("cat") not in PROFILER_CATEGORIES:
            track = names.get((pid, e["tid"]), f"track {e['tid']}")
            busy[pid][track] += ns
            count[pid][track] += 1
    for pid, d in devices.items():
        ranked = sorted(busy[pid].items(), key=lambda kv: _track_order(kv[0]))
        d.engine_busy_ns = dict(ranked)
        d.engine_instructions = {t: count[pid][t] for t, _ in ranked}
        d.ops = dict(sorted(d.ops.items(), key=lambda kv: -kv[1][0]))
    return [devices[p] for p in sorted(devices) if devices[p].programs]


def render(summaries: list[DeviceSummary], top: int = 10) -> str:
    if not summaries:
        return "no device programs were captured"
    out = []
    for d in summaries:
        out.append(f"NeuronCore {d.device}: device time {d.device_ns / 1e3:.2f} us over {d.programs} programs")
        out.append(f"  {'engine':<12} {'busy us':>12} {'utilization':>12} {'instructions':>13}")
        for engine, ns in d.engine_busy_ns.items():
            out.append(f"  {engine:<12} {ns / 1e3:>12.2f} {d.utilization()[engine]:>12.1%} "
                       f"{d.engine_instructions[engine]:>13}")
        if not d.engine_busy_ns:
            out.append("  (no per-instruction tracks: captured without instructions)")
        out.append(f"  {'op':<40} {'device us':>12} {'share':>7} {'programs':>9}")
        for op, (ns, n) in list(d.ops.items())[:top]:
            out.append(f"  {op:<40} {ns / 1e3:>12.2f} {ns / (d.device_ns or 1.0):>7.1%} {n:>9}")
    return "\n".join(out)


def as_dict(summaries: list[DeviceSummary]) -> dict:
    return {"device_ns": sum(d.device_ns for d in summaries),
            "devices": [{"device": d.device, "device_ns": d.device_ns, "programs": d.programs,
                         "engine_busy_ns": d.engine_busy_ns, "utilization": d.utilization(),
                         "ops": {op: {"device_ns": ns, "programs": n} for op, (ns, n) in d.ops.items()}}
                        for d in summaries]}
