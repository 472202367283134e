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


def check_cast(result: torch.dtype, target: torch.Tensor) -> None:
    """aten's rule for in-place and out= results: the result dtype must cast safely into the target's
    (an int tensor cannot take a float result), never a silent truncation."""
    if not torch.can_cast(result, target.dtype):
        raise RuntimeError(f"result type {_type_name(result)} can't be cast to the desired output type "
                           f"{_type_name(target.dtype)}")


def _type_name(dtype: torch.dtype) -> str:
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")  # aten's: Float, Int


def out_variant(fn):
    """``fn(*args, out=t)`` from a functional ``fn(*args) -> Tensor``."""

    def run_out(*args, out, **kwargs):
        return write_out(out, fn(*args, **kwargs))

    run_out.__name__ = f"{fn.__name__}_out"
    return run_out


def inplace_variant(fn):
    """``fn_(self, *args)`` from a functional ``fn(self, *args) -> Tensor``: computes, then copies into self."""

    def run_inplace(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        check_cast(result.dtype, self)
        self.copy_(result)
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

