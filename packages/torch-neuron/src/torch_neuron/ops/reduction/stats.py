"""Moments and norms: var/std (``correction``), var_mean/std_mean, logsumexp and linalg_vector_norm, on the
``reduce`` kernels (fp32 accumulation, Chan-merged two-pass variances, max-shifted logsumexp) and, for
the norms, elementwise kernels. Floats only (float64 and integer inputs take the counted CPU path;
logsumexp also takes bool/8-16-32-bit integers, as torch does, returning float32).

float32/bfloat16 variances are computed on x scaled by a power of two near its max magnitude (``_scaled``:
five more small programs) so that no squared deviation leaves FP32's range where torch's CPU, accumulating
in double, stays finite. Where the CPU's own float mean overflows (std of 100 values of 3e37 is inf there)
the device keeps the true result.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import elementwise, float_bits, movement, reduce
from neuron_kernels.library.formula import formula, inputs, where

from ..core.compose import const, ew, write_outs
from ..core.dtypes import FLOATS, device_dtype
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from .sums import ORDERED, cast_to, mean_dim, plan

aten = torch.ops.aten


# -- var / std ----------------------------------------------------------------------------------
def _var(name, std: bool, cpu_op, self, dim, correction, keepdim):
    if self.dtype not in FLOATS:
        return on_cpu(cpu_op, self, dim, correction=correction, keepdim=keepdim)
    dims, oshape, _ = plan(self, dim, keepdim)
    if self.numel() == 0:
        return const(oshape, math.nan, self.dtype, self.device)
    c = 1.0 if correction is None else float(correction)
    kernel, x = reduce.std if std else reduce.var, contig(self)
    if x.dtype == torch.float16:  # its squared deviations fit FP32 whatever the values
        return run(name, kernel, x, dims, c, keepdim)[0]
    m, mant = _max_and_mantissa(name, x, dims)
    y = run(name, formula, x, m, mant, expr=_scaled(-1), out_dtype=device_dtype(x.dtype))[0]
    v = run(name, kernel, y, dims, c, keepdim)[0]
    return run(name, formula, v, m.reshape(v.shape), mant.reshape(v.shape), expr=_scaled(1 if std else 2),
               out_dtype=device_dtype(x.dtype))[0]


def _max_and_mantissa(name, x, dims):
    """max |x| over ``dims`` (kept) and its frexp mantissa, from which ``_scaled`` makes a power of two."""
    m = run(name, reduce.amax, ew(name, elementwise.abs, x), dims, True)[0]
    bits = torch.int32 if m.dtype == torch.float32 else torch.int16
    fmt = "float32" if m.dtype == torch.float32 else "bfloat16"
    mant = run(name, float_bits.frexp, m.view(bits), fmt=fmt)[0].view(m.dtype)
    return m, mant


def _scaled(power: int):
    """x0 * s**power, s = max / (2 * mantissa), the power of two 2**(e - 1) (finite for any finite max; 1 where
    the max is 0, inf or NaN). torch's CPU accumulates var/std of float32 in double; in FP32 the squared
    deviations overflow from about 1.8e19 and underflow below about 1e-19, so the kernel sees x / s (|x / s|
    < 2) and the result is scaled back. Scaling by a power of two is exact: results inside FP32's range are
    the same as without it."""
    x, m, mant = inputs(3)
    q = m / (mant * 2.0)
    s = where(m.gt(0.0) * q.lt(math.inf), q, 1.0)
    if power < 0:
        return (x / s).node
    return (x * s * s if power == 2 else x * s).node


def var(self, dim=None, *, correction=None, keepdim=False):
    return _var("var", False, aten.var.correction, self, dim, correction, keepdim)


def std(self, dim=None, *, correction=None, keepdim=False):
    return _var("std", True, aten.std.correction, self, dim, correction, keepdim)


def var_mean(self, dim=None, *, correction=None, keepdim=False):
    if self.dtype not in FLOATS:
        return on_cpu(aten.var_mean.correction, self, dim, correction=correction, keepdim=keepdim)
    return var(self, dim, correction=correction, keepdim=keepdim), mean_dim(self, dim, keepdim)


def std_mean(self, dim=None, *, correction=None, keepdim=False):
    if self.dtype not in FLOATS:
        return on_cpu(aten.std_mean.correction, self, dim, correction=correction, keepdim=keepdim)
    return std(self, dim, correction=correction, keepdim=keepdim), mean_dim(self, dim, keepdim)


# -- logsumexp ------------------------------------------------------------------------------------
def logsumexp(self, dim, keepdim=False):
    if self.dtype not in ORDERED:
        return on_cpu(aten.logsumexp.default, self, dim, keepdim)
    dims, oshape, _ = plan(self, dim, keepdim)
    if self.numel() == 0:
        return const(oshape, -math.inf, self.dtype if self.dtype in FLOATS else torch.float32, self.device)
    return run("logsumexp", reduce.logsumexp, contig(self), dims, keepdim)[0]


# -- norms ----------------------------------------------------------------------------------------
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    """sum(|x|^ord)^(1/ord) (and the max/min/count forms for inf/-inf/0) from elementwise and reduce
    kernels; 16-bit inputs are widened to fp32 first so every intermediate is fp32, as torch's."""
    x = cast_to(self, dtype)
    p = float(ord)
    if x is None or x.dtype not in FLOATS or (x.numel() == 0 and (p < 0 or math.isinf(p))):
        return on_cpu(aten.linalg_vector_norm.default, self, ord, dim, keepdim, dtype=dtype)
    dims, oshape, count = plan(x, dim, keepdim)
    if x.numel() == 0:  # sums over nothing
        return const(oshape, 0, x.dtype, x.device)
    x, name = contig(x), "linalg_vector_norm"
    if count == 1 and p != 0:  # |x| itself, as torch's CPU gives: |x|^p would overflow or underflow for nothing
        return ew(name, elementwise.abs, x).reshape(oshape)
    if math.isinf(p):
        mag = ew(name, elementwise.abs, x)
        return run(name, reduce.amax if p > 0 else reduce.amin, mag, dims, keepdim)[0]
    xf = x if x.dtype == torch.float32 else run(name, movement.copy, x, torch.float32)[0]
    if p == 0:  # a count, summed in fp32 as torch does
        terms = run(name, movement.copy, ew(name, elementwise.ne, xf, 0), torch.float32)[0]
        total = run(name, reduce.sum, terms, dims, keepdim)[0]
    else:
        mag = ew(name, elementwise.square, xf) if p == 2 else ew(name, elementwise.abs, xf)
        terms = mag if p in (1, 2) else ew(name, elementwise.pow, mag, p)
        total = run(name, reduce.sum, terms, dims, keepdim)[0]
        if p != 1:
            total = ew(name, elementwise.sqrt, total) if p == 2 else ew(name, elementwise.pow, total, 1.0 / p)
    return total if x.dtype == torch.float32 else run(name, movement.copy, total, x.dtype)[0]


def _pair_out(fn):
    def run_out(*args, out0, out1, **kwargs):
        return write_outs((out0, out1), fn(*args, **kwargs))
    return run_out
