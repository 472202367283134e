"""Losses: the elementwise losses and nll_loss."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import elementwise, nll
    elementwise.register(lib)
    nll.register(lib)
