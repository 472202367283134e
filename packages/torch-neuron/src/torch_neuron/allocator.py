"""A caching allocator over HAL device memory, as torch.cuda's: freed blocks are kept per rounded
size and reused, so a training step's allocations stop reaching the driver after the first step.

Block sizes are rounded up (512 B below 1 MiB, 2 MiB above) so that similar requests share
blocks; the statistics count those block sizes, as CUDA's do.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from neuron_hal import DeviceOutOfMemoryError

SMALL, SMALL_LIMIT, LARGE = 512, 1 << 20, 2 << 20


def round_size(nbytes: int) -> int:
    unit = SMALL if nbytes < SMALL_LIMIT else LARGE
    return -(-nbytes // unit) * unit


class DeviceStats:
    def __init__(self):
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.allocations = self.peak_allocations = self.alloc_count = self.free_count = 0
        self.ooms = self.retries = 0
        self.requested = self.peak_requested = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak_allocated,
            "allocated_bytes.all.allocated": self.alloc_count, "allocated_bytes.all.freed": self.free_count,
            "requested_bytes.all.current": self.requested, "requested_bytes.all.peak": self.peak_requested,
            "reserved_bytes.all.current": self.reserved, "reserved_bytes.all.peak": self.peak_reserved,
            "active_bytes.all.current": self.allocated, "active_bytes.all.peak": self.peak_allocated,
            "allocation.all.current": self.allocations, "allocation.all.peak": self.peak_allocations,
            "num_alloc_retries": self.retries, "num_ooms": self.ooms,
        }


class CachingAllocator:
    def __init__(self, driver):
        self.driver = driver
        self.cache: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))  # device -> size -> addrs
        self.live: dict[int, tuple[int, int, int]] = {}  # address -> (device, block size, requested)
        self.stats: dict[int, DeviceStats] = defaultdict(DeviceStats)

    def alloc(self, device: int, nbytes: int) -> int:
        size = round_size(nbytes)
        free_list = self.cache[device][size]
        s = self.stats[device]
        if free_list:
            address = free_list.pop()
        else:
            address = self._fresh(device, size, nbytes)
            s.reserved += size
            s.peak_reserved = max(s.peak_reserved, s.reserved)
        self.live[address] = (device, size, nbytes)
        s.allocated += size
        s.requested += nbytes
        s.allocations += 1
        s.alloc_count += size
        s.peak_allocated = max(s.peak_allocated, s.allocated)
        s.peak_requested = max(s.peak_requested, s.requested)
        s.peak_allocations = max(s.peak_allocations, s.allocations)
        return address

    def _fresh(self, device: int, size: int, nbytes: int) -> int:
        try:
            return self.driver.alloc(device, size)
        except DeviceOutOfMemoryError:
            self.stats[device].retries += 1
            self.empty_cache(device)
        try:
            return self.driver.alloc(device, size)
        except DeviceOutOfMemoryError as e:
            self.stats[device].ooms += 1
            s = self.stats[device]
            raise torch.OutOfMemoryError(
                f"neuron:{device} out of memory: tried to allocate {_fmt(nbytes)}; {_fmt(e.free)} free of "
                f"{_fmt(e.capacity)} HBM capacity (largest free block {_fmt(e.largest_free)}); "
                f"{_fmt(s.allocated)} allocated by tensors, {_fmt(s.reserved - s.allocated)} cached. "
                f"Lower the batch size, free tensors, or raise NEURON_SIM_HBM_BYTES on the simulator."
            ) from None

    def free(self, device: int, address: int) -> None:
        device, size, nbytes = self.live.pop(address)
        s = self.stats[device]
        s.allocated -= size
        s.requested -= nbytes
        s.allocations -= 1
        s.free_count += size
        self.cache[device][size].append(address)

    def empty_cache(self, device: int | None = None) -> None:
        for dev in [device] if device is not None else list(self.cache):
            for size, addresses in self.cache[dev].items():
                for address in addresses:
                    self.driver.free(dev, address)
                self.stats[dev].reserved -= size * len(addresses)
            self.cache[dev].clear()

    def device_of(self, address: int) -> int:
        hit = self.live.get(address)
        if hit is not None:
            return hit[0]
        for start, (device, size, _) in self.live.items():
            if start <= address < start + size:
                return device
        return -1

    def reset_peak(self, device: int) -> None:
        s = self.stats[device]
        s.peak_allocated, s.peak_reserved = s.allocated, s.reserved
        s.peak_requested, s.peak_allocations = s.requested, s.allocations


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
