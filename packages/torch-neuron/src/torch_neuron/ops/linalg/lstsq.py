"""``linalg_lstsq`` (+ out=) composed from the device QR and SVD (linalg.qr / linalg.eig). float32 only.

Drivers: ``gels`` solves by Householder QR (of A when m >= n: X = R^-1 (Q^T B)[:n]; of A^T when m < n, the
minimum-norm solution X = Q R^-T B), assuming full rank as LAPACK's gels does. ``gelsy`` (the CPU default),
``gelsd`` and ``gelss`` use the SVD: X = V diag(1/s) U^T B over the singular values above rcond * s_max,
rank = their count. That is LAPACK's rule for gelsd/gelss; gelsy decides the rank from a column-pivoted QR
instead, which agrees for every matrix whose numerical rank is not borderline. Output shapes follow torch
(residuals only when m > n and, for the SVD drivers, every matrix has full rank; rank except for gels;
singular values for gelsd/gelss). Argument errors and empty inputs take the CPU path (lstsq has no meta
kernel to word torch's errors).
"""

from __future__ import annotations

import torch

from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.registry import note_native
from .cholesky import batched, native, solve_tri
from .eig import svd_batched
from .qr import apply_q, geqrf_batched

aten = torch.ops.aten
DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _plan(a, b, driver):
    """(batch, m, n, k, vector) when this call can run on the device, else None (the CPU raises or handles)."""
    if not native(a, b) or driver not in DRIVERS or a.dim() < 2 or b.dim() not in (a.dim(), a.dim() - 1):
        return None
    vector = b.dim() == a.dim() - 1
    m, n = a.shape[-2:]
    bm = b.shape[-1] if vector else b.shape[-2]
    k = 1 if vector else b.shape[-1]
    bb = b.shape[:-1] if vector else b.shape[:-2]
    try:
        batch = torch.broadcast_shapes(a.shape[:-2], bb)
    except RuntimeError:
        return None
    if bm != m or a.numel() == 0 or b.numel() == 0:
        return None
    return batch, m, n, k, vector


def _gels(w, rhs):
    """Full-rank least squares / minimum norm by QR: w [B, m, n], rhs [B, m, k] -> X [B, n, k]."""
    bs, m, n = w.shape
    if m >= n:
        tau = geqrf_batched(w)
        qtb = apply_q(w, tau, rhs, left=True, transpose=True)
        return solve_tri(w[:, :n, :n], qtb[:, :n], upper=True)
    wt = w.mT.contiguous()  # A^T = Q R, A = R^T Q^T
    tau = geqrf_batched(wt)
    y = solve_tri(wt[:, :m, :m].mT, rhs, upper=False)  # R^T y = B
    pad = torch.zeros(bs, n, rhs.shape[-1], dtype=w.dtype, device=w.device)
    pad[:, :m] = y
    return apply_q(wt, tau, pad, left=True, transpose=False)


def _svd_solve(w, rhs, rcond):
    """-> (X, rank as float, s) by the truncated pseudo-inverse."""
    bs, m, n = w.shape
    wide = m < n
    u, s, v = svd_batched(w.mT.contiguous() if wide else w, False, True)
    if wide:
        u, v = v, u
    keep = s > rcond * s[:, :1]
    inv = torch.where(keep, 1.0 / torch.where(keep, s, 1.0), 0.0)
    x = torch.bmm(v, inv.unsqueeze(-1) * torch.bmm(u.mT, rhs))
    return x, keep.to(torch.float32).sum(-1), s


def _lstsq(a, b, rcond, driver, plan):
    batch, m, n, k, vector = plan
    w = batched(a, batch, m, n)
    rhs = batched(b.unsqueeze(-1) if vector else b, batch, m, k)
    dev = a.device
    empty_f, empty_i = torch.zeros(0, device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
    rank, svals = empty_i, empty_f
    if driver == "gels":
        x = _gels(w.clone(), rhs)
        full = True
    else:
        rc = rcond if rcond is not None and rcond > 0 else torch.finfo(torch.float32).eps * max(m, n)
        x, rank_f, s = _svd_solve(w, rhs, rc)
        rank = rank_f.to(torch.int64).reshape(batch)
        if driver in ("gelsd", "gelss"):
            svals = s.reshape(*batch, min(m, n))
        full = driver != "gelsy" and m > n and bool((rank_f == n).all())  # host sync only when it matters
    resid = empty_f
    if m > n and full:
        resid = (torch.bmm(w, x) - rhs).square().sum(1).reshape(*batch, k)
    x = x.reshape(*batch, n, k)
    return (x.squeeze(-1) if vector else x), resid, rank, svals


def linalg_lstsq(a, b, rcond=None, *, driver=None):
    drv = "gelsy" if driver is None else driver
    plan = _plan(a, b, drv)
    if plan is None:
        return on_cpu(aten.linalg_lstsq.default, a, b, rcond, driver=driver)
    note_native("linalg_lstsq")
    return _lstsq(a, b, rcond, drv, plan)


def linalg_lstsq_out(a, b, rcond=None, *, driver=None, solution, residuals, rank, singular_values):
    return write_outs((solution, residuals, rank, singular_values), linalg_lstsq(a, b, rcond, driver=driver))
