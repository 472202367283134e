"""scaled_dot_product_attention on the neuron device against PyTorch CPU, forward and backward: the
``_fused_sdp_choice`` stub routes fitting calls (plain, causal, float and boolean masks, any lengths,
custom scales, 3-d and 4-d inputs, bf16/fp16) to the flash-attention kernels through
``_scaled_dot_product_fused_attention_overrideable``; the rest (dropout, head dims > 128, grouped-query
heads, masks that need a gradient) take aten's math decomposition."""

import math

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"
FUSED, MATH = 4, 0  # at::SDPBackend
FWD, BWD = "scaled_dot_product_attention", "scaled_dot_product_attention_backward"
TOL = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
       torch.float16: dict(rtol=5e-3, atol=5e-3)}


def native_calls(op):
    return torch.neuron.metrics()["native"].get(op, 0)


def run_both(q, k, v, grad=True, **kw):
    """SDPA of float32 CPU references of q, k, v (rounded to their dtype) and of device copies: outputs and,
    when ``grad``, the gradients of q, k, v for a random output gradient."""
    cpu = [t.float().clone().requires_grad_(grad) for t in (q, k, v)]
    dev = [t.to(DEV).requires_grad_(grad) for t in (q, k, v)]
    mask = kw.pop("attn_mask", None)
    want = F.scaled_dot_product_attention(*cpu, attn_mask=mask, **kw)
    got = F.scaled_dot_product_attention(*dev, attn_mask=None if mask is None else mask.to(DEV), **kw)
    if not grad:
        return got, want, None, None
    g = torch.randn_like(want).to(q.dtype)
    want.backward(g.float())
    got.backward(g.to(DEV))
    return got, want, [t.grad for t in dev], [t.grad for t in cpu]


def close(got, want, dtype):
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])


CASES = {  # name: (q shape, kv shape, kwargs)
    "plain": ((2, 3, 17, 16), (2, 3, 17, 16), {}),
    "cross_lengths": ((2, 2, 9, 32), (2, 2, 140, 32), {}),
    "causal": ((1, 4, 130, 64), (1, 4, 130, 64), {"is_causal": True}),
    "causal_short_keys": ((1, 2, 12, 8), (1, 2, 7, 8), {"is_causal": True}),
    "scale": ((2, 2, 10, 16), (2, 2, 10, 16), {"scale": 0.7}),
    "negative_scale": ((1, 2, 10, 16), (1, 2, 10, 16), {"scale": -0.2}),
    "three_d": ((3, 20, 24), (3, 33, 24), {}),
    "head_dim_128": ((1, 2, 40, 128), (1, 2, 40, 128), {"is_causal": True}),
    "many_tiny_heads": ((2, 48, 12, 8), (2, 48, 12, 8), {}),  # the backward's key blocks overflowed SBUF
}


@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_routes_to_the_flash_kernels_and_matches_cpu(case):
    torch.manual_seed(0)
    qs, kvs, kw = CASES[case]
    q, k, v = torch.randn(qs), torch.randn(kvs), torch.randn(kvs)
    assert torch._fused_sdp_choice(q.to(DEV), k.to(DEV), v.to(DEV), **kw) == FUSED
    fwd, bwd = native_calls(FWD), native_calls(BWD)
    got, want, dgrads, cgrads = run_both(q, k, v, **kw)
    assert native_calls(FWD) == fwd + 1 and native_calls(BWD) == bwd + 1
    close(got, want, torch.float32)
    for d, c in zip(dgrads, cgrads):
        close(d, c, torch.float32)


@pytest.mark.parametrize("mask_shape", [(17, 20), (1, 1, 17, 20), (2, 1, 17, 20), (2, 3, 17, 20), (3, 1, 20)])
@pytest.mark.parametrize("boolean", [False, True])
def test_masks_broadcast_like_torch(mask_shape, boolean):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 17, 16), torch.randn(2, 3, 20, 16), torch.randn(2, 3, 20, 16)
    if boolean:
        mask = torch.rand(mask_shape) > 0.3
        mask[..., 0] = True  # every query keeps a key (a row with none gives NaN on both sides)
    else:
        mask = torch.randn(mask_shape)
    fwd = native_calls(FWD)
    got, want, dgrads, cgrads = run_both(q, k, v, attn_mask=mask)
    assert native_calls(FWD) == fwd + 1
    close(got, want, torch.float32)
    for d, c in zip(dgrads, cgrads):
        close(d, c, torch.float32)


@pytest.mark.parametrize("kind", ["finfo_min", "boolean"])
def test_rows_with_every_key_masked_match_cpu(kind):
    """Hugging Face masks use finfo.min as minus infinity (the kernel divides the mask by the scale: it must not
    overflow to -inf and give NaN); a boolean mask's all-False row gives zeros and zero gradients on the CPU."""
    torch.manual_seed(6)
    q, k, v = torch.randn(2, 2, 7, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    if kind == "boolean":
        mask = torch.rand(2, 1, 7, 9) > 0.3
        mask[0, :, 2] = False
        mask[1, :, 5] = False
    else:
        mask = torch.zeros(2, 1, 7, 9)
        mask[0, :, 2] = torch.finfo(torch.float32).min
        mask[1, :, 4, 3:] = torch.finfo(torch.float32).min
    fwd = native_calls(FWD)
    got, want, dgrads, cgrads = run_both(q, k, v, attn_mask=mask)
    assert native_calls(FWD) == fwd + 1
    close(got, want, torch.float32)
    for d, c in zip(dgrads, cgrads):
        close(d, c, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e20])
@pytest.mark.parametrize("shape, kw", [((1, 1, 4, 8), {}), ((1, 2, 200, 32), {}), ((1, 2, 9, 160), {}),
                                       ((1, 4, 9, 16), {"enable_gqa": True})])  # short, flash, wide, grouped
def test_causal_inf_in_a_future_key_stays_masked(dtype, bad, shape, kw):
    """A non-finite (or huge) element of key j reaches no query before j, as on the CPU, whose causal kernel
    fills future scores with -inf: an added -inf once made inf - inf = NaN of the earlier queries' rows. The
    output is non-finite exactly where the CPU's is; the earlier queries' gradients match where the CPU's
    are finite (its dS K also meets the bad column with 0)."""
    torch.manual_seed(0)
    kv = (shape[0], shape[1] // 2 if kw else shape[1], *shape[2:])
    q, k, v = torch.randn(shape).to(dtype), torch.randn(kv).to(dtype), torch.randn(kv).to(dtype)
    j = shape[2] - 2
    k[0, 0, j, 0] = bad
    got, want, grads, wants = run_both(q, k, v, is_causal=True, **kw)
    torch.testing.assert_close(got.cpu().float(), want.detach(), equal_nan=True, **TOL[dtype])
    dq, want_dq = grads[0].cpu().float()[..., :j, :], wants[0][..., :j, :]
    fin = torch.isfinite(want_dq)
    torch.testing.assert_close(dq[fin], want_dq[fin], **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qs, kvs, kw", [((1, 2, 40, 160), (1, 2, 40, 160), {}), ((2, 3, 30, 256), (2, 3, 17, 256), {}),
                                         ((2, 4, 20, 16), (2, 2, 20, 16), {"enable_gqa": True}),
                                         ((1, 6, 9, 144), (1, 2, 12, 144), {"enable_gqa": True})])
def test_causal_calls_the_kernels_cannot_take_match_cpu(dtype, qs, kvs, kw):
    """Causal calls with head dims > 128 or grouped-query heads take the overrideable op's decomposition (future
    keys selected to -inf), not aten's math path (which adds a -inf bias): forward and backward as on the CPU."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(s).to(dtype) for s in (qs, kvs, kvs))
    assert torch._fused_sdp_choice(q.to(DEV), k.to(DEV), v.to(DEV), is_causal=True, **kw) == FUSED
    got, want, dgrads, cgrads = run_both(q, k, v, is_causal=True, **kw)
    close(got, want, dtype)
    for d, c in zip(dgrads, cgrads):
        close(d, c, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 2, 7, 16), (1, 2, 150, 32)])  # the short-sequence and the flash kernels
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}])
def test_rows_whose_scores_are_all_minus_inf_give_zeros(dtype, shape, kw):
    """No mask: a query whose q . k is -inf for every key (q = -inf in a dimension where every key is positive)
    gives a zero output and zero value gradients, as torch's CPU kernel does, not NaN (exp(-inf - -inf) once made
    the kernels' probabilities NaN); the other rows match."""
    torch.manual_seed(8)
    q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
    k[..., 0] = k[..., 0].abs() + 0.5
    q[0, 1, 3] = 0.0
    q[0, 1, 3, 0] = -math.inf
    got, want, grads, wants = run_both(q, k, v, **kw)
    assert (got.cpu()[0, 1, 3] == 0).all()
    close(got, want, dtype)
    close(grads[2], wants[2], dtype)  # dQ, dK meet 0 * inf on the CPU as well


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e20])
@pytest.mark.parametrize("shape", [(2, 2, 7, 16), (1, 2, 150, 32)])  # the short-sequence and the flash kernels
def test_masked_rows_made_nan_by_an_inf_input_stay_nan(dtype, bad, shape):
    """With a mask, a query row that an inf or NaN input makes NaN stays NaN (forward and backward), as on the CPU;
    only rows whose mask drops every key become zeros. The op once told those rows by a NaN logsumexp, so an
    input's NaN silently became a zero output."""
    torch.manual_seed(7)
    b, h, s, d = shape
    q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
    q[0, 1, 3, 2] = bad
    mask = torch.rand(b, 1, s, s) > 0.3
    mask[..., 0] = True
    mask[-1, :, 5] = False  # every key dropped: zeros on both
    got, want, grads, wants = run_both(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got.cpu().float(), want.detach(), equal_nan=True, **TOL[dtype])
    for name, g, w in zip("qkv", grads, wants):
        g = g.cpu().float()
        if name == "k" and bad == 1e20:  # dK = dS^T Q: 1e20 times dS's rounding on either side; finite where the CPU's
            assert torch.equal(torch.isfinite(g), torch.isfinite(w))
            continue
        torch.testing.assert_close(g, w, equal_nan=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_inputs(dtype):
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 2, 64, 32, dtype=dtype) for _ in range(3))
    got, want, dgrads, cgrads = run_both(q, k, v, is_causal=True)
    assert got.dtype == dtype
    close(got, want, dtype)
    for d, c in zip(dgrads, cgrads):
        close(d, c, dtype)


def test_non_contiguous_heads_from_a_projection():
    torch.manual_seed(3)
    b, s, h, d = 2, 24, 4, 8
    qkv = torch.randn(b, s, 3 * h * d)
    split = lambda t: [x.view(b, s, h, d).transpose(1, 2) for x in t.split(h * d, dim=2)]
    want = F.scaled_dot_product_attention(*split(qkv), is_causal=True)
    fwd = native_calls(FWD)
    qkv_d = qkv.to(DEV).requires_grad_()
    got = F.scaled_dot_product_attention(*split(qkv_d), is_causal=True)
    assert native_calls(FWD) == fwd + 1
    close(got, want, torch.float32)
    # the output (and the gradients) have the layout aten gives: the query's, so this view works as on the CPU
    assert got.stride() == want.stride()
    got.transpose(1, 2).view(b, s, h * d).sum().backward()
    assert qkv_d.grad.shape == qkv.shape


def _heads_of_layouts(kind, b, s, h, d, dtype):
    """A leaf tensor and q, k, v viewed out of it as models do: split or unbound from a fused projection, separate
    dense projections (Hugging Face), or keys and values broadcast over heads."""
    torch.manual_seed(5)
    if kind == "split":
        base = torch.randn(b, s, 3 * h * d, dtype=dtype)
        return base, lambda t: [x.view(b, s, h, d).transpose(1, 2) for x in t.split(h * d, dim=2)]
    if kind == "unbind":
        base = torch.randn(b, s, 3 * h * d, dtype=dtype)
        return base, lambda t: t.view(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    if kind == "dense":
        base = torch.randn(3, b, s, h * d, dtype=dtype)
        return base, lambda t: [x.view(b, s, h, d).transpose(1, 2) for x in t]
    base = torch.randn(b, s, 3 * d, dtype=dtype)  # one key/value head broadcast to h
    return base, lambda t: [x.view(b, s, 1, d).transpose(1, 2).expand(b, h, s, d) for x in t.split(d, dim=2)]


@pytest.mark.parametrize("kind", ["split", "unbind", "dense", "broadcast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": True}], ids=["plain", "causal", "mask"])
def test_heads_in_any_layout_are_read_and_written_in_place(kind, dtype, kw):
    """q, k, v with contiguous rows go to the kernels as they are (no layout copy before them), the output comes
    in the layout aten gives it and the gradients in their inputs' layouts where those are dense."""
    b, s, h, d = 2, 40, 3, 16
    base, heads = _heads_of_layouts(kind, b, s, h, d, dtype)
    kw = dict(kw)
    mask = torch.randn(s, s, dtype=dtype) if kw.pop("mask", False) else None
    cpu = base.float().clone().requires_grad_()
    want = F.scaled_dot_product_attention(*heads(cpu), attn_mask=None if mask is None else mask.float(), **kw)
    g = torch.randn_like(want)
    want.backward(g)
    dev = base.clone().to(DEV).requires_grad_()
    q, k, v = heads(dev)
    g_dev, mask_dev = g.to(dtype).to(DEV), None if mask is None else mask.to(DEV)
    copies = torch.neuron.metrics()["native"].get("copy_", 0)
    fwd, bwd = native_calls(FWD), native_calls(BWD)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_dev, **kw)
    dq, dk, dv = torch.autograd.grad(got, (q, k, v), g_dev, retain_graph=True)
    assert (native_calls(FWD), native_calls(BWD)) == (fwd + 1, bwd + 1)
    if mask is None:  # (aten pads and expands a mask itself before the kernels)
        assert torch.neuron.metrics()["native"].get("copy_", 0) == copies  # nothing copied to another layout
    assert got.stride() == F.scaled_dot_product_attention(*heads(base), **kw).stride()
    for grad, x in zip((dq, dk, dv), (q, k, v)):
        if is_dense(x) and x.stride(1) != 0:
            assert grad.stride() == x.stride()
    close(got, want, dtype)
    got.backward(g_dev)
    close(dev.grad, cpu.grad, dtype)


def is_dense(t):
    return t.numel() == 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) and 0 not in t.stride()


UNFUSED = {
    "dropout": ((1, 2, 8, 16), (1, 2, 8, 16), {"dropout_p": 0.5}),
    "head_dim_256": ((1, 1, 8, 256), (1, 1, 8, 256), {}),
    "grouped_query": ((1, 4, 8, 16), (1, 2, 8, 16), {"enable_gqa": True}),
    "broadcast_batch": ((2, 2, 8, 16), (1, 2, 8, 16), {}),
}


@pytest.mark.parametrize("case", list(UNFUSED))
def test_calls_the_kernels_cannot_take_use_the_math_path(case):
    torch.manual_seed(4)
    qs, kvs, kw = UNFUSED[case]
    q, k, v = torch.randn(qs), torch.randn(kvs), torch.randn(kvs)
    assert torch._fused_sdp_choice(q.to(DEV), k.to(DEV), v.to(DEV), **kw) == MATH
    fwd = native_calls(FWD)
    if case == "dropout":  # random: check the shape and that kept entries are rescaled, not the values
        got = F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), **kw)
        assert got.shape == qs and torch.isfinite(got.cpu()).all()
    else:
        got, want, _, _ = run_both(q, k, v, grad=False, **kw)
        close(got, want, torch.float32)
    assert native_calls(FWD) == fwd


def test_a_mask_that_needs_a_gradient_uses_the_math_path():
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    mask = torch.randn(6, 6).to(DEV).requires_grad_()
    assert torch._fused_sdp_choice(q.to(DEV), k.to(DEV), v.to(DEV), mask) == MATH


def test_transformer_encoder_layer_matches_cpu():
    torch.manual_seed(5)
    cpu = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    dev = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(DEV).eval()
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 10, 32)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(10)
    want = cpu(x, src_mask=causal, is_causal=True)
    fwd = native_calls(FWD)
    got = dev(x.to(DEV), src_mask=causal.to(DEV), is_causal=True)
    assert native_calls(FWD) == fwd + 1
    close(got, want.detach(), torch.float32)


# every head dim 1..256 (fused up to 128, math above), lengths q != k on both sides of a 128-query tile,
# batch / head counts, masks and causal: forward and backward match CPU whichever path a shape takes.
# Tiny head dims once overflowed the backward's per-load query tile group (D = 1..3 float32, 1..7 16-bit).
SWEEP = [  # (batch, heads, Sq, Skv, D, kwargs)
    (1, 2, 3, 3, 1, {}), (2, 1, 5, 9, 2, {"is_causal": True}), (1, 3, 300, 140, 3, {}),
    (2, 2, 130, 7, 4, {"mask": (130, 7)}), (1, 1, 7, 260, 5, {"mask": (1, 1, 7, 260)}),
    (3, 2, 129, 129, 7, {"is_causal": True}), (1, 2, 64, 200, 8, {"bool_mask": (64, 200)}),
    (2, 3, 1, 1, 15, {}), (1, 1, 257, 31, 33, {"scale": 0.3}), (2, 2, 40, 600, 64, {"mask": (2, 2, 40, 600)}),
    (1, 2, 200, 128, 100, {"is_causal": True}), (1, 1, 33, 65, 127, {}), (2, 1, 129, 70, 128, {}),
    (1, 2, 20, 30, 129, {"is_causal": True}), (1, 1, 17, 9, 200, {"mask": (17, 9)}), (2, 1, 12, 12, 256, {}),
]


def _sweep_kwargs(kw):
    kw = dict(kw)
    if "mask" in kw:
        kw["attn_mask"] = torch.randn(kw.pop("mask"))
    if "bool_mask" in kw:
        mask = torch.rand(kw.pop("bool_mask")) > 0.5
        mask[..., 0] = True  # every query keeps a key
        kw["attn_mask"] = mask
    return kw


@pytest.mark.parametrize("b, h, sq, skv, d, kw", SWEEP, ids=[f"{c[:5]}-{sorted(c[5])}" for c in SWEEP])
def test_shape_sweep_forward_and_backward_match_cpu(b, h, sq, skv, d, kw):
    torch.manual_seed(d)
    q, k, v = torch.randn(b, h, sq, d), torch.randn(b, h, skv, d), torch.randn(b, h, skv, d)
    got, want, dgrads, cgrads = run_both(q, k, v, **_sweep_kwargs(kw))
    close(got, want, torch.float32)
    for dg, cg in zip(dgrads, cgrads):
        close(dg, cg, torch.float32)


@pytest.mark.parametrize("d", [1, 3, 7])
def test_tiny_head_dims_in_sixteen_bits(d):
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 2, 150, d, dtype=torch.bfloat16) for _ in range(3))
    bwd = native_calls(BWD)
    got, want, dgrads, cgrads = run_both(q, k, v, is_causal=True)
    assert native_calls(BWD) == bwd + 1
    close(got, want, torch.bfloat16)
    for dg, cg in zip(dgrads, cgrads):
        close(dg, cg, torch.bfloat16)


@pytest.mark.parametrize("mask_shape", [(2, 3, 70, 90), (70, 90), (1, 3, 1, 90)])
def test_overrideable_backward_gives_the_mask_gradient(mask_shape):
    """The fused op called directly with a float bias that needs a gradient (as aten's own op tests do): dq, dk, dv
    from the kernels and d(bias) summed to the bias's broadcast shape, against CPU autograd of the math path."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, s, 32) for s in (70, 90, 90))
    bias = torch.randn(mask_shape)
    g = torch.randn(2, 3, 70, 32)
    cpu = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3])
    want.backward(g)
    dev = [t.to(DEV) for t in (q, k, v, bias)]
    dev[3].requires_grad_()
    with torch.no_grad():
        out, lse, csq, csk, mq, mk, seed, offset, _ = \
            torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*dev[:3], attn_bias=dev[3])
    torch.testing.assert_close(out.cpu(), want.detach(), **TOL[torch.float32])

    def backward(mask):
        return torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
            g.to(DEV), *dev, mask, out, lse, csq, csk, mq, mk, dropout_p=0.0, is_causal=False,
            philox_seed=seed, philox_offset=offset)

    grads = backward([True, True, True, True])
    assert grads[3].shape == bias.shape
    for got, ref in zip(grads, cpu):
        torch.testing.assert_close(got.cpu(), ref.grad, **TOL[torch.float32])
    assert backward([True, True, True, False])[3] is None
