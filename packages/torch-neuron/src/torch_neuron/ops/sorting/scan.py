"""cummax / cummin (``_cummax_helper`` / ``_cummin_helper``), logcumsumexp and cumprod along a dim.

The running extremes and logcumsumexp are prefix reductions over an [B, n, n] matrix masked by j <= i
(one formula program, one reduce launch: few launches, O(n^2) work, so rows up to ``SCAN_MAX``):
- cummax_i = max of x_j, j <= i, NaN propagating; its index is torch's: the last j <= i holding that
  value (torch updates on ``x >= max`` or a NaN), and the value is read back at that index (so a -0.0
  after a 0.0 is torch's -0.0).
- logcumsumexp_i = m_i + log(sum_{j<=i} exp(x_j - m_i)) with m_i the running max (a shift that keeps
  every exp <= 1 and the largest term exactly 1); where m_i is +-inf the result is m_i. FP32, rounded once.
- cumprod: a Hillis-Steele scan in FP32 (log2(n) steps of multiply-by-shifted; a product of FP32 values
  in another association order than torch's double accumulation: a few ulps, within float tolerance).
Floats only for cumprod and logcumsumexp; cummax/cummin also for bool/uint8/int8/int16 (exact through
float32). int32/int64 take the counted CPU path.
"""

from __future__ import annotations

import math

import torch

from neuron_hal import DType
from neuron_kernels.library import elementwise, movement, reduce
from neuron_kernels.library.formula import abs_, act, formula, inputs, where

from ..core.compose import ew
from ..core.dtypes import FLOATS, device_dtype
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out
from .rank import SCAN_MAX, positions, row_blocks, to_int64
from .sort import rows_of, unrows, wrap_dim

aten = torch.ops.aten
F32 = DType.float32
SMALL = (torch.bool, torch.uint8, torch.int8, torch.int16)
_I, _J, _PI, _PJ = inputs(4)  # x_i (or m_i), x_j, position i [n, 1], position j [1, n]


def _masked(fill: float):
    """x_j where j <= i, ``fill`` elsewhere (inputs: positions i, x_j, positions j)."""
    pi, xj, pj = inputs(3)
    return where(pj.le(pi), xj, fill).node


# (j + 1) where j <= i and x_j equals m_i (NaN equal to NaN), else 0
_HIT = where(_PJ.le(_PI), (_J.eq(_I) + _I.isnan() * _J.isnan()) * (_PJ + 1.0), 0.0).node


def _prefix_extreme(op: str, rows: torch.Tensor, is_max: bool) -> torch.Tensor:
    """FP32 running max (min) [B, n] of float [B, n] rows, NaN propagating."""
    B, n = rows.shape
    pos, parts = positions(n, rows.device), []
    for rs in row_blocks(B, n):
        x = rows[rs]
        big = run(op, formula, pos.view(n, 1), x.view(x.shape[0], 1, n), pos.view(1, n),
                  expr=_masked(-math.inf if is_max else math.inf), out_dtype=F32)[0]
        parts.append(run(op, reduce.amax if is_max else reduce.amin, big, (2,), False)[0])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def running_extreme(op: str, rows: torch.Tensor, is_max: bool):
    """(FP32 running max/min [B, n], int32 indices [B, n]) of float [B, n] rows."""
    B, n = rows.shape
    m, pos, parts = _prefix_extreme(op, rows, is_max), positions(n, rows.device), []
    for rs in row_blocks(B, n):
        k = rs.stop - rs.start
        hit = run(op, formula, m[rs].view(k, n, 1), rows[rs].view(k, 1, n), pos.view(n, 1), pos.view(1, n),
                  expr=_HIT, out_dtype=F32)[0]
        parts.append(run(op, reduce.amax, hit, (2,), False)[0])
    last = parts[0] if len(parts) == 1 else torch.cat(parts)
    return m, run(op, movement.copy, ew(op, elementwise.sub, last, 1.0), dtype=torch.int32)[0]


def _cum_extreme(op: str, cpu_op, is_max: bool, self, values, indices, dim):
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    if (self.dtype not in FLOATS and self.dtype not in SMALL) or n > SCAN_MAX:
        return on_cpu(cpu_op, self, values, indices, dim)
    if self.numel() == 0:
        return None
    x = self if self.dim() else self.view(1)
    rows, moved = rows_of(x, d)
    xf = rows if rows.dtype in FLOATS else run(op, movement.copy, rows, dtype=torch.float32)[0]
    _, idx = running_extreme(op, xf, is_max)
    vals = run(op, movement.gather, rows, 1, idx)[0]
    write_out(values, unrows(vals, moved, d).view(self.shape))
    write_out(indices, unrows(to_int64(op, idx), moved, d).view(self.shape))
    return None


def cummax_helper(self, values, indices, dim):
    return _cum_extreme("cummax", aten._cummax_helper.default, True, self, values, indices, dim)


def cummin_helper(self, values, indices, dim):
    return _cum_extreme("cummin", aten._cummin_helper.default, False, self, values, indices, dim)


# -- logcumsumexp ---------------------------------------------------------------------------------------
_TERMS = where(_PJ.le(_PI), act("exp", _J - _I), 0.0).node  # input 0: m_i
_M, _S = inputs(2)
_LOG = where(abs_(_M).eq(math.inf), _M, _M + act("log", _S)).node


def logcumsumexp(self, dim):
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    if self.dtype not in FLOATS or n > SCAN_MAX:
        return on_cpu(aten._logcumsumexp.default, self, dim)
    if self.numel() == 0:
        return torch.empty_like(self)
    op, x = "logcumsumexp", (self if self.dim() else self.view(1))
    rows, moved = rows_of(x, d)
    m, pos, parts = _prefix_extreme(op, rows, True), positions(n, rows.device), []
    for rs in row_blocks(rows.shape[0], n):
        k = rs.stop - rs.start
        terms = run(op, formula, m[rs].view(k, n, 1), rows[rs].view(k, 1, n), pos.view(n, 1), pos.view(1, n),
                    expr=_TERMS, out_dtype=F32)[0]
        parts.append(run(op, reduce.sum, terms, (2,), False)[0])
    s = parts[0] if len(parts) == 1 else torch.cat(parts)
    out = run(op, formula, m, s, expr=_LOG, out_dtype=device_dtype(self.dtype))[0]
    return unrows(out, moved, d).view(self.shape)


def logcumsumexp_out(self, dim, *, out):
    return write_out(out, logcumsumexp(self, dim))


# -- cumprod --------------------------------------------------------------------------------------------
def _scan_mul(op: str, y: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix products of FP32 [B, n] rows: y_i *= y_{i-k} for k = 1, 2, 4, ..."""
    n, k = y.shape[1], 1
    while k < n:
        prod = ew(op, elementwise.mul, contig(y[:, k:]), contig(y[:, :n - k]))
        y = torch.cat((y[:, :k], prod), 1)
        k *= 2
    return y


def cumprod(self, dim, *, dtype=None):
    target = dtype or self.dtype
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    if self.dtype not in FLOATS or target not in FLOATS:
        return on_cpu(aten.cumprod.default, self, dim, dtype=dtype)
    if self.numel() == 0:
        return torch.empty(self.shape, dtype=target, device=self.device)
    op, x = "cumprod", (self if self.dim() else self.view(1))
    rows, moved = rows_of(x, d)
    y = _scan_mul(op, run(op, movement.copy, rows, dtype=torch.float32)[0]) if n > 1 else rows
    y = run(op, movement.copy, contig(y), dtype=target)[0]
    return unrows(y, moved, d).view(self.shape)


def cumprod_out(self, dim, *, dtype=None, out):
    return write_out(out, cumprod(self, dim, dtype=dtype))


def cumprod_(self, dim, *, dtype=None):
    return self.copy_(cumprod(self, dim, dtype=dtype))
