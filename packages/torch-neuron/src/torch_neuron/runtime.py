"""The process's devices: one HAL driver (sim unless NEURON_HAL_DRIVER says otherwise) whose
devices are the NeuronCores of the profile's chip. The C++ core calls the methods of ``RUNTIME``."""

from __future__ import annotations

import functools

from neuron_hal import get_driver

from . import fallback
from .allocator import CachingAllocator


class Runtime:
    def __init__(self):
        self.driver = get_driver()
        self.infos = self.driver.devices()
        self.allocator = CachingAllocator(self.driver)
        self._opened: set[int] = set()

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
        return self.driver.timeline(device, stream)

    def synchronize(self, device: int, stream: int) -> None:
        self.driver.synchronize(device, None if stream < 0 else stream)

    def fallback(self, op: str) -> None:
        fallback.on_fallback(op)


@functools.cache
def runtime() -> Runtime:
    return Runtime()
