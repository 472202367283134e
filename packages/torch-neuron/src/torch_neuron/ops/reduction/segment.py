"""segment_reduce (``torch._segment_reduce``: max, min, sum, prod, mean over segments given by ``lengths`` or
``offsets`` along ``axis``) as a reducing scatter (:mod:`.scatter_reduce`).

Every element i along the axis gets the slot ``c(i) = #(offsets[k] <= i)``: 0 before the first segment,
j + 1 inside segment j, S + 1 after the last. c is exact integer work: ones scatter-added at the offsets
into a zeroed int32 table, and one int32 cumsum (lengths become offsets by a cumsum and a leading 0).
The data are then reduced into S + 2 slots holding ``initial`` (or the reduction's identity; NaN for a
mean without initial, whose empty segments are NaN), of which slots 1..S are the result. Offsets are
read back once (their minima and maxima, by ``index32``) to check them as the CPU does: negative lengths,
rows not summing to the axis size (unless ``unsafe``), decreasing offsets raise torch's errors; offsets
past the data (undefined on the CPU) take the CPU path.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import movement
from neuron_kernels.library import reduce as red

from ..core.checks import full, meta_result, same_device
from ..core.copy import to_host
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from ..indexing.gather_scatter import index32
from ..indexing.scatter_reduce import native, reduce_region

aten = torch.ops.aten
_I32_MAX = 2**31 - 1
_NAMES = {"max": "amax", "min": "amin", "sum": "sum", "prod": "prod", "mean": "mean"}
_IDENTITY = {"max": -math.inf, "min": math.inf, "sum": 0.0, "prod": 1.0, "mean": math.nan}


def _lengths_to_offsets(op: str, lengths, rows: int, d: int, unsafe: bool) -> torch.Tensor | None:
    """int32 [rows, S + 1] offsets from lengths (None: they overrun the data, the CPU's undefined case)."""
    s = lengths.shape[-1]
    lens = index32(op, lengths, _I32_MAX, error=RuntimeError, message=lambda v: "lengths contains negative value!")
    ends = run(op, red.cumsum, lens.view(rows, s), 1)[0]
    totals = to_host(ends[:, -1]).tolist() if s else [0] * rows
    if not unsafe and any(t != d for t in totals):
        raise RuntimeError("segment_reduce(): Expected all rows of lengths along axis to sum to "
                           "data.size(lengths.dim()-1) when !unsafe.")
    if any(t > d for t in totals):
        return None
    zero = full(op, (rows, 1), 0, torch.int32, lengths.device)
    ends32 = run(op, movement.copy, ends, dtype=torch.int32)[0]  # values <= d: exact
    return run(op, movement.cat.kernel(2), zero, ends32, dim=1)[0]


def _checked_offsets(op: str, offsets, rows: int, d: int) -> torch.Tensor | None:
    """int32 [rows, S + 1] offsets, or None when some lie outside [0, d] (the CPU reads past the data)."""
    s1 = offsets.shape[-1]
    try:
        offs = index32(op, offsets, d + 1, error=RuntimeError).view(rows, s1)
    except (RuntimeError, IndexError):
        return None
    if s1 > 1:
        steps = run(op, ew.sub, contig(offs[:, 1:]), contig(offs[:, :-1]))[0]
        if to_host(run(op, red.amin, steps)[0]).item() < 0:
            raise RuntimeError("Expected segment_length >= 0 to be true, but got false.")
    return offs


def _slots(op: str, offs, d: int) -> torch.Tensor:
    """int32 [rows, d]: c(i) = #(offs[k] <= i) per row."""
    rows, s1 = offs.shape
    marks = full(op, (rows, d + 1), 0, torch.int32, offs.device)
    ones = full(op, (rows, s1), 1, torch.int32, offs.device)
    marks = run(op, movement.scatter_add, marks, 1, offs, ones)[0]
    counts = run(op, red.cumsum, marks, 1)[0]
    return run(op, movement.copy, contig(counts[:, :d]), dtype=torch.int32)[0]


def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    op = "segment_reduce"
    args = {"lengths": lengths, "indices": indices, "offsets": offsets, "axis": axis, "unsafe": unsafe,
            "initial": initial}
    meta = meta_result(aten.segment_reduce.default, data, reduce, **args)
    same_device(data, lengths, offsets, indices)
    ax = axis % max(data.dim(), 1)
    shape = tuple(data.shape)
    rows, d, inner = math.prod(shape[:ax]), (shape[ax] if shape else 1), math.prod(shape[ax + 1:])
    s = meta.shape[ax] if meta.dim() else 1
    seg = lengths if offsets is None else offsets
    if (lengths is None) == (offsets is None) or indices is not None or reduce not in _NAMES or \
            tuple(seg.shape[:-1]) != shape[:ax] or not native(data, _NAMES[reduce], s + 2, d, data.numel() * (s + 2)):
        # (a segment tensor not shaped [*data.shape[:axis], S]: the CPU raises torch's error)
        return on_cpu(aten.segment_reduce.default, data, reduce, **args)
    if meta.numel() == 0:
        return torch.empty(meta.shape, dtype=data.dtype, device=data.device)
    if lengths is not None:
        offs = _lengths_to_offsets(op, lengths, rows, d, unsafe)
    else:
        offs = _checked_offsets(op, offsets, rows, d)
    if offs is None or d == 0:
        return on_cpu(aten.segment_reduce.default, data, reduce, **args)
    start = _IDENTITY[reduce] if initial is None else initial
    xs = full(op, (rows, s + 2, inner), start, data.dtype, data.device)
    name = "segment_mean" if reduce == "mean" and initial is not None else _NAMES[reduce]
    keep_start = not (reduce == "mean" and initial is None)  # a mean without initial: sum / count, NaN if empty
    got = reduce_region(op, xs, _slots(op, offs, d).view(rows, d, 1), contig(data).view(rows, d, inner),
                        name, keep_start)
    return contig(got[:, 1:s + 1]).view(meta.shape)
