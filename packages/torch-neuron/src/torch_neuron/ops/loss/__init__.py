"""Losses: the elementwise losses and nll_loss."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import out_variant
    from .elementwise import (
        _grad_input_out,
        binary_cross_entropy,
        binary_cross_entropy_backward,
        huber_loss,
        huber_loss_backward,
        mse_loss,
        mse_loss_backward,
        smooth_l1_loss,
        smooth_l1_loss_backward,
    )
    from .nll import _nll_backward_out, _nll_forward_out, nll_loss_backward, nll_loss_forward

    # elementwise.py
    for fn, name in ((mse_loss, "mse_loss"), (smooth_l1_loss, "smooth_l1_loss"), (huber_loss, "huber_loss"),
                     (binary_cross_entropy, "binary_cross_entropy")):
        impl(name)(fn)
        impl(f"{name}.out")(out_variant(fn))
    for fn, name in ((mse_loss_backward, "mse_loss_backward"), (smooth_l1_loss_backward, "smooth_l1_loss_backward"),
                     (huber_loss_backward, "huber_loss_backward"),
                     (binary_cross_entropy_backward, "binary_cross_entropy_backward")):
        impl(name)(fn)
        impl(f"{name}.grad_input")(_grad_input_out(fn))

    # nll.py
    for name in ("nll_loss_forward", "nll_loss2d_forward"):
        impl(name)(nll_loss_forward)
        impl(f"{name}.output")(_nll_forward_out)
    for name in ("nll_loss_backward", "nll_loss2d_backward"):
        impl(name)(nll_loss_backward)
        impl(f"{name}.grad_input")(_nll_backward_out)
