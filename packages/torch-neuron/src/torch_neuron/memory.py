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


def memory_snapshot() -> list[dict]:
    """The caching allocator's segments of every device, each with its blocks in address order, in
    torch.cuda.memory_snapshot()'s shape (``total_size``, ``allocated_size``, ``segment_type``, ``blocks`` with
    ``size`` / ``requested_size`` / ``state``). No allocation history is kept, so blocks carry no ``frames``."""
    return runtime().allocator.snapshot()


_SUMMARY_ROWS = (("allocated_bytes", "Allocated memory"), ("active_bytes", "Active memory"),
                 ("requested_bytes", "Requested memory"), ("reserved_bytes", "Reserved memory"),
                 ("inactive_split_bytes", "Non-releasable memory"), ("allocation", "Allocations"),
                 ("active", "Active allocs"), ("segment", "Reserved segments"),
                 ("inactive_split", "Non-releasable allocs"))
_COLUMNS = ("current", "peak", "allocated", "freed")


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """memory_stats as torch.cuda.memory_summary lays them out: one row per statistic with its current, peak,
    total allocated and total freed values. The allocator keeps no per-pool split of its statistics, so there
    are no "from large/small pool" rows (the table is the abbreviated one whatever ``abbreviated`` says)."""
    index = _index(device)
    stats = memory_stats(index)
    rule, bar = "-" * 75, "=" * 75
    lines = [bar, f" {'':16} PyTorch NEURON memory summary, device ID {index:<15d} ", rule,
             f"  {'':9} Device OOMs: {stats['num_ooms']:<10d} | {'':6} device alloc retries: "
             f"{stats['num_alloc_retries']:<6d}  ", bar,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for key, name in _SUMMARY_ROWS:
        fmt = _format_size if key.endswith("bytes") else _format_count
        values = [stats[f"{key}.all.{c}"] for c in _COLUMNS]
        lines += [rule, f" {name:<21} | " + " | ".join(fmt(v) for v in values) + " "]
    lines.append(bar)
    return "|" + "|\n|".join(lines) + "|\n"


def _format_size(n: int) -> str:
    """torch.cuda.memory_summary's units: the next unit up while the value is at least 768 of the next one."""
    return _scaled(n, ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB"), 1024, 768 * 1024, 6)


def _format_count(n: int) -> str:
    return _scaled(n, (" ", "K", "M"), 1000, 750 * 1000, 7) + " "


def _scaled(n: int, units: tuple, base: int, limit: int, width: int) -> str:
    unit = 0
    while unit + 1 < len(units) and n >= limit:
        n //= base
        unit += 1
    return f"{n:{width}d} {units[unit]}"
