"""softmax / log_softmax forward and backward over any dim against numpy references, every layout and
the long-row (two-pass) path; the bench shape reaches the DMA roofline target."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_hal import get_driver, get_profile
from neuron_kernels import KernelError, TensorSpec, roofline
from neuron_kernels import language as nl
from neuron_kernels.library import softmax as SM

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
RTOL = {np.dtype(np.float32): 1e-5, BF16: 1e-2, np.dtype(np.float16): 2e-3}
SET = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def shape_dim(draw, max_elems=30_000):
    ndim = draw(st.integers(1, 3))
    sizes = st.sampled_from([1, 2, 3, 7, 64, 127, 128, 129, 300, 1000])
    shape = []
    for _ in range(ndim):
        s = draw(sizes)
        shape.append(1 if math.prod(shape) * s > max_elems else s)
    return tuple(shape), draw(st.integers(-ndim, ndim - 1))


def ref_softmax(x, d):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=d, keepdims=True))
    return e / e.sum(axis=d, keepdims=True)


def ref_log_softmax(x, d):
    x = x.astype(np.float64)
    m = x.max(axis=d, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=d, keepdims=True))


def _close(got, ref, dtype, magnitude=0.0, what=""):
    got = np.asarray(got)
    assert got.dtype == dtype and got.shape == ref.shape, (what, got.dtype, got.shape, ref.shape)
    rtol = RTOL[np.dtype(dtype)]
    err = np.abs(got.astype(np.float64) - ref)
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)  # float16 results may be subnormal
    bad = err > rtol * (np.abs(ref) + magnitude) + tiny
    assert not bad.any(), f"{what}: max error {err.max()} at {np.argwhere(bad)[:3].tolist()}"


LAYOUTS = st.sampled_from(["auto", "A", "B", "two_pass"])


@SET
@given(shape_dim(), st.sampled_from(FLOATS), LAYOUTS)
def test_softmax_and_log_softmax_forward(sd, dtype, layout):
    shape, dim = sd
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 3).astype(dtype)
    y = SM.softmax(x, dim, layout=layout)
    _close(y, ref_softmax(x, dim), dtype, 1e-6, "softmax")
    ly = SM.log_softmax(x, dim, layout=layout)
    _close(ly, ref_log_softmax(x, dim), dtype, 1.0, "log_softmax")


@SET
@given(shape_dim(), st.sampled_from(FLOATS), LAYOUTS)
def test_softmax_backward(sd, dtype, layout):
    shape, dim = sd
    rng = np.random.default_rng(3)
    y = SM.softmax((rng.standard_normal(shape) * 2).astype(dtype), dim)
    g = rng.standard_normal(shape).astype(dtype)
    y64, g64 = y.astype(np.float64), g.astype(np.float64)
    ref = y64 * (g64 - (g64 * y64).sum(axis=dim, keepdims=True))
    # rounding of the terms y * g and y * sum bounds the error of their difference
    mag = y64 * (np.abs(g64) + np.abs((g64 * y64).sum(axis=dim, keepdims=True)))
    _close(SM.softmax_backward(g, y, dim, layout=layout), ref, dtype, mag, "softmax_backward")


@SET
@given(shape_dim(), st.sampled_from(FLOATS), LAYOUTS)
def test_log_softmax_backward(sd, dtype, layout):
    shape, dim = sd
    rng = np.random.default_rng(4)
    ly = SM.log_softmax((rng.standard_normal(shape) * 2).astype(dtype), dim)
    g = rng.standard_normal(shape).astype(dtype)
    ly64, g64 = ly.astype(np.float64), g.astype(np.float64)
    s = g64.sum(axis=dim, keepdims=True)
    ref = g64 - np.exp(ly64) * s
    mag = np.abs(g64) + np.exp(ly64) * np.abs(g64).sum(axis=dim, keepdims=True)
    _close(SM.log_softmax_backward(g, ly, dim, layout=layout), ref, dtype, mag, "log_softmax_backward")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), ml_dtypes.bfloat16])
def test_a_short_reduced_dim_before_many_columns_fits_sbuf(dtype):
    """softmax over dim 0 of [1, 4099, 5]: one reduced element per column and 20495 columns, whose fp32
    statistics take as much SBUF as the chunk; the chunk is sized with them (it overflowed SBUF)."""
    x = (np.random.default_rng(3).standard_normal((1, 4099, 5)) * 3).astype(dtype)
    _close(SM.softmax(x, 0), ref_softmax(x, 0), np.dtype(dtype), 1e-6, "softmax")
    _close(SM.log_softmax(x, 0), ref_log_softmax(x, 0), np.dtype(dtype), 1.0, "log_softmax")


def test_masked_rows_follow_torch():
    """-inf entries get probability 0; an all -inf row is nan (as in torch)."""
    x = np.array([[0.0, -np.inf, 1.0, -np.inf], [-np.inf] * 4, [np.inf, 0.0, 0.0, 0.0]], np.float32)
    with np.errstate(all="ignore"):
        y = SM.softmax(x, 1)
    np.testing.assert_allclose(y[0], [1 / (1 + math.e), 0, math.e / (1 + math.e), 0], rtol=1e-6)
    assert np.isnan(y[1]).all() and np.isnan(y[2, 0])


def test_long_rows_recompute_path():
    """A 16-bit row too long to keep an fp32 copy: ScalarE recomputes exp(x - max - log(sum))."""
    x = (np.random.default_rng(0).standard_normal((130, 30_000)) * 3).astype(BF16)
    _close(SM.softmax(x, 1), ref_softmax(x, 1), BF16, 1e-6)


@pytest.mark.parametrize("dtype,value", [(BF16, 1e30), (np.dtype(np.float16), 6e4)])
def test_long_16bit_rows_with_a_large_max_recompute_exp_of_x_minus_max(dtype, value):
    """The recompute path divides exp(x - max) by the sum: exp(x + (-max - log(sum))) lost log(sum) in the
    rounding of a large max (rows of 1e30 gave 1.0, not 1/n)."""
    x = np.full((128, 13000), value, dtype)
    x[:, :5] = (value - 1.0) if dtype != BF16 else value / 2
    _close(SM.softmax(x, 1), ref_softmax(x, 1), dtype, 1e-6, "softmax")


def test_errors():
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(KernelError, match="one dim"):
        SM.softmax(x, (0, 1))
    with pytest.raises(KernelError, match="floating point"):
        SM.softmax(np.zeros((4, 4), np.int32), 1)
    with pytest.raises(KernelError, match="differ"):
        SM.softmax_backward(x, np.zeros((4, 5), np.float32), 1)


@pytest.mark.parametrize("dtype", [nl.bfloat16, nl.float32])
def test_bench_shape_reaches_the_dma_roofline(dtype):
    """Softmax over rows of 4096 of a 16 MiB tensor: >= 80% of bytes read + written at DMA bandwidth."""
    drv = get_driver("sim", get_profile("trn2"))
    rows = 16 * 2**20 // (4096 * dtype.itemsize)
    prog = SM.softmax.trace(TensorSpec((rows, 4096), dtype), -1, profile=drv.profile)
    ns = drv.estimate(0, drv.load(0, prog)).device_ns
    assert roofline.fraction(drv.profile, roofline.dma_ns(drv.profile, 2 * rows * 4096 * dtype.itemsize), ns) >= 0.8


@pytest.mark.parametrize("shape,dim,layout", [
    ((300, 700), 1, "auto"), ((300, 700), 0, "auto"), ((3, 5000), 1, "B"), ((5, 300, 7), 1, "auto"),
    ((1000, 10), 1, "auto"), ((130, 3, 40), 0, "B"), ((300, 700), 1, "two_pass"), ((4, 300, 130), 1, "two_pass"),
])
def test_layouts_on_medium_shapes(shape, dim, layout):
    rng = np.random.default_rng(sum(shape))
    for dtype in (np.dtype(np.float32), BF16):
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        _close(SM.softmax(x, dim, layout=layout), ref_softmax(x, dim), dtype, 1e-6, "softmax")
        _close(SM.log_softmax(x, dim, layout=layout), ref_log_softmax(x, dim), dtype, 1.0, "log_softmax")


@pytest.mark.parametrize("layout", ["A", "B", "two_pass"])
def test_log_softmax_subtracts_the_log_of_the_sum_after_the_max(layout):
    """(x - max) - log(sum), as torch orders it: x - max is exact near the max, while x + (-max - log(sum)) lost
    log(sum) in the rounding of a large max ([1e20, 1e20] gave 0, not -log 2; float16 65504s gave -0.6914)."""
    cases = [(np.full((2, 300), 1e20, np.float32), 1), (np.full((300, 2), 1e20, np.float32), 0),
             (np.full((2, 1, 1), 65504, np.float16), 0), (np.full((3, 130), 65504, np.float16), 1),
             ((np.random.default_rng(0).standard_normal((4, 300)) + 1e4).astype(np.float32), 1)]
    for x, dim in cases:
        got = SM.log_softmax(x, dim, layout=layout)
        _close(got, ref_log_softmax(x, dim), x.dtype, 0.0, f"log_softmax {x.shape} {x.dtype} dim={dim}")


@pytest.mark.parametrize("layout", ["B", "two_pass"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_a_part_of_a_row_that_is_all_minus_inf_takes_no_weight(layout, dtype):
    """Segments (layout B) and chunks (two passes) of a row are merged by their max: a part holding only -inf has
    max -inf, and exp(x - max) = exp(-inf + inf) made the whole row NaN; it takes weight 0, as in torch."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 2053)).astype(np.float32)
    x[0, :7] = -np.inf
    y = rng.standard_normal((300, 5)).astype(np.float32)
    y[:200, 0] = -np.inf
    y[:, 1] = -np.inf  # a whole row of -inf stays NaN
    y[:, 2] = float(ml_dtypes.finfo(dtype).min)  # a row of the dtype's minimum is uniform
    for a, dim in ((x.astype(dtype), 0), (y.astype(dtype), 0), (y.T.copy().astype(dtype), 1)):
        with np.errstate(all="ignore"):
            ref, lref = ref_softmax(a, dim), ref_log_softmax(a, dim)
        got, lgot = SM.softmax(a, dim, layout=layout), SM.log_softmax(a, dim, layout=layout)
        assert (np.isnan(got) == np.isnan(ref)).all() and (np.isnan(lgot) == np.isnan(lref)).all()
        ok = ~np.isnan(ref)
        _close(np.where(ok, got, 0).astype(dtype), np.where(ok, ref, 0), np.dtype(dtype), 1e-6, "softmax")
        ok = np.isfinite(lref)
        np.testing.assert_array_equal(lgot[~ok].astype(np.float64), lref[~ok])  # -inf where x is, NaN rows
        _close(np.where(ok, lgot, 0).astype(dtype), np.where(ok, lref, 0), np.dtype(dtype), 1.0, "log_softmax")


@pytest.mark.parametrize("shape,dtype", [((2, 2053, 7), BF16), ((2, 57000), np.dtype(np.float32)),
                                         ((3, 19000), np.dtype(np.float16)), ((130, 440), BF16)])
def test_a_short_dim_across_partitions_before_many_columns_fits_sbuf(shape, dtype):
    """Layout B over a dim of 2+ before ~14k-57k columns: the chunk's columns are sized with the per-column
    statistics of the combine, which outgrew SBUF (a KernelError on valid input)."""
    x = (np.random.default_rng(2).standard_normal(shape) * 3).astype(dtype)
    _close(SM.softmax(x, 0, layout="B"), ref_softmax(x, 0), dtype, 1e-6, "softmax")
    _close(SM.log_softmax(x, 0, layout="B"), ref_log_softmax(x, 0), dtype, 1.0, "log_softmax")


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_few_long_16bit_rows_keep_their_exps_across_partitions(dtype):
    """A 16-bit row of 40000 takes the recompute path in layout A; cut across partitions (layout B) each segment
    keeps exp(x - max_i) for the combine's rescale (its absence raised an internal AttributeError)."""
    x = (np.random.default_rng(5).standard_normal((2, 40000)) * 3).astype(dtype)
    _close(SM.softmax(x, 1), ref_softmax(x, 1), dtype, 1e-6, "softmax")
