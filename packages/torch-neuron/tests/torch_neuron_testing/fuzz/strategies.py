"""Hypothesis strategies for fuzz cases: sizes (0, 1, primes, around the 128 partitions, large free dims),
shapes under an element budget, layouts, fills with edge values, broadcasting partners, dims.

Every choice lists its simplest option first, so a failing case shrinks to a small, dense, ordinary one
and whatever remains in the reproducer is what the failure needs.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from .spec import LAYOUTS, T
from .values import edges, fills

# 1, primes, powers of two and their neighbours around the 128 SBUF partitions, large free dims
SIZES = (1, 2, 3, 5, 7, 4, 8, 13, 16, 31, 64, 127, 128, 129, 131, 200, 257, 509, 1031, 2053, 4099)


@st.composite
def shapes(draw, cap: int, min_dims: int = 0, max_dims: int = 4, min_size: int = 1) -> tuple[int, ...]:
    """A shape of ``min_dims``..``max_dims`` sizes from :data:`SIZES` with at most ``cap`` elements; one
    draw in eight has a zero size in one dim (not when a ``min_size`` above 1 is asked for)."""
    ndim = draw(st.integers(min_dims, max_dims))
    out, left = [], cap
    for _ in range(ndim):
        size = draw(st.sampled_from([s for s in SIZES if min_size <= s <= max(left, 1)] or [1]))
        out.append(size)
        left //= size
    if ndim and min_size == 1 and draw(st.integers(0, 7)) == 0:
        out[draw(st.integers(0, ndim - 1))] = 0
    return tuple(out)


def dtype_of(dtypes) -> st.SearchStrategy:
    return st.sampled_from(tuple(dtypes))


@st.composite
def tensors(draw, shape, dtype, layouts=LAYOUTS, fill_kinds=None, with_edges: bool = True,
            bounds: tuple[int, int] | None = None, cpu: bool = False) -> T:
    """A :class:`T` of ``shape``/``dtype`` in one of ``layouts``, with a fill and (unless ``bounds`` or not
    ``with_edges``) up to four edge values at chosen storage positions."""
    layout = draw(st.sampled_from(tuple(layouts)))
    kinds = tuple(fill_kinds or (fills(dtype) if bounds is None else ("normal",)))
    kind = draw(st.sampled_from(kinds))
    seed = draw(st.integers(0, 2 ** 16))
    edge = ()
    if with_edges and bounds is None:
        n = max(math.prod(shape), 1)
        pos = st.integers(0, 4 * n)  # wraps around the storage (views may have more storage than elements)
        edge = tuple(draw(st.lists(st.tuples(pos, st.sampled_from(edges(dtype))), max_size=4)))
    return T(tuple(shape), dtype, layout, kind, seed, edge, bounds, cpu)


def tensor(cap: int, dtype, min_dims=0, max_dims=4, **kw) -> st.SearchStrategy:
    return shapes(cap, min_dims, max_dims).flatmap(lambda s: tensors(s, dtype, **kw))


@st.composite
def broadcast_partner(draw, shape) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: a suffix of it, some sizes set to 1."""
    keep = draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - keep:]
    return tuple(1 if draw(st.booleans()) else s for s in suffix) if suffix else ()


def dim(ndim: int) -> st.SearchStrategy:
    return st.integers(-max(ndim, 1), max(ndim, 1) - 1)


@st.composite
def dims(draw, ndim: int):
    """None (all dims), one dim, or a set of distinct dims (possibly negative)."""
    kind = draw(st.sampled_from(("one", "all", "some")))
    if kind == "all" or ndim == 0:
        return None if kind == "all" or ndim == 0 else ()
    if kind == "one":
        return draw(dim(ndim))
    picked = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(d - ndim if draw(st.booleans()) else d for d in picked)


def float_dtypes(half: bool = True, double: bool = True) -> tuple[torch.dtype, ...]:
    out = [torch.float32, torch.bfloat16]
    out += [torch.float16] if half else []
    out += [torch.float64] if double else []
    return tuple(out)
