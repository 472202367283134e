"""Indexing: index_select, gather, scatter (src / value), scatter_add, index.Tensor (advanced indexing),
index_put_ (``_index_put_impl_``), nonzero and masked_select.

Indices arrive as int64; the movement kernels take int32. ``index32`` converts exactly on the device:
an int64 index is read as its [low, high] 32-bit words (one transpose puts the low words in a
contiguous row, which is the int32 index), and the min/max of both rows (two reductions, read back)
prove every value fits int32 and lies in range before any kernel uses it. Out-of-range indices raise
what torch raises (IndexError or RuntimeError, naming the value and the limit); negative indices are
wrapped (``remainder``, exact on GpSimd) only where torch allows them (advanced indexing).

The gathers and scatters move bytes without arithmetic, so they are exact for every device dtype (int64
and float64 move as 8-byte words); scatter_add and index_put_ with accumulate add on the DMA engines
(floats in FP32, rounded once; integers exactly) and take the CPU for dtypes they cannot add (float64).
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import movement
from neuron_kernels.library import reduce as red

from ..core.checks import arange32, full, meta_result, same_device
from ..core.copy import to_host
from ..core.dtypes import device_dtype
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.registry import impl
from ..core.variants import contig, write_out
from ..tensor.shape import copy_into, movable

aten = torch.ops.aten
_INT32_MAX = 2**31 - 1


# -- int64 -> int32 indices ----------------------------------------------------------------------------
def _minmax(op: str, rows: torch.Tensor) -> tuple[list[int], list[int]]:
    """Per-row min and max of an int32 [r, n] tensor, read back to the host."""
    lo = to_host(run(op, red.amin, rows, dim=1)[0]).tolist()
    hi = to_host(run(op, red.amax, rows, dim=1)[0]).tolist()
    return lo, hi


def _out_of_range(index, size, dim, wrap, error, message):
    """Raise torch's error for the first index outside the range (the slow path reads the indices)."""
    host = index.cpu().reshape(-1)
    low = -size if wrap else 0
    bad = host[(host < low) | (host >= size)]
    value = int(bad[0]) if bad.numel() else int(host.max())
    text = message(value) if message else f"index {value} is out of bounds for dimension {dim} with size {size}"
    raise error(text)


def index32(op: str, index: torch.Tensor, size: int, dim: int = 0, wrap: bool = False,
            error=IndexError, message=None) -> torch.Tensor:
    """A contiguous int32 tensor equal to the int64/int32 ``index`` with every value in [0, size) (negatives
    in [-size, 0) wrapped when ``wrap``); raises ``error`` naming the first bad value otherwise (``message``:
    value -> text, for ops whose wording differs from gather's)."""
    idx = contig(index)
    n = idx.numel()
    if n == 0:
        return torch.empty(idx.shape, dtype=torch.int32, device=idx.device)
    if idx.dtype == torch.int64:
        # flat first: a contiguous tensor may still have a size-1 last dim with another stride
        flat = idx.reshape(n)
        if flat.stride(0) != 1:  # one element is contiguous with any stride; viewing its words needs stride 1
            flat = flat.as_strided((n,), (1,))
        lohi = run(op, movement.transpose, flat.view(torch.int32).view(n, 2))[0]  # [2, n]: low, high words
        (lo_min, hi_min), (lo_max, hi_max) = _minmax(op, lohi)
        low = lohi[0]
        fits = (hi_min == hi_max == 0 and lo_min >= 0) or (hi_min == hi_max == -1 and lo_max < 0)
        if not fits and -1 <= hi_min and hi_max <= 0:  # mixed signs: each high word must be its low word's sign
            sign = run(op, ew.bitwise_right_shift, low, 31)[0]
            fits = not to_host(run(op, red.amax, run(op, ew.ne, lohi[1], sign)[0])[0]).item()
    else:
        low = idx.reshape(n)
        (lo_min,), (lo_max,) = _minmax(op, low.view(1, n))
        fits = True
    if not fits or lo_max >= size or lo_min < (-size if wrap else 0):
        _out_of_range(index, size, dim, wrap, error, message)
    if lo_min < 0:
        low = run(op, ew.remainder, low, size)[0]
    return low.view(idx.shape)


# -- index_select / gather ---------------------------------------------------------------------------
def index_select(x, dim, index):
    meta = meta_result(aten.index_select.default, x, dim, index)
    same_device(x, index)
    carrier = movable(x.dtype)
    if carrier is None:
        return on_cpu(aten.index_select.default, x, dim, index)
    if meta.numel() == 0:
        return torch.empty(meta.shape, dtype=x.dtype, device=x.device)
    d = dim % max(x.dim(), 1)
    size = x.shape[d] if x.dim() else 1
    idx = index32("index_select", index.reshape(-1), size, d, message=lambda v: (
        f"index out of range in self: index {v} is out of bounds for dimension {d} with size {size}"))
    got = run("index_select", movement.index_select, contig(x).view(carrier), d, idx)[0]
    return got.view(x.dtype).view(meta.shape)


def index_select_out(x, dim, index, *, out):
    if out.dtype != x.dtype:
        raise RuntimeError("index_select(): self and result must have the same scalar type")
    return write_out(out, index_select(x, dim, index))


def gather(x, dim, index, *, sparse_grad=False):
    meta = meta_result(aten.gather.default, x, dim, index, sparse_grad=sparse_grad)
    same_device(x, index)
    carrier = movable(x.dtype)
    if carrier is None or x.numel() >= 2**31:
        return on_cpu(aten.gather.default, x, dim, index, sparse_grad=sparse_grad)
    if meta.numel() == 0:
        return torch.empty(meta.shape, dtype=x.dtype, device=x.device)
    if x.dim() == 0:  # a 0-d gather: the index (0 or -0) picks the only element
        x, index = x.view(1), index.view(1)
    d = dim % x.dim()
    idx = index32("gather", index, x.shape[d], d, error=RuntimeError)
    got = run("gather", movement.gather, contig(x).view(carrier), d, idx)[0]
    return got.view(x.dtype).view(meta.shape)


def gather_out(x, dim, index, *, sparse_grad=False, out):
    if out.dtype != x.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {x.dtype}, but got {out.dtype} instead")
    return write_out(out, gather(x, dim, index, sparse_grad=sparse_grad))


# -- scatter / scatter_add ----------------------------------------------------------------------------
def _scatter(op: str, overload, x, dim, index, src, add: bool):
    meta_result(overload, x, dim, index, src)
    tensors = (x, index, src) if isinstance(src, torch.Tensor) else (x, index)
    same_device(*tensors)
    carrier = addable(x.dtype) if add else movable(x.dtype)
    if carrier is None or x.numel() >= 2**31:
        return on_cpu(overload, x, dim, index, src)
    shape = x.shape
    if x.dim() == 0:
        x, index = x.view(1), index.view(1)
        src = src.view(1) if isinstance(src, torch.Tensor) else src
    d = dim % x.dim()
    idx = index32(op, index, x.shape[d], d, error=RuntimeError)  # an empty x still rejects every index
    if x.numel() == 0 or index.numel() == 0:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
        copy_into(op, out, x.view(shape))
        return out
    src = contig(src).view(carrier) if isinstance(src, torch.Tensor) else _scalar_src(op, src, x, index.shape, carrier)
    kernel = movement.scatter_add if add else movement.scatter
    got = run(op, kernel, contig(x).view(carrier), d, idx, src)[0]
    return got.view(x.dtype).view(shape)


def addable(dtype: torch.dtype) -> torch.dtype | None:
    """dtype when the DMA engines can accumulate it (scatter_add), else None (float64, bool, complex)."""
    return dtype if device_dtype(dtype) is not None and dtype != torch.bool else None


def _scalar_of(value, dtype: torch.dtype):
    """A Python scalar as torch stores it into ``dtype`` (the kernel writes it as an immediate)."""
    return torch.tensor(value).to(dtype).item()


def _scalar_src(op: str, value, x: torch.Tensor, shape, carrier: torch.dtype):
    """A scalar to scatter: an immediate, or for 8-byte dtypes (the engines memset values of at most 32 bits)
    a tensor of it of the index's ``shape``, float64 as the int64 words of its bit pattern."""
    if x.element_size() != 8:
        return _scalar_of(value, x.dtype)
    if carrier != x.dtype:
        value = torch.tensor(float(value), dtype=torch.float64).view(torch.int64).item()
    else:
        value = _scalar_of(value, x.dtype)
    return full(op, shape, value, carrier, x.device)


def _register_scatter(name: str, overload: str, src_name: str, add: bool) -> None:
    functional = getattr(aten, name).__getattr__(overload)
    key = f"{name}.{overload}" if overload != "default" else name

    def fn(x, dim, index, src):
        return _scatter(name, functional, x, dim, index, src, add)

    def fn_(x, dim, index, src):
        return x.copy_(fn(x, dim, index, src))

    def fn_out(x, dim, index, src, *, out):
        if out.dtype != x.dtype:
            raise RuntimeError(f"Expected out tensor to have dtype {x.dtype}, but got {out.dtype} instead")
        return write_out(out, fn(x, dim, index, src))

    impl(key)(fn)
    impl(f"{name}_.{overload}" if overload != "default" else f"{name}_")(fn_)
    impl(f"{name}.{src_name}" if name == "scatter" else f"{name}.out")(fn_out)




# scatter(reduce=...), scatter_reduce and index_reduce: ops/scatter_reduce.py


# -- nonzero / masked_select ---------------------------------------------------------------------------
def _positions(op: str, mask: torch.Tensor) -> torch.Tensor:
    """int32 flat positions (row-major) of the true elements of a contiguous bool tensor, in order.

    The inclusive cumsum c of the mask numbers the true elements 1..count: element i goes to slot c[i]
    when it is true, else to the spare slot 0, so one scatter of [0, n) into count + 1 slots writes the
    positions into slots 1..count. The count is read back (the result's size depends on it)."""
    n = mask.numel()
    flat = mask.reshape(n)
    csum = run(op, red.cumsum, flat, 0)[0]  # int64, exact (int32 accumulation, n < 2**31)
    count = int(to_host(csum[n - 1]).item())
    rank = run(op, movement.copy, csum, dtype=torch.int32)[0]  # values < 2**31: the low words, exactly
    slot = run(op, ew.where, flat, rank, 0)[0]
    spare = torch.empty(count + 1, dtype=torch.int32, device=mask.device)
    return run(op, movement.scatter, spare, 0, slot, arange32(n, mask.device))[0][1:]


def _as_mask(op: str, x: torch.Tensor) -> torch.Tensor:
    """x != 0 as a contiguous bool tensor (x itself when it already is one). Floats compare by value
    (-0.0 is zero, NaN is not); int64 is nonzero where either 32-bit word is."""
    x = contig(x)
    if x.dtype == torch.bool:
        return x
    if x.dtype == torch.int64:
        words = run(op, ew.ne, x.reshape(-1).view(torch.int32).view(-1, 2), 0)[0]
        return run(op, red.amax, words, dim=1)[0].view(x.shape)
    return run(op, ew.ne, x, 0)[0]


def _coords(op: str, pos: torch.Tensor, shape) -> torch.Tensor:
    """int64 [count, ndim] coordinates of int32 flat row-major positions in ``shape``:
    ``(pos // stride) % size`` per dim (exact integer ops on GpSimd), joined and widened by one cat."""
    cols, stride = [], math.prod(shape)
    for k, size in enumerate(shape):
        stride //= size
        c = run(op, ew.floor_divide, pos, stride)[0] if stride > 1 else pos
        if k > 0:  # the first coordinate is below shape[0] already
            c = run(op, ew.remainder, c, size)[0]
        cols.append(c.view(-1, 1))
    return run(op, movement.cat.kernel(len(cols)), *cols, dim=1, dtype=torch.int64)[0]


def _nonzero_native(x) -> bool:
    return device_dtype(x.dtype) is not None and x.numel() < 2**31


def nonzero(x):
    if not _nonzero_native(x):
        return on_cpu(aten.nonzero.default, x)
    if x.numel() == 0:
        return torch.empty((0, x.dim()), dtype=torch.int64, device=x.device)
    pos = _positions("nonzero", _as_mask("nonzero", x))
    if x.dim() == 0 or pos.numel() == 0:
        return torch.empty((pos.numel(), x.dim()), dtype=torch.int64, device=x.device)
    return _coords("nonzero", pos, tuple(x.shape))


def nonzero_out(x, *, out):
    if out.dtype != torch.int64:
        raise RuntimeError(f"nonzero: Expected out tensor to have scalar type Long but got scalar type {out.dtype}")
    return write_out(out, nonzero(x))


def masked_select(x, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    same_device(x, mask)
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    carrier = movable(x.dtype)
    if carrier is None or math.prod(shape) >= 2**31:
        return on_cpu(aten.masked_select.default, x, mask)
    if math.prod(shape) == 0:
        return torch.empty(0, dtype=x.dtype, device=x.device)
    pos = _positions("masked_select", contig(mask.expand(shape)))
    if pos.numel() == 0:
        return torch.empty(0, dtype=x.dtype, device=x.device)
    flat = contig(x.expand(shape)).view(carrier).reshape(-1)
    return run("masked_select", movement.index_select, flat, 0, pos)[0].view(x.dtype)


def masked_select_out(x, mask, *, out):
    return write_out(out, masked_select(x, mask))
