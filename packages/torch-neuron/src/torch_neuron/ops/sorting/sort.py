"""sort (stable or not, either direction, any dim), topk, kthvalue, median, nanmedian and mode on the device.

All of them sort rows with :mod:`.network` (a stable bitonic-network sort, NaN largest) after moving the
dim last, then pick positions: topk the first k of the sorted row, kthvalue position k-1, median the lower
middle (or the first NaN: torch's median is NaN with the NaN's index when a row holds one), nanmedian the lower
middle of the non-NaN values; mode counts equal values with an [n, n] formula. Where torch's order of ties
comes from libstdc++'s unstable algorithms (sort with stable=False, topk, mode), the device returns the stable
choice for float32/int32, whose values rarely tie, and hands dtypes where ties are common (16-bit floats, small
ints) to the CPU unless torch's order is stable there too (rows of at most 16); a float32/int32 topk whose
selected head does hold a tie also takes the CPU's answer. kthvalue and median pick the stable index among ties.
Rows longer than the network's ``max_row`` (mode: ``MAX_ROW``), float64 and other dtypes take the counted CPU
path (int64 sorts with stable=True or short rows, and its kthvalue/median, run on the device).
"""

from __future__ import annotations

import torch

from neuron_hal import DType
from neuron_kernels.library import elementwise, movement, reduce
from neuron_kernels.library.formula import formula, inputs, maximum, where

from ..core.compose import ew, index32, write_outs
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from .network import SORTABLE, sort_rows, sortable
from .rank import MAX_ROW, blocks, iota, join, to_int64

aten = torch.ops.aten
WIDE_KEYS = (torch.float32, torch.int32)  # dtypes whose values rarely tie
_F32 = DType.float32


def wrap_dim(x: torch.Tensor, dim: int) -> int:
    n = max(x.dim(), 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def rows_of(x: torch.Tensor, dim: int):
    """(contiguous [B, n] rows along ``dim``, the moved shape) for a tensor of at least one dim."""
    moved = x.movedim(dim, -1)
    return contig(moved).reshape(-1, moved.shape[-1]), moved.shape


def unrows(t: torch.Tensor, moved_shape, dim: int) -> torch.Tensor:
    """Rows [B, m] back into the input's layout with the sorted dim of size m at ``dim``."""
    return contig(t.reshape(*moved_shape[:-1], t.shape[-1]).movedim(-1, dim))


def _sort(x: torch.Tensor, dim: int, descending: bool, op: str = "sort"):
    """(values, int64 indices) of a stable sort of a >= 1-d tensor whose rows are sortable."""
    rows, moved = rows_of(x, dim)
    values, perm = sort_rows(op, rows, descending, int64_indices=True)
    return unrows(values, moved, dim), unrows(perm, moved, dim)


def _trivial(x: torch.Tensor):
    """(values, indices) when there is nothing to reorder (empty, 0-d or rows of one element)."""
    return contig(x).clone(), torch.zeros(x.shape, dtype=torch.int64, device=x.device)


def sort_stable(self, *, stable=None, dim=-1, descending=False):
    d = wrap_dim(self, dim)
    if self.numel() == 0 or self.dim() == 0 or self.shape[d] == 1:
        if self.dtype in SORTABLE:
            return _trivial(self)
    n = self.shape[d] if self.dim() else 1
    # stable=False: torch's CPU order of equal values is std::sort's, stable (insertion sort) up to 16
    # elements only; the device's is stable. Where ties are common (16-bit floats, small ints) longer rows
    # take the CPU path to give torch's indices.
    if not sortable(self, n) or (not stable and n > 16 and self.dtype not in WIDE_KEYS):
        return on_cpu(aten.sort.stable, self, stable=stable, dim=dim, descending=descending)
    return _sort(self, d, descending)


def sort_values_stable(self, *, stable=None, dim=-1, descending=False, values, indices):
    return write_outs((values, indices), sort_stable(self, stable=stable, dim=dim, descending=descending))


def sort_default(self, dim=-1, descending=False):
    return sort_stable(self, stable=False, dim=dim, descending=descending)


def sort_values(self, dim=-1, descending=False, *, values, indices):
    return write_outs((values, indices), sort_default(self, dim, descending))


# -- topk / kthvalue ------------------------------------------------------------------------------------
def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    # torch's order of tied values is libstdc++'s (partial_sort / nth_element: unspecified); the device's
    # is stable. Where ties are common (16-bit floats, small ints) the CPU path gives torch's indices.
    if not 0 <= k <= n or not sortable(self, n) or self.numel() == 0 or self.dtype not in WIDE_KEYS:
        return on_cpu(aten.topk.default, self, k, dim, largest, sorted)
    if self.dim() == 0:
        return _trivial(self)
    values, idx = _sort(self, d, largest, "topk")
    if _ties_in_head(values, d, k):
        return on_cpu(aten.topk.default, self, k, dim, largest, sorted)
    return contig(values.narrow(d, 0, k)), contig(idx.narrow(d, 0, k))


def _ties_in_head(values: torch.Tensor, d: int, k: int) -> bool:
    """Whether two of the first k + 1 sorted values of a row are equal: then torch's choice and order of the
    tied indices (libstdc++'s) may differ from the stable one, and models do tie in float32 (ReLU'd scores that
    are all 0, masked scores at -inf in a sparse-attention indexer), so such calls take the CPU's answer."""
    m = min(k + 1, values.shape[d])
    if m < 2:
        return False
    head = values.narrow(d, 0, m)
    return bool((head.narrow(d, 1, m - 1) == head.narrow(d, 0, m - 1)).any())


def topk_values(self, k, dim=-1, largest=True, sorted=True, *, values, indices):  # noqa: A002
    return write_outs((values, indices), topk(self, k, dim, largest, sorted))


def _pick(op: str, x: torch.Tensor, dim: int, keepdim: bool, pos_fn):
    """(values, int64 indices) at per-row positions of the ascending rows along ``dim``:
    ``pos_fn(op, rows, sorted rows) -> int32 [B, 1]``."""
    shape = list(x.shape)
    shape[dim] = 1
    if x.numel() == 0:  # no rows (another dim is empty): empty results
        v, i = torch.empty(shape, dtype=x.dtype, device=x.device), torch.empty(shape, dtype=torch.int64,
                                                                               device=x.device)
    else:
        rows, _ = rows_of(x, dim)
        values, perm = sort_rows(op, rows, False)
        pos = pos_fn(op, rows, values)
        v = run(op, movement.gather, values, 1, pos)[0].view(shape)
        i = to_int64(op, run(op, movement.gather, perm, 1, pos)[0]).view(shape)
    if not keepdim:
        v, i = v.squeeze(dim), i.squeeze(dim)
    return v, i


def _fixed(p: int):
    def pos(op, rows, _sorted):
        return contig(iota(p + 1, rows.device)[p:].expand(rows.shape[0], 1))
    return pos


def kthvalue(self, k, dim=-1, keepdim=False):
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    if not 1 <= k <= n or not sortable(self, n):
        return on_cpu(aten.kthvalue.default, self, k, dim, keepdim)
    if self.dim() == 0:
        return _trivial(self)
    return _pick("kthvalue", self, d, keepdim, _fixed(k - 1))


def kthvalue_values(self, k, dim=-1, keepdim=False, *, values, indices):
    return write_outs((values, indices), kthvalue(self, k, dim, keepdim))


# -- median / nanmedian ---------------------------------------------------------------------------------
def _non_nan_count(op: str, rows: torch.Tensor) -> torch.Tensor:
    """FP32 [B, 1] count of the non-NaN values of each row (exact: rows are shorter than 2**24)."""
    if not rows.dtype.is_floating_point:  # integers are never NaN
        return torch.full((rows.shape[0], 1), float(rows.shape[1]), device=rows.device)
    ok = ew(op, elementwise.eq, rows, rows)
    return run(op, reduce.sum, run(op, movement.copy, ok, dtype=torch.float32)[0], (1,), True)[0]


_X = inputs(1)[0]


def _median_pos(nan_aware: bool):
    """int32 [B, 1] positions in the ascending rows: with a NaN in the row (counted c < n non-NaN) the
    first NaN sits at position c; else the lower middle. nanmedian: the lower middle of the c non-NaN
    values (position 0 when there are none)."""
    def pos(op, rows, _sorted):
        n = rows.shape[1]
        c = _non_nan_count(op, rows)
        if nan_aware:
            e = maximum(_X - 1.0, 0.0) * 0.5
        else:
            e = where(_X.lt(float(n)), _X, float((n - 1) // 2))
        p = run(op, formula, c, expr=e.node, out_dtype=_F32)[0]
        return run(op, movement.copy, p, dtype=torch.int32)[0]  # truncation = floor of a non-negative
    return pos


def _median_dim(op, cpu_op, nan_aware, self, dim, keepdim):
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    if n == 0 or not sortable(self, n):
        return on_cpu(cpu_op, self, dim, keepdim)
    if self.dim() == 0:
        return _trivial(self)
    return _pick(op, self, d, keepdim, _median_pos(nan_aware))


def median_dim(self, dim, keepdim=False):
    return _median_dim("median", aten.median.dim, False, self, dim, keepdim)


def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim("nanmedian", aten.nanmedian.dim, True, self, dim, keepdim)


def median_all(self):
    if self.numel() == 0 or not sortable(self, self.numel()):
        return on_cpu(aten.median.default, self)
    return median_dim(self.reshape(-1), 0)[0].view(())


def nanmedian_all(self):
    if self.numel() == 0 or not sortable(self, self.numel()):
        return on_cpu(aten.nanmedian.default, self)
    return nanmedian_dim(self.reshape(-1), 0)[0].view(())


def _values_out(fn):
    def run_out(self, dim, keepdim=False, *, values, indices):
        return write_outs((values, indices), fn(self, dim, keepdim))
    return run_out


# -- mode -----------------------------------------------------------------------------------------------
_XI, _XJ = inputs(2)
# 1.0 where x_j equals x_i, NaN equal to NaN (torch's own sort-and-count leaves NaN runs unspecified)
_SAME = (_XJ.eq(_XI) + _XI.isnan() * _XJ.isnan()).node


def _positions1(n: int, device) -> torch.Tensor:
    """FP32 1..n (a row position plus one, so that 0 means "no hit")."""
    return run("mode", movement.copy, iota(n + 1, device)[1:], dtype=torch.float32)[0]


def _mode_rows(op: str, rows: torch.Tensor):
    """(values [B, 1], int32 indices [B, 1]): the smallest most frequent value and its last index."""
    B, n = rows.shape
    xf = rows if rows.dtype in FLOATS else run(op, movement.copy, rows, dtype=torch.float32)[0]
    counts = []
    for rs, cs in blocks(B, n):
        rows_j = xf[rs]
        k, m = rows_j.shape[0], cs.stop - cs.start
        xi = rows_j.view(k, n, 1) if m == n else contig(rows_j[:, cs]).view(k, m, 1)
        same = run(op, formula, xi, rows_j.view(k, 1, n), expr=_SAME, out_dtype=_F32)[0]
        counts.append(run(op, reduce.sum, same, (2,), False)[0])
    count = join(counts, B, n)
    best = run(op, reduce.amax, count, (1,), True)[0]
    _, perm = sort_rows(op, rows, False)
    sorted_count = run(op, movement.gather, count, 1, perm)[0]
    first = run(op, reduce.argmax, ew(op, elementwise.eq, sorted_count, best), 1, True)[0]  # smallest value
    first = run(op, movement.gather, perm, 1, index32(first, op))[0]
    value = run(op, movement.gather, xf, 1, first)[0]
    # the last index holding that value: row positions where same(x_j, value), highest wins
    hit = run(op, formula, value.view(B, 1, 1), xf.view(B, 1, n), expr=_SAME, out_dtype=_F32)[0].view(B, n)
    score = ew(op, elementwise.mul, hit, _positions1(n, rows.device))
    last = run(op, reduce.amax, score, (1,), True)[0]
    idx = run(op, movement.copy, ew(op, elementwise.sub, last, 1.0), dtype=torch.int32)[0]
    return run(op, movement.gather, rows, 1, idx)[0], idx


def mode(self, dim=-1, keepdim=False):
    d = wrap_dim(self, dim)
    n = self.shape[d] if self.dim() else 1
    # torch counts runs after std::sort, whose order of equal values is stable (insertion sort) only up to 16
    # elements: beyond that the index of a tie is unspecified, so dtypes where ties are common go to the CPU.
    # int32 goes there too (the equality counts are FP32 formulas).
    if self.numel() == 0 or not sortable(self, n) or n > MAX_ROW or self.dtype in (torch.int32, torch.int64) \
            or (self.dtype not in WIDE_KEYS and n > 16):
        return on_cpu(aten.mode.default, self, dim, keepdim)
    if self.dim() == 0:
        return _trivial(self)
    rows, moved = rows_of(self, d)
    v, i = _mode_rows("mode", rows)
    shape = list(self.shape)
    shape[d] = 1
    v, i = v.view(shape), to_int64("mode", i).view(shape)
    return (v, i) if keepdim else (v.squeeze(d), i.squeeze(d))


def mode_values(self, dim=-1, keepdim=False, *, values, indices):
    return write_outs((values, indices), mode(self, dim, keepdim))
