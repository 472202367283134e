"""A caching allocator over HAL device memory, as torch.cuda's: device memory is taken from the driver in segments
and handed out as blocks carved from them, so a training step's allocations stop reaching the driver after the
first step, and a job whose shapes change every step reuses what it has instead of growing.

Requests are rounded up to 512 B blocks. Requests of at most 1 MiB share 2 MiB segments (the small pool); larger
ones take 20 MiB segments below 10 MiB and segments rounded up to 2 MiB above (the large pool), as CUDA's. A request
takes the smallest free block of its pool that holds it (best fit) and splits it when the remainder is worth
keeping (at least 512 B in the small pool, more than 1 MiB in the large one): the remainder stays cached as a free
block, and a freed block merges with the free neighbours of its segment. ``empty_cache`` returns every segment with
nothing allocated in it to the driver; an allocation the driver cannot serve does that and retries once.

Operations are exclusive: other threads wait, and a tensor freed while this thread is inside the allocator (a
garbage collection run by an allocation of its own) is freed when the operation ends.

Streams: the HAL's emulated drivers complete a program before ``execute`` returns, so a block freed after its last
use on any stream is idle and may be reused by any stream at once (what CUDA needs ``record_stream`` for). Every
block is therefore active until freed: ``active_bytes`` equals ``allocated_bytes``.

The statistics are CUDA's (``torch.cuda.memory_stats`` names): block sizes in ``allocated_bytes`` / ``active_bytes``,
segment sizes in ``reserved_bytes``, free blocks of partly used segments in ``inactive_split_bytes``, the requested
bytes in ``requested_bytes``, and counts of allocations, segments and inactive splits.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

import torch

from neuron_hal import DeviceOutOfMemoryError

MIN_BLOCK = 512  # every block is a multiple of this (kMinBlockSize)
SMALL_SIZE = 1 << 20  # requests up to this share the small pool's segments (kSmallSize)
SMALL_SEGMENT = 2 << 20  # kSmallBuffer
LARGE_SEGMENT = 20 << 20  # the segment of a large request below MIN_LARGE_ALLOC (kLargeBuffer)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # segments of larger requests are rounded up to this (kRoundLarge)


def round_size(nbytes: int) -> int:
    """The block size of a request: a multiple of 512 B, at least 512 B."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """The driver allocation a block of ``size`` bytes is carved from when no cached block holds it."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class Stat:
    """One statistic as CUDA keeps it: current and peak value, and the totals added and removed."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        if self.current > self.peak:
            self.peak = self.current

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n


STATS = ("allocation", "segment", "inactive_split", "allocated_bytes", "reserved_bytes", "inactive_split_bytes",
         "requested_bytes")
SAME = {"active": "allocation", "active_bytes": "allocated_bytes"}  # no block waits for a stream (see above)


class DeviceStats:
    def __init__(self):
        for name in STATS:
            setattr(self, name, Stat())
        self.ooms = self.retries = self.device_allocs = self.device_frees = 0

    # the allocator's hot path: every tensor's allocation and free updates these (Stat.add / sub written out)
    def on_alloc(self, size: int, requested: int) -> None:
        """A block of ``size`` bytes handed out for ``requested`` bytes (the inactive splits were counted as blocks
        entered and left the pools; their peaks are taken here, once per operation)."""
        self._split_peaks()
        a, b, r = self.allocation, self.allocated_bytes, self.requested_bytes
        a.current += 1
        a.allocated += 1
        b.current += size
        b.allocated += size
        r.current += requested
        r.allocated += requested
        if b.current > b.peak:
            b.peak = b.current
        if a.current > a.peak:
            a.peak = a.current
        if r.current > r.peak:
            r.peak = r.current

    def _split_peaks(self) -> None:
        n, b = self.inactive_split, self.inactive_split_bytes
        if b.current > b.peak:
            b.peak = b.current
        if n.current > n.peak:
            n.peak = n.current

    def on_free(self, size: int, requested: int) -> None:
        self._split_peaks()
        a, b, r = self.allocation, self.allocated_bytes, self.requested_bytes
        a.current -= 1
        a.freed += 1
        b.current -= size
        b.freed += size
        r.current -= requested
        r.freed += requested

    def as_dict(self) -> dict[str, int]:
        out = {}
        for name in (*STATS, *SAME):
            s = getattr(self, SAME.get(name, name))
            out |= {f"{name}.all.current": s.current, f"{name}.all.peak": s.peak,
                    f"{name}.all.allocated": s.allocated, f"{name}.all.freed": s.freed}
        return out | {"num_alloc_retries": self.retries, "num_ooms": self.ooms,
                      "num_device_alloc": self.device_allocs, "num_device_free": self.device_frees}

    def reset_peak(self) -> None:
        for name in STATS:
            s = getattr(self, name)
            s.peak = s.current

    def reset_accumulated(self) -> None:
        """As torch.cuda.reset_accumulated_memory_stats: the totals added and removed, and the event counts."""
        for name in STATS:
            s = getattr(self, name)
            s.allocated = s.freed = 0
        self.ooms = self.retries = self.device_allocs = self.device_frees = 0


class Block:
    """A piece of a segment: [address, address + size), allocated or free, with its neighbours in the segment."""

    __slots__ = ("device", "address", "size", "requested", "pool", "prev", "next", "allocated")

    def __init__(self, device: int, address: int, size: int, pool: list):
        self.device, self.address, self.size, self.pool = device, address, size, pool  # pool: where it goes free
        self.requested, self.prev, self.next, self.allocated = 0, None, None, False

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class CachingAllocator:
    def __init__(self, driver):
        self.driver = driver
        # free blocks as sorted (size, address) lists: pools[device][small] (large pool first)
        self.pools: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
        self.blocks: dict[int, Block] = {}  # address -> every block, free or allocated
        self.segments: list[tuple[int, int, int]] = []  # sorted (start, size, device) of the driver allocations
        self.stats: dict[int, DeviceStats] = defaultdict(DeviceStats)
        self._lock = threading.RLock()
        self._busy = False  # inside an operation: a free arriving now (see ``free``) waits in ``_deferred``
        self._deferred: list[int] = []

    def _exclusive(self, fn, *args):
        """``fn(*args)`` with the pools to itself: other threads wait; frees this thread makes meanwhile (a garbage
        collection inside the operation finalizing tensors) run after it, on consistent pools."""
        with self._lock:
            self._busy = True
            try:
                return fn(*args)
            finally:
                self._drain()

    def _drain(self) -> None:
        try:
            while self._deferred:
                self._free(self._deferred.pop())
        finally:
            self._busy = False

    # -- allocation ------------------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> int:
        with self._lock:  # _exclusive(self._alloc, ...), inlined: every tensor comes here
            self._busy = True
            try:
                return self._alloc(device, nbytes)
            finally:
                if self._deferred:
                    self._drain()
                self._busy = False

    def _alloc(self, device: int, nbytes: int) -> int:
        size = max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)  # round_size, inlined (as below: the hot path)
        small = size <= SMALL_SIZE
        pool = self.pools[device][small]
        stats = self.stats[device]
        i = bisect.bisect_left(pool, (size, 0))  # best fit: the smallest free block that holds it (lowest address)
        if i < len(pool):
            block = self.blocks[pool.pop(i)[1]]
            if block.prev is not None or block.next is not None:  # it was an inactive split
                _inactive_split(stats, -1, block.size)
        else:
            block = self._segment(device, size, pool, nbytes)
        # CUDA's rule: split off a remainder of at least a block in the small pool, of more than 1 MiB in the large
        # one (a smaller remainder stays with the block: large requests of nearly the same size share blocks)
        if block.size - size >= (MIN_BLOCK if small else SMALL_SIZE + 1):
            self._split(block, size, stats)
        block.allocated, block.requested = True, nbytes
        stats.on_alloc(block.size, nbytes)
        return block.address

    def _segment(self, device: int, size: int, pool: list, nbytes: int) -> Block:
        """A new segment holding a block of ``size`` bytes. When the driver cannot serve it, the cached segments go
        back to the driver and it is retried; a rounded-up segment that still does not fit gives way to one of
        the block's size; that not fitting either is torch's out-of-memory error."""
        want = segment_size(size)
        address = self._driver_alloc(device, want)
        if isinstance(address, DeviceOutOfMemoryError):
            self.stats[device].retries += 1
            self._empty(device)
            address = self._driver_alloc(device, want)
        if isinstance(address, DeviceOutOfMemoryError) and want > size:
            want, address = size, self._driver_alloc(device, size)
        if isinstance(address, DeviceOutOfMemoryError):
            self._raise_oom(device, nbytes, address)
        bisect.insort(self.segments, (address, want, device))
        block = self.blocks[address] = Block(device, address, want, pool)
        s = self.stats[device]
        s.segment.add(1)
        s.reserved_bytes.add(want)
        s.device_allocs += 1
        return block

    def _driver_alloc(self, device: int, nbytes: int) -> int | DeviceOutOfMemoryError:
        try:
            return self.driver.alloc(device, nbytes)
        except DeviceOutOfMemoryError as e:
            return e

    def _raise_oom(self, device: int, nbytes: int, e: DeviceOutOfMemoryError):
        s = self.stats[device]
        s.ooms += 1
        allocated, reserved = s.allocated_bytes.current, s.reserved_bytes.current
        raise torch.OutOfMemoryError(
            f"neuron:{device} out of memory: tried to allocate {_fmt(nbytes)}; {_fmt(e.free)} free of "
            f"{_fmt(e.capacity)} HBM capacity (largest free block {_fmt(e.largest_free)}); "
            f"{_fmt(allocated)} allocated by tensors, {_fmt(reserved - allocated)} cached. "
            f"Lower the batch size, free tensors, or raise NEURON_SIM_HBM_BYTES on the simulator."
        ) from None

    def _split(self, block: Block, size: int, stats: DeviceStats) -> None:
        rest = Block(block.device, block.address + size, block.size - size, block.pool)
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next, block.size = rest, size
        self.blocks[rest.address] = rest
        bisect.insort(rest.pool, (rest.size, rest.address))  # _insert_free: rest is an inactive split
        _inactive_split(stats, 1, rest.size)

    # -- freeing ---------------------------------------------------------------------------------
    def free(self, device: int, address: int) -> None:
        with self._lock:
            if self._busy:  # called back from inside an operation of this thread: after it
                self._deferred.append(address)
                return
            self._busy = True
            try:
                self._free(address)
            finally:
                if self._deferred:
                    self._drain()
                self._busy = False

    def _free(self, address: int) -> None:
        block = self.blocks[address]
        stats, size, requested = self.stats[block.device], block.size, block.requested
        block.allocated, block.requested = False, 0
        before, after = block.prev, block.next
        if before is not None and not before.allocated:
            self._remove_free(before)
            block = _merge(before, block, self.blocks)
        if after is not None and not after.allocated:
            self._remove_free(after)
            block = _merge(block, after, self.blocks)
        self._insert_free(block)
        stats.on_free(size, requested)

    def _insert_free(self, block: Block) -> None:
        bisect.insort(block.pool, (block.size, block.address))
        if block.prev is not None or block.next is not None:  # is_split
            _inactive_split(self.stats[block.device], 1, block.size)

    def _remove_free(self, block: Block) -> None:
        pool = block.pool
        del pool[bisect.bisect_left(pool, (block.size, block.address))]
        if block.prev is not None or block.next is not None:  # is_split
            _inactive_split(self.stats[block.device], -1, block.size)

    def empty_cache(self, device: int | None = None) -> None:
        """Return every segment with no allocated block (one free block spanning it) to the driver."""
        self._exclusive(self._empty, device)

    def _empty(self, device: int | None) -> None:
        for dev, pools in list(self.pools.items()):
            if device is not None and dev != device:
                continue
            for pool in pools:
                for _, address in [entry for entry in pool if not self.blocks[entry[1]].is_split]:
                    self._release(self.blocks[address])

    def _release(self, block: Block) -> None:
        self._remove_free(block)
        del self.blocks[block.address]
        del self.segments[bisect.bisect_left(self.segments, (block.address,))]
        self.driver.free(block.device, block.address)
        s = self.stats[block.device]
        s.segment.sub(1)
        s.reserved_bytes.sub(block.size)
        s.device_frees += 1

    # -- queries ---------------------------------------------------------------------------------
    def device_of(self, address: int) -> int:
        """The device whose memory holds ``address`` (any byte of a segment), or -1."""
        i = bisect.bisect_right(self.segments, (address, float("inf"))) - 1
        if i >= 0:
            start, size, device = self.segments[i]
            if address < start + size:
                return device
        return -1

    def snapshot(self) -> list[dict]:
        """Every segment with its blocks in address order, as torch.cuda.memory_snapshot() lists them."""
        with self._lock:
            return [self._segment_info(start, size, device) for start, size, device in self.segments]

    def _segment_info(self, start: int, size: int, device: int) -> dict:
        first = block = self.blocks[start]
        blocks = []
        while block is not None:
            blocks.append({"address": block.address, "size": block.size, "requested_size": block.requested,
                           "state": "active_allocated" if block.allocated else "inactive"})
            block = block.next
        used = [b for b in blocks if b["state"] == "active_allocated"]
        allocated = sum(b["size"] for b in used)
        return {"device": device, "address": start, "total_size": size, "allocated_size": allocated,
                "active_size": allocated, "requested_size": sum(b["requested_size"] for b in used), "stream": 0,
                "segment_type": "small" if first.pool is self.pools[device][1] else "large",
                "is_expandable": False, "blocks": blocks}

    def reset_peak(self, device: int) -> None:
        self.stats[device].reset_peak()

    def reset_accumulated(self, device: int) -> None:
        self.stats[device].reset_accumulated()


def _inactive_split(stats: DeviceStats, n: int, size: int) -> None:
    """A free block of ``size`` bytes in a partly used segment entering (n = 1) or leaving (n = -1) a pool; the
    peaks are taken once per operation (DeviceStats.on_alloc / on_free)."""
    count, nbytes = stats.inactive_split, stats.inactive_split_bytes
    count.current += n
    nbytes.current += n * size
    if n > 0:
        count.allocated += 1
        nbytes.allocated += size
    else:
        count.freed += 1
        nbytes.freed += size


def _merge(first: Block, second: Block, blocks: dict) -> Block:
    """One free block of two free neighbours of a segment, ``first`` before ``second`` (neither in a pool)."""
    first.size += second.size
    first.next = second.next
    if second.next is not None:
        second.next.prev = first
    del blocks[second.address]
    return first


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
