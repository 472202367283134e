"""Copying shape ops (cat, flip, roll, tril/triu, pad, ...) and complex views."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import complex_views, shape  # noqa: F401  (importing registers)
