"""The calibration suite's vocabulary: a published hardware measurement, the kernel that reproduces its
structure, and what the simulator makes of it.

A :class:`Case` is one published figure (:class:`Measurement`: value, statistic, hardware, source) and a
kernel written in the project's kernel language the way the source structures it (same loop nests, tiles,
buffers, what is loaded where), traced for the measurement's hardware profile and timed by the ``sim``
driver. ``simulate`` runs one case; ``run.py`` runs them all and writes the fidelity table.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import time
from dataclasses import dataclass, field

from neuron_hal import get_profile
from neuron_hal.cache import set_cache_dir
from neuron_kernels.store import ProgramStore, set_default_store
from neuron_sim import events
from neuron_sim.schedule import schedule
from neuron_sim.timing import prepare_timing

METRICS = ("device", "dma_data")
KINDS = ("measured", "threshold")  # a value reported as measured; an upper bound asserted by a test
STATISTICS = ("p1", "p50", "p99", "mean", "profile")


@dataclass(frozen=True)
class Measurement:
    """One published hardware figure."""

    value_us: float
    statistic: str  # one of STATISTICS: nki.benchmark percentiles, a mean of runs, or a profile's total time
    hardware: str  # profile name: trn1, trn2, trn3
    source: str  # document or repository, version or commit, section/lines: enough to find it again
    published: str  # date of the publication (YYYY-MM): which toolchain produced it
    includes_launch: bool = True  # the runtime's per-execution start-up/tear-down is inside the figure
    lnc: int = 1  # logical NeuronCore size the figure was measured with
    kind: str = "measured"  # one of KINDS
    note: str = ""  # how the figure was read (a screenshot read-off, a threshold's margin, an ambiguity)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"measurement kind {self.kind!r} is not one of {KINDS}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"measurement statistic {self.statistic!r} is not one of {STATISTICS}")
        get_profile(self.hardware)  # an unknown hardware name fails here, naming the profiles
        if not self.value_us > 0:
            raise ValueError(f"measurement value {self.value_us!r} us must be positive")


@dataclass(frozen=True)
class Case:
    """A published figure and the kernel that reproduces its structure.

    ``family`` groups the variants of one kernel that one source measured under one toolchain: their order and
    slowest/fastest ratio are compared with the published ones. ``differs`` says what the kernel cannot
    express of the source (empty when nothing), so a reader can judge the comparison.
    """

    family: str
    name: str
    kernel: object  # a neuron_kernels Kernel
    args: tuple  # TensorSpecs (and constants) in the kernel's order
    measurement: Measurement
    kwargs: dict = field(default_factory=dict)
    differs: str = ""
    expressible: bool = True  # False: the kernel language cannot express the source; the case is reported only
    # The Neuron compiler schedules a kernel's instructions across independent iterations; the simulator's
    # list scheduler (neuron_sim.schedule, as for compiled graphs) stands in for it. False where the source was
    # compiled with instruction scheduling off, so it ran in program order.
    scheduled: bool = True
    # What the figure measures: "device" (the execution's device time) or "dma_data" (a profile window: from
    # the first DMA's data start to the last DMA's completion, trigger latency and launch excluded).
    metric: str = "device"

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"case {self.family}/{self.name}: metric {self.metric!r} is not one of {METRICS}")

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


@dataclass(frozen=True)
class Result:
    case: Case
    simulated_us: float
    busy: dict  # engine -> busy fraction of the device time
    dma_gbps: float  # bytes moved by DMA per simulated second
    instructions: int
    wall_s: float

    @property
    def ratio(self) -> float:
        """Simulated over published."""
        return self.simulated_us / self.case.measurement.value_us

    @property
    def error(self) -> float:
        """Signed relative error of the simulated time."""
        return self.ratio - 1.0

    @property
    def bound(self) -> str:
        """The busiest resource and its busy fraction, e.g. ``dma 0.93``."""
        engine, frac = max(self.busy.items(), key=lambda kv: kv[1])
        return f"{engine} {frac:.2f}"


def use_cache() -> None:
    """Keep traces and schedule choices on disk between runs (``$NEURON_SIM_CALIBRATION_CACHE``, default
    ``~/.cache/neuron-sim/calibration``; ``off``: in this process only). Both are content addressed by the code
    that produced them, so an edit to a kernel, the language or the simulator is a miss, never a stale entry."""
    root = os.environ.get("NEURON_SIM_CALIBRATION_CACHE", str(pathlib.Path.home() / ".cache/neuron-sim/calibration"))
    if root == "off":
        return
    set_default_store(ProgramStore(pathlib.Path(root) / "programs"))
    set_cache_dir(root)


def program(case: Case, profile):
    """The case's program for ``profile``: traced, and scheduled as the compiler would (unless the source was not)."""
    prog = case.kernel.trace(*case.args, profile=profile, **case.kwargs)
    return schedule(prog, profile, prog.digest)[0] if case.scheduled else prog


def measured_ns(case: Case, plan, profile) -> float:
    """The simulated counterpart of the case's published figure, from its prepared timing plan."""
    if case.metric == "dma_data":
        res = events.run(plan, want_events=True, profile=profile)
        dma = plan.engine == 4
        return float(res.end[dma].max() - (res.start[dma].min() + profile.dma_fixed_ns))
    ns = events.run(plan, profile=profile).device_ns
    return ns if case.measurement.includes_launch else ns - profile.launch_ns


def simulate(case: Case, profile=None) -> Result:
    """Trace ``case`` for its hardware (or ``profile``, a Profile to try other parameters) and time it."""
    prof = profile if profile is not None else get_profile(case.measurement.hardware)
    t0 = time.perf_counter()
    plan = prepare_timing(program(case, prof), prof)
    ns = measured_ns(case, plan, prof)
    report = events.run(plan, profile=prof)
    wall = time.perf_counter() - t0
    span = report.device_ns or 1.0
    busy = {e: min(1.0, b / span) for e, b in report.engine_busy_ns.items()}
    return Result(case, ns / 1e3, busy, report.dma_bytes / span, plan.n, wall)


def geomean(xs) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def replace(case: Case, **changes) -> Case:
    return dataclasses.replace(case, **changes)
