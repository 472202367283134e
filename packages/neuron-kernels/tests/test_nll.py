"""nll_loss forward and backward kernels against numpy references of torch's formulas: [N, C] and [N, C, D]
inputs, int64 and int32 targets, class weights, ignore_index (kept classes, ignored entries, all ignored),
the three reductions, float32/bfloat16/float16, and targets that must fail the bounds check."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError
from neuron_kernels.library import nll

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
RTOL = {np.dtype(np.float32): 1e-5, BF16: 1e-2, np.dtype(np.float16): 2e-3}  # as test_loss.py
SET = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
IGNORES = [-100, 0, 1, -(2**31), 2**31 - 1]


def _entries(lp, t):
    """(N, C, D) and the target as [N, D]."""
    N, C = lp.shape[:2]
    D = lp.shape[2] if lp.ndim == 3 else 1
    return N, C, D, t.reshape(N, D)


def ref_forward(lp, t, w, ii, reduction):
    """(loss, total_weight) in float64: torch's formulas."""
    N, C, D, t2 = _entries(lp, t)
    x = lp.astype(np.float64).reshape(N, C, D)
    ww = np.ones(C) if w is None else w.astype(np.float64)
    keep = t2 != ii
    tc = np.where(keep, t2, 0)
    picked = np.take_along_axis(x, tc[:, None, :], 1)[:, 0, :]
    loss = np.where(keep, -ww[tc] * picked, 0.0)
    total = (ww[tc] * keep).sum()
    if reduction == "none":
        return loss.reshape(t.shape), 0.0
    with np.errstate(all="ignore"):
        return (loss.sum() / total if reduction == "mean" else loss.sum()), total


def ref_backward(go, lp, t, w, ii, reduction, total):
    N, C, D, t2 = _entries(lp, t)
    ww = np.ones(C) if w is None else w.astype(np.float64)
    g = np.asarray(go, np.float64)
    g = g.reshape(N, D) if reduction == "none" else np.full((N, D), float(g))
    if reduction == "mean":
        with np.errstate(all="ignore"):
            g = g / float(total)
    keep = t2 != ii
    tc = np.where(keep, t2, 0)
    grad = np.zeros((N, C, D))
    n, d = np.nonzero(keep)
    grad[n, tc[n, d], d] = -ww[tc[n, d]] * g[n, d]
    return grad.reshape(lp.shape)


def _close(got, ref, dtype, scale, what):
    got = np.asarray(got)
    ref = np.asarray(ref, np.float64)
    assert got.dtype == dtype and got.shape == ref.shape, (what, got.dtype, got.shape, ref.shape)
    err = np.abs(got.astype(np.float64) - ref)
    with np.errstate(invalid="ignore"):
        bad = ~((err <= RTOL[dtype] * (np.abs(ref) + scale)) | (np.isnan(got) & np.isnan(ref)))
    assert not bad.any(), f"{what}: {np.argwhere(bad)[:3].tolist()} got {got[bad][:3]} want {ref[bad][:3]}"


@st.composite
def problems(draw):
    n = draw(st.sampled_from([1, 2, 5, 127, 128, 129, 300]))
    c = draw(st.sampled_from([1, 2, 3, 10, 128, 700, 3000]))
    d = draw(st.sampled_from([None, None, 1, 3, 300]))
    if d == 300 and n * c > 3000:  # keep [N, C, D] inputs small
        n = draw(st.sampled_from([1, 2]))
    dtype = draw(st.sampled_from(FLOATS))
    weighted = draw(st.booleans())
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    ii = draw(st.sampled_from(IGNORES))
    ignored = draw(st.sampled_from([0.0, 0.3, 1.0]))
    return n, c, d, dtype, weighted, reduction, ii, ignored, draw(st.integers(0, 2**16))


def _inputs(n, c, d, dtype, weighted, ii, ignored, seed, int32=False):
    rng = np.random.default_rng(seed)
    shape = (n, c) if d is None else (n, c, d)
    tshape = (n,) if d is None else (n, d)
    lp = (rng.standard_normal(shape) * 3).astype(dtype)
    t = rng.integers(0, c, tshape).astype(np.int32 if int32 else np.int64)
    t[rng.random(tshape) < ignored] = ii
    w = (rng.random(c) + 0.5).astype(dtype) if weighted else None
    return lp, t, w


def _scale(lp, t, w, reduction):
    """The size of the terms a sum adds up (the sum's rounding error is relative to it)."""
    mag = float(np.abs(lp.astype(np.float64)).max(initial=0)) * (1.0 if w is None else float(w.max()))
    return mag * (t.size if reduction == "sum" else 1)


@SET
@given(problems())
def test_nll_loss_forward(prob):
    n, c, d, dtype, weighted, reduction, ii, ignored, seed = prob
    lp, t, w = _inputs(n, c, d, dtype, weighted, ii, ignored, seed)
    loss, total = nll.nll_loss(lp, t, w, ignore_index=ii, reduction=reduction)
    ref, rtotal = ref_forward(lp, t, w, ii, reduction)
    _close(loss, ref, dtype, _scale(lp, t, w, reduction) if reduction != "none" else 0.0, "loss")
    _close(total, rtotal, dtype, 0.0, "total_weight")


@SET
@given(problems())
def test_nll_loss_backward(prob):
    n, c, d, dtype, weighted, reduction, ii, ignored, seed = prob
    lp, t, w = _inputs(n, c, d, dtype, weighted, ii, ignored, seed)
    rng = np.random.default_rng(seed + 1)
    go = (rng.standard_normal(t.shape) if reduction == "none" else np.array(rng.standard_normal())).astype(dtype)
    total = np.array(ref_forward(lp, t, w, ii, "sum")[1], dtype)
    got = nll.nll_loss_backward(go, lp, t, w, total, ignore_index=ii, reduction=reduction)
    # "mean" rounds grad_output / total_weight to the dtype first (torch's CPU kernel): one more rounding
    _close(got, ref_backward(go, lp, t, w, ii, reduction, total), dtype, 0.0, "grad")


@pytest.mark.parametrize("shape", [(2, 3000, 300), (130, 1500, 3), (3, 5, 1000)])
def test_layouts_and_class_chunks(shape):
    """[N, C, D] with D on partitions (cols layout), several class chunks per one-hot gradient tile."""
    n, c, d = shape
    lp, t, w = _inputs(n, c, d, np.dtype(np.float32), True, -100, 0.1, 9)
    loss, total = nll.nll_loss(lp, t, w, reduction="sum")
    ref, rtotal = ref_forward(lp, t, w, -100, "sum")
    _close(loss, ref, lp.dtype, _scale(lp, t, w, "sum"), "loss")
    go = np.random.default_rng(2).standard_normal(t.shape).astype(np.float32)
    got = nll.nll_loss_backward(go, lp, t, w, None, reduction="none")
    _close(got, ref_backward(go, lp, t, w, -100, "none", rtotal), lp.dtype, 0.0, "grad")


def test_all_ignored_mean_is_nan_sum_is_zero():
    lp = np.random.default_rng(0).standard_normal((6, 9)).astype(np.float32)
    lp[:, 0] = np.nan  # ignored entries read class 0: it must not leak
    t = np.full(6, -100, np.int64)
    loss, total = nll.nll_loss(lp, t)
    assert np.isnan(loss) and total == 0
    assert nll.nll_loss(lp, t, reduction="sum") == (0, 0)
    grad = nll.nll_loss_backward(np.array(1.0, np.float32), lp, t, None, np.array(0.0, np.float32))
    np.testing.assert_array_equal(grad, np.zeros((6, 9)))  # the mean's 1 / 0 scale reaches no entry
    assert not np.signbit(grad).any()


def test_int32_targets_match_int64():
    lp, t, w = _inputs(200, 30, None, np.dtype(np.float32), True, -100, 0.2, 3)
    for red in ("none", "mean"):
        a = nll.nll_loss(lp, t, w, reduction=red)
        b = nll.nll_loss(lp, t.astype(np.int32), w, reduction=red)
        np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("bad", [7, -1, 2**31, 2**32 + 1, -(2**40), 2**32 - 100, -(2**63)])
@pytest.mark.parametrize("d", [None, 3])
def test_bad_targets_fail_the_bounds_check(bad, d):
    """Out of [0, C), negative, or not int32 (2**32 - 100 has -100 = ignore_index as its low word)."""
    lp, t, _ = _inputs(130, 7, d, np.dtype(np.float32), False, -100, 0.2, 1)
    t.flat[129] = bad
    go = np.array(1.0, np.float32)
    with pytest.raises(KernelError, match="bounds"):
        nll.nll_loss(lp, t)
    with pytest.raises(KernelError, match="bounds"):
        nll.nll_loss_backward(go, lp, t, None, go)


def test_empty_batch():
    lp = np.zeros((0, 5), np.float32)
    t = np.zeros(0, np.int64)
    loss, total = nll.nll_loss(lp, t)
    assert np.isnan(loss) and total == 0
    assert nll.nll_loss(lp, t, reduction="none")[0].shape == (0,)
    assert nll.nll_loss_backward(np.array(1.0, np.float32), lp, t, None, total).shape == (0, 5)


def test_argument_errors():
    lp = np.zeros((4, 5), np.float32)
    t = np.zeros(4, np.int64)
    with pytest.raises(KernelError, match="target"):
        nll.nll_loss(lp, t.astype(np.float32))
    with pytest.raises(KernelError, match="reduction"):
        nll.nll_loss(lp, t, reduction="avg")
    with pytest.raises(KernelError, match="weight"):
        nll.nll_loss(lp, t, np.ones(4, np.float32))
    with pytest.raises(KernelError, match="grad_output"):
        nll.nll_loss_backward(np.zeros(4, np.float32), lp, t, None, np.array(4.0, np.float32))
