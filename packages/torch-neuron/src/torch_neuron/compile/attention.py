"""Attention written out by hand becomes ``scaled_dot_product_attention``: the flash kernel, forward and backward.

Models that spell attention as ``softmax(q @ k.transpose(-2, -1) * scale + mask) @ v`` (Hugging Face's
``eager`` attention, many research models) would run two matmuls, a softmax and their backward, with the
[L, S] scores and probabilities in HBM. The pass runs on Dynamo's graph, before AOTAutograd, so both the
forward and the backward get the fused kernel. It matches, each value used only by the next step:

    matmul(q, kt) -> [* s | / d] -> [+ mask] -> softmax(-1) -> [.to(same dtype)] -> [dropout(p=0 | eval)]
        -> matmul(., v)

and replaces it with ``scaled_dot_product_attention(q, kt.transpose(-2, -1), v, attn_mask=mask, scale=s)``,
which computes the same function. Only chains whose operands, scores and mask share one floating dtype are
rewritten (autocast's mixed dtypes and integer or boolean masks stay as written), only where q, k, v
have the same batch dims (SDPA does not broadcast them as matmul does), and only with a mask that needs no
gradient (a learned bias added to the scores, as T5's, would lose its).

One difference remains, torch's own: a query row whose every key is masked with a finite minimum (left padding
in Hugging Face's float masks) has the same uniform output either way, but its gradient is an artifact of
rounding (the true one is zero), and torch's SDPA produces another artifact than the written-out formula. The
rewritten model then trains as with ``attn_implementation="sdpa"``; on the CPU the two differ the same way.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from .patterns import is_call, only_user, value_of

_MATMUL = (torch.matmul, operator.matmul)
_MUL = (operator.mul, torch.mul)
_DIV = (operator.truediv, torch.div)
_ADD = (operator.add, torch.add)
_SOFTMAX = (F.softmax, torch.softmax)
_TRANSPOSE = (torch.transpose,)


def fuse_attention(gm: fx.GraphModule) -> int:
    """Rewrite every hand-written attention of ``gm`` (in place); returns how many were."""
    count = 0
    for node in list(gm.graph.nodes):
        if is_call(node, _MATMUL, "matmul"):
            match = _match(node)
            if match is not None:
                _rewrite(gm.graph, node, *match)
                count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _match(scores: fx.Node):
    """(q, kt, v, mask, scale, chain, out) of an attention starting at the matmul ``scores``, else None."""
    q, kt = scores.args[:2] if len(scores.args) == 2 else (None, None)
    if not all(isinstance(t, fx.Node) for t in (q, kt)):
        return None
    chain, node, scale, mask = [scores], only_user(scores), None, None
    if node is not None and is_call(node, _MUL + _DIV, ("mul", "div", "__mul__", "__truediv__")):
        scale = _constant_factor(node, scores)
        if scale is None:
            return None
        chain.append(node)
        node = only_user(node)
    if node is not None and is_call(node, _ADD, ("add", "__add__")) and len(node.args) == 2 and not node.kwargs:
        mask = node.args[1] if node.args[0] is chain[-1] else node.args[0]
        if not isinstance(mask, fx.Node):
            return None
        chain.append(node)
        node = only_user(node)
    if node is None or not _is_softmax_last_dim(node):
        return None
    chain.append(node)
    node = only_user(node)
    while node is not None and (_is_same_dtype_to(node) or _is_inert_dropout(node)):
        chain.append(node)
        node = only_user(node)
    if node is None or not is_call(node, _MATMUL, "matmul") or node.args[0] is not chain[-1]:
        return None
    v = node.args[1]
    if not isinstance(v, fx.Node) or not _dtypes_and_shapes_fit(q, kt, v, mask, chain, node):
        return None
    return q, kt, v, mask, 1.0 if scale is None else scale, chain, node


def _rewrite(graph: fx.Graph, scores, q, kt, v, mask, scale, chain, out) -> None:
    with graph.inserting_before(out):
        k = _untransposed(graph, kt)
        kwargs = {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False, "scale": scale}
        sdpa = graph.call_function(F.scaled_dot_product_attention, (q, k, v), kwargs)
    sdpa.meta.update({key: out.meta[key] for key in ("example_value", "val") if key in out.meta})
    out.replace_all_uses_with(sdpa)
    for n in [out, *reversed(chain)]:
        graph.erase_node(n)
    if k is not kt and not kt.users:
        # only the replaced nodes and the transpose the kernel does without go: Dynamo's graph holds in-place
        # method calls whose results nobody reads (``index_add_`` of an MoE), which a dead-code pass would drop
        graph.erase_node(kt)


def _untransposed(graph: fx.Graph, kt: fx.Node) -> fx.Node:
    """k from kt = k.transpose(-2, -1): its source where kt is that transpose, else a transpose of kt."""
    rank = value_of(kt).dim()
    if is_call(kt, _TRANSPOSE, "transpose") and len(kt.args) == 3:
        dims = {d % rank for d in kt.args[1:] if isinstance(d, int)}
        if dims == {rank - 2, rank - 1}:
            return kt.args[0]
    return graph.call_method("transpose", (kt, -2, -1))


def _constant_factor(node: fx.Node, scores: fx.Node) -> float | None:
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    other = b if a is scores else a if b is scores else None
    if not isinstance(other, int | float) or isinstance(other, bool) or other == 0:
        return None
    if node.target in _DIV or node.target in ("div", "__truediv__"):
        return 1.0 / other if a is scores else None  # c / scores is not a scaling
    return float(other)


def _is_softmax_last_dim(node: fx.Node) -> bool:
    if not is_call(node, _SOFTMAX, "softmax"):
        return False
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    at = 3 if node.target is F.softmax else 2  # F.softmax(x, dim, _stacklevel, dtype); torch/Tensor.softmax(dim, dtype)
    dtype = node.kwargs.get("dtype", node.args[at] if len(node.args) > at else None)
    value = value_of(node.args[0])
    return (isinstance(dim, int) and value is not None and dim % value.dim() == value.dim() - 1
            and (dtype is None or dtype == value.dtype))


def _is_same_dtype_to(node: fx.Node) -> bool:
    if not is_call(node, (), ("to", "type_as", "float")):
        return False
    before, after = value_of(node.args[0]), value_of(node)
    return before is not None and after is not None and before.dtype == after.dtype and \
        before.device == after.device


def _is_inert_dropout(node: fx.Node) -> bool:
    if not is_call(node, (F.dropout,), ()):
        return False
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
    return p == 0 or training is False


def _dtypes_and_shapes_fit(q, kt, v, mask, chain, out) -> bool:
    vals = [value_of(n) for n in (q, kt, v, *chain, out)] + ([value_of(mask)] if mask is not None else [])
    if any(t is None for t in vals) or not vals[0].is_floating_point():
        return False
    if len({t.dtype for t in vals}) != 1 or len({t.device for t in vals}) != 1:
        return False
    qv, ktv, vv = vals[:3]
    if qv.dim() < 2 or not (qv.dim() == ktv.dim() == vv.dim()):
        return False
    if not (qv.shape[:-2] == ktv.shape[:-2] == vv.shape[:-2]):
        return False  # SDPA takes equal batch dims; matmul would broadcast them
    if qv.shape[-1] != ktv.shape[-2] or ktv.shape[-1] != vv.shape[-2]:
        return False
    if mask is not None:
        if vals[-1].requires_grad:
            return False  # a learned bias (T5's relative positions): SDPA gives no gradient for attn_mask
        scores = value_of(chain[0])
        try:
            return torch.broadcast_shapes(vals[-1].shape, scores.shape) == scores.shape
        except RuntimeError:
            return False
    return True
