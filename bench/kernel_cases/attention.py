"""Flash attention, forward and backward: TensorE-bound, so the roofline is the matmul FLOPs.

Forward: QK^T and PV, 4 * BH * Sq * Skv * D FLOPs (half with causal). Backward: five matmuls (S recomputed, dP,
dV, dK, dQ), 10 * BH * Sq * Skv * D FLOPs (half with causal). Transposes, exp and rescaling are overhead.
"""

from neuron_hal import DType
from neuron_kernels import TensorSpec
from neuron_kernels.library import attention as attn

from . import Case


def _fwd(bh, s, d, causal):
    x = TensorSpec((bh, s, d), DType.bfloat16)
    flops = 4 * bh * s * s * d / (2 if causal else 1)
    label = f"bh{bh}xs{s}xd{d}{' causal' if causal else ''}"
    return Case("attention.fwd", attn.flash_attention_fwd, (x, x, x), label, "bfloat16", "tensor", flops,
                {"causal": causal})


def _bwd(bh, s, d, causal):
    x = TensorSpec((bh, s, d), DType.bfloat16)
    lse = TensorSpec((bh, s), DType.float32)
    flops = 10 * bh * s * s * d / (2 if causal else 1)
    label = f"bh{bh}xs{s}xd{d}{' causal' if causal else ''}"
    return Case("attention.bwd", attn.flash_attention_bwd, (x, x, x, x, x, lse), label, "bfloat16", "tensor", flops,
                {"causal": causal})


CASES = [
    _fwd(1, 4096, 128, False),
    _fwd(1, 4096, 128, True),
    _fwd(4, 2048, 128, False),
    _bwd(1, 2048, 128, False),
    _bwd(1, 2048, 128, True),
]
