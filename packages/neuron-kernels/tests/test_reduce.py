"""Reductions (sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std, logsumexp, cumsum) against
numpy references written here, with hypothesis-drawn shapes, dims, dtypes and both layouts."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError
from neuron_kernels.library import reduce as R

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
RTOL = {np.dtype(np.float32): 1e-5, BF16: 1e-2, np.dtype(np.float16): 2e-3}
SET = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def shapes_dims(draw, max_elems=40_000, max_ndim=4, single=False):
    ndim = draw(st.integers(1, max_ndim))
    sizes = st.sampled_from([1, 2, 3, 5, 17, 64, 127, 128, 129, 300, 700])
    shape = []
    for _ in range(ndim):
        s = draw(sizes)
        if math.prod(shape) * s > max_elems:
            s = 1
        shape.append(s)
    if single:
        return tuple(shape), draw(st.integers(-ndim, ndim - 1))
    dims = draw(st.one_of(st.none(), st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)))
    return tuple(shape), None if dims is None else tuple(dims)


def _np_axis(dims):
    return None if dims is None else tuple(dims)


def _data(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _close(got, ref, dtype, magnitude=None, what=""):
    """|got - ref| <= rtol * (|ref| + magnitude) for the dtype's rtol; magnitude bounds the terms summed."""
    got = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    rtol = RTOL[np.dtype(dtype)]
    bound = rtol * (np.abs(ref) + (0 if magnitude is None else magnitude)) + 1e-30
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(got - ref) <= bound) | (np.isnan(got) & np.isnan(ref)) | (got == ref))
    assert not bad.any(), f"{what}: {np.argwhere(bad)[:3].tolist()} got {got[bad][:3]} want {ref[bad][:3]}"


LAYOUTS = st.sampled_from(["auto", "A", "B"])


@SET
@given(shapes_dims(), st.sampled_from(FLOATS), st.booleans(), LAYOUTS)
def test_sum_mean_any_dims(sd, dtype, keepdim, layout):
    shape, dims = sd
    x = _data(np.random.default_rng(len(shape)), shape, dtype)
    x64 = x.astype(np.float64)
    ax = _np_axis(dims)
    mag = np.abs(x64).sum(axis=ax, keepdims=keepdim)
    got = R.sum(x, dims, keepdim, layout=layout)
    assert got.dtype == dtype
    _close(got, x64.sum(axis=ax, keepdims=keepdim), dtype, mag, "sum")
    n = x64.size // max(1, np.asarray(got).size) if x64.size else 0
    got = R.mean(x, dims, keepdim, layout=layout)
    _close(got, x64.mean(axis=ax, keepdims=keepdim), dtype, mag / max(n, 1), "mean")


@SET
@given(shapes_dims(max_elems=20_000), st.sampled_from(FLOATS), LAYOUTS)
def test_prod_amax_amin_any_dims(sd, dtype, layout):
    shape, dims = sd
    rng = np.random.default_rng(7)
    x = (1 + 0.01 * rng.standard_normal(shape)).astype(dtype)
    ax = _np_axis(dims)
    _close(R.prod(x, dims, layout=layout), x.astype(np.float64).prod(axis=ax), dtype, what="prod")
    y = _data(rng, shape, dtype)
    d = () if dims is None else dims
    np.testing.assert_array_equal(R.amax(y, d, layout=layout), y.max(axis=ax))  # exact
    np.testing.assert_array_equal(R.amin(y, d, True, layout=layout), y.min(axis=ax, keepdims=True))


@SET
@given(shapes_dims(single=True), st.sampled_from(FLOATS), st.booleans(), LAYOUTS, st.sampled_from([1, 32]))
def test_max_min_argmax_argmin_one_dim(sd, dtype, keepdim, layout, tile_kib):
    shape, dim = sd
    rng = np.random.default_rng(11)
    x = np.round(rng.standard_normal(shape) * 2).astype(dtype)  # many ties: the first occurrence wins
    v, i = R.max(x, dim, keepdim, layout=layout, tile_kib=tile_kib)
    np.testing.assert_array_equal(v, x.max(axis=dim, keepdims=keepdim))
    assert i.dtype == np.int64
    np.testing.assert_array_equal(i, x.argmax(axis=dim, keepdims=keepdim))
    v, i = R.min(x, dim, keepdim, layout=layout, tile_kib=tile_kib)
    np.testing.assert_array_equal(v, x.min(axis=dim, keepdims=keepdim))
    np.testing.assert_array_equal(i, x.argmin(axis=dim, keepdims=keepdim))
    np.testing.assert_array_equal(R.argmax(x, dim, layout=layout), x.argmax(axis=dim))
    np.testing.assert_array_equal(R.argmin(x, None, layout=layout), x.argmin())  # flattened


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32], ids=str)
def test_arg_reductions_size_chunks_by_their_32bit_position_keys(dtype):
    """A 16-bit input's chunk holds 4-byte position keys beside it: chunks sized by the input's 2 bytes overflowed
    SBUF at the largest tile budget (max over dim 0 of [2, 64, 127], tile_kib=32)."""
    x = np.round(np.random.default_rng(5).standard_normal((2, 64, 127)) * 2).astype(dtype)
    v, i = R.max(x, 0, False, layout="A", tile_kib=32)
    np.testing.assert_array_equal(v, x.max(axis=0))
    np.testing.assert_array_equal(i, x.argmax(axis=0))


@pytest.mark.parametrize("layout", ["A", "B"])
def test_argmax_nan_is_the_first_maximum(layout):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 300)).astype(np.float32)
    x[3, [17, 200]] = np.nan
    x[5, 0] = np.nan
    x[7, 299] = np.nan
    for dim in (0, 1):
        np.testing.assert_array_equal(R.argmax(x, dim, layout=layout, tile_kib=1), np.argmax(x, axis=dim))
        np.testing.assert_array_equal(R.argmin(x, dim, layout=layout, tile_kib=1), np.argmin(x, axis=dim))
        np.testing.assert_array_equal(R.amax(x, dim, layout=layout), np.max(x, axis=dim))
    assert R.argmax(x, layout=layout) == np.argmax(x)


@SET
@given(shapes_dims(), st.sampled_from(FLOATS), st.sampled_from([0, 1, 2]), LAYOUTS, st.sampled_from([1, 32]))
def test_var_std_correction(sd, dtype, correction, layout, tile_kib):
    shape, dims = sd
    x = (_data(np.random.default_rng(5), shape, dtype) + 3).astype(dtype)  # a mean far from 0
    x64 = x.astype(np.float64)
    ax = _np_axis(dims)
    n = x64.size // max(1, x64.sum(axis=ax).size)
    with np.errstate(all="ignore"):
        ref = ((x64 - x64.mean(axis=ax, keepdims=True)) ** 2).sum(axis=ax) / max(0, n - correction)
    kw = dict(correction=correction, layout=layout, tile_kib=tile_kib)
    _close(R.var(x, dims, **kw), ref.astype(dtype), dtype, what="var")
    with np.errstate(all="ignore"):
        _close(R.std(x, dims, **kw), np.sqrt(ref).astype(dtype), dtype, what="std")


@SET
@given(shapes_dims(), st.sampled_from(FLOATS), LAYOUTS, st.sampled_from([1, 32]))
def test_logsumexp(sd, dtype, layout, tile_kib):
    shape, dims = sd
    x = _data(np.random.default_rng(9), shape, dtype, scale=4)
    x64 = x.astype(np.float64)
    ax = _np_axis(dims)
    m = x64.max(axis=ax, keepdims=True)
    ref = np.log(np.exp(x64 - m).sum(axis=ax)) + np.squeeze(m, axis=ax) if ax is not None else \
        np.log(np.exp(x64 - m).sum()) + m.item()
    d = tuple(range(len(shape))) if dims is None else dims
    _close(R.logsumexp(x, d, layout=layout, tile_kib=tile_kib), ref, dtype, magnitude=1.0, what="logsumexp")


def test_logsumexp_infinite_maxima_follow_torch():
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0], [-np.inf, 2.0]], np.float32)
    np.testing.assert_array_equal(R.logsumexp(x, 1), np.array([-np.inf, np.inf, np.nan, 2.0], np.float32))


INTS = [np.int8, np.int16, np.int32, np.uint8, np.bool_]


@SET
@given(shapes_dims(max_elems=20_000), st.sampled_from(INTS), LAYOUTS)
def test_integer_reductions_exact(sd, dtype, layout):
    shape, dims = sd
    rng = np.random.default_rng(13)
    x = rng.integers(0, 2, shape).astype(bool) if dtype is np.bool_ else rng.integers(-60, 60, shape).astype(dtype)
    ax = _np_axis(dims)
    got = R.sum(x, dims, layout=layout)
    assert got.dtype == np.int64  # torch: integer sums are int64
    np.testing.assert_array_equal(got, x.astype(np.int64).sum(axis=ax))
    if dtype is not np.bool_:
        np.testing.assert_array_equal(R.amax(x, () if dims is None else dims, layout=layout), x.max(axis=ax))
        np.testing.assert_array_equal(R.argmin(x, None, layout=layout), x.argmin())


def test_int32_extremes_are_exact():
    x = np.random.default_rng(0).integers(-2**30, 2**30, (64, 200)).astype(np.int32)
    np.testing.assert_array_equal(R.amax(x, 1), x.max(axis=1))
    np.testing.assert_array_equal(R.argmax(x, 0), x.argmax(axis=0))
    np.testing.assert_array_equal(R.sum(x[:, :2], 1), x[:, :2].astype(np.int64).sum(axis=1))


@SET
@given(shapes_dims(max_elems=30_000, single=True), st.sampled_from(FLOATS + [np.dtype(np.int32)]),
       st.sampled_from([1, 32]))
def test_cumsum_any_dim(sd, dtype, tile_kib):
    shape, dim = sd
    rng = np.random.default_rng(17)
    if dtype == np.int32:
        x = rng.integers(-1000, 1000, shape).astype(np.int32)
        got = R.cumsum(x, dim, tile_kib=tile_kib)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.cumsum(x.astype(np.int64), axis=dim))
        return
    x = _data(rng, shape, dtype)
    x64 = x.astype(np.float64)
    got = R.cumsum(x, dim, tile_kib=tile_kib)
    assert got.dtype == dtype
    _close(got, np.cumsum(x64, axis=dim), dtype, np.cumsum(np.abs(x64), axis=dim), "cumsum")


TORCH = {np.dtype(np.float32): torch.float32, BF16: torch.bfloat16, np.dtype(np.float16): torch.float16}


@SET
@given(shapes_dims(max_elems=30_000, single=True), st.sampled_from(FLOATS),
       st.sampled_from([math.inf, -math.inf, math.nan, 1e20]), st.integers(0, 2**16))
def test_cumsum_inf_stays_after_its_position(sd, dtype, bad, seed):
    """A non-finite (or huge) element reaches only the outputs from its position on, as the CPU's running
    sum (a triangular 0/1 matmul once made 0 * inf = NaN of every output before it)."""
    shape, dim = sd
    rng = np.random.default_rng(seed)
    x = _data(rng, shape, dtype)
    with np.errstate(over="ignore"):  # 1e20 is inf in float16
        x[tuple(rng.integers(0, s) for s in shape)] = bad
    got = R.cumsum(x, dim).astype(np.float64)
    ref = torch.tensor(x.astype(np.float32)).to(TORCH[dtype]).cumsum(dim).double().numpy()
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(got), special(ref))
    fin = np.isfinite(ref)
    x64 = x.astype(np.float64)
    magnitude = np.cumsum(np.where(np.isfinite(x64), np.abs(x64), 0), axis=dim)
    _close(got[fin], ref[fin], dtype, magnitude[fin], "cumsum")


def test_edge_shapes():
    x = np.random.default_rng(1).standard_normal((4, 1, 5)).astype(np.float32)
    np.testing.assert_allclose(R.sum(x, (0, 2), keepdim=True), x.sum(axis=(0, 2), keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(R.sum(x, 1), x.sum(axis=1))  # a size-1 dim
    assert np.isnan(R.var(x, 1)).all()  # one element, correction 1: 0/0
    np.testing.assert_array_equal(R.argmax(x, 1), np.zeros((4, 5), np.int64))
    z = np.array(3.5, np.float32)
    assert R.sum(z).shape == () and R.sum(z) == 3.5
    assert R.argmax(z) == 0
    e = np.zeros((3, 0), np.float32)
    np.testing.assert_array_equal(R.sum(e, 1), np.zeros(3, np.float32))
    np.testing.assert_array_equal(R.prod(e, 1), np.ones(3, np.float32))
    assert np.isnan(R.mean(e, 1)).all()
    np.testing.assert_array_equal(R.logsumexp(e, 1), np.full(3, -np.inf, np.float32))
    assert R.sum(e, 0).shape == (0,)
    with pytest.raises(KernelError, match="empty dim"):
        R.amax(e, 1)
    with pytest.raises(KernelError, match="one dim"):
        R.argmax(x, (0, 1))


def test_long_rows_and_full_reductions_are_chunked():
    """Rows longer than a tile run in chunks merged online; a full reduction splits across partitions."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 50_000)).astype(np.float32)
    x64 = x.astype(np.float64)
    _close(R.sum(x, 1, tile_kib=4), x64.sum(axis=1), np.float32, np.abs(x64).sum(axis=1))
    _close(R.var(x, 1, tile_kib=4), x64.var(axis=1, ddof=1), np.float32)
    np.testing.assert_array_equal(R.argmax(x, 1, tile_kib=4), x.argmax(axis=1))
    _close(R.sum(x), x64.sum(), np.float32, np.abs(x64).sum())
