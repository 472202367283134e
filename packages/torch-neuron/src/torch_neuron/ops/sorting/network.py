"""The sorting engine of :mod:`.sorting` and :mod:`.unique`: stable row sorts by the bitonic sorting
network of :mod:`neuron_kernels.library.sort` (one launch for all rows, n log^2 n per row, NaN largest in both
directions, ties in index order), for every dtype in ``SORTABLE`` and rows up to the kernel's ``max_row``
(128 partitions of a power-of-two segment: 1M elements of 16/32-bit floats, 512K of int32/int64). int64 rows
travel as their int32 word arrays.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import sort as network

from ...runtime import runtime
from ..core.dtypes import TORCH_TO_DTYPE
from ..core.launch import run

SMALL_INTS = (torch.bool, torch.uint8, torch.int8, torch.int16)
SORTABLE = (torch.float32, torch.bfloat16, torch.float16, *SMALL_INTS, torch.int32, torch.int64)


def max_row(dtype: torch.dtype) -> int:
    """The longest row of ``dtype`` the network sorts on this device's profile."""
    words = dtype == torch.int64
    return network.max_row(TORCH_TO_DTYPE[torch.int32 if words else dtype], runtime().profile, words)


def sortable(x: torch.Tensor, n: int) -> bool:
    """Whether rows of ``n`` elements of ``x``'s dtype sort exactly on the device."""
    return x.dtype in SORTABLE and n <= max_row(x.dtype)


def sort_rows(op: str, x: torch.Tensor, descending: bool, int64_indices: bool = False):
    """(sorted values, permutation: int32, or int64 with ``int64_indices``) of the rows of a contiguous [B, n]
    tensor of a ``sortable`` row length: stable, NaN largest."""
    B, n = x.shape
    if x.dtype == torch.int64:
        values, perm = run(op, network.sort, x.view(torch.int32).view(B, n, 2), descending=bool(descending),
                           int64_indices=int64_indices)
        return values.view(torch.int64).view(B, n), perm
    return run(op, network.sort, x, descending=bool(descending), int64_indices=int64_indices)
