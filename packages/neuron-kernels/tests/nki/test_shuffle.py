"""nisa.nc_stream_shuffle against a numpy reference written from NKI's documentation."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl


@nki.jit
def shuffle(src, dst_init, mask, in_place):
    s = nl.load(src)
    if in_place:
        d = s
    else:
        d = nl.load(dst_init)
    nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=mask)
    out = nl.ndarray(d.shape, dtype=d.dtype, buffer=nl.shared_hbm)
    nl.store(out, d)
    return out


def ref(src, dst, mask):
    """Output partition q*32+i = input partition q*32+mask[i]; 255 keeps dst's partition."""
    out = dst.copy()
    for p in range(dst.shape[0]):
        q, i = divmod(p, 32)
        if mask[i] != 255:
            out[p] = src[q * 32 + mask[i]]
    return out


@settings(max_examples=8, deadline=None)
@given(quadrants=st.integers(1, 4), cols=st.integers(1, 300), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16]), in_place=st.booleans())
def test_shuffle_within_quadrants(quadrants, cols, seed, dtype, in_place):
    g = np.random.default_rng(seed)
    p = 32 * quadrants
    mask = tuple(int(m) for m in np.where(g.random(32) < 0.2, 255, g.integers(0, 32, 32)))
    src = g.standard_normal((p, cols)).astype(dtype)
    dst = src if in_place else g.standard_normal((p, cols)).astype(dtype)
    np.testing.assert_array_equal(shuffle(src, dst, mask, in_place), ref(src, dst, mask))


def test_broadcast_one_partition_and_special_values():
    src = np.array([[1.0, -np.inf, np.nan, 3.5]], np.float32)
    dst = np.zeros((32, 4), np.float32)
    np.testing.assert_array_equal(shuffle(src, dst, (0,) * 32, False), np.repeat(src, 32, axis=0))


def test_shuffle_validation():
    with pytest.raises(KernelError, match=r"shuffle_mask must be 32 partitions"):
        shuffle(np.zeros((32, 2), np.float32), np.zeros((32, 2), np.float32), (0,) * 31, False)
    with pytest.raises(KernelError, match=r"output partition 1 copies input partition 5; src .* has 4"):
        shuffle(np.zeros((4, 2), np.float32), np.zeros((8, 2), np.float32), (0, 5) + (0,) * 30, False)
    with pytest.raises(NotImplementedError, match=r"nc_stream_shuffle of int32 data"):
        shuffle(np.zeros((32, 2), np.int32), np.zeros((32, 2), np.int32), (0,) * 32, False)
