"""Encoding a program for timing: what each instruction is, where it runs, what it costs and what it touches.

``encode`` reads a program's instructions once (at load) into numpy columns: opcode, engine, stream (engine
or DMA queue), compute cycles and DMA parameters from the cost model (:mod:`.costs`), and every memory access
(instruction, access pattern, read or write) for the dependency analysis (:mod:`.deps`). Instructions are
handled per class, vectorized over the class's instructions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from itertools import chain, count
from operator import attrgetter

import numpy as np

from neuron_hal import isa
from neuron_hal.dtypes import DType
from neuron_hal.isa import AP, Alu, Space
from neuron_hal.profiles import Profile

from . import costs
from .costs import Opnd
from .plan import ENGINE_CODES, N_COMPUTE, OPCODE_NAMES

_SPACES = (Space.SBUF, Space.PSUM, Space.HBM)  # codes costs.SBUF/PSUM/HBM
_DTYPES = tuple(DType)
_DT_ITEMSIZE = np.array([d.itemsize for d in _DTYPES], np.int64)
_DT_F16 = np.array([d in (DType.bfloat16, DType.float16) for d in _DTYPES])
_DT_BF16 = np.array([d is DType.bfloat16 for d in _DTYPES])
_DT_FP32 = np.array([d is DType.float32 for d in _DTYPES])
_ENGINES = tuple(ENGINE_CODES)
_ALUS = tuple(Alu)
_ACTS = tuple(costs.ACT_CODES)

# Instructions that read dst when a flag is set (their reads() override); any other override is unknown.
_READS_DST_IF = {isa.Matmul: "accumulate", isa.DmaScatter: "accumulate"}


def _codes(objs: list, members: tuple) -> np.ndarray:
    """Index into ``members`` of each object (by identity; enum members are singletons)."""
    keys = np.array([id(m) for m in members], np.int64)
    ids = np.fromiter(map(id, objs), np.int64, len(objs))
    sorter = np.argsort(keys)
    pos = np.minimum(np.searchsorted(keys, ids, sorter=sorter), len(keys) - 1)
    code = sorter[pos]
    if ids.size and not np.array_equal(keys[code], ids):
        bad = objs[int(np.flatnonzero(keys[code] != ids)[0])]
        raise TypeError(f"timing: unexpected value {bad!r}; expected one of {members}")
    return code


def _field_roles(cls) -> list[tuple[str, str]]:
    """(field, role) for the AP-capable fields of an instruction class: 'r', 'w' or 'wr' (write, and read
    when the flag in _READS_DST_IF is set), consistent with Instruction.reads()/writes()."""
    overrides = cls.reads is not isa.Instruction.reads
    if overrides and cls not in _READS_DST_IF:
        raise NotImplementedError(f"timing: {cls.__name__} overrides reads(); teach timing._field_roles about it")
    if cls.writes is not isa.Instruction.writes:
        raise NotImplementedError(f"timing: {cls.__name__} overrides writes(); teach timing._field_roles about it")
    writes = {"dst", *cls._extra_writes}
    roles = []
    for f in fields(cls):
        t = str(f.type)
        if "AP" not in t and "Operand" not in t:
            continue
        role = "w" if f.name in writes else "r"
        if f.name == "dst" and cls in _READS_DST_IF:
            role = "wr"
        roles.append((f.name, role))
    return roles


class _Free:
    """Features of the distinct free patterns of a program (few), indexed by pattern id."""

    def __init__(self, patterns: list):
        u = len(patterns)
        self.n = np.empty(u, np.int64)
        self.inner_size = np.ones(u, np.int64)
        self.inner_stride = np.zeros(u, np.int64)
        self.run = np.ones(u, np.int64)  # elements in the innermost contiguous run
        self.lo = np.zeros(u, np.int64)  # free_extent in elements
        self.hi = np.ones(u, np.int64)
        self.outer_size = np.ones((u, 3), np.int64)  # size>1 dims other than the innermost one
        self.outer_stride = np.zeros((u, 3), np.int64)
        for k, free in enumerate(patterns):
            self.n[k] = math.prod(s for s, _ in free)
            lo = sum(min(0, (s - 1) * st) for s, st in free if s > 0)
            hi = sum(max(0, (s - 1) * st) for s, st in free if s > 0)
            self.lo[k], self.hi[k] = lo, hi + 1
            dims = [(s, st) for s, st in free if s > 1]
            run = 1
            for s, st in reversed(dims):
                if st != run:
                    break
                run *= s
            self.run[k] = run
            if dims:
                self.inner_size[k], self.inner_stride[k] = dims[-1]
                for j, (s, st) in enumerate(dims[:-1]):
                    self.outer_size[k, j], self.outer_stride[k, j] = s, st


class _APs:
    """Columns of every AP operand of a program (one row per AP occurrence)."""

    def __init__(self, aps: list):
        # Read each distinct AP object once, in address order (much kinder to the caches than operand
        # order), then expand to one row per occurrence.
        ids = np.fromiter(map(id, aps), np.int64, len(aps))
        _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
        uniq = [aps[k] for k in first.tolist()]
        u = len(uniq)
        self.count = len(aps)
        self.space = _codes(list(map(attrgetter("space"), uniq)), _SPACES).astype(np.int8)[inv]
        self.dtype = _codes(list(map(attrgetter("dtype"), uniq)), _DTYPES).astype(np.int8)[inv]
        self.partitions = np.fromiter(map(attrgetter("partitions"), uniq), np.int64, u)[inv]
        self.start = np.fromiter(map(attrgetter("start_partition"), uniq), np.int64, u)[inv]
        self.offset = np.fromiter(map(attrgetter("offset"), uniq), np.int64, u)[inv]
        self.pstride = np.fromiter(map(attrgetter("partition_stride"), uniq), np.int64, u)[inv]
        self.tensor = np.fromiter(map(attrgetter("tensor"), uniq), np.int64, u)[inv]
        # Free patterns: interned (tuples of ints hash in C), then featurized once per distinct pattern.
        index: dict = {}
        raw = np.fromiter(map(index.setdefault, map(attrgetter("free"), uniq), count()), np.int64, u)
        lut = np.zeros(max(u, 1), np.int64)
        lut[np.fromiter(index.values(), np.int64, len(index))] = np.arange(len(index))
        self.fid = lut[raw][inv]
        self.free = _Free(list(index))
        self.itemsize = _DT_ITEMSIZE[self.dtype]
        self.n = self.free.n[self.fid]

    def opnd(self, rows: np.ndarray) -> Opnd:
        """Operand columns for instructions whose AP row is ``rows`` (-1: not an AP)."""
        present = rows >= 0
        r = np.where(present, rows, 0)

        def col(x, absent):
            return np.where(present, x[r], absent) if self.count else np.full(rows.shape, absent, x.dtype)

        dt = col(self.dtype, 0)
        return Opnd(present=present, space=col(self.space, costs.ABSENT).astype(np.int8),
                    itemsize=np.where(present, _DT_ITEMSIZE[dt], 0), f16=present & _DT_F16[dt],
                    bf16=present & _DT_BF16[dt], fp32=present & _DT_FP32[dt],
                    partitions=col(self.partitions, 0), start=col(self.start, 0), n=col(self.n, 0),
                    inner_size=col(self.free.inner_size[self.fid], 1),
                    inner_stride=col(self.free.inner_stride[self.fid], 0),
                    run=col(self.free.run[self.fid], 1), pstride=col(self.pstride, 0))


_CLASSES = tuple(isa.OPCODES.values())


def _group(instrs: tuple) -> list[tuple[type, np.ndarray, list]]:
    """(class, indices, instructions) per instruction class, indices ascending."""
    code = _codes(list(map(type, instrs)), _CLASSES).astype(np.int16)
    order = np.argsort(code, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(code, minlength=len(_CLASSES)))))
    groups = []
    for k, cls in enumerate(_CLASSES):
        if bounds[k + 1] > bounds[k]:
            idx = order[bounds[k]:bounds[k + 1]]
            groups.append((cls, idx, [instrs[i] for i in idx.tolist()]))
    return groups


@dataclass
class Encoded:
    """A program's instructions as columns (one entry per instruction unless noted)."""

    n: int
    opcode: np.ndarray  # int16 index into OPCODE_NAMES
    engine: np.ndarray  # int8: 0..3 compute engines, 4 DMA
    stream: np.ndarray  # int16: engine for compute, N_COMPUTE + queue for DMA
    n_streams: int
    cycles: np.ndarray  # float64 engine cycles of compute instructions (before sequence-dependent costs)
    ls_cycles: np.ndarray  # float64 LoadStationary cycles of matmuls
    te: np.ndarray  # TensorE instruction indices
    te_mm: np.ndarray  # bool per TensorE instruction: a matmul
    te_key: np.ndarray  # [len(te), 6] each matmul's stationary AP (space, dtype, partitions, start, offset, free)
    dma: costs.Dma  # per-instruction DMA figures (zeros for compute instructions)
    act_func: np.ndarray  # int16 activation function code (costs.ACT_CODES), -1 for other instructions
    aps: _APs
    acc_i: np.ndarray  # accesses: instruction
    acc_row: np.ndarray  # AP row (into aps)
    acc_w: np.ndarray  # int8: 1 write, 0 read


def encode(program, profile: Profile) -> Encoded:
    instrs = program.instructions
    n = len(instrs)
    groups = _group(instrs) if n else []

    opcode = np.zeros(n, np.int16)
    act_func = np.full(n, -1, np.int16)
    engine = np.zeros(n, np.int8)
    queue = np.zeros(n, np.int64)
    cycles = np.zeros(n, np.float64)
    ls_cycles = np.zeros(n, np.float64)
    dma = costs.Dma(np.zeros(n, np.int64), np.full(n, -1, np.int64), np.ones(n, np.int64), np.ones(n, np.int64),
                    np.ones(n, np.float64), np.zeros(n, bool))

    # Pass 1: collect every AP operand (one flat list) with its owner and role.
    ap_lists, owners, slots = [], [], []  # slots: (group no, field, role, positions in the group holding an AP)
    group_fields = []
    base = 0
    for g, (cls, idx, sub) in enumerate(groups):
        roles = _field_roles(cls)
        always_ap = {f.name: str(f.type) == "AP" for f in fields(cls)}
        per_field = {}
        for name, role in roles:
            col = list(map(attrgetter(name), sub))
            if always_ap[name]:
                where = np.arange(len(col))
            else:
                where = np.flatnonzero(np.fromiter(map(id, map(type, col)), np.int64, len(col)) == id(AP))
            aps = col if where.size == len(col) else [col[j] for j in where.tolist()]
            rows = np.full(len(col), -1, np.int64)
            rows[where] = np.arange(base, base + where.size)
            base += where.size
            ap_lists.append(aps)
            per_field[name] = (rows, role)
            owners.append(idx[where])
            slots.append((g, name, role, where))
        group_fields.append(per_field)
    aps = _APs(list(chain.from_iterable(ap_lists)))

    # Pass 2: per class, engine codes and costs (vectorized over the class's instructions).
    mm_rows = []
    for g, (cls, idx, sub) in enumerate(groups):
        name = cls.opcode
        opcode[idx] = OPCODE_NAMES.index(name)
        if len(cls.engines) == 1:
            eng = np.full(len(idx), ENGINE_CODES[cls.engines[0]], np.int64)
        else:
            eng = _codes(list(map(attrgetter("engine"), sub)), _ENGINES)
        engine[idx] = eng
        ops = {f: aps.opnd(rows) for f, (rows, _) in group_fields[g].items()}
        extra = {}
        if name in ("tensor_tensor", "tensor_reduce"):
            extra["op"] = _codes(list(map(attrgetter("op"), sub)), _ALUS)
        if name == "scalar_tensor_tensor":
            extra["op0"] = _codes(list(map(attrgetter("op0"), sub)), _ALUS)
            extra["op1"] = _codes(list(map(attrgetter("op1"), sub)), _ALUS)
        if name == "activation":
            act_func[idx] = _codes(list(map(attrgetter("func"), sub)), _ACTS)
        if name == "memset":
            extra["value"] = np.fromiter(map(attrgetter("value"), sub), np.float64, len(idx))
        if name in isa.DMA_OPCODES:
            queue[idx] = np.fromiter(map(attrgetter("queue"), sub), np.int64, len(idx))
            d = costs.dma(name, ops, profile)
            for f in ("nbytes", "p0", "parts", "runs", "bw", "read"):
                getattr(dma, f)[idx] = getattr(d, f)
        elif name == "nc_matmul":
            cycles[idx], ls_cycles[idx] = costs.matmul(ops, extra, eng, profile)
            mm_rows.append((idx, group_fields[g]["stationary"][0]))
        else:
            cycles[idx] = costs.COMPUTE[name](ops, extra, eng, profile)

    # Accesses: (instruction, AP row, is_write); 'wr' fields also read where the flag is set.
    acc_i, acc_row, acc_w = [], [], []

    def access(instr, rows, is_write):
        acc_i.append(instr)
        acc_row.append(rows)
        acc_w.append(np.full(instr.size, is_write, np.int8))

    for (g, name, role, where), own in zip(slots, owners):
        rows = group_fields[g][name][0][where]
        access(own, rows, 0 if role == "r" else 1)
        if role == "wr":
            cls, _, sub = groups[g]
            flag = np.fromiter(map(attrgetter(_READS_DST_IF[cls]), [sub[j] for j in where.tolist()]), bool, own.size)
            access(own[flag], rows[flag], 0)

    bad = (engine == 4) & ((queue < 0) | (queue >= profile.dma_queues))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"timing: instruction {i}: DMA queue {int(queue[i])} outside 0..{profile.dma_queues - 1}")
    stream = np.where(engine == 4, N_COMPUTE + queue, engine).astype(np.int16)

    def cat(parts, dtype):
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    te, te_mm, te_key = _stationary_keys(engine, mm_rows, aps)
    return Encoded(n, opcode, engine, stream, N_COMPUTE + profile.dma_queues, cycles, ls_cycles, te, te_mm, te_key,
                   dma, act_func, aps, cat(acc_i, np.int64), cat(acc_row, np.int64),
                   cat(acc_w, np.int8))


def _stationary_keys(engine, mm_rows, aps: _APs):
    """(TensorE instruction indices, which are matmuls, each matmul's stationary AP as a key row): what the
    LoadStationary rule (:func:`.costs.load_stationary`) compares between consecutive TensorE instructions."""
    te = np.flatnonzero(engine == 0)
    is_mm = np.zeros(te.size, bool)
    key = np.full((te.size, 6), -1, np.int64)
    for idx, rows in mm_rows:
        pos = np.searchsorted(te, idx)
        is_mm[pos] = True
        key[pos] = np.stack([aps.space[rows], aps.dtype[rows], aps.partitions[rows], aps.start[rows],
                             aps.offset[rows], aps.fid[rows]], axis=1)
    return te, is_mm, key
