"""Casts folded into the kernel that produces their input, on AOTAutograd's graph.

Autocast puts a cast on each side of every linear layer: the float32 output of a norm cast to bfloat16 before the
projection, the bfloat16 gradients of the input and the weight cast back to float32. Alone, each cast is a kernel
that reads its input back from HBM and writes it again, a round trip on the graph's critical path. ``mm``,
``addmm`` and ``native_layer_norm`` can write the cast's dtype themselves: their result rounded to their own
dtype first, then converted by the store DMA, the same values as the op followed by the cast. The pass matches

    y = cast(view*(producer(...)))      each intermediate used only by the next step

(views: transposes, reshapes, permutes, dtype-agnostic) and makes the producer write the cast's dtype, the views
apply to that, and the cast goes.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..ops import linalg, normalization
from .patterns import only_user

aten = torch.ops.aten
_VIEWS = frozenset({aten.t.default, aten.transpose.int, aten.permute.default, aten.reshape.default,
                    aten.view.default, aten._unsafe_view.default})
_FLOATS = frozenset({torch.float32, torch.bfloat16, torch.float16})


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


def fold_casts(graph: fx.Graph) -> int:
    """Fold every cast of ``graph`` that has a producer able to write its dtype (in place); returns how many."""
    count = 0
    for node in list(graph.nodes):
        dtype = _cast_dtype(node)
        if dtype is None:
            continue
        chain, src = [], node.args[0]
        while _is_view(src) and only_user(src) is not None:
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
    if not isinstance(value, torch.Tensor) or value.dtype not in _FLOATS or dtype not in _FLOATS:
        return None
    same = (set(kw) <= {"dtype", "layout", "device", "memory_format"} and kw.get("layout") in (None, torch.strided)
            and kw.get("device") in (None, value.device)
            and kw.get("memory_format") in (None, torch.preserve_format))
    return dtype if same and dtype != value.dtype else None


def _is_view(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in _VIEWS


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


def _retyped(value, dtype: torch.dtype):
    """The (fake) tensor ``value`` with another dtype: the metadata later passes read."""
    mode = getattr(value, "fake_mode", None)
    if not isinstance(value, torch.Tensor) or mode is None:
        return value
    with mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=dtype, device=value.device)
