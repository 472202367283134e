"""Embedding gather and its scatter-add gradient against numpy references."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal.errors import NeuronError
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import language as nl
from neuron_kernels.library.embedding import embedding, embedding_backward

SETTINGS = settings(max_examples=20, deadline=None)
BF16 = ml_dtypes.bfloat16
RTOL = {np.dtype(np.float32): 1e-6, np.dtype(BF16): 1e-2, np.dtype(np.float16): 2e-3}
INDEX_DTYPES = st.sampled_from([np.int32, np.int64, np.uint32])
DTYPES = st.sampled_from([np.float32, BF16, np.float16])


def grad_weight_ref(grad, indices, v, padding_idx=None, by_freq=False):
    d = grad.shape[-1]
    idx = indices.astype(np.int64).reshape(-1)
    g = grad.astype(np.float64).reshape(-1, d)
    if by_freq:
        g = g / np.bincount(idx, minlength=v)[idx][:, None]
    out = np.zeros((v, d))
    np.add.at(out, idx, g)
    if padding_idx is not None and padding_idx >= 0:
        out[padding_idx] = 0
    return out


@SETTINGS
@given(st.integers(1, 600), st.integers(1, 300), st.lists(st.integers(0, 40), min_size=0, max_size=2),
       DTYPES, INDEX_DTYPES, st.integers(0, 2**16))
def test_embedding_gathers_rows(v, d, ishape, dtype, itype, seed):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((v, d)).astype(dtype)
    indices = rng.integers(0, v, ishape).astype(itype)
    out = embedding(weight, indices)
    assert out.shape == tuple(ishape) + (d,) and out.dtype == weight.dtype
    np.testing.assert_array_equal(out.view(np.uint8), weight[indices.astype(np.int64)].view(np.uint8))


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 200), st.integers(0, 700), DTYPES, INDEX_DTYPES,
       st.sampled_from([None, -1, 0, 3]), st.booleans(), st.integers(0, 2**16))
def test_embedding_backward_adds_duplicates(v, d, n, dtype, itype, padding_idx, by_freq, seed):
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, min(v, 1 + seed % 50), (n,)).astype(itype)  # few distinct rows: duplicates
    grad = rng.standard_normal((n, d)).astype(dtype)
    pad = padding_idx if padding_idx is None or padding_idx < v else None
    got = embedding_backward(grad, indices, v, padding_idx=pad, scale_grad_by_freq=by_freq)
    ref = grad_weight_ref(grad, indices, v, pad, by_freq)
    assert got.shape == (v, d) and got.dtype == grad.dtype
    rtol = RTOL[np.dtype(dtype)]
    # float32 sums of up to n terms, rounded once: error relative to the sum of magnitudes
    mag = np.zeros((v, d))
    np.add.at(mag, indices.astype(np.int64), np.abs(grad.astype(np.float64)))
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - ref), rtol * mag + 1e-6 * mag + 1e-30)


def test_embedding_backward_shapes_and_padding():
    rng = np.random.default_rng(0)
    indices = np.array([[1, 2, 2], [0, 5, 2]], np.int64)
    grad = rng.standard_normal((2, 3, 4)).astype(np.float32)
    got = embedding_backward(grad, indices, 6, padding_idx=2)
    ref = grad_weight_ref(grad, indices, 6, 2)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert not got[2].any() and not got[3].any() and not got[4].any()


def test_long_rows_are_gathered_in_column_chunks():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((10, 20000)).astype(np.float32)
    indices = np.array([3, 9, 0, 3, 7], np.int32)
    np.testing.assert_array_equal(embedding(weight, indices), weight[indices])
    grad = rng.standard_normal((5, 20000)).astype(np.float32)
    np.testing.assert_allclose(embedding_backward(grad, indices, 10), grad_weight_ref(grad, indices, 10), rtol=1e-6)


def test_out_of_range_index_is_a_clear_error():
    weight = np.ones((8, 4), np.float32)
    with pytest.raises(NeuronError, match=r"index value 8 at partition 2 .* outside the gather table's 8 rows"):
        embedding(weight, np.array([1, 2, 8, 3], np.int32))
    with pytest.raises(NeuronError, match=r"index value -1 at partition 1 .* outside the scatter table's 8 rows"):
        embedding_backward(np.ones((4, 4), np.float32), np.array([1, -1, 2, 3], np.int32), 8)


def test_trace_errors():
    with pytest.raises(KernelError, match="indices are float32"):
        embedding.trace(TensorSpec((8, 4), nl.float32), TensorSpec((3,), nl.float32))
    with pytest.raises(KernelError, match="padding_idx 9 is not below num_weights 8"):
        embedding_backward.trace(TensorSpec((3, 4), nl.float32), TensorSpec((3,), nl.int32), 8, 9)


def test_empty_indices():
    weight = np.ones((8, 4), np.float32)
    assert embedding(weight, np.zeros((0,), np.int32)).shape == (0, 4)
    got = embedding_backward(np.zeros((0, 4), np.float32), np.zeros((0,), np.int32), 8)
    assert got.shape == (8, 4) and not got.any()
