"""Convolution forward and backward."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import convolution  # noqa: F401  (importing registers)
