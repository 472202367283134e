"""The counter-based generator and dropout: bit exact against numpy, rough statistical quality, reproducibility."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import DType
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels.library import random as rnd

SETTINGS = settings(max_examples=15, deadline=None)
M32 = 0xFFFFFFFF
# shapes of up to 3 dims and at most ~40k elements (the values run on the simulator)
def _cap(shape, limit=40000):
    shape = list(shape)
    while int(np.prod(shape)) > limit:
        i = int(np.argmax(shape))
        shape[i] = max(1, shape[i] // 2)
    return tuple(shape)


SHAPES = st.lists(st.integers(1, 300), min_size=1, max_size=3).map(_cap)


# An independent numpy implementation of the documented generator, written from the spec (Python ints per
# round for clarity, vectorized with uint64 and a 32-bit mask).
def _xorshift_mul(x, shifts_mults, last_shift):
    for shift, mult in shifts_mults:
        x = x ^ (x >> shift)
        x = (x * mult) & M32
    return x ^ (x >> last_shift)


def lowbias32(x):
    return _xorshift_mul(x, ((16, 0x7FEB352D), (15, 0x846CA68B)), 16)


def fmix32(x):
    return _xorshift_mul(x, ((16, 0x85EBCA6B), (13, 0xC2B2AE35)), 16)


def bits_ref(n, seed, offset):
    seed &= M32
    k1 = int(fmix32(np.uint64(seed ^ 0x9E3779B9)))
    c = (np.arange(n, dtype=np.uint64) + np.uint64(offset & M32)) & np.uint64(M32)
    return fmix32(lowbias32(c ^ np.uint64(seed)) ^ np.uint64(k1)).astype(np.uint32)


def test_mixers_match_known_values():
    # both mixers fix 0; fmix32(1) is the published MurmurHash3 finalizer value
    assert int(fmix32(np.uint64(0))) == 0 and int(lowbias32(np.uint64(0))) == 0
    assert int(fmix32(np.uint64(1))) == 0x514E28B7  # MurmurHash3 fmix32(1)


def state(seed, offset=0):
    return np.array([seed, offset], np.int64).astype(np.uint32).view(np.int32)


@SETTINGS
@given(SHAPES, st.integers(-2 ** 31, 2 ** 31 - 1),
       st.integers(0, 2 ** 32 - 1))
def test_bits_are_bit_exact(shape, seed, offset):
    out = rnd.random_bits(tuple(shape), state(seed, offset))
    n = int(np.prod(shape))
    want = bits_ref(n, seed, offset).reshape(shape)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(rnd.random_bits_reference(n, seed, offset).reshape(shape), want)


@pytest.mark.parametrize("dtype, m", [(np.float32, 24), (ml_dtypes.bfloat16, 8), (np.float16, 11)])
def test_rand_dtype_and_range(dtype, m):
    s = state(7, 1000)
    u = rnd.rand((130, 77), s, dtype=DType.of(dtype))
    assert u.dtype == np.dtype(dtype)
    want = (bits_ref(130 * 77, 7, 1000) >> np.uint32(32 - m)).astype(np.float64) * 2.0 ** -m
    np.testing.assert_array_equal(u.astype(np.float64).reshape(-1), want)
    assert u.astype(np.float32).min() >= 0 and u.astype(np.float32).max() < 1


def test_offsets_continue_the_stream_and_seed_is_data():
    a = rnd.rand((1000,), state(42, 0))
    b = rnd.rand((1000,), state(42, 500))
    np.testing.assert_array_equal(a[500:], b[:500])
    # the seed tensor is data: another seed or offset reuses the same traced program
    spec = TensorSpec((2,), DType.int32)
    assert rnd.rand.trace((1000,), spec) is rnd.rand.trace((1000,), spec)
    with pytest.raises(KernelError, match="shape \\[2\\]"):
        rnd.rand((10,), np.zeros(3, np.int32))


def _uniforms(seed, n=1 << 18, offset=0):
    return rnd.rand((n,), state(seed, offset)).astype(np.float64)


def test_uniformity_and_independence():
    n = 1 << 18
    u = _uniforms(1)
    # chi-square over 256 equal bins: mean 255, sd ~22.6
    counts = np.bincount((u * 256).astype(int), minlength=256)
    chi2 = ((counts - n / 256) ** 2 / (n / 256)).sum()
    assert chi2 < 255 + 6 * 22.6
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n)
    # lag-1 serial correlation
    r = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(r) < 6 / np.sqrt(n)
    # each of the 32 bits is balanced
    bits = bits_ref(n, 1, 0)
    ones = np.array([((bits >> np.uint32(k)) & np.uint32(1)).mean() for k in range(32)])
    assert np.all(np.abs(ones - 0.5) < 6 * 0.5 / np.sqrt(n))
    # neighbouring seeds and interleaved offsets give uncorrelated streams
    for other in (_uniforms(2), _uniforms(1 ^ (1 << 31)), _uniforms(1, offset=n // 2 + 12345)):
        r = np.corrcoef(u, other)[0, 1]
        assert abs(r) < 6 / np.sqrt(n)
    v = rnd.random_bits((n,), state(2))
    agree = np.unpackbits((bits ^ v).view(np.uint8)).mean()  # differing bits between seeds 1 and 2
    assert abs(agree - 0.5) < 6 * 0.5 / np.sqrt(32 * n)


@SETTINGS
@given(SHAPES, st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
       st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16]), st.integers(0, 2 ** 31 - 1))
def test_dropout(shape, p, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    s = state(seed, seed // 3)
    out, mask = rnd.dropout(x, p, s)
    assert out.dtype == np.dtype(dtype) and mask.dtype == np.bool_ and mask.shape == x.shape
    n = x.size
    keep = ((bits_ref(n, seed, seed // 3) >> np.uint32(8)) >= np.uint32(round(p * 2 ** 24))).reshape(shape)
    np.testing.assert_array_equal(mask, keep)
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    want = (x.astype(np.float32) * (keep * np.float32(scale))).astype(dtype)
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))
    # backward recomputes the same mask from (seed, offset), and applies it
    np.testing.assert_array_equal(rnd.dropout_mask(tuple(shape), p, s), mask)
    g = rng.standard_normal(shape).astype(dtype)
    np.testing.assert_array_equal(rnd.dropout_backward(g, mask, scale).astype(np.float32),
                                  (g.astype(np.float32) * (mask * np.float32(scale))).astype(dtype).astype(np.float32))


def test_dropout_rate_and_eval():
    x = np.ones((256, 512), np.float32)
    for p in (0.1, 0.5):
        _, mask = rnd.dropout(x, p, state(3, 9))
        assert abs(mask.mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / mask.size)
    out, mask = rnd.dropout(x, 0.5, state(3), train=False)
    np.testing.assert_array_equal(out, x)
    assert mask.all()
    with pytest.raises(KernelError, match="floating-point"):
        rnd.dropout(np.ones(4, np.int32), 0.5, state(1))
    with pytest.raises(KernelError, match="p must be in"):
        rnd.dropout(x, 1.5, state(1))
