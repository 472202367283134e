"""Helpers of the ops built on [n, n] comparison formulas (mode's counts, scans, unique's slices, searching):
position constants made once per size, blocks of at most ``CHUNK`` pairs (i, j), the joins of their results,
and exact integer compares. Sorting itself is :mod:`.network`'s.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from neuron_kernels.library import elementwise, movement

from ..core.compose import ew
from ..core.launch import run

MAX_ROW = 16384  # longest row of the ops with [n, n] comparison work in blocks (mode, unique)
CHUNK = 1 << 22  # comparison-matrix elements per launch (16 MiB of FP32)
SCAN_MAX = 2048  # longest row of the ops that need whole [n, n] blocks (scans)


@lru_cache(maxsize=256)
def _host_const(kind: str, n: int, device: torch.device) -> torch.Tensor:
    """0..n-1 as int32 (``iota``) or float32 (``pos``, exact below 2**24), made on the host once per size
    and copied over."""
    return torch.arange(n, dtype=torch.int32 if kind == "iota" else torch.float32).to(device)


def iota(n: int, device) -> torch.Tensor:
    return _host_const("iota", n, device)


def positions(n: int, device) -> torch.Tensor:
    return _host_const("pos", n, device)


def row_blocks(B: int, n: int) -> list[slice]:
    """Slices of whole rows with at most ~CHUNK pairs (i, j) each (for rows of at most SCAN_MAX)."""
    step = max(1, CHUNK // (n * n))
    return [slice(b, min(b + step, B)) for b in range(0, B, step)]


def blocks(B: int, n: int):
    """(row slice, column slice of i) blocks covering [B, n] with at most ~CHUNK comparisons each: whole
    rows when a row's n * n fits, else slices of i within one row."""
    if n * n <= CHUNK:
        step = CHUNK // (n * n)
        return [(slice(b, min(b + step, B)), slice(0, n)) for b in range(0, B, step)]
    step = max(1, CHUNK // n)
    return [(slice(b, b + 1), slice(i, min(i + step, n))) for b in range(B) for i in range(0, n, step)]


def join(parts, B: int, n: int) -> torch.Tensor:
    """The per-block results back into [B, n] (blocks are whole rows, or pieces of one row in order)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p.reshape(-1) for p in parts]).view(B, n)


def to_int64(op: str, t: torch.Tensor) -> torch.Tensor:
    return run(op, movement.copy, t, dtype=torch.int64)[0]


def int_compares(op: str, int64: bool):
    """((lt, gt), eq) bool compares of exact integers: the int32 kernels (GpSimd), or int64 word by word."""
    if int64:  # the int64 comparison ops of pointwise.int64
        return (lambda a, b: torch.lt(a, b), lambda a, b: torch.gt(a, b)), torch.eq
    return ((lambda a, b: ew(op, elementwise.lt, a, b), lambda a, b: ew(op, elementwise.gt, a, b)),
            lambda a, b: ew(op, elementwise.eq, a, b))
