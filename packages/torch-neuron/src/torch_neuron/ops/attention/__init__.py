"""Scaled dot product attention (flash-attention kernels) and the Transformer inference fast path."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import sdpa, transformer_fast  # noqa: F401  (importing registers)


def sdp_choice(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> int:
    """The family's entry point for the C++ ``_fused_sdp_choice`` stub (csrc/Attention.cpp imports
    ``torch_neuron.ops.attention``): the decision is :func:`.sdpa.sdp_choice`."""
    from .sdpa import sdp_choice as choose

    return choose(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
