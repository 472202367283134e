"""A device-time profiler: which aten op ran which program when, on the device timeline, as one Perfetto trace.

    with torch.neuron.profiler.profile() as prof:
        with torch.neuron.profiler.record_function("step"):
            loss = model(x).sum(); loss.backward(); opt.step()
    prof.export_chrome_trace("trace.json")   # open in https://ui.perfetto.dev
    print(prof.table())

While a profile is active, every program the ops launch is executed with the driver's tracing on and
labelled with its aten op. The trace holds, per device, a track of aten ops (one slice per program
launch, named by op), a track of ``record_function`` ranges, CPU fallbacks as instant markers, and (with
``instructions=True``) the driver's own per-instruction engine/DMA tracks of each program. Timestamps
are device time (simulated on the sim driver), so the slices of one device never overlap within a queue.
``prof.key_averages()`` gives (op, device ns, programs) per op, with a ``table(sort_by=..., row_limit=...)``
like torch's ``EventList.table``.

PyTorch's own profilers and the neuron device:

- ``torch.autograd.profiler.profile(use_device="neuron")`` (its legacy, non-kineto mode) times each op on the
  device through the PrivateUse1 ``ProfilerStubs`` (``csrc/ProfilerStubs.cpp``): an event at op entry and exit
  on the current stream's device clock, as ``torch.neuron.Event`` records it, so an op's NEURON time is the
  device time of the programs it queued. torch keeps these as whole microseconds (``privateuse1_elapsed_us``).
- ``torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])`` runs kineto, which in torch 2.13
  takes device events only from a libkineto ``IActivityProfiler`` plugin registered through
  ``PrivateUse1ProfilerRegistry`` (``REGISTER_PRIVATEUSE1_PROFILER``); the stubs above are not consulted there.
  ``csrc/Kineto.cpp`` is that plugin (fed by ``torch_neuron.kineto``): each program execution is a device kernel
  linked to the aten op that launched it. This profiler adds record_function ranges on the device timeline,
  fallback markers, per-instruction tracks and nesting.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field

from .fallback import observers as fallback_observers
from .metrics import observers as native_observers
from .runtime import runtime

OPS_TID, RANGES_TID = 1000, 1001  # above the driver's engine/queue track ids


@dataclass
class OpEvent:
    op: str
    program: str
    device: int
    queue: int
    start_ns: float
    end_ns: float
    trace: dict | None = field(default=None, repr=False)


class KeyAverages(list):
    """``profile.key_averages()``: (op, device ns, programs) tuples with a ``table`` like torch's EventList's."""

    SORT_KEYS = {"device_time_total": lambda t: -t[1], "device_time": lambda t: -t[1] / t[2],
                 "count": lambda t: -t[2], "name": lambda t: t[0]}

    def table(self, sort_by: str = "device_time_total", row_limit: int = 100) -> str:
        """One row per op: total device time, its share, the average per program and the programs launched;
        ``sort_by`` one of SORT_KEYS, at most ``row_limit`` rows (all of them when negative)."""
        if sort_by not in self.SORT_KEYS:
            raise ValueError(f"sort_by={sort_by!r}: expected one of {sorted(self.SORT_KEYS)}")
        rows = sorted(self, key=self.SORT_KEYS[sort_by])
        rows = rows if row_limit < 0 else rows[:row_limit]
        all_ns = sum(ns for _, ns, _ in self) or 1.0
        width = max([len("Name"), *(len(op) for op, _, _ in rows)]) + 2
        header = (f"{'Name':>{width}}  {'Device total':>12}  {'Device %':>8}  {'Device time avg':>15}  "
                  f"{'# of Calls':>10}")
        rule = "-" * len(header)
        lines = [rule, header, rule]
        for op, ns, n in rows:
            lines.append(f"{op:>{width}}  {_us(ns):>12}  {ns / all_ns:>8.2%}  {_us(ns / n):>15}  {n:>10}")
        lines += [rule, f"Device time total: {_us(sum(ns for _, ns, _ in self))}"]
        return "\n".join(lines)


def _install(driver) -> None:
    """While any profile is active, every program runs traced (when a profile wants instructions) and its report
    goes to each active profile."""
    untraced, untraced_graph = driver.execute, driver.end_graph

    def wanted(trace: bool) -> bool:
        return trace or any(p.instructions for p in profile._stack)

    def deliver(report) -> None:
        for p in profile._stack:
            p._pending.append(report)

    def execute(device, loaded, args, queue=0, trace=False):  # shadows the method on this instance only
        report = untraced(device, loaded, args, queue=queue, trace=wanted(trace))
        if not report.in_graph:  # a compiled graph's launches are timed as its one program (end_graph)
            deliver(report)
        return report

    def end_graph(device, queue=0, trace=False):
        report = untraced_graph(device, queue, trace=wanted(trace))
        if report is not None:
            deliver(report)
        return report

    driver.execute, driver.end_graph = execute, end_graph


def _uninstall(driver) -> None:
    del driver.execute, driver.end_graph  # the class's methods again


class profile(contextlib.ContextDecorator):
    """Record the device programs run inside the ``with`` block (see the module docstring)."""

    _stack: list[profile] = []  # the active profiles, outermost first: profiles nest (neuron-profile capture
    # of a script that profiles its own steps), each recording what runs inside its block

    def __init__(self, instructions: bool = True):
        self.instructions = instructions
        self.events: list[OpEvent] = []
        self.ranges: list[tuple[str, int, float, float]] = []  # (name, device, start, end)
        self.fallbacks: list[tuple[str, int, float]] = []  # (op, device, device time when it ran)
        self._pending: list = []

    def __enter__(self):
        if not profile._stack:
            _install(runtime().driver)
        profile._stack.append(self)
        native_observers.append(self._on_native)
        fallback_observers.append(self._on_fallback)
        return self

    def __exit__(self, *exc):
        native_observers.remove(self._on_native)
        fallback_observers.remove(self._on_fallback)
        profile._stack.remove(self)
        if not profile._stack:
            _uninstall(runtime().driver)
        return False

    def _on_native(self, op: str, ns: float) -> None:
        pending, self._pending = self._pending, []
        for r in pending:
            self.events.append(OpEvent(op, r.program, r.device, r.queue, r.start_ns, r.end_ns, r.trace))

    def _on_fallback(self, op: str) -> None:
        device = _current_device()
        self.fallbacks.append((op, device, runtime().timeline(device, _stream(device))))

    # -- results ---------------------------------------------------------------------------------
    def device_ns(self) -> float:
        return sum(e.end_ns - e.start_ns for e in self.events)

    def key_averages(self) -> KeyAverages:
        """(op, device ns, programs) per aten op, most device time first."""
        total, count = defaultdict(float), defaultdict(int)
        for e in self.events:
            total[e.op] += e.end_ns - e.start_ns
            count[e.op] += 1
        return KeyAverages(sorted(((op, ns, count[op]) for op, ns in total.items()), key=lambda t: -t[1]))

    def table(self, sort_by: str = "device_time_total", row_limit: int = 10) -> str:
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit)

    def chrome_trace(self) -> dict:
        events: list[dict] = []
        seen: set[tuple] = set()
        for device in sorted({e.device for e in self.events} | {d for _, d, _, _ in self.ranges}):
            _meta(events, seen, device)
        for e in self.events:
            events.append({"ph": "X", "name": e.op, "cat": "op", "pid": e.device, "tid": OPS_TID,
                           "ts": e.start_ns / 1e3, "dur": (e.end_ns - e.start_ns) / 1e3,
                           "args": {"program": e.program, "queue": e.queue}})
            for ev in (e.trace or {}).get("traceEvents", ()):
                if ev.get("ph") == "M":
                    key = (ev["pid"], ev["tid"], ev["name"])
                    if key in seen:
                        continue
                    seen.add(key)
                events.append(ev)
        for name, device, start, end in self.ranges:
            events.append({"ph": "X", "name": name, "cat": "range", "pid": device, "tid": RANGES_TID,
                           "ts": start / 1e3, "dur": (end - start) / 1e3})
        for op, device, ts in self.fallbacks:
            events.append({"ph": "i", "s": "t", "name": f"CPU fallback: {op}", "cat": "fallback", "pid": device,
                           "tid": OPS_TID, "ts": ts / 1e3})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def export_chrome_trace(self, path) -> str:
        """Write the trace as Chrome/Perfetto JSON; returns the path."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return str(path)


@contextlib.contextmanager
def record_function(name: str, device=None):
    """A named range on the device timeline (of the current stream) in each active profile."""
    active = list(profile._stack)
    if not active:
        yield
        return
    index = _current_device() if device is None else device
    start = runtime().timeline(index, _stream(index))
    try:
        yield
    finally:
        end = runtime().timeline(index, _stream(index))
        for prof in active:
            prof.ranges.append((name, index, start, end))


def _us(ns: float) -> str:
    return f"{ns / 1e3:.3f}us"


def _meta(events: list, seen: set, pid: int) -> None:
    """Names of a device's process and of the profiler's tracks (the driver's traces name their own)."""
    seen.add((pid, 0, "process_name"))
    events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"NeuronCore {pid}"}})
    for tid, name in ((OPS_TID, "aten ops"), (RANGES_TID, "ranges")):
        seen.add((pid, tid, "thread_name"))
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})


def _current_device() -> int:
    from .device import current_device

    return current_device()


def _stream(device: int) -> int:
    import torch

    return torch.accelerator.current_stream(torch.device("neuron", device)).stream_id
