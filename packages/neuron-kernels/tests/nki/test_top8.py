"""nisa.max8 / nc_find_index8 / nc_match_replace8 against numpy references written from NKI's documentation."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl

NOT_FOUND = np.uint32(0xFFFFFFFF)


@nki.jit
def top8(x):
    out = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    m = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.sbuf)
    nisa.max8(dst=m, src=t)
    nisa.dma_copy(dst=out, src=m)
    return out


@nki.jit
def find8(x, vals, index_dtype):
    out = nl.ndarray((x.shape[0], 8), dtype=index_dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    v = nl.load(vals)
    i = nl.ndarray((x.shape[0], 8), dtype=index_dtype, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=i, data=t, vals=v)
    nl.store(out, i)
    return out


@nki.jit
def replace8(x, vals, imm):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    t, v = nl.load(x), nl.load(vals)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    i = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=r, data=t, vals=v, imm=imm, dst_idx=i)
    nl.store(out, r)
    nl.store(idx, i)
    return out, idx


def ref_max8(x):
    """The 8 largest values of each row (as fp32), descending: a value present k times appears k times."""
    return -np.sort(-x.astype(np.float32), axis=1)[:, :8]


def ref_find8(x, vals):
    """First occurrences; a value given several times pairs with ascending positions; absent: all ones."""
    out = np.full(vals.shape, NOT_FOUND, np.uint32)
    for p in range(x.shape[0]):
        taken = set()
        for k in range(8):
            hits = [i for i in np.flatnonzero(x[p] == vals[p, k]) if i not in taken]
            if hits:
                out[p, k] = hits[0]
                taken.add(hits[0])
    return out


def ref_replace8(x, vals, imm):
    """vals taken from slot 7 down to 0, each matching its first position not matched yet."""
    out, idx = x.copy(), np.full(vals.shape, NOT_FOUND, np.uint32)
    for p in range(x.shape[0]):
        taken = set()
        for k in reversed(range(8)):
            hits = [i for i in np.flatnonzero(x[p] == vals[p, k]) if i not in taken]
            if hits:
                idx[p, k] = hits[0]
                taken.add(hits[0])
                out[p, hits[0]] = imm
    return out, idx


def rows(draw_ints, parts, n):
    """Small integers as floats: ties and duplicates are common."""
    return draw_ints.reshape(parts, n).astype(np.float32)


@settings(max_examples=6, deadline=None)
@given(parts=st.integers(1, 128), n=st.integers(8, 300), dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16]),
       seed=st.integers(0, 2**16))
def test_max8_keeps_duplicates_in_descending_order(parts, n, dtype, seed):
    x = np.random.default_rng(seed).integers(-20, 20, (parts, n)).astype(dtype)
    out = top8(x)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.astype(np.float32), ref_max8(x))


def test_max8_of_distinct_floats_and_three_dim_source():
    x = np.random.default_rng(1).standard_normal((16, 4, 50)).astype(np.float32)
    np.testing.assert_array_equal(top8(x), ref_max8(x.reshape(16, 200)))


@settings(max_examples=6, deadline=None)
@given(parts=st.integers(1, 64), n=st.integers(8, 200), seed=st.integers(0, 2**16),
       index_dtype=st.sampled_from(["uint32", "uint16"]))
def test_find_index8_pairs_duplicates_ascending_and_marks_absent(parts, n, seed, index_dtype):
    g = np.random.default_rng(seed)
    x = g.integers(0, 6, (parts, n)).astype(np.float32)
    vals = g.integers(0, 8, (parts, 8)).astype(np.float32)  # 6 and 7 are absent
    out = find8(x, vals, index_dtype)
    want = ref_find8(x, vals)
    assert out.dtype == np.dtype(index_dtype)
    np.testing.assert_array_equal(out, want.astype(index_dtype))  # absent: 0xFFFF for uint16


def test_find_index8_of_max8_gives_argmax_positions():
    x = np.random.default_rng(2).standard_normal((32, 500)).astype(np.float32)
    np.testing.assert_array_equal(find8(x, ref_max8(x), "uint32"), np.argsort(-x, axis=1)[:, :8])


@settings(max_examples=6, deadline=None)
@given(parts=st.integers(1, 64), n=st.integers(8, 200), seed=st.integers(0, 2**16),
       imm=st.sampled_from([-1e9, 0.0, 3.5]))
def test_match_replace8_reverse_order_pairing(parts, n, seed, imm):
    g = np.random.default_rng(seed)
    x = g.integers(0, 6, (parts, n)).astype(np.float32)
    vals = np.take_along_axis(x, g.integers(0, n, (parts, 8)), axis=1)  # present values, duplicates likely
    out, idx = replace8(x, vals, imm)
    want, want_idx = ref_replace8(x, vals, imm)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(idx, want_idx)


def test_match_replace8_documented_example():
    x = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    out, idx = replace8(x, vals, -1.0)
    np.testing.assert_array_equal(idx, [[2, 10, 9, 8, 7, 6, 5, 4]])
    np.testing.assert_array_equal(out, [[1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1]])


def test_top8_validation_names_the_operand_and_limit():
    with pytest.raises(KernelError, match=r"nisa.max8: data .* has 4 elements per partition \(8 to 16384\)"):
        top8(np.zeros((2, 4), np.float32))
    with pytest.raises(KernelError, match=r"index dst .* must be uint16 or uint32"):
        find8(np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32), "int32")
