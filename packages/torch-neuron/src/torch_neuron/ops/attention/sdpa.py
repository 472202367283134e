"""Scaled dot product attention on the fused flash-attention kernels.

``F.scaled_dot_product_attention`` (CompositeImplicit) asks the ``_fused_sdp_choice`` DispatchStub of the
query's device which backend to use; the C++ core registers the stub's PrivateUse1 entry, which calls
:func:`sdp_choice` here. It answers ``overrideable`` when the flash kernels fit (same float dtype for q,
k, v, head dim <= 128 shared by q, k and v, equal batch and head counts, no dropout, no gradient wanted
for the mask, lengths the kernels hold in SBUF) and aten then calls
``_scaled_dot_product_fused_attention_overrideable`` (flash_attention_fwd: output and logsumexp) and, in
backward, ``..._overrideable_backward`` (flash_attention_bwd: dq, dk, dv). Otherwise it answers ``math``:
aten's own decomposition (bmm, softmax, ...) on the other native ops, except causal calls the kernels cannot
take only for their head dim (> 128) or grouped-query heads: aten's math adds a -inf bias above the diagonal,
so a future key's +inf or NaN score would make inf - inf = NaN of every earlier query; those take the
overrideable op as a float32 decomposition that selects -inf (``_wide_forward`` / ``_wide_backward``), as
torch's CPU kernel fills them. Queries and keys that each fit one tile
(pmax rows) take the short-sequence kernels instead (attention_short: same contract, every head of a batch
element per DMA), as the flash kernels are bound by their per-head DMAs there.

Layouts: q, k, v (and in the backward grad_out and out) whose rows are contiguous are read in place, in any
batch/head strides (heads viewed out of a [B, S, H * D] projection, heads broadcast by stride 0): the kernels take
the storage such a tensor spans and its [B, H, S, D] strides. The output is written in the layout aten's meta
gives it, and each gradient in its input's layout where that input is dense (else contiguous), so the
autograd of the heads' view needs no copy either.

Masks: aten turns a boolean mask into an additive float one before calling the op; the kernel takes
[Sq, Skv] or [BH, Sq, Skv], so a mask broadcast over batch and heads is passed as its [Sq, Skv] plane and
other broadcasts are materialized. ``is_causal`` is top-left aligned in both torch and the kernel.

Masked rows as torch has them: the kernel divides the mask by the scale, so the finite "minus infinity" of
Hugging Face masks (``finfo.min``) would overflow to -inf; mask entries below ``finfo(float32).min * scale / 4``
are raised to that floor first (exp of either is 0 next to any unmasked key; a row of nothing but such entries
stays uniform, as on the CPU). A row whose keys are all -inf (a boolean mask's False) gives a zero output and
zero gradients, as torch's CPU and CUDA kernels do: its logsumexp is set to +inf, which makes every
probability the backward kernel recomputes for it exp(-inf) = 0.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import attention as kattn
from neuron_kernels.library import attention_short as kshort

from ...runtime import runtime
from ..core.checks import constant, in_layout, meta_result, same_device
from ..core.copy import storage_span
from ..core.dtypes import FLOATS
from ..core.launch import run
from ..core.variants import contig
from ..pointwise.base import is_non_overlapping_and_dense

aten = torch.ops.aten
MATH, OVERRIDEABLE = 0, 4  # at::SDPBackend
MAX_HEAD_DIM = 128  # one contraction tile (attention kernel docstring)
MAX_SEQ = 16384  # well inside the kernels' SBUF limits (~24K keys fp32 forward, ~40K queries backward)


def _fits(q, k, v, mask, dropout_p, enable_gqa, max_head_dim=MAX_HEAD_DIM, groups=False) -> bool:
    if any(t.is_nested for t in (q, k, v)) or dropout_p > 0.0:
        return False
    if q.dim() not in (3, 4) or not (q.dim() == k.dim() == v.dim()):
        return False
    if q.dtype not in FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    d = q.shape[-1]
    if not (0 < d <= max_head_dim and k.shape[-1] == d and v.shape[-1] == d):
        return False
    if not (q.shape[:-2] == k.shape[:-2] or groups and _grouped(q, k)) or k.shape[:-1] != v.shape[:-1]:
        return False  # broadcast batches, grouped-query heads (but for the decomposition): math
    sq, skv = q.shape[-2], k.shape[-2]
    if not (0 < sq <= MAX_SEQ and 0 < skv <= MAX_SEQ and q.numel()):
        return False
    if mask is not None:
        if mask.dtype != torch.bool and not mask.is_floating_point():
            return False
        try:
            torch.broadcast_shapes(mask.shape, (*q.shape[:-1], skv))
        except RuntimeError:
            return False
    return True


def _grouped(q, k) -> bool:
    """[B, Hq, S, D] queries sharing [B, Hk, S, D] keys in groups of Hq / Hk heads (enable_gqa)."""
    return q.dim() == 4 and q.shape[0] == k.shape[0] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0


def _causal_wide(q, k, v, mask, dropout_p, is_causal, enable_gqa=True) -> bool:
    """A causal call the kernels take but for its head dim (> 128) or grouped-query heads: the overrideable op runs
    it as a decomposition (``_wide_forward``) rather than aten's math path, which adds a -inf bias above the
    diagonal: a future key's +inf or NaN score then makes inf - inf = NaN of every earlier query (torch's CPU
    kernel fills them). aten passes the overrideable op no enable_gqa: grouped heads there were asked for."""
    return bool(is_causal) and mask is None and _fits(q, k, v, None, dropout_p, False, max_head_dim=1 << 30,
                                                       groups=enable_gqa)


def sdp_choice(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> int:
    """The backend scaled_dot_product_attention uses for neuron tensors (called by the C++ stub)."""
    fused = _fits(q, k, v, mask, dropout_p, enable_gqa) or _causal_wide(q, k, v, mask, dropout_p, is_causal,
                                                                         enable_gqa)
    # a mask that needs a gradient: aten's math path (the overrideable backward computes it by a float32
    # decomposition, for direct calls of the op)
    return OVERRIDEABLE if fused and (mask is None or not mask.requires_grad) else MATH


def fused_sdp_choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    return sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _heads(t: torch.Tensor, name: str, layouts: list) -> torch.Tensor:
    """[B, H, S, D] or [H, S, D] as the kernels read it: contiguous as [B*H, S, D]; in place when its rows are
    contiguous (heads split out of a [B, S, H * D] projection, batch or heads broadcast by stride 0): the storage
    it spans, with its sizes and strides appended to ``layouts``; other strides copied to contiguous."""
    if t.is_contiguous() or t.stride(-1) != 1:
        return contig(t).reshape(-1, *t.shape[-2:])
    lead = ((1,), (0,)) if t.dim() == 3 else ((), ())
    layouts.append((name, lead[0] + tuple(t.shape), lead[1] + tuple(t.stride())))
    return storage_span(t)


def _scale(q, scale) -> float:
    return abs(scale) if scale is not None else q.shape[-1] ** -0.5


def _floored(mask, s):
    """Entries below the floor the kernel's division by the scale ``s`` survives, raised to it; -inf kept."""
    floor = torch.finfo(torch.float32).min * min(1.0, s) / 4
    low = mask < floor
    return torch.where(low, torch.where(torch.isneginf(mask), mask, torch.full_like(mask, floor)), mask)


def _kernel_mask(mask, q, skv, scale=None):
    """The additive mask as the kernel takes it: [Sq, Skv] when shared by every batch-head, else [BH, Sq, Skv]."""
    if mask is None:
        return None
    sq = q.shape[-2]
    if mask.dtype != q.dtype:  # aten passes masks in q's dtype; keep the kernel's operands uniform
        mask = mask.to(q.dtype)
    if mask.is_floating_point():
        mask = _floored(mask, _scale(q, scale))
    full = mask.expand(*q.shape[:-1], skv)
    if all(s == 0 or n == 1 for s, n in zip(full.stride()[:-2], full.shape[:-2])):
        return contig(full[(0,) * (full.dim() - 2)])  # one plane shared by every batch-head
    return contig(full).reshape(-1, sq, skv)


def _kernels(sq: int, skv: int):
    """(forward, backward) kernels for these lengths: the short-sequence ones when queries and keys each fit one
    tile (they move every head of a batch element per DMA; the flash kernels issue several DMAs per head, which
    bounds them at short lengths), else flash."""
    pmax = runtime().profile.pmax
    if sq <= pmax and skv <= pmax:
        return kshort.short_attention_fwd, kshort.short_attention_bwd
    return kattn.flash_attention_fwd, kattn.flash_attention_bwd


def _empty(device, dtype=torch.int64):
    return torch.empty(0, dtype=dtype, device=device)


def sdpa_forward(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    same_device(q, k, v, attn_bias)
    wide = not _fits(q, k, v, attn_bias, dropout_p, False) and _causal_wide(q, k, v, attn_bias, dropout_p, is_causal)
    if not (wide or _fits(q, k, v, attn_bias, dropout_p, False)) or return_debug_mask:
        raise NotImplementedError("the neuron flash-attention kernels do not take these arguments (dropout, "
                                  "head dim > 128, grouped-query heads, debug masks); "
                                  "F.scaled_dot_product_attention routes such calls to the math backend")
    sq, skv = q.shape[-2], k.shape[-2]
    meta = meta_result(torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default, q, k, v, attn_bias,
                       dropout_p, is_causal, return_debug_mask, scale=scale)
    seed = torch.empty((), dtype=torch.int64, device=q.device)
    if wide:
        out, lse = _wide_forward(q, k, v, scale)
        return in_layout(out, meta[0]), lse, _empty(q.device), _empty(q.device), sq, skv, seed, seed, \
            _empty(q.device, q.dtype)
    layouts, into = [], {}
    qkv = [_heads(t, name, layouts) for t, name in ((q, "q"), (k, "k"), (v, "v"))]
    result = _written_in_place(q.shape, meta[0].stride(), q, "out", layouts, into)
    kmask = _kernel_mask(attn_bias, q, skv, scale)
    outs = run("scaled_dot_product_attention", _kernels(sq, skv)[0], *qkv, scale=scale,
               causal=bool(is_causal), mask=kmask, **_layouts(layouts), **into)
    out, lse = (result, outs[0]) if into else (outs[0].view(q.shape), outs[1])
    lse = lse.view(q.shape[:-1])
    if attn_bias is not None:
        out, lse = _empty_rows(out, lse, kmask)
    out = in_layout(out, meta[0])
    lse = lse if q.dim() == 4 else lse.unsqueeze(0)
    return out, lse, _empty(q.device), _empty(q.device), sq, skv, seed, seed, _empty(q.device, q.dtype)


def sdpa_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                  max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None, targets=None):
    """aten's fused SDPA backward; ``targets`` (compiled graphs): dq, dk, dv written into these tensors (views with
    contiguous rows, e.g. slices of the buffer a graph stacks the three gradients into), which are returned."""
    same_device(grad_out, q, k, v, out)
    if dropout_p > 0.0:
        raise NotImplementedError("the neuron flash-attention backward takes no dropout; "
                                  "F.scaled_dot_product_attention routes such calls to the math backend")
    dq, dk, dv = _sdpa_backward_qkv(grad_out, q, k, v, attn_bias, out, logsumexp, dropout_p, is_causal, scale,
                                    targets)
    wants_bias = grad_input_mask[3] and attn_bias is not None
    return dq, dk, dv, _bias_grad(grad_out, q, k, v, out, attn_bias, scale) if wants_bias else None


def _bias_grad(grad_out, q, k, v, out, bias, scale) -> torch.Tensor:
    """The gradient of the additive attn_bias: dS = P * (dO V^T - rowsum(dO * O)), P recomputed from the
    scores, in float32, summed down to the bias's broadcast shape (FlashAttention-2's dS, unscaled)."""
    if not bias.is_floating_point():
        raise ValueError(f"sdpa backward: a {bias.dtype} attn_bias has no gradient (only a floating-point one)")
    sc = q.shape[-1] ** -0.5 if scale is None else scale  # (the kernels take no causal flag beside a mask)
    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * sc + bias.float()
    p = torch.softmax(s, -1)
    do = grad_out.float()
    ds = p * (torch.matmul(do, v.float().transpose(-2, -1)) - (do * out.float()).sum(-1, keepdim=True))
    return ds.sum_to_size(bias.shape).to(bias.dtype)


def _sdpa_backward_qkv(grad_out, q, k, v, attn_bias, out, logsumexp, dropout_p, is_causal, scale, targets):
    """dq, dk, dv by the backward kernels (or _wide_backward for the causal calls they cannot take)."""
    if not _fits(q, k, v, attn_bias, dropout_p, False):  # a causal call wider than the kernels (_causal_wide)
        grads = _wide_backward(grad_out, q, k, v, out, logsumexp, scale)
        if targets is not None:
            grads = [t.copy_(g) for t, g in zip(targets, grads)]
        return grads
    skv = k.shape[-2]
    layouts, into = [], {}
    tensors = [_heads(t, name, layouts) for t, name in
               ((grad_out, "grad_out"), (q, "q"), (k, "k"), (v, "v"), (out, "out"))]
    # a gradient in its input's layout where the input is dense (heads viewed out of a [B, S, H * D] projection:
    # [B, S, H, D] gradients, which the autograd of that view takes without a copy); else contiguous (heads split
    # or unbound from a fused qkv projection: its backward concatenates or stacks them, fastest from contiguous)
    if targets is not None:
        grads = [_target(g, t, name, layouts, into) for g, t, name in zip(targets, (q, k, v), ("dq", "dk", "dv"))]
    else:
        grads = [_written_in_place(t.shape, t.stride(), t, name, layouts, into) if is_non_overlapping_and_dense(t)
                 else None for t, name in ((q, "dq"), (k, "dk"), (v, "dv"))]
    made = iter(run("scaled_dot_product_attention_backward", _kernels(q.shape[-2], skv)[1], *tensors,
                    contig(logsumexp).reshape(-1, q.shape[-2]), scale=scale, causal=bool(is_causal),
                    mask=_kernel_mask(attn_bias, q, skv, scale), **_layouts(layouts), **into))
    dq, dk, dv = (g if name in into else next(made).view(t.shape)
                  for g, name, t in zip(grads, ("dq", "dk", "dv"), (q, k, v)))
    return dq, dk, dv


def _wide_scores(q, k, scale) -> torch.Tensor:
    """float32 scale * q k^T with future keys (above the top-left diagonal) selected to -inf, not added."""
    sq, skv = q.shape[-2], k.shape[-2]
    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    keep = constant(("causal_keep", sq, skv), q.device, lambda: torch.ones(sq, skv, dtype=torch.bool).tril())
    return torch.where(keep, s, float("-inf"))


def _ungrouped(q, t) -> torch.Tensor:
    """Keys or values repeated for each query head of their group (aten's math path does the same)."""
    return t if t.shape[:-2] == q.shape[:-2] else t.repeat_interleave(q.shape[1] // t.shape[1], 1)


def _wide_forward(q, k, v, scale):
    """(contiguous out in q's dtype, float32 logsumexp) of causal attention the kernels cannot take."""
    k, v = _ungrouped(q, k), _ungrouped(q, v)
    s = _wide_scores(q, k, scale)
    lse = torch.logsumexp(s, -1)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # scores all -inf: zero weights, as torch's kernels
    out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float()).to(q.dtype)
    return contig(out), (lse if q.dim() == 4 else lse.unsqueeze(0))


def _wide_backward(grad_out, q, k, v, out, lse, scale):
    """dq, dk, dv of _wide_forward (FlashAttention-2's formulas in float32, P recomputed from the logsumexp)."""
    sc = q.shape[-1] ** -0.5 if scale is None else scale
    lse = lse.reshape(q.shape[:-1]).unsqueeze(-1)
    kf, vf = _ungrouped(q, k).float(), _ungrouped(q, v).float()
    p = torch.exp(_wide_scores(q, kf, scale) - lse)
    do = grad_out.float()
    dv = torch.matmul(p.transpose(-2, -1), do)
    ds = p * (torch.matmul(do, vf.transpose(-2, -1)) - (do * out.float()).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kf) * sc
    dk = torch.matmul(ds.transpose(-2, -1), q.float()) * sc
    return [_regrouped(g, t).to(t.dtype) for g, t in zip((dq, dk, dv), (q, k, v))]


def _regrouped(g, t) -> torch.Tensor:
    """The gradient of ``t`` from that of its per-query-head repeats: summed over each group."""
    if g.shape == t.shape:
        return g
    return g.view(t.shape[0], t.shape[1], -1, *g.shape[2:]).sum(2)


def _target(target: torch.Tensor, like: torch.Tensor, name: str, layouts: list, into: dict) -> torch.Tensor:
    """``target`` as the kernel's argument ``name`` (written in place): ``like``'s shape and dtype, rows contiguous."""
    if target.shape != like.shape or target.dtype != like.dtype or target.stride(-1) != 1:
        raise ValueError(f"sdpa backward: {name} target must be {list(like.shape)} {like.dtype} with contiguous rows, "
                         f"got {list(target.shape)} {target.dtype} strides {target.stride()}")
    into[name] = _heads(target, name, layouts)
    return target


def _written_in_place(shape, strides, like: torch.Tensor, name: str, layouts: list, into: dict):
    """A result of ``shape`` the kernel writes in the layout ``strides`` where that is not contiguous: a new tensor
    (``like``'s dtype and device) whose storage goes into ``into`` (the kernel's argument ``name``) and its layout
    into ``layouts``. None where the kernel's own contiguous output is the result."""
    if strides[-1] != 1 or torch.empty_strided(shape, strides, device="meta").is_contiguous():
        return None
    result = torch.empty_strided(shape, strides, dtype=like.dtype, device=like.device)
    into[name] = _heads(result, name, layouts)
    return result


def _layouts(layouts: list) -> dict:
    """The kernels' ``layouts`` argument: only when some tensor is read in place (the contiguous programs stay
    as they were traced and tuned)."""
    return {"layouts": tuple(layouts)} if layouts else {}


def _empty_rows(out, lse, mask):
    """Rows whose mask has every key at -inf (the kernel's NaN): zero output and a +inf logsumexp (see the
    docstring). Told by the mask, not by a NaN logsumexp: a row made NaN by an inf or NaN input stays NaN, as
    on the CPU, instead of turning silently into zeros."""
    empty = torch.isneginf(mask).all(-1).expand(lse.shape) if mask.dim() == 2 else \
        torch.isneginf(mask).all(-1).view(lse.shape)
    out = torch.where(empty.unsqueeze(-1), torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out, torch.where(empty, torch.full_like(lse, float("inf")), lse)
