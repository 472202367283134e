"""The sorting engine of :mod:`.sorting`: a stable rank-by-comparison sort along the last dim.

For a row x of n elements, rank_i = #(j placed before i), where j goes before i when x_j orders below x_i
or when they tie and j < i (stability); NaN orders above everything (torch's rule, in both directions).
The [B, n, n] "before" matrix is one pointwise formula program (broadcast compares of values and of
positions, FP32), summed over j by one reduce launch (counts < 2**24 are exact in FP32), in blocks of
whole rows, or of slices of i for long rows, of at most ``CHUNK`` comparisons. The inverse permutation
comes from one scatter (perm[rank_i] = i) and the sorted values from one gather: about five launches per
block, O(n^2) work, so rows longer than ``MAX_ROW`` take the CPU path (see ``sortable``).

Exactness: float16/bfloat16 values are exact in FP32; bool/uint8/int8/int16 are ranked through an
exact float32 copy; int32 compares exactly on GpSimd (elementwise kernels, a few more launches); int64
compares exactly word by word (the int64 comparison ops of :mod:`.pointwise_int64`).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from neuron_hal import DType
from neuron_kernels.library import elementwise, movement, reduce

from .common import contig
from .compose import FLOATS, ew
from .launch import run
from .pointwise_expr import formula, inputs
from .sorting_network import network_fits, network_sort

MAX_ROW = 16384  # longest row ranked on the device (n**2 comparisons)
CHUNK = 1 << 22  # comparison-matrix elements per launch (16 MiB of FP32)
SCAN_MAX = 2048  # longest row of the ops that need whole [n, n] blocks (scans, mode)
SMALL_INTS = (torch.bool, torch.uint8, torch.int8, torch.int16)
RANKABLE = (*FLOATS, *SMALL_INTS, torch.int32, torch.int64)


def sortable(x: torch.Tensor, n: int) -> bool:
    """Whether rows of ``n`` elements of ``x``'s dtype sort exactly on the device."""
    return x.dtype in RANKABLE and n <= MAX_ROW


@lru_cache(maxsize=64)
def _before_expr(descending: bool):
    """1.0 where x_j (input 1) goes before x_i (input 0); inputs 2 and 3 are the positions i and j."""
    xi, xj, pi, pj = inputs(4)
    ni, nj = xi.isnan(), xj.isnan()
    below = xj.gt(xi) if descending else xj.lt(xi)
    tie = xj.eq(xi) + ni * nj
    nan_first = nj * (1.0 - ni) if descending else ni * (1.0 - nj)
    return (below + tie * pj.lt(pi) + nan_first).node


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


def _rank_float(op: str, x: torch.Tensor, descending: bool) -> torch.Tensor:
    """FP32 ranks [B, n] of a contiguous float [B, n] tensor."""
    B, n = x.shape
    pos, node, parts = positions(n, x.device), _before_expr(descending), []
    for rs, cs in blocks(B, n):
        rows = x[rs]
        k, m = rows.shape[0], cs.stop - cs.start
        xi = rows.view(k, n, 1) if m == n else contig(rows[:, cs]).view(k, m, 1)
        before = run(op, formula, xi, rows.view(k, 1, n), pos[cs].view(m, 1), pos.view(1, n), expr=node,
                     out_dtype=DType.float32)[0]
        parts.append(run(op, reduce.sum, before, (2,), False)[0])
    return join(parts, B, n)


def join(parts, B: int, n: int) -> torch.Tensor:
    """The per-block results back into [B, n] (blocks are whole rows, or pieces of one row in order)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p.reshape(-1) for p in parts]).view(B, n)


def _compares(op: str, int64: bool):
    """(below, eq) compares of exact integers: the int32 kernels (GpSimd), or int64 word by word."""
    if int64:  # the int64 comparison ops of pointwise_int64
        return (lambda a, b: torch.lt(a, b), lambda a, b: torch.gt(a, b)), torch.eq
    return ((lambda a, b: ew(op, elementwise.lt, a, b), lambda a, b: ew(op, elementwise.gt, a, b)),
            lambda a, b: ew(op, elementwise.eq, a, b))


def _rank_int(op: str, x: torch.Tensor, descending: bool) -> torch.Tensor:
    """FP32 ranks of a contiguous int32 or int64 [B, n] tensor, by exact integer compares."""
    B, n = x.shape
    pos = iota(n, x.device)
    (lt, gt), eq = _compares(op, x.dtype == torch.int64)
    parts = []
    for rs, cs in blocks(B, n):
        rows = x[rs]
        k, m = rows.shape[0], cs.stop - cs.start
        xi, xj = contig(rows[:, cs]).view(k, m, 1), rows.view(k, 1, n)
        earlier = ew(op, elementwise.lt, pos.view(1, n), contig(pos[cs]).view(m, 1))
        tie = ew(op, elementwise.logical_and, eq(xj, xi), earlier)
        before = ew(op, elementwise.logical_or, (gt if descending else lt)(xj, xi), tie)
        before = run(op, movement.copy, before, dtype=torch.float32)[0]
        parts.append(run(op, reduce.sum, before, (2,), False)[0])
    return join(parts, B, n)


def ranks(op: str, x: torch.Tensor, descending: bool) -> torch.Tensor:
    """int32 [B, n] stable ranks of the rows of a contiguous [B, n] tensor (a RANKABLE dtype)."""
    if x.dtype in (torch.int32, torch.int64):
        r = _rank_int(op, x, descending)
    else:
        xf = x if x.dtype in FLOATS else run(op, movement.copy, x, dtype=torch.float32)[0]
        r = _rank_float(op, xf, descending)
    return run(op, movement.copy, r, dtype=torch.int32)[0]


def sort_rows(op: str, x: torch.Tensor, descending: bool, want_values: bool = True):
    """(sorted values or None, int32 permutation) of the rows of a contiguous [B, n] tensor, stable: by the
    sorting network where the rows fit it (:mod:`.sorting_network`), else by ranks."""
    B, n = x.shape
    if B and network_fits(x.dtype, n):
        values, perm = network_sort(op, x, descending)
        return (values if want_values else None), perm
    r = ranks(op, x, descending)
    src = contig(iota(n, x.device).expand(B, n))
    perm = run(op, movement.scatter, r, 1, r, src)[0]  # r is a same-shape, same-dtype placeholder
    values = run(op, movement.gather, x, 1, perm)[0] if want_values else None
    return values, perm


def to_int64(op: str, t: torch.Tensor) -> torch.Tensor:
    return run(op, movement.copy, t, dtype=torch.int64)[0]
