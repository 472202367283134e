"""nn.TransformerEncoderLayer / nn.MultiheadAttention's inference fast path on the device:
``_native_multi_head_attention`` and ``_transformer_encoder_layer_fwd`` (``model.eval()`` under no_grad or
inference_mode), which aten only implements for the CPU and CUDA.

Both are composed of the device's own ops (linear, matmul, softmax, layer_norm, gelu/relu), in aten's order:
q, k, v from the packed in-projection, softmax(q k^T / sqrt(head_dim) + mask) v per head, the out-projection;
the layer adds the residuals and norms before (``norm_first``) or after each block. Masks are aten's merged
ones: ``mask_type`` 0 an attention mask [T, S], 1 a key padding mask [B, S], 2 a merged [B, H, T, S]; True
(or -inf) masks a key out, so a row with every key masked is NaN, as on the CPU. Nested tensors (what
nn.TransformerEncoder makes of a padded batch) have no neuron layout: that input raises.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..core.checks import same_device


def _dense(op: str, t: torch.Tensor) -> None:
    if t.is_nested:
        raise NotImplementedError(f"{op}: nested tensors are not supported on neuron; pass a padded batch with a "
                                  f"key padding mask (nn.TransformerEncoder(enable_nested_tensor=False))")


def _mask(mask, mask_type, b: int, h: int, t: int, s: int):
    """aten's merged mask as an additive [B or 1, H or 1, T, S] tensor (None: no mask)."""
    if mask is None:
        return None
    if mask.dim() == 2 and (mask_type == 1 or (mask_type is None and mask.shape == (b, s) and (b, s) != (t, s))):
        mask = mask.view(b, 1, 1, s)  # key padding
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.float()


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


def attention(query, key, value, embed_dim: int, num_head: int, qkv_weight, qkv_bias, proj_weight, proj_bias,
              mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    op = "_native_multi_head_attention"
    for t in (query, key, value):
        _dense(op, t)
    same_device(query, key, value, qkv_weight, qkv_bias, proj_weight, proj_bias, mask)
    if not query.shape == key.shape == value.shape:
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")  # aten's own check
    if query.dim() != 3 or embed_dim % num_head or query.shape[-1] != embed_dim:
        raise ValueError(f"{op}: query must be [batch, seq, embed_dim={embed_dim}] with embed_dim divisible by "
                         f"num_head={num_head}, got {list(query.shape)}")
    w, bias = qkv_weight.chunk(3), qkv_bias.chunk(3)
    if query is key and key is value:  # self-attention: one packed projection
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        q, k, v = (F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), w, bias))
    b, t, s = query.shape[0], query.shape[1], key.shape[1]
    q, k, v = _heads(q, num_head), _heads(k, num_head), _heads(v, num_head)
    scores = torch.matmul(q / math.sqrt(embed_dim // num_head), k.transpose(-2, -1))
    m = _mask(mask, mask_type, b, num_head, t, s)
    if m is not None:
        scores = scores + m
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, embed_dim)
    out = F.linear(out, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, weights.mean(dim=1) if average_attn_weights else weights


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    return attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                     need_weights, average_attn_weights, mask_type)


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                                  norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    _dense("_transformer_encoder_layer_fwd", src)

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True,
                  mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    y = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    y = F.linear(y, ffn_weight_1, ffn_bias_1)
    y = F.linear(F.gelu(y) if use_gelu else F.relu(y), ffn_weight_2, ffn_bias_2) + x
    return y if norm_first else norm(y, norm_weight_2, norm_bias_2)


def nested_tensor_from_mask_left_aligned(t, mask):
    """Whether each row of ``mask`` (True: a real token) is a prefix of Trues: nn.TransformerEncoder's check
    before it packs a padded batch into a nested tensor."""
    same_device(t, mask)
    if mask.dim() != 2 or t.dim() != 3 or tuple(mask.shape) != tuple(t.shape[:2]):
        raise RuntimeError(f"_nested_tensor_from_mask_left_aligned: expected a [batch, seq] mask for a [batch, seq, "
                           f"embed] tensor, got mask {list(mask.shape)} and tensor {list(t.shape)}")
    m = mask.bool()
    return not bool((m[:, 1:] & ~m[:, :-1]).any().item())


def nested_tensor_from_mask(t, mask, mask_check=True):
    raise NotImplementedError(
        "nested tensors are not supported on neuron (nn.TransformerEncoder packs a padded batch into one on its "
        "fast path): build it with nn.TransformerEncoder(..., enable_nested_tensor=False), which runs the same "
        "fast path on the padded batch with src_key_padding_mask")
