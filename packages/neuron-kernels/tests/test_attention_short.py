"""Short-sequence attention (Sq, Skv <= pmax) against PyTorch CPU scaled_dot_product_attention in float64.

Tolerances are test_attention.py's (the same kernels' contract). Layouts as torch_neuron's SDPA op passes them:
contiguous [B, H, S, D], and heads viewed out of a [B, S, 3, H, D] qkv projection (storage + ``layouts``);
outputs new or written in place (``out=``, ``dq=``, ``dk=``, ``dv=``).
"""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_contract import BAD, BWD_TOL, LSE_TOL, TOL, assert_close, check_future_key
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import TRN1, TRN2, get_driver, isa
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import language as nl
from neuron_kernels.library.attention import flash_attention_bwd, flash_attention_fwd
from neuron_kernels.library.attention_short import UNIT_HEADS, short_attention_bwd, short_attention_fwd

PMAX = TRN2.pmax


def grad_floors(do, q, k, v, scale):
    """dS = P * (dP - rowsum(dO * O)) cancels, so its rounding error is relative to scale |dO| |V| sqrt(D):
    dq and dk are compared relative to at least a tenth of that times |K| (|Q|), as in test_attention.py."""
    amax = [float(np.abs(x.astype(np.float64)).max()) for x in (q, k, v, do)]
    natural = abs(1 / np.sqrt(q.shape[-1]) if scale is None else scale) * amax[3] * amax[2] * np.sqrt(q.shape[-1])
    return {"dq": 0.1 * natural * amax[1], "dk": 0.1 * natural * amax[0], "dv": 0.0}


# -- reference: torch on the CPU in float64 ----------------------------------------------------------
def reference(q, k, v, do, scale, causal, mask):
    """(out, logsumexp, dq, dk, dv) of [BH, S, D] numpy inputs."""
    t = [torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(mask.astype(np.float64))
    out = F.scaled_dot_product_attention(*t, attn_mask=m, is_causal=causal, scale=scale)
    out.backward(torch.from_numpy(do.astype(np.float64)))
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    with torch.no_grad():
        s = t[0] @ t[1].transpose(-2, -1) * sc
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
        if m is not None:
            s = s + m
        lse = torch.logsumexp(s, -1)
    return tuple(x.detach().numpy() for x in (out, lse, t[0].grad, t[1].grad, t[2].grad))


# -- layouts -------------------------------------------------------------------------------------
def _projection(x):
    """[B, H, S, D] heads viewed out of a [B, S, 2, H, D] projection (the other half unrelated values, as a fused
    projection's other outputs): the storage the view spans (as torch_neuron passes it) and its element strides."""
    b, h, s, d = x.shape
    proj = np.full((b, s, 2, h, d), 7.0, x.dtype)
    proj[:, :, 0] = x.transpose(0, 2, 1, 3)
    strides = (s * 2 * h * d, d, 2 * h * d, 1)
    span = sum((n - 1) * st_ for n, st_ in zip((b, h, s, d), strides)) + 1
    return proj.reshape(-1)[:span].copy(), strides


def _bsh(b, h, s, d):
    """Element strides of [B, H, S, D] heads viewed out of a dense [B, S, H * D] tensor."""
    return (s * h * d, d, h * d, 1)


def _from_bsh(flat, b, h, s, d):
    return flat.reshape(b, s, h, d).transpose(0, 2, 1, 3).reshape(b * h, s, d)


# -- inputs --------------------------------------------------------------------------------------
@st.composite
def problems(draw):
    b, h = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 3, 4, 12]))
    sq = draw(st.sampled_from([1, 2, 64, 127, PMAX]) | st.integers(1, PMAX))
    skv = draw(st.sampled_from([1, 3, 64, 100, PMAX]) | st.integers(1, PMAX))
    d = draw(st.sampled_from([1, 8, 16, 32, 33, 64, 128]))
    dtype = np.dtype(draw(st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16])))
    variant = draw(st.sampled_from(["none", "causal", "mask", "mask_bcast", "mask_full"]))
    scale = draw(st.sampled_from([None, None, 0.3, -0.2, 0.0]))
    spread = draw(st.sampled_from([1.0, 3.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = (rng.standard_normal((b, h, sq, d)) * spread).astype(dtype)
    k, v = (rng.standard_normal((b, h, skv, d)).astype(dtype) for _ in range(2))
    do = rng.standard_normal((b, h, sq, d)).astype(dtype)
    mask = None
    if variant.startswith("mask"):
        shape = {"mask": (sq, skv), "mask_bcast": (1, sq, skv), "mask_full": (b * h, sq, skv)}[variant]
        mask = rng.standard_normal(shape).astype(draw(st.sampled_from([np.float32, dtype])))
        mask[rng.random(shape) < 0.2] = -np.inf
        mask[..., 0] = 0.0  # never a whole row
    return dict(q=q, k=k, v=v, do=do, mask=mask, causal=variant == "causal", scale=scale,
                layout=draw(st.sampled_from(["contiguous", "projection"])), in_place=draw(st.booleans()))


def _out_floor(q, k, v, scale, causal, mask) -> float:
    """max of sum_j p_j |v_j| over [BH, S, D] inputs: the forward's errors are relative to it (the weights are
    rounded to the inputs' dtype before P V), which an output that cancels to near 0 does not show."""
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, np.abs(v))]
    m = None if mask is None else torch.from_numpy(mask.astype(np.float64))
    return F.scaled_dot_product_attention(*t, attn_mask=m, is_causal=causal, scale=scale).abs().max().item()


def _check_forward(p, out, lse, ref, floor=0.0):
    dt = p["q"].dtype
    assert out.dtype == dt and lse.dtype == np.float32
    assert_close(out, ref[0], TOL[dt], "out", floor)
    np.testing.assert_allclose(lse, ref[1], rtol=0, atol=LSE_TOL[dt] * max(1.0, np.abs(ref[1]).max()))


def _check_backward(p, grads, ref, flat):
    dt = p["q"].dtype
    floors = grad_floors(flat["do"], flat["q"], flat["k"], flat["v"], p["scale"])
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref[2:]):
        assert g.dtype == dt
        if p["scale"] == 0 and name in ("dq", "dk"):
            np.testing.assert_array_equal(g, 0)
            continue
        assert_close(g, r, BWD_TOL[dt], name, floors[name])


@settings(max_examples=120, deadline=None)
@given(problems())
def test_forward_and_backward_match_torch(p):
    b, h, sq, d = p["q"].shape
    skv = p["k"].shape[2]
    flat = {n: p[n].reshape(b * h, -1, d) for n in ("q", "k", "v", "do")}
    ref = reference(flat["q"], flat["k"], flat["v"], flat["do"], p["scale"], p["causal"], p["mask"])
    kw = dict(scale=p["scale"], causal=p["causal"], mask=p["mask"])
    if p["layout"] == "contiguous":
        args, layouts = [flat["q"], flat["k"], flat["v"]], []
    else:
        views = [_projection(p[n]) for n in ("q", "k", "v")]
        args = [x for x, _ in views]
        layouts = [(n, p[n].shape, strides) for n, (_, strides) in zip(("q", "k", "v"), views)]
    if p["in_place"]:  # the output in a [B, S, H * D] layout, written in place
        out = np.full(b * sq * h * d, np.nan, p["q"].dtype)
        lse = short_attention_fwd(*args, **kw, layouts=tuple(layouts + [("out", (b, h, sq, d), _bsh(b, h, sq, d))]),
                                  out=out)
        out_heads = _from_bsh(out, b, h, sq, d)
    else:
        out_heads, lse = short_attention_fwd(*args, **kw, **({"layouts": tuple(layouts)} if layouts else {}))
    _check_forward(p, out_heads, lse, ref, _out_floor(flat["q"], flat["k"], flat["v"], p["scale"], p["causal"],
                                                      p["mask"]))

    # backward from this forward; grad_out and out as [B, S, H * D] layouts when in place
    if p["in_place"]:
        do = np.ascontiguousarray(p["do"].transpose(0, 2, 1, 3)).reshape(-1)
        grads_in = [np.full(b * n * h * d, np.nan, p["q"].dtype) for n in (sq, skv, skv)]
        blay = layouts + [("grad_out", (b, h, sq, d), _bsh(b, h, sq, d)), ("out", (b, h, sq, d), _bsh(b, h, sq, d))]
        blay += [(n, (b, h, s, d), _bsh(b, h, s, d)) for n, s in (("dq", sq), ("dk", skv), ("dv", skv))]
        if p["layout"] == "contiguous":
            blay += [(n, (b, h, s, d), (h * s * d, s * d, d, 1)) for n, s in (("q", sq), ("k", skv), ("v", skv))]
            args = [x.reshape(-1) for x in args]
        r = short_attention_bwd(do, *args, out, lse, **kw, layouts=tuple(blay), dq=grads_in[0], dk=grads_in[1],
                                dv=grads_in[2])
        assert r is None
        grads = [_from_bsh(g, b, h, s, d) for g, s in zip(grads_in, (sq, skv, skv))]
    else:
        grads = short_attention_bwd(flat["do"], *args, out_heads, lse, **kw,
                                    **({"layouts": tuple(layouts)} if layouts else {}))
    _check_backward(p, grads, ref, flat)


@pytest.mark.parametrize("first, second", [("flash", "short"), ("short", "flash")])
@pytest.mark.parametrize("variant", ["causal", "mask"])
def test_logsumexp_interoperates_with_flash(first, second, variant):
    """The forward of one kernel family feeds the backward of the other."""
    rng = np.random.default_rng(7)
    bh, sq, skv, d = 6, 100, 77, 32
    q, do = (rng.standard_normal((bh, sq, d)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((bh, skv, d)).astype(np.float32) for _ in range(2))
    mask = None
    if variant == "mask":
        mask = rng.standard_normal((bh, sq, skv)).astype(np.float32)
        mask[rng.random(mask.shape) < 0.3] = -np.inf
        mask[..., 0] = 0.0
    kw = dict(causal=variant == "causal", mask=mask, scale=-0.4)
    fwd = {"flash": flash_attention_fwd, "short": short_attention_fwd}
    bwd = {"flash": flash_attention_bwd, "short": short_attention_bwd}
    out, lse = fwd[first](q, k, v, **kw)
    grads = bwd[second](do, q, k, v, out, lse, **kw)
    p = dict(q=q, scale=-0.4)
    ref = reference(q, k, v, do, -0.4, kw["causal"], mask)
    _check_forward(p, out, lse, ref)
    _check_backward(p, grads, ref, dict(q=q, k=k, v=v, do=do))
    out2, lse2 = fwd[second](q, k, v, **kw)
    np.testing.assert_allclose(lse2, lse, rtol=0, atol=1e-5 * max(1.0, np.abs(lse).max()))


def test_more_batch_heads_than_partitions():
    """Logsumexps leave in blocks of pmax batch-heads; units never straddle a block."""
    rng = np.random.default_rng(8)
    b, h, s, d = 33, 4, 5, 8  # 132 batch-heads: a full block and a partial one
    q, k, v, do = (rng.standard_normal((b * h, s, d)).astype(np.float32) for _ in range(4))
    out, lse = short_attention_fwd(q, k, v, causal=True)
    ref = reference(q, k, v, do, None, True, None)
    p = dict(q=q, scale=None)
    _check_forward(p, out, lse, ref)
    _check_backward(p, short_attention_bwd(do, q, k, v, out, lse, causal=True), ref, dict(q=q, k=k, v=v, do=do))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_trn1(dtype):
    """NC-v2: ScalarE copies by activation (no tensor_copy there), a smaller SBUF."""
    rng = np.random.default_rng(10)
    q, k, v, do = (rng.standard_normal((12, 64, 32)).astype(dtype) for _ in range(4))
    out, lse = short_attention_fwd(q, k, v, causal=True, driver=get_driver("sim", TRN1))
    grads = short_attention_bwd(do, q, k, v, out, lse, causal=True, driver=get_driver("sim", TRN1))
    p = dict(q=q, scale=None)
    ref = reference(q, k, v, do, None, True, None)
    _check_forward(p, out, lse, ref)
    _check_backward(p, grads, ref, dict(q=q, k=k, v=v, do=do))


@pytest.mark.parametrize("how", ["mask", "inputs"])
def test_rows_of_only_minus_inf_scores_give_zeros_like_flash(how):
    """A query whose scores are all -inf (a mask row of -inf, or -inf from the inputs: q . k = -inf for every key)
    gives a zero output, as torch does, and backward recomputes zero probabilities for it (no NaN in any
    gradient); the other rows are the reference's."""
    rng = np.random.default_rng(9)
    q, k, v, do = (rng.standard_normal((2, 16, 8)).astype(np.float32) for _ in range(4))
    mask = np.zeros((16, 16), np.float32)
    if how == "mask":
        mask[3] = -np.inf
    else:
        q[:, 3], k[:, :, 0] = 0.0, np.abs(k[:, :, 0]) + 0.5
        q[:, 3, 0] = -np.inf
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    ref = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(mask))
    ref.backward(torch.tensor(do))
    grads = [t.grad.numpy() for t in (tq, tk, tv)] if how == "mask" else [tv.grad.numpy()]
    for fwd, bwd in ((short_attention_fwd, short_attention_bwd), (flash_attention_fwd, flash_attention_bwd)):
        out, lse = fwd(q, k, v, mask=mask)
        assert (out[:, 3] == 0).all(), fwd.name
        np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-4, atol=1e-5)
        got = bwd(do, q, k, v, out, lse, mask=mask)
        for g, r in zip(got if how == "mask" else got[2:], grads):  # dq, dk with -inf inputs: 0 * inf on the CPU too
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5, err_msg=bwd.name)


def _dmas(kernel, *args, **kw):
    prog = kernel.trace(*args, profile=TRN2, **kw)
    return sum(isinstance(i, isa.DmaCopy) for i in prog.instructions)


def test_one_dma_per_operand_per_unit():
    """The point of these kernels: GPT-sized heads (B=8, H=4, S=64, D=32) in a few DMAs, not several per head."""
    x = TensorSpec((32, 64, 32), nl.bfloat16)
    lse = TensorSpec((32, 64), nl.float32)
    fwd, bwd = _dmas(short_attention_fwd, x, x, x, causal=True), _dmas(short_attention_bwd, x, x, x, x, x, lse)
    units = -(-32 // UNIT_HEADS)
    assert fwd <= 4 * units + 1 and bwd <= 8 * units + 1, (fwd, bwd)  # per unit q, k, v, out (+ do, o, dk, dv); lse
    assert 4 * fwd < _dmas(flash_attention_fwd, x, x, x, causal=True)
    assert 4 * bwd < _dmas(flash_attention_bwd, x, x, x, x, x, lse)


def test_rejected_inputs_name_the_limit():
    f32 = nl.float32
    long, short = TensorSpec((2, PMAX + 1, 32), f32), TensorSpec((2, 64, 32), f32)
    with pytest.raises(KernelError, match=f"Sq={PMAX + 1} > {PMAX}"):
        short_attention_fwd.trace(long, short, short, profile=TRN2)
    with pytest.raises(KernelError, match=f"Skv={PMAX + 1} > {PMAX}"):
        short_attention_fwd.trace(short, long, long, profile=TRN2)
    with pytest.raises(KernelError, match=f"Skv={PMAX + 1} > {PMAX}"):
        short_attention_bwd.trace(short, short, long, long, short, TensorSpec((2, 64), f32), profile=TRN2)
    with pytest.raises(KernelError, match="head dim 160"):
        short_attention_fwd.trace(*(TensorSpec((1, 8, 160), f32),) * 3, profile=TRN2)
    with pytest.raises(KernelError, match="logsumexp must be"):
        short_attention_bwd.trace(short, short, short, short, short, TensorSpec((2, 64), nl.bfloat16), profile=TRN2)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.sampled_from([2, 8, 33, 64, 127, 128]), st.sampled_from([16, 64]),
       st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16]),
       st.sampled_from(BAD), st.integers(0, 2**16))
def test_causal_inf_in_a_future_key_stays_masked(bh, s, d, dtype, bad, seed):
    """A non-finite (or huge) key element reaches no query before it, as on the CPU: the causal mask selects -inf
    (an added -inf made inf - inf = NaN of the earlier queries' rows)."""
    check_future_key(short_attention_fwd, short_attention_bwd, bh, s, d, dtype, bad, seed)
