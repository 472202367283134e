"""The process's devices: one HAL driver (sim unless NEURON_HAL_DRIVER says otherwise) whose
devices are the NeuronCores of the profile's chip. The C++ core calls the methods of ``RUNTIME``."""

from __future__ import annotations

import functools
from collections import defaultdict

from neuron_hal import get_driver

from . import fallback
from .allocator import CachingAllocator
from .tools import telemetry


class Runtime:
    def __init__(self):
        self.driver = get_driver()
        self.infos = self.driver.devices()
        self.allocator = CachingAllocator(self.driver)
        self._opened: set[int] = set()
        self._queues: defaultdict[int, set[int]] = defaultdict(lambda: {0})  # device -> queues events have seen
        self.telemetry = telemetry.start(self)  # for neuron-top / neuron-ls; off with NEURON_TELEMETRY=0

    @property
    def profile(self):
        return self.driver.profile

    def device_count(self) -> int:
        return len(self.infos)

    def open(self, device: int) -> None:
        if device not in self._opened:
            self.driver.open(device)
            self._opened.add(device)

    # -- called from C++ -------------------------------------------------------------------------
    def alloc(self, device: int, nbytes: int) -> int:
        self.open(device)
        return self.allocator.alloc(device, nbytes)

    def free(self, device: int, address: int) -> None:
        self.allocator.free(device, address)

    def copy(self, device: int, dst: int, src: int, nbytes: int) -> None:
        self.driver.copy(device, dst, src, nbytes)

    def device_of(self, address: int) -> int:
        return self.allocator.device_of(address)

    def timeline(self, device: int, stream: int) -> float:
        """The device time an event recorded now on ``stream`` marks: when the stream's submitted work
        completes, and not before the device's present. A core runs one program at a time whatever its
        queue, so work issued next on an idle stream starts when the other queues' work ends; an event on
        that stream must mark that moment, not the stream's last (possibly long past) completion."""
        queues = self._queues[device]
        queues.add(stream)
        return max(self.driver.timeline(device, q) for q in queues)

    def synchronize(self, device: int, stream: int) -> None:
        self.driver.synchronize(device, None if stream < 0 else stream)

    def fallback(self, op: str) -> None:
        fallback.on_fallback(op)

    def memory(self, request: str, device: int):
        """What c10's DeviceAllocator interface (torch.accelerator's memory functions) asks of the allocator."""
        from . import memory

        answers = {"stats": memory.memory_stats, "reset_peak": memory.reset_peak_memory_stats,
                   "reset_accumulated": memory.reset_accumulated_memory_stats, "info": memory.mem_get_info,
                   "empty_cache": lambda device: memory.empty_cache()}
        return answers[request](device)


@functools.cache
def runtime() -> Runtime:
    return Runtime()
