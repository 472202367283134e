"""Indexing: gather/scatter, advanced indexing, index updates, reducing scatters, put/masked_scatter, nonzero."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import advanced, flat, gather_scatter, nonzero_static, scatter_reduce, update  # noqa: F401  (importing registers)
