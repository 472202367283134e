"""LU factorization with partial pivoting and what is built on it, composed from device ops.

``lu_factor`` is LAPACK's getrf as a host loop of device kernels over a batch [B, m, n]: per column a
masked arg-max of |column| picks the pivot row (the first largest, as idamax), whole rows are swapped with
a gather and a scatter, the column is scaled and the panel gets a rank-1 update; panels of ``BLOCK``
columns update the rest of the matrix with one triangular solve and one GEMM (TensorE). Pivots are int32
and 1-based, info is the first exactly-zero diagonal of U (1-based), exactly as LAPACK reports them.

Registered (float32; float64/complex and 16-bit dtypes take the CPU path): ``linalg_lu_factor_ex``,
``linalg_lu``, ``lu_unpack``, ``linalg_lu_solve``, ``_linalg_solve_ex``, ``linalg_inv_ex``, ``_linalg_det``,
``_linalg_slogdet`` (each with its out= overload).
"""

from __future__ import annotations

import torch

from ..core.checks import arange32, constant, meta_result
from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.registry import note_native
from .cholesky import BLOCK, batched, eye, first_failure, flat, native, solve_tri

aten = torch.ops.aten


# -- factorization ---------------------------------------------------------------------------------------
def _below(m: int, j: int, device) -> torch.Tensor:
    """bool [m]: rows j.. (the pivot candidates of column j), a cached constant."""
    return constant(("rows_from", m, j), device, lambda: torch.arange(m) >= j)


def _swap_rows(w: torch.Tensor, j: int, p: torch.Tensor) -> None:
    """Swap row j with row p[b] of every matrix b of w [B, m, n] (p int [B]); p == j leaves it as it is."""
    bs, _, n = w.shape
    idx = p.view(bs, 1, 1).expand(bs, 1, n)
    row_j = w[:, j:j + 1, :].clone()
    w[:, j:j + 1, :] = w.gather(1, idx)
    w.scatter_(1, idx, row_j)


def _pivot_column(w: torch.Tensor, j: int, end: int, info: torch.Tensor):
    """Step j of the panel ending at column ``end``: pivot, swap, scale, rank-1 update. -> (pivot, info)."""
    m = w.shape[1]
    cand = torch.where(_below(m, j, w.device), w[:, :, j].abs(), -1.0)  # rows above j never win
    p = cand.argmax(-1).to(torch.int32)
    _swap_rows(w, j, p)
    d = w[:, j, j:j + 1]
    zero = d == 0
    info = first_failure(info, zero.squeeze(1), j + 1)
    if j + 1 < m:
        col = w[:, j + 1:, j]
        w[:, j + 1:, j] = torch.where(zero, col, col / d)  # getrf leaves the column of a zero pivot unscaled
        if j + 1 < end:
            w[:, j + 1:, j + 1:end].baddbmm_(w[:, j + 1:, j:j + 1], w[:, j:j + 1, j + 1:end], alpha=-1)
    return p, info


def lu_factor(w: torch.Tensor):
    """Factor w [B, m, n] in place into L\\U; -> (pivots int32 [B, k] 1-based, info int32 [B])."""
    bs, m, n = w.shape
    k = min(m, n)
    info = torch.zeros(bs, dtype=torch.int32, device=w.device)
    pivots = []
    for c0 in range(0, k, BLOCK):
        c1 = min(c0 + BLOCK, k)
        end = n if k <= BLOCK else c1  # one panel: rank-1 updates reach every column, no GEMM step
        for j in range(c0, c1):
            p, info = _pivot_column(w, j, end, info)
            pivots.append(p)
        if end < n:
            w[:, c0:c1, c1:] = u12 = solve_tri(w[:, c0:c1, c0:c1], w[:, c0:c1, c1:], upper=False, unit=True)
            if c1 < m:
                w[:, c1:, c1:].baddbmm_(w[:, c1:, c0:c1], u12, alpha=-1)
    piv = torch.stack(pivots, -1) + 1 if pivots else torch.zeros(bs, 0, dtype=torch.int32, device=w.device)
    return piv, info


def _factor(a: torch.Tensor):
    """(LU, pivots, info) of a [..., m, n] with torch's shapes."""
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    k = min(m, n)
    if a.numel() == 0:
        return (torch.zeros(a.shape, dtype=a.dtype, device=a.device),  # pivots are empty too
                torch.zeros(*batch, k, dtype=torch.int32, device=a.device),
                torch.zeros(batch, dtype=torch.int32, device=a.device))
    w = batched(a, batch, m, n)
    piv, info = lu_factor(w)
    return w.reshape(a.shape), piv.reshape(*batch, k), info.reshape(batch)


def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    kw = dict(pivot=pivot, check_errors=check_errors)
    meta_result(aten.linalg_lu_factor_ex.default, a, **kw)
    if not (native(a) and pivot):  # LU without pivoting: the CPU raises torch's error
        return on_cpu(aten.linalg_lu_factor_ex.default, a, **kw)
    lu, piv, info = _factor(a)
    note_native("linalg_lu_factor_ex")
    if check_errors:
        torch._linalg_check_errors(info, "torch.linalg.lu_factor_ex", is_matrix=a.dim() == 2)
    return lu, piv, info


def linalg_lu_factor_ex_out(a, *, pivot=True, check_errors=False, LU, pivots, info):
    return write_outs((LU, pivots, info), linalg_lu_factor_ex(a, pivot=pivot, check_errors=check_errors))


# -- permutations ------------------------------------------------------------------------------------------
def permutation(piv: torch.Tensor, m: int) -> torch.Tensor:
    """int32 [B, m]: row i of L U is row perm[i] of A, from LAPACK's sequence of swaps (i <-> piv[i] - 1)."""
    bs, k = piv.shape
    perm = arange32(m, piv.device).expand(bs, m).clone()
    p0 = piv - 1
    for i in range(k):
        idx = p0[:, i:i + 1]
        at_i = perm[:, i:i + 1].clone()
        perm[:, i:i + 1] = perm.gather(1, idx)
        perm.scatter_(1, idx, at_i)
    return perm


def perm_matrix(perm: torch.Tensor) -> torch.Tensor:
    """P [B, m, m] float32 with P[perm[i], i] = 1, so that A = P L U."""
    m = perm.shape[-1]
    rows = constant(("col_index", m), perm.device, lambda: torch.arange(m, dtype=torch.int32).unsqueeze(1))
    return (perm.unsqueeze(-2) == rows).to(torch.float32)


def _unpack(lu: torch.Tensor, piv: torch.Tensor, data: bool, pivots: bool, metas):
    m, n = lu.shape[-2:]
    k = min(m, n)
    p_meta, l_meta, u_meta = metas
    dev = lu.device
    p = l_mat = u_mat = None
    if pivots and p_meta.numel():
        batch = p_meta.shape[:-2]
        perm = permutation(flat(piv, batch, k), m)
        p = perm_matrix(perm).reshape(p_meta.shape)
    if data and l_meta.numel():
        l_mat = lu[..., :, :k].tril(-1) + eye(m, dev)[:, :k]
    if data and u_meta.numel():
        u_mat = lu[..., :k, :].triu()
    return tuple(t if t is not None else torch.zeros(meta.shape, dtype=meta.dtype, device=dev)
                 for t, meta in zip((p, l_mat, u_mat), metas))


def lu_unpack(lu, piv, unpack_data=True, unpack_pivots=True):
    metas = meta_result(aten.lu_unpack.default, lu, piv, unpack_data, unpack_pivots)
    if not native(lu) or piv.dtype != torch.int32:
        return on_cpu(aten.lu_unpack.default, lu, piv, unpack_data, unpack_pivots)
    note_native("lu_unpack")
    return _unpack(lu, piv, unpack_data, unpack_pivots, metas)


def lu_unpack_out(lu, piv, unpack_data=True, unpack_pivots=True, *, P, L, U):
    return write_outs((P, L, U), lu_unpack(lu, piv, unpack_data, unpack_pivots))


def linalg_lu(a, *, pivot=True):
    metas = meta_result(aten.linalg_lu.default, a, pivot=pivot)
    if not (native(a) and pivot):
        return on_cpu(aten.linalg_lu.default, a, pivot=pivot)
    lu, piv, _ = _factor(a)
    note_native("linalg_lu")
    return _unpack(lu, piv, True, True, metas)


def linalg_lu_out(a, *, pivot=True, P, L, U):
    return write_outs((P, L, U), linalg_lu(a, pivot=pivot))
