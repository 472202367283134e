"""Access patterns as numpy views over the bytes of simulated memory.

An :class:`~neuron_hal.isa.AP` names elements of one memory space; here it becomes an
``np.ndarray`` that shares memory with the space's ``uint8`` array, so reads see the bytes and
writes through the view land in them. The view's shape is ``(partitions, *free sizes)``:

- SBUF/PSUM (a 2-D ``uint8`` array ``[partitions, bytes]``): partition ``p`` of the view is row
  ``start_partition + p``, starting ``offset`` bytes into the row.
- HBM (a flat ``uint8`` array): row ``p`` starts at ``address + offset + p * partition_stride``
  elements.

Free strides are in elements and may be zero (broadcast) or negative. Offsets need not be aligned
to the element size: numpy handles unaligned views. numpy checks every view against the size of
the underlying array, so a view can never reach outside it (``ValueError`` otherwise).
"""

from __future__ import annotations

import numpy as np

from neuron_hal.isa import AP, Space

# Unsigned integer types of each element size: same-dtype moves copy these so they are bit exact.
RAW = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def raw_dtype(dtype: np.dtype) -> np.dtype:
    """The unsigned integer type of ``dtype``'s size (for bit-exact copies)."""
    return RAW[np.dtype(dtype).itemsize]


def geometry(ap: AP, partition_stride_bytes: int, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, byte strides) of the view of ``ap``."""
    shape = (ap.partitions, *ap.sizes)
    strides = (partition_stride_bytes, *(st * itemsize for st in ap.strides))
    return shape, strides


def onchip_view(mem: np.ndarray, ap: AP, dtype=None) -> np.ndarray:
    """View of an SBUF/PSUM operand over ``mem`` (``uint8 [partitions, bytes per partition]``; its rows may be
    padded: ``mem`` may be the leading columns of a wider C-contiguous array)."""
    if ap.space is Space.HBM:
        raise ValueError(f"{ap} is an HBM operand; use hbm_view")
    dt = np.dtype(dtype if dtype is not None else ap.dtype.numpy)
    row = mem.strides[0]
    shape, strides = geometry(ap, row, dt.itemsize)
    view = np.ndarray(shape, dt, buffer=_row_buffer(mem), offset=ap.start_partition * row + ap.offset,
                      strides=strides)
    lo, hi = ap.byte_range()
    if ap.start_partition + ap.partitions > mem.shape[0] or (ap.num_elements and (lo < 0 or hi > mem.shape[1])):
        raise ValueError(f"{ap} reaches outside the {mem.shape[0]} x {mem.shape[1]}-byte memory")
    return view


def _row_buffer(mem: np.ndarray) -> np.ndarray:
    """The C-contiguous array whose bytes ``mem`` (rows, possibly padded) starts at."""
    if mem.flags.c_contiguous:
        return mem
    base = mem.base
    if not (isinstance(base, np.ndarray) and base.flags.c_contiguous and base.ctypes.data == mem.ctypes.data
            and base.ndim == 2 and base.strides[0] == mem.strides[0]):
        raise ValueError("on-chip memory must be C-contiguous or the leading columns of a C-contiguous array")
    return base


def hbm_view(hbm: np.ndarray, address: int, ap: AP, dtype=None) -> np.ndarray:
    """View of an HBM operand whose tensor starts at byte ``address`` of the flat ``hbm`` array."""
    return HbmView(ap, dtype)(hbm, address)


class HbmView:
    """Precomputed geometry of an HBM operand; calling it with (hbm, tensor address) gives the view.

    Building a view costs ~1 us; the geometry is computed once per instruction, not per run.
    """

    __slots__ = ("tensor", "offset", "shape", "strides", "dtype")

    def __init__(self, ap: AP, dtype=None):
        if ap.space is not Space.HBM:
            raise ValueError(f"{ap} is not an HBM operand")
        self.dtype = np.dtype(dtype if dtype is not None else ap.dtype.numpy)
        self.tensor, self.offset = ap.tensor, ap.offset
        self.shape, self.strides = geometry(ap, ap.partition_stride * self.dtype.itemsize, self.dtype.itemsize)

    def __call__(self, hbm: np.ndarray, address: int) -> np.ndarray:
        return np.ndarray(self.shape, self.dtype, buffer=hbm, offset=address + self.offset, strides=self.strides)
