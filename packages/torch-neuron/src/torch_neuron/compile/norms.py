"""RMSNorm written out by hand becomes ``F.rms_norm``: one norm kernel forward and one backward.

Hugging Face's ``*RMSNorm`` modules (Llama, Mistral, Qwen, Gemma, ...) compute
``x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps)`` in float32: a square, a mean, an add, a reciprocal
square root and a multiply, and more than as many ops again in the backward. The pass runs on Dynamo's graph,
before AOTAutograd, and matches, each intermediate used only by the next step:

    sq = x.pow(2) | x * x | x ** 2;  var = sq.mean(-1, keepdim=True);  r = rsqrt(var + eps);  y = x * r

replacing ``y`` with ``F.rms_norm(x, (x.shape[-1],), eps=eps)``, the same function. Only float32 ``x`` is
rewritten (models upcast to float32 for it; a 16-bit ``x`` would round each step in eager mode, which the norm
kernel does not).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from .patterns import is_call, only_user, value_of

_POW = (operator.pow, torch.pow)
_MUL = (operator.mul, torch.mul)
_ADD = (operator.add, torch.add)
_MEAN = (torch.mean,)
_RSQRT = (torch.rsqrt,)


def fuse_rms_norms(gm: fx.GraphModule) -> int:
    """Rewrite every hand-written RMSNorm of ``gm`` (in place); returns how many were."""
    count = 0
    for node in list(gm.graph.nodes):
        match = _match(node)
        if match is not None:
            x, eps, chain, out = match
            with gm.graph.inserting_before(out):
                norm = gm.graph.call_function(F.rms_norm, (x, (value_of(x).shape[-1],)), {"eps": eps})
            norm.meta.update({k: out.meta[k] for k in ("example_value", "val") if k in out.meta})
            out.replace_all_uses_with(norm)
            for n in [out, *reversed(chain)]:
                gm.graph.erase_node(n)
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _match(sq: fx.Node):
    """(x, eps, chain, out) where ``sq`` squares x and starts an RMSNorm of it, else None."""
    x = _squared(sq)
    value = value_of(x)
    if value is None or value.dtype != torch.float32 or value.dim() == 0:
        return None
    var = only_user(sq)
    if var is None or not _is_last_dim_mean(var, value.dim()):
        return None
    add = only_user(var)
    if add is None or not is_call(add, _ADD, ("add", "__add__")) or len(add.args) != 2 or add.kwargs:
        return None
    eps = add.args[1] if add.args[0] is var else add.args[0]
    if not isinstance(eps, int | float) or isinstance(eps, bool) or eps < 0:
        return None
    rsqrt = only_user(add)
    if rsqrt is None or not is_call(rsqrt, _RSQRT, "rsqrt"):
        return None
    out = only_user(rsqrt)
    if out is None or not is_call(out, _MUL, ("mul", "__mul__")) or len(out.args) != 2 or out.kwargs:
        return None
    if set(out.args) != {x, rsqrt} or value_of(out) is None or value_of(out).shape != value.shape:
        return None
    return x, float(eps), [sq, var, add, rsqrt], out


def _squared(node: fx.Node) -> fx.Node | None:
    """x where ``node`` is x ** 2 (pow) or x * x, else None."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if is_call(node, _POW, ("pow", "__pow__")) and isinstance(a, fx.Node) and b == 2 and not isinstance(b, bool):
        return a
    if is_call(node, _MUL, ("mul", "__mul__")) and isinstance(a, fx.Node) and a is b:
        return a
    return None


def _is_last_dim_mean(node: fx.Node, rank: int) -> bool:
    if not is_call(node, _MEAN, "mean") or node.kwargs.get("dtype") is not None:
        return False
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    keepdim = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
    if isinstance(dim, list | tuple) and len(dim) == 1:
        dim = dim[0]
    return isinstance(dim, int) and dim % rank == rank - 1 and keepdim is True
