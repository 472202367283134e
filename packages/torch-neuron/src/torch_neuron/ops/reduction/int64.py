"""Exact integer sums with an int64 result on the device: sum and cumsum of int64 (wrapping like torch) and
of bool/uint8/int8/int16/int32 when their partial sums could leave int32 (``reduction.sum_dim`` and
``reduction.cumsum`` send those here).

The engines accumulate integers exactly only in int32, so a value is summed byte by byte: the input as
int64 viewed as uint8 ``[..., 8]`` (smaller integers are first cast to int64 on the device, a DMA cast that
sign-extends), the 8 byte planes reduced together by ``reduce.sum`` (each byte sum ``<= 255 * count``, exact
in int32 for ``count < 2**23``), then ``wide_sum.combine_bytes`` carries them into the int64 total modulo
2**64. A cumsum scans the byte planes instead (every prefix is a byte sum of at most ``count`` values) and
carries each prefix the same way. More than ``wide_sum.MAX_COUNT - 1`` values per result is beyond that
proof: the CPU (loud).
"""

from __future__ import annotations

import torch

from neuron_kernels.library import reduce, wide_sum

from ..core.compose import const
from ..core.launch import run
from ..core.variants import contig

INTS = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def exact(dtype: torch.dtype, count: int) -> bool:
    """An int64-result sum of ``count`` values per result of ``dtype`` this module computes exactly."""
    return dtype in INTS and count < wide_sum.MAX_COUNT


def int64_sum(x: torch.Tensor, dims: tuple, oshape: tuple, keepdim: bool) -> torch.Tensor:
    """torch.sum(x, dims, keepdim) of an integer tensor, as int64 (``dims`` and ``oshape`` from ``reduction.plan``)."""
    if x.numel() == 0:
        return const(oshape, 0, torch.int64, x.device)
    x = contig(x if x.dtype is torch.int64 else x.to(torch.int64))
    if not dims:  # nothing reduced (0-d input): the values themselves
        return x.clone().reshape(oshape)
    planes = x.unsqueeze(-1).view(torch.uint8)  # [..., 8]: byte k of each value, least significant first
    sums = run("sum", reduce.sum, planes, dims, keepdim)[0]  # [*oshape, 8] int64, each < 2**31
    words = run("sum", wide_sum.combine_bytes, sums.unsqueeze(-1).view(torch.int32))[0]
    return words.view(torch.int64).view(oshape)


def int64_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """torch.cumsum(x, dim) of an integer tensor, as int64 (``dim`` non-negative, ``x`` not empty)."""
    x = contig(x if x.dtype is torch.int64 else x.to(torch.int64))
    planes = contig(x.unsqueeze(-1).view(torch.uint8))  # [..., 8]: byte k of each value
    sums = run("cumsum", reduce.cumsum, planes, dim)[0]  # [..., 8] int64 prefix byte sums, each < 2**31
    words = run("cumsum", wide_sum.combine_bytes, sums.unsqueeze(-1).view(torch.int32))[0]
    return words.view(torch.int64).view(x.shape)
