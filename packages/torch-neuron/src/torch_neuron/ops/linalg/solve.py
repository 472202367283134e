"""Solvers, inverses and determinants from the device LU and Cholesky factorizations (linalg/cholesky.py, linalg/lu.py).

Registered (float32; other dtypes take the CPU path): ``linalg_lu_solve``, ``_linalg_solve_ex``,
``linalg_inv_ex``, ``_linalg_det``, ``_linalg_slogdet``, ``_cholesky_solve_helper``, ``cholesky_inverse``
(each with its out= overload where aten has one). Singular inputs give LAPACK's info (the first exactly-zero
diagonal of U) and, when asked to check errors, torch's own LinAlgError via ``_linalg_check_errors``.
"""

from __future__ import annotations

import torch

from ..core.checks import constant, meta_result
from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.registry import note_native
from .cholesky import batched, eye, flat, native, solve_tri
from .lu import _factor, permutation

aten = torch.ops.aten


# -- LU solve ----------------------------------------------------------------------------------------------
def _rows(b: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """P^T B: row i is B[perm[i]] (b [B, n, k], perm int32 [B, n])."""
    return b.gather(1, perm.unsqueeze(-1).expand(b.shape))


def _unrows(z: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """P Z: row perm[i] is Z[i]."""
    return torch.empty(z.shape, dtype=z.dtype, device=z.device).scatter_(1, perm.unsqueeze(-1).expand(z.shape), z)


def lu_solve(lu, piv, b, left: bool, adjoint: bool, shape) -> torch.Tensor:
    """X with A X = B (``left``) or X A = B, A = P L U given as (LU, pivots), A^T when ``adjoint``; broadcast
    over batches to ``shape``."""
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return lu_solve(lu, piv, b.mT, True, not adjoint, shape[:-2] + shape[-2:][::-1]).mT
    batch, n, k = shape[:-2], shape[-2], shape[-1]
    w = batched(lu, batch, n, n)
    perm = permutation(flat(piv, batch, n), n)
    rhs = flat(b, batch, n, k)
    if adjoint:  # U^T L^T P^T X = B
        z = solve_tri(w.mT, solve_tri(w.mT, rhs, upper=False), upper=True, unit=True)
        x = _unrows(z, perm)
    else:  # L U X = P^T B
        x = solve_tri(w, solve_tri(w, _rows(rhs, perm), upper=False, unit=True), upper=True)
    return x.reshape(shape)


def linalg_lu_solve(lu, piv, b, *, left=True, adjoint=False):
    meta = meta_result(aten.linalg_lu_solve.default, lu, piv, b, left=left, adjoint=adjoint)
    if not native(lu, b) or piv.dtype != torch.int32:
        return on_cpu(aten.linalg_lu_solve.default, lu, piv, b, left=left, adjoint=adjoint)
    if meta.numel() == 0:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=b.device)
    note_native("linalg_lu_solve")
    return lu_solve(lu, piv, b, left, adjoint, meta.shape)


def linalg_lu_solve_out(lu, piv, b, *, left=True, adjoint=False, out):
    return write_outs((out,), (linalg_lu_solve(lu, piv, b, left=left, adjoint=adjoint),))[0]


# -- solve / inverse ---------------------------------------------------------------------------------------
def _vector_rhs(a, b) -> bool:
    """torch's rule: B is a (batch of) vector(s) when 1-D or shaped like A without its last dimension."""
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])


def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    kw = dict(left=left, check_errors=check_errors)
    metas = meta_result(aten._linalg_solve_ex.default, a, b, **kw)
    if not native(a, b):
        return on_cpu(aten._linalg_solve_ex.default, a, b, **kw)
    lu, piv, info = _factor(a)
    if check_errors:
        torch._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=a.dim() == 2)
    res = metas[0]
    if res.numel() == 0:
        x = torch.zeros(res.shape, dtype=res.dtype, device=a.device)
    else:
        vec = _vector_rhs(a, b)
        rhs = b.unsqueeze(-1) if vec else b
        shape = res.shape + (1,) if vec else res.shape
        x = lu_solve(lu, piv, rhs, left, False, shape).reshape(res.shape)
    note_native("_linalg_solve_ex")
    return x, lu, piv, info


def linalg_solve_ex_out(a, b, *, left=True, check_errors=False, result, LU, pivots, info):
    return write_outs((result, LU, pivots, info), linalg_solve_ex(a, b, left=left, check_errors=check_errors))


def linalg_inv_ex(a, *, check_errors=False):
    meta_result(aten.linalg_inv_ex.default, a, check_errors=check_errors)
    if not native(a):
        return on_cpu(aten.linalg_inv_ex.default, a, check_errors=check_errors)
    lu, piv, info = _factor(a)
    if check_errors:
        torch._linalg_check_errors(info, "linalg.inv_ex", is_matrix=a.dim() == 2)
    n = a.shape[-1]
    if a.numel() == 0:
        inv = torch.zeros(a.shape, dtype=a.dtype, device=a.device)
    else:
        inv = lu_solve(lu, piv, eye(n, a.device), True, False, a.shape)
    note_native("linalg_inv_ex")
    return inv, info


def linalg_inv_ex_out(a, *, check_errors=False, inverse, info):
    return write_outs((inverse, info), linalg_inv_ex(a, check_errors=check_errors))


# -- determinants ------------------------------------------------------------------------------------------
def _perm_sign(piv: torch.Tensor) -> torch.Tensor:
    """(-1)^(number of actual swaps) as float32 [...]."""
    k = piv.shape[-1]
    if k == 0 or piv.numel() == 0:
        return torch.ones(piv.shape[:-1], dtype=torch.float32, device=piv.device)
    steps = constant(("steps1", k), piv.device, lambda: torch.arange(1, k + 1, dtype=torch.int32))
    swaps = (piv != steps).to(torch.float32).sum(-1)  # counted in FP32: exact up to 2**24 swaps
    return 1.0 - 2.0 * torch.remainder(swaps, 2.0)


def _det_parts(a: torch.Tensor):
    """LU of A, or of A^T when A is contiguous, as aten does (det(A^T) = det(A)): the backward formulas
    read the LU with that convention."""
    lu, piv, _ = _factor(a.mT if a.is_contiguous() else a)
    return lu, piv, lu.diagonal(dim1=-2, dim2=-1), _perm_sign(piv)


def linalg_det(a):
    meta_result(aten._linalg_det.default, a)
    if not native(a):
        return on_cpu(aten._linalg_det.default, a)
    lu, piv, diag, sign = _det_parts(a)
    note_native("_linalg_det")
    return sign * diag.prod(-1), lu, piv


def linalg_det_out(a, *, result, LU, pivots):
    return write_outs((result, LU, pivots), linalg_det(a))


def linalg_slogdet(a):
    meta_result(aten._linalg_slogdet.default, a)
    if not native(a):
        return on_cpu(aten._linalg_slogdet.default, a)
    lu, piv, diag, sign = _det_parts(a)
    note_native("_linalg_slogdet")
    return sign * diag.sign().prod(-1), diag.abs().log().sum(-1), lu, piv


def linalg_slogdet_out(a, *, sign, logabsdet, LU, pivots):
    return write_outs((sign, logabsdet, LU, pivots), linalg_slogdet(a))


# -- Cholesky solve / inverse ------------------------------------------------------------------------------
def cholesky_solve_helper(b, fac, upper):
    """X with (L L^T) X = B (U^T U when ``upper``); aten broadcasts b and fac before calling the helper."""
    meta = meta_result(aten._cholesky_solve_helper.default, b, fac, upper)
    if not native(b, fac):
        return on_cpu(aten._cholesky_solve_helper.default, b, fac, upper)
    if meta.numel() == 0:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=b.device)
    batch, n, k = meta.shape[:-2], meta.shape[-2], meta.shape[-1]
    lo = batched(fac.mT if upper else fac, batch, n, n)
    y = solve_tri(lo, batched(b, batch, n, k), upper=False)
    note_native("cholesky_solve")
    return solve_tri(lo.mT, y, upper=True).reshape(meta.shape)


def cholesky_inverse(fac, upper=False):
    """(L L^T)^-1 = L^-T L^-1 (U^-1 U^-T when ``upper``): one triangular solve against I and one GEMM."""
    meta = meta_result(aten.cholesky_inverse.default, fac, upper)
    if not native(fac):
        return on_cpu(aten.cholesky_inverse.default, fac, upper)
    if meta.numel() == 0:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=fac.device)
    batch, n = meta.shape[:-2], meta.shape[-1]
    lo = batched(fac.mT if upper else fac, batch, n, n)
    linv = solve_tri(lo, eye(n, fac.device).expand(lo.shape), upper=False)
    note_native("cholesky_inverse")
    return torch.bmm(linv.mT, linv).reshape(meta.shape)


def cholesky_inverse_out(fac, upper=False, *, out):
    return write_outs((out,), (cholesky_inverse(fac, upper),))[0]
