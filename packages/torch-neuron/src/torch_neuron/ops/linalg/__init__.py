"""Linear algebra: matrix products on TensorE, factorizations and solvers composed from device ops, distances."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import cholesky, distance, eig, lstsq, lu, matmul, matrix_exp, qr, solve  # noqa: F401  (importing registers)
