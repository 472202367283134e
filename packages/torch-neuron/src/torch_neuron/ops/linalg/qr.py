"""Householder QR composed from device ops: ``geqrf``, ``linalg_householder_product`` (orgqr), ``ormqr``,
``linalg_qr`` (modes reduced / complete / r), each with its out= overload. float32 only.

A host loop over columns issues, per column, a norm reduction, a few elementwise ops and two GEMVs on
TensorE for the rank-1 update of the trailing columns, batched over all matrices at once. The reflectors
follow LAPACK's dlarfg exactly (beta = -sign(alpha) * ||x||, tau = (beta - alpha) / beta, v[0] = 1, and
H = I with tau = 0 when the part below the diagonal is already zero), so Q and R match LAPACK's signs.
"""

from __future__ import annotations

import torch

from ..core.checks import meta_result
from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.registry import note_native
from .cholesky import batched, eye, flat, native

aten = torch.ops.aten


def _reflect_left(c: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """(I - tau v v^T) C for C [B, r, c], v [B, r], tau [B]: one GEMV for v^T C, one rank-1 update."""
    w = torch.bmm(v.unsqueeze(1), c)  # [B, 1, c]
    return torch.baddbmm(c, (v * tau.unsqueeze(1)).unsqueeze(2), w, alpha=-1)


def _reflect_right(c: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """C (I - tau v v^T) for C [B, r, c], v [B, c]."""
    w = torch.bmm(c, v.unsqueeze(2))  # [B, r, 1]
    return torch.baddbmm(c, w, (v * tau.unsqueeze(1)).unsqueeze(1), alpha=-1)


def _householder(x: torch.Tensor):
    """dlarfg for a batch of columns x [B, r]: (v with v[0] = 1, tau, beta)."""
    alpha = x[:, :1]
    tail = x[:, 1:]
    xnorm = torch.linalg.vector_norm(tail, dim=1, keepdim=True) if tail.shape[1] else torch.zeros_like(alpha)
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    beta = torch.where(alpha >= 0, -norm, norm)
    keep = xnorm == 0  # nothing to annihilate: H = I
    tau = torch.where(keep, 0.0, (beta - alpha) / beta)
    scale = torch.where(keep, 1.0, alpha - beta)
    v = torch.cat([torch.ones_like(alpha), tail / scale], dim=1)
    return v, tau.squeeze(1), torch.where(keep, alpha, beta)


def geqrf_batched(w: torch.Tensor) -> torch.Tensor:
    """Factor w [B, m, n] in place into R and the reflectors below its diagonal; -> tau [B, k]."""
    bs, m, n = w.shape
    taus = []
    for j in range(min(m, n)):
        v, tau, beta = _householder(w[:, j:, j])
        if j + 1 < n:
            w[:, j:, j + 1:] = _reflect_left(w[:, j:, j + 1:], v, tau)
        w[:, j, j] = beta.squeeze(1)
        w[:, j + 1:, j] = v[:, 1:]
        taus.append(tau)
    return torch.stack(taus, -1)


def _vector(refl: torch.Tensor, j: int) -> torch.Tensor:
    """Reflector j of a geqrf result [B, m, n]: [1, refl[j + 1:, j]] (rows j..m)."""
    col = refl[:, j:, j]
    return torch.cat([torch.ones_like(col[:, :1]), col[:, 1:]], dim=1)


def householder_product_batched(refl: torch.Tensor, tau: torch.Tensor, cols: int) -> torch.Tensor:
    """The first ``cols`` columns of H_1 ... H_k (k = tau's length) for reflectors refl [B, m, >= k]."""
    bs, m, _ = refl.shape
    q = eye(m, refl.device)[:, :cols].expand(bs, m, cols).clone()
    for j in range(tau.shape[1] - 1, -1, -1):  # Q = H_1 (H_2 (... H_k I)): each only touches rows j..
        q[:, j:] = _reflect_left(q[:, j:], _vector(refl, j), tau[:, j])
    return q


def apply_q(refl, tau, c, left: bool, transpose: bool) -> torch.Tensor:
    """Q C, Q^T C, C Q or C Q^T for Q = H_1 ... H_k, C [B, r, c] (ormqr)."""
    c = c.clone()
    k = tau.shape[1]
    forward = left == transpose  # Q^T C = H_k .. H_1 C and C Q = C H_1 .. H_k apply H_1 first
    for j in (range(k) if forward else range(k - 1, -1, -1)):
        v, t = _vector(refl, j), tau[:, j]
        if left:
            c[:, j:] = _reflect_left(c[:, j:], v, t)
        else:
            c[:, :, j:] = _reflect_right(c[:, :, j:], v, t)
    return c


# -- registrations -----------------------------------------------------------------------------------------
def _zeros(meta, device):
    return torch.zeros(meta.shape, dtype=meta.dtype, device=device)


def geqrf(a):
    if a.dim() < 2 or not native(a):  # geqrf has no meta kernel: the CPU raises torch's errors
        return on_cpu(aten.geqrf.default, a)
    m, n = a.shape[-2:]
    tau_shape = (*a.shape[:-2], min(m, n))
    if a.numel() == 0:
        return torch.zeros(a.shape, device=a.device), torch.zeros(tau_shape, device=a.device)
    w = batched(a, a.shape[:-2], m, n)
    tau = geqrf_batched(w)
    note_native("geqrf")
    return w.reshape(a.shape), tau.reshape(tau_shape)


def geqrf_out(self, *, a, tau):
    return write_outs((a, tau), geqrf(self))


def linalg_qr(a, mode="reduced"):
    mq, mr = meta_result(aten.linalg_qr.default, a, mode)
    if not native(a):
        return on_cpu(aten.linalg_qr.default, a, mode)
    if a.numel() == 0:
        q = _zeros(mq, a.device)
        if mode == "complete" and q.numel():  # 0 columns, m rows: Q is the identity
            q = eye(q.shape[-1], a.device).expand(q.shape).clone()
        return q, _zeros(mr, a.device)
    m, n = a.shape[-2:]
    w = batched(a, a.shape[:-2], m, n)
    tau = geqrf_batched(w)
    r = w[:, :mr.shape[-2], :].triu()
    q = householder_product_batched(w, tau, mq.shape[-1]) if mq.numel() else _zeros(mq, a.device)
    note_native("linalg_qr")
    return q.reshape(mq.shape), r.reshape(mr.shape)


def linalg_qr_out(a, mode="reduced", *, Q, R):
    return write_outs((Q, R), linalg_qr(a, mode))


def householder_product(a, tau):
    meta = meta_result(aten.linalg_householder_product.default, a, tau)
    if not native(a, tau):
        return on_cpu(aten.linalg_householder_product.default, a, tau)
    if meta.numel() == 0:
        return _zeros(meta, a.device)
    m, n = a.shape[-2:]
    batch = meta.shape[:-2]
    k = tau.shape[-1]
    refl = batched(a, batch, m, n)
    q = householder_product_batched(refl, flat(tau, batch, k), n)
    note_native("linalg_householder_product")
    return q.reshape(meta.shape)


def householder_product_out(a, tau, *, out):
    return write_outs((out,), (householder_product(a, tau),))[0]


def ormqr(a, tau, c, left=True, transpose=False):
    meta = meta_result(aten.ormqr.default, a, tau, c, left, transpose)
    if not native(a, tau, c):
        return on_cpu(aten.ormqr.default, a, tau, c, left, transpose)
    if meta.numel() == 0:
        return _zeros(meta, a.device)
    batch = meta.shape[:-2]
    m, n = a.shape[-2:]
    k = tau.shape[-1]
    refl = batched(a, batch, m, n)
    cc = batched(c, batch, *c.shape[-2:])
    out = apply_q(refl, flat(tau, batch, k), cc, left, transpose)
    note_native("ormqr")
    return out.reshape(meta.shape)


def ormqr_out(a, tau, c, left=True, transpose=False, *, out):
    return write_outs((out,), (ormqr(a, tau, c, left, transpose),))[0]
