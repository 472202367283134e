"""Memory statistics of the caching allocator, shaped like torch.cuda's."""

from __future__ import annotations

from .device import _index
from .runtime import runtime


def _stats(device):
    return runtime().allocator.stats[_index(device)]


def memory_stats(device=None) -> dict[str, int]:
    """torch.cuda.memory_stats' keys (see ``allocator``), for one device."""
    return _stats(device).as_dict()


def memory_allocated(device=None) -> int:
    return _stats(device).allocated_bytes.current


def max_memory_allocated(device=None) -> int:
    return _stats(device).allocated_bytes.peak


def memory_reserved(device=None) -> int:
    return _stats(device).reserved_bytes.current


def max_memory_reserved(device=None) -> int:
    return _stats(device).reserved_bytes.peak


def reset_peak_memory_stats(device=None) -> None:
    runtime().allocator.reset_peak(_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    """Zero the totals (``*.allocated`` / ``*.freed``) and event counts, as torch.cuda's."""
    runtime().allocator.reset_accumulated(_index(device))


def empty_cache() -> None:
    """Return every cached segment with no tensor in it to the device (the driver's HBM), as
    torch.cuda.empty_cache: reserved memory drops to the segments live tensors occupy."""
    runtime().allocator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device's HBM as the driver sees it (cached blocks count as used)."""
    stats = runtime().driver.memory_stats(_index(device))
    return stats.free, stats.capacity
