"""Convolution forward and backward."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .convolution import convolution, convolution_backward

    # convolution.py
    impl("convolution_overrideable")(convolution)
    impl("convolution_backward_overrideable")(convolution_backward)
