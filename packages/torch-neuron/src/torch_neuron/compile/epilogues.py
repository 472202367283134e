"""Work after a matmul or a norm done by its kernel, on AOTAutograd's graph: casts and residual adds.

Casts. Autocast puts a cast on each side of every linear layer: the float32 output of a norm cast to bfloat16
before the projection, the bfloat16 gradients of the input and the weight cast back to float32. Alone, each cast
is a kernel that reads its input back from HBM and writes it again, a round trip on the graph's critical path.
``mm``, ``addmm`` and ``native_layer_norm`` can write the cast's dtype themselves: their result rounded to their
own dtype first, then converted by the store DMA, the same values as the op followed by the cast. Matched:

    y = cast(view*(producer(...)))      each intermediate used only by the next step

(views: transposes, reshapes, permutes, dtype-agnostic): the producer writes the cast's dtype, the views apply
to that, and the cast goes.

Residual adds. ``x + view*(mm or addmm)`` (a residual connection after a projection, the product used only
there, reshapes and plain clones only in between, ``x`` of the sum's shape) becomes one matmul kernel that adds
``x`` to each rounded output tile before storing it: the product never goes to HBM and back.

Activations. ``f(view*(mm or addmm))`` for f whose own kernel is one ScalarE activation (gelu, silu, sigmoid,
tanh) becomes one matmul kernel storing the product (other nodes may read it: the activation's backward does)
and f of it, computed from the same SBUF tile.

Norm gradients. In a pre-norm residual network each block's backward adds its norm's input gradient to the
residual stream's gradient, ``s = r + getitem(native_layer_norm_backward(...), 0)`` (or
``_fused_rms_norm_backward``: RMSNorm modules, and hand-written ones the compiler made ``F.rms_norm``; ``r`` of
the same shape and dtype, defined before the backward, the gradient used only there), and autocast casts ``s``
(or the first backward's gradient itself) for the next matmuls. The backward's kernel adds ``r`` to each rounded
gradient tile and writes the cast as a second output: the gradient never goes to HBM and back.

Stacked attention gradients. A fused qkv projection split into heads gets its gradient as
``clone(permute(stack([dq, dk, dv])))``: a copy of all three. The attention backward writes dq, dk and dv into
the slices of that contiguous result instead (``sdpa_backward(targets=...)``).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..ops.attention import sdpa as attention
from ..ops.core.dtypes import FLOATS
from ..ops.linalg import matmul as linalg
from ..ops.normalization import norms as normalization
from .graph_io import fake_tensor
from .patterns import only_user

aten = torch.ops.aten
_VIEWS = frozenset({aten.t.default, aten.transpose.int, aten.permute.default, aten.reshape.default,
                    aten.view.default, aten._unsafe_view.default})


class MatmulTo:
    """``mm`` / ``addmm`` followed by a cast to ``dtype``, as one kernel (a graph node's target)."""

    def __init__(self, op, dtype: torch.dtype):
        self.op, self.dtype = op, dtype
        self.__name__ = f"{op.__name__.split('.')[0]}_to_{str(dtype).removeprefix('torch.')}"

    def __call__(self, *args, **kwargs):
        if self.op is aten.mm.default:
            return linalg.mm_to(*args, self.dtype)
        bias, a, b = args
        return linalg.addmm_to(bias, a, b, self.dtype, **kwargs)


class LayerNormTo:
    """``native_layer_norm`` whose output (not its statistics) is cast to ``dtype``, as one kernel."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.__name__ = f"native_layer_norm_to_{str(dtype).removeprefix('torch.')}"

    def __call__(self, *args):
        return normalization.layer_norm(*args, out_dtype=self.dtype)


def fold_epilogues(graph: fx.Graph) -> dict[str, int]:
    """Fold the casts, residual adds, norm gradient adds and casts, activations and attention gradient stacks of
    ``graph`` into their producers (in place); returns how many of each."""
    return {"casts_folded": fold_casts(graph), "residual_adds_folded": fold_residual_adds(graph),
            "norm_grad_adds_folded": fold_norm_grad_adds(graph), "activations_folded": fold_activations(graph),
            "attention_grad_stacks_folded": fold_stacked_attention_grads(graph)}


def fold_casts(graph: fx.Graph) -> int:
    """Fold every cast of ``graph`` that has a producer able to write its dtype (in place); returns how many."""
    count = 0
    for node in list(graph.nodes):
        dtype = _cast_dtype(node)
        if dtype is None:
            continue
        chain, src = [], node.args[0]
        while _is_call(src, _VIEWS) and only_user(src) is not None:
            chain.append(src)
            src = src.args[0]
        if only_user(src) is None or not _retarget(src, dtype):
            continue
        for n in [src, *chain]:
            n.meta["val"] = _retyped(n.meta.get("val"), dtype)
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
        count += 1
    return count


def _cast_dtype(node: fx.Node) -> torch.dtype | None:
    """The dtype of a float-to-float ``_to_copy`` that changes nothing else (same device, strided, the input's
    memory format), else None."""
    if node.op != "call_function" or node.target is not aten._to_copy.default or len(node.args) != 1:
        return None
    src, kw = node.args[0], node.kwargs
    value = src.meta.get("val") if isinstance(src, fx.Node) else None
    dtype = kw.get("dtype")
    if not isinstance(value, torch.Tensor) or value.dtype not in FLOATS or dtype not in FLOATS:
        return None
    same = (set(kw) <= {"dtype", "layout", "device", "memory_format"} and kw.get("layout") in (None, torch.strided)
            and kw.get("device") in (None, value.device)
            and kw.get("memory_format") in (None, torch.preserve_format))
    return dtype if same and dtype != value.dtype else None


def _retarget(src: fx.Node, dtype: torch.dtype) -> bool:
    """Make ``src`` write ``dtype``: an mm / addmm, or output 0 of a native_layer_norm."""
    if src.op != "call_function":
        return False
    if src.target in (aten.mm.default, aten.addmm.default):
        src.target = MatmulTo(src.target, dtype)
        return True
    norm = src.args[0] if src.target is operator.getitem and src.args[1] == 0 else None
    if isinstance(norm, fx.Node) and norm.op == "call_function" and norm.target is aten.native_layer_norm.default:
        norm.target = LayerNormTo(dtype)
        values = norm.meta.get("val")
        if isinstance(values, tuple):
            norm.meta["val"] = (_retyped(values[0], dtype), *values[1:])
        return True
    return False


def _retyped(value, dtype: torch.dtype, shape=None):
    """The (fake) tensor ``value`` with another dtype (and contiguous ``shape``): the metadata later passes read."""
    mode = getattr(value, "fake_mode", None)
    if not isinstance(value, torch.Tensor) or mode is None:
        return value
    if shape is None:
        return fake_tensor(mode, value.shape, value.stride(), dtype, value.device)
    return fake_tensor(mode, shape, torch._prims_common.make_contiguous_strides_for(shape), dtype, value.device)


_RESHAPES = frozenset({aten.reshape.default, aten.view.default, aten._unsafe_view.default})


def fold_residual_adds(graph: fx.Graph) -> int:
    """Fold every ``x + view*(mm or addmm)`` of ``graph`` into the matmul (in place); returns how many."""
    count = 0
    for node in list(graph.nodes):
        match = _residual_match(node)
        if match is None:
            continue
        residual, chain, product = match
        shape = list(product.meta["val"].shape)
        with graph.inserting_before(node):
            flat = graph.call_function(aten.reshape.default, (residual, shape))
            flat.meta["val"] = _retyped(residual.meta["val"], residual.meta["val"].dtype, shape)
            args = (flat, *product.args[1:], product.args[0]) if product.target is aten.addmm.default else \
                (flat, *product.args)
            fused = graph.call_function(GemmAdd(), args, dict(product.kwargs))
            fused.meta["val"] = _retyped(node.meta["val"], node.meta["val"].dtype, shape)
            out = fused
            for view in reversed(chain):  # the reshapes back to the sum's shape (a clone of a value used once: none)
                if view.target is not aten.clone.default:
                    out = graph.call_function(view.target, (out, *view.args[1:]), dict(view.kwargs))
                    out.meta["val"] = _retyped(view.meta["val"], node.meta["val"].dtype)
        node.replace_all_uses_with(out)
        for n in [node, *chain, product]:
            graph.erase_node(n)
        count += 1
    return count


class GemmAdd:
    """``residual + mm(a, b)`` or ``residual + addmm(bias, a, b)`` as one kernel (a graph node's target); called
    as (residual, a, b[, bias])."""

    __name__ = "gemm_add"

    def __call__(self, residual, a, b, bias=None, **kwargs):
        return linalg.gemm_add(residual, a, b, bias, **kwargs)


def _residual_match(node: fx.Node):
    """(residual, reshapes from the product's user down, product) of ``residual + reshape*(product)``, else
    None."""
    if node.op != "call_function" or node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) != 1:
        return None
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype not in FLOATS or len(node.args) != 2:
        return None
    for residual, src in (node.args, node.args[::-1]):
        rv = residual.meta.get("val") if isinstance(residual, fx.Node) else None
        if not isinstance(rv, torch.Tensor) or rv.shape != value.shape or rv.dtype not in FLOATS:
            continue
        chain, user = [], node
        while (_is_call(src, _RESHAPES) or _is_plain_clone(src)) and only_user(src) is user:
            chain.append(src)
            user, src = src, src.args[0]
        if _is_call(src, (aten.mm.default, aten.addmm.default)) and only_user(src) is user and residual is not src \
                and all(isinstance(d, int) for d in src.meta["val"].shape):  # the residual's reshape is spelled out
            return residual, chain, src
    return None


def _is_plain_clone(node) -> bool:
    """A clone that only copies (what a dropout of probability 0 leaves in the graph)."""
    return _is_call(node, (aten.clone.default,)) and node.kwargs.get("memory_format") in (
        None, torch.preserve_format, torch.contiguous_format)


def _is_call(node, targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


# the norm backwards whose grad_input a residual add and a cast can go into: the op's implementation, taking them
_NORM_BACKWARDS = {aten.native_layer_norm_backward.default: normalization.layer_norm_backward,
                   aten._fused_rms_norm_backward.default: normalization.rms_norm_backward}


class NormBackwardAdd:
    """A norm backward (``native_layer_norm_backward``, ``_fused_rms_norm_backward``) whose grad_input gets a
    residual added (the argument after the op's own, when given) and/or a cast to ``cast_dtype``, as one kernel
    (a graph node's target); returns (grad_input [+ residual], its cast or None, the parameters' grads)."""

    def __init__(self, op, cast_dtype: torch.dtype | None):
        self.op, self.cast_dtype = op, cast_dtype
        self.nargs = len(op._schema.arguments)
        to = "" if cast_dtype is None else "_to_" + str(cast_dtype).removeprefix("torch.")
        self.__name__ = f"{op.__name__.split('.')[0]}_add{to}"

    def __call__(self, *args):
        residual = args[self.nargs] if len(args) > self.nargs else None
        return _NORM_BACKWARDS[self.op](*args[:self.nargs], residual=residual, cast_dtype=self.cast_dtype)


def fold_norm_grad_adds(graph: fx.Graph) -> int:
    """Fold the add of a residual to each norm backward's grad_input, and the cast of the sum (or of grad_input),
    into the backward (in place); returns how many backwards took an add or a cast."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    count = 0
    for node in list(graph.nodes):
        match = _norm_grad_match(node, order)
        if match is None:
            continue
        items, add, residual, cast = match
        dx, values = items[0], node.meta.get("val")
        node.target = NormBackwardAdd(node.target, None if cast is None else cast.kwargs["dtype"])
        node.args = node.args + ((residual,) if add is not None else ())
        for index, item in items.items():  # the parameters' grads move one place on, after the cast
            if index:
                item.args = (node, index + 1)
        if add is not None:  # grad_input is the sum now
            dx.meta["val"] = add.meta["val"]
            add.replace_all_uses_with(dx)
            graph.erase_node(add)
        if cast is not None:
            with graph.inserting_before(cast):
                cast_item = graph.call_function(operator.getitem, (node, 1))
            cast_item.meta["val"] = cast.meta.get("val")
            cast.replace_all_uses_with(cast_item)
            graph.erase_node(cast)
        if isinstance(values, tuple):
            node.meta["val"] = (dx.meta["val"], None if cast is None else cast_item.meta["val"], *values[1:])
        count += 1
    return count


def _norm_grad_match(node: fx.Node, order: dict):
    """({output index: getitem}, add or None, residual or None, cast or None) of a norm backward whose grad_input
    is added to a residual (the gradient used only there) and/or cast, else None."""
    if not _is_call(node, _NORM_BACKWARDS) or node.kwargs or len(node.args) != len(node.target._schema.arguments) \
            or not node.args[-1][0]:  # all arguments given, the last the output mask: grad_input asked for
        return None
    items = {g.args[1]: g for g in node.users if _is_call(g, (operator.getitem,))}
    if len(items) != len(node.users) or 0 not in items:
        return None
    dx = items[0]
    value = dx.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype not in FLOATS:
        return None
    add, residual = None, None
    user = only_user(dx)
    if _is_call(user, (aten.add.Tensor,)) and len(user.args) == 2 and not user.kwargs:
        other = user.args[1] if user.args[0] is dx else user.args[0]
        if _same_tensor(other, value) and _same_tensor(user, value) and order.get(other, len(order)) < order[node]:
            add, residual = user, other  # defined before the backward: the fused node stays where it is
    out = dx if add is None else add
    cast = next((u for u in out.users if _cast_dtype(u) is not None), None)
    return None if add is None and cast is None else (items, add, residual, cast)


def _same_tensor(node, value: torch.Tensor) -> bool:
    """``node``'s value has ``value``'s dtype and (provably, without a guard) its shape."""
    other = node.meta.get("val") if isinstance(node, fx.Node) else None
    return (isinstance(other, torch.Tensor) and other.dtype == value.dtype and other.dim() == value.dim()
            and all(statically_known_true(a == b) for a, b in zip(other.shape, value.shape)))


_SDPA_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default


def fold_stacked_attention_grads(graph: fx.Graph) -> int:
    """Write the gradients of every ``clone(permute(stack([dq, dk, dv])))`` of ``graph`` in place; returns how many."""
    count = 0
    for node in list(graph.nodes):
        match = _stack_match(node)
        if match is None:
            continue
        backward, items, stack, permute = match
        dim = stack.args[1] if len(stack.args) > 1 else stack.kwargs.get("dim", 0)
        with graph.inserting_before(node):
            fused = graph.call_function(StackedAttentionGrads(dim, tuple(permute.args[1])), backward.args,
                                        dict(backward.kwargs))
        fused.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(fused)
        for n in [node, permute, stack, *items, backward]:
            graph.erase_node(n)
        count += 1
    return count


def _stack_match(node: fx.Node):
    """(backward, its three getitems, stack, permute) of ``clone(permute(stack(backward's dq, dk, dv)))``."""
    if not _is_plain_clone(node) or node.kwargs.get("memory_format") is torch.preserve_format:
        return None
    permute = node.args[0]
    if not _is_call(permute, (aten.permute.default,)) or only_user(permute) is not node:
        return None
    stack = permute.args[0]
    if not _is_call(stack, (aten.stack.default,)) or only_user(stack) is not permute or len(stack.args[0]) != 3:
        return None
    items = list(stack.args[0])
    backward = items[0].args[0] if _is_call(items[0], (operator.getitem,)) else None
    if not _is_call(backward, (_SDPA_BACKWARD,)) or set(backward.users) != set(items):
        return None
    if any(not _is_call(g, (operator.getitem,)) or g.args != (backward, i) or only_user(g) is not stack
           for i, g in enumerate(items)):
        return None
    return backward, items, stack, permute


class StackedAttentionGrads:
    """The fused SDPA backward returning ``clone(permute(stack([dq, dk, dv], dim), perm))``, its gradients written
    into that result's slices (a graph node's target; called with the backward's arguments)."""

    __name__ = "sdpa_backward_stacked"

    def __init__(self, dim: int, perm: tuple[int, ...]):
        self.dim, self.perm = dim, perm

    def __call__(self, *args, **kwargs):
        q = args[1]
        dim = self.dim % (q.dim() + 1)
        shape = [*q.shape[:dim], 3, *q.shape[dim:]]
        out = torch.empty([shape[i] for i in self.perm], dtype=q.dtype, device=q.device)
        inverse = sorted(range(len(self.perm)), key=self.perm.__getitem__)
        targets = out.permute(inverse).unbind(dim)
        if all(t.stride(-1) == 1 for t in targets) and args[2].shape == q.shape == args[3].shape:
            attention.sdpa_backward(*args, **kwargs, targets=targets)
        else:  # rows not contiguous in the result: the gradients as usual, then the stack
            grads = attention.sdpa_backward(*args, **kwargs)[:3]
            out.copy_(torch.stack(grads, dim).permute(self.perm))
        return out


_ACTIVATIONS = {aten.silu.default: "silu", aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh"}


def fold_activations(graph: fx.Graph) -> int:
    """Fold every activation of a matmul's output (through views) into the matmul (in place); returns how many."""
    count = 0
    for node in list(graph.nodes):
        name = _activation_name(node)
        chain, src = [], node.args[0] if name else None
        while _is_call(src, _VIEWS):
            chain.append(src)
            src = src.args[0]
        if not _is_call(src, (aten.mm.default, aten.addmm.default)) or not isinstance(src.meta.get("val"),
                                                                                      torch.Tensor):
            continue
        args = (*src.args[1:], src.args[0]) if src.target is aten.addmm.default else src.args
        with graph.inserting_before(src):
            fused = graph.call_function(MatmulAct(name), args, dict(src.kwargs))
            pre = graph.call_function(operator.getitem, (fused, 0))
            post = graph.call_function(operator.getitem, (fused, 1))
        fused.meta["val"] = (src.meta["val"], src.meta["val"])
        pre.meta["val"] = post.meta["val"] = src.meta["val"]
        src.replace_all_uses_with(pre)
        graph.erase_node(src)
        with graph.inserting_before(node):  # the views again, on the activation
            for view in reversed(chain):
                post = graph.call_function(view.target, (post, *view.args[1:]), dict(view.kwargs))
                post.meta["val"] = view.meta.get("val")
        node.replace_all_uses_with(post)
        graph.erase_node(node)
        count += 1
    return count


def _activation_name(node: fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    if node.target is aten.gelu.default:
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return "gelu" if approximate == "none" else "gelu_tanh" if approximate == "tanh" else None
    return _ACTIVATIONS.get(node.target)


class MatmulAct:
    """``(p, f(p))`` of ``p = mm(a, b)`` or ``addmm(bias, a, b)`` as one kernel (a graph node's target); called as
    (a, b[, bias])."""

    def __init__(self, activation: str):
        self.activation = activation
        self.__name__ = f"matmul_{activation}"

    def __call__(self, a, b, bias=None, **kwargs):
        return linalg.gemm_act(a, b, bias, self.activation, **kwargs)
