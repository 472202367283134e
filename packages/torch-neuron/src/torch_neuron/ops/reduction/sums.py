"""Sums and extremes: sum, mean, prod, nansum, count_nonzero, cumsum, amax/amin/aminmax, full max/min,
all/any — the ``reduce`` kernels over any dims, with keepdim and dtype=. Index reductions are in
:mod:`.arg`, variances and norms in :mod:`.stats`.

Which calls run natively (the others take the counted CPU path, :mod:`.oncpu`):
- Floats (float32/bfloat16/float16) everywhere; the kernels accumulate in fp32 and round once.
- Integer sums/cumsums accumulate in int32 on the engines, torch returns exact int64: native only when no
  partial sum can leave int32, known from the shape alone (bool/uint8/int8/int16, ``count * max|x| <
  2**31``); other int64-result sums (int32/int64 inputs, larger counts) are exact byte sums in
  :mod:`.int64` (up to 2**23 - 1 values per result).
  prod: bool only (int products wrap at 32 bits). float64 goes to the CPU.
- amax/amin/aminmax/max/min and all/any: exact for floats and bool/uint8/int8/int16/int32.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from neuron_kernels.library import elementwise, movement, reduce

from ..core.compose import const, ew, write_outs
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from .int64 import INTS, int64_cumsum, int64_sum
from .int64 import exact as int64_exact

aten = torch.ops.aten
SMALL_INTS = {torch.bool: 1, torch.uint8: 255, torch.int8: 128, torch.int16: 32768}  # max |value|
ORDERED = (*FLOATS, torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)


# -- dims -----------------------------------------------------------------------------------------
def _dim_key(dim):
    if dim is None:
        return None
    return (dim,) if isinstance(dim, int) else tuple(dim)


@lru_cache(maxsize=4096)
def _plan(shape: tuple, dim, keepdim: bool, empty_is_all: bool = True):
    """(dims, result shape, elements reduced per result) with torch's checks and messages."""
    ndim, wrap = len(shape), max(len(shape), 1)
    if dim is None or (empty_is_all and len(dim) == 0):
        dims = tuple(range(ndim))
    else:
        seen = []
        for d in dim:
            if not -wrap <= d < wrap:
                raise IndexError(f"Dimension out of range (expected to be in range of [{-wrap}, {wrap - 1}], "
                                 f"but got {d})")
            if d % wrap in seen:
                raise RuntimeError(f"dim {d % wrap} appears multiple times in the list of dims")
            seen.append(d % wrap)
        dims = tuple(sorted(d for d in seen if d < ndim))
    if keepdim:
        oshape = tuple(1 if d in dims else s for d, s in enumerate(shape))
    else:
        oshape = tuple(s for d, s in enumerate(shape) if d not in dims)
    return dims, oshape, math.prod(shape[d] for d in dims)


def plan(x: torch.Tensor, dim, keepdim: bool, empty_is_all: bool = True):
    return _plan(tuple(x.shape), _dim_key(dim), bool(keepdim), empty_is_all)


NARROW_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32)  # cumsum(dtype=) results that wrap


def cast_to(x: torch.Tensor, dtype) -> torch.Tensor | None:
    """x converted to the dtype= argument; None when no kernel computes in that dtype (the CPU path)."""
    if dtype is None or dtype == x.dtype:
        return x
    return x.to(dtype) if dtype in ORDERED else None


def _int_sum_exact(dtype: torch.dtype, count: int) -> bool:
    return dtype in SMALL_INTS and count * SMALL_INTS[dtype] < 2**31


# -- sum / mean / prod ----------------------------------------------------------------------------
def sum_dim(self, dim=None, keepdim=False, *, dtype=None):
    if dtype == torch.float32 and self.dtype in (torch.bfloat16, torch.float16) and self.numel():
        # widening is exact: the kernel sums the 16-bit values into float32 with no float32 copy of them
        dims, _, _ = plan(self, dim, keepdim)
        return run("sum", reduce.sum, contig(self), dims, keepdim, dtype=dtype)[0]
    x = cast_to(self, dtype)
    dims, oshape, count = plan(self, dim, keepdim)
    # -- int64-result sums beyond int32 (exact byte sums, reduction.int64) --
    if dtype in (None, torch.int64) and int64_exact(self.dtype, count) and (
            x is None or not _int_sum_exact(x.dtype, count)):
        return int64_sum(self, dims, oshape, keepdim)
    # -- end --
    if x is None or (x.dtype not in FLOATS and not _int_sum_exact(x.dtype, count)):
        return on_cpu(aten.sum.dim_IntList, self, dim, keepdim, dtype=dtype)
    if x.numel() == 0:
        return const(oshape, 0, x.dtype if x.dtype in FLOATS else torch.int64, x.device)
    return run("sum", reduce.sum, contig(x), dims, keepdim)[0]


def sum_all(self, *, dtype=None):
    return sum_dim(self, None, False, dtype=dtype)


def mean_dim(self, dim=None, keepdim=False, *, dtype=None):
    x = cast_to(self, dtype)
    if x is None or x.dtype not in FLOATS:
        return on_cpu(aten.mean.dim, self, dim, keepdim, dtype=dtype)
    dims, oshape, _ = plan(x, dim, keepdim)
    if x.numel() == 0:
        return const(oshape, math.nan, x.dtype, x.device)
    return run("mean", reduce.mean, contig(x), dims, keepdim)[0]


def mean_all(self, *, dtype=None):
    return mean_dim(self, None, False, dtype=dtype)


def prod_dim(self, dim, keepdim=False, *, dtype=None):
    x = cast_to(self, dtype)
    if x is None or (x.dtype not in FLOATS and x.dtype != torch.bool):  # int products wrap at 32 bits on the engines
        return on_cpu(aten.prod.dim_int, self, dim, keepdim, dtype=dtype)
    dims, oshape, _ = plan(x, dim, keepdim)
    if x.numel() == 0:
        return const(oshape, 1, x.dtype if x.dtype in FLOATS else torch.int64, x.device)
    return run("prod", reduce.prod, contig(x), dims, keepdim)[0]


def prod_all(self, *, dtype=None):
    x = cast_to(self, dtype)
    if x is None or (x.dtype not in FLOATS and x.dtype != torch.bool):
        return on_cpu(aten.prod.default, self, dtype=dtype)
    return prod_dim(x, None, False)


# -- amax / amin / max / min ----------------------------------------------------------------------
def _extreme(kernel, name, cpu_op, self, dim, keepdim):
    dims, oshape, count = plan(self, dim, keepdim)
    int64 = self.dtype is torch.int64 and self.dim() > 0
    if (self.dtype not in ORDERED and not int64) or (count == 0 and math.prod(oshape) != 0):
        return on_cpu(cpu_op, self, dim, keepdim)  # wide ints/float64, or torch's empty-dim error
    if self.numel() == 0:
        return torch.empty(oshape, dtype=self.dtype, device=self.device)
    if int64:
        return _int64_extreme(kernel is reduce.amax, self, dims, oshape)
    return run(name, kernel, contig(self), dims, keepdim)[0]


_I32_MIN, _I32_MAX = -(2 ** 31), 2 ** 31 - 1


def _int64_extreme(largest: bool, self, dims, oshape):
    """amax/amin of int64 from its 32-bit words, exactly: the extreme high (signed) word, then among the values
    holding it the extreme low word compared unsigned (its sign bit flipped, a signed int32 order)."""
    words = contig(self).unsqueeze(-1).view(torch.int32)  # [..., 2]: low, high
    hi, lo = words[..., 1], words[..., 0].bitwise_xor(_I32_MIN)
    red = torch.amax if largest else torch.amin
    top = red(hi, dims, keepdim=True)
    lo = red(torch.where(hi == top, lo, _I32_MIN if largest else _I32_MAX), dims, keepdim=True).bitwise_xor(_I32_MIN)
    return torch.stack((lo, top), -1).view(torch.int64).reshape(oshape)


def amax(self, dim=(), keepdim=False):
    return _extreme(reduce.amax, "amax", aten.amax.default, self, dim, keepdim)


def amin(self, dim=(), keepdim=False):
    return _extreme(reduce.amin, "amin", aten.amin.default, self, dim, keepdim)


def max_all(self):
    if self.numel() == 0 or (self.dtype not in ORDERED and self.dtype is not torch.int64):
        return on_cpu(aten.max.default, self)
    return amax(self.reshape(-1) if self.dtype is torch.int64 else self)


def min_all(self):
    if self.numel() == 0 or (self.dtype not in ORDERED and self.dtype is not torch.int64):
        return on_cpu(aten.min.default, self)
    return amin(self.reshape(-1) if self.dtype is torch.int64 else self)


def aminmax(self, *, dim=None, keepdim=False):
    if (self.numel() == 0 and dim is None) or self.dtype not in ORDERED:
        return on_cpu(aten.aminmax.default, self, dim=dim, keepdim=keepdim)
    dims = () if dim is None else (dim,)
    return amin(self, dims, keepdim), amax(self, dims, keepdim)


def nansum(self, dim=None, keepdim=False, *, dtype=None):
    """sum with NaN counted as zero (a ``where`` first; integers have no NaN)."""
    if self.dtype not in FLOATS:
        return sum_dim(self, dim, keepdim, dtype=dtype) if self.dtype in INTS else on_cpu(
            aten.nansum.default, self, dim, keepdim, dtype=dtype)
    x = contig(self)
    if x.numel():
        x = ew("nansum", elementwise.where, ew("nansum", elementwise.ne, x, x), 0.0, x)
    return sum_dim(x, dim, keepdim, dtype=dtype)


def count_nonzero(self, dim=()):
    dims, oshape, count = plan(self, dim, False)
    if self.dtype not in ORDERED or count >= 2**31:
        return on_cpu(aten.count_nonzero.dim_IntList, self, dim)
    if self.numel() == 0:
        return const(oshape, 0, torch.int64, self.device)
    x = contig(self)
    nonzero = x if x.dtype == torch.bool else ew("count_nonzero", elementwise.ne, x, 0)
    return run("count_nonzero", reduce.sum, nonzero, dims, False)[0]


def count_nonzero_one(self, dim=None):
    return count_nonzero(self, () if dim is None else (dim,))


def cumsum(self, dim, *, dtype=None):
    x = cast_to(self, dtype)
    dims = plan(self, (dim,), False)[0]
    d = dims[0] if dims else 0  # 0-d: dim 0 or -1
    n = self.shape[d] if dims else 1
    if (dtype in (None, torch.int64) and int64_exact(self.dtype, n) and self.numel()
            and (x is None or not _int_sum_exact(x.dtype, n))):
        # exact byte-plane scans (reduction.int64); a 0-d cumsum is its value
        return int64_cumsum(self, d) if dims else self.to(torch.int64, copy=True)
    if dtype in NARROW_INTS and x is not None and self.numel() and int64_exact(x.dtype, n):
        # torch sums in the narrow dtype, wrapping: the exact int64 scan cast down wraps the same way
        if not dims:
            return x.clone()
        wide = run("cumsum", reduce.cumsum, contig(x), d)[0] if _int_sum_exact(x.dtype, n) else int64_cumsum(x, d)
        return wide.to(dtype)
    if x is None or (x.dtype not in FLOATS and not _int_sum_exact(x.dtype, n)):
        return on_cpu(aten.cumsum.default, self, dim, dtype=dtype)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype if x.dtype in FLOATS else torch.int64, device=x.device)
    return run("cumsum", reduce.cumsum, contig(x), d)[0]


def cumsum_(self, dim, *, dtype=None):
    return self.copy_(cumsum(self, dim, dtype=dtype))


# -- all / any ------------------------------------------------------------------------------------
def _logical(name: str, is_all: bool, cpu_op, self, dim, keepdim):
    if self.dtype not in ORDERED:
        return on_cpu(cpu_op, self, dim, keepdim)
    dims, oshape, _ = plan(self, dim, keepdim, empty_is_all=False)
    odt = torch.uint8 if self.dtype == torch.uint8 else torch.bool
    if self.numel() == 0:
        return const(oshape, is_all, odt, self.device)
    x = contig(self)
    truth = x if x.dtype == torch.bool else ew(name, elementwise.ne, x, 0)
    if dims:
        truth = run(name, reduce.amin if is_all else reduce.amax, truth, dims, keepdim)[0]
    else:
        truth = truth.reshape(oshape)
    return truth if odt == torch.bool else run(name, movement.copy, truth, odt)[0]


def all_dims(self, dim=None, keepdim=False):
    return _logical("all", True, aten.all.dims, self, dim, keepdim)


def any_dims(self, dim=None, keepdim=False):
    return _logical("any", False, aten.any.dims, self, dim, keepdim)


# -- registration -------------------------------------------------------------------------------
def _aminmax_out(self, *, dim=None, keepdim=False, min, max):  # noqa: A002
    return write_outs((min, max), aminmax(self, dim=dim, keepdim=keepdim))


def _whole(fn):
    return lambda self: fn(self)


def _one_dim(fn):
    return lambda self, dim, keepdim=False: fn(self, (dim,), keepdim)
