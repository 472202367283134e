"""nn.TransformerEncoderLayer and nn.MultiheadAttention's inference fast path (torch._transformer_encoder_layer_fwd,
torch._native_multi_head_attention) on neuron against the CPU's own fast path: same module, same weights, no CPU
fallback (strict mode), and the device time charged to the fast-path op."""

import pytest
import torch
from torch import nn
from torch_neuron_testing.native import native


def _fast_path_ran(op: str) -> bool:
    return torch.neuron.metrics()["device_ns"].get(op, 0) > 0


def _padding(b: int, t: int) -> torch.Tensor:
    pad = torch.zeros(b, t, dtype=torch.bool)
    pad[0, -2:] = True
    return pad


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masked", ["none", "key_padding", "attn_mask"])
def test_transformerencoderlayer_fastpath(norm_first, activation, masked):
    torch.manual_seed(0)
    b, t, d = 3, 7, 16
    layer = nn.TransformerEncoderLayer(d, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first).eval()
    x = torch.randn(b, t, d)
    kwargs = {}
    if masked == "key_padding":
        kwargs["src_key_padding_mask"] = _padding(b, t)
    elif masked == "attn_mask":
        kwargs["src_mask"] = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    with torch.no_grad():
        want = layer(x, **kwargs)
        dev = layer.to("neuron")
        torch.neuron.reset_metrics()
        with native():
            got = dev(x.to("neuron"), **{k: v.to("neuron") for k, v in kwargs.items()})
    assert _fast_path_ran("_transformer_encoder_layer_fwd")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_multiheadattention_fastpath(need_weights, average):
    """nn.MultiheadAttention takes the fast path for self-attention with an even number of heads."""
    torch.manual_seed(1)
    b, t, d = 2, 6, 12
    mha = nn.MultiheadAttention(d, 4, batch_first=True).eval()
    q = torch.randn(b, t, d)
    pad = torch.zeros(b, t, dtype=torch.bool)
    pad[1, :3] = True
    with torch.inference_mode():
        want = mha(q, q, q, key_padding_mask=pad, need_weights=need_weights, average_attn_weights=average)
        qd = q.to("neuron")
        dev = mha.to("neuron")
        torch.neuron.reset_metrics()
        with native():
            got = dev(qd, qd, qd, key_padding_mask=pad.to("neuron"), need_weights=need_weights,
                      average_attn_weights=average)
    assert _fast_path_ran("_native_multi_head_attention")
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-4, atol=1e-4)
    if need_weights:
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-4, atol=1e-5)
    else:
        assert got[1] is None and want[1] is None


@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
def test_native_multi_head_attention_cross_and_masks(mask_type):
    """The op itself: separate key/value (three projections) and each of aten's mask kinds."""
    torch.manual_seed(3)
    b, t, s, d, h = 2, 5, 5, 8, 2
    q, k, v = torch.randn(b, t, d), torch.randn(b, s, d), torch.randn(b, s, d)
    w, bias, pw, pb = torch.randn(3 * d, d), torch.randn(3 * d), torch.randn(d, d), torch.randn(d)
    shapes = {0: (t, s), 1: (b, s), 2: (b, h, t, s)}
    mask = None if mask_type is None else torch.rand(shapes[mask_type]) > 0.7
    if mask is not None:
        mask.view(-1, s)[:, 0] = False  # a row with every key masked is NaN on both
    args = (d, h, w, bias, pw, pb, mask, True, False, mask_type)
    want = torch._native_multi_head_attention(q, k, v, *args)
    dev = [a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args]
    with native():
        got = torch._native_multi_head_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), *dev)
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g.cpu(), w_, rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="shapes to match"):
        torch._native_multi_head_attention(q.to("neuron"), k[:, 1:].to("neuron"), v.to("neuron"), *dev)


def test_transformerencoder_nested_tensor_raises_clearly():
    """nn.TransformerEncoder packs a padded batch into a nested tensor on its fast path; neuron has no nested
    layout: a clear error saying how to avoid it, and that way (enable_nested_tensor=False) matches the CPU."""
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x, pad = torch.randn(2, 5, 8), _padding(2, 5)
    nested = nn.TransformerEncoder(layer, 2).eval().to("neuron")
    with torch.no_grad(), pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
        nested(x.to("neuron"), src_key_padding_mask=pad.to("neuron"))
    plain = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        want = plain.cpu()(x, src_key_padding_mask=pad)
        with native():
            got = plain.to("neuron")(x.to("neuron"), src_key_padding_mask=pad.to("neuron"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,aligned", [([[1, 1, 0], [1, 0, 0]], True), ([[1, 0, 1], [1, 1, 1]], False),
                                          ([[0, 0, 0], [1, 1, 1]], True)])
def test_nested_tensor_from_mask_left_aligned(rows, aligned):
    mask = torch.tensor(rows, dtype=torch.bool)
    t = torch.randn(2, 3, 4)
    assert torch._nested_tensor_from_mask_left_aligned(t, mask) is aligned
    with native():
        assert torch._nested_tensor_from_mask_left_aligned(t.to("neuron"), mask.to("neuron")) is aligned
