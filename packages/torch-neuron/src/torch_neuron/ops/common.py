"""Helpers the op modules share: contiguous operands, out= and in-place variants."""

from __future__ import annotations

import torch
from torch._prims_common.wrappers import _maybe_resize_out

from .registry import impl


def contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def write_out(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """Store a result into an ``out=`` tensor as aten does: resize it if its shape differs (warning when
    it was not empty), then copy with a cast to out's dtype."""
    _maybe_resize_out(out, result.shape)
    out.copy_(result)
    return out


def out_variant(fn):
    """``fn(*args, out=t)`` from a functional ``fn(*args) -> Tensor``."""

    def run_out(*args, out, **kwargs):
        return write_out(out, fn(*args, **kwargs))

    run_out.__name__ = f"{fn.__name__}_out"
    return run_out


def inplace_variant(fn):
    """``fn_(self, *args)`` from a functional ``fn(self, *args) -> Tensor``: computes, then copies into self."""

    def run_inplace(self, *args, **kwargs):
        self.copy_(fn(self, *args, **kwargs))
        return self

    run_inplace.__name__ = f"{fn.__name__}_"
    return run_inplace


def register_op(functional: str | None = None, inplace: str | None = None, out: str | None = None):
    """Decorator: register a functional kernel under ``functional`` and derive the in-place and out=
    overloads from it (names are aten overload names, e.g. ``"add.Tensor"``, ``"add_.Tensor"``, ``"add.out"``)."""

    def register(fn):
        if functional:
            impl(functional)(fn)
        if inplace:
            impl(inplace)(inplace_variant(fn))
        if out:
            impl(out)(out_variant(fn))
        return fn

    return register


def run_on_cpu(op: torch._ops.OpOverload, *args, **kwargs):
    """Run aten ``op`` on the CPU for a registered neuron kernel that cannot handle these arguments
    (float64, an unsupported configuration): loud like the C++ fallback (warning, counter, strict
    mode), arguments copied over and results copied back, mutated arguments updated in place."""
    from torch.utils._pytree import tree_map

    from ..fallback import on_fallback

    name = op._schema.name.removeprefix("aten::")
    on_fallback(f"{name}.{op._overloadname}" if op._overloadname != "default" else name)
    device = next(a.device for a in _tensors(args, kwargs) if a.device.type == "neuron")
    to_cpu = lambda v: v.cpu() if isinstance(v, torch.Tensor) and v.device.type == "neuron" else v
    cpu_args, cpu_kwargs = tree_map(to_cpu, args), tree_map(to_cpu, kwargs)
    result = op(*cpu_args, **cpu_kwargs)
    written = {}
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        orig, moved = (args[i], cpu_args[i]) if i < len(args) else (kwargs.get(arg.name), cpu_kwargs.get(arg.name))
        if isinstance(orig, torch.Tensor) and orig is not moved:
            if orig.shape != moved.shape:  # an out= tensor the op resized
                orig.resize_(moved.shape)
            orig.copy_(moved)
            written[id(moved)] = orig
    return tree_map(lambda v: written.get(id(v), v.to(device) if isinstance(v, torch.Tensor) else v), result)


def _tensors(args, kwargs):
    from torch.utils._pytree import tree_leaves

    return [v for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
