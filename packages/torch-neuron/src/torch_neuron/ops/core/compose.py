"""Small building blocks for ops composed of several kernel launches: one elementwise launch, host-made
constants, exact int64 -> int32 index conversion, and ``out=`` for ops with several results."""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise, movement

from .launch import run
from .variants import contig, write_out


def ew(op: str, kernel, *args, **kwargs) -> torch.Tensor:
    """One elementwise kernel launch charged to ``op`` (tensor arguments must be contiguous)."""
    return run(op, kernel, *args, **kwargs)[0]


def const(shape, value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor filled with ``value``, made on the host and copied over (for empty reductions and other
    rare cases; the copy is a plain DMA write)."""
    return torch.full(tuple(shape), value, dtype=dtype).to(device)


def _words(t: torch.Tensor, op: str) -> torch.Tensor:
    """[2, n] int32: the low and the high 32-bit words of an int64 tensor's values (little endian)."""
    pairs = contig(t).reshape(-1).view(torch.int32).view(-1, 2)
    return run(op, movement.transpose, pairs, 0, 1)[0]


def index32(t: torch.Tensor, op: str) -> torch.Tensor:
    """An index tensor as int32 for the DMA gather/scatter kernels, exactly: an int64 value in
    [0, 2**31) keeps its value, any other becomes -1, which every table rejects as out of range, so
    nothing is silently wrapped. int32 tensors pass through."""
    if t.dtype == torch.int32:
        return contig(t)
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=torch.int32, device=t.device)
    w = _words(t, op)
    return ew(op, elementwise.where, w[1], -1, w[0]).view(t.shape)  # high word set: negative or >= 2**32


def write_outs(outs, results) -> tuple:
    """``out=`` for an op with several results (each out resized and cast as aten does; an out whose result
    was not asked for, a backward's masked gradient, is left as it is)."""
    return tuple(o if r is None else write_out(o, r) for o, r in zip(outs, results))
