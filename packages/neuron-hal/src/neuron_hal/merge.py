"""Several programs, launched in order, as one ``Program``: what a compiled graph runs.

A graph of kernels launched one by one pays each kernel's whole latency in turn. As one program, the
engines and DMA queues overlap independent kernels, as they do within a kernel: only real data
dependencies (through HBM or on-chip memory) order them.

- **HBM**: the launches' tensors are bound to device addresses. Overlapping address ranges are one buffer
  (an intermediate one kernel writes and the next reads, a view into another tensor); each buffer becomes
  one byte tensor of the merged program and every access is rebased into it, so dependencies between
  kernels follow from the addresses, as the hardware sees them.
- **On-chip memory**: every kernel allocates SBUF and PSUM from offset 0. Kept there, each kernel would wait
  for the previous one to release the same bytes; the merged program instead places the kernels' on-chip
  footprints one after another in a ring over each partition's SBUF (and over the PSUM banks), so consecutive
  kernels that fit side by side can run at the same time. A kernel that does not fit in what is left of the
  ring starts again at offset 0 (and then waits for whatever used those bytes).
- Scratch tensors stay private to their kernel.

The merged program computes exactly what the launches compute in sequence: instructions keep their
program order and operands, only their addresses move.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from .dtypes import DType
from .isa import AP, Space
from .profiles import Profile
from .program import Program, TensorArg


def buffers(spans_lo: np.ndarray, spans_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group byte ranges [lo, hi) into buffers of overlapping ranges: (buffer of each range, buffer starts,
    buffer ends). Buffers are numbered in order of their first range, so the same launches give the same
    numbering wherever the allocator put their tensors."""
    order = np.argsort(spans_lo, kind="stable")
    lo, hi = spans_lo[order], spans_hi[order]
    reach = np.maximum.accumulate(hi) if lo.size else hi
    new = np.ones(lo.size, bool)
    new[1:] = lo[1:] >= reach[:-1]
    by_address = np.empty(lo.size, np.int64)
    by_address[order] = np.cumsum(new) - 1
    starts = lo[new]
    ends = np.maximum.reduceat(hi, np.flatnonzero(new)) if lo.size else hi
    _, first = np.unique(by_address, return_index=True)  # each buffer's first range
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    inverse = np.argsort(rank)
    return rank[by_address], starts[inverse], ends[inverse]


def spans(programs: Sequence[Program], bindings: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) of every bound (non-scratch) tensor of every launch, in launch and argument order."""
    lo, hi = [], []
    for program, addresses in zip(programs, bindings):
        given = [a for a in program.args if a.role != "scratch"]
        if len(given) != len(addresses):
            raise ValueError(f"program {program.name!r} takes {len(given)} tensors, got {len(addresses)} addresses")
        for arg, address in zip(given, addresses):
            lo.append(int(address))
            hi.append(int(address) + arg.nbytes)
    return np.array(lo, np.int64), np.array(hi, np.int64)


@functools.lru_cache(maxsize=4096)
def footprint(program: Program, space: Space) -> int:
    """Bytes per partition ``program`` addresses in ``space`` (the end of its highest on-chip access)."""
    end = 0
    for ap in {id(ap): ap for ins in program.instructions for ap in _operands(ins)}.values():
        if ap.space is space:
            last = sum((size - 1) * stride for size, stride in ap.free) if ap.free else 0
            end = max(end, ap.offset + (last + 1) * ap.dtype.itemsize)
    return end


def merge(programs: Sequence[Program], bindings: Sequence[Sequence[int]], profile: Profile,
          name: str = "graph") -> tuple[Program, list[int]]:
    """One program running ``programs`` in order, with each one's tensors bound to ``bindings`` (addresses of its
    non-scratch tensors, in ``program.args`` order). Returns the program and the addresses of its tensors."""
    lo, hi = spans(programs, bindings)
    which, starts, ends = buffers(lo, hi)
    args = [TensorArg(f"buffer{i}", (int(e - s),), DType.uint8, "inout") for i, (s, e) in enumerate(zip(starts, ends))]
    sbuf = _Ring(profile.sbuf_partition_bytes, 64)
    psum = _Ring(profile.psum_partition_bytes, profile.psum_partition_bytes // profile.psum_banks)
    instructions, span = [], 0
    for j, program in enumerate(programs):
        table = {}
        for t, arg in enumerate(program.args):
            if arg.role == "scratch":
                table[t] = (len(args), 0)
                args.append(TensorArg(f"k{j}.{arg.name}", arg.shape, arg.dtype, "scratch"))
            else:
                table[t] = (int(which[span]), int(lo[span] - starts[which[span]]))
                span += 1
        shift = {Space.SBUF: sbuf.place(footprint(program, Space.SBUF)),
                 Space.PSUM: psum.place(footprint(program, Space.PSUM))}
        # id -> (object, relocated): a program shares AP objects between instructions and repeats instructions
        moved: dict = {}
        for ins in program.instructions:
            hit = moved.get(id(ins))
            if hit is None:
                hit = moved[id(ins)] = (ins, _relocated(ins, table, shift, moved))
            instructions.append(hit[1])
    return Program(name, tuple(args), tuple(instructions)), [int(s) for s in starts]


class _Ring:
    """Places footprints one after another in ``capacity`` bytes, wrapping to 0 when one does not fit."""

    def __init__(self, capacity: int, align: int):
        self.capacity, self.align, self.next = capacity, align, 0

    def place(self, nbytes: int) -> int:
        if nbytes == 0:
            return 0
        size = -(-nbytes // self.align) * self.align
        if self.next + size > self.capacity:
            self.next = 0
        at, self.next = self.next, self.next + size
        return at


def _operands(ins):
    return [ap for name in ins.operand_fields if isinstance(ap := getattr(ins, name), AP)]


def _relocated(ins, table: dict, shift: dict, moved: dict):
    """``ins`` with every AP operand moved (HBM: into its buffer; on chip: by its space's shift)."""
    changes = {}
    for name in ins.operand_fields:
        ap = getattr(ins, name)
        if isinstance(ap, AP):
            hit = moved.get(id(ap))
            if hit is None:
                hit = moved[id(ap)] = (ap, _relocate(ap, table, shift))
            if hit[1] is not ap:
                changes[name] = hit[1]
    return _copy_with(ins, changes) if changes else ins


def _relocate(ap: AP, table: dict, shift: dict) -> AP:
    if ap.space is Space.HBM:
        tensor, byte_offset = table[ap.tensor]
        return _copy_with(ap, {"tensor": tensor, "offset": ap.offset + byte_offset})
    moved = shift.get(ap.space, 0)
    return _copy_with(ap, {"offset": ap.offset + moved}) if moved else ap


def _copy_with(obj, changes: dict):
    """``dataclasses.replace(obj, **changes)`` for the ISA's frozen dataclasses, without replace's per-call field
    introspection (merging relocates every operand of every kernel of a graph)."""
    cls = type(obj)
    return cls(*[changes[name] if name in changes else getattr(obj, name) for name in _field_names(cls)])


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))
