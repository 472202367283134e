"""Normalization: layer/RMS/group norm, batch norm, softmax and log_softmax."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import batch_norm, norms, softmax
    batch_norm.register(lib)
    norms.register(lib)
    softmax.register(lib)
