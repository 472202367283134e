"""Kernel benchmark cases: each module here defines ``CASES``, a list of :class:`Case`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from neuron_hal import DType
from neuron_kernels import TensorSpec


def spec(shape, dtype) -> TensorSpec:
    return TensorSpec(tuple(int(s) for s in shape), DType.of(dtype))


def nbytes(*specs: TensorSpec) -> int:
    """Bytes of the given tensors in HBM (what a memory-bound kernel must read or write)."""
    return sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)


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
