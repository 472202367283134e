"""Rooflines of a NeuronCore, from its profile: the device time a kernel could take at best."""

from __future__ import annotations

from neuron_hal import DType, Profile


def tensor_ns(profile: Profile, flops: float, dtype=DType.bfloat16) -> float:
    """Time for ``flops`` at TensorE peak (FP32 inputs run at 1/matmul_fp32_factor of it)."""
    slow = profile.matmul_fp32_factor if DType.of(dtype) is DType.float32 else 1
    return flops * slow / profile.tensor_peak_flops * 1e9


def dma_ns(profile: Profile, nbytes: float) -> float:
    """Time to move ``nbytes`` at the core's sustained DMA bandwidth (engines capped by its HBM share)."""
    return nbytes / profile.dma_bytes_per_ns


def fraction(ideal_ns: float, device_ns: float) -> float:
    return ideal_ns / device_ns if device_ns > 0 else 0.0
