"""Cholesky factorization and triangular solves composed from device ops (no LAPACK on Trainium).

Each algorithm is a host loop issuing device kernels on a batch of matrices [B, n, n] at once: matrix
products on TensorE (the ``mm``/``bmm``/``baddbmm`` ops), elementwise ops and reductions on the other
engines, FP32 throughout. Matrices larger than ``BLOCK`` are split in halves recursively, so most of the
flops land in large GEMMs (trailing updates) and only ``BLOCK``-sized diagonal blocks run column by column.

Registered: ``linalg_cholesky_ex`` (+ ``.L``), ``cholesky`` (+ ``.out``), ``linalg_solve_triangular``
(+ ``.out``), ``triangular_solve`` (+ ``.X``). float32 only: float64/complex take the CPU (policy), and the
16-bit dtypes too (torch's CPU kernels refuse them, so the CPU path raises torch's own error).
"""

from __future__ import annotations

import torch

from ..core.checks import constant, meta_result, same_device
from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.registry import note_native

aten = torch.ops.aten
BLOCK = 32  # diagonal blocks up to this size are factored/solved by rows or columns, larger ones are split


# -- shared helpers (also used by linalg.lu) --------------------------------------------------------
def native(*tensors) -> bool:
    """float32 tensors on one neuron device (others take the CPU path)."""
    same_device(*tensors)
    return all(t.dtype == torch.float32 for t in tensors if t is not None)


def flat(t: torch.Tensor, batch, *tail: int) -> torch.Tensor:
    """``t`` broadcast to ``batch + tail`` and flattened to [B, *tail] (B counted, so empty tails work)."""
    bs = 1
    for d in batch:
        bs *= d
    return t.expand(*batch, *tail).reshape(bs, *tail)


def batched(t: torch.Tensor, batch, rows: int, cols: int) -> torch.Tensor:
    """A contiguous working copy of ``t`` broadcast to ``batch`` and flattened to [B, rows, cols]."""
    return flat(t, batch, rows, cols).clone(memory_format=torch.contiguous_format)


def eye(n: int, device: torch.device) -> torch.Tensor:
    return constant(("eye32", n), device, lambda: torch.eye(n, dtype=torch.float32))


def zeros_like(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device)


def first_failure(info: torch.Tensor, bad: torch.Tensor, index: int) -> torch.Tensor:
    """LAPACK's info: the 1-based ``index`` of the first failing step per batch element (0: none yet)."""
    return torch.where(bad & (info == 0), index, info)


def merge_info(info1: torch.Tensor, info2: torch.Tensor, offset: int) -> torch.Tensor:
    """Info of a matrix split in two: the first block's failure wins, the second's is shifted by ``offset``."""
    return torch.where(info1 != 0, info1, torch.where(info2 != 0, info2 + offset, 0))


# -- Cholesky ----------------------------------------------------------------------------------------------
def _chol_columns(a: torch.Tensor):
    """Left-looking Cholesky of [B, n, n] (lower triangle read): column j is A[j:, j] minus L[j:, :j] @ L[j, :j],
    one GEMV on TensorE, then scaled by the square root of its first entry."""
    bs, n, _ = a.shape
    lo = zeros_like(a)
    info = torch.zeros(bs, dtype=torch.int32, device=a.device)
    for j in range(n):
        col = a[:, j:, j]
        if j:
            col = col - torch.bmm(lo[:, j:, :j], lo[:, j, :j].unsqueeze(-1)).squeeze(-1)
        d = col[:, :1]
        info = first_failure(info, (d > 0).logical_not().squeeze(1), j + 1)  # NaN fails too, as in potrf
        lo[:, j:, j] = col / d.sqrt()
    return lo, info


def cholesky_lower(a: torch.Tensor):
    """(L, info) for a batch [B, n, n] (only its lower triangle is read). A failed element is NaN from its
    failing column on (LAPACK leaves it partly factored; torch's callers raise or ignore it)."""
    n = a.shape[-1]
    if n <= BLOCK:
        return _chol_columns(a)
    h = n // 2
    l11, info1 = cholesky_lower(a[:, :h, :h])
    l21 = solve_tri(l11, a[:, h:, :h].mT, upper=False).mT  # L21 L11^T = A21
    l22, info2 = cholesky_lower(torch.baddbmm(a[:, h:, h:], l21, l21.mT, alpha=-1))
    lo = zeros_like(a)
    lo[:, :h, :h] = l11
    lo[:, h:, :h] = l21
    lo[:, h:, h:] = l22
    return lo, merge_info(info1, info2, h)


def cholesky_batched(a: torch.Tensor, upper: bool):
    """(factor, info) for [B, n, n]; upper reads the upper triangle and returns U = L^T (real matrices)."""
    lo, info = cholesky_lower(a.mT if upper else a)
    return (lo.mT if upper else lo), info


def _cholesky(a: torch.Tensor, upper: bool):
    n = a.shape[-1]
    batch = a.shape[:-2]
    if a.numel() == 0:
        return torch.zeros(a.shape, dtype=a.dtype, device=a.device), torch.zeros(
            batch, dtype=torch.int32, device=a.device)
    fac, info = cholesky_batched(batched(a, batch, n, n), upper)
    note_native("linalg_cholesky_ex")
    return fac.reshape(a.shape), info.reshape(batch)


def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    meta_result(aten.linalg_cholesky_ex.default, a, upper=upper, check_errors=check_errors)
    if not native(a):
        return on_cpu(aten.linalg_cholesky_ex.default, a, upper=upper, check_errors=check_errors)
    fac, info = _cholesky(a, upper)
    if check_errors:
        torch._linalg_check_errors(info, "linalg.cholesky_ex", is_matrix=a.dim() == 2)
    return fac, info


def linalg_cholesky_ex_out(a, *, upper=False, check_errors=False, L, info):
    return write_outs((L, info), linalg_cholesky_ex(a, upper=upper, check_errors=check_errors))


def cholesky(a, upper=False):
    meta_result(aten.cholesky.default, a, upper)
    if not native(a):
        return on_cpu(aten.cholesky.default, a, upper)
    fac, info = _cholesky(a, upper)
    torch._linalg_check_errors(info, "cholesky", is_matrix=a.dim() == 2)
    return fac


def cholesky_out(a, upper=False, *, out):
    return write_outs((out,), (cholesky(a, upper),))[0]


# -- triangular solves -------------------------------------------------------------------------------------
def _solve_rows(t: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool) -> torch.Tensor:
    """Substitution row by row for T X = B, T [B, n, n] triangular, B [B, n, k]: each row is one GEMV against
    the rows already solved, then a division by the diagonal (inf/NaN for a zero diagonal, as trsm)."""
    n = t.shape[-1]
    x = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    for i in (range(n - 1, -1, -1) if upper else range(n)):
        done = slice(i + 1, n) if upper else slice(0, i)
        r = b[:, i, :]
        if done.stop > done.start:
            r = r - torch.bmm(t[:, i:i + 1, done], x[:, done, :]).squeeze(1)
        if not unit:
            r = r / t[:, i, i:i + 1]
        x[:, i, :] = r
    return x


def solve_tri(t: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool = False) -> torch.Tensor:
    """X with T X = B for a batch (T [B, n, n], only its ``upper``/lower triangle read; B [B, n, k]); blocks
    larger than BLOCK recurse: solve one half, subtract its contribution from the other with one GEMM."""
    n = t.shape[-1]
    if n <= BLOCK:
        return _solve_rows(t, b, upper, unit)
    h = n // 2
    x = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    if upper:
        x[:, h:] = x2 = solve_tri(t[:, h:, h:], b[:, h:], True, unit)
        x[:, :h] = solve_tri(t[:, :h, :h], torch.baddbmm(b[:, :h], t[:, :h, h:], x2, alpha=-1), True, unit)
    else:
        x[:, :h] = x1 = solve_tri(t[:, :h, :h], b[:, :h], False, unit)
        x[:, h:] = solve_tri(t[:, h:, h:], torch.baddbmm(b[:, h:], t[:, h:, :h], x1, alpha=-1), False, unit)
    return x


def solve_triangular(a, b, upper: bool, left: bool, unit: bool, shape) -> torch.Tensor:
    """op(A) X = B (left) or X A = B broadcast over batches, as a tensor of ``shape`` (the meta result's)."""
    batch = shape[:-2]
    if not left:  # X A = B  <=>  A^T X^T = B^T, A^T has the other triangle
        a, b, upper = a.mT, b.mT, not upper
    n, k = a.shape[-1], b.shape[-1]
    x = solve_tri(batched(a, batch, n, n), batched(b, batch, n, k), upper, unit)
    return (x if left else x.mT).reshape(shape)


def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    kw = dict(upper=upper, left=left, unitriangular=unitriangular)
    meta = meta_result(aten.linalg_solve_triangular.default, a, b, **kw)
    if not native(a, b):
        return on_cpu(aten.linalg_solve_triangular.default, a, b, **kw)
    if meta.numel() == 0:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=a.device)
    note_native("linalg_solve_triangular")
    return solve_triangular(a, b, upper, left, unitriangular, meta.shape)


def linalg_solve_triangular_out(a, b, *, upper, left=True, unitriangular=False, out):
    return write_outs((out,), (linalg_solve_triangular(a, b, upper=upper, left=left, unitriangular=unitriangular),))[0]


def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """(X, copy of A broadcast) with op(A) X = B, op(A) = A^T when ``transpose`` (the older API)."""
    meta_x, meta_a = meta_result(aten.triangular_solve.default, b, a, upper, transpose, unitriangular)
    if not native(a, b):
        return on_cpu(aten.triangular_solve.default, b, a, upper, transpose, unitriangular)
    coef = a.expand(meta_a.shape).clone(memory_format=torch.contiguous_format)
    if meta_x.numel() == 0:
        return torch.zeros(meta_x.shape, dtype=meta_x.dtype, device=a.device), coef
    op_a, op_upper = (a.mT, not upper) if transpose else (a, upper)
    note_native("triangular_solve")
    return solve_triangular(op_a, b, op_upper, True, unitriangular, meta_x.shape), coef


def triangular_solve_out(b, a, upper=True, transpose=False, unitriangular=False, *, X, M):
    return write_outs((X, M), triangular_solve(b, a, upper, transpose, unitriangular))
