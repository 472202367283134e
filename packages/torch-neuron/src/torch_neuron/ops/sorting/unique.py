"""unique (``_unique2``, ``_unique``) and unique_consecutive over the flattened tensor.

The values are sorted (:mod:`.network`; unique_consecutive keeps the order), a new group starts
where a value differs from its predecessor (NaN differs from everything, so each NaN is its own group, as
torch's), and the group number of each element is the running count of starts. The number of groups is
read to the host (the output's size depends on the data, as on torch's CPU and CUDA). The output is a
scatter of each group's first value to the group's slot (torch's pick: -0.0 or 0.0), the inverse a scatter
of group numbers to the elements' original positions, counts a scatter_add of ones. unique_consecutive
and unique with ``dim=`` (unique_dim) compare whole slices; unique_dim orders them lexicographically as
torch's comparator does (one [n, n, M] formula, the first ordered column by argmax, a stable rank), up to
``CHUNK`` compares. Integers compare exactly: int32 on GpSimd, int64 word by word (the int64 comparison ops
of :mod:`..pointwise.int64`), so values beyond 32 bits stay apart. float64 takes the counted CPU path, as do
unique's inputs longer than ``MAX_ROW`` (its group scatters move one element per index).
"""

from __future__ import annotations

import torch

from neuron_hal import DType
from neuron_kernels.library import elementwise, movement, reduce
from neuron_kernels.library.formula import formula, inputs

from ..core.compose import ew, index32
from ..core.copy import to_host
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from .network import SORTABLE, sort_rows, sortable
from .rank import CHUNK, MAX_ROW, int_compares, iota, positions, to_int64

aten = torch.ops.aten
F32 = DType.float32


def _ne(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bool a != b, exact for every dtype the module takes (the elementwise kernels stop at 32 bits)."""
    return torch.ne(a, b) if a.dtype is torch.int64 else ew(op, elementwise.ne, a, b)


def _groups(op: str, s, n: int = 0, starts=None, device=None):
    """(int32 group number per element, number of groups, FP32 1.0 where a group starts): a new group where
    an element of the 1-d ``s`` differs from the one before it (or where ``starts``, bool [n - 1], says so
    for elements 1..n-1)."""
    if s is not None:
        n, device = s.shape[0], s.device
        starts = _ne(op, s[1:], s[:n - 1]) if n > 1 else None
    flags = torch.ones(n, dtype=torch.float32).to(device)  # element 0 starts a group
    if starts is not None:
        flags = torch.cat((flags[:1], run(op, movement.copy, starts, dtype=torch.float32)[0]))
    group = run(op, reduce.cumsum, flags, 0)[0]  # exact in FP32 below 2**24
    count = int(to_host(group[n - 1:]).item())
    return run(op, movement.copy, ew(op, elementwise.sub, group, 1.0), dtype=torch.int32)[0], count, flags


def _firsts(op: str, group, flags, u: int, values, dim_shape=None):
    """values[i] of each group's first element i (torch's output), scattered along dim 0; the other
    elements go to a spare slot u that is cut off."""
    target = ew(op, elementwise.where, flags, group, u)
    if dim_shape is not None:
        target = contig(target.view(-1, 1).expand(values.shape))
    base = torch.empty((u + 1, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return run(op, movement.scatter, base, 0, target, values)[0][:u]


def _results(op: str, values: torch.Tensor, order, shape, return_inverse: bool, return_counts: bool):
    """(output, inverse, counts) from the ordered 1-d values and ``order`` (int32 original position of each,
    None when already in place)."""
    group, u, flags = _groups(op, values)
    out = _firsts(op, group, flags, u, values)
    return _extras(op, out, group, order, shape, u, return_inverse, return_counts)


def _extras(op: str, out, group, order, shape, u: int, return_inverse: bool, return_counts: bool):
    """(out, inverse, counts): the inverse scatters group numbers back to the original positions, counts
    add one per element into its group."""
    device = out.device
    inverse = counts = torch.empty(0, dtype=torch.int64, device=device)
    if return_inverse:
        inv = group if order is None else run(op, movement.scatter, group, 0, order, group)[0]
        inverse = to_int64(op, inv).view(shape)
    if return_counts:
        ones = torch.ones(group.shape[0], dtype=torch.float32).to(device)
        zeros = torch.zeros(u, dtype=torch.float32).to(device)
        counts = to_int64(op, run(op, movement.scatter_add, zeros, 0, group, ones)[0])
    return out, inverse, counts


def _empty(self, return_inverse: bool, return_counts: bool):
    e = torch.empty(0, dtype=torch.int64, device=self.device)
    inv = torch.empty(self.shape, dtype=torch.int64, device=self.device) if return_inverse else e
    return torch.empty(0, dtype=self.dtype, device=self.device), inv, e


def unique2(self, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    if self.numel() == 0 and self.dtype in SORTABLE:
        return _empty(self, return_inverse, return_counts)
    if not sortable(self, self.numel()) or self.numel() > MAX_ROW:
        return on_cpu(aten._unique2.default, self, sorted, return_inverse, return_counts)
    op = "unique"
    values, perm = sort_rows(op, contig(self).reshape(1, -1), False)
    return _results(op, values.view(-1), perm.view(-1), self.shape, return_inverse, return_counts)


def unique(self, sorted=True, return_inverse=False):  # noqa: A002
    out, inverse, _ = unique2(self, sorted, return_inverse, False)
    return out, inverse


def _shape_only(op, self, *args):
    """Results that depend on the input's shape alone (an empty input's, or torch's error for a 0-d one):
    torch computes them on a CPU tensor of that shape, no data moves."""
    out = op(torch.empty(self.shape, dtype=self.dtype), *args)
    return tuple(t.to(self.device) for t in out)


def _consecutive_rows(self, dim: int, return_inverse: bool, return_counts: bool):
    """unique_consecutive along ``dim``: slices along dim compared whole (a new group where any element
    differs from the slice before), the output gathers each group's slice."""
    op = "unique_consecutive"
    n = self.shape[dim]
    rows = contig(self.movedim(dim, 0)).reshape(n, -1)
    if n > 1:
        diff = _ne(op, rows[1:], rows[:n - 1])
        starts = run(op, reduce.amax, diff, (1,), False)[0]
    else:
        starts = None
    group, u, flags = _groups(op, None, n, starts, self.device)
    out = _firsts(op, group, flags, u, rows, rows.shape)
    moved = self.movedim(dim, 0).shape
    out = contig(out.view(u, *moved[1:]).movedim(0, dim))
    return _extras(op, out, group, None, (n,), u, return_inverse, return_counts)


def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if self.dtype not in SORTABLE or self.numel() >= 2**24:
        return on_cpu(aten.unique_consecutive.default, self, return_inverse, return_counts, dim)
    if self.numel() == 0 and dim is None:
        return _empty(self, return_inverse, return_counts)
    if dim is not None and (self.numel() == 0 or self.dim() == 0):  # torch's error for a 0-d input
        return _shape_only(aten.unique_consecutive.default, self, return_inverse, return_counts, dim)
    if dim is not None:
        return _consecutive_rows(self, dim % self.dim(), return_inverse, return_counts)
    return _results("unique_consecutive", contig(self).reshape(-1), None, self.shape, return_inverse, return_counts)


# -- unique along a dim: slices sorted lexicographically ---------------------------------------------------
_A, _B = inputs(2)  # row i's column k, row j's column k
_CODE = (_B.lt(_A) + _B.gt(_A) * 2.0).node  # 1: j below i at k, 2: above, 0: no order (equal or NaN)
_MASKS = (_A + _B * 2.0).node  # the same code from exact integer compares (masks: below, above)
_C, _PI, _PJ = inputs(3)
_BEFORE = (_C.eq(1.0) + _C.eq(0.0) * _PJ.lt(_PI)).node  # j first: below at the first ordered column, or a tie


def _codes(op: str, rows: torch.Tensor) -> torch.Tensor:
    """FP32 [n, n, M]: 1 where row j is below row i at column k, 2 where above, 0 where neither. int32 and
    int64 compare exactly (FP32 keys would merge values beyond 2**24); the rest through FP32 keys."""
    n, m = rows.shape
    if rows.dtype in (torch.int32, torch.int64):
        (lt, gt), _ = int_compares(op, rows.dtype is torch.int64)
        ri, rj = rows.view(n, 1, m), rows.view(1, n, m)
        return run(op, formula, lt(rj, ri), gt(rj, ri), expr=_MASKS, out_dtype=F32)[0]
    if rows.dtype not in FLOATS:  # small integers and bool: exact in FP32
        rows = run(op, movement.copy, rows, dtype=torch.float32)[0]
    return run(op, formula, rows.view(n, 1, m), rows.view(1, n, m), expr=_CODE, out_dtype=F32)[0]


def _lex_perm(op: str, rows: torch.Tensor) -> torch.Tensor:
    """int32 order of the rows of an [n, M] tensor sorted lexicographically as torch compares slices
    (column by column, ``<`` then ``>``, NaN orders nothing), ties by position."""
    n = rows.shape[0]
    code = _codes(op, rows)
    first = index32(run(op, reduce.argmax, ew(op, elementwise.ne, code, 0.0), 2, True)[0], op)
    decided = run(op, movement.gather, code, 2, first)[0].view(n, n)
    pos = positions(n, rows.device)
    before = run(op, formula, decided, pos.view(n, 1), pos.view(1, n), expr=_BEFORE, out_dtype=F32)[0]
    rank = run(op, movement.copy, run(op, reduce.sum, before, (1,), False)[0], dtype=torch.int32)[0]
    return run(op, movement.scatter, rank, 0, rank, iota(n, rows.device))[0]


def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    op = "unique_dim"
    if self.dtype not in SORTABLE or self.dim() == 0:
        return on_cpu(aten.unique_dim.default, self, dim, sorted, return_inverse, return_counts)
    d = dim % self.dim()
    n = self.shape[d]
    if self.numel() == 0:
        return _shape_only(aten.unique_dim.default, self, dim, sorted, return_inverse, return_counts)
    rows = contig(self.movedim(d, 0)).reshape(n, -1)
    if n * n * rows.shape[1] > CHUNK:
        return on_cpu(aten.unique_dim.default, self, dim, sorted, return_inverse, return_counts)
    perm = _lex_perm(op, rows)
    ordered = run(op, movement.index_select, rows, 0, perm)[0]
    starts = None
    if n > 1:
        starts = run(op, reduce.amax, _ne(op, ordered[1:], ordered[:n - 1]), (1,), False)[0]
    group, u, flags = _groups(op, None, n, starts, self.device)
    out = _firsts(op, group, flags, u, ordered, ordered.shape)
    moved = self.movedim(d, 0).shape
    out = contig(out.view(u, *moved[1:]).movedim(0, d))
    return _extras(op, out, group, perm, (n,), u, return_inverse, return_counts)
