"""The driver interface: the one contract between devices and everything above them.

Device memory is addressed by integers (chip-global HBM addresses; 0 is never a valid address).
Work is submitted to numbered queues per device; each queue is an in-order timeline of device
time. ``timeline`` is the completion primitive: the device time (ns) at which all work submitted
to a queue so far completes. Streams, events and profiler ranges above the HAL derive from it.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from .profiles import Profile
from .program import Program


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str  # e.g. "trn2 NeuronCore-v3 #0 (sim)"
    driver: str
    profile: Profile
    hbm_bytes: int  # HBM capacity this device can allocate from (shared by the chip's cores)


@dataclass(frozen=True)
class MemoryStats:
    allocated: int  # bytes in live allocations of this device
    peak_allocated: int
    allocations: int  # live allocation count
    chip_allocated: int  # bytes allocated by all cores of the chip
    capacity: int  # HBM capacity of the chip
    largest_free: int  # largest contiguous free block

    @property
    def free(self) -> int:
        return self.capacity - self.chip_allocated


@dataclass
class ExecutionReport:
    """What one execution cost on the device timeline."""

    program: str
    device: int
    queue: int
    start_ns: float
    end_ns: float
    instructions: int
    engine_busy_ns: dict[str, float] = field(default_factory=dict)
    engine_instructions: dict[str, int] = field(default_factory=dict)
    clocks_ghz: dict[str, float] = field(default_factory=dict)
    dma_bytes: int = 0
    trace: dict | None = None  # Chrome/Perfetto trace JSON object, when asked for
    in_graph: bool = False  # recorded into a graph (Driver.begin_graph): its time is the graph's report

    @property
    def device_ns(self) -> float:
        return self.end_ns - self.start_ns

    def cycles(self, engine: str = "tensor") -> float:
        return self.device_ns * self.clocks_ghz.get(engine, 1.0)

    def utilization(self) -> dict[str, float]:
        """Busy fraction of each engine over the execution."""
        span = self.device_ns or 1.0
        return {e: min(1.0, busy / span) for e, busy in self.engine_busy_ns.items()}

    def save_trace(self, path) -> str:
        """Write the trace as Chrome/Perfetto JSON (open in ui.perfetto.dev or chrome://tracing)."""
        if self.trace is None:
            raise ValueError(f"no trace recorded for {self.program!r}: execute with trace=True")
        with open(path, "w") as f:
            json.dump(self.trace, f)
        return str(path)

    def summary(self) -> str:
        util = ", ".join(f"{e} {u:.0%}" for e, u in self.utilization().items())
        return (f"{self.program}: {self.device_ns / 1e3:.2f} us on device {self.device} "
                f"({self.instructions} instructions, {self.dma_bytes / 2**20:.2f} MiB DMA); utilization: {util}")


class Driver(abc.ABC):
    """A family of devices. One instance per (driver, profile); devices are indices into it."""

    name: ClassVar[str]
    priority: ClassVar[int] = 0  # auto-selection tries higher first; < 0 means only when named

    def __init__(self, profile: Profile):
        self.profile = profile

    @classmethod
    def available(cls) -> bool:
        """Whether this driver finds devices on this machine (cheap; no device is opened)."""
        return True

    @abc.abstractmethod
    def devices(self) -> list[DeviceInfo]: ...

    @abc.abstractmethod
    def open(self, device: int) -> None:
        """Make a device ready. Idempotent. Raises InvalidDeviceError for an unknown index."""

    @abc.abstractmethod
    def alloc(self, device: int, nbytes: int) -> int:
        """Reserve device memory; raises DeviceOutOfMemoryError naming requested, free and capacity."""

    @abc.abstractmethod
    def free(self, device: int, address: int) -> None: ...

    @abc.abstractmethod
    def write(self, device: int, address: int, data) -> None:
        """Host -> device: copy the bytes of a buffer-protocol object to ``address``."""

    @abc.abstractmethod
    def read(self, device: int, address: int, out) -> None:
        """Device -> host: fill the writable buffer ``out`` from ``address``."""

    @abc.abstractmethod
    def copy(self, device: int, dst: int, src: int, nbytes: int, queue: int = 0) -> None:
        """Device -> device within the chip (any of its cores' memory)."""

    @abc.abstractmethod
    def load(self, device: int, program: Program):
        """Validate and prepare a program; returns a handle for ``execute``. Cached by program digest."""

    @abc.abstractmethod
    def unload(self, device: int, loaded) -> None:
        """The caller is done with a handle ``load`` returned (it must not execute it again): once every load of
        the program is unloaded the driver drops what it prepared for it, so callers that load a program per
        shape and let go of the old ones (torch-neuron's bounded launch cache) hold bounded memory."""

    @abc.abstractmethod
    def execute(self, device: int, loaded, args: Sequence[int], queue: int = 0,
                trace: bool = False) -> ExecutionReport:
        """Run a loaded program with its tensors bound to device addresses (in ``program.args`` order;
        scratch tensors are allocated by the driver)."""

    @abc.abstractmethod
    def synchronize(self, device: int, queue: int | None = None) -> None:
        """Wait until submitted work (of one queue, or all) has completed."""

    @abc.abstractmethod
    def memory_stats(self, device: int) -> MemoryStats: ...

    @abc.abstractmethod
    def timeline(self, device: int, queue: int = 0) -> float:
        """Device time (ns) at which everything submitted to ``queue`` so far completes."""

    def estimate(self, device: int, loaded) -> ExecutionReport | None:
        """Device time of a loaded program from the driver's cost model, without running it or
        advancing any queue; None for drivers that can only measure by running (hardware)."""
        return None

    def begin_graph(self, device: int, queue: int = 0) -> bool:
        """Start recording this thread's executions on ``queue`` as one program (a compiled graph): each still
        runs when submitted, in order, but the device runs them as one program, overlapping what does not
        depend on each other (see :mod:`neuron_hal.merge`); ``end_graph`` submits that program's time.
        Returns whether it opened a graph: False where the driver cannot merge programs (each runs on its own) or
        one is open already (the executions go into that one; only its opener ends it)."""
        return False

    def end_graph(self, device: int, queue: int = 0, trace: bool = False) -> ExecutionReport | None:
        """Close the graph ``begin_graph`` opened: the report of the merged program, None if nothing ran."""
        return None

    def enqueue(self, device: int, queue: int, duration_ns: float) -> tuple[float, float] | None:
        """Account modelled work that does not run on the core's engines (a collective on the CC cores and
        DMA rings) on a queue: it starts when the queue's submitted work completes. Returns (start, end) ns;
        None on drivers whose queues run in real time (hardware), where there is nothing to model."""
        return None

    def map(self, device: int, address: int, nbytes: int) -> memoryview | None:
        """A host view of device memory, or None where the device's memory is not host-mappable."""
        return None
