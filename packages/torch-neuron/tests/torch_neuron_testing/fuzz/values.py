"""The values a fuzzed tensor holds: a base fill over its whole storage (a distribution chosen for what it
exercises) and edge values written at chosen storage positions.

Fills are generated from a seed with torch's CPU generator, so a case is rebuilt bit for bit from its spec.
"""

from __future__ import annotations

import math

import torch

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
COMPLEX = (torch.complex64,)
ALL = FLOATS + INTS + (torch.bool,) + COMPLEX

# Fills, simplest first (hypothesis shrinks towards the first): what each exercises
FLOAT_FILLS = (
    "normal",    # randn: the ordinary case
    "ints",      # small integers as floats: ties (sort, max, unique) and exact arithmetic
    "positive",  # (0.1, 2.1): inside log/sqrt/pow domains
    "wide",      # randn * 10**U(-8, 8): magnitudes far apart (cancellation, overflow of squares)
    "const",     # one value everywhere: zero variance, all ties
)
INT_FILLS = ("small", "nonneg", "full")  # [-4, 4], [0, 9], the dtype's whole range
BOOL_FILLS = ("bits",)


def fills(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return BOOL_FILLS
    if dtype.is_floating_point or dtype.is_complex:
        return FLOAT_FILLS
    return INT_FILLS


def edges(dtype: torch.dtype) -> tuple:
    """The edge values of ``dtype``: non-finite, signed zeros, denormals, huge, the dtype's extremes."""
    if dtype == torch.bool:
        return (True, False)
    if dtype.is_floating_point or dtype.is_complex:
        fi = torch.finfo(torch.float32 if dtype.is_complex else dtype)
        return (math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, -1.0, 0.5, fi.eps, fi.tiny, fi.tiny * fi.eps,
                -fi.tiny * fi.eps, fi.tiny / 4, 1e20, -1e20, fi.max, fi.min, 1e-20)
    ii = torch.iinfo(dtype)
    return tuple(sorted({0, 1, ii.max, ii.min, ii.max - 1, ii.min + 1, -1 if ii.min < 0 else 2}, key=abs))


def _fill_float(kind: str, n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    real = torch.float32 if dtype.is_complex else torch.float64
    if kind == "normal":
        x = torch.randn(n, generator=g, dtype=real)
    elif kind == "ints":
        x = torch.randint(-3, 4, (n,), generator=g).to(real)
    elif kind == "positive":
        x = torch.rand(n, generator=g, dtype=real) * 2 + 0.1
    elif kind == "wide":
        x = torch.randn(n, generator=g, dtype=real) * 10 ** (torch.rand(n, generator=g, dtype=real) * 16 - 8)
    elif kind == "const":
        x = torch.full((n,), 1.25, dtype=real)
    else:
        raise ValueError(f"unknown float fill {kind!r}")
    if dtype.is_complex:
        x = torch.complex(x, torch.randn(n, generator=g))
    return x.to(dtype)


def _fill_int(kind: str, n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    ii = torch.iinfo(dtype)
    if kind == "small":
        lo, hi = max(-4, ii.min), 5
    elif kind == "nonneg":
        lo, hi = 0, 10
    elif kind == "full":  # random bits cover the whole range, int64 included
        return torch.randint(-(2 ** 63), 2 ** 63 - 1, (n,), generator=g, dtype=torch.int64).to(dtype)
    else:
        raise ValueError(f"unknown int fill {kind!r}")
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def fill(kind: str, n: int, dtype: torch.dtype, seed: int, bounds: tuple[int, int] | None = None) -> torch.Tensor:
    """``n`` values of ``dtype``; ``bounds`` (lo, hi) makes integers in [lo, hi) (indices, class targets)."""
    g = torch.Generator().manual_seed(seed)
    if bounds is not None:
        lo, hi = bounds
        return torch.randint(lo, max(hi, lo + 1), (n,), generator=g, dtype=torch.int64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return _fill_float(kind, n, dtype, g)
    return _fill_int(kind, n, dtype, g)
