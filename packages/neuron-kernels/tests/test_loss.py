"""cross_entropy forward and backward against numpy references of torch's formulas: reductions,
ignore_index, label smoothing, class weights, float32/bfloat16/float16, short and long rows."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError
from neuron_kernels.library import loss as L

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
RTOL = {np.dtype(np.float32): 1e-5, BF16: 1e-2, np.dtype(np.float16): 2e-3}
SET = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def log_softmax(x):
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def ref_loss(x, t, w, ignore_index, reduction, eps):
    """torch.nn.functional.cross_entropy in float64 (clamped gathers for ignored rows)."""
    x = x.astype(np.float64)
    N, C = x.shape
    lp = log_softmax(x)
    ww = np.ones(C) if w is None else w.astype(np.float64)
    valid = t != ignore_index
    tc = np.clip(t, 0, C - 1)
    nll = -ww[tc] * lp[np.arange(N), tc]
    smooth = -(lp * ww).sum(1)
    loss = np.where(valid, (1 - eps) * nll + eps / C * smooth, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.array(loss.sum())
    with np.errstate(all="ignore"):
        return np.array(loss.sum() / (ww[tc] * valid).sum())


def ref_grad(go, x, t, w, ignore_index, reduction, eps):
    x = x.astype(np.float64)
    N, C = x.shape
    p = np.exp(log_softmax(x))
    ww = np.ones(C) if w is None else w.astype(np.float64)
    valid = t != ignore_index
    tc = np.clip(t, 0, C - 1)
    go = np.asarray(go, np.float64)
    g = go if reduction == "none" else np.full(N, float(go))
    if reduction == "mean":
        with np.errstate(all="ignore"):
            g = g / (ww[tc] * valid).sum()
    g = np.where(valid, g, 0.0)
    onehot = np.zeros((N, C))
    onehot[np.arange(N), tc] = 1
    return g[:, None] * ((1 - eps) * ww[tc][:, None] * (p - onehot) + eps / C * (p * ww.sum() - ww[None, :]))


def _close(got, ref, dtype, magnitude=0.0, what=""):
    got = np.asarray(got)
    assert got.dtype == dtype and got.shape == ref.shape, (what, got.dtype, got.shape, ref.shape)
    err = np.abs(got.astype(np.float64) - ref)
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    with np.errstate(invalid="ignore"):
        bad = ~((err <= RTOL[dtype] * (np.abs(ref) + magnitude) + tiny) | (np.isnan(got) & np.isnan(ref)))
    assert not bad.any(), f"{what}: {np.argwhere(bad)[:3].tolist()} error {err[bad][:3]}"


@st.composite
def problems(draw):
    n = draw(st.sampled_from([1, 2, 5, 64, 127, 128, 129, 300]))
    c = draw(st.sampled_from([1, 2, 3, 10, 127, 128, 700, 3000]))
    dtype = draw(st.sampled_from(FLOATS))
    weighted = draw(st.booleans())
    eps = draw(st.sampled_from([0.0, 0.1]))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    ignore = draw(st.sampled_from([-100, 0]))
    tile_kib = draw(st.sampled_from([1, 32]))
    return n, c, dtype, weighted, eps, reduction, ignore, tile_kib


def _inputs(n, c, dtype, weighted, ignore, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    t = rng.integers(0, c, n).astype(np.int32)
    t[rng.random(n) < 0.2] = ignore
    w = (rng.random(c) + 0.5).astype(np.float32) if weighted else None
    return x, t, w


@SET
@given(problems())
def test_cross_entropy_forward(prob):
    n, c, dtype, weighted, eps, reduction, ignore, tile_kib = prob
    x, t, w = _inputs(n, c, dtype, weighted, ignore, n * c)
    args = (x, t) + ((w,) if weighted else ())
    got = L.cross_entropy(*args, ignore_index=ignore, reduction=reduction, label_smoothing=eps, tile_kib=tile_kib)
    # losses are log-domain values: log(sum exp) carries the sum's rounding as an absolute error (as in
    # torch's float32 logsumexp), so the bound is relative to |loss| + 1 (per row; times the weights)
    ref = ref_loss(x, t, w, ignore, reduction, eps)
    mag = 1.0 if w is None else float(np.abs(w).max())
    if reduction == "sum":
        mag *= n
    _close(got, ref, dtype, magnitude=mag, what="loss")


@SET
@given(problems())
def test_cross_entropy_backward(prob):
    n, c, dtype, weighted, eps, reduction, ignore, tile_kib = prob
    x, t, w = _inputs(n, c, dtype, weighted, ignore, n + c)
    rng = np.random.default_rng(n)
    go = (rng.standard_normal(n) if reduction == "none" else np.array(rng.standard_normal())).astype(dtype)
    args = (go, x, t) + ((w,) if weighted else ())
    got = L.cross_entropy_backward(*args, ignore_index=ignore, reduction=reduction, label_smoothing=eps,
                                   tile_kib=tile_kib)
    ref = ref_grad(go, x, t, w, ignore, reduction, eps)
    # each element is a difference of terms of size |g_i| * ((1-eps) w_t (p + 1) + eps / C (p W + w_c)):
    # bound the rounding error by them (|g_i| is grad_output, divided by the mean's denominator)
    ww = np.ones(c) if w is None else w.astype(np.float64)
    valid = t != ignore
    g = np.abs(go.astype(np.float64)) * np.ones(n)
    if reduction == "mean":
        with np.errstate(all="ignore"):
            g = g / max((ww[np.clip(t, 0, c - 1)] * valid).sum(), 1e-30)
    scale = float((g * valid).max(initial=0)) * 2 * (ww.max() + eps / c * (ww.sum() + ww.max()))
    _close(got, ref, dtype, magnitude=scale, what="grad")


def test_all_ignored_mean_is_nan_and_sum_is_zero():
    x = np.random.default_rng(0).standard_normal((6, 9)).astype(np.float32)
    t = np.full(6, -100, np.int32)
    assert np.isnan(L.cross_entropy(x, t))
    assert L.cross_entropy(x, t, reduction="sum") == 0
    np.testing.assert_array_equal(L.cross_entropy_backward(np.array(1.0, np.float32), x, t), np.zeros((6, 9)))


def test_long_rows_stream_in_chunks():
    """A vocabulary-sized row: column chunks merged online (forward), two reads (backward)."""
    x, t, _ = _inputs(130, 40_000, BF16, False, -100, 1)
    _close(L.cross_entropy(x, t, tile_kib=8), ref_loss(x, t, None, -100, "mean", 0.0), BF16, what="loss")
    go = np.array(0.5, BF16)
    ref = ref_grad(go, x, t, None, -100, "mean", 0.0)
    _close(L.cross_entropy_backward(go, x, t, tile_kib=8), ref, BF16, magnitude=np.abs(ref).max(), what="grad")


def test_argument_errors():
    x = np.zeros((4, 5), np.float32)
    t = np.zeros(4, np.int32)
    with pytest.raises(KernelError, match="int32"):
        L.cross_entropy(x, t.astype(np.int64))
    with pytest.raises(KernelError, match="reduction"):
        L.cross_entropy(x, t, reduction="avg")
    with pytest.raises(KernelError, match="weight"):
        L.cross_entropy(x, t, np.ones(4, np.float32))
    with pytest.raises(KernelError, match="grad_output"):
        L.cross_entropy_backward(np.zeros(4, np.float32), x, t)
