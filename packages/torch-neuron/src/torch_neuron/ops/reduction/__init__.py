"""Reductions: sums and extremes, index reductions, moments and norms, int64 sums, segment_reduce."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import arg, int64, segment, stats, sums  # noqa: F401  (importing registers)
    arg.register(lib)
    stats.register(lib)
    sums.register(lib)
