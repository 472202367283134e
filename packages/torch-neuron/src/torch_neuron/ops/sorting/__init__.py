"""Sorting and selection: sort/topk/median/mode, unique, scans, searchsorted/bucketize/isin, histc."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import hist, network, rank, scan, search, sort, unique  # noqa: F401  (importing registers)
    hist.register(lib)
    scan.register(lib)
    search.register(lib)
    sort.register(lib)
    unique.register(lib)
