"""put_ and masked_scatter_, composed of the native index, scan and select ops.

``put_`` indexes ``self`` as if flattened (row-major, negative indices wrapped): an index_copy_ or
index_add_ on the flat view (a contiguous copy written back for a strided ``self``). ``masked_scatter_``
takes source elements in order for the set positions of the (broadcast) mask: their ranks are the mask's
running count, read once to the host to check that ``source`` has enough elements, as torch does.
"""

from __future__ import annotations

import torch

from ..core.checks import same_device
from ..core.fallback import on_cpu
from .gather_scatter import index32

aten = torch.ops.aten
_NATIVE = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int16, torch.int8, torch.uint8,
           torch.bool)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1) if x.is_contiguous() else x.contiguous().view(-1)


def put_(x, index, source, accumulate=False):
    same_device(x, index, source)
    if x.dtype not in _NATIVE or source.dtype != x.dtype or index.dtype != torch.int64 or (
            accumulate and x.dtype == torch.bool):
        return on_cpu(aten.put_.default, x, index, source, accumulate)
    if index.numel() != source.numel():
        raise RuntimeError(f"put_(): Expected source and index to have the same number of elements, but got "
                           f"source.numel() = {source.numel()}, index.numel() = {index.numel()}")
    if index.numel() == 0:
        return x
    n = x.numel()
    idx = index32("put_", index.reshape(-1), n, wrap=True,  # exact range check, negatives wrapped
                  message=lambda v: f"out of range: tried to access index {v} on a tensor of {n} elements.")
    idx = idx.to(torch.int64)
    flat = _flat(x)
    if accumulate:
        flat.index_add_(0, idx, source.reshape(-1))
    else:
        flat.index_copy_(0, idx, source.reshape(-1))
    if flat.data_ptr() != x.data_ptr() or not x.is_contiguous():
        x.copy_(flat.view(x.shape))
    return x


def masked_scatter_(x, mask, source):
    same_device(x, mask, source)
    if x.dtype not in _NATIVE or source.dtype != x.dtype or mask.dtype != torch.bool or x.numel() >= 2**24:
        return on_cpu(aten.masked_scatter_.default, x, mask, source)
    m = mask.expand(x.shape)  # torch's error when mask does not broadcast to self
    if x.numel() == 0:
        return x
    rank = torch.cumsum(_flat(m).to(torch.float32), 0)  # exact in FP32: counts below 2**24
    count = int(rank[-1])
    if count > source.numel():
        raise RuntimeError("masked_scatter: expected source to have at least as many elements as the ones in "
                           f"mask ({count}), got {source.numel()}")
    if count == 0:
        return x
    taken = _flat(source)[:count].index_select(0, (rank - 1).clamp(min=0).to(torch.int32))
    x.copy_(torch.where(m, taken.view(x.shape), x))
    return x
