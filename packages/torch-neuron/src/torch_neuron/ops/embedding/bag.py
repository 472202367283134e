"""``_embedding_bag_forward_only`` / ``_embedding_bag`` (``F.embedding_bag`` without / with grad): sum / mean /
max of the gathered table rows of each bag, with per_sample_weights (sum), padding_idx and include_last_offset,
and the CPU kernel's auxiliary outputs (offset2bag, bag_size, max_indices) as it fills them.

The offsets are read back once (a bag count's worth of integers) to check them as the CPU does (offsets[0]
must be 0; decreasing offsets, offsets past the indices, or an include_last_offset end other than the
index count are undefined or quirky on the CPU and take it). Element i's bag is ``#(starts <= i)`` (a
scatter_add of ones at the bag starts and an int32 cumsum, :func:`.segment_reduce._slots`); padded
elements go to a spare slot 0, bags to slots 1..B. The rows are gathered once (``embedding``) and
reduced into the slots by :func:`.scatter_reduce.reduce_region` (FP32, rounded once; empty bags are 0).
max follows the CPU's loop ``if first or v > cur: cur = v``: a NaN counts only as a bag's first element
(other NaNs become -inf first), and max_indices is the word index of the first element equal to the
bag's maximum (a position amin per bag and column), 0 for empty bags.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import embedding as emb
from neuron_kernels.library import movement
from neuron_kernels.library.formula import formula, inputs, where

from ..core.checks import full, same_device
from ..core.copy import to_host
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from ..indexing.gather_scatter import index32
from ..indexing.scatter_reduce import F32, native, reduce_region
from ..reduction.segment import _slots
from ..sorting.rank import positions

aten = torch.ops.aten
OP = "embedding_bag"  # the metrics name of both overloads
SUM, MEAN, MAX = 0, 1, 2


def _formulas():
    r, first, p = inputs(3)
    not_first_nan = where(r.isnan() * first.ne(p), -math.inf, r)  # NaN counts only as a bag's first
    v, res, pos = inputs(3)
    at_max = where(v.eq(res) + v.isnan() * res.isnan(), pos, math.inf)  # candidate positions of the max
    return not_first_nan.node, at_max.node


_DROP_NAN, _AT_MAX = _formulas()


def _to_int(t: torch.Tensor, dtype) -> torch.Tensor:
    return run(OP, movement.copy, contig(t), dtype=dtype)[0]


def _max(rows, slot, nslots: int, n: int, words):
    """(values [nslots, D] in rows' dtype, word indices [nslots, D] of ``words``' dtype) of max bags."""
    d = rows.shape[1]
    pos = positions(n, rows.device).view(n, 1)
    inf = full(OP, (1, nslots, 1), math.inf, torch.float32, rows.device)
    first = reduce_region(OP, inf, slot.view(1, n, 1), pos.view(1, n, 1), "amin", True).view(nslots, 1)
    first_g = run(OP, movement.index_select, first, 0, slot)[0]
    vals = run(OP, formula, rows, first_g, pos, expr=_DROP_NAN, out_dtype=F32)[0]
    zeros = full(OP, (1, nslots, d), 0, rows.dtype, rows.device)
    res = reduce_region(OP, zeros, slot.view(1, n, 1), vals.view(1, n, d), "amax", False).view(nslots, d)
    res_g = run(OP, movement.index_select, res, 0, slot)[0]
    cand = run(OP, formula, vals, res_g, pos, expr=_AT_MAX, out_dtype=F32)[0]
    infs = full(OP, (1, nslots, d), math.inf, torch.float32, rows.device)
    at = reduce_region(OP, infs, slot.view(1, n, 1), cand.view(1, n, d), "amin", True)
    x, = inputs(1)
    at = run(OP, formula, at, expr=where(x.eq(math.inf), float(n), x).node, out_dtype=F32)[0]  # empty -> sentinel
    ext = run(OP, movement.cat.kernel(2), words, full(OP, (1,), 0, words.dtype, words.device), dim=0)[0]
    picked = run(OP, movement.index_select, ext, 0, _to_int(at, torch.int32).view(-1))[0]
    return res, picked.view(nslots, d)


def _usable(weight, indices, offsets, mode, psw) -> bool:
    return (weight.dim() == 2 and weight.dtype in FLOATS and indices.dim() == 1 and offsets.dim() == 1
            and indices.dtype in (torch.int32, torch.int64) and offsets.dtype in (torch.int32, torch.int64)
            and mode in (SUM, MEAN, MAX) and (psw is None or (mode == SUM and psw.dtype == weight.dtype
                                                               and psw.shape == indices.shape))
            and indices.numel() > 0 and weight.shape[1] > 0)


def _bag_starts(offsets, n: int, last: bool) -> list[int] | None:
    """The host offsets, checked; None for the cases the CPU leaves undefined (they take the CPU)."""
    offs = to_host(offsets).tolist()
    if offs and offs[0] != 0:
        raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                           f"position 0. However, got {offs[0]}")
    bags = len(offs) - 1 if last else len(offs)
    if bags <= 0 or any(b < a for a, b in zip(offs, offs[1:])) or offs[-1] > n or (last and offs[-1] != n):
        return None
    return offs


def embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                               per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    args = (weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset,
            padding_idx)
    return _embedding_bag(aten._embedding_bag_forward_only.default, args, False)


def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """The same forward for autograd (its backward is separate ops); only sum's zero bag_size / max_indices
    have one entry per bag rather than per offset."""
    args = (weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset,
            padding_idx)
    return _embedding_bag(aten._embedding_bag.default, args, True)


def _embedding_bag(overload, args, grad: bool):
    weight, indices, offsets, _, mode, _, per_sample_weights, include_last_offset, padding_idx = args
    same_device(weight, indices, offsets, per_sample_weights)
    n, (num, d) = indices.numel(), weight.shape if weight.dim() == 2 else (0, 0)
    offs = None
    if _usable(weight, indices, offsets, mode, per_sample_weights):
        offs = _bag_starts(offsets, n, include_last_offset)
    bags = (len(offs) - 1 if include_last_offset else len(offs)) if offs else 0
    if offs is None or not native(weight, "amax" if mode == MAX else "sum", bags + 1, n, (bags + 1) * n * d):
        return on_cpu(overload, *args)
    itype = torch.promote_types(indices.dtype, offsets.dtype)
    idx = index32(OP, indices, num, error=RuntimeError, message=lambda v: (
        f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {v}"))
    starts = _to_int(offsets[:bags], torch.int32).view(1, bags)
    bag = _slots(OP, starts, n).view(n)  # 1..B
    slot = run(OP, ew.where, run(OP, ew.ne, idx, padding_idx)[0], bag, 0)[0] if padding_idx >= 0 else bag
    rows = run(OP, emb.embedding, contig(weight), idx)[0]
    nslots = bags + 1
    fast_sum = mode == SUM and padding_idx < 0 and weight.stride(1) == 1 and (
        per_sample_weights is None or per_sample_weights.stride(0) == 1)
    offset2bag = (torch.empty(0, dtype=itype, device=weight.device) if fast_sum
                  else _to_int(run(OP, ew.sub, bag, 1)[0], itype))
    if mode == MAX:
        out, max_idx = _max(rows, slot, nslots, n, _to_int(indices, itype))
        return contig(out[1:]), offset2bag, _bag_sizes(slot, nslots, n, itype), max_idx[1:]
    if per_sample_weights is not None:
        r, w = inputs(2)
        rows = run(OP, formula, rows, contig(per_sample_weights).view(n, 1), expr=(r * w).node, out_dtype=F32)[0]
    zeros = full(OP, (1, nslots, d), 0, weight.dtype, weight.device)
    reduce, keep = ("mean", False) if mode == MEAN else ("sum", True)
    out = reduce_region(OP, zeros, slot.view(1, n, 1), rows.view(1, n, d), reduce, keep).view(nslots, d)
    if mode == MEAN:  # the CPU's max_indices of a mean is its bag_size
        bag_size = _bag_sizes(slot, nslots, n, itype)
        return contig(out[1:]), offset2bag, bag_size, bag_size.clone()
    size = bags if grad else offsets.numel()  # sum: zeros, one per offset without grad
    return (contig(out[1:]), offset2bag, full(OP, (size,), 0, itype, weight.device),
            full(OP, (size,), 0, itype, weight.device))


def _bag_sizes(slot, nslots: int, n: int, itype) -> torch.Tensor:
    """Elements per bag, padding excluded (exact int32 scatter_add of ones), in the index dtype."""
    device = slot.device
    counts = run(OP, movement.scatter_add, full(OP, (nslots,), 0, torch.int32, device), 0, slot,
                 full(OP, (n,), 1, torch.int32, device))[0]
    return _to_int(counts[1:], itype)
