"""PyTorch type promotion for the device dtypes (pure Python, no torch).

The rules, as torch states them (``torch.result_type``, "Type promotion" in the tensor attributes docs):

- Categories are ordered bool < integral < floating. Operands are ranked in three tiers: tensors with
  at least one dimension, zero-dim tensors, and Python scalars ("wrapped numbers").
- Within a tier the dtypes combine with :func:`promote_types` (the lattice: bool joins anything;
  uint8 with a signed int needs the next signed width that holds both, so uint8 + int8 -> int16;
  int + float -> the float; float16 + bfloat16 -> float32; otherwise the wider type).
- A Python scalar's dtype is its category's default: bool, int64 for int, and the default float
  dtype (float32) for float. A lower tier only matters when it is of a *higher category* than the
  tiers above it: then the result is the promotion of the two (``int32 tensor + 2.5 -> float32``,
  ``bool tensor + 5 -> int64``), otherwise the higher tier's dtype stands (``int8 tensor + 1000 ->
  int8``, ``float16 tensor + float32 zero-dim tensor -> float16``).

Precisely, torch's ``combine_categories(higher, lower)``: a floating ``higher`` wins; if ``higher``
is bool or ``lower`` is floating, promote the two; else ``higher`` if defined, else ``lower``; and
``result = combine(dim, combine(zero_dim, scalars))``.

int64: int64 tensors exist in HBM (DMA moves them) but Vector/Scalar/GpSimd compute on 32-bit values at
most, and no engine can cheaply check that an int64 value fits 32 bits. So the promotion here is
exactly torch's (int64 results appear, e.g. ``bool tensor + 5``), and the kernels reject int64 (and
uint64) operands and results with a :class:`~neuron_kernels.KernelError` naming the dtype: the caller
(the PyTorch backend) converts int64 tensors to int32 on the host, where it can check the range, or
passes an int32 tensor. uint16/uint32 and the fp8 types have no torch promotion with other dtypes
(torch's "barebones" unsigned types and float8 refuse mixed promotion); they promote only with
themselves.
"""

from __future__ import annotations

import numbers

import numpy as np

from neuron_hal import DType

__all__ = ["DEFAULT_FLOAT", "promote_types", "result_type", "category", "float_result", "is_scalar",
           "scalar_dtype", "check_scalar_fits"]

DEFAULT_FLOAT = DType.float32  # torch.get_default_dtype()

_B, _U1, _I1, _I2, _I4, _I8 = DType.bool_, DType.uint8, DType.int8, DType.int16, DType.int32, DType.int64
_F2, _BF, _F4 = DType.float16, DType.bfloat16, DType.float32
_ORDER = (_B, _U1, _I1, _I2, _I4, _I8, _F2, _BF, _F4)
_SIGNED = (_I1, _I2, _I4, _I8)


def category(dtype: DType) -> int:
    """0 bool, 1 integral, 2 floating."""
    dtype = DType.of(dtype)
    return 0 if dtype.kind == "b" else 1 if dtype.kind in "iu" else 2


def promote_types(a, b) -> DType:
    """torch.promote_types for two dtypes."""
    a, b = DType.of(a), DType.of(b)
    if a is b:
        return a
    if a not in _ORDER or b not in _ORDER:
        odd = a if a not in _ORDER else b
        raise TypeError(f"no torch type promotion between {a} and {b}: {odd} promotes only with itself")
    if a is _B:
        return b
    if b is _B:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:  # floats: f16 + bf16 -> f32, else the wider
        if {a, b} == {_F2, _BF}:
            return _F4
        return a if a.itemsize > b.itemsize else b
    # integers: uint8 with a signed type needs a signed type wider than 8 bits
    if _U1 in (a, b):
        s = b if a is _U1 else a
        return _I2 if s is _I1 else s
    return a if a.itemsize > b.itemsize else b


def is_scalar(x) -> bool:
    """A Python or numpy scalar number (not a tensor or an array, even a zero-dim one)."""
    return isinstance(x, numbers.Number | np.bool_)


def scalar_dtype(x) -> DType:
    """The dtype torch gives a Python scalar: bool, int64, or the default float dtype."""
    if isinstance(x, bool | np.bool_):
        return _B
    if isinstance(x, numbers.Integral):
        return _I8
    if isinstance(x, numbers.Real):
        return DEFAULT_FLOAT
    raise TypeError(f"unsupported scalar {x!r} ({type(x).__name__}): complex numbers are not supported")


def _tier(operand) -> tuple[int, DType]:
    """(0 dimensioned tensor, 1 zero-dim tensor, 2 scalar), dtype."""
    if isinstance(operand, DType):
        return 0, operand
    if hasattr(operand, "dtype") and hasattr(operand, "shape"):
        return (1 if tuple(operand.shape) == () else 0), DType.of(operand.dtype)
    return 2, scalar_dtype(operand)


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    if higher is None:
        return lower
    if lower is None:
        return higher
    if category(higher) == 2:
        return higher
    if higher is _B or category(lower) == 2:
        return promote_types(higher, lower)
    return higher


def result_type(*operands) -> DType:
    """torch.result_type over any number of operands.

    An operand is a DType (a dimensioned tensor), anything with ``shape`` and ``dtype`` (a tensor,
    zero-dim when its shape is ``()``: numpy arrays, TensorSpecs, kernel views), or a Python scalar.
    """
    if not operands:
        raise TypeError("result_type needs at least one operand")
    tiers: list[DType | None] = [None, None, None]
    for op in operands:
        t, dt = _tier(op)
        tiers[t] = dt if tiers[t] is None else promote_types(tiers[t], dt)
    return _combine(tiers[0], _combine(tiers[1], tiers[2]))


def float_result(dtype) -> DType:
    """The dtype of a floating-point op (exp, true division, ...) on ``dtype``: ints and bool give float32."""
    dtype = DType.of(dtype)
    return dtype if category(dtype) == 2 else DEFAULT_FLOAT


def check_scalar_fits(value, dtype) -> None:
    """Raise when a Python scalar cannot be represented in an integral result dtype (torch raises an
    overflow error converting it; wrapping silently would hide the mistake)."""
    dtype = DType.of(dtype)
    if category(dtype) != 1 or isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return
    bits = 8 * dtype.itemsize
    lo, hi = (0, 2 ** bits - 1) if dtype.kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if not lo <= int(value) <= hi:
        raise OverflowError(f"scalar {value} does not fit the result dtype {dtype} (range [{lo}, {hi}])")
