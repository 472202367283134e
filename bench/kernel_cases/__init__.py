"""Kernel benchmark cases: each module here defines ``CASES``, a list of :class:`Case`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Case:
    family: str  # printed name, e.g. "matmul"
    kernel: object  # a neuron_kernels Kernel
    args: tuple  # TensorSpecs and constants, as the kernel takes them
    shape: str  # printed shape label, e.g. "4096x4096x4096"
    dtype: str
    roofline: str  # "tensor" (work = FLOPs) or "dma" (work = bytes that must cross HBM)
    work: float
    kwargs: dict = field(default_factory=dict)
