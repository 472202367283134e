"""Normalization kernels (layer_norm, rms_norm, group_norm, forward and backward) against numpy references."""

import math
import os

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import language as nl
from neuron_kernels.library import norms
from neuron_kernels.library.norms import (
    group_norm,
    group_norm_backward,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)

SETTINGS = settings(max_examples=int(os.environ.get("NORMS_EXAMPLES", 25)), deadline=None)
BF16 = ml_dtypes.bfloat16
DTYPES = st.sampled_from([np.float32, BF16, np.float16])
# relative tolerance of one rounding to the dtype, with headroom for float32 accumulation order
RTOL = {np.dtype(np.float32): 2e-5, np.dtype(BF16): 1e-2, np.dtype(np.float16): 2e-3}


def f64(a):
    return np.asarray(a).astype(np.float64)


def close(out, ref, dtype, scale=None):
    """|out - ref| <= rtol * (|ref| + scale): scale is the size of the terms that cancel into ref."""
    rtol = RTOL[np.dtype(dtype)]
    ref = f64(ref)
    scale = np.abs(ref).max() if scale is None and ref.size else (scale or 0.0)
    np.testing.assert_allclose(f64(out), ref, rtol=rtol, atol=rtol * scale + 1e-30)


def data(rng, shape, dtype, loc=0.0, scale=1.0):
    return (rng.standard_normal(shape) * scale + loc).astype(dtype)


# ---- references (float64, from the definitions) ------------------------------------------------
def ln_ref(x, w, b, eps):
    x = f64(x)
    m = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)
    y = (x - m) * r
    y = y * f64(w) if w is not None else y
    y = y + f64(b) if b is not None else y
    return y, m, r


def rms_ref(x, w, eps):
    x = f64(x)
    r = 1 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    y = x * r
    return (y * f64(w) if w is not None else y), r


def norm_bwd_ref(dy, x, w, centered, eps):
    x, dy = f64(x), f64(dy)
    m = x.mean(-1, keepdims=True) if centered else 0.0
    var = ((x - m) ** 2).mean(-1, keepdims=True)
    r = 1 / np.sqrt(var + eps)
    xh = (x - m) * r
    g = dy * (f64(w) if w is not None else 1.0)
    dx = g - xh * (g * xh).mean(-1, keepdims=True)
    if centered:
        dx = dx - g.mean(-1, keepdims=True)
    d = x.shape[-1]
    return r * dx, (dy * xh).reshape(-1, d).sum(0), dy.reshape(-1, d).sum(0), m, r, np.abs(r * g).max(initial=0)


def _gn_rstd(xg, m, eps, var_dtype):
    """1 / sqrt(var + eps) in float64, the sum of squared deviations first rounded to ``var_dtype`` when given
    (beyond float32's range it is inf, and rstd 0)."""
    m2 = ((xg - m[..., None]) ** 2).sum(-1)
    if var_dtype is not None:
        with np.errstate(over="ignore"):
            m2 = m2.astype(var_dtype).astype(np.float64)
    return 1 / np.sqrt(m2 / xg.shape[-1] + eps)


def gn_ref(x, w, b, groups, eps, var_dtype=None):
    n, c = x.shape[:2]
    xg = f64(x).reshape(n, groups, -1)
    m = xg.mean(-1)
    r = _gn_rstd(xg, m, eps, var_dtype)
    y = ((xg - m[..., None]) * r[..., None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    y = y * f64(w).reshape(shape) if w is not None else y
    y = y + f64(b).reshape(shape) if b is not None else y
    return y, m, r


def gn_bwd_ref(dy, x, w, groups, eps, var_dtype=None):
    n, c = x.shape[:2]
    xg = f64(x).reshape(n, groups, -1)
    m = xg.mean(-1)
    r = _gn_rstd(xg, m, eps, var_dtype)
    xh = ((xg - m[..., None]) * r[..., None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    g = (f64(dy) * (f64(w).reshape(shape) if w is not None else 1.0)).reshape(n, groups, -1)
    xhg = xh.reshape(n, groups, -1)
    dx = r[..., None] * (g - g.mean(-1, keepdims=True) - xhg * (g * xhg).mean(-1, keepdims=True))
    axes = (0,) + tuple(range(2, x.ndim))
    scale = np.abs(r[..., None] * g).max(initial=0)
    return dx.reshape(x.shape), (f64(dy) * xh).sum(axes), f64(dy).sum(axes), m, r, scale


# ---- layer_norm / rms_norm forward ---------------------------------------------------------------
@SETTINGS
@given(st.integers(1, 300), st.integers(1, 700), DTYPES, st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_layer_norm_forward(rows, d, dtype, has_w, has_b, seed):
    rng = np.random.default_rng(seed)
    x = data(rng, (rows, d), dtype, loc=3.0, scale=2.0)
    w = data(rng, (d,), dtype) if has_w else None
    b = data(rng, (d,), dtype) if has_b else None
    out, mean, rstd = layer_norm(x, w, b, eps=1e-5)
    y, m, r = ln_ref(x, w, b, 1e-5)
    assert out.dtype == x.dtype and mean.dtype == np.float32 and mean.shape == (rows, 1) == rstd.shape
    # (x - mean) * rstd: the float32 rounding of mean (an ulp of |x|) is amplified by rstd
    wmax = np.abs(f64(w)).max() if has_w else 1.0
    close(out, y, dtype, scale=np.abs(y).max() + np.abs(f64(x)).max() * r.max() * wmax * 4)
    np.testing.assert_allclose(mean, m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd, r, rtol=1e-4)


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 700), DTYPES, st.booleans(), st.integers(0, 2**16))
def test_rms_norm_forward(rows, d, dtype, has_w, seed):
    rng = np.random.default_rng(seed)
    x = data(rng, (rows, d), dtype)
    w = data(rng, (d,), dtype) if has_w else None
    out, rstd = rms_norm(x, w, eps=1e-6)
    y, r = rms_ref(x, w, 1e-6)
    assert out.dtype == x.dtype and rstd.dtype == np.float32 and rstd.shape == (rows, 1)
    close(out, y, dtype)
    np.testing.assert_allclose(rstd, r, rtol=1e-4)


def test_forward_keeps_leading_dims_and_default_eps():
    rng = np.random.default_rng(1)
    x = data(rng, (2, 3, 5, 40), BF16)
    out, rstd = rms_norm(x)  # eps=None: float32's eps (the computation dtype's), as torch
    y, r = rms_ref(x, None, float(np.finfo(np.float32).eps))
    assert out.shape == x.shape and rstd.shape == (2, 3, 5, 1)
    close(out, y, BF16)
    one = np.array([[-0.5], [0.25]], BF16)  # D = 1: x / sqrt(x^2 + eps) shows the eps (bf16's would give -0.985)
    want = torch.nn.functional.rms_norm(torch.from_numpy(one.astype(np.float32)).bfloat16(), (1,))
    np.testing.assert_array_equal(rms_norm(one)[0].astype(np.float32), want.float().numpy())
    out, mean, rstd = layer_norm(x)
    assert out.shape == x.shape and mean.shape == (2, 3, 5, 1)


@pytest.mark.parametrize("rows,d,dtype", [(130, 9000, np.float32), (3, 20000, np.float32), (5, 12000, BF16)])
def test_long_rows_go_in_column_chunks(rows, d, dtype):
    rng = np.random.default_rng(d)
    x = data(rng, (rows, d), dtype, loc=5.0, scale=3.0)
    w, b = data(rng, (d,), dtype), data(rng, (d,), dtype)
    out, mean, rstd = layer_norm(x, w, b)
    y, m, r = ln_ref(x, w, b, 1e-5)
    close(out, y, dtype, scale=np.abs(y).max())
    np.testing.assert_allclose(mean, m, rtol=1e-5)
    np.testing.assert_allclose(rstd, r, rtol=1e-4)
    out, rstd = rms_norm(x, w, eps=1e-5)
    y, r = rms_ref(x, w, 1e-5)
    close(out, y, dtype)


def test_overflowing_placement_retraces_with_a_smaller_budget(monkeypatch):
    # an optimistic estimate of the pipeline's live tiles: the first placement overflows SBUF, the kernel
    # retraces with a smaller budget (column chunks) and stays correct
    monkeypatch.setitem(norms.DEPTH, "ln", {2: 0.2, 4: 0.2})
    rng = np.random.default_rng(6)
    x, w = data(rng, (1024, 8000), np.float32), data(rng, (8000,), np.float32)
    out, mean, rstd = layer_norm(x, w, None)
    y, m, r = ln_ref(x, w, None, 1e-5)
    close(out, y, np.float32, scale=np.abs(y).max())
    np.testing.assert_allclose(rstd, r, rtol=1e-4)


def test_layer_norm_variance_is_centered():
    # mean / std = 1e4: E[x^2] - mean^2 in float32 would lose every digit of the variance
    rng = np.random.default_rng(2)
    x = (1e4 + rng.standard_normal((64, 256))).astype(np.float32)
    out, mean, rstd = layer_norm(x)
    y, m, r = ln_ref(x, None, None, 1e-5)
    np.testing.assert_allclose(rstd, r, rtol=1e-3)
    np.testing.assert_allclose(out, y, atol=2e-3)


def test_empty_rows():
    out, mean, rstd = layer_norm(np.zeros((0, 8), np.float32))
    assert out.shape == (0, 8) and mean.shape == (0, 1)


def test_bad_weight_shape_is_a_trace_error():
    with pytest.raises(KernelError, match=r"rms_norm: weight shape \[5\] must be \[4\]"):
        rms_norm.trace(TensorSpec((8, 4), nl.float32), TensorSpec((5,), nl.float32))


# ---- layer_norm / rms_norm backward --------------------------------------------------------------
@SETTINGS
@given(st.integers(1, 260), st.integers(1, 600), DTYPES, st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_layer_norm_backward(rows, d, dtype, has_w, centered, seed):
    rng = np.random.default_rng(seed)
    x = data(rng, (rows, d), dtype, loc=1.0, scale=2.0)
    dy = data(rng, (rows, d), dtype)
    w = data(rng, (d,), dtype) if has_w else None
    dx, dw, db, m, r, scale = norm_bwd_ref(dy, x, w, centered, 1e-5)
    if centered:
        res = layer_norm_backward(dy, x, np.float32(m), np.float32(r), w, output_mask=(True, has_w, True))
    else:
        res = rms_norm_backward(dy, x, np.float32(r), w, output_mask=(True, has_w))
    res = list(res) if isinstance(res, tuple) else [res]
    close(res.pop(0), dx, dtype, scale=scale)
    if has_w:
        got = res.pop(0)
        assert got.dtype == w.dtype and got.shape == (d,)
        close(got, dw, dtype, scale=np.abs(f64(dy)).sum(0).max() * 4)
    if centered:
        close(res.pop(0), db, dtype, scale=np.abs(f64(dy)).sum(0).max())


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False), (False, True, True), (True, True, False)])
def test_layer_norm_backward_output_mask(mask):
    rng = np.random.default_rng(3)
    x, dy, w = data(rng, (150, 300), np.float32), data(rng, (150, 300), np.float32), data(rng, (300,), np.float32)
    dx, dw, db, m, r, scale = norm_bwd_ref(dy, x, w, True, 1e-5)
    res = layer_norm_backward(dy, x, np.float32(m), np.float32(r), w, output_mask=mask)
    res = list(res) if isinstance(res, tuple) else [res]
    expected = [(a, s) for a, s, f in zip((dx, dw, db), (scale, 100.0, 100.0), mask) if f]
    assert len(res) == len(expected)
    for got, (ref, s) in zip(res, expected):
        close(got, ref, np.float32, scale=s)


def test_backward_long_rows_and_empty():
    rng = np.random.default_rng(4)
    x, dy, w = data(rng, (7, 9000), np.float32), data(rng, (7, 9000), np.float32), data(rng, (9000,), np.float32)
    dx, dw, db, m, r, scale = norm_bwd_ref(dy, x, w, True, 1e-5)
    gx, gw, gb = layer_norm_backward(dy, x, np.float32(m), np.float32(r), w)
    close(gx, dx, np.float32, scale=scale)
    close(gw, dw, np.float32, scale=10.0)
    close(gb, db, np.float32, scale=10.0)
    e = np.zeros((0, 16), np.float32)
    gx, gw, gb = layer_norm_backward(e, e, np.zeros((0, 1), np.float32), np.zeros((0, 1), np.float32),
                                     np.ones(16, np.float32))
    assert gx.shape == (0, 16) and not gw.any() and not gb.any()


def test_grad_weight_needs_a_weight():
    spec = TensorSpec((8, 4), nl.float32)
    with pytest.raises(KernelError, match="grad_weight requested"):
        rms_norm_backward.trace(spec, spec, TensorSpec((8, 1), nl.float32))


# ---- grad_input epilogue: a residual added, a cast written --------------------------------------
def bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def check_epilogue(dy, x, w, centered, residual, cast):
    """The backward with residual/cast_dtype against the plain backward, then the add (float32, rounded once to
    grad_input's dtype) and the cast (round to nearest even) in numpy: the same bits; the other grads unchanged."""
    dx_ref, _, _, m, r, scale = norm_bwd_ref(dy, x, w, centered, 1e-5)
    m, r = np.float32(m), np.float32(r)
    if centered:
        mask = (True, w is not None, True)
        plain = layer_norm_backward(dy, x, m, r, w, output_mask=mask)
        fused = layer_norm_backward(dy, x, m, r, w, output_mask=mask, residual=residual, cast_dtype=cast)
    else:
        mask = (True, w is not None)
        plain = rms_norm_backward(dy, x, r, w, output_mask=mask)
        fused = rms_norm_backward(dy, x, r, w, output_mask=mask, residual=residual, cast_dtype=cast)
    plain = list(plain) if isinstance(plain, tuple) else [plain]
    fused = list(fused) if isinstance(fused, tuple) else [fused]
    close(plain[0], dx_ref, x.dtype, scale=scale)
    expect = plain[0] if residual is None else \
        (plain[0].astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
    got = fused.pop(0)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(bits(got), bits(expect))
    if cast is not None:
        got = fused.pop(0)
        assert got.dtype == np.dtype(cast) and got.shape == x.shape
        np.testing.assert_array_equal(bits(got), bits(expect.astype(cast)))
    assert len(fused) == len(plain) - 1
    for a, b in zip(fused, plain[1:]):
        np.testing.assert_array_equal(bits(a), bits(b))


CASTS = st.sampled_from([None, np.float32, BF16, np.float16])


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 200), DTYPES, DTYPES, CASTS, st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 2**16))
def test_backward_adds_a_residual_and_writes_a_cast(rows, d, dtype, res_dtype, cast, has_res, has_w, centered, seed):
    rng = np.random.default_rng(seed)
    x, dy = data(rng, (rows, d), dtype, loc=1.0, scale=2.0), data(rng, (rows, d), dtype)
    w = data(rng, (d,), dtype) if has_w else None
    residual = data(rng, (rows, d), res_dtype) if has_res or cast is None else None
    check_epilogue(dy, x, w, centered, residual, cast)


@pytest.mark.parametrize("rows,d,dtype,res_dtype,cast", [(130, 9000, np.float32, np.float32, BF16),
                                                         (3, 20000, BF16, np.float32, np.float16)])
def test_backward_epilogue_of_long_rows_in_column_chunks(rows, d, dtype, res_dtype, cast):
    rng = np.random.default_rng(d)
    x, dy, w = data(rng, (rows, d), dtype), data(rng, (rows, d), dtype), data(rng, (d,), dtype)
    check_epilogue(dy, x, w, True, data(rng, (rows, d), res_dtype), cast)


def test_backward_epilogue_errors():
    spec, stat = TensorSpec((8, 4), nl.float32), TensorSpec((8, 1), nl.float32)
    with pytest.raises(KernelError, match=r"residual \[8, 5\] must have input's shape \[8, 4\]"):
        layer_norm_backward.trace(spec, spec, stat, stat, residual=TensorSpec((8, 5), nl.float32))
    with pytest.raises(KernelError, match="residual is int32"):
        rms_norm_backward.trace(spec, spec, stat, residual=TensorSpec((8, 4), nl.int32))
    with pytest.raises(KernelError, match="cast_dtype is int32"):
        rms_norm_backward.trace(spec, spec, stat, cast_dtype=nl.int32)
    with pytest.raises(KernelError, match=r"output_mask\[0\] turns off"):
        layer_norm_backward.trace(spec, spec, stat, stat, TensorSpec((4,), nl.float32),
                                  output_mask=(False, True, True), cast_dtype=nl.bfloat16)


# ---- group_norm --------------------------------------------------------------------------------
GN_SHAPES = st.sampled_from([(2, 8, 25, 4), (3, 6, 7, 3), (4, 64, 100, 32), (2, 260, 9, 1), (2, 300, 3, 2),
                             (3, 130, 4, 65), (130, 2, 3, 1), (1, 4, 1, 2), (5, 32, 16, 8)])


@SETTINGS
@given(GN_SHAPES, DTYPES, st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_group_norm_forward(shape, dtype, has_w, has_b, seed):
    n, c, hw, groups = shape
    rng = np.random.default_rng(seed)
    x = data(rng, (n, c, hw), dtype, loc=2.0, scale=3.0)
    w = data(rng, (c,), dtype) if has_w else None
    b = data(rng, (c,), dtype) if has_b else None
    out, mean, rstd = group_norm(x, w, b, num_groups=groups, eps=1e-5)
    y, m, r = gn_ref(x, w, b, groups, 1e-5)
    assert mean.shape == (n, groups) and mean.dtype == np.float32
    # out = x * (rstd * w) + (b - mean * rstd * w): the terms are |x| * rstd * |w| large
    scale = (np.abs(f64(x)).max() * r.max() * (np.abs(f64(w)).max() if has_w else 1.0))
    close(out, y, dtype, scale=scale)
    np.testing.assert_allclose(mean, m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd, r, rtol=1e-4)


@SETTINGS
@given(GN_SHAPES, DTYPES, st.booleans(), st.integers(0, 2**16))
def test_group_norm_backward(shape, dtype, has_w, seed):
    n, c, hw, groups = shape
    rng = np.random.default_rng(seed)
    x = data(rng, (n, c, hw), dtype, loc=2.0, scale=3.0)
    dy = data(rng, (n, c, hw), dtype)
    w = data(rng, (c,), dtype) if has_w else None
    dx, dw, db, m, r, scale = gn_bwd_ref(dy, x, w, groups, 1e-5)
    res = group_norm_backward(dy, x, np.float32(m), np.float32(r), w, num_groups=groups,
                              output_mask=(True, has_w, True))
    res = list(res) if isinstance(res, tuple) else [res]
    close(res.pop(0), dx, dtype, scale=scale * 4)
    sums = np.abs(f64(dy)).sum(axis=(0, 2)).max()
    if has_w:
        close(res.pop(0), dw, dtype, scale=sums * 4)
    close(res.pop(0), db, dtype, scale=sums)


BAD = st.sampled_from([math.inf, -math.inf, math.nan, 1e20])


def torch_ref(fn, dtype, *arrays):
    """fn on CPU torch tensors of ``arrays`` (None stays None) in the kernel's dtype (float32 for bfloat16,
    which numpy and torch do not share); returns (out, input leaves) with gradients enabled."""
    tdt = torch.float32 if np.dtype(dtype) == np.dtype(BF16) else torch.from_numpy(np.zeros(0, dtype)).dtype
    leaves = [None if a is None else torch.tensor(f64(a), dtype=tdt, requires_grad=True) for a in arrays]
    return fn(*leaves), leaves


def same_specials(out, ref):
    """out has NaN, +inf and -inf exactly where ref has them."""
    out, ref = f64(out), f64(ref)
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(out), special(ref))


@SETTINGS
@given(GN_SHAPES, DTYPES, BAD, st.integers(0, 2**16))
@example((1, 4, 1, 2), np.float32, 1e20, 0)  # the CPU's rstd is NaN here, not 0
def test_group_norm_inf_stays_in_its_group(shape, dtype, bad, seed):
    """A non-finite (or overflowing) value makes only its own group NaN/0, as on the CPU: group sums never go
    through a 0/1 matmul (0 * inf = NaN in every group), forward and backward."""
    n, c, hw, groups = shape
    rng = np.random.default_rng(seed)
    clean, dy = data(rng, (n, c, hw), dtype, loc=2.0, scale=3.0), data(rng, (n, c, hw), dtype)
    w, b = data(rng, (c,), dtype), data(rng, (c,), dtype)
    x = clean.copy()
    with np.errstate(over="ignore"):  # 1e20 is inf in float16
        x[tuple(rng.integers(0, s) for s in x.shape)] = bad
    out, mean, rstd = group_norm(x, w, b, num_groups=groups, eps=1e-5)
    dx, dw, db = group_norm_backward(dy, x, mean, rstd, w, num_groups=groups)
    if np.isfinite(f64(x)).all():
        # a finite value whose group's sum of squared deviations overflows float32 (1e20 outside float16): the
        # kernel's saturates at inf, so rstd is 0 and the group's output its bias; the CPU's rstd is 0 or NaN by
        # how its vectorized moments split the group (NaN for [1, 4, 1] in 2 groups), so the reference is
        # float64 with that sum rounded to float32
        y = gn_ref(x, w, b, groups, 1e-5, var_dtype=np.float32)
        refs = (*y, *gn_bwd_ref(dy, x, w, groups, 1e-5, var_dtype=np.float32)[:3])
    else:
        y, leaves = torch_ref(lambda x, w, b: torch.native_group_norm(x, w, b, n, c, hw, groups, 1e-5), dtype,
                              x, w, b)
        y[0].backward(torch.tensor(f64(dy), dtype=y[0].dtype))
        refs = tuple(t.detach().numpy() for t in (*y, *(t.grad for t in leaves)))
    # tolerances as test_group_norm_forward / _backward's, from the terms of the finite input
    _, m, r = gn_ref(clean, w, b, groups, 1e-5)
    scale = gn_bwd_ref(dy, clean, w, groups, 1e-5)[-1]
    sums = np.abs(f64(dy)).sum(axis=(0, 2)).max()
    scales = (np.abs(f64(clean)).max() * r.max() * np.abs(f64(w)).max(), np.abs(m).max() + 1, r.max(), scale * 4,
              sums * 4, sums)
    for i, (got, ref, sc) in enumerate(zip((out, mean, rstd, dx, dw, db), refs, scales, strict=True)):
        fin = np.isfinite(ref)
        if i in (1, 2):  # the CPU's Welford mean of a group holding an inf is inf or NaN by where the inf sits
            np.testing.assert_array_equal(np.isfinite(f64(got)), fin)
        else:
            same_specials(got, ref)
        close(np.asarray(got)[fin], ref[fin], dtype, scale=sc)


def test_group_norm_long_spatial_and_wide_groups():
    rng = np.random.default_rng(5)
    for shape, groups in (((1, 4, 9000), 2), ((2, 256, 3000), 1)):
        x, dy = data(rng, shape, np.float32, loc=1.0), data(rng, shape, np.float32)
        w, b = data(rng, (shape[1],), np.float32), data(rng, (shape[1],), np.float32)
        out, mean, rstd = group_norm(x, w, b, num_groups=groups)
        y, m, r = gn_ref(x, w, b, groups, 1e-5)
        close(out, y, np.float32, scale=np.abs(y).max() * 4)
        dx, dw, db, m, r, scale = gn_bwd_ref(dy, x, w, groups, 1e-5)
        gx, gw, gb = group_norm_backward(dy, x, mean, rstd, w, num_groups=groups)
        close(gx, dx, np.float32, scale=scale * 4)
        close(gw, dw, np.float32, scale=np.abs(dw).max() * 4)
        close(gb, db, np.float32, scale=np.abs(db).max() * 4)


def test_group_norm_errors():
    with pytest.raises(KernelError, match="6 channels do not split into 4 groups"):
        group_norm.trace(TensorSpec((2, 6, 5), nl.float32), num_groups=4)
