"""Reductions over any dims (keepdim, dtype=), scans, and the order statistics (median, kthvalue, mode)."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from .op import Op, magnitude
from .pointwise import EVERY, FLOATS, NUMERIC
from .spec import Case
from .strategies import dim, dims, shapes, tensors


@st.composite
def _reduce(draw, cap, dtypes, over, params):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    p = {"dim": draw(over(len(shape)))}
    p.update(draw(params) if params is not None else {})
    return Case((draw(tensors(shape, dtype)),), p)


def reduction(name, fn, dtypes=FLOATS, over=dims, params=None, **kw) -> Op:
    """``fn(x, dim=..., **params)``; ``over(ndim)`` draws the dim argument."""
    return Op(name, fn, lambda cap: _reduce(cap, dtypes, over, params), **kw)


def _one_dim(ndim):
    return dim(ndim)


def _named_dims(ndim):
    return dims(ndim).map(lambda d: tuple(range(ndim)) if d is None else d)


def _dim_or_none(ndim):
    return st.one_of(st.none(), dim(ndim))


KEEP = st.fixed_dictionaries({"keepdim": st.booleans()})
CORRECTION = st.fixed_dictionaries({"keepdim": st.booleans(), "correction": st.sampled_from((1, 0, 2))})
NORM_P = st.fixed_dictionaries({"keepdim": st.booleans(),
                                "ord": st.sampled_from((2, 1, math.inf, -math.inf, 3, 0, 0.5))})


def _sum(x, dim, keepdim):
    return torch.sum(x, dim, keepdim=keepdim)


def _sum_float32(x, dim, keepdim):
    return torch.sum(x, _all(dim), keepdim=keepdim, dtype=torch.float32)


def _mean(x, dim, keepdim):
    return torch.mean(x, dim, keepdim=keepdim)


def _sorted_pick(out, inputs, params):
    """(values, the input's values at the returned indices): the index of one of several equal values may
    be any of them."""
    values, indices = out
    x, d = inputs[0], params.get("dim", -1)
    if x.dim() == 0:  # the only index is 0
        return values, indices
    keep = params.get("keepdim", False)
    idx = indices if keep else indices.unsqueeze(d)
    picked = torch.take_along_dim(x, idx, d)
    return values, picked if keep else picked.squeeze(d)


def _all(dim):
    """aten's "every dim" for reductions whose dim list is () rather than None."""
    return () if dim is None else dim


def _scan(name):
    return lambda x, dim: getattr(torch, name)(x, dim)


def _cum_extreme(name):
    return lambda x, dim: tuple(getattr(torch, name)(x, dim))


REDUCTIONS = [
    reduction("sum", _sum, NUMERIC + (torch.bool, torch.complex64), params=KEEP, scale=magnitude(_sum)),
    reduction("sum_dtype", _sum_float32, FLOATS[:3] + NUMERIC[4:], params=KEEP,
              scale=lambda x, dim, keepdim: torch.sum(x.double().abs(), _all(dim), keepdim=keepdim)),
    reduction("mean", _mean, FLOATS + (torch.complex64,), params=KEEP, scale=magnitude(_mean)),
    reduction("nansum", lambda x, dim, keepdim: torch.nansum(x, dim, keepdim=keepdim), FLOATS, params=KEEP,
              scale=magnitude(lambda x, dim, keepdim: torch.nansum(x, dim, keepdim=keepdim))),
    reduction("nanmean", lambda x, dim, keepdim: torch.nanmean(x, dim, keepdim=keepdim), FLOATS, params=KEEP,
              scale=magnitude(lambda x, dim, keepdim: torch.nanmean(x, dim, keepdim=keepdim))),
    reduction("prod", lambda x, dim, keepdim: torch.prod(x, dim, keepdim=keepdim) if dim is not None
              else torch.prod(x), NUMERIC + (torch.bool,), over=_dim_or_none, params=KEEP),
    reduction("amax", lambda x, dim, keepdim: torch.amax(x, _all(dim), keepdim=keepdim), NUMERIC + (torch.bool,),
              params=KEEP),
    reduction("amin", lambda x, dim, keepdim: torch.amin(x, _all(dim), keepdim=keepdim), NUMERIC, params=KEEP),
    reduction("aminmax", lambda x, dim, keepdim: tuple(torch.aminmax(x, dim=dim, keepdim=keepdim)), NUMERIC,
              over=_dim_or_none, params=KEEP),
    reduction("max_dim", lambda x, dim, keepdim: tuple(torch.max(x, dim, keepdim=keepdim)), NUMERIC,
              over=_one_dim, params=KEEP),
    reduction("min_dim", lambda x, dim, keepdim: tuple(torch.min(x, dim, keepdim=keepdim)), NUMERIC,
              over=_one_dim, params=KEEP),
    reduction("max", lambda x, dim: torch.max(x), NUMERIC + (torch.bool,), over=lambda n: st.none()),
    reduction("argmax", lambda x, dim, keepdim: torch.argmax(x, dim, keepdim=keepdim), NUMERIC,
              over=_dim_or_none, params=KEEP),
    reduction("argmin", lambda x, dim, keepdim: torch.argmin(x, dim, keepdim=keepdim), NUMERIC,
              over=_dim_or_none, params=KEEP),
    reduction("var", lambda x, dim, **k: torch.var(x, dim, **k), FLOATS, params=CORRECTION),
    reduction("std", lambda x, dim, **k: torch.std(x, dim, **k), FLOATS, params=CORRECTION),
    reduction("var_mean", lambda x, dim, **k: tuple(torch.var_mean(x, dim, **k)), FLOATS, params=CORRECTION,
              reference=lambda x, dim, **k: (torch.var(x, dim, **k), _mean(x, dim, k["keepdim"]))),
    reduction("std_mean", lambda x, dim, **k: tuple(torch.std_mean(x, dim, **k)), FLOATS, params=CORRECTION,
              reference=lambda x, dim, **k: (torch.std(x, dim, **k), _mean(x, dim, k["keepdim"]))),
    reduction("vector_norm", lambda x, dim, **k: torch.linalg.vector_norm(x, dim=dim, **k), FLOATS,
              params=NORM_P),
    reduction("norm_fro", lambda x, dim, keepdim: torch.norm(x, dim=dim, keepdim=keepdim), FLOATS, params=KEEP),
    # named dims only: the CPU raises for logsumexp(x, ()) whatever x (its output is resized to the wrong shape)
    reduction("logsumexp", lambda x, dim, keepdim: torch.logsumexp(x, dim, keepdim=keepdim), FLOATS,
              over=_named_dims, params=KEEP),
    reduction("all", lambda x, dim, keepdim: torch.all(x, dim, keepdim=keepdim) if dim is not None
              else torch.all(x), EVERY, over=_dim_or_none, params=KEEP),
    reduction("any", lambda x, dim, keepdim: torch.any(x, dim, keepdim=keepdim) if dim is not None
              else torch.any(x), EVERY, over=_dim_or_none, params=KEEP),
    reduction("count_nonzero", lambda x, dim: torch.count_nonzero(x, dim), EVERY),
    reduction("cumsum", _scan("cumsum"), NUMERIC + (torch.bool,), over=_one_dim,
              scale=magnitude(_scan("cumsum"))),
    reduction("cumprod", _scan("cumprod"), NUMERIC, over=_one_dim),
    reduction("logcumsumexp", _scan("logcumsumexp"), FLOATS, over=_one_dim),
    reduction("cummax", _cum_extreme("cummax"), NUMERIC, over=_one_dim),
    reduction("cummin", _cum_extreme("cummin"), NUMERIC, over=_one_dim),
    reduction("median", lambda x, dim: torch.median(x), NUMERIC, over=lambda n: st.none()),
    reduction("median_dim", lambda x, dim, keepdim: tuple(torch.median(x, dim, keepdim=keepdim)), NUMERIC,
              over=_one_dim, params=KEEP, post=_sorted_pick),
    reduction("nanmedian_dim", lambda x, dim, keepdim: tuple(torch.nanmedian(x, dim, keepdim=keepdim)), FLOATS,
              over=_one_dim, params=KEEP, post=_sorted_pick),
    reduction("mode", lambda x, dim, keepdim: tuple(torch.mode(x, dim, keepdim=keepdim)), NUMERIC,
              over=_one_dim, params=KEEP, post=_sorted_pick),
]
