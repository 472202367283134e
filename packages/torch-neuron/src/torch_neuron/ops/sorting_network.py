"""Stable row sorts by the bitonic sorting network of :mod:`neuron_kernels.library.sort` (n log^2 n per row, one
launch for all rows): the engine of :mod:`.sorting_rank`'s ``sort_rows`` for rows of more than ``RANK_MAX``
elements that fit one partition (``network_fits``). int64 rows travel as their int32 word arrays."""

from __future__ import annotations

import torch

from neuron_kernels.library import sort as network

from ..runtime import runtime
from .launch import TORCH_TO_DTYPE, run

# rows of at most this many elements rank faster (a few launches of n^2 compares beat the network's
# k(k+1)/2 dependent steps; see bench/torch_ops.py "sort")
RANK_MAX = 16
NETWORK_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.uint8, torch.int8, torch.int16,
                  torch.int32, torch.int64)


def network_fits(dtype: torch.dtype, n: int) -> bool:
    """Whether rows of ``n`` elements of ``dtype`` take the network (longer than RANK_MAX, short enough for SBUF)."""
    if dtype not in NETWORK_DTYPES or n <= RANK_MAX:
        return False
    words = dtype == torch.int64
    return n <= network.max_row(TORCH_TO_DTYPE[torch.int32 if words else dtype], runtime().profile, words)


def network_sort(op: str, x: torch.Tensor, descending: bool):
    """(sorted values, int32 permutation) of the rows of a contiguous [B, n] tensor: stable, NaN largest."""
    B, n = x.shape
    if x.dtype == torch.int64:
        values, perm = run(op, network.sort, x.view(torch.int32).view(B, n, 2), descending=bool(descending))
        return values.view(torch.int64).view(B, n), perm
    return run(op, network.sort, x, descending=bool(descending))
