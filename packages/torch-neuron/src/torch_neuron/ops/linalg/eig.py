"""Symmetric eigendecomposition and SVD by Jacobi rotations, composed from device ops: ``_linalg_eigh`` and
``_linalg_svd`` (+ out= overloads). float32 only.

Parallel (round-robin) Jacobi: a sweep is n - 1 rounds (n odd: n rounds with one index idle); a round
rotates n/2 disjoint index pairs at once, so its rotations form one matrix J and are applied with GEMMs on
TensorE: A <- J^T A J (eigh), U <- U J and V <- V J (one-sided Jacobi for the SVD, the angles taken from
G = U^T U). The per-pair angles are elementwise ops on values gathered from fixed positions. After each
sweep one host sync checks convergence (relative off-diagonal norm below float32 rounding), at most
``MAX_SWEEPS`` sweeps. Results are sorted (eigenvalues ascending, singular values descending) by ranks
from one broadcast comparison and a scatter.
"""

from __future__ import annotations

import torch

from ..core.checks import constant, meta_result
from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.registry import note_native
from .cholesky import batched, eye, native
from .qr import geqrf_batched, householder_product_batched

aten = torch.ops.aten
MAX_SWEEPS = 30
TOL = 4e-7  # off-diagonal norm relative to the matrix norm at which a sweep stops (a few float32 ulps)


# -- the rotation schedule ---------------------------------------------------------------------------------
def _rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin pairings of 0..n-1 (circle method): every pair exactly once per sweep."""
    players = list(range(n + n % 2))  # n odd: player n is a bye
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(min(a, b), max(a, b)) for a, b in zip(players[:half], players[half:][::-1])]
        rounds.append([pq for pq in pairs if pq[1] < n])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _schedule(n: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per round: flat positions [pp, qq, pq] to gather and [pp, qq, pq, qp] to scatter into J."""
    def build(r):
        def make():
            p = torch.tensor([a for a, _ in _rounds(n)[r]])
            q = torch.tensor([b for _, b in _rounds(n)[r]])
            return torch.stack([p * n + p, q * n + q, p * n + q, q * n + p])
        return constant(("jacobi", n, r), device, make)
    return [build(r) for r in range(len(_rounds(n)))]


def _rotation(g: torch.Tensor, pos: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """J [B, n, n] whose rotations zero the (p, q) entries of symmetric g: J^T g J (Rutishauser's angles)."""
    bs, n, _ = g.shape
    vals = g.reshape(bs, n * n).index_select(1, pos[:3].reshape(-1)).view(bs, 3, -1)
    app, aqq, apq = vals[:, 0], vals[:, 1], vals[:, 2]
    zero = apq == 0
    theta = (aqq - app) / torch.where(zero, 1.0, 2.0 * apq)
    t = torch.where(theta >= 0, 1.0, -1.0) / (theta.abs() + (1.0 + theta * theta).sqrt())
    t = torch.where(zero, 0.0, t)
    c = (1.0 + t * t).rsqrt()
    s = t * c
    j = base.expand(bs, n * n).clone()
    j.scatter_(1, pos.reshape(1, -1).expand(bs, -1), torch.cat([c, c, s, -s], 1))
    return j.view(bs, n, n)


def _off_ratio(g: torch.Tensor, scale: torch.Tensor) -> float:
    """max over the batch of ||offdiag(g)||_F / scale (one host sync)."""
    n = g.shape[-1]
    mask = constant(("offdiag", n), g.device, lambda: 1.0 - torch.eye(n))
    off = torch.linalg.vector_norm(g * mask, dim=(1, 2))
    return float((off / scale).amax())


def _sweeps(g: torch.Tensor, vecs: list, one_sided: torch.Tensor | None, scale: torch.Tensor):
    """Jacobi sweeps on symmetric g [B, n, n] (or on G = U^T U with U = ``one_sided``) until converged;
    every rotation is also applied to the matrices in ``vecs``. -> (g, vecs, one_sided)."""
    n = g.shape[-1]
    sched = _schedule(n, g.device)
    base = eye(n, g.device).reshape(1, n * n)
    for _ in range(MAX_SWEEPS):
        if _off_ratio(g, scale) <= TOL:
            break
        for pos in sched:
            j = _rotation(g, pos, base)
            vecs = [torch.bmm(v, j) for v in vecs]
            if one_sided is None:
                g = torch.bmm(j.mT, torch.bmm(g, j))
            else:
                one_sided = torch.bmm(one_sided, j)
                g = torch.bmm(one_sided.mT, one_sided)
    return g, vecs, one_sided


def _ranks(d: torch.Tensor, descending: bool) -> torch.Tensor:
    """int32 [B, n]: the position of each d[i] in sorted order (ties keep their index order)."""
    n = d.shape[-1]
    di, dj = d.unsqueeze(-1), d.unsqueeze(-2)
    before = constant(("strict_lower", n), d.device, lambda: torch.ones(n, n, dtype=torch.bool).tril(-1))
    first = (di < dj) if descending else (di > dj)  # [i, j]: d[j] goes before d[i]
    count = (first | ((di == dj) & before)).to(torch.float32).sum(-1)
    return count.to(torch.int32)


def _sorted(d: torch.Tensor, vecs: list, descending: bool):
    rank = _ranks(d, descending)
    out_d = torch.empty_like(d).scatter_(1, rank, d)
    out_v = [torch.empty_like(v).scatter_(2, rank.unsqueeze(1).expand(v.shape), v) for v in vecs]
    return out_d, out_v


def _finite(a: torch.Tensor) -> bool:
    """One host sync. LAPACK fails on NaN/inf with an error code torch puts in its message, which only the
    CPU can word: such inputs take the CPU path (loudly), finite ones run here."""
    return a.numel() == 0 or bool(torch.isfinite(a).all())


# -- eigh --------------------------------------------------------------------------------------------------
def eigh_batched(a: torch.Tensor, lower: bool, vectors: bool):
    """(eigenvalues ascending [B, n], eigenvectors [B, n, n] or None) of the symmetric matrix given by one
    triangle of a [B, n, n]."""
    tri = a.tril() if lower else a.triu()
    sym = tri + (tri.tril(-1) if lower else tri.triu(1)).mT
    n = a.shape[-1]
    scale = torch.linalg.vector_norm(sym, dim=(1, 2)).clamp_min(torch.finfo(torch.float32).tiny)
    vecs = [eye(n, a.device).expand(a.shape).clone()] if vectors else []
    g, vecs, _ = _sweeps(sym, vecs, None, scale)
    d, vecs = _sorted(g.diagonal(dim1=1, dim2=2), vecs, descending=False)
    return d, (vecs[0] if vectors else None)


def linalg_eigh(a, UPLO="L", compute_v=True):
    mvals, mvecs = meta_result(aten._linalg_eigh.default, a, UPLO, compute_v)
    if not native(a) or not _finite(a):
        return on_cpu(aten._linalg_eigh.default, a, UPLO, compute_v)
    dev = a.device
    if a.numel() == 0:
        return torch.zeros(mvals.shape, device=dev), torch.zeros(mvecs.shape, device=dev)
    n = a.shape[-1]
    d, v = eigh_batched(batched(a, a.shape[:-2], n, n), UPLO.upper() == "L", compute_v)
    note_native("_linalg_eigh")
    return d.reshape(mvals.shape), (v.reshape(mvecs.shape) if compute_v else torch.zeros(mvecs.shape, device=dev))


def linalg_eigh_out(a, UPLO="L", compute_v=True, *, eigenvalues, eigenvectors):
    return write_outs((eigenvalues, eigenvectors), linalg_eigh(a, UPLO, compute_v))


# -- SVD ---------------------------------------------------------------------------------------------------
def _orthonormal_columns(u: torch.Tensor, full: bool):
    """u [B, m, n] (m >= n) with orthogonal columns -> (Q [B, m, m or n], diag(R) [B, n]) of its Householder
    QR: Q's first n columns are u's directions (orthonormal even where a column is zero)."""
    w = u.clone()
    tau = geqrf_batched(w)
    q = householder_product_batched(w, tau, w.shape[1] if full else w.shape[2])
    return q, w.diagonal(dim1=1, dim2=2)


def svd_batched(a: torch.Tensor, full: bool, compute_uv: bool):
    """(U, S descending, V) of a [B, m, n] with m >= n by one-sided Jacobi; U [B, m, m or n], V [B, n, n]."""
    bs, m, n = a.shape
    scale = torch.linalg.vector_norm(a, dim=(1, 2)).square().clamp_min(torch.finfo(torch.float32).tiny)
    vecs = [eye(n, a.device).expand(bs, n, n).clone()] if compute_uv else []
    _, vecs, u = _sweeps(torch.bmm(a.mT, a), vecs, a, scale)
    # largest columns first: the QR then orthogonalizes the rounding-noise columns of a rank-deficient
    # matrix against the significant ones, not the other way round
    _, (u, *vecs) = _sorted(torch.linalg.vector_norm(u, dim=1), [u, *vecs], descending=True)
    q, r = _orthonormal_columns(u, full)
    s = r.abs()
    if not compute_uv:
        return None, _sorted(s, [], descending=True)[0], None
    sign = torch.where(r < 0, -1.0, 1.0)
    cols = q[:, :, :n] * sign.unsqueeze(1)
    s, (cols, v) = _sorted(s, [cols, vecs[0]], descending=True)
    if full and m > n:
        cols = torch.cat([cols, q[:, :, n:]], dim=2)
    return cols, s, v


def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    mu, ms, mvh = meta_result(aten._linalg_svd.default, a, full_matrices, compute_uv, driver=driver)
    if not native(a) or not _finite(a):
        return on_cpu(aten._linalg_svd.default, a, full_matrices, compute_uv, driver=driver)
    dev = a.device
    if a.numel() == 0:
        u, s, vh = (torch.zeros(t.shape, device=dev) for t in (mu, ms, mvh))
        for t in (u, vh):  # full_matrices with a zero dimension: the other factor is an identity
            if t.numel() and t.shape[-1] == t.shape[-2]:
                t.copy_(eye(t.shape[-1], dev).expand(t.shape))
        return u, s, vh
    m, n = a.shape[-2:]
    wide = m < n  # A = U S V^T  <=>  A^T = V S U^T
    w = batched(a.mT if wide else a, a.shape[:-2], max(m, n), min(m, n))
    u, s, v = svd_batched(w, full_matrices, compute_uv)
    note_native("_linalg_svd")
    if not compute_uv:
        return torch.zeros(mu.shape, device=dev), s.reshape(ms.shape), torch.zeros(mvh.shape, device=dev)
    u, vh = (v, u.mT) if wide else (u, v.mT)
    return u.reshape(mu.shape), s.reshape(ms.shape), vh.reshape(mvh.shape)


def linalg_svd_out(a, full_matrices=False, compute_uv=True, driver=None, *, U, S, Vh):
    return write_outs((U, S, Vh), linalg_svd(a, full_matrices, compute_uv, driver=driver))
