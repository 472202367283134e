"""Convolutions (1-d, 2-d, transposed; stride, padding, dilation, groups, bias), pooling (max with indices,
average with its options, adaptive) and attention (scaled_dot_product_attention with masks, causal, scale,
grouped-query heads)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from .op import Op, magnitude
from .spec import Case
from .strategies import tensors

CONV_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SPATIAL = (1, 2, 3, 5, 7, 8, 13, 16, 31, 64)
CHANNELS = (1, 2, 3, 4, 8, 16, 129)


@st.composite
def _spatial(draw, cap, nd, per_point):
    out = []
    for _ in range(nd):
        budget = max(cap // max(per_point, 1), 1)
        out.append(draw(st.sampled_from([s for s in SPATIAL if s <= budget] or [1])))
        per_point *= out[-1]
    return tuple(out)


@st.composite
def _conv(draw, cap, nd, transposed):
    dtype = draw(st.sampled_from(CONV_DTYPES))
    groups = draw(st.sampled_from((1, 2, 3)))
    cin, cout = groups * draw(st.sampled_from(CHANNELS[:5])), groups * draw(st.sampled_from(CHANNELS[:5]))
    n = draw(st.sampled_from((1, 2, 0, 3)))
    spatial = draw(_spatial(cap, nd, n * cin))
    k = tuple(draw(st.sampled_from((1, 2, 3, 5))) for _ in range(nd))
    wshape = (cin, cout // groups) + k if transposed else (cout, cin // groups) + k
    ts = (draw(tensors((n, cin) + spatial, dtype)), draw(tensors(wshape, dtype)))
    if draw(st.booleans()):
        ts += (draw(tensors((cout,), dtype)),)
    p = {"stride": draw(st.sampled_from((1, 2, 3))), "padding": draw(st.sampled_from((0, 1, 2))),
         "dilation": draw(st.sampled_from((1, 2))), "groups": groups}
    if transposed and p["stride"] > 1:
        p["output_padding"] = draw(st.sampled_from((0, 1)))
    if _cpu_crashes(dtype, nd, transposed, spatial, k, p):
        p["dilation"] = 1
    return Case(ts, p)


def _cpu_crashes(dtype, nd, transposed, spatial, k, p) -> bool:
    """The CPU's float16 conv2d of a one-column image with a one-column kernel, stride 2+, padding 1+ and dilation
    2+ ends the process (a segmentation fault: `F.conv2d(torch.randn(1, 1, 3, 1).half(), torch.randn(1, 1, 1,
    1).half(), stride=2, padding=1, dilation=2)`), so the fuzzer does not draw it (docs/fuzz.md)."""
    return (dtype == torch.float16 and nd == 2 and not transposed and spatial[-1] == 1 and k[-1] == 1
            and p["stride"] >= 2 and p["padding"] >= 1 and p["dilation"] >= 2)


def _conv_fn(fn):
    return lambda x, w, b=None, **p: fn(x, w, b, **p)


def _conv_op(name, fn, nd, transposed):
    return Op(name, _conv_fn(fn), lambda cap: _conv(cap, nd, transposed), scale=magnitude(_conv_fn(fn)))


@st.composite
def _pool(draw, cap, nd, kind):
    dtype = draw(st.sampled_from(CONV_DTYPES))
    n, c = draw(st.sampled_from((1, 2, 0))), draw(st.sampled_from(CHANNELS))
    spatial = draw(_spatial(cap, nd, n * c))
    x = draw(tensors((n, c) + spatial, dtype))
    if kind == "adaptive":
        return Case((x,), {"output_size": tuple(draw(st.sampled_from((1, 2, 3, 5))) for _ in range(nd))})
    k = draw(st.sampled_from((1, 2, 3, 4)))
    p = {"kernel_size": k, "stride": draw(st.sampled_from((None, 1, 2, 3))),
         "padding": draw(st.sampled_from((0, 1, 2))), "ceil_mode": draw(st.booleans())}
    if kind == "max":
        p["dilation"] = draw(st.sampled_from((1, 2)))
    else:
        p["count_include_pad"] = draw(st.booleans())
        if nd == 2:
            p["divisor_override"] = draw(st.sampled_from((None, 3)))
    return Case((x,), p)


def _max_pool(fn):
    return lambda x, **p: tuple(fn(x, return_indices=True, **p))


def _pool_op(name, fn, nd, kind, **kw):
    return Op(name, fn, lambda cap: _pool(cap, nd, kind), **kw)


CONV = [
    _conv_op("conv1d", F.conv1d, 1, False),
    _conv_op("conv2d", F.conv2d, 2, False),
    _conv_op("conv_transpose1d", F.conv_transpose1d, 1, True),
    _conv_op("conv_transpose2d", F.conv_transpose2d, 2, True),
    _pool_op("max_pool1d", _max_pool(F.max_pool1d), 1, "max"),
    _pool_op("max_pool2d", _max_pool(F.max_pool2d), 2, "max"),
    _pool_op("avg_pool1d", lambda x, **p: F.avg_pool1d(x, **p), 1, "avg"),
    _pool_op("avg_pool2d", lambda x, **p: F.avg_pool2d(x, **p), 2, "avg"),
    _pool_op("adaptive_avg_pool1d", lambda x, **p: F.adaptive_avg_pool1d(x, **p), 1, "adaptive"),
    _pool_op("adaptive_avg_pool2d", lambda x, **p: F.adaptive_avg_pool2d(x, **p), 2, "adaptive"),
    _pool_op("adaptive_max_pool2d", lambda x, **p: tuple(F.adaptive_max_pool2d(x, return_indices=True, **p)), 2,
             "adaptive"),
]


@st.composite
def _sdpa(draw, cap):
    dtype = draw(st.sampled_from((torch.float32, torch.bfloat16, torch.float16, torch.float64)))
    b, h = draw(st.sampled_from((1, 2, 0))), draw(st.sampled_from((1, 2, 4)))
    kv_heads = draw(st.sampled_from(sorted({1, h})))
    lq, lk = draw(st.sampled_from((1, 2, 5, 16, 128, 129, 257))), draw(st.sampled_from((1, 3, 16, 128, 131, 300)))
    e = draw(st.sampled_from((1, 8, 16, 64, 128)))
    if b * h * max(lq, lk) * e > cap * 4:
        lq, lk = min(lq, 16), min(lk, 16)
    q = draw(tensors((b, h, lq, e), dtype))
    k, v = (draw(tensors((b, kv_heads, lk, e), dtype)) for _ in range(2))
    mask_kind = draw(st.sampled_from(("none", "causal", "bool", "float")))
    p = {"scale": draw(st.sampled_from((None, 0.5, 1e-3))), "enable_gqa": kv_heads != h}
    if mask_kind == "causal":
        p["is_causal"] = True
    ts = (q, k, v)
    if mask_kind in ("bool", "float"):
        mask_shape = draw(st.sampled_from(((lq, lk), (1, 1, lq, lk), (b, 1, lq, lk))))
        ts += (draw(tensors(mask_shape, torch.bool if mask_kind == "bool" else dtype)),)
    return Case(ts, p)


def _attention(q, k, v, mask=None, **p):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **p)


def _attention_scale(q, k, v, mask=None, **p):
    """sum_j p_ij |v_j|: the magnitude the rounding of the weights p (to the inputs' dtype, as flash kernels
    do before the product with v) is relative to."""
    return F.scaled_dot_product_attention(q, k, v.abs(), attn_mask=mask, **p)


def _attention_math(q, k, v, mask=None, scale=None, is_causal=False, enable_gqa=False):
    """The arbiter, written from the documented semantics (the CPU's fused kernel is not a faithful one: its
    running max skips a NaN score, so a NaN key gives 0): scores scaled as aten's math path scales them (q and k by
    sqrt(scale) each, so a large q . k does not overflow first); a boolean or causal mask *selects* the keys that
    take part (a masked key's inf or NaN score never meets the row, where aten's math path adds -inf to it and
    gets NaN), a float mask is added; a row with every score -inf gets zero weights, as torch's kernels give."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], -3) for t in (k, v))
    sc = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q * math.sqrt(sc)) @ (k * math.sqrt(sc)).transpose(-2, -1) if sc > 0 else (q * sc) @ k.transpose(-2, -1)
    keep = torch.ones(s.shape[-2:], dtype=torch.bool)
    if is_causal:
        keep = keep.tril()
    if mask is not None and mask.dtype == torch.bool:
        keep = keep & mask
    elif mask is not None:
        s = s + mask
    s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, -1).masked_fill((s == -math.inf).all(-1, keepdim=True), 0.0)
    return p @ v


ATTENTION = [Op("scaled_dot_product_attention", _attention, _sdpa, scale=_attention_scale, reference=_attention_math)]
