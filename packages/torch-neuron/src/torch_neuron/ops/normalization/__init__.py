"""Normalization: layer/RMS/group norm, batch norm, softmax and log_softmax."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import out_variant
    from . import batch_norm, norms
    from .batch_norm import (
        _backward_with_reserve,
        _legit,
        _legit_no_stats,
        _legit_no_training,
        _with_update,
        native_batch_norm,
        native_batch_norm_backward,
    )
    from .norms import group_norm, group_norm_backward, layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
    from .softmax import _grad_input_out, log_softmax, log_softmax_backward, softmax, softmax_backward

    # batch_norm.py
    impl("_batch_norm_with_update")(_with_update)
    impl("batch_norm_backward")(_backward_with_reserve)
    impl("_native_batch_norm_legit")(_legit)
    impl("_native_batch_norm_legit.no_stats")(_legit_no_stats)
    impl("_native_batch_norm_legit_no_training")(_legit_no_training)
    impl("native_batch_norm")(native_batch_norm)
    impl("native_batch_norm.out")(batch_norm._triple_out)
    impl("native_batch_norm_backward")(native_batch_norm_backward)

    # norms.py
    impl("native_layer_norm")(layer_norm)
    impl("native_layer_norm.out")(norms._triple_out(layer_norm))
    impl("native_layer_norm_backward")(layer_norm_backward)
    impl("native_layer_norm_backward.out")(norms._triple_out(layer_norm_backward))
    impl("_fused_rms_norm")(rms_norm)
    impl("_fused_rms_norm_backward")(rms_norm_backward)
    impl("native_group_norm")(group_norm)
    impl("native_group_norm.out")(norms._triple_out(group_norm))
    impl("native_group_norm_backward")(group_norm_backward)
    impl("native_group_norm_backward.out")(norms._triple_out(group_norm_backward))

    # softmax.py
    for fn, name in ((softmax, "_softmax"), (log_softmax, "_log_softmax"),
                     (log_softmax_backward, "_log_softmax_backward_data")):
        impl(name)(fn)
        impl(f"{name}.out")(out_variant(fn))
    impl("_softmax_backward_data")(softmax_backward)
    impl("_softmax_backward_data.out")(_grad_input_out(softmax_backward))
