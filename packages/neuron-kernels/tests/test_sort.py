"""The bitonic sort kernel against numpy's stable argsort: row lengths around powers of two, NaN / +-inf / +-0 /
duplicates, every key dtype, both directions, and each layout (rows packed several per partition, one per
partition, spread across partitions with sentinels, several tiles)."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import DType, get_profile
from neuron_kernels import KernelError
from neuron_kernels.library import sort as S

SETTINGS = settings(max_examples=20, deadline=None)
BF16 = ml_dtypes.bfloat16
FLOAT_TYPES = (np.float32, BF16, np.float16)
INT_TYPES = (np.int32, np.int64, np.int16, np.int8, np.uint8, np.bool_)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 1.0, -2.5], np.float32)
# lengths around powers of two, where the network's padding and partial blocks change
LENGTHS = sorted({max(1, (1 << k) + d) for k in range(13) for d in (-1, 0, 1)} | {100, 1000, 4097, 5000})


def reference(x: np.ndarray, descending: bool):
    """torch.sort(stable=True): NaN largest in both directions, ties in index order."""
    if x.dtype in (np.float32, BF16, np.float16):
        k = x.astype(np.float64)
        nan = np.isnan(k)
        k = np.where(nan, 0.0, -k if descending else k)
        nan_class = (~nan if descending else nan).astype(np.int8)
        idx = np.lexsort((k, nan_class), axis=-1)  # lexsort is stable
    else:
        k = x.astype(np.int64)
        idx = np.argsort(~k if descending else k, axis=-1, kind="stable")
    return np.take_along_axis(x, idx, -1), idx


def keys(dtype, shape, seed: int, ties: bool):
    rng = np.random.default_rng(seed)
    if dtype in FLOAT_TYPES:
        x = (rng.integers(-6, 7, shape) * 0.5 if ties else rng.standard_normal(shape)).astype(np.float32)
        special = rng.random(shape) < 0.2
        return np.where(special, SPECIAL[rng.integers(0, len(SPECIAL), shape)], x).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    info = np.iinfo(dtype)
    lo, hi = (-3, 3) if ties else (int(info.min), int(info.max))
    x = rng.integers(lo, hi, shape, dtype=np.int64, endpoint=True).astype(dtype)
    if dtype == np.int64 and not ties:  # words that tie high and differ low
        x[..., ::3] = (rng.integers(-2, 2, x[..., ::3].shape) << 32) | rng.integers(0, 3, x[..., ::3].shape)
    return x


def run_sort(x: np.ndarray, descending: bool, int64_indices: bool = False):
    if x.dtype == np.int64:
        v, i = S.sort(x.view(np.int32).reshape(*x.shape, 2), descending=descending, int64_indices=int64_indices)
        return v.view(np.int64).reshape(x.shape), i
    return S.sort(x, descending=descending, int64_indices=int64_indices)


def check(x: np.ndarray, descending: bool):
    v, i = run_sort(x, descending)
    rv, ri = reference(x, descending)
    np.testing.assert_array_equal(i, ri)
    if x.dtype in FLOAT_TYPES:  # values bit for bit, NaN as any NaN
        nan = np.isnan(rv.astype(np.float32))
        np.testing.assert_array_equal(np.isnan(v.astype(np.float32)), nan)
        np.testing.assert_array_equal(v.view(np.uint16 if x.itemsize == 2 else np.uint32)[~nan],
                                      rv.view(np.uint16 if x.itemsize == 2 else np.uint32)[~nan])
    else:
        np.testing.assert_array_equal(v, rv)


@SETTINGS
@given(n=st.sampled_from(LENGTHS), rows=st.sampled_from([1, 2, 3, 7, 130]), dtype=st.sampled_from(
    (np.float32, np.float32, BF16, np.float16, np.int32, np.int64)), descending=st.booleans(), ties=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_sort_matches_numpy_stable_argsort(n, rows, dtype, descending, ties, seed):
    rows = max(1, min(rows, 60_000 // n))  # a fraction of a second per example
    check(keys(dtype, (rows, n), seed, ties), descending)


@pytest.mark.parametrize("dtype", INT_TYPES[2:] + (np.int64,))
def test_sort_small_int_keys_and_int64_extremes(dtype):
    x = keys(dtype, (5, 37), 3, ties=False)
    if dtype == np.int64:
        x[0, :4] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0]
    for descending in (False, True):
        check(x, descending)


@pytest.mark.parametrize("rows,n", [(300, 17), (257, 9), (130, 64), (1, 100), (3, 257), (2, 1000), (1, 20000),
                                    (70, 4097)])
def test_sort_every_layout(rows, n):
    """Packed rows with a partial last partition, one row per partition over two tiles, rows spread across
    partitions with sentinel padding: each against the reference, both directions."""
    x = keys(np.float32, (rows, n), rows * n, ties=True)
    for descending in (False, True):
        check(x, descending)


def test_sort_layouts_cover_packed_partitioned_and_spread_rows():
    prof = get_profile()
    assert S.geometry(300, 17, 1, prof).g > 1
    assert S.geometry(1000, 4097, 1, prof).q == 1
    assert S.geometry(1, 20000, 1, prof).q == 128
    assert S.geometry(3, 5000, 2, prof).q > 1
    assert S.geometry(1, 20000, 1, prof).padded


def test_sort_int64_indices():
    x = keys(np.float32, (4, 300), 5, ties=True)
    v, i = run_sort(x, True, int64_indices=True)
    assert i.dtype == np.int64
    np.testing.assert_array_equal(i, reference(x, True)[1])


def test_sort_rows_of_one_and_empty():
    v, i = S.sort(np.array([[3.0], [np.nan]], np.float32))
    assert i.tolist() == [[0], [0]] and v[0, 0] == 3.0 and np.isnan(v[1, 0])
    v, i = S.sort(np.zeros((0, 5), np.float32))
    assert v.shape == (0, 5) and i.shape == (0, 5)


def test_sort_work_grows_as_n_log2_n():
    """VectorE elements processed per row: (k(k+1)/2 steps) x (n/2 pairs) x a constant, nowhere near n^2."""
    def work(n):
        prog = S.sort.trace(np.zeros((128, n), np.float32))
        return sum(ins.dst.num_elements for ins in prog.instructions if ins.engine.value == "vector")
    small, big = work(1024), work(4096)
    expected = 4 * (12 * 13 / 2) / (10 * 11 / 2)  # n log^2 n from 1024 to 4096: 5.7x (n^2: 16x)
    assert big / small < expected * 1.15


def test_sort_rejects_rows_beyond_the_limit_and_bad_shapes():
    prof = get_profile()
    limit = S.max_row(DType.float32, prof)
    assert limit >= 1 << 19 and math.log2(limit).is_integer()
    with pytest.raises(KernelError, match=rf"sort: rows of {limit + 1} elements exceed the {limit}"):
        S.sort.trace(np.zeros((1, limit + 1), np.float32))
    with pytest.raises(KernelError, match="word array"):
        S.sort.trace(np.zeros((2, 3, 4), np.int32))
    with pytest.raises(KernelError, match="sort: rows of uint32 are not supported"):
        S.sort.trace(np.zeros((2, 3), np.uint32))
