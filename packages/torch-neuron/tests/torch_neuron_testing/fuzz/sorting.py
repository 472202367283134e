"""Sorting and selection: sort (stable or not, descending), argsort, topk (sorted or not), kthvalue, msort,
unique / unique_consecutive (counts, inverse), searchsorted, bucketize, bincount, histc.

Indices of equal values are unspecified unless the sort is stable: such results are compared as the
values they pick from the input."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from .op import Op
from .pointwise import FLOATS, NUMERIC
from .spec import Case
from .strategies import dim, shapes, tensors

SORT_DTYPES = NUMERIC + (torch.bool,)


def _pick(out, inputs, params):
    """(values, the input's values at the returned indices) for (values, indices) along params['dim']."""
    values, indices = out
    x, d = inputs[0], params.get("dim", -1)
    if x.dim() == 0:
        return values, indices
    return values, torch.take_along_dim(x, indices, d)


def _sorted_pick(out, inputs, params):
    """topk(sorted=False): the order is unspecified, so both are compared sorted."""
    values, picked = _pick(out, inputs, params)
    d = params.get("dim", -1)
    return (values.sort(d)[0], picked.sort(d)[0]) if values.dim() else (values, picked)


@st.composite
def _along(draw, cap, dtypes, params):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    d = draw(dim(len(shape)))
    p = {"dim": d}
    p.update(draw(params(shape, d)))
    return Case((draw(tensors(shape, dtype)),), p)


def _topk_params(shape, d):
    size = shape[d] if shape else 1
    return st.fixed_dictionaries({"k": st.integers(0, size), "largest": st.booleans(), "sorted": st.booleans()})


def _kth_params(shape, d):
    size = shape[d] if shape else 1
    return st.fixed_dictionaries({"k": st.integers(1, max(size, 1)), "keepdim": st.booleans()})


def _sort_params(shape, d):
    return st.fixed_dictionaries({"descending": st.booleans(), "stable": st.booleans()})


def _no_params(shape, d):
    return st.just({})


def _sort(x, dim, descending, stable):
    return tuple(torch.sort(x, dim=dim, descending=descending, stable=stable))


def _sort_post(out, inputs, params):
    return out if params["stable"] else _pick(out, inputs, params)


def _kth_pick(out, inputs, params):
    values, indices = out
    if inputs[0].dim() == 0:
        return values, indices
    d = params["dim"]
    idx = indices if params["keepdim"] else indices.unsqueeze(d)
    picked = torch.take_along_dim(inputs[0], idx, d)
    return values, picked if params["keepdim"] else picked.squeeze(d)


def _topk_post(out, inputs, params):
    return _pick(out, inputs, params) if params["sorted"] else _sorted_pick(out, inputs, params)


@st.composite
def _unique(draw, cap, consecutive):
    dtype = draw(st.sampled_from(SORT_DTYPES))
    shape = draw(shapes(cap))
    p = {"return_inverse": draw(st.booleans()), "return_counts": draw(st.booleans())}
    if not consecutive and shape and draw(st.booleans()):
        p["dim"] = draw(dim(len(shape)))
    return Case((draw(tensors(shape, dtype, fill_kinds=None)),), p)


def _unique_fn(x, **p):
    out = torch.unique(x, sorted=True, **p)
    return tuple(out) if isinstance(out, tuple) else out


def _unique_consecutive_fn(x, **p):
    out = torch.unique_consecutive(x, **p)
    return tuple(out) if isinstance(out, tuple) else out


@st.composite
def _search(draw, cap, bucketize):
    dtype = draw(st.sampled_from(NUMERIC))
    n = draw(st.sampled_from((1, 2, 5, 0, 128, 1031)))
    boundaries = draw(tensors((n,), dtype))
    values = draw(tensors(draw(shapes(cap, max_dims=2)), dtype))
    return Case((boundaries, values), {"right": draw(st.booleans()), "bucketize": bucketize})


def _searchsorted(boundaries, values, right, bucketize):
    b = boundaries.sort()[0]  # NaN sorts last, as searchsorted expects
    return torch.bucketize(values, b, right=right) if bucketize else torch.searchsorted(b, values, right=right)


@st.composite
def _counts(draw, cap, hist):
    if hist:
        x = draw(tensors(draw(shapes(cap, max_dims=2)), draw(st.sampled_from(FLOATS))))
        return Case((x,), {"bins": draw(st.sampled_from((1, 4, 100, 129))), "min": draw(st.sampled_from((0, -1))),
                           "max": draw(st.sampled_from((0, 1, 3)))})
    x = draw(tensors(draw(shapes(cap, max_dims=1, min_dims=1)), torch.int64, bounds=(0, draw(
        st.sampled_from((1, 5, 129, 3000))))))
    return Case((x,), {"minlength": draw(st.sampled_from((0, 10)))})


SORTING = [
    Op("sort", _sort, lambda cap: _along(cap, SORT_DTYPES, _sort_params), post=_sort_post),
    Op("argsort_stable", lambda x, dim, descending, stable: torch.argsort(x, dim=dim, descending=descending,
                                                                          stable=True),
       lambda cap: _along(cap, SORT_DTYPES, _sort_params)),
    Op("msort", lambda x, dim: torch.msort(x), lambda cap: _along(cap, SORT_DTYPES, _no_params)),
    Op("topk", lambda x, **p: tuple(torch.topk(x, **p)), lambda cap: _along(cap, NUMERIC, _topk_params),
       post=_topk_post),
    Op("kthvalue", lambda x, **p: tuple(torch.kthvalue(x, **p)), lambda cap: _along(cap, NUMERIC, _kth_params),
       post=_kth_pick),
    Op("unique", _unique_fn, lambda cap: _unique(cap, False)),
    Op("unique_consecutive", _unique_consecutive_fn, lambda cap: _unique(cap, True)),
    Op("searchsorted", _searchsorted, lambda cap: _search(cap, False)),
    Op("bucketize", _searchsorted, lambda cap: _search(cap, True)),
    Op("histc", lambda x, **p: torch.histc(x, **p), lambda cap: _counts(cap, True)),
    Op("bincount", lambda x, **p: torch.bincount(x, **p), lambda cap: _counts(cap, False)),
]
