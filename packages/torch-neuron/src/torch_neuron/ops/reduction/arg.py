"""max/min along a dim (values and indices), argmax and argmin: the ``reduce`` kernels' index reductions.

Indices are int64, first occurrence on ties, NaN counts as the extreme. Native for floats and
bool/uint8/int8/int16/int32 (exact) when the reduced dim has at most 2**24 elements (the kernels' fp32
index arithmetic is exact below that); the rest takes the counted CPU path. The kernel returns the
first +inf (-inf for min) instead of the first NaN when a row holds both with the inf first: rows whose
value is NaN are re-indexed here with an argmax of ``isnan``, after a check on the small result, so
only calls that meet a NaN pay for it.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise, reduce

from ..core.compose import ew, write_outs
from ..core.copy import to_host
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from .sums import ORDERED, plan

aten = torch.ops.aten
INDEX_EXACT = 1 << 24


def _first_nan(name: str, x: torch.Tensor, dim, keepdim: bool, values, idx):
    """Rows whose extreme value is NaN get the index of their first NaN (see the module docstring)."""
    nan_rows = ew(name, elementwise.ne, values, values)
    if not to_host(run(name, reduce.amax, nan_rows.reshape(-1), ())[0]).item():
        return idx
    is_nan = ew(name, elementwise.ne, x, x)
    first = run(name, reduce.argmax, is_nan, dim, keepdim)[0]
    pairs = (first.reshape(-1).view(torch.int32).view(-1, 2), idx.reshape(-1).view(torch.int32).view(-1, 2))
    fixed = ew(name, elementwise.where, nan_rows.reshape(-1, 1), *pairs)  # int64 as (low, high) int32 words
    return fixed.view(torch.int64).view(idx.shape)


def _with_indices(name: str, is_max: bool, x: torch.Tensor, dim, keepdim: bool):
    """(values, int64 indices) of max/min along ``dim`` (None: the flattened tensor), torch's rules."""
    x = contig(x)
    kernel = reduce.max if is_max else reduce.min
    if dim is None:
        flat = x.reshape(-1)
        values, idx = run(name, kernel, flat, 0, False)
        shape = (1,) * x.dim() if keepdim else ()
        values, idx, x, dim, keepdim = values.view(shape), idx.view(shape), flat, 0, False
    else:
        values, idx = run(name, kernel, x, dim, keepdim)
    if x.dtype in FLOATS:
        idx = _first_nan(name, x, dim, keepdim, values.reshape(idx.shape), idx)
    return values, idx


def _index_native(x: torch.Tensor, dim) -> bool:
    if x.dtype not in ORDERED or x.numel() == 0:
        return False
    n = x.numel() if dim is None else (x.shape[dim] if x.dim() else 1)
    return n <= INDEX_EXACT


def _empty(self, dim, keepdim: bool):
    """(values, indices) of an empty input whose reduced dim is not empty: empty results, as torch's."""
    oshape = plan(self, dim, keepdim)[1]
    return (torch.empty(oshape, dtype=self.dtype, device=self.device),
            torch.empty(oshape, dtype=torch.int64, device=self.device))


def _empty_ok(self, dim) -> bool:
    return self.numel() == 0 and dim is not None and self.dim() > 0 and self.shape[dim] > 0


def max_dim(self, dim, keepdim=False):
    plan(self, dim, keepdim)  # torch's dim checks
    if _empty_ok(self, dim):
        return _empty(self, dim, keepdim)
    if not _index_native(self, dim):
        return on_cpu(aten.max.dim, self, dim, keepdim)
    return _with_indices("max", True, self, dim, keepdim)


def min_dim(self, dim, keepdim=False):
    plan(self, dim, keepdim)
    if _empty_ok(self, dim):
        return _empty(self, dim, keepdim)
    if not _index_native(self, dim):
        return on_cpu(aten.min.dim, self, dim, keepdim)
    return _with_indices("min", False, self, dim, keepdim)


def argmax(self, dim=None, keepdim=False):
    if dim is not None:
        plan(self, dim, keepdim)
    if _empty_ok(self, dim) and self.dtype != torch.bool:
        return _empty(self, dim, keepdim)[1]
    if not _index_native(self, dim) or self.dtype == torch.bool:  # torch refuses bool: its error, from the CPU
        return on_cpu(aten.argmax.default, self, dim, keepdim)
    return _with_indices("argmax", True, self, dim, keepdim)[1]


def argmin(self, dim=None, keepdim=False):
    if dim is not None:
        plan(self, dim, keepdim)
    if _empty_ok(self, dim) and self.dtype != torch.bool:
        return _empty(self, dim, keepdim)[1]
    if not _index_native(self, dim) or self.dtype == torch.bool:
        return on_cpu(aten.argmin.default, self, dim, keepdim)
    return _with_indices("argmin", False, self, dim, keepdim)[1]


def _named_out(fn, first: str, second: str):
    def run_out(*args, **kwargs):
        outs = (kwargs.pop(first), kwargs.pop(second))
        return write_outs(outs, fn(*args, **kwargs))
    return run_out
