"""Exact kernels on bit patterns and wide integers against numpy: wide_sum.combine_bytes (int64 totals from
byte sums), float_bits.nextafter/frexp/copysign (float32, bfloat16 and float16 bits), float_bits.ldexp (x * 2**e rounded
once), arange_f64 (double arithmetic rounded to float32, in exact integer steps)."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError
from neuron_kernels.library import arange_f64 as AF
from neuron_kernels.library import float_bits as FB
from neuron_kernels.library import wide_sum as WS

SETTINGS = settings(max_examples=20, deadline=None)
LO, HI = -(2 ** 63), 2 ** 63 - 1
I64 = st.one_of(st.sampled_from([0, -1, LO, HI, 2 ** 32 - 1, 0x00FF00FF00FF00FF]), st.integers(LO, HI))


@SETTINGS
@given(data=st.data(), rows=st.integers(1, 40), cols=st.integers(1, 6))
def test_combine_bytes_is_the_wrapped_int64_total(data, rows, cols):
    x = np.array(data.draw(st.lists(I64, min_size=rows * cols, max_size=rows * cols)), np.int64).reshape(rows, cols)
    sums = x[..., None].view(np.uint8).astype(np.int64).sum(0)  # [cols, 8] byte sums
    out = np.asarray(WS.combine_bytes(np.ascontiguousarray(sums).view(np.int32).reshape(cols, 8, 2)))
    assert np.array_equal(out.view(np.int64).reshape(cols), x.sum(0))  # numpy int64 sums wrap


def test_combine_bytes_at_the_carry_bound():
    top = 255 * (WS.MAX_COUNT - 1)  # the largest byte sum the proof covers, in every byte
    sums = np.full((3, 8), top, np.int64)
    out = np.asarray(WS.combine_bytes(sums.view(np.int32).reshape(3, 8, 2))).view(np.int64).reshape(3)
    expect = sum(top << (8 * k) for k in range(8)) % 2 ** 64
    assert out.tolist() == [expect - 2 ** 64 if expect >= 2 ** 63 else expect] * 3
    with pytest.raises(KernelError):
        WS.combine_bytes(sums.view(np.int32))


FLOAT_BITS = {"float32": (np.float32, np.int32), "float16": (np.float16, np.int16)}


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(sorted(FLOAT_BITS)))
def test_nextafter_and_frexp_on_every_bit_pattern(data, fmt):
    ft, it = FLOAT_BITS[fmt]
    width = 8 * np.dtype(it).itemsize
    draw = lambda: np.array(data.draw(st.lists(st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1),  # noqa: E731
                                               min_size=64, max_size=64)), it)
    xb, yb = draw(), draw()
    xb[:8] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5], ft).view(it)
    yb[:4] = xb[:4]
    x, y = xb.view(ft), yb.view(ft)
    got = np.asarray(FB.nextafter(xb, yb, fmt=fmt)).view(ft)
    ref = np.nextafter(x, y)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(it), ref[~nan].view(it))
    m, e = FB.frexp(xb, fmt=fmt)
    rm, re = np.frexp(x)
    m = np.asarray(m).view(ft)
    nan = np.isnan(rm)
    assert np.array_equal(m[~nan].view(it), rm[~nan].view(it))
    finite = np.isfinite(x)
    assert np.array_equal(np.asarray(e)[finite], re[finite])


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(["float32", "bfloat16", "float16"]))
def test_copysign_on_every_bit_pattern_and_broadcasts(data, fmt):
    """x's magnitude bits with y's sign bit: signed zeros, infinities and NaNs (payload kept, sign set) too."""
    it = np.int32 if fmt == "float32" else np.int16
    width = 8 * np.dtype(it).itemsize
    draw = lambda n: np.array(data.draw(st.lists(st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1),  # noqa: E731
                                                 min_size=n, max_size=n)), it)
    xb, yb = draw(6 * 8).reshape(6, 8), draw(8)
    mag = (1 << (width - 1)) - 1
    expect = (xb & mag) | (yb & ~mag)  # numpy's copysign would quiet a signalling NaN's payload
    assert np.array_equal(np.asarray(FB.copysign(xb, yb, fmt=fmt)), expect)
    if fmt == "float32":  # against numpy's copysign where it keeps the bits (every non-NaN x)
        x, y = xb.view(np.float32), yb.view(np.float32)
        ok = ~np.isnan(x)
        assert np.array_equal(expect[ok], np.copysign(x, y).view(it)[ok])


LDEXP_DTYPES = {"float32": (np.float32, np.int32), "bfloat16": (ml_dtypes.bfloat16, np.int16),
                "float16": (np.float16, np.int16)}


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(sorted(LDEXP_DTYPES)))
def test_ldexp_is_exact_and_rounded_once(data, fmt):
    """Every bit pattern times 2**e for e far beyond FP32's exponent range (2**e itself overflows or underflows
    there), rounded once to the input's dtype: the float64 product (exact) rounded to it."""
    ft, it = LDEXP_DTYPES[fmt]
    width = 8 * np.dtype(it).itemsize
    x = np.array(data.draw(st.lists(st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1), min_size=64,
                                    max_size=64)), it).view(ft)
    x[:6] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5], np.float32).astype(ft)
    e = np.array(data.draw(st.lists(st.one_of(st.integers(-330, 330), st.integers(-2 ** 31, 2 ** 31 - 1)),
                                    min_size=64, max_size=64)), np.int32)
    e[5] = -149  # 1.5 * 2**-149: a tie between two subnormals, to even
    got = np.asarray(FB.ldexp(x, e))
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN inputs, overflowing products
        ref = np.ldexp(x.astype(np.float64), np.clip(e, -1000, 1000)).astype(ft)
    nan = np.isnan(ref.astype(np.float32))
    assert got.dtype == np.dtype(ft) and np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got[~nan].view(it), ref[~nan].view(it))


def test_ldexp_broadcasts_and_checks_its_operands():
    x = np.array([[1.0], [3.0]], np.float32)
    got = np.asarray(FB.ldexp(x, np.array([0, 100, -140], np.int32)))
    assert np.array_equal(got, np.ldexp(x.astype(np.float64), [0, 100, -140]).astype(np.float32))
    with pytest.raises(KernelError, match="int32"):
        FB.ldexp(x, np.array([1], np.int64))
    with pytest.raises(KernelError, match="float32, bfloat16 or float16"):
        FB.ldexp(np.array([1], np.int32), np.array([1], np.int32))


def _scaled(start: float, step: float):
    fs, fk = Fraction(start), Fraction(step)
    q = min(-(f.denominator.bit_length() - 1) for f in (fs, fk))
    return int(fs * 2 ** -q), int(fk * 2 ** -q), q


@SETTINGS
@given(start=st.floats(-4, 4).filter(lambda v: abs(v) > 0.25), step=st.floats(0.25, 2),
       first=st.integers(0, 20), n=st.integers(1, 60), width=st.sampled_from([0, 8, 16]))
def test_arange_f64_is_double_rounded_to_float32(start, step, first, n, width):
    a, k, q = _scaled(start, step)  # |start| < 4, step < 2, ulps >= 2**-54: within the kernel's contract
    assert abs(a) + abs(k) * (first + n + width) < AF.LIMIT and q >= -126
    dst = np.zeros(n, np.int32)
    params = np.array(AF.params(a, k, q, first), np.int32)
    AF.arange_f64(dst, params, width=width)
    l = np.arange(n)  # noqa: E741
    if width:
        j = l & (width - 1)
        base = (start + step * (first + l - j).astype(np.float64)).astype(np.float32).astype(np.float64)
        ref = (base + j * step).astype(np.float32)
    else:
        ref = (start + step * (first + l).astype(np.float64)).astype(np.float32)
    assert np.array_equal(dst, ref.view(np.int32))


def test_arange_f64_checks_its_arguments():
    with pytest.raises(KernelError):
        AF.params(2 ** 62, 1, 0, 0)
    with pytest.raises(KernelError):
        AF.arange_f64(np.zeros(4, np.int32), np.array(AF.params(1, 1, 0, 0), np.int32), width=3)
