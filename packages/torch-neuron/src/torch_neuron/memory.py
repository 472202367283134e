"""Memory statistics of the caching allocator, shaped like torch.cuda's."""

from __future__ import annotations

from .device import _index
from .runtime import runtime


def memory_stats(device=None) -> dict[str, int]:
    return runtime().allocator.stats[_index(device)].as_dict()


def memory_allocated(device=None) -> int:
    return runtime().allocator.stats[_index(device)].allocated


def max_memory_allocated(device=None) -> int:
    return runtime().allocator.stats[_index(device)].peak_allocated


def memory_reserved(device=None) -> int:
    return runtime().allocator.stats[_index(device)].reserved


def max_memory_reserved(device=None) -> int:
    return runtime().allocator.stats[_index(device)].peak_reserved


def reset_peak_memory_stats(device=None) -> None:
    runtime().allocator.reset_peak(_index(device))


def empty_cache() -> None:
    """Return cached blocks to the device (the driver's HBM), as torch.cuda.empty_cache."""
    runtime().allocator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device's HBM as the driver sees it (cached blocks count as used)."""
    stats = runtime().driver.memory_stats(_index(device))
    return stats.free, stats.capacity
