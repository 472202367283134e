"""``nki.language``'s tile-level functions (NKI's "experimental" numpy-like API): each makes a new tile and emits the
instructions NKI documents for it — ``load``/``store`` (a DMA), the reductions (one VectorE ``tensor_reduce``),
``broadcast_to`` (a copy, or a GpSimd partition broadcast from one partition), ``transpose`` / ``matmul`` (TensorE
into PSUM), ``where`` (a VectorE select), ``ones`` / ``empty_like`` / ``expand_dims``.
"""

from __future__ import annotations

import math

from neuron_hal import Alu, DType, Space

from .. import isa as _isa
from .. import language as _lib
from ..errors import KernelError
from ..tensors import View


def _tile(x, what: str) -> View:
    if not isinstance(x, View):
        raise KernelError(f"{what}: expected a tile (an nl.ndarray), got {x!r}")
    return x


def load(src: View, dtype=None) -> View:
    """A new SBUF tile holding ``src`` (first dim on partitions), by DMA; ``dtype`` casts."""
    src = _tile(src, "nl.load")
    t = _lib.ndarray(src.shape, DType.of(dtype) if dtype is not None else src.dtype, Space.SBUF)
    _isa.dma_copy(t, src)
    return t


def store(dst: View, value: View) -> None:
    """``dst`` (HBM) = ``value`` (an on-chip tile), by DMA."""
    _isa.dma_copy(_tile(dst, "nl.store"), _tile(value, "nl.store"))


def _axes(x: View, axis, what: str) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, int) else tuple(int(a) for a in axis)
    axes = tuple(sorted(a + x.ndim if a < 0 else a for a in axes))
    if not axes or axes[0] < 1 or list(axes) != list(range(axes[0], x.ndim)):
        raise KernelError(f"{what}: axis {axis} must be the last contiguous free dims of {x!r} ([1], [1, 2], ...; "
                          f"the partition dim 0 cannot be reduced)")
    return axes


def _reduce(name: str, op: Alu, scale_by_count: bool = False):
    def reduce(x, axis, dtype=None, keepdims: bool = False) -> View:
        x = _tile(x, f"nl.{name}")
        axes = _axes(x, axis, f"nl.{name}")
        kept = x.shape[:axes[0]]
        shape = kept + (1,) * len(axes) if keepdims else kept
        out_dtype = DType.of(dtype) if dtype is not None else x.dtype
        t = _lib.ndarray(shape if len(shape) > 1 else (x.shape[0], 1), out_dtype, Space.SBUF)
        if not scale_by_count:
            _isa.tensor_reduce(t, x, op, axes)
            return t
        acc = _lib.ndarray(t.shape, DType.float32, Space.SBUF)  # the sum in fp32, then one rounding
        _isa.tensor_reduce(acc, x, op, axes)
        _isa.tensor_scalar(t, acc, Alu.multiply, 1.0 / math.prod(x.shape[a] for a in axes))
        return t

    reduce.__name__ = name
    reduce.__doc__ = f"nl.{name}: the {name} over free ``axis`` (the last contiguous free dims) on VectorE, in fp32."
    return reduce


sum = _reduce("sum", Alu.add)  # noqa: A001 (NKI's names)
max = _reduce("max", Alu.max)  # noqa: A001
min = _reduce("min", Alu.min)  # noqa: A001
mean = _reduce("mean", Alu.add, scale_by_count=True)


def broadcast_to(x, shape, dtype=None) -> View:
    """A new tile of ``shape`` (same rank) with ``x``'s values broadcast from its size-1 dims (numpy rules): free dims
    by a VectorE copy of a stride-0 view, the partition dim (from one partition) by a GpSimd partition broadcast."""
    x = _tile(x, "nl.broadcast_to")
    shape = tuple(int(s) for s in shape)
    out_dtype = DType.of(dtype) if dtype is not None else x.dtype
    if len(shape) != x.ndim or any(s != w and s != 1 for s, w in zip(x.shape, shape)):
        raise KernelError(f"nl.broadcast_to: cannot broadcast {list(x.shape)} to {list(shape)} (same rank; each dim "
                          f"equal or from 1)")
    if shape == x.shape and out_dtype == x.dtype:
        return x
    row = x
    if shape[1:] != x.shape[1:] or (shape[0] == x.shape[0] and out_dtype != x.dtype):
        row = _lib.ndarray((x.shape[0],) + shape[1:], out_dtype, Space.SBUF)
        _isa.tensor_copy(row, x.broadcast_to(row.shape))
    if shape[0] == row.shape[0]:
        return row
    t = _lib.ndarray(shape, out_dtype, Space.SBUF)
    _isa.partition_broadcast(t, row)
    return t


def ones(shape, dtype, buffer=Space.SBUF, name: str = "") -> View:
    from . import language as nl

    return nl.full(shape, 1.0, dtype, buffer, name)


def empty_like(x: View, dtype=None, buffer=None, name: str = "") -> View:
    from . import language as nl

    x = _tile(x, "nl.empty_like")
    return nl.ndarray(x.shape, dtype if dtype is not None else x.dtype, x.space if buffer is None else buffer, name)


def expand_dims(x: View, axis: int) -> View:
    """A view of ``x`` with a new size-1 dim at ``axis`` (no copy)."""
    x = _tile(x, "nl.expand_dims")
    return x.expand_dim(int(axis) + x.ndim + 1 if axis < 0 else int(axis))


def transpose(x, dtype=None) -> View:
    """A new PSUM tile [F, P] = x[P, F], on TensorE (fp32 unless dtype= or a 4-byte input says otherwise)."""
    x = _tile(x, "nl.transpose")
    if x.ndim != 2:
        raise KernelError(f"nl.transpose: x must be a 2-D tile, got {x!r}")
    out_dtype = DType.of(dtype) if dtype is not None else x.dtype
    t = _lib.ndarray((x.shape[1], x.shape[0]), out_dtype, Space.PSUM)
    _isa.nc_transpose(t, x)
    return t


def matmul(x, y, transpose_x: bool = False) -> View:
    """x @ y (or x.T @ y with ``transpose_x``) into a new fp32 PSUM tile, on TensorE; without ``transpose_x`` x is
    first transposed on TensorE (as NKI inserts one) so that the contraction dim is on partitions."""
    x, y = _tile(x, "nl.matmul"), _tile(y, "nl.matmul")
    if not transpose_x:
        xt_psum = transpose(x, DType.float32)
        xt = _lib.ndarray(xt_psum.shape, x.dtype, Space.SBUF)
        _isa.tensor_copy(xt, xt_psum)
        x = xt
    if x.shape[0] != y.shape[0]:
        raise KernelError(f"nl.matmul: contraction dims differ: {list(x.shape)} and {list(y.shape)}")
    out = _lib.ndarray((x.shape[1], y.shape[1]), DType.float32, Space.PSUM)
    _isa.nc_matmul(out, x, y, accumulate=False)
    return out


def where(condition, x, y, dtype=None) -> View:
    """A new tile: x where condition != 0, else y (y a tile of the same shape or a scalar), on VectorE."""
    condition, x = _tile(condition, "nl.where"), _tile(x, "nl.where")
    if condition.shape != x.shape or (isinstance(y, View) and y.shape != x.shape):
        raise KernelError(f"nl.where: condition {list(condition.shape)}, x {list(x.shape)} and y must have one shape")
    t = _lib.ndarray(x.shape, DType.of(dtype) if dtype is not None else x.dtype, Space.SBUF)
    _isa.select(t, condition, x, y)
    return t


def negative(x, dtype=None) -> View:
    """A new tile: -x (a VectorE multiply by -1)."""
    x = _tile(x, "nl.negative")
    t = _lib.ndarray(x.shape, DType.of(dtype) if dtype is not None else x.dtype, Space.SBUF)
    _isa.tensor_scalar(t, x, Alu.multiply, -1.0)
    return t


def is_hbm(buffer) -> bool:
    from . import language as nl

    return isinstance(buffer, nl._HBM) or buffer is Space.HBM


def is_sbuf(buffer) -> bool:
    return buffer is Space.SBUF


def is_psum(buffer) -> bool:
    return buffer is Space.PSUM


def is_on_chip(buffer) -> bool:
    return buffer in (Space.SBUF, Space.PSUM)


__all__ = ["load", "store", "sum", "max", "min", "mean", "broadcast_to", "ones", "empty_like", "expand_dims",
           "transpose", "matmul", "where", "negative", "is_hbm", "is_sbuf", "is_psum", "is_on_chip"]


def shared_identity_matrix(n, dtype=DType.uint8, dst: View | None = None) -> View:
    """An [n, n] SBUF identity matrix: a GpSimd iota of p - f, then a VectorE compare with 0. NKI reuses one per
    (n, dtype) in a kernel; so does this (unless ``dst`` is given)."""
    from ..tracer import builder

    n = int(n)
    dt = DType.of(dtype)
    cache = builder().__dict__.setdefault("nki_identities", {})
    if dst is None and (n, dt) in cache:
        return cache[(n, dt)]
    t = dst if dst is not None else _lib.ndarray((n, n), dt, Space.SBUF)
    if t.shape != (n, n):
        raise KernelError(f"nl.shared_identity_matrix: dst {t!r} must be [{n}, {n}]")
    diff = _lib.ndarray((n, n), DType.int32, Space.SBUF)
    _isa.iota(diff, (-1,), offset=0, channel_multiplier=1)
    _isa.tensor_scalar(t, diff, Alu.equal, 0.0)
    if dst is None:
        cache[(n, dt)] = t
    return t
