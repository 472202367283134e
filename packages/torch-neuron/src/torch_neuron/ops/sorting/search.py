"""searchsorted, bucketize and isin by counting comparisons (no binary search on the engines).

On an ascending sequence s (NaN last, torch's sort order) the left insertion point of v is #(s_j < v) and
the right one #(s_j <= v): each predicate holds on a prefix of s, so its count is where torch's binary
search stops (a NaN v compares false everywhere: 0, as torch's search). One broadcast compare launch
(exact on the engines for floats and 32-bit ints), a cast and a sum per chunk of rows; the [rows, m]
compare matrix is chunked to ``CHUNK`` elements. isin is ``any(elements == test)`` the same way (NaN is
in nothing). int64/float64 operands, mixed dtypes and the argument errors take the counted CPU path.
"""

from __future__ import annotations

import torch

from neuron_hal import DType
from neuron_kernels.library import elementwise, movement, reduce
from neuron_kernels.library.formula import fmod, formula, inputs, where

from ..core.compose import ew, index32
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out
from .rank import CHUNK

aten = torch.ops.aten
F32 = DType.float32
EXACT = (*FLOATS, torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)
SEARCHABLE = (*FLOATS, torch.uint8, torch.int8, torch.int16)  # exact in FP32 formulas


def _search_exprs(right: bool):
    """Formulas of one binary-search step on FP32 bounds (exact below 2**24): inputs start, end, the
    sequence value at mid, the value searched. torch's step: go right when ``!(s[mid] >= v)`` (left) or
    ``!(s[mid] > v)`` (right), which also fixes where NaNs go."""
    lo, hi, smid, v = inputs(4)
    d = hi - lo
    mid = lo + (d - fmod(d, 2.0)) * 0.5
    go = where(smid.gt(v) if right else smid.ge(v), 0.0, 1.0) * lo.lt(hi)
    stop = where(smid.gt(v) if right else smid.ge(v), 1.0, 0.0) * lo.lt(hi)
    return mid.node, where(go, mid + 1.0, lo).node, where(stop, mid, hi).node


def _binary_search(op: str, seq: torch.Tensor, vals: torch.Tensor, right: bool) -> torch.Tensor:
    """FP32 [B, k] insertion points, torch's binary search step by step: seq [B, m] (or [1, m] shared by
    every value: then vals is [N, 1]), vals [B, k]. Every lane takes ceil(log2(m + 1)) steps (a finished
    lane keeps its bounds), 5 launches a step."""
    m = seq.shape[1]
    mid_e, lo_e, hi_e = _search_exprs(right)
    lo = torch.zeros(vals.shape, dtype=torch.float32).to(vals.device)  # a DMA write, no launch
    hi = ew(op, elementwise.add, lo, float(m))
    flat_seq = seq.shape[0] == 1 and vals.shape[1] == 1
    for _ in range(m.bit_length()):
        mid = run(op, formula, lo, hi, expr=mid_e, out_dtype=F32)[0]
        at = ew(op, elementwise.minimum, run(op, movement.copy, mid, dtype=torch.int32)[0], m - 1)
        smid = (run(op, movement.gather, seq.view(m), 0, at.view(-1))[0].view(at.shape) if flat_seq
                else run(op, movement.gather, seq, 1, at)[0])
        lo, hi = (run(op, formula, lo, hi, smid, vals, expr=lo_e, out_dtype=F32)[0],
                  run(op, formula, lo, hi, smid, vals, expr=hi_e, out_dtype=F32)[0])
    return lo


def _search_native(seq, vals, sorter) -> bool:
    if seq.dtype != vals.dtype or seq.dtype not in SEARCHABLE or seq.dim() == 0 or seq.device != vals.device:
        return False
    if seq.dim() > 1 and tuple(seq.shape[:-1]) != tuple(vals.shape[:-1]):
        return False  # torch's shape error, from the CPU
    if sorter is not None and (sorter.dtype != torch.int64 or sorter.shape != seq.shape
                               or sorter.device != seq.device):
        return False
    return seq.shape[-1] < 2**24  # positions stay exact in FP32


def _searchsorted(seq, vals, out_int32, right, sorter):
    op = "searchsorted"
    out_dtype = torch.int32 if out_int32 else torch.int64
    if vals.numel() == 0 or seq.shape[-1] == 0:  # nothing to search, or every insertion point is 0
        return torch.zeros(vals.shape, dtype=out_dtype).to(vals.device)
    seq = contig(seq)
    if sorter is not None:
        seq = run(op, movement.gather, seq, seq.dim() - 1, index32(sorter, op))[0]
    if seq.dtype not in FLOATS:  # small ints: exact in FP32, which the step formulas compute in
        seq, vals = (run(op, movement.copy, contig(t), dtype=torch.float32)[0] for t in (seq, vals))
    m = seq.shape[-1]
    if seq.dim() == 1:
        rows, seq2 = contig(vals).reshape(-1, 1), seq.view(1, m)  # every value against the one sequence
    else:
        rows, seq2 = contig(vals).reshape(-1, vals.shape[-1]), seq.reshape(-1, m)
    counts = _binary_search(op, seq2, rows, right)
    return run(op, movement.copy, counts, dtype=out_dtype)[0].view(vals.shape)


def _side_right(right: bool, side) -> bool | None:
    """torch's right/side pair as one flag; None for a conflicting or unknown side (torch's error)."""
    if side is None:
        return right
    if side not in ("left", "right") or (right and side == "left"):
        return None
    return side == "right"


def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    r = _side_right(right, side)
    if r is None or not _search_native(sorted_sequence, self, sorter):
        return on_cpu(aten.searchsorted.Tensor, sorted_sequence, self, out_int32=out_int32, right=right,
                      side=side, sorter=sorter)
    return _searchsorted(sorted_sequence, self, out_int32, r, sorter)


def _scalar_tensor(seq: torch.Tensor, value):
    """A Python scalar as a 0-d tensor of the sequence's dtype when that is its promoted dtype, else None."""
    if torch.result_type(seq, value) != seq.dtype:
        return None
    return torch.tensor(value, dtype=seq.dtype).to(seq.device)


def searchsorted_scalar(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    v = _scalar_tensor(sorted_sequence, self)
    if v is None or sorted_sequence.dim() != 1:
        return on_cpu(aten.searchsorted.Scalar, sorted_sequence, self, out_int32=out_int32, right=right,
                      side=side, sorter=sorter)
    return searchsorted(sorted_sequence, v, out_int32=out_int32, right=right, side=side, sorter=sorter)


def bucketize(self, boundaries, *, out_int32=False, right=False):
    if boundaries.dim() != 1 or not _search_native(boundaries, self, None):
        return on_cpu(aten.bucketize.Tensor, self, boundaries, out_int32=out_int32, right=right)
    return _searchsorted(boundaries, self, out_int32, right, None)


def bucketize_scalar(self, boundaries, *, out_int32=False, right=False):
    v = _scalar_tensor(boundaries, self)
    if v is None or boundaries.dim() != 1:
        return on_cpu(aten.bucketize.Scalar, self, boundaries, out_int32=out_int32, right=right)
    return bucketize(v, boundaries, out_int32=out_int32, right=right)


# -- isin -----------------------------------------------------------------------------------------------
def _isin(elements, test, invert: bool):
    op = "isin"
    if elements.numel() == 0:
        return torch.empty(elements.shape, dtype=torch.bool, device=elements.device)
    if test.numel() == 0:
        return torch.full(elements.shape, invert, dtype=torch.bool).to(elements.device)
    flat, t = contig(elements).reshape(-1), contig(test).reshape(1, -1)
    step, parts = max(1, CHUNK // t.shape[1]), []
    for b in range(0, flat.shape[0], step):
        chunk = flat[b:b + step].view(-1, 1)
        # int64 (token ids against eos ids in generate()): the exact word-wise comparison of pointwise.int64
        hits = torch.eq(chunk, t) if torch.int64 in (chunk.dtype, t.dtype) else ew(op, elementwise.eq, chunk, t)
        parts.append(run(op, reduce.amax, hits, (1,), False)[0])
    found = parts[0] if len(parts) == 1 else torch.cat(parts)
    if invert:
        found = ew(op, elementwise.logical_not, found)
    return found.view(elements.shape)


def _isin_native(a, b) -> bool:
    exact = (*EXACT, torch.int64)
    return a.dtype in exact and b.dtype in exact and torch.result_type(a, b) in exact and a.device == b.device


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    if not _isin_native(elements, test_elements):
        return on_cpu(aten.isin.Tensor_Tensor, elements, test_elements, assume_unique=assume_unique, invert=invert)
    return _isin(elements, test_elements, invert)


def isin_tensor_scalar(elements, test_element, *, assume_unique=False, invert=False):
    t = _scalar_tensor(elements, test_element)
    if t is None or elements.dtype not in (*EXACT, torch.int64):
        return on_cpu(aten.isin.Tensor_Scalar, elements, test_element, assume_unique=assume_unique, invert=invert)
    return _isin(elements, t, invert)


def isin_scalar_tensor(element, test_elements, *, assume_unique=False, invert=False):
    e = _scalar_tensor(test_elements, element)
    if e is None or test_elements.dtype not in (*EXACT, torch.int64):
        return on_cpu(aten.isin.Scalar_Tensor, element, test_elements, assume_unique=assume_unique, invert=invert)
    return _isin(e, test_elements, invert)


def _out(fn):
    def run_out(*args, out, **kwargs):
        return write_out(out, fn(*args, **kwargs))
    return run_out
