"""_cdist_forward and _pdist_forward on the device, composed of neuron ops the way aten's CPU kernels compute.

p-norm distances of row pairs: the differences of every pair ([B, P, R, M], in float32; pairs taken in
blocks of x1 rows so that no intermediate exceeds ``_BLOCK`` elements), then per p as aten's ``Dist``:
p = 0 counts the non-zero differences, 1 sums |d|, 2 is sqrt(sum d^2), inf the largest |d|, any other
p is (sum |d|^p)^(1/p). cdist with p = 2 takes aten's matrix-product form (``_euclidean_dist``: norms
and one matmul, clamped at 0) exactly where aten does: compute_mode 1, or the default with more than 25
rows on a side. pdist is the upper triangle (i < j, row-major) of the distances of x with itself.
"""

from __future__ import annotations

import math

import torch

from ..core.checks import constant, meta_result, same_device
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu

aten = torch.ops.aten
_BLOCK = 1 << 24


def _norm(a: torch.Tensor, b: torch.Tensor, p: float) -> torch.Tensor:
    """[B, P, R]: the p-norm distances of a [B, P, M] and b [B, R, M] (float32)."""
    d = a[:, :, None, :] - b[:, None, :, :]
    if p == 0:
        return (d != 0).float().sum(-1)
    if p == 1:
        return d.abs().sum(-1)
    if p == 2:
        return (d * d).sum(-1).sqrt()
    if math.isinf(p):
        return d.abs().amax(-1)
    return d.abs().pow(p).sum(-1).pow(1.0 / p)


def _pairwise(a: torch.Tensor, b: torch.Tensor, p: float) -> torch.Tensor:
    rows = max(1, _BLOCK // max(1, a.shape[0] * b.shape[1] * a.shape[2]))
    if rows >= a.shape[1]:
        return _norm(a, b, p)
    return torch.cat([_norm(a[:, i:i + rows], b, p) for i in range(0, a.shape[1], rows)], 1)


def cdist_forward(x1, x2, p, compute_mode=None):
    result = meta_result(aten._cdist_forward.default, x1, x2, p, compute_mode)
    same_device(x1, x2)
    if x1.dtype not in FLOATS or x2.dtype != x1.dtype:
        return on_cpu(aten._cdist_forward.default, x1, x2, p, compute_mode)
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x1.dtype, device=x1.device)
    r1, r2, m = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    if m == 0:
        return torch.zeros(result.shape, dtype=x1.dtype, device=x1.device)
    batch = tuple(result.shape[:-2])
    a = x1.expand(*batch, r1, m).reshape(-1, r1, m).float()
    b = x2.expand(*batch, r2, m).reshape(-1, r2, m).float()
    mode = 0 if compute_mode is None else compute_mode
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        d = aten._euclidean_dist(a, b)  # aten's matrix-product form (composite: norms, cat, matmul)
    else:
        d = _pairwise(a, b, p)
    return d.to(x1.dtype).view(result.shape)


def _upper(n: int, device) -> torch.Tensor:
    """int64 flat offsets of the pairs i < j of an [n, n] matrix, row-major."""
    def build():
        i, j = torch.triu_indices(n, n, 1)
        return i * n + j
    return constant(("pdist_upper", n), device, build)


def pdist_forward(x, p=2.0):
    result = meta_result(aten._pdist_forward.default, x, p)
    if x.dtype not in FLOATS:
        return on_cpu(aten._pdist_forward.default, x, p)
    n, m = x.shape
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x.dtype, device=x.device)
    if m == 0:
        return torch.zeros(result.shape, dtype=x.dtype, device=x.device)
    a = x.float().reshape(1, n, m)
    d = _pairwise(a, a, p).reshape(n * n)
    return d.index_select(0, _upper(n, x.device)).to(x.dtype)
