"""histc: torch's linear-interpolation binning, step for step, and a scatter_add of ones.

torch's CPU kernel takes the outer edges in the input dtype (min/max, or the data's aminmax when they
are equal, widened by 1 when still equal) and bins an element x in [left, right] (NaN and outside: no
bin) at ``int((x - left) * bins / (right - left))``, the right edge in the last bin, every operation in
the input dtype. One formula program does the same in FP32 with a rounding to the input dtype after each
operation for 16-bit floats (FP32 operations on 16-bit values, rounded, are the 16-bit operations), a
cast and one scatter_add count the bins (FP32 counts, exact below 2**24). torch counts in the input
dtype, per thread: a 16-bit count above its dtype's exact integers (256 for bfloat16, 2048 for float16)
depends on torch's threads, so larger 16-bit inputs take the counted CPU path, as do float64 and
integers (torch refuses them).
"""

from __future__ import annotations

import math

import torch

from neuron_hal import DType
from neuron_kernels.library import movement, reduce

from .common import contig, write_out
from .copy import to_host
from .launch import run
from .oncpu import on_cpu
from .pointwise_expr import fmod, formula, inputs, minimum, rounded, where
from .registry import impl

aten = torch.ops.aten
EXACT_COUNT = {torch.float32: 2**24, torch.bfloat16: 256, torch.float16: 2048}


def _in(dtype: torch.dtype, v: float) -> float:
    """v rounded to ``dtype`` (torch's edges and intermediate results live in the input dtype)."""
    return torch.tensor(v, dtype=torch.float64).to(dtype).item()


def _edges(op: str, x: torch.Tensor, lo: float, hi: float):
    """(left, right) as torch picks them, or None where torch raises (its error then comes from the CPU)."""
    if lo == hi and x.numel() > 0:
        lo, hi = (to_host(run(op, k, contig(x).reshape(-1), ())[0]).item() for k in (reduce.amin, reduce.amax))
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        return None
    return _in(x.dtype, lo), _in(x.dtype, hi)


def _bin_expr(dtype: torch.dtype, left: float, right: float, bins: int):
    """Bin number of input 0, ``bins`` for elements outside [left, right] (NaN too)."""
    (x,) = inputs(1)

    def r(e):
        return e if dtype == torch.float32 else rounded(e, dtype)

    t = r(r(r(x - left) * _in(dtype, bins)) / _in(dtype, right - left))
    pos = minimum(t - fmod(t, 1.0), float(bins - 1))  # int64 cast of a non-negative value; right edge: last bin
    return where(x.ge(left) * x.le(right), pos, float(bins)).node


def histc(self, bins=100, min=0, max=0):  # noqa: A002
    op = "histc"
    if self.dtype not in EXACT_COUNT or self.numel() >= EXACT_COUNT[self.dtype] or bins <= 0:
        return on_cpu(aten.histc.default, self, bins, min, max)
    edges = _edges(op, self, float(min), float(max))
    if edges is None:
        return on_cpu(aten.histc.default, self, bins, min, max)
    if self.numel() == 0:
        return torch.zeros(bins, dtype=self.dtype).to(self.device)
    x = contig(self).reshape(-1)
    where_to = run(op, formula, x, expr=_bin_expr(self.dtype, *edges, bins), out_dtype=DType.float32)[0]
    index = run(op, movement.copy, where_to, dtype=torch.int32)[0]
    ones = torch.ones(x.shape[0], dtype=torch.float32).to(x.device)
    zeros = torch.zeros(bins + 1, dtype=torch.float32).to(x.device)  # the last one takes what no bin takes
    counts = run(op, movement.scatter_add, zeros, 0, index, ones)[0]
    return run(op, movement.copy, counts[:bins], dtype=self.dtype)[0]


def histc_out(self, bins=100, min=0, max=0, *, out):  # noqa: A002
    return write_out(out, histc(self, bins, min, max))


def register(lib) -> None:
    impl("histc")(histc)
    impl("histc.out")(histc_out)

