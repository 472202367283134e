"""Matrix products: mm, bmm, matmul (broadcast batches, 1-D operands), linear (bias or not), addmm,
baddbmm, dot, mv, einsum. Rounding errors are judged relative to |a| @ |b| (any summation order is right)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from .op import Op, magnitude
from .spec import Case
from .strategies import SIZES, tensors

MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
INT_MM = (torch.int64, torch.int32)


BATCHES = (1, 2, 3, 0, 5, 7, 13)


@st.composite
def _sizes(draw, cap, n):
    """A batch size, then ``n`` sizes whose pairwise products times the batch stay within ``cap``."""
    b = draw(st.sampled_from(BATCHES))
    out, budget = [b], cap // max(b, 1)
    for _ in range(n):
        biggest = max(max(out[1:], default=1), 1)
        out.append(draw(st.sampled_from([s for s in SIZES if s * biggest <= budget])))
    return out


@st.composite
def _mm(draw, cap, dtypes, batch: bool, bias: str | None):
    dtype = draw(st.sampled_from(dtypes))
    b, m, k, n = draw(_sizes(cap, 3))
    lead = (b,) if batch else ()
    if bias is None:
        return Case((draw(tensors(lead + (m, k), dtype)), draw(tensors(lead + (k, n), dtype))))
    out_shape = lead + (m, n) if bias == "full" else (n,)
    c = draw(tensors(out_shape, dtype))
    return Case((c, draw(tensors(lead + (m, k), dtype)), draw(tensors(lead + (k, n), dtype))),
                {"beta": draw(st.sampled_from((1, 0.5, 0))), "alpha": draw(st.sampled_from((1, 2.0, -0.5)))})


@st.composite
def _matmul(draw, cap):
    """torch.matmul's cases: 1-D x 1-D, 1-D x N-D, N-D x 1-D, broadcast batches."""
    dtype = draw(st.sampled_from(MM_DTYPES))
    b, m, k, n = draw(_sizes(cap, 3))
    left = draw(st.sampled_from(((k,), (m, k), (b, m, k), (1, m, k), (b, 1, m, k))))
    right = draw(st.sampled_from(((k,), (k, n), (b, k, n), (1, k, n))))
    return Case((draw(tensors(left, dtype)), draw(tensors(right, dtype))))


@st.composite
def _linear(draw, cap):
    dtype = draw(st.sampled_from(MM_DTYPES))
    b, m, k, n = draw(_sizes(cap, 3))
    x = draw(tensors(draw(st.sampled_from(((m, k), (b, m, k), (k,)))), dtype))
    bias = draw(st.one_of(st.none(), tensors((n,), dtype)))
    return Case((x, draw(tensors((n, k), dtype))) + ((bias,) if bias is not None else ()))


def _mm_op(name, fn, case, **kw):
    return Op(name, fn, case, scale=magnitude(fn), **kw)


MATMUL = [
    _mm_op("mm", torch.mm, lambda cap: _mm(cap, MM_DTYPES, False, None)),
    _mm_op("mm_int", torch.mm, lambda cap: _mm(cap, INT_MM, False, None)),
    _mm_op("bmm", torch.bmm, lambda cap: _mm(cap, MM_DTYPES, True, None)),
    _mm_op("addmm", lambda c, a, b, **p: torch.addmm(c, a, b, **p), lambda cap: _mm(cap, MM_DTYPES, False, "row")),
    _mm_op("addmm_full", lambda c, a, b, **p: torch.addmm(c, a, b, **p),
           lambda cap: _mm(cap, MM_DTYPES, False, "full")),
    _mm_op("baddbmm", lambda c, a, b, **p: torch.baddbmm(c, a, b, **p), lambda cap: _mm(cap, MM_DTYPES, True, "full")),
    _mm_op("matmul", torch.matmul, _matmul),
    _mm_op("linear", F.linear, _linear),
    _mm_op("einsum_bij_bjk", lambda a, b: torch.einsum("bij,bjk->bik", a, b),
           lambda cap: _mm(cap, MM_DTYPES, True, None)),
]
