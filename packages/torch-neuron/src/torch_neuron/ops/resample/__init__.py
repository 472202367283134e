"""Resampling: interpolate's forwards and backward, grid_sample of 5-d inputs."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import grid_sample, upsample, upsample_backward  # noqa: F401  (importing registers)
