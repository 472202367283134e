"""Scaled dot product attention (flash-attention kernels) and the Transformer inference fast path."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .sdpa import fused_sdp_choice, sdpa_backward, sdpa_forward
    from .transformer_fast import (
        native_multi_head_attention,
        nested_tensor_from_mask,
        nested_tensor_from_mask_left_aligned,
        transformer_encoder_layer_fwd,
    )

    # sdpa.py
    impl("_fused_sdp_choice")(fused_sdp_choice)
    impl("_scaled_dot_product_fused_attention_overrideable")(sdpa_forward)
    impl("_scaled_dot_product_fused_attention_overrideable_backward")(sdpa_backward)

    # transformer_fast.py
    impl("_native_multi_head_attention")(native_multi_head_attention)
    impl("_transformer_encoder_layer_fwd")(transformer_encoder_layer_fwd)
    impl("_nested_tensor_from_mask_left_aligned")(nested_tensor_from_mask_left_aligned)
    impl("_nested_tensor_from_mask")(nested_tensor_from_mask)


def sdp_choice(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> int:
    """The family's entry point for the C++ ``_fused_sdp_choice`` stub (csrc/Attention.cpp imports
    ``torch_neuron.ops.attention``): the decision is :func:`.sdpa.sdp_choice`."""
    from .sdpa import sdp_choice as choose

    return choose(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
