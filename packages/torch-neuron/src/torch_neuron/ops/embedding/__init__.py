"""Embedding lookups, bags and renorm."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import bag, lookup, renorm  # noqa: F401  (importing registers)
    lookup.register(lib)
