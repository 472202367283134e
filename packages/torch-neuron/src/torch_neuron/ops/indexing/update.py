"""Index updates along one dim: index_add, index_copy, index_fill (functional, in-place, out=) and take.

Each is one scatter kernel over x: the 1-d index (exact int32, bounds-checked like torch by ``index32``)
is broadcast along ``dim`` to the source's shape, so element (.., i, ..) of the source lands at
(.., index[i], ..); index_add accumulates (scatter_add: floats in FP32, integers exactly), index_copy and
index_fill overwrite (where an index repeats, one of the writes wins, as torch leaves it unspecified).
take is index_select over the flattened input (negative indices wrap). repeat_interleave's index form
(repeats -> indices) is a scatter_add and two integer cumsums.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import movement
from neuron_kernels.library import reduce as red

from ..core.checks import constant, full, meta_result, same_device
from ..core.copy import to_host
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out
from ..tensor.shape import copy_into, movable
from .gather_scatter import _scalar_src, addable, index32

aten = torch.ops.aten


def _along(idx: torch.Tensor, dim: int, shape) -> torch.Tensor:
    """A 1-d int32 index laid along ``dim`` and broadcast to ``shape`` (contiguous, as the kernel takes it)."""
    view = [1] * len(shape)
    view[dim] = idx.numel()
    return contig(idx.view(view).expand(shape))


def _native(x, carrier) -> bool:
    return carrier is not None and x.numel() < 2**31


def _scatter_along(op: str, x, dim, index, src, add: bool, error, message=None) -> torch.Tensor:
    """x with src's slices scattered to ``index`` along ``dim`` (a new tensor)."""
    if x.dim() == 0:  # a 0-d tensor updates as its 1-element vector
        src = src.reshape(1) if isinstance(src, torch.Tensor) else src
        return _scatter_along(op, x.reshape(1), 0, index, src, add, error, message).view(())
    d = dim % x.dim()
    # checked before anything else: an empty x still rejects every index, as the CPU does
    idx = index32(op, index.reshape(-1), x.shape[d], d, wrap=op == "index_fill", error=error, message=message)
    if index.numel() == 0 or x.numel() == 0:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        copy_into(op, out, x)
        return out
    if add and x.dtype in (torch.bfloat16, torch.float16) and isinstance(src, torch.Tensor):
        # the scatter rounds into a 16-bit table once per 128 values: accumulate in fp32, round once
        wide = [run(op, movement.copy, contig(t), torch.float32)[0] for t in (x, src)]
        return run(op, movement.copy, _scatter_along(op, wide[0], d, index, wide[1], True, error, message),
                   x.dtype)[0]
    carrier = x.dtype if add else movable(x.dtype)
    shape = list(x.shape)
    shape[d] = idx.numel()
    if isinstance(src, torch.Tensor):
        src = contig(src.expand(shape) if src.dim() else src.reshape([1] * x.dim()).expand(shape)).view(carrier)
    else:
        src = _scalar_src(op, src, x, shape, carrier)
    kernel = movement.scatter_add if add else movement.scatter
    got = run(op, kernel, contig(x).view(carrier), d, _along(idx, d, shape), src)[0]
    return got.view(x.dtype)


# -- index_add ---------------------------------------------------------------------------------------
def index_add_out(x, dim, index, source, *, alpha=1, out):
    meta_result(aten.index_add.default, x, dim, index, source, alpha=alpha)
    same_device(x, index, source)
    if not _native(x, addable(x.dtype)):
        return on_cpu(aten.index_add.out, x, dim, index, source, alpha=alpha, out=out)
    if alpha != 1:  # the device's own multiply: int64 sources take the exact two-word kernels
        source = torch.mul(source, alpha)
    return write_out(out, _scatter_along("index_add", x, dim, index, source, True, RuntimeError))


# -- index_copy --------------------------------------------------------------------------------------
def index_copy_out(x, dim, index, source, *, out):
    meta_result(aten.index_copy.default, x, dim, index, source)
    same_device(x, index, source)
    if not _native(x, movable(x.dtype)):
        return on_cpu(aten.index_copy.out, x, dim, index, source, out=out)
    d = dim % max(x.dim(), 1)
    size = x.shape[d] if x.dim() else 1
    message = lambda v: f"index_copy_(): index {v} is out of bounds for dimension {d} with size {size}"
    return write_out(out, _scatter_along("index_copy", x, dim, index, source, False, IndexError, message))


# -- index_fill ----------------------------------------------------------------------------------------
def _index_fill(x, dim, index, value):
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                               f"{value.dim()} dimension(s).")
        value = value.item()
    value = torch.tensor(value).to(x.dtype).item()  # as torch stores the scalar into x's dtype
    return _scatter_along("index_fill", x, dim, index, value, False, IndexError)


def _fill_native(x, index) -> bool:
    same_device(x, index)
    return _native(x, movable(x.dtype))


def index_fill_scalar_(x, dim, index, value):
    meta_result(aten.index_fill_.int_Scalar, x, dim, index, value)
    if not _fill_native(x, index):
        return on_cpu(aten.index_fill_.int_Scalar, x, dim, index, value)
    return x.copy_(_index_fill(x, dim, index, value))


def index_fill_tensor_(x, dim, index, value):
    meta_result(aten.index_fill_.int_Tensor, x, dim, index, value)
    if not _fill_native(x, index):
        return on_cpu(aten.index_fill_.int_Tensor, x, dim, index, value)
    return x.copy_(_index_fill(x, dim, index, value))


# -- take ----------------------------------------------------------------------------------------------
def take(x, index):
    meta = meta_result(aten.take.default, x, index)
    same_device(x, index)
    carrier = movable(x.dtype)
    if carrier is None or x.numel() >= 2**31:
        return on_cpu(aten.take.default, x, index)
    if index.numel() == 0:
        return torch.empty(meta.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    message = lambda v: f"out of range: tried to access index {v} on a tensor of {n} elements."
    idx = index32("take", index.reshape(-1), n, 0, wrap=True, message=message)
    got = run("take", movement.index_select, contig(x).view(carrier).reshape(-1), 0, idx)[0]
    return got.view(x.dtype).view(meta.shape)


def take_out(x, index, *, out):
    return write_out(out, take(x, index))


# -- repeat_interleave (the index form) ------------------------------------------------------------
def _skip_first(n: int, device) -> torch.Tensor:
    return constant(("skip_first32", n), device, lambda: (torch.arange(n) > 0).to(torch.int32))


def repeat_interleave(repeats, *, output_size=None):
    """[0] * r0 + [1] * r1 + ...: the output index p is the number of i >= 1 whose run starts at or before
    p, so marks at the run starts (scatter_add of [0, 1, 1, ...] at the exclusive prefix sums; runs of
    length 0 share a start) and one integer cumsum give the result, exactly."""
    op = "repeat_interleave"
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        return on_cpu(aten.repeat_interleave.Tensor, repeats, output_size=output_size)
    n = repeats.numel()
    if n == 0:
        return torch.empty(0, dtype=repeats.dtype, device=repeats.device)
    r = index32(op, repeats, 2**31 - 1, error=RuntimeError, message=lambda v: (
        "repeats can not be negative" if v < 0 else f"repeats value {v} does not fit the neuron device"))
    if int(to_host(run(op, red.amax, r)[0]).item()) * n >= 2**31:  # prefix sums must stay exact in int32
        return on_cpu(aten.repeat_interleave.Tensor, repeats, output_size=output_size)
    csum = run(op, red.cumsum, r, 0)[0]
    total = int(to_host(csum[n - 1]).item())
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    if total == 0:
        return torch.empty(0, dtype=repeats.dtype, device=repeats.device)
    starts = run(op, ew.sub, run(op, movement.copy, csum, dtype=torch.int32)[0], r)[0]
    marks = full(op, (total + 1,), 0, torch.int32, repeats.device)
    marks = run(op, movement.scatter_add, marks, 0, starts, _skip_first(n, repeats.device))[0]
    out = run(op, red.cumsum, marks[:total], 0)[0]
    return out if repeats.dtype == torch.int64 else run(op, movement.copy, out, dtype=torch.int32)[0]
