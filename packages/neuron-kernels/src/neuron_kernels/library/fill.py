"""Filling kernels: a bit pattern written over a tensor (``fill_pattern``) and one iota per tile (``arange_into``).

Both work in place on an HBM tensor viewed flat and write it in tiles of [P, columns] (long DMA runs): the caller
converts a fill value to the words of the tensor's dtype, and decides when an arange is exact (see torch-neuron's
``ops/creation/fill.py``).
"""

from __future__ import annotations

import math

from neuron_hal import Alu, DType, Engine

from .. import isa as nisa
from .. import language as nl
from ..jit import kernel

TILE_BYTES = (16384, 32768, 8192)


def _rows(dst, n: int, per: int, store) -> None:
    """Cover ``n`` flat elements with tiles of [P, per]: ``store(hbm_view, partitions, columns, first_element)``."""
    P = nl.tile_size.pmax
    done = 0
    while done < n:
        left = n - done
        parts, cols = (min(P, left // per), per) if left >= per else (1, left)
        store(type(dst)(dst.owner, dst.dtype, dst.offset + done, ((parts, cols), (cols, 1))), parts, cols, done)
        done += parts * cols


@kernel(name="fill_", tunables={"tile_bytes": TILE_BYTES})
def fill_pattern(dst, pattern, tile_bytes=TILE_BYTES[0]):
    """Write the integer words ``pattern`` repeatedly over the flat integer tensor ``dst`` (in place)."""
    k, n = len(pattern), math.prod(dst.shape)
    per = max(1, min(tile_bytes // (k * dst.dtype.itemsize), nl.cdiv(n // k, nl.tile_size.pmax))) * k
    t = nl.ndarray((nl.tile_size.pmax, per // k, k), dst.dtype, name="fill")
    for j, v in enumerate(pattern):
        nisa.memset(t[:, :, j:j + 1], v, engine=Engine.GPSIMD)
    flat = t.reshape(nl.tile_size.pmax, per)
    _rows(dst, n, per, lambda view, parts, cols, first: nisa.dma_copy(view, flat[:parts, :cols]))


@kernel(name="arange", tunables={"tile_bytes": TILE_BYTES})
def arange_into(dst, start, step, scale=1.0, tile_bytes=TILE_BYTES[0]):
    """dst[i] = (start + i * step) * scale (integers; the iota computes exactly, the tile's dtype rounds, a
    power-of-two ``scale`` of a float tile is exact, the store casts), in place."""
    n = math.prod(dst.shape)
    tdt = DType.int32 if dst.dtype.kind in "iu" else DType.float32
    per = max(1, min(tile_bytes // 4, nl.cdiv(n, nl.tile_size.pmax)))

    def store(view, parts, cols, first):
        t = nl.ndarray((parts, cols), tdt, name="iota")
        nisa.iota(t, (step,), offset=start + first * step, channel_multiplier=cols * step)
        if scale != 1.0:  # -- dyadic aranges (torch-neuron's _dyadic) --
            nisa.tensor_scalar(t, t, Alu.multiply, scale, engine=Engine.VECTOR)
        nisa.dma_copy(view, t)

    _rows(dst, n, per, store)
