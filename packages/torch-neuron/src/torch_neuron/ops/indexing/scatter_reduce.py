"""Reducing scatters: scatter_reduce (sum, prod, mean, amax, amin; include_self or not), index_reduce
(prod, mean, amax, amin) and scatter's ``reduce="add" / "multiply"`` overloads (functional, in-place, out=).

The DMA engines accumulate by adding only, so the other reductions are composed. Along the scatter dim
the region of x the index reaches is ``[A, N, B]`` and the index/source ``[A, M, B]``; for a block of
targets n the product tensor ``V[a, n, m, b] = src[a, m, b] if index[a, m, b] == n else identity`` is one
pointwise formula (index and n compared in FP32, exact below 2**24) and its reduce over m (one reduce
launch: amax/amin exact and NaN-propagating like the CPU kernel, prod in FP32) gives every target's
reduction of its sources, whatever the duplicates. Sums (and means) instead take one FP32 scatter_add.
How many sources hit each target is one more FP32 scatter_add of ones (exact counts; whole rows at a time
when the index is one per source slice, as index_reduce's along dim 0); a final formula
combines x, the reduction and the counts as torch does (include_self=False keeps x where nothing lands;
mean divides by the count, plus one for self) and rounds once to x's dtype (bfloat16/float16 computed
in FP32). The dense work is ``index.numel() * N`` elements: beyond ``DENSE_MAX`` (and for integer
dtypes, which FP32 cannot reduce exactly) the op takes the CPU fallback.
"""

from __future__ import annotations

import math

import torch

from neuron_hal import DType
from neuron_kernels.library import embedding as emb
from neuron_kernels.library import movement
from neuron_kernels.library import reduce as red
from neuron_kernels.library.formula import formula, inputs, maximum, minimum, where

from ..core.checks import full, meta_result, same_device
from ..core.dtypes import FLOATS, TORCH_TO_DTYPE
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.registry import impl
from ..core.variants import contig, write_out
from ..sorting.rank import positions
from ..tensor.shape import copy_into
from .gather_scatter import _scatter, addable, index32

aten = torch.ops.aten
F32 = DType.float32
DENSE_MAX = 1 << 26  # one-hot product elements per call (beyond: CPU)
CHUNK = 1 << 22  # product elements per launch (16 MiB of FP32)
_IDENTITY = {"amax": -math.inf, "amin": math.inf, "prod": 1.0}
_REDUCE = {"amax": red.amax, "amin": red.amin, "prod": red.prod}
_SUMS = ("sum", "mean", "segment_mean")  # reductions from one scatter_add


def _combine_expr(reduce: str, include_self: bool):
    """x (input 0), the targets' reduction (1) and their source counts (2) -> the result."""
    x, r, cnt = inputs(3)
    if reduce == "segment_mean":  # segment_reduce's: the initial value adds to the sum, not to the count
        return where(cnt, (x + r) / cnt, x)
    if reduce == "mean":
        return (x + r) / (cnt + 1.0) if include_self else where(cnt, r / cnt, x)
    if not include_self:
        return where(cnt, r, x)
    if reduce == "amax":
        return maximum(x, r)
    if reduce == "amin":
        return minimum(x, r)
    return x + r if reduce == "sum" else x * r


def _dense(op: str, idxf, src, n: int, reduce: str) -> torch.Tensor:
    """FP32 [A, n, B]: per target, the ``reduce`` of the sources whose index equals it (identity if none).
    ``idxf``: FP32 [A|1, 1, M, B|1] index; ``src``: [A, 1, M, B]."""
    i, t, s = inputs(3)
    expr = where(i.eq(t), s, _IDENTITY[reduce]).node
    A, _, M, B = src.shape
    step = max(1, CHUNK // max(1, A * M * B))
    pos = positions(n, src.device)
    parts = []
    for n0 in range(0, n, step):
        targets = pos[n0:n0 + step].view(1, -1, 1, 1)
        v = run(op, formula, idxf, targets, src, expr=expr, out_dtype=F32)[0]
        parts.append(run(op, _REDUCE[reduce], v, dim=2)[0])
    if len(parts) == 1:
        return parts[0]
    return run(op, movement.cat.kernel(len(parts)), *parts, dim=1)[0]


def _scatter_sum(op: str, idx, src, shape) -> torch.Tensor:
    """FP32 ``shape`` [A, N, B]: the sum of the sources landing on each target (``idx``: int32 broadcastable
    to ``src``'s [A, M, B]). An index that is one per source slice (index_reduce's [1, M, 1]) with A == 1
    adds whole rows (the embedding gradient's row scatter); otherwise one element per index."""
    A, N, B = shape
    if idx.shape[0] == idx.shape[2] == 1 and A == 1:
        rows = run(op, emb.embedding_backward, src.view(src.shape[1], B), contig(idx).view(-1), N)[0]
        return rows.view(1, N, B)
    zeros = full(op, shape, 0, torch.float32, src.device)
    return run(op, movement.scatter_add, zeros, 1, contig(idx.expand(src.shape)), src)[0]


def _counts(op: str, idx, shape, device) -> torch.Tensor:
    """FP32 counts of the sources landing on each target, [A|1, N, B|1] (exact below 2**24)."""
    A, N, B = shape
    if idx.shape[0] == idx.shape[2] == 1:  # the same for every (a, b): count once
        ones = full(op, (1, idx.shape[1], 1), 1.0, torch.float32, device)
        return _scatter_sum(op, idx, ones, (1, N, 1))
    ones = full(op, (A, idx.shape[1], B), 1.0, torch.float32, device)
    return _scatter_sum(op, idx, ones, shape)


def reduce_region(op: str, xs, idx, src, reduce: str, include_self: bool) -> torch.Tensor:
    """The reduced [A, N, B] region: ``xs`` (x's, contiguous), ``idx`` int32 in [0, N) broadcastable to
    ``src``'s [A, M, B] (index_reduce's is [1, M, 1]), ``src`` of x's dtype."""
    A, N, B = xs.shape
    src32 = run(op, movement.copy, contig(src), torch.float32)[0] if src.dtype != torch.float32 else contig(src)
    if reduce in _SUMS:
        r = _scatter_sum(op, idx, src32, (A, N, B))
    else:
        idxf = run(op, movement.copy, contig(idx), torch.float32)[0].unsqueeze(1)
        r = _dense(op, idxf, src32.unsqueeze(1), N, reduce)
    need_count = reduce in _SUMS[1:] or not include_self
    cnt = _counts(op, idx, (A, N, B), xs.device) if need_count else r  # (r: unused by the formula)
    expr = _combine_expr(reduce, include_self).node
    return run(op, formula, xs, r, cnt, expr=expr, out_dtype=TORCH_TO_DTYPE[xs.dtype])[0]


def native(x: torch.Tensor, reduce: str, targets: int, per_target: int, dense: int) -> bool:
    """Whether a reduction into ``targets`` slots along the dim, at most ``per_target`` sources each, runs on
    the device: float dtypes, slot numbers and counts exact in FP32, and for prod/amax/amin a one-hot
    product of ``dense`` elements within ``DENSE_MAX``."""
    return (x.dtype in FLOATS and x.numel() < 2**31 and max(targets, per_target) < 2**24
            and (reduce in _SUMS or dense <= DENSE_MAX))


# -- scatter_reduce ----------------------------------------------------------------------------------------
def _region(shape, d: int) -> tuple:
    return tuple(slice(None) if k == d else slice(0, s) for k, s in enumerate(shape))


def _three(t: torch.Tensor, d: int) -> torch.Tensor:
    s = t.shape
    return t.reshape(math.prod(s[:d]), s[d], math.prod(s[d + 1:]))


def scatter_reduce_dense(op: str, overload, x, dim, index, src, reduce, include_self) -> torch.Tensor:
    """scatter_reduce along ``dim`` on the device (see the module docstring), or the CPU when not native."""
    kwargs = {"include_self": include_self} if overload is aten.scatter_reduce.two else {}
    meta_result(overload, x, dim, index, src, reduce, **kwargs)
    same_device(x, index, src)
    d = dim % max(x.dim(), 1)
    size = x.shape[d] if x.dim() else 1
    if not native(x, reduce, size, index.shape[d] if index.dim() else 1, index.numel() * size):
        return on_cpu(overload, x, dim, index, src, reduce, **kwargs)
    shape = tuple(index.shape) or (1,)
    idx = index32(op, index.view(shape), size, d, error=RuntimeError)  # an empty x still rejects every index
    if index.numel() == 0 or x.numel() == 0:
        return _clone(op, x)
    xv = x.view(1) if x.dim() == 0 else x
    sub = contig(src.view(shape) if src.dim() == 0 else src[tuple(slice(0, s) for s in shape)])
    region = _region(shape, d)
    xs = contig(xv[region])
    got = reduce_region(op, _three(xs, d), _three(idx, d), _three(sub, d), reduce, include_self).view(xs.shape)
    if xs.shape == xv.shape:  # the index reaches every slice of x
        return got.view(x.shape)
    out = _clone(op, x)
    copy_into(op, (out.view(1) if x.dim() == 0 else out)[region], got)
    return out


def _clone(op: str, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    copy_into(op, out, x)
    return out


def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    """reduce="sum" on float32 or an integer dtype is one scatter_add (exact integers; without include_self
    the targets are zeroed first by a scatter of 0); the rest as the module docstring says."""
    overload = aten.scatter_reduce.two
    if reduce == "sum" and x.dtype not in (torch.bfloat16, torch.float16) and addable(x.dtype) is not None:
        meta_result(overload, x, dim, index, src, reduce, include_self=include_self)
        base = x if include_self else _scatter("scatter_reduce", aten.scatter.value, x, dim, index, 0, False)
        return _scatter("scatter_reduce", aten.scatter_add.default, base, dim, index, src, True)
    return scatter_reduce_dense("scatter_reduce", overload, x, dim, index, src, reduce, include_self)


def scatter_reduce_out(x, dim, index, src, reduce, *, include_self=True, out):
    return write_out(out, scatter_reduce(x, dim, index, src, reduce, include_self=include_self))


def scatter_reduce_(x, dim, index, src, reduce, *, include_self=True):
    return x.copy_(scatter_reduce(x, dim, index, src, reduce, include_self=include_self))


# -- scatter(reduce=...) ----------------------------------------------------------------------------------
def _scatter_with(overload, x, dim, index, src, reduce):
    """scatter with ``reduce="add"`` is scatter_add, "multiply" a prod scatter_reduce including self;
    a scalar src becomes a tensor of it of the index's shape."""
    if reduce not in ("add", "multiply") or (reduce == "multiply" and x.dtype not in FLOATS):
        return on_cpu(overload, x, dim, index, src, reduce=reduce)
    if not isinstance(src, torch.Tensor):
        meta_result(overload, x, dim, index, src, reduce=reduce)
        if addable(x.dtype) is None:
            return on_cpu(overload, x, dim, index, src, reduce=reduce)
        src = full("scatter", index.shape, src, x.dtype, x.device)
    if reduce == "add":
        return _scatter("scatter", aten.scatter_add.default, x, dim, index, src, True)
    return scatter_reduce_dense("scatter", aten.scatter_reduce.two, x, dim, index, src, "prod", True)


def _register_scatter_with(overload: str) -> None:
    functional = getattr(aten.scatter, overload)

    def fn(x, dim, index, src, *, reduce):
        return _scatter_with(functional, x, dim, index, src, reduce)

    def fn_(x, dim, index, src, *, reduce):
        return x.copy_(fn(x, dim, index, src, reduce=reduce))

    def fn_out(x, dim, index, src, *, reduce, out):
        return write_out(out, fn(x, dim, index, src, reduce=reduce))

    impl(f"scatter.{overload}")(fn)
    impl(f"scatter_.{overload}")(fn_)
    impl(f"scatter.{overload}_out")(fn_out)




# -- index_reduce ------------------------------------------------------------------------------------------
def index_reduce(x, dim, index, source, reduce, include_self=True):
    op = "index_reduce"
    overload = aten.index_reduce.default
    meta_result(overload, x, dim, index, source, reduce, include_self=include_self)
    same_device(x, index, source)
    d = dim % max(x.dim(), 1)
    size = x.shape[d] if x.dim() else 1
    if not native(x, reduce, size, index.numel(), index.numel() * x.numel()):
        return on_cpu(overload, x, dim, index, source, reduce, include_self=include_self)
    idx = index32(op, index.reshape(-1), size, d, message=lambda v: "index out of range in self")  # empty x too
    if index.numel() == 0 or x.numel() == 0:
        return _clone(op, x)
    shape = tuple(x.shape) or (1,)
    src_shape = shape[:d] + (index.numel(),) + shape[d + 1:]
    xs = _three(contig(x).view(shape), d)
    src = _three(contig(source).view(src_shape), d)
    return reduce_region(op, xs, idx.view(1, -1, 1), src, reduce, include_self).view(x.shape)


def index_reduce_functional(x, dim, index, source, reduce, *, include_self=True):
    return index_reduce(x, dim, index, source, reduce, include_self)


def index_reduce_(x, dim, index, source, reduce, *, include_self=True):
    return x.copy_(index_reduce(x, dim, index, source, reduce, include_self))


def index_reduce_out(x, dim, index, source, reduce, *, include_self=True, out):
    return write_out(out, index_reduce(x, dim, index, source, reduce, include_self))
