"""Formulas (``neuron_kernels.library.formula``) as pointwise ops: the ``(kernel, operands, constants)`` a
pointwise.base adapter returns for a formula, and torch dtypes for the formulas' roundings."""

from __future__ import annotations

from neuron_kernels.library import formula as fl

from ..core.dtypes import FLOATS, TORCH_TO_DTYPE


def rounded(a: fl.Expr, dtype) -> fl.Expr:
    """``a`` rounded to ``dtype`` (a torch float dtype or a device dtype) and read back: torch's intermediate
    roundings."""
    return fl.rounded(a, TORCH_TO_DTYPE[dtype] if dtype in FLOATS else dtype)


def call(e: fl.Expr, tensors, out_dtype):
    """The ``(kernel, operands, constants)`` of a pointwise.base adapter for formula ``e`` over ``tensors``."""
    if len(tensors) > fl.MAX_INPUTS:
        raise ValueError(f"a formula takes at most {fl.MAX_INPUTS} tensors, got {len(tensors)}")
    return fl.formula, tuple(tensors), {"expr": e.node, "out_dtype": out_dtype}


def call_named(key: str, build, tensors, out_dtype):
    """Like ``call`` for the formula ``build()`` known by the unique name ``key`` (built once): the kernel's
    constant is the short key instead of the tree (``formula.define_named``)."""
    fl.define_named(key, build)
    if len(tensors) > fl.MAX_INPUTS:
        raise ValueError(f"a formula takes at most {fl.MAX_INPUTS} tensors, got {len(tensors)}")
    return fl.named_formula, tuple(tensors), {"key": key, "out_dtype": out_dtype}
