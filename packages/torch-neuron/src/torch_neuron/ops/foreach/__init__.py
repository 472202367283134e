"""Multi-tensor ops: _foreach_*, the fused optimizer steps and GradScaler's ops."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules (the op
    tables of foreach register when imported)."""
    from ..core.registry import impl
    from . import foreach  # noqa: F401  (importing registers the tables)
    from .amp_scale import non_finite_check_and_unscale_, update_scale_
    from .optim import fused_adam_, fused_adamw_, fused_sgd_

    # amp_scale.py
    impl("_amp_foreach_non_finite_check_and_unscale_")(non_finite_check_and_unscale_)
    impl("_amp_update_scale_")(update_scale_)

    # optim.py
    impl("_fused_adamw_", "_fused_adamw_.tensor_lr")(fused_adamw_)
    impl("_fused_adam_", "_fused_adam_.tensor_lr")(fused_adam_)
    impl("_fused_sgd_", "_fused_sgd_.tensor_lr")(fused_sgd_)
