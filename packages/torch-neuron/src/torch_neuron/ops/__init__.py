"""aten ops on the neuron device, each as neuron-kernels programs through the HAL.

``core`` holds the machinery (launches, registration, checks, variants, the CPU fallback, copies, decompositions);
every other package is one op family and registers its ops in its ``register(lib)``. Then ops without a kernel
that PyTorch can decompose run the decomposition on the device (``core.decomp``); the rest take the loud CPU
fallback.
"""

from __future__ import annotations

import importlib

from .core import decomp, registry

FAMILIES = (
    'core', 'attention', 'conv', 'creation', 'embedding', 'foreach', 'indexing', 'linalg', 'loss',
    'normalization', 'pointwise', 'pool', 'random', 'reduction', 'resample', 'rnn', 'sorting', 'tensor',
)


def register() -> None:
    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}").register(registry.LIB)
    # last: PyTorch's decompositions for the ops that are still without a kernel
    decomp.DECOMPOSED[:] = decomp.register()
