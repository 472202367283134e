"""Flash attention forward / backward against a float64 numpy reference of torch's scaled_dot_product_attention."""

import ml_dtypes
import numpy as np
import pytest
from attention_contract import BAD, BWD_TOL, LSE_TOL, TOL, assert_close, check_future_key
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import TRN1, TRN2, get_driver, isa
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import language as nl
from neuron_kernels.library.attention import flash_attention_bwd, flash_attention_fwd

SETTINGS = settings(max_examples=100, deadline=None)
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
# -- reference (float64) -------------------------------------------------------------------------
def _scores(q, k, scale, causal, mask):
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    sc = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bqd,bkd->bqk", q64, k64) * sc
    if causal:  # top-left aligned, as torch's is_causal: query i sees keys 0..i
        s = np.where(np.tril(np.ones(s.shape[1:], bool)), s, -np.inf)
    if mask is not None:
        s = s + mask.astype(np.float64)
    return s, sc


def ref_forward(q, k, v, scale=None, causal=False, mask=None):
    s, _ = _scores(q, k, scale, causal, mask)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    l_ = e.sum(-1, keepdims=True)
    return np.einsum("bqk,bkd->bqd", e / l_, v.astype(np.float64)), (m + np.log(l_))[..., 0]


def ref_backward(do, q, k, v, scale=None, causal=False, mask=None):
    s, sc = _scores(q, k, scale, causal, mask)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    do64, v64 = do.astype(np.float64), v.astype(np.float64)
    o = np.einsum("bqk,bkd->bqd", p, v64)
    dv = np.einsum("bqk,bqd->bkd", p, do64)
    ds = p * (np.einsum("bqd,bkd->bqk", do64, v64) - (do64 * o).sum(-1, keepdims=True))
    dq = np.einsum("bqk,bkd->bqd", ds, k.astype(np.float64)) * sc
    dk = np.einsum("bqk,bqd->bkd", ds, q.astype(np.float64)) * sc
    return dq, dk, dv


def grad_floors(do, q, k, v, scale):
    """dS = P * (dP - rowsum(dO * O)) cancels (exactly, with one key), so its rounding error is relative to
    |dO| |V| sqrt(D): dq and dk are compared relative to at least a tenth of scale * that * |K| (or |Q|)."""
    amax = [float(np.abs(x.astype(np.float64)).max()) for x in (q, k, v, do)]
    sc = abs(1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    natural = sc * amax[3] * amax[2] * np.sqrt(q.shape[-1])
    return {"dq": 0.1 * natural * amax[1], "dk": 0.1 * natural * amax[0], "dv": 0.0}


# -- inputs --------------------------------------------------------------------------------------
@st.composite
def problems(draw):
    bh = draw(st.integers(1, 3))
    sq = draw(st.sampled_from([1, 2, 64, 127, 128, 129, 200, 256, 300]) | st.integers(1, 300))
    skv = draw(st.sampled_from([1, 3, 128, 129, 255, 300]) | st.integers(1, 300))
    d = draw(st.sampled_from([16, 64, 128, 8, 33]))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    variant = draw(st.sampled_from(["none", "causal", "mask", "mask_bcast", "mask_full"]))
    scale = draw(st.sampled_from([None, None, 0.3, -0.2]))
    spread = draw(st.sampled_from([1.0, 3.0]))  # 3: peaky softmax, large score ranges
    chunk = draw(st.sampled_from([128, 256, 1024]))  # small chunks: several online-softmax steps per row
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((bh, sq, d)) * spread).astype(dtype)
    k = rng.standard_normal((bh, skv, d)).astype(dtype)
    v = rng.standard_normal((bh, skv, d)).astype(dtype)
    do = rng.standard_normal((bh, sq, d)).astype(dtype)
    mask = None
    if variant.startswith("mask"):
        shape = {"mask": (sq, skv), "mask_bcast": (1, sq, skv), "mask_full": (bh, sq, skv)}[variant]
        mask = rng.standard_normal(shape).astype(draw(st.sampled_from([np.float32, dtype])))
        mask[rng.random(shape) < 0.2] = -np.inf  # masked-out keys, never a whole row
        if skv:
            mask[..., 0] = 0.0
    return dict(q=q, k=k, v=v, do=do, mask=mask, causal=variant == "causal", scale=scale, chunk=chunk)


@SETTINGS
@given(problems())
def test_forward_matches_reference(p):
    out, lse = flash_attention_fwd(p["q"], p["k"], p["v"], scale=p["scale"], causal=p["causal"], mask=p["mask"],
                                   kv_chunk=p["chunk"])
    ref_out, ref_lse = ref_forward(p["q"], p["k"], p["v"], p["scale"], p["causal"], p["mask"])
    dt = p["q"].dtype
    assert out.dtype == dt and lse.dtype == np.float32
    assert_close(out, ref_out, TOL[dt], "out")
    tol = LSE_TOL[dt] * max(1.0, np.abs(ref_lse).max())
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=tol)


@SETTINGS
@given(problems(), st.sampled_from([128, 256, 512]), st.sampled_from([None, False]))
def test_backward_matches_reference(p, block, resident):
    """resident=False: the streaming path long sequences take, here on short ones."""
    args = (p["q"], p["k"], p["v"])
    out, lse = flash_attention_fwd(*args, scale=p["scale"], causal=p["causal"], mask=p["mask"])
    dq, dk, dv = flash_attention_bwd(p["do"], *args, out, lse, scale=p["scale"], causal=p["causal"], mask=p["mask"],
                                     kv_block=block, resident=resident)
    ref = ref_backward(p["do"], *args, p["scale"], p["causal"], p["mask"])
    dt = p["q"].dtype
    tol = BWD_TOL[dt]
    floors = grad_floors(p["do"], *args, p["scale"])
    for name, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert g.dtype == dt
        if p["scale"] == 0 and name in ("dq", "dk"):
            np.testing.assert_array_equal(g, 0)
            continue
        assert_close(g, r, tol, name, floors[name])


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.sampled_from([2, 8, 64, 128, 129, 200, 300]), st.sampled_from([16, 64]),
       st.sampled_from(DTYPES), st.sampled_from(BAD), st.integers(0, 2**16))
def test_causal_inf_in_a_future_key_stays_masked(bh, s, d, dtype, bad, seed):
    """A non-finite (or huge) key element reaches no query before it, as on the CPU: the causal mask selects -inf
    (an added -inf made inf - inf = NaN of the earlier queries' rows)."""
    check_future_key(flash_attention_fwd, flash_attention_bwd, bh, s, d, dtype, bad, seed)


def test_online_softmax_rescales_when_later_keys_dominate():
    """Scores grow by ~60 per 128-key chunk: exp without the running max would overflow fp32."""
    rng = np.random.default_rng(0)
    q = np.ones((1, 130, 32), np.float32)
    k = rng.standard_normal((1, 700, 32)).astype(np.float32) * 0.1
    k += (60 / np.sqrt(32) * np.arange(700) / 128)[None, :, None].astype(np.float32)  # q.k / sqrt(32) ramps up
    v = rng.standard_normal((1, 700, 32)).astype(np.float32)
    # fp32 rounding of scores this large (|s| ~ 330) moves each probability by ~eps * |s| (conditioning)
    tol = TOL[np.dtype(np.float32)] + 4 * np.finfo(np.float32).eps * 330
    for chunk in (128, 512):
        out, lse = flash_attention_fwd(q, k, v, kv_chunk=chunk)
        ref_out, ref_lse = ref_forward(q, k, v)
        assert ref_lse.max() > 300
        assert_close(out, ref_out, tol, f"out (chunk {chunk})")
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    out, lse = flash_attention_fwd(q, k[:, ::-1].copy(), v[:, ::-1].copy(), kv_chunk=128)  # decreasing scores
    assert_close(out, ref_forward(q, k[:, ::-1], v[:, ::-1])[0], tol, "out (decreasing)")


def test_causal_rows_without_future_keys_and_sq_ne_skv():
    """Top-left alignment with more queries than keys and more keys than queries."""
    rng = np.random.default_rng(1)
    for sq, skv in ((300, 140), (140, 300), (1, 5)):
        q, do = (rng.standard_normal((2, sq, 64)).astype(np.float32) for _ in range(2))
        k, v = (rng.standard_normal((2, skv, 64)).astype(np.float32) for _ in range(2))
        out, lse = flash_attention_fwd(q, k, v, causal=True)
        ref_out, ref_lse = ref_forward(q, k, v, causal=True)
        assert_close(out, ref_out, TOL[np.dtype(np.float32)], f"out {sq}x{skv}")
        grads = flash_attention_bwd(do, q, k, v, out, lse, causal=True)
        floors = grad_floors(do, q, k, v, None)
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref_backward(do, q, k, v, causal=True)):
            assert_close(g, r, BWD_TOL[np.dtype(np.float32)], f"{name} {sq}x{skv}", floors[name])
        if skv > sq:  # keys no query sees get exactly zero gradient
            np.testing.assert_array_equal(grads[1][:, sq:], 0)
            np.testing.assert_array_equal(grads[2][:, sq:], 0)


def _random_qkv(rng, bh, sq, skv, d, dtype, spread=1.0):
    q = (rng.standard_normal((bh, sq, d)) * spread).astype(dtype)
    k, v = (rng.standard_normal((bh, skv, d)).astype(dtype) for _ in range(2))
    return q, k, v


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.sampled_from([1, 127, 200, 300]), st.sampled_from([5, 255, 256, 513, 700, 1100]),
       st.sampled_from([16, 64, 128]), st.sampled_from(DTYPES), st.sampled_from(["none", "causal", "mask"]),
       st.sampled_from([0.0, 0.3, 1.0]), st.sampled_from([256, 512, 1024, 2048]), st.integers(0, 2**32 - 1))
def test_forward_dma_and_tensor_engine_transposes(bh, sq, skv, d, dtype, variant, share, chunk, seed):
    """Every split of the P^T transposes between the DMA engines and TensorE (dma_share), every key chunk."""
    rng = np.random.default_rng(seed)
    q, k, v = _random_qkv(rng, bh, sq, skv, d, dtype, spread=3.0)
    mask = None
    if variant == "mask":
        mask = rng.standard_normal((sq, skv)).astype(np.float32)
        mask[rng.random((sq, skv)) < 0.2] = -np.inf
        mask[:, 0] = 0.0
    causal = variant == "causal"
    out, lse = flash_attention_fwd(q, k, v, causal=causal, mask=mask, kv_chunk=chunk, dma_share=share)
    ref_out, ref_lse = ref_forward(q, k, v, None, causal, mask)
    dt = np.dtype(dtype)
    assert_close(out, ref_out, TOL[dt], "out")
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=LSE_TOL[dt] * max(1.0, np.abs(ref_lse).max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["none", "causal"])
def test_forward_without_dma_transpose_uses_tensor_engine(dtype, variant):
    """trn1 has no DMA transpose: every transpose (K^T, Q^T, P^T) goes through TensorE."""
    rng = np.random.default_rng(3)
    q, k, v = _random_qkv(rng, 2, 300, 700, 64, dtype)
    driver = get_driver("sim", TRN1)
    out, lse = flash_attention_fwd(q, k, v, causal=variant == "causal", driver=driver)
    ref_out, ref_lse = ref_forward(q, k, v, causal=variant == "causal")
    dt = np.dtype(dtype)
    assert_close(out, ref_out, TOL[dt], "out")
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=LSE_TOL[dt] * max(1.0, np.abs(ref_lse).max()))
    x = TensorSpec((1, 512, 64), nl.bfloat16)
    prog = flash_attention_fwd.trace(x, x, x, profile=TRN1)
    assert not any(isinstance(i, isa.DmaTranspose) for i in prog.instructions)
    assert any(isinstance(i, isa.DmaTranspose) for i in flash_attention_fwd.trace(x, x, x, profile=TRN2).instructions)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [40.0, -40.0, 1e-3, 0.05])
def test_forward_large_and_tiny_scales(scale, dtype):
    """Outside GEXP_SCALES every exp stays on ScalarE; inside, GpSimd's powers of e^scale match it."""
    rng = np.random.default_rng(4)
    q, k, v = _random_qkv(rng, 1, 200, 600, 32, dtype, spread=1.0 if abs(scale) > 1 else 30.0)
    out, lse = flash_attention_fwd(q, k, v, scale=scale)
    ref_out, ref_lse = ref_forward(q, k, v, scale)
    dt = np.dtype(dtype)
    # score rounding (|s| ~ 100s) moves each probability by ~eps * |s| (conditioning), as in the rescale test
    tol = TOL[dt] + 4 * np.finfo(np.float32).eps * np.abs(ref_lse).max()
    assert_close(out, ref_out, tol, "out")
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=LSE_TOL[dt] * max(1.0, np.abs(ref_lse).max()))


def _matmul_count(kernel, *args, **kw):
    prog = kernel.trace(*args, profile=TRN2, **kw)
    return sum(isinstance(i, isa.Matmul) for i in prog.instructions)


def test_causal_skips_fully_masked_blocks():
    x = TensorSpec((1, 2048, 128), nl.bfloat16)
    lse = TensorSpec((1, 2048), nl.float32)
    for kernel, args in ((flash_attention_fwd, (x, x, x)), (flash_attention_bwd, (x, x, x, x, x, lse))):
        full, causal = _matmul_count(kernel, *args), _matmul_count(kernel, *args, causal=True)
        assert causal < 0.6 * full, (kernel.name, causal, full)


def test_psum_and_sbuf_fit_at_bench_shapes():
    x = TensorSpec((2, 4096, 128), nl.bfloat16)
    for causal in (False, True):
        prog = flash_attention_fwd.trace(x, x, x, causal=causal, profile=TRN2)
        assert prog.meta["psum_bytes"] <= TRN2.psum_partition_bytes
    x = TensorSpec((1, 2048, 128), nl.float32)
    flash_attention_bwd.trace(x, x, x, x, x, TensorSpec((1, 2048), nl.float32), profile=TRN2)


@pytest.mark.parametrize("dtype, skv", [(nl.bfloat16, 48000), (nl.float32, 24000)])
def test_forward_fits_the_documented_key_lengths(dtype, skv):
    q, kv = TensorSpec((1, 256, 128), dtype), TensorSpec((1, skv, 128), dtype)
    for kw in ({}, {"causal": True}, {"mask": TensorSpec((256, skv), nl.float32)}):
        prog = flash_attention_fwd.trace(q, kv, kv, profile=TRN2, **kw)
        assert prog.meta["sbuf_bytes"] <= TRN2.sbuf_partition_bytes


def test_rejected_inputs_name_the_problem():
    f32, bf16 = nl.float32, nl.bfloat16
    q = TensorSpec((2, 64, 32), f32)
    with pytest.raises(KernelError, match="head dim 160"):
        flash_attention_fwd.trace(*(TensorSpec((1, 8, 160), f32),) * 3)
    with pytest.raises(KernelError, match="causal=True or a mask"):
        flash_attention_fwd.trace(q, q, q, causal=True, mask=TensorSpec((64, 64), f32))
    with pytest.raises(KernelError, match="mask must be"):
        flash_attention_fwd.trace(q, q, q, mask=TensorSpec((3, 64, 64), f32))
    with pytest.raises(KernelError, match="share one of"):
        flash_attention_fwd.trace(q, q, TensorSpec((2, 64, 32), bf16))
    with pytest.raises(KernelError, match="k and v must be"):
        flash_attention_fwd.trace(q, TensorSpec((2, 64, 16), f32), TensorSpec((2, 64, 16), f32))
    with pytest.raises(KernelError, match="empty input"):
        flash_attention_fwd.trace(*(TensorSpec((2, 0, 32), f32),) * 3)
    with pytest.raises(KernelError, match="logsumexp must be"):
        flash_attention_bwd.trace(q, q, q, q, q, TensorSpec((2, 64), bf16))
