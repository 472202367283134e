"""Indexing families: gather / scatter (value, src, add, reduce), index_select / index_add / index_copy /
index_fill / index_put (accumulate or not), advanced getitem, masked_fill / masked_select /
masked_scatter, take / take_along_dim, nonzero, embedding.

Writes with repeated indices are ordered nowhere in PyTorch, so a non-accumulating write draws indices that
are distinct along the written dim (fill "perm"); accumulating ones take any."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from .op import Op, magnitude
from .pointwise import EVERY, FLOATS, NUMERIC
from .spec import Case
from .strategies import dim, shapes, tensors

GATHER_DTYPES = EVERY
ACCUMULATE_DTYPES = NUMERIC


def _index(shape, size, distinct=False, cpu=False):
    """int64 indices of ``shape`` into a dim of ``size``; ``distinct`` along the last dim, dense (the op moves
    that dim into place, which makes the index non-contiguous: another layout would reorder the values)."""
    layouts = ("contiguous",) if distinct else ("contiguous", "transposed", "expanded")
    return tensors(shape, torch.int64, layouts=layouts, bounds=(0, size), cpu=cpu,
                   fill_kinds=("perm",) if distinct else None)


@st.composite
def _along(draw, cap, dtypes, distinct, with_src):
    """x, dim and an index shaped for gather/scatter along dim (no larger than x elsewhere)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap, min_dims=1))
    d = draw(dim(len(shape))) % len(shape)
    ishape = []
    for j, s in enumerate(shape):
        if j == d:
            options = (s, 1, 3) if distinct else (s, 1, 3, 2 * s + 1)
            ishape.append(min(draw(st.sampled_from(options)), s) if distinct else draw(st.sampled_from(options)))
        else:
            ishape.append(draw(st.sampled_from((s, 1, s // 2))))
    # distinct indices are drawn along the last dim, then moved to ``d`` by the op (a non-contiguous index)
    moved = tuple(ishape[:d] + ishape[d + 1:] + [ishape[d]]) if distinct else tuple(ishape)
    ts = (draw(tensors(shape, dtype)), draw(_index(moved, shape[d], distinct)))
    if with_src:
        ts += (draw(tensors(tuple(ishape), dtype)),)
    return Case(ts, {"dim": d, "moved": distinct})


def _idx(index, dim, moved):
    return index.movedim(-1, dim) if moved else index


def _gather(x, index, dim, moved):
    return torch.gather(x, dim, _idx(index, dim, moved))


def _scatter(x, index, src, dim, moved):
    return x.scatter(dim, _idx(index, dim, moved), src)


def _scatter_value(x, index, dim, moved):
    return x.scatter(dim, _idx(index, dim, moved), 2.5 if x.dtype.is_floating_point else 3)


def _scatter_add(x, index, src, dim, moved):
    return x.scatter_add(dim, _idx(index, dim, moved), src)


def _scatter_reduce(reduce, include_self):
    def fn(x, index, src, dim, moved):
        return x.scatter_reduce(dim, _idx(index, dim, moved), src, reduce, include_self=include_self)
    return fn


@st.composite
def _select(draw, cap, dtypes, distinct, with_src, with_value=False):
    """x, dim and a 1-D index into dim (index_select / index_add / index_copy / index_fill)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap, min_dims=1))
    d = draw(dim(len(shape))) % len(shape)
    size = shape[d]
    count = min(draw(st.sampled_from((size, 1, 3, 0, 2 * size + 1))), size if distinct else 10 ** 9)
    ts = (draw(tensors(shape, dtype)), draw(_index((count,), size, distinct)))
    if with_src:
        src_shape = shape[:d] + (count,) + shape[d + 1:]
        ts += (draw(tensors(src_shape, dtype)),)
    p = {"dim": d}
    if with_value:
        p["alpha"] = draw(st.sampled_from((1, 2, -1)))
    return Case(ts, p)


def _index_add(x, i, s, dim, alpha):
    return x.index_add(dim, i, s, alpha=alpha)


@st.composite
def _index_put(draw, cap, dtypes, accumulate):
    """x[i0, i1, ...] = v with 1 or 2 broadcast index tensors on the leading dims."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap, min_dims=1))
    k = draw(st.integers(1, min(2, len(shape))))
    count = draw(st.sampled_from((1, 3, 7, 0, 130)))
    if not accumulate:
        count = min(count, shape[0])
    idx = tuple(draw(_index((count,), shape[j], distinct=not accumulate and j == 0)) for j in range(k))
    vshape = draw(st.sampled_from(((count,) + shape[k:], shape[k:], ())))
    return Case(idx + (draw(tensors(shape, dtype)), draw(tensors(vshape, dtype))), {"k": k, "accumulate": accumulate})


def _put(*ts, k, accumulate):
    idx, x, v = ts[:k], ts[k], ts[k + 1]
    return x.index_put(idx, v, accumulate=accumulate)


@st.composite
def _getitem(draw, cap, dtypes):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap, min_dims=1))
    kind = draw(st.sampled_from(("first", "second", "pair", "mask", "negative")))
    x = draw(tensors(shape, dtype))
    if kind == "mask":
        return Case((x, draw(tensors(shape[:draw(st.integers(1, len(shape)))], torch.bool))), {"kind": kind})
    j = 1 if kind == "second" and len(shape) > 1 else 0
    ishape = draw(shapes(64, min_dims=1, max_dims=2))
    lo = -shape[j] if kind == "negative" else 0
    idx = draw(tensors(ishape, torch.int64, bounds=(lo, shape[j])))
    if kind == "pair" and len(shape) > 1:
        return Case((x, idx, draw(tensors(ishape, torch.int64, bounds=(0, shape[1])))), {"kind": kind})
    return Case((x, idx), {"kind": kind if j == 1 else "first"})


def _get(x, i, i2=None, kind="first"):
    if kind == "second":
        return x[:, i]
    if kind == "pair" and i2 is not None:
        return x[i, i2]
    return x[i]


@st.composite
def _masked(draw, cap, dtypes, with_src):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    mask_shape = draw(st.sampled_from((shape, shape[1:], tuple(1 for _ in shape))))
    ts = (draw(tensors(shape, dtype)), draw(tensors(mask_shape, torch.bool)))
    if with_src:
        ts += (draw(tensors(shape, dtype)),)
    return Case(ts)


def _masked_fill(x, mask):
    return x.masked_fill(mask, 7 if not x.dtype.is_floating_point else -1.5)


@st.composite
def _take(draw, cap, dtypes, along):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap, min_dims=1))
    x = draw(tensors(shape, dtype))
    if along:
        d = draw(dim(len(shape))) % len(shape)
        ishape = tuple(draw(st.sampled_from((s, 1))) if j != d else draw(st.sampled_from((s, 1, 3)))
                       for j, s in enumerate(shape))
        return Case((x, draw(tensors(ishape, torch.int64, bounds=(0, shape[d])))), {"dim": d})
    n = math.prod(shape)
    return Case((x, draw(tensors(draw(shapes(256, max_dims=2)), torch.int64, bounds=(-n, n)))))


@st.composite
def _embedding(draw, cap):
    dtype = draw(st.sampled_from(FLOATS))
    num, width = draw(st.sampled_from((1, 3, 5, 129, 1000))), draw(st.sampled_from((1, 2, 16, 128, 300)))
    if num * width > cap:
        width = max(cap // num, 1)
    weight = draw(tensors((num, width), dtype))
    idx = draw(tensors(draw(shapes(512, max_dims=2)), torch.int64, bounds=(0, num)))
    return Case((idx, weight), {"padding_idx": draw(st.sampled_from((None, 0)))})


def _unary_case(cap, dtypes):
    return st.sampled_from(dtypes).flatmap(lambda d: shapes(cap).flatmap(lambda s: tensors(s, d))).map(
        lambda t: Case((t,)))


INDEXING = [
    Op("gather", _gather, lambda cap: _along(cap, GATHER_DTYPES, False, False)),
    Op("scatter", _scatter, lambda cap: _along(cap, GATHER_DTYPES, True, True)),
    Op("scatter_value", _scatter_value, lambda cap: _along(cap, NUMERIC, True, False)),
    Op("scatter_add", _scatter_add, lambda cap: _along(cap, ACCUMULATE_DTYPES, False, True),
       scale=magnitude(_scatter_add)),
    *[Op(f"scatter_reduce_{r}{'' if inc else '_exclude_self'}", _scatter_reduce(r, inc),
         lambda cap: _along(cap, ACCUMULATE_DTYPES, False, True),
         scale=magnitude(_scatter_reduce(r, inc)) if r in ("sum", "mean") else None)
      for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)],
    Op("index_select", lambda x, i, dim: torch.index_select(x, dim, i),
       lambda cap: _select(cap, GATHER_DTYPES, False, False)),
    Op("index_add", _index_add, lambda cap: _select(cap, ACCUMULATE_DTYPES, False, True, with_value=True),
       scale=magnitude(_index_add)),
    Op("index_copy", lambda x, i, s, dim: x.index_copy(dim, i, s), lambda cap: _select(cap, GATHER_DTYPES, True, True)),
    Op("index_fill", lambda x, i, dim: x.index_fill(dim, i, -2), lambda cap: _select(cap, NUMERIC, False, False)),
    Op("index_put", _put, lambda cap: _index_put(cap, GATHER_DTYPES, False)),
    Op("index_put_accumulate", _put, lambda cap: _index_put(cap, ACCUMULATE_DTYPES, True), scale=magnitude(_put)),
    Op("getitem", _get, lambda cap: _getitem(cap, GATHER_DTYPES)),
    Op("masked_fill", _masked_fill, lambda cap: _masked(cap, GATHER_DTYPES, False)),
    Op("masked_select", torch.masked_select, lambda cap: _masked(cap, GATHER_DTYPES, False)),
    Op("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), lambda cap: _masked(cap, GATHER_DTYPES, True)),
    Op("take", torch.take, lambda cap: _take(cap, GATHER_DTYPES, False)),
    Op("take_along_dim", lambda x, i, dim: torch.take_along_dim(x, i, dim),
       lambda cap: _take(cap, GATHER_DTYPES, True)),
    Op("nonzero", torch.nonzero, lambda cap: _unary_case(cap, GATHER_DTYPES)),
    Op("embedding", lambda i, w, padding_idx: F.embedding(i, w, padding_idx), _embedding),
]
