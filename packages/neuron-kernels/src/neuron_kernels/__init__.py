"""neuron-kernels: an NKI-style tile kernel language over neuron-hal.

    import neuron_kernels as nk
    from neuron_kernels import language as nl, isa as nisa

    @nk.kernel
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.hbm)
        for i in nl.affine_range(nl.cdiv(a.shape[0], nl.tile_size.pmax)):
            rows = slice(i * 128, min(a.shape[0], (i + 1) * 128))
            nl.store(out[rows], nl.add(nl.load(a[rows]), nl.load(b[rows])))
        return out

Kernels reach devices only through neuron_hal, never by importing the simulator.
"""

import _neuron_kernels_nki

from . import isa, language
from .errors import KernelError
from .jit import Kernel, TensorSpec, jit, kernel

_neuron_kernels_nki.register()  # ``import nki`` answers with neuron_kernels.nki when AWS's nki is absent

__version__ = "0.0.1"
__all__ = ["Kernel", "KernelError", "TensorSpec", "isa", "jit", "kernel", "language"]
