"""Elementwise kernels against independent numpy references: type promotion, broadcasting, every op."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import DType, get_driver, get_profile, isa
from neuron_kernels import KernelError, TensorSpec, roofline
from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import promote

SETTINGS = settings(max_examples=100, deadline=None)
BF16 = ml_dtypes.bfloat16
FLOATS = [np.float32, BF16, np.float16]
INTS = [np.int8, np.uint8, np.int16, np.int32]
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(BF16): 1e-2, np.dtype(np.float16): 2e-3}


# ================================================================================================
# Type promotion: torch's table, written out from the documented rules
# ================================================================================================
_NAMES = ["b1", "u1", "i1", "i2", "i4", "i8", "f2", "bf", "f4"]
_DT = dict(zip(_NAMES, [DType.bool_, DType.uint8, DType.int8, DType.int16, DType.int32, DType.int64,
                        DType.float16, DType.bfloat16, DType.float32]))
# torch.promote_types(row, column)
_TABLE = """
    b1 u1 i1 i2 i4 i8 f2 bf f4
b1  b1 u1 i1 i2 i4 i8 f2 bf f4
u1  u1 u1 i2 i2 i4 i8 f2 bf f4
i1  i1 i2 i1 i2 i4 i8 f2 bf f4
i2  i2 i2 i2 i2 i4 i8 f2 bf f4
i4  i4 i4 i4 i4 i4 i8 f2 bf f4
i8  i8 i8 i8 i8 i8 i8 f2 bf f4
f2  f2 f2 f2 f2 f2 f2 f2 f4 f4
bf  bf bf bf bf bf bf f4 bf f4
f4  f4 f4 f4 f4 f4 f4 f4 f4 f4
"""


def test_promote_types_table():
    rows = [r.split() for r in _TABLE.strip().splitlines()]
    cols = rows[0]
    for row in rows[1:]:
        for col, want in zip(cols, row[1:]):
            assert promote.promote_types(_DT[row[0]], _DT[col]) is _DT[want], (row[0], col)


def _t(name, zero_dim=False):
    return TensorSpec(() if zero_dim else (3,), _DT[name])


@pytest.mark.parametrize("operands, want", [
    ((_t("i4"), 2.5), "f4"),  # int tensor + float scalar: the default float dtype
    ((_t("i4"), 5), "i4"),  # a scalar of the same category does not widen
    ((_t("i1"), 1000), "i1"),
    ((_t("u1"), -1), "u1"),
    ((_t("b1"), 5), "i8"),  # bool tensor + int scalar: int64
    ((_t("b1"), 2.5), "f4"),
    ((_t("b1"), True), "b1"),
    ((_t("f2"), 2.5), "f2"),
    ((_t("bf"), 3), "bf"),
    ((_t("bf"), _t("f4", True)), "bf"),  # zero-dim tensors rank below dimensioned ones
    ((_t("i4"), _t("f2", True)), "f2"),  # ... unless of a higher category
    ((_t("i1"), _t("i8", True)), "i1"),
    ((_t("i1", True), _t("u1", True)), "i2"),
    ((_t("u1"), _t("i1", True)), "u1"),
    ((_t("f2", True), 2.5), "f2"),
    ((_t("i4", True), 2.5), "f4"),
    ((_t("b1", True), 3), "i8"),
    ((_t("bf"), _t("i8")), "bf"),
    ((_t("f2"), _t("bf")), "f4"),
    ((_t("b1"), _t("f2", True), 3), "f2"),
    ((_t("i1"), _t("u1", True), 2.5), "f4"),
    ((_t("u1"), _t("i1")), "i2"),
])
def test_result_type_tiers(operands, want):
    assert promote.result_type(*operands) is _DT[want]


def test_promotion_edges():
    assert promote.float_result(DType.int32) is DType.float32
    assert promote.float_result(DType.bfloat16) is DType.bfloat16
    assert promote.promote_types(DType.uint16, DType.uint16) is DType.uint16
    with pytest.raises(TypeError, match="promotes only with itself"):
        promote.promote_types(DType.uint16, DType.int32)
    with pytest.raises(OverflowError, match="does not fit"):
        promote.check_scalar_fits(300, DType.uint8)
    promote.check_scalar_fits(255, DType.uint8)


# ================================================================================================
# Helpers
# ================================================================================================
@st.composite
def broadcast_shapes(draw, n=2, max_rank=4, max_elems=20000):
    """Shapes of n operands that broadcast together: drop leading dims, set some dims to 1."""
    rank = draw(st.integers(0, max_rank))
    out = [draw(st.sampled_from([1, 2, 3, 5, 8, 17, 64, 130, 301])) for _ in range(rank)]
    while math.prod(out) > max_elems:
        out[out.index(max(out))] //= 4
    shapes = []
    for _ in range(n):
        r = draw(st.integers(0, rank))
        ones = draw(st.lists(st.booleans(), min_size=r, max_size=r))
        shapes.append(tuple(1 if one else d for d, one in zip(out[rank - r:], ones)))
    return shapes


def rand(shape, dtype, rng, lo=-3.0, hi=3.0):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dt)
    return np.asarray(rng.uniform(lo, hi, shape)).astype(dt)


def f32(x):
    return np.asarray(x).astype(np.float32)


def check_float(out, ref, dtype):
    """ref computed in float64/float32, rounded to dtype, compared with the dtype's tolerance."""
    dt = np.dtype(dtype)
    assert out.dtype == dt, (out.dtype, dt)
    ref = np.asarray(ref).astype(dt)
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), rtol=RTOL[dt], atol=RTOL[dt] * 1e-1)


# ================================================================================================
# Binary float ops with broadcasting
# ================================================================================================
_FLOAT_REFS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
    "minimum": np.minimum,
}


# small tile budgets force many tiles: partial chunks, outer loops, operands reused across loops
TILE_BYTES = st.sampled_from([64, 512, ew.TILE_BYTES[0]])


@SETTINGS
@given(broadcast_shapes(), st.sampled_from(FLOATS), st.sampled_from(sorted(_FLOAT_REFS)), TILE_BYTES,
       st.integers(0, 2 ** 16))
def test_binary_float_broadcasting(shapes, dtype, op, tile_bytes, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
    if op == "div":
        b = np.where(np.abs(f32(b)) < 0.1, 0.5, f32(b)).astype(dtype)
    out = getattr(ew, op)(a, b, tile_bytes=tile_bytes)
    check_float(out, _FLOAT_REFS[op](f32(a), f32(b)), dtype)
    assert out.shape == np.broadcast_shapes(a.shape, b.shape)


@SETTINGS
@given(broadcast_shapes(max_rank=8, max_elems=4000), st.sampled_from([np.float32, np.int16]), TILE_BYTES,
       st.integers(0, 2 ** 16))
def test_high_rank_broadcasting(shapes, dtype, tile_bytes, seed):
    """More alternating broadcast dims than an access pattern has free dims: the outer ones become loops."""
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ew.mul(a, b, tile_bytes=tile_bytes), np.multiply(a, b))


@SETTINGS
@given(broadcast_shapes(n=1), st.sampled_from(FLOATS), st.floats(-4, 4, width=32), st.booleans(),
       st.integers(0, 2 ** 16))
def test_binary_with_python_scalars(shapes, dtype, s, scalar_first, seed):
    rng = np.random.default_rng(seed)
    a = rand(shapes[0], dtype, rng)
    for op, ref in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("maximum", np.maximum)):
        out = getattr(ew, op)(s, a) if scalar_first else getattr(ew, op)(a, s)
        want = ref(np.float32(s), f32(a)) if scalar_first else ref(f32(a), np.float32(s))
        check_float(out, want, dtype)


@SETTINGS
@given(broadcast_shapes(), st.sampled_from([np.float32, BF16]), st.sampled_from([2, -0.5, 3]),
       st.integers(0, 2 ** 16))
def test_add_sub_alpha(shapes, dtype, alpha, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
    check_float(ew.add(a, b, alpha=alpha), f32(a) + np.float32(alpha) * f32(b), dtype)
    check_float(ew.sub(a, b, alpha=alpha), f32(a) - np.float32(alpha) * f32(b), dtype)


def test_mixed_dtypes_promote():
    rng = np.random.default_rng(1)
    a = rand((4, 70), BF16, rng)
    b = rand((70,), np.float16, rng)
    out = ew.add(a, b)
    assert out.dtype == np.float32  # bf16 + f16 -> f32
    np.testing.assert_allclose(out, f32(a) + f32(b), rtol=1e-6)
    i = rand((4, 70), np.int32, rng)
    out = ew.mul(i, 0.5)  # int tensor * float scalar -> float32
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, i.astype(np.float32) * np.float32(0.5), rtol=1e-6)
    out = ew.div(i, rand((70,), np.int16, rng) | 1)  # true division of ints -> float32
    assert out.dtype == np.float32


# ================================================================================================
# Integer ops: exact, wrapping like torch
# ================================================================================================
_INT_REFS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


def _np_dtype(d: DType):
    return d.numpy


@SETTINGS
@given(broadcast_shapes(), st.sampled_from(INTS), st.sampled_from(INTS), st.sampled_from(sorted(_INT_REFS)),
       TILE_BYTES, st.integers(0, 2 ** 16))
def test_binary_int_exact_wrapping(shapes, da, db, op, tile_bytes, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], da, rng), rand(shapes[1], db, rng)
    R = _np_dtype(promote.result_type(a, b))
    out = getattr(ew, op)(a, b, tile_bytes=tile_bytes)
    with np.errstate(over="ignore"):
        want = _INT_REFS[op](a.astype(np.int64), b.astype(np.int64)).astype(R)
    assert out.dtype == R
    np.testing.assert_array_equal(out, want)


def test_int_scalar_and_bool():
    x = np.array([[2 ** 31 - 1, -5, 7]], np.int32)
    np.testing.assert_array_equal(ew.add(x, 1), np.array([[-2 ** 31, -4, 8]], np.int32))  # wraps
    np.testing.assert_array_equal(ew.mul(x, 3), (x.astype(np.int64) * 3).astype(np.int32))
    t = np.array([True, False, True])
    np.testing.assert_array_equal(ew.add(t, t), t | t)  # bool + bool stays bool
    np.testing.assert_array_equal(ew.mul(t, np.array([True, True, False])), [True, False, False])
    with pytest.raises(KernelError, match="int64"):
        ew.add(t, 5)  # torch: bool tensor + int -> int64, which engines do not compute on
    with pytest.raises(KernelError, match="is int64"):
        ew.add(np.arange(4, dtype=np.int64), 1)
    with pytest.raises(KernelError, match="alpha must not be a floating point"):
        ew.add(x, x, alpha=0.5)
    with pytest.raises(KernelError, match="bool"):
        ew.sub(t, t)
    with pytest.raises(OverflowError):
        ew.add(np.zeros(3, np.uint8), 300)


@SETTINGS
@given(broadcast_shapes(), st.sampled_from(["floor", "trunc"]), st.sampled_from([np.int32, np.int16, np.int8]),
       st.integers(0, 2 ** 16))
def test_int_division_exact(shapes, mode, dtype, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
    b = np.where(b == 0, 3, b).astype(dtype)
    if rng.integers(2):
        b = (b % 50 + 1).astype(dtype)  # small divisors too
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    want = np.floor_divide(a64, b64) if mode == "floor" else np.trunc(a64 / b64).astype(np.int64)
    # trunc through float64 is exact for 32-bit operands except when the quotient is huge; recompute exactly
    if mode == "trunc":
        q = np.abs(a64) // np.abs(b64)
        want = np.where((a64 < 0) != (b64 < 0), -q, q)
    out = ew.div(a, b, rounding_mode=mode)
    assert out.dtype == np.dtype(dtype)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, want.astype(dtype))


def test_int_division_extremes():
    a = np.array([2 ** 31 - 1, -2 ** 31 + 1, 2 ** 31 - 100, -7, 7, -7, 7, 0, 123456789, -987654321], np.int32)
    b = np.array([1, 3, 3, 2, 2, -2, -2, 5, 46341, 65537], np.int32)
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    np.testing.assert_array_equal(ew.div(a, b, rounding_mode="floor"), a64 // b64)
    np.testing.assert_array_equal(ew.floor_divide(a, 7), a64 // 7)
    q = np.abs(a64) // np.abs(b64)
    np.testing.assert_array_equal(ew.div(a, b, rounding_mode="trunc"), np.where((a64 < 0) != (b64 < 0), -q, q))
    np.testing.assert_array_equal(ew.remainder(a, b), a64 % b64)
    np.testing.assert_array_equal(ew.fmod(a, b), np.fmod(a64, b64))


@SETTINGS
@given(broadcast_shapes(), st.sampled_from([np.float32, BF16]), st.integers(0, 2 ** 16))
def test_float_division_modes_and_remainder(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng, -20, 20), rand(shapes[1], dtype, rng, -4, 4)
    b = np.where(np.abs(f32(b)) < 0.25, 0.75, f32(b)).astype(dtype)
    a32, b32 = f32(a), f32(b)
    # torch's floor division: from fmod, so exact where floor(a / b) would round across an integer
    m = np.fmod(a32, b32)
    div = (a32 - m) / b32
    div = div - ((m != 0) & ((b32 < 0) != (m < 0)))
    np.testing.assert_array_equal(f32(ew.div(a, b, rounding_mode="floor")), f32(np.round(div).astype(dtype)))
    np.testing.assert_array_equal(f32(ew.div(a, b, rounding_mode="trunc")), f32(np.trunc(a32 / b32).astype(dtype)))
    rem = m + np.where((m != 0) & ((b32 < 0) != (m < 0)), b32, 0)
    check_float(ew.remainder(a, b), rem, dtype)
    check_float(ew.fmod(a, b), m, dtype)


def test_float_floor_division_is_torchs():
    a = np.array([1.0, -1.0, 7.5, -7.5, 3.0, 5.0, 0.0], np.float32)
    b = np.array([0.1, 0.1, 2.0, 2.0, -2.0, 0.0, 3.0], np.float32)
    out = ew.div(a, b, rounding_mode="floor")
    np.testing.assert_array_equal(out, [9.0, -10.0, 3.0, -4.0, -2.0, np.inf, 0.0])  # 1 // 0.1 == 9 (Python too)
    np.testing.assert_array_equal(ew.remainder(np.float32([5.0, -5.0]), 3.0), np.float32([2.0, 1.0]))
    np.testing.assert_array_equal(ew.remainder(np.float32([5.0, -5.0]), -3.0), np.float32([-1.0, -2.0]))


# ================================================================================================
# Comparisons, logical and bitwise ops, where
# ================================================================================================
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}


@SETTINGS
@given(broadcast_shapes(), st.sampled_from(FLOATS + INTS), st.sampled_from(sorted(_CMP)), TILE_BYTES,
       st.integers(0, 2 ** 16))
def test_comparisons(shapes, dtype, op, tile_bytes, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
    if np.dtype(dtype).kind in "iu":  # make ties and near-ties of large values likely
        b = np.where(rng.integers(0, 3, b.shape) == 0, a[(0,) * a.ndim] if a.ndim else a, b).astype(dtype)
    out = getattr(ew, op)(a, b, tile_bytes=tile_bytes)
    assert out.dtype == np.bool_
    wide = np.int64 if np.dtype(dtype).kind in "iu" else np.float64
    np.testing.assert_array_equal(out, _CMP[op](a.astype(wide), b.astype(wide)))


def test_int32_comparisons_are_exact():
    a = np.array([2 ** 30 + 1, 16777217, -2 ** 31], np.int32)
    b = np.array([2 ** 30, 16777216, -2 ** 31 + 1], np.int32)  # equal once rounded to fp32
    np.testing.assert_array_equal(ew.gt(a, b), [True, True, False])
    np.testing.assert_array_equal(ew.eq(a, b), [False, False, False])
    np.testing.assert_array_equal(ew.lt(a, 16777217), [False, False, True])


@SETTINGS
@given(broadcast_shapes(), st.sampled_from([np.float32, np.int32, np.bool_, np.uint8]),
       st.sampled_from(["logical_and", "logical_or", "logical_xor"]), st.integers(0, 2 ** 16))
def test_logical(shapes, dtype, op, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
    a = np.where(rng.integers(0, 3, a.shape) == 0, 0, a).astype(dtype)
    out = getattr(ew, op)(a, b)
    np.testing.assert_array_equal(out, getattr(np, op)(a, b))
    np.testing.assert_array_equal(ew.logical_not(a), np.logical_not(a))


@SETTINGS
@given(broadcast_shapes(), st.sampled_from(INTS + [np.bool_]), st.sampled_from(INTS + [np.bool_]),
       st.sampled_from(["bitwise_and", "bitwise_or", "bitwise_xor"]), TILE_BYTES, st.integers(0, 2 ** 16))
def test_bitwise(shapes, da, db, op, tile_bytes, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(shapes[0], da, rng), rand(shapes[1], db, rng)
    R = _np_dtype(promote.result_type(a, b))
    out = getattr(ew, op)(a, b, tile_bytes=tile_bytes)
    assert out.dtype == R
    np.testing.assert_array_equal(out, getattr(np, op)(a.astype(R), b.astype(R)))
    np.testing.assert_array_equal(ew.bitwise_not(a), np.invert(a))


def test_shifts():
    x = np.array([1, -8, 100, -1, 2 ** 30], np.int32)
    s = np.array([3, 1, 0, 31, 1], np.int32)
    np.testing.assert_array_equal(ew.bitwise_left_shift(x, s), (x.astype(np.int64) << s).astype(np.int32))
    np.testing.assert_array_equal(ew.bitwise_right_shift(x, s), x >> s)
    u = np.array([255, 128, 7], np.uint8)
    np.testing.assert_array_equal(ew.bitwise_right_shift(u, 2), u >> 2)  # logical for unsigned
    np.testing.assert_array_equal(ew.bitwise_left_shift(u, 1), (u.astype(np.int32) << 1).astype(np.uint8))
    with pytest.raises(KernelError, match="integer or bool"):
        ew.bitwise_and(np.ones(3, np.float32), 1)


@SETTINGS
@given(broadcast_shapes(n=3), st.sampled_from(FLOATS + [np.int32, np.int8]), TILE_BYTES, st.integers(0, 2 ** 16))
def test_where(shapes, dtype, tile_bytes, seed):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, shapes[0]).astype(bool)
    a, b = rand(shapes[1], dtype, rng), rand(shapes[2], dtype, rng)
    out = ew.where(c, a, b, tile_bytes=tile_bytes)
    np.testing.assert_array_equal(out, np.where(c, a, b))  # bit exact
    out = ew.where(c, 2, b)
    np.testing.assert_array_equal(out, np.where(c, np.asarray(2).astype(dtype), b))
    out = ew.where(c, a, -1)
    np.testing.assert_array_equal(out, np.where(c, a, np.asarray(-1).astype(dtype)))


def test_where_promotes_and_scalars():
    c = np.array([[True], [False]])
    a = np.arange(6, dtype=np.int8).reshape(2, 3)
    b = np.full((3,), 2 ** 20, np.int32)
    out = ew.where(c, a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.where(c, a.astype(np.int32), b))
    out = ew.where(c, 1.5, -2.5)  # both scalars: the default float dtype
    np.testing.assert_array_equal(out, np.where(c, 1.5, -2.5).astype(np.float32) * np.ones((2, 1), np.float32))


# ================================================================================================
# Unary ops
# ================================================================================================
_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


_UNARY = {
    "exp": (np.exp, -4, 4), "log": (np.log, 0.05, 8), "tanh": (np.tanh, -4, 4),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), -6, 6), "relu": (lambda x: np.maximum(x, 0), -3, 3),
    "silu": (lambda x: x / (1 + np.exp(-x)), -6, 6), "sqrt": (np.sqrt, 0, 9),
    "rsqrt": (lambda x: 1 / np.sqrt(x), 0.1, 9),
    "reciprocal": (lambda x: 1 / x, 0.1, 9), "square": (np.square, -3, 3), "abs": (np.abs, -3, 3),
    "sin": (np.sin, -3, 3), "cos": (np.cos, -3, 3), "softplus": (lambda x: np.log1p(np.exp(x)), -6, 6),
    "erf": (_erf, -3, 3), "sign": (np.sign, -3, 3), "neg": (np.negative, -3, 3), "gelu": (_gelu, -5, 5),
    "exp2": (np.exp2, -6, 6), "log2": (np.log2, 0.05, 8), "expm1": (np.expm1, -3, 3), "log1p": (np.log1p, -0.9, 4),
}


@SETTINGS
@given(broadcast_shapes(n=1), st.sampled_from(FLOATS), st.sampled_from(sorted(_UNARY)), st.integers(0, 2 ** 16))
def test_unary_float(shapes, dtype, op, seed):
    ref, lo, hi = _UNARY[op]
    rng = np.random.default_rng(seed)
    x = rand(shapes[0], dtype, rng, lo, hi)
    out = getattr(ew, op)(x)
    want = np.asarray(ref(x.astype(np.float64)))
    check_float(out, want, dtype)


def test_unary_precision_near_zero():
    x = np.float32([1e-7, -3e-6, 1e-4, -0.3, 0.49, 0.51, 2.0, -1e-30])
    np.testing.assert_allclose(ew.expm1(x), np.expm1(x.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(ew.log1p(x), np.log1p(x.astype(np.float64)), rtol=1e-6)
    y = np.float32([-4, -1, 0, 1, 4])
    np.testing.assert_allclose(ew.gelu(y, approximate="tanh"),
                               0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3))), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(ew.softplus(y, beta=2.0, threshold=3.0),
                               np.where(2 * y > 3, y, np.log1p(np.exp(2 * y)) / 2), rtol=1e-6)


@SETTINGS
@given(broadcast_shapes(n=1), st.sampled_from(INTS + [np.bool_]), st.integers(0, 2 ** 16))
def test_unary_on_integers(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rand(shapes[0], dtype, rng)
    out = ew.exp(x)
    assert out.dtype == np.float32  # integer input to a float op: the default float dtype
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out, np.exp(x.astype(np.float64)).astype(np.float32), rtol=1e-5)
    if dtype is np.bool_:
        return
    x64 = x.astype(np.int64)
    for op, ref in (("abs", np.abs), ("relu", lambda v: np.maximum(v, 0)), ("sign", np.sign),
                    ("square", np.square), ("neg", np.negative)):
        out = getattr(ew, op)(x)
        assert out.dtype == x.dtype
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(out, ref(x64).astype(x.dtype))
    for op in ("floor", "ceil", "round", "trunc"):
        np.testing.assert_array_equal(getattr(ew, op)(x), x)


@SETTINGS
@given(broadcast_shapes(n=1), st.sampled_from(FLOATS), st.integers(0, 2 ** 16))
def test_rounding(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rand(shapes[0], dtype, rng, -1e3, 1e3)
    if x.size:  # halves, huge values and specials
        flat = x.reshape(-1)
        specials = np.array([0.5, -0.5, 1.5, -2.5, 3e9, -3e9, np.inf, -np.inf, np.nan, 0.0], np.float32)
        n = min(flat.size, specials.size)
        with np.errstate(over="ignore"):
            flat[:n] = specials[:n].astype(dtype)
    for op, ref in (("floor", np.floor), ("ceil", np.ceil), ("round", np.rint), ("trunc", np.trunc)):
        out = getattr(ew, op)(x)
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(f32(out), f32(ref(f32(x)).astype(dtype)))


def test_rounding_fp32_boundaries():
    x = np.float32([2 ** 22 + 0.5, 2 ** 23 - 0.5, -(2 ** 23 - 0.5), 2 ** 23 + 1, 8388607.5, 0.49999997, -0.49999997])
    for op, ref in (("floor", np.floor), ("ceil", np.ceil), ("round", np.rint), ("trunc", np.trunc)):
        np.testing.assert_array_equal(getattr(ew, op)(x), ref(x))


@SETTINGS
@given(broadcast_shapes(n=3), st.sampled_from(FLOATS + [np.int32, np.int16]), st.integers(0, 2 ** 16))
def test_clamp(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    x, lo, hi = (rand(s, dtype, rng) for s in shapes)
    both = ew.clamp(x, lo, hi, tile_bytes=128)
    np.testing.assert_array_equal(both, np.minimum(np.maximum(x, lo), hi))
    np.testing.assert_array_equal(ew.clamp(x, min=lo), np.maximum(x, lo))
    np.testing.assert_array_equal(ew.clamp(x, max=hi), np.minimum(x, hi))
    s = ew.clamp(x, -1, 2)
    np.testing.assert_array_equal(s, np.clip(x, np.asarray(-1).astype(dtype), np.asarray(2).astype(dtype)))


def test_clamp_promotes_and_nan():
    x = np.array([-3, 0, 5], np.int32)
    out = ew.clamp(x, min=0.5)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0.5, 0.5, 5.0])
    y = np.float32([np.nan, -2, 2])
    np.testing.assert_array_equal(ew.clamp(y, -1, 1), [np.nan, -1, 1])
    np.testing.assert_array_equal(ew.clamp(y, 1, -1), [np.nan, -1, -1])  # min > max: all max
    with pytest.raises(KernelError, match="at least one"):
        ew.clamp(y)


def test_pow():
    rng = np.random.default_rng(3)
    x = rand((70, 9), np.float32, rng, 0.1, 3)
    for e in (2, 0.5, 3, -1.5, 0, 1):
        np.testing.assert_allclose(ew.pow(x, e), np.power(x.astype(np.float64), e), rtol=1e-5)
    e = rand((9,), np.float32, rng, -2, 2)
    np.testing.assert_allclose(ew.pow(x, e), np.power(x.astype(np.float64), e), rtol=1e-5)
    np.testing.assert_allclose(ew.pow(2.0, e), np.power(2.0, e.astype(np.float64)), rtol=1e-5)
    i = rng.integers(-50, 50, (70, 9)).astype(np.int32)
    for k in (0, 1, 2, 5, 7):
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(ew.pow(i, k), (i.astype(np.int64) ** k).astype(np.int32))  # wraps
    with pytest.raises(KernelError, match="negative integer powers"):
        ew.pow(i, -1)
    assert ew.pow(i, 0.5).dtype == np.float32


# ================================================================================================
# Shapes, layout and performance
# ================================================================================================
def test_empty_zero_dim_and_size_one():
    e = np.zeros((0, 5), np.float32)
    assert ew.add(e, 1.0).shape == (0, 5)
    assert ew.add(e, np.ones((5,), np.float32)).shape == (0, 5)
    z = np.float32(2.5) * np.ones((), np.float32)
    out = ew.mul(z, z)
    assert out.shape == () and out == np.float32(6.25)
    x = np.arange(3, dtype=np.float32).reshape(3, 1, 1)
    np.testing.assert_array_equal(ew.add(x, z), x + z)
    with pytest.raises(KernelError, match="do not broadcast"):
        ew.add(np.ones((3, 4), np.float32), np.ones((5,), np.float32))


def test_large_odd_shapes():
    rng = np.random.default_rng(5)
    a = rand((257, 1031), np.float32, rng)
    b = rand((1031,), np.float32, rng)
    np.testing.assert_array_equal(ew.add(a, b), a + b)
    c = rand((257, 1), np.float32, rng)
    np.testing.assert_array_equal(ew.mul(a, c), a * c)
    big = rand((3, 100003), BF16, rng)
    np.testing.assert_array_equal(f32(ew.add(big, big[1:2])), f32((f32(big) + f32(big[1:2])).astype(BF16)))


def _dma_bytes(program, tensor):
    return sum(ins.src.nbytes for ins in program.instructions
               if isinstance(ins, isa.DmaCopy) and ins.src.space.value == "hbm" and ins.src.tensor == tensor)


def test_broadcast_operands_are_not_materialized():
    x, bias = TensorSpec((64, 512, 256), DType.bfloat16), TensorSpec((256,), DType.bfloat16)
    prog = ew.add.trace(x, bias)
    # the bias row is loaded once (replicated on 128 partitions), x exactly once
    assert _dma_bytes(prog, 1) == 128 * 256 * 2
    assert _dma_bytes(prog, 0) == 64 * 512 * 256 * 2
    col = TensorSpec((64 * 512, 1), DType.float32)
    prog = ew.mul.trace(TensorSpec((64 * 512, 256), DType.float32), col)
    assert _dma_bytes(prog, 1) == 64 * 512 * 4
    assert any(isinstance(i, isa.TensorScalar) or isinstance(i, isa.TensorTensor) for i in prog.instructions)


@pytest.mark.parametrize("kernel, args", [
    (ew.add, (TensorSpec((4096, 1024), DType.float32),) * 2),
    (ew.add, (TensorSpec((4096, 2048), DType.bfloat16),) * 2),
    (ew.gelu, (TensorSpec((4096, 2048), DType.bfloat16),)),
    (ew.add, (TensorSpec((8, 1024, 2048), DType.bfloat16), TensorSpec((2048,), DType.bfloat16))),
])
def test_16mib_ops_reach_80_percent_of_dma_roofline(kernel, args):
    profile = get_profile("trn2")
    driver = get_driver("sim", profile)
    program = kernel.trace(*args, profile=profile, tile_bytes=ew.TILE_BYTES[0])
    ns = driver.estimate(0, driver.load(0, program)).device_ns
    out = program.args[program.meta["outputs"][0]]
    moved = sum(a.nbytes for a in program.args if a.role == "in") + out.nbytes
    assert roofline.fraction(profile, roofline.dma_ns(profile, moved), ns) >= 0.8
