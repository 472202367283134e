"""Casts between every pair of dtypes, from every layout (Tensor.to, and copy_ into a tensor of another
dtype and layout).

A floating value outside an integer dtype's range (NaN and inf included) cast to that dtype is undefined
behaviour in C++ and in PyTorch (the CPU's answer depends on the vector width), so float -> integer casts
draw only edge values the target holds."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from .op import Op
from .spec import Case
from .strategies import shapes, tensors
from .values import ALL

IN_RANGE_EDGES = (0.0, -0.0, 1.0, -1.0, 0.5)


def _defined(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every edge value of ``src`` has a defined cast to ``dst``."""
    floating = src.is_floating_point or src.is_complex
    return not (floating and not (dst.is_floating_point or dst.is_complex or dst == torch.bool))


def _in_range_fills(dst: torch.dtype) -> tuple[str, ...]:
    """Fills whose values every integer ``dst`` holds (randn stays within +-127 in practice; unsigned
    targets take no negative values)."""
    return ("positive", "const") if dst == torch.uint8 else ("normal", "ints", "positive", "const")


@st.composite
def _cast(draw, cap, into):
    src, dst = draw(st.sampled_from(ALL)), draw(st.sampled_from(ALL))
    shape = draw(shapes(cap))
    defined = _defined(src, dst)
    x = draw(tensors(shape, src, fill_kinds=None if defined else _in_range_fills(dst), with_edges=defined))
    if not defined and draw(st.booleans()):  # in-range edge values: signed zeros, +-1, 1/2
        edge = draw(st.sampled_from(IN_RANGE_EDGES if dst != torch.uint8 else (0.0, -0.0, 1.0, 0.5)))
        x = dataclasses.replace(x, edges=((draw(st.integers(0, 64)), edge),))
    if dst.is_complex and not (src.is_floating_point or src.is_complex):
        dst = torch.complex64
    ts = (x,)
    if into:
        ts += (draw(tensors(shape, dst, layouts=("contiguous", "transposed", "sliced"), with_edges=False)),)
    return Case(ts, {} if into else {"dtype": dst})


def _copy_into(x, out):
    return out.copy_(x)


CASTS = [
    Op("to_dtype", lambda x, dtype: x.to(dtype), lambda cap: _cast(cap, False), arbiter=False),
    Op("copy_into", _copy_into, lambda cap: _cast(cap, True), arbiter=False, inplace=True),
]
