"""Random numbers: the distributions' in-place samplers and multinomial."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import distributions, multinomial  # noqa: F401  (importing registers)
    distributions.register(lib)
