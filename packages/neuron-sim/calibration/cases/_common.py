"""What the case modules share: tensor specs and how each toolchain issued NKI's loads and stores.

The published figures come from NKI kernels compiled by the Neuron compiler of their day, which chose the DMA
queue of every ``nl.load`` / ``nl.store``. A case module names the toolchain its figure was measured with and
issues its loads and stores through it (``TOOLCHAIN.load(view)``, ``TOOLCHAIN.store(view, tile)``), so the
kernel's DMAs sit on the queues that toolchain used, as far as published profiles show them:

- ``LEGACY_2024`` (NKI 0.1 ``neuronxcc.nki``, Neuron 2.20-2.21, figures published Sep 2024 - Jan 2025): every
  input load on one queue (``qSyncIO0``), every output store on another (``qGpSimdIO0``): the fused-Mamba
  tutorial's profiles and the NKI performance guide's figures 12, 27 and 30 (Neuron 2.20-2.26 docs).
- ``CURRENT`` (later toolchains, and kernels written with explicit ``nisa.dma_copy``): no published profile
  shows the queue of each load, so the project's default assignment (round robin over the queues) stands in.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_hal import DType
from neuron_kernels import TensorSpec
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl


def spec(shape, dtype) -> TensorSpec:
    return TensorSpec(tuple(shape), DType.of(dtype))


@dataclass(frozen=True)
class Toolchain:
    name: str
    load_queue: int | None  # None: the project's default assignment
    store_queue: int | None

    def load(self, src, dtype=None, name=None):
        """``nl.load``: a new SBUF tile of ``src``'s shape, filled by one DMA (cast when ``dtype`` differs)."""
        t = nl.ndarray(src.shape, dtype or src.dtype, name=name)
        nisa.dma_copy(t, src, queue=self.load_queue)
        return t

    def load_into(self, tile, src) -> None:
        """``tile[...] = nl.load(src)``."""
        nisa.dma_copy(tile, src, queue=self.load_queue)

    def store(self, dst, tile) -> None:
        """``nl.store(dst, value=tile)``."""
        nisa.dma_copy(dst, tile, queue=self.store_queue)


LEGACY_2024 = Toolchain("neuronxcc 2.20-2.21 (NKI 0.1)", load_queue=0, store_queue=8)
CURRENT = Toolchain("later toolchains", load_queue=None, store_queue=None)
