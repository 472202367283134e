"""histc: torch's linear-interpolation binning, step for step, and a scatter_add of ones.

torch's CPU kernel takes the outer edges in the input dtype (min/max, or the data's aminmax when they
are equal, widened by 1 when still equal) and bins an element x in [left, right] (NaN and outside: no
bin) at ``int((x - left) * bins / (right - left))``, the right edge in the last bin, every operation in
the input dtype. One formula program does the same in FP32 with a rounding to the input dtype after each
operation for 16-bit floats (FP32 operations on 16-bit values, rounded, are the 16-bit operations), a
cast and one scatter_add count the bins (FP32 counts, exact below 2**24). torch counts in the input
dtype, per thread: a 16-bit count above its dtype's exact integers (256 for bfloat16, 2048 for float16)
depends on torch's threads, so larger 16-bit inputs take the counted CPU path, as does float64. Integer
inputs, which the CPU refuses, are binned as CUDA does (integer arithmetic, exact in FP32 for the ranges
``_int_exact`` admits: Mixture-of-Experts routers count tokens per expert this way); others take the CPU
path, which raises torch's error.
"""

from __future__ import annotations

import math

import torch

from neuron_hal import DType
from neuron_kernels.library import movement, reduce
from neuron_kernels.library.formula import fmod, formula, inputs, minimum, where

from ..core.copy import to_host
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out
from ..pointwise.expr import rounded

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
    pos = where(pos.isnan(), 0.0, pos)  # (x - left) * bins overflowed the dtype: the CPU counts it in bin 0
    return where(x.ge(left) * x.le(right), pos, float(bins)).node


def _int_bin_expr(left: int, right: int, bins: int):
    """Bin number of input 0 (an integer tensor read as FP32) as CUDA's integer kernel computes it:
    ``(x - left) * bins / (right - left)`` in integer arithmetic (floor: the values are non-negative there),
    the right edge in the last bin. Exact in FP32 while ``(right - left) * bins < 2**24`` (``_int_exact``)."""
    (x,) = inputs(1)
    q = ((x - float(left)) * float(bins)) / float(right - left)
    pos = minimum(q - fmod(q, 1.0), float(bins - 1))
    return where(x.ge(float(left)) * x.le(float(right)), pos, float(bins)).node


_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _int_exact(left: float, right: float, bins: int, numel: int) -> bool:
    """FP32 reproduces the integer binning: operands and products below 2**24, edges well inside FP32's
    exact integers (so a large value that rounds cannot land inside), counts exact."""
    return (abs(left) < 2**23 and abs(right) < 2**23 and (right - left) * bins < 2**24 and numel < 2**24)


def _histc_int(op: str, self, bins: int, lo: float, hi: float):
    """torch.histc of an integer tensor (CUDA computes it; the CPU refuses integers): edges truncated to
    the dtype like CUDA's ``min.to<input_t>()``, binned in integer arithmetic; None when not exact here."""
    edges = _edges(op, self, float(int(lo)), float(int(hi)))
    if edges is None or not _int_exact(*edges, bins, self.numel()):
        return None
    left, right = int(edges[0]), int(edges[1])
    if self.numel() == 0:
        return torch.zeros(bins, dtype=self.dtype).to(self.device)
    x = run(op, movement.copy, contig(self).reshape(-1), dtype=torch.float32)[0]
    where_to = run(op, formula, x, expr=_int_bin_expr(left, right, bins), out_dtype=DType.float32)[0]
    return _count(op, where_to, bins, self.dtype)


def _count(op: str, where_to: torch.Tensor, bins: int, dtype: torch.dtype) -> torch.Tensor:
    """Counts of the bin numbers in ``where_to`` (FP32; ``bins`` = no bin) in ``dtype``."""
    index = run(op, movement.copy, where_to, dtype=torch.int32)[0]
    ones = torch.ones(where_to.shape[0], dtype=torch.float32).to(where_to.device)
    zeros = torch.zeros(bins + 1, dtype=torch.float32).to(where_to.device)  # the last one takes what no bin takes
    counts = run(op, movement.scatter_add, zeros, 0, index, ones)[0]
    return run(op, movement.copy, counts[:bins], dtype=dtype)[0]


def histc(self, bins=100, min=0, max=0):  # noqa: A002
    op = "histc"
    if self.dtype in _INTS and bins > 0:
        result = _histc_int(op, self, bins, min, max)
        if result is not None:
            return result
    if self.dtype not in EXACT_COUNT or self.numel() >= EXACT_COUNT[self.dtype] or bins <= 0:
        return on_cpu(aten.histc.default, self, bins, min, max)
    edges = _edges(op, self, float(min), float(max))
    if edges is None:
        return on_cpu(aten.histc.default, self, bins, min, max)
    if self.numel() == 0:
        return torch.zeros(bins, dtype=self.dtype).to(self.device)
    x = contig(self).reshape(-1)
    where_to = run(op, formula, x, expr=_bin_expr(self.dtype, *edges, bins), out_dtype=DType.float32)[0]
    return _count(op, where_to, bins, self.dtype)


def histc_out(self, bins=100, min=0, max=0, *, out):  # noqa: A002
    return write_out(out, histc(self, bins, min, max))
