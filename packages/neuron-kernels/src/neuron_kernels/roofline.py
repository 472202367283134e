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


def kernel_ns(profile: Profile, device_ns: float) -> float:
    """A program's own span: its device time less the runtime's per-launch start-up and tear-down, which every
    program pays whatever its kernel does (the launch is the runtime's cost, not the kernel's)."""
    return max(0.0, device_ns - profile.launch_ns)


def fraction(profile: Profile, ideal_ns: float, device_ns: float) -> float:
    """How close a kernel comes to its roofline: ``ideal_ns`` over its own span (``kernel_ns``)."""
    span = kernel_ns(profile, device_ns)
    return ideal_ns / span if span > 0 else 0.0
