"""Chip memory emulated in host RAM: the shared base of drivers with no hardware behind them.

HBM is one anonymous mapping of the profile's capacity with MAP_NORESERVE, so 96 GiB of simulated
HBM costs host memory only for the pages a program touches. ``NEURON_SIM_HBM_BYTES`` lowers the
capacity (tests use it to reach out-of-memory quickly). Addresses are offsets into that mapping
plus one alignment unit, so 0 is never valid.
"""

from __future__ import annotations

import bisect
import hashlib
import mmap
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import merge
from .driver import DeviceInfo, Driver, ExecutionReport, MemoryStats
from .errors import DeviceOutOfMemoryError, InvalidAddressError, InvalidDeviceError
from .program import Program
from .sizes import env_bytes
from .validate import validate

ALIGN = 512  # allocation granularity: DMA descriptors favour 512-byte aligned buffers
GRAPH_CACHE_ENTRIES = 64  # merged programs kept (a compiled graph's forward and backward are one each)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux value; Python < 3.13 lacks the name


def hbm_capacity(default: int) -> int:
    value = env_bytes("NEURON_SIM_HBM_BYTES")
    return default if value is None else min(value, default)


def _bytes_of(buf) -> np.ndarray:
    """The bytes of a buffer as a flat uint8 array sharing memory (ml_dtypes arrays have no buffer export)."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError(f"host buffer of shape {buf.shape} must be C-contiguous")
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


class RangeAllocator:
    """Best-fit allocator over [base, base + capacity) with coalescing of freed neighbours."""

    def __init__(self, base: int, capacity: int, align: int = ALIGN):
        self.base, self.capacity, self.align = base, capacity, align
        self._free = {base: capacity}  # start -> size
        self._live_starts: list[int] = []
        self._live: dict[int, tuple[int, int]] = {}  # start -> (size, owner)
        self.allocated = 0

    def alloc(self, nbytes: int, owner: int = 0) -> int:
        size = max(self.align, -(-nbytes // self.align) * self.align)
        best = None
        for start, free in self._free.items():
            if free >= size and (best is None or free < self._free[best]):
                best = start
        if best is None:
            raise DeviceOutOfMemoryError(nbytes, self.capacity - self.allocated, self.capacity, owner,
                                         max(self._free.values(), default=0))
        remaining = self._free.pop(best) - size
        if remaining:
            self._free[best + size] = remaining
        self._live[best] = (size, owner)
        bisect.insort(self._live_starts, best)
        self.allocated += size
        return best

    def free(self, start: int) -> tuple[int, int]:
        if start not in self._live:
            raise InvalidAddressError(f"free of {start:#x}: not the start of a live device allocation")
        freed, owner = self._live.pop(start)
        del self._live_starts[bisect.bisect_left(self._live_starts, start)]
        self.allocated -= freed
        size, end = freed, start + freed
        if end in self._free:
            size += self._free.pop(end)
        for s, sz in list(self._free.items()):
            if s + sz == start:
                start, size = s, sz + size
                del self._free[s]
                break
        self._free[start] = size
        return freed, owner  # the allocation's size, not the coalesced free range's

    def check(self, address: int, nbytes: int) -> None:
        """Raise unless [address, address + nbytes) lies inside one live allocation."""
        i = bisect.bisect_right(self._live_starts, address) - 1
        if i >= 0:
            start = self._live_starts[i]
            if address + nbytes <= start + self._live[start][0]:
                return
        raise InvalidAddressError(
            f"device range [{address:#x}, {address + nbytes:#x}) ({nbytes} bytes) is not inside a live allocation"
        )

    def largest_free(self) -> int:
        return max(self._free.values(), default=0)


@dataclass
class Loaded:
    program: Program
    state: object = None  # what the driver prepared (e.g. encoded tables)
    prepare: Callable | None = None  # makes ``state`` on first use: a kernel that only runs inside compiled graphs
    # is never timed alone, so nothing is prepared for it

    def prepared(self):
        if self.state is None and self.prepare is not None:
            self.state = self.prepare(self.program)
        return self.state


@dataclass(frozen=True)
class MergedGraph:
    """A compiled graph's merged program as a driver is asked to load it: its content address (its kernels'
    digests and how their tensors share buffers), name and instruction count, and how to build it. Merging is
    the expensive part: a driver that kept under ``key`` what it needs need not build the program at all."""

    key: str
    name: str
    instructions: int
    build: Callable[[], Program]


class EmulatedDriver(Driver):
    """Host-RAM HBM, an allocator, queues and validation; subclasses define how programs run."""

    def __init__(self, profile):
        super().__init__(profile)
        self.capacity = hbm_capacity(profile.hbm_bytes)
        self._map = mmap.mmap(-1, self.capacity + ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        self.hbm = np.frombuffer(self._map, dtype=np.uint8)
        self.allocator = RangeAllocator(ALIGN, self.capacity)
        self._lock = threading.RLock()
        n = profile.cores_per_chip
        self._allocated = [0] * n
        self._peak = [0] * n
        self._count = [0] * n
        self._opened: set[int] = set()
        self._queues: dict[tuple[int, int], float] = {}
        self._core_busy = [0.0] * n
        self._loaded: dict[str, Loaded] = {}  # by program digest, while some caller holds a load of it
        self._loads: dict[str, int] = {}  # loads not yet unloaded, by digest
        self._graphs = threading.local()  # (device, queue) -> executions recorded by this thread
        self._merged_cache: dict[tuple, tuple[Loaded, list[Program]]] = {}

    # -- devices ------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        p = self.profile
        return [DeviceInfo(i, f"{p.name} NeuronCore-v{p.nc_version} #{i} ({self.name})", self.name, p, self.capacity)
                for i in range(p.cores_per_chip)]

    def _device(self, device: int) -> int:
        if not isinstance(device, int) or not 0 <= device < self.profile.cores_per_chip:
            raise InvalidDeviceError(
                f"neuron device {device!r} does not exist: a {self.profile.name} chip has "
                f"{self.profile.cores_per_chip} cores (valid indices 0..{self.profile.cores_per_chip - 1})"
            )
        return device

    def open(self, device: int) -> None:
        self._opened.add(self._device(device))

    # -- memory -------------------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> int:
        self._device(device)
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        with self._lock:
            address = self.allocator.alloc(nbytes, device)
            size = self.allocator._live[address][0]
            self._allocated[device] += size
            self._count[device] += 1
            self._peak[device] = max(self._peak[device], self._allocated[device])
        return address

    def free(self, device: int, address: int) -> None:
        with self._lock:
            size, owner = self.allocator.free(address)
            self._allocated[owner] -= size
            self._count[owner] -= 1

    def _view(self, address: int, nbytes: int) -> np.ndarray:
        self.allocator.check(address, nbytes)
        return self.hbm[address:address + nbytes]

    def write(self, device: int, address: int, data) -> None:
        src = _bytes_of(data)
        self._view(address, src.nbytes)[:] = src

    def read(self, device: int, address: int, out) -> None:
        dst = _bytes_of(out)
        if not dst.flags.writeable:
            raise ValueError("read() needs a writable buffer")
        dst[:] = self._view(address, dst.nbytes)

    def copy(self, device: int, dst: int, src: int, nbytes: int, queue: int = 0) -> None:
        self._view(dst, nbytes)[:] = self._view(src, nbytes)

    def map(self, device: int, address: int, nbytes: int) -> memoryview:
        return memoryview(self._view(address, nbytes))

    def memory_stats(self, device: int) -> MemoryStats:
        self._device(device)
        return MemoryStats(self._allocated[device], self._peak[device], self._count[device],
                           self.allocator.allocated, self.capacity, self.allocator.largest_free())

    def reset_peak(self, device: int) -> None:
        self._peak[self._device(device)] = self._allocated[device]

    # -- programs -----------------------------------------------------------------------------
    def load(self, device: int, program: Program) -> Loaded:
        self._device(device)
        digest = program.digest
        if digest not in self._loaded:
            validate(program, self.profile)
        with self._lock:
            loaded = self._loaded.get(digest)
            if loaded is None:
                loaded = self._loaded[digest] = Loaded(program, prepare=self._prepare)
            self._loads[digest] = self._loads.get(digest, 0) + 1
        return loaded

    def unload(self, device: int, loaded: Loaded) -> None:
        digest = loaded.program.digest
        with self._lock:
            left = self._loads.get(digest, 0) - 1
            if left > 0:
                self._loads[digest] = left
            else:  # the last load of the program: its validation and prepared plans go with it
                self._loads.pop(digest, None)
                self._loaded.pop(digest, None)

    def _prepare(self, program: Program):
        return None

    def execute(self, device: int, loaded: Loaded, args: Sequence[int], queue: int = 0,
                trace: bool = False) -> ExecutionReport:
        self._device(device)
        program = loaded.program
        addresses, scratch = self._bind(device, program, args)
        graph = self._graphs.__dict__.get((device, queue))
        try:
            with self._lock:
                if graph is not None:  # runs now; its time is the graph's (end_graph)
                    self._values(device, loaded, addresses)
                    graph.append((loaded, tuple(int(a) for a in args)))
                    at = self._queues.get((device, queue), 0.0)
                    return ExecutionReport(program.name, device, queue, at, at, len(program.instructions),
                                           in_graph=True)
                start = max(self._queues.get((device, queue), 0.0), self._core_busy[device])
                report = self._run(device, loaded, addresses, start, trace)
                report.queue = queue
                self._queues[(device, queue)] = self._core_busy[device] = report.end_ns
        finally:
            for a in scratch:
                self.free(device, a)
        return report

    # -- graphs: executions recorded as one program ----------------------------------------------
    def begin_graph(self, device: int, queue: int = 0) -> bool:
        self._device(device)
        if (device, queue) in self._graphs.__dict__:
            return False  # nested: the executions go into the open graph
        self._graphs.__dict__[(device, queue)] = []
        return True

    def end_graph(self, device: int, queue: int = 0, trace: bool = False) -> ExecutionReport | None:
        launches = self._graphs.__dict__.pop((device, queue), None)
        if not launches:
            return None
        with self._lock:  # the merged-program cache is shared by every thread's graphs
            loaded, addresses = self._merged(launches)
            start = max(self._queues.get((device, queue), 0.0), self._core_busy[device])
            report = self._time(device, loaded, start, trace)
            report.queue = queue
            self._queues[(device, queue)] = self._core_busy[device] = report.end_ns
        return report

    def _merged(self, launches: list) -> tuple[Loaded, list[int]]:
        """The loaded merged program of ``launches`` and its addresses; cached by the launches' programs and
        how their tensors share buffers (not where the buffers are: a graph's every call reuses its program)."""
        programs = [loaded.program for loaded, _ in launches]
        bindings = [args for _, args in launches]
        lo, hi = merge.spans(programs, bindings)
        which, starts, ends = merge.buffers(lo, hi)
        key = (tuple(map(id, programs)), which.tobytes(), (lo - starts[which]).tobytes(), (ends - starts).tobytes())
        hit, _ = self._merged_cache.pop(key, (None, None))
        if hit is None:
            # valid by construction: its programs were validated at load, and merging keeps every access inside
            # its buffer and every on-chip footprint inside SBUF/PSUM (64-byte / bank aligned shifts). Not kept
            # in the digest-keyed load cache: there is one per graph and buffer layout.
            name = f"graph of {len(programs)} programs"
            content = (self.profile.fingerprint, [p.digest for p in programs], *key[1:])
            hit = self._load_merged(MergedGraph(
                hashlib.sha256(repr(content).encode()).hexdigest(), name, sum(len(p.instructions) for p in programs),
                lambda: merge.merge(programs, bindings, self.profile, name)[0]))
        # most recent last: the oldest goes first. The entry holds its programs: the key has their ids, which a
        # program traced after one of them was let go of (an evicted launch) could otherwise take over
        self._merged_cache[key] = hit, programs
        while len(self._merged_cache) > GRAPH_CACHE_ENTRIES:
            del self._merged_cache[next(iter(self._merged_cache))]
        return hit, [int(s) for s in starts]

    def _load_merged(self, graph: MergedGraph):
        """A merged program ready for :meth:`_time` (a :class:`Loaded`, or what the driver's ``_time`` takes);
        drivers with a cost model may reorder its instructions first (their scheduler must keep every
        dependency: the values still come from the launches one by one), and keep what they derive under
        ``graph.key`` across processes (``neuron_hal.cache``)."""
        program = graph.build()
        return Loaded(program, self._prepare(program))

    def _bind(self, device: int, program: Program, args: Sequence[int]) -> tuple[list[int], list[int]]:
        given = [a for a in program.args if a.role != "scratch"]
        if len(args) != len(given):
            raise ValueError(f"program {program.name!r} takes {len(given)} tensors "
                             f"({', '.join(a.name for a in given)}), got {len(args)} addresses")
        it, addresses, scratch = iter(args), [], []
        for arg in program.args:
            if arg.role == "scratch":
                scratch.append(self.alloc(device, arg.nbytes))
                addresses.append(scratch[-1])
            else:
                address = int(next(it))
                if arg.nbytes == 0:  # an empty tensor (any address, e.g. torch's null data pointer): no bytes
                    addresses.append(address)
                    continue
                try:
                    self.allocator.check(address, arg.nbytes)
                except InvalidAddressError as e:
                    raise InvalidAddressError(f"program {program.name!r} tensor {arg.name!r}: {e}") from None
                addresses.append(address)
        return addresses, scratch

    def _run(self, device: int, loaded: Loaded, addresses: list[int], start_ns: float,
             trace: bool) -> ExecutionReport:
        self._values(device, loaded, addresses)
        return self._time(device, loaded, start_ns, trace)

    def _values(self, device: int, loaded: Loaded, addresses: list[int]) -> None:
        """Compute the program's results in memory."""
        raise NotImplementedError

    def _time(self, device: int, loaded: Loaded, start_ns: float, trace: bool) -> ExecutionReport:
        """The program's execution on the device timeline, starting at ``start_ns``."""
        raise NotImplementedError

    def synchronize(self, device: int, queue: int | None = None) -> None:
        self._device(device)  # emulated execution completes before execute() returns

    def enqueue(self, device: int, queue: int, duration_ns: float) -> tuple[float, float]:
        self._device(device)
        with self._lock:  # the engines stay free: _core_busy does not move
            start = self._queues.get((device, queue), 0.0)
            self._queues[(device, queue)] = end = start + duration_ns
        return start, end

    def timeline(self, device: int, queue: int = 0) -> float:
        self._device(device)
        return self._queues.get((device, queue), 0.0)
