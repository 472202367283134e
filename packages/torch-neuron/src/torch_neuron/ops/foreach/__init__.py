"""Multi-tensor ops: _foreach_*, the fused optimizer steps and GradScaler's ops."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import amp_scale, foreach, optim  # noqa: F401  (importing registers)
