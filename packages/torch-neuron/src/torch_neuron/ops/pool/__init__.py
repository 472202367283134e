"""Pooling: average, max and adaptive pools and their backward."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .adaptive import (
        adaptive_avg_pool2d,
        adaptive_avg_pool2d_backward,
        adaptive_avg_pool2d_backward_out,
        adaptive_avg_pool2d_out,
        adaptive_avg_pool3d,
        adaptive_avg_pool3d_backward,
        adaptive_avg_pool3d_backward_out,
        adaptive_avg_pool3d_out,
        adaptive_max_pool2d,
        adaptive_max_pool2d_backward,
        adaptive_max_pool2d_backward_out,
        adaptive_max_pool2d_out,
        adaptive_max_pool3d,
        adaptive_max_pool3d_backward,
        adaptive_max_pool3d_backward_out,
        adaptive_max_pool3d_out,
    )
    from .avg import (
        avg_pool2d,
        avg_pool2d_backward,
        avg_pool2d_backward_out,
        avg_pool2d_out,
        avg_pool3d,
        avg_pool3d_backward,
        avg_pool3d_backward_out,
        avg_pool3d_out,
        max_pool3d_with_indices_backward,
        max_pool3d_with_indices_backward_out,
    )
    from .max import (
        max_pool2d_with_indices,
        max_pool2d_with_indices_backward,
        max_pool2d_with_indices_backward_out,
        max_pool2d_with_indices_out,
        max_pool3d_with_indices,
        max_pool3d_with_indices_out,
    )

    # adaptive.py
    impl("_adaptive_avg_pool2d")(adaptive_avg_pool2d)
    impl("_adaptive_avg_pool3d")(adaptive_avg_pool3d)
    impl("_adaptive_avg_pool2d.out")(adaptive_avg_pool2d_out)
    impl("_adaptive_avg_pool3d.out")(adaptive_avg_pool3d_out)
    impl("_adaptive_avg_pool2d_backward")(adaptive_avg_pool2d_backward)
    impl("_adaptive_avg_pool3d_backward")(adaptive_avg_pool3d_backward)
    impl("_adaptive_avg_pool2d_backward.out")(adaptive_avg_pool2d_backward_out)
    impl("_adaptive_avg_pool3d_backward.out")(adaptive_avg_pool3d_backward_out)
    impl("adaptive_max_pool2d")(adaptive_max_pool2d)
    impl("adaptive_max_pool3d")(adaptive_max_pool3d)
    impl("adaptive_max_pool2d.out")(adaptive_max_pool2d_out)
    impl("adaptive_max_pool3d.out")(adaptive_max_pool3d_out)
    impl("adaptive_max_pool2d_backward")(adaptive_max_pool2d_backward)
    impl("adaptive_max_pool3d_backward")(adaptive_max_pool3d_backward)
    impl("adaptive_max_pool2d_backward.grad_input")(adaptive_max_pool2d_backward_out)
    impl("adaptive_max_pool3d_backward.grad_input")(adaptive_max_pool3d_backward_out)

    # avg.py
    impl("max_pool3d_with_indices_backward")(max_pool3d_with_indices_backward)
    impl("max_pool3d_with_indices_backward.grad_input")(max_pool3d_with_indices_backward_out)
    impl("avg_pool2d")(avg_pool2d)
    impl("avg_pool3d")(avg_pool3d)
    impl("avg_pool2d.out")(avg_pool2d_out)
    impl("avg_pool3d.out")(avg_pool3d_out)
    impl("avg_pool2d_backward")(avg_pool2d_backward)
    impl("avg_pool3d_backward")(avg_pool3d_backward)
    impl("avg_pool2d_backward.grad_input")(avg_pool2d_backward_out)
    impl("avg_pool3d_backward.grad_input")(avg_pool3d_backward_out)

    # max.py
    impl("max_pool2d_with_indices")(max_pool2d_with_indices)
    impl("max_pool3d_with_indices")(max_pool3d_with_indices)
    impl("max_pool2d_with_indices.out")(max_pool2d_with_indices_out)
    impl("max_pool3d_with_indices.out")(max_pool3d_with_indices_out)
    impl("max_pool2d_with_indices_backward")(max_pool2d_with_indices_backward)
    impl("max_pool2d_with_indices_backward.grad_input")(max_pool2d_with_indices_backward_out)
