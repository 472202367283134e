"""The fused LSTM and GRU cell ops."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import cells  # noqa: F401  (importing registers)
