"""Errors raised through the HAL. Each names what was wrong, the values, and the limit."""

from __future__ import annotations


class NeuronError(RuntimeError):
    """Base of HAL errors."""


class ProgramError(NeuronError, ValueError):
    """An instruction breaks a hardware rule (found before or during execution)."""

    def __init__(self, program: str, index: int, listing: str, rule: str, detail: str):
        self.program, self.index, self.listing, self.rule, self.detail = program, index, listing, rule, detail
        super().__init__(f"program {program!r}, instruction {index} [{rule}]: {detail}\n    {index}: {listing}")


class DeviceOutOfMemoryError(NeuronError, MemoryError):
    """Device memory exhausted. torch-neuron turns this into torch.OutOfMemoryError."""

    def __init__(self, requested: int, free: int, capacity: int, device: int = 0, largest_free: int | None = None):
        self.requested, self.free, self.capacity, self.device = requested, free, capacity, device
        self.largest_free = free if largest_free is None else largest_free
        super().__init__(
            f"neuron device {device}: out of HBM: tried to allocate {_fmt(requested)}, "
            f"{_fmt(free)} free (largest free block {_fmt(self.largest_free)}) of {_fmt(capacity)} capacity"
        )


class DriverNotFoundError(NeuronError, LookupError):
    pass


class InvalidDeviceError(NeuronError, IndexError):
    pass


class InvalidAddressError(NeuronError, ValueError):
    pass


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"
