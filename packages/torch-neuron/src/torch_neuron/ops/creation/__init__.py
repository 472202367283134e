"""Tensor creation: fill_/zero_/masked_fill, eye and arange."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import arange_double, fill  # noqa: F401  (importing registers)
