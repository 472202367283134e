"""Pointwise ops: one kernel call per overload (base), formula programs (expr), and the op tables."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import arithmetic, base, bessel, bits, complex, expr, int64, misc, polynomials, special  # noqa: F401  (importing registers)
    bits.register(lib)
