"""Tensor creation: fill_/zero_/masked_fill, eye and arange."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..pointwise.base import COMPUTE, pointwise
    from .fill import _masked_fill, arange_start_out, eye_m_out, eye_out, fill_scalar, fill_tensor, zero_

    # fill.py
    impl("fill_.Scalar")(fill_scalar)
    impl("fill_.Tensor")(fill_tensor)
    impl("zero_")(zero_)
    impl("eye.m_out")(eye_m_out)
    impl("eye.out")(eye_out)
    pointwise("masked_fill", ["masked_fill.Scalar", "masked_fill.Tensor"],
              ["masked_fill_.Scalar", "masked_fill_.Tensor"], [],
              promoted=(0,), supports=lambda plan, *a: plan.R in COMPUTE)(_masked_fill)
    impl("arange.start_out")(arange_start_out)
