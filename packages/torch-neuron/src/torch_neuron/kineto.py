"""The Python side of torch.profiler's neuron device events (``csrc/Kineto.cpp``).

While a ``torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])`` records, kineto's neuron
session has every program execution (and compiled graph) reported to it with its device start and end and the
user op it serves (``metrics.user_op``, as ``torch.neuron.metrics()`` charges it). The observer is installed by
the session's start and removed by its stop: a profile without that activity costs nothing.
"""

from __future__ import annotations

from .metrics import report_observers
from .runtime import runtime


def _observe(op: str, report) -> None:
    from . import _C

    _C._kineto_record(report.device, report.queue, report.start_ns, report.end_ns, op, report.program)


def _start() -> list[float]:
    """Called by the session's start: install the observer; returns each device's present (its timeline now),
    the device time the session's start maps to."""
    rt = runtime()
    if _observe not in report_observers:
        report_observers.append(_observe)
    return [rt.timeline(d, 0) for d in range(rt.device_count())]


def _stop() -> None:
    if _observe in report_observers:
        report_observers.remove(_observe)
