"""The timing half of the simulator: when each instruction of a program runs on a NeuronCore.

``prepare_timing`` encodes a program once (at load) into numpy arrays: per-instruction engine/stream,
cost, DMA parameters and the dependency graph derived from read/write sets of memory blocks.
``run_timing`` schedules it with a Numba-compiled loop; its memory is O(instructions), independent of
the simulated time. The model is described in the package README ("Timing model"); every hardware
number comes from the :class:`~neuron_hal.Profile`.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, fields
from itertools import chain, count
from operator import attrgetter

import numba
import numpy as np

from neuron_hal import isa
from neuron_hal.dtypes import DType
from neuron_hal.isa import AP, Alu, Engine, Space
from neuron_hal.profiles import Profile

from . import costs
from .costs import Opnd

ENGINE_NAMES = ("tensor", "vector", "scalar", "gpsimd")
ENGINE_CODES = {Engine.TENSOR: 0, Engine.VECTOR: 1, Engine.SCALAR: 2, Engine.GPSIMD: 3, Engine.SYNC: 4}
N_COMPUTE = 4  # streams 0..3 are the compute engines; DMA queue q is stream N_COMPUTE + q
OPCODE_NAMES = tuple(isa.OPCODES)

# Dependency tracking indexes memory by blocks (SBUF: bytes per partition; PSUM: banks; HBM: bytes of a
# tensor). Records inside a block keep exact byte and partition ranges, so block sizes only trade memory
# and speed; they are model choices, not hardware numbers.
DEP_SBUF_BLOCK_BYTES = 512  # INFERRED: SBUF bytes per partition per tracked block (PSUM uses whole banks)
DEP_HBM_BLOCK_BYTES = 512  # INFERRED: HBM bytes per tracked block (DMA-friendly alignment)
# Implementation limits (bound the prepare-time memory; not hardware numbers).
HBM_DEP_BLOCKS_MAX = 1 << 22  # HBM blocks tracked individually; larger programs get coarser HBM blocks
HBM_ACCESS_BLOCKS_MAX = 1 << 15  # an HBM access touching more blocks is tracked per tensor (conservative)
RECORDS_PER_STREAM_MAX = 4  # disjoint access records a stream keeps per block before merging them


def stream_name(stream: int) -> str:
    return ENGINE_NAMES[stream] if stream < N_COMPUTE else f"dma q{stream - N_COMPUTE}"


@dataclass
class TimingPlan:
    """A program encoded for timing (all arrays have one entry per instruction unless noted)."""

    profile: Profile
    n: int
    opcode: np.ndarray  # int16 index into OPCODE_NAMES
    engine: np.ndarray  # int8: 0..3 compute engines, 4 DMA
    stream: np.ndarray  # int16: engine for compute, N_COMPUTE + queue for DMA (the trace track)
    cycles: np.ndarray  # float64 engine cycles of compute instructions (0 for DMA)
    dur_ns: np.ndarray  # float64 duration of compute instructions (0 for DMA)
    dependent: np.ndarray  # bool: dependent-issue floor applied
    dma_bytes: np.ndarray  # int64 bytes moved (0 for compute)
    dma_engines: np.ndarray  # int64 DMA engines a transfer is split over
    dma_bw: np.ndarray  # float64 bytes/ns per DMA engine
    pred_count: np.ndarray  # int32 dependencies (other streams; same DMA queue included)
    succ_ptr: np.ndarray  # int64 [n + 1] CSR of dependents
    succ_idx: np.ndarray  # int32
    n_streams: int
    stream_ptr: np.ndarray  # int64 [n_streams + 1] CSR of each stream's instructions in program order
    stream_instr: np.ndarray  # int32
    busy_ns: np.ndarray  # float64 [4] compute busy time per engine
    counts: np.ndarray  # int64 [5] instructions per engine (tensor, vector, scalar, gpsimd, dma)
    total_dma_bytes: int
    hbm_block_bytes: int  # HBM dependency granularity used for this program
    # (duration, busy, counts) of an untraced execution: a program's schedule does not depend on when it
    # starts, so it is computed once (a program runs many times: every call of an eager op)
    untraced: tuple | None = None
    # with prepare_timing(..., exact=True): the full dependency graph as a predecessor CSR (pred_ptr [n + 1],
    # preds), every conflicting pair of accesses in program order with no in-order assumption (an engine's own
    # instructions included): what any reordering of the program must keep (see schedule.py)
    exact: tuple | None = None

    @property
    def edges(self) -> int:
        return int(self.succ_idx.size)


@dataclass
class TimingResult:
    start_ns: float
    end_ns: float
    engine_busy_ns: dict[str, float]
    engine_instructions: dict[str, int]
    dma_bytes: int
    start: np.ndarray | None = None  # per instruction (DMA: issue start), when want_events
    end: np.ndarray | None = None  # per instruction (DMA: completion)
    track: np.ndarray | None = None  # per instruction stream id (see stream_name)

    @property
    def device_ns(self) -> float:
        return self.end_ns - self.start_ns


# ---- encoding ---------------------------------------------------------------------------------
_SPACES = (Space.SBUF, Space.PSUM, Space.HBM)  # codes costs.SBUF/PSUM/HBM
_DTYPES = tuple(DType)
_DT_ITEMSIZE = np.array([d.itemsize for d in _DTYPES], np.int64)
_DT_F16 = np.array([d in (DType.bfloat16, DType.float16) for d in _DTYPES])
_DT_BF16 = np.array([d is DType.bfloat16 for d in _DTYPES])
_DT_FP32 = np.array([d is DType.float32 for d in _DTYPES])
_ENGINES = tuple(ENGINE_CODES)
_ALUS = tuple(Alu)

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
                    partitions=col(self.partitions, 0), n=col(self.n, 0),
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


def prepare_timing(program, profile: Profile, exact: bool = False) -> TimingPlan:
    """Encode ``program`` for :func:`run_timing` (once per program; the plan does not change between runs).
    ``exact``: also its full dependency graph (``TimingPlan.exact``)."""
    enabled = gc.isenabled()
    gc.disable()  # the encoder builds millions of short-lived objects with no cycles
    try:
        return _prepare(program, profile, exact)
    finally:
        if enabled:
            gc.enable()


def _prepare(program, profile: Profile, exact: bool = False) -> TimingPlan:
    instrs = program.instructions
    n = len(instrs)
    groups = _group(instrs) if n else []

    opcode = np.zeros(n, np.int16)
    engine = np.zeros(n, np.int8)
    queue = np.zeros(n, np.int64)
    cycles = np.zeros(n, np.float64)
    ls_cycles = np.zeros(n, np.float64)
    dma_bytes = np.zeros(n, np.int64)
    dma_engines = np.ones(n, np.int64)
    dma_bw = np.ones(n, np.float64)

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
        if name == "memset":
            extra["value"] = np.fromiter(map(attrgetter("value"), sub), np.float64, len(idx))
        if name in isa.DMA_OPCODES:
            queue[idx] = np.fromiter(map(attrgetter("queue"), sub), np.int64, len(idx))
            dma_bytes[idx], dma_engines[idx], dma_bw[idx] = costs.dma(name, ops, profile)
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
    acc_i = np.concatenate(acc_i) if acc_i else np.zeros(0, np.int64)
    acc_row = np.concatenate(acc_row) if acc_row else np.zeros(0, np.int64)
    acc_w = np.concatenate(acc_w) if acc_w else np.zeros(0, np.int8)

    bad = (engine == 4) & ((queue < 0) | (queue >= profile.dma_queues))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"timing: instruction {i}: DMA queue {int(queue[i])} outside 0..{profile.dma_queues - 1}")
    stream = np.where(engine == 4, N_COMPUTE + queue, engine).astype(np.int16)
    n_streams = N_COMPUTE + profile.dma_queues

    g = geo = _geometry(program, profile, aps, acc_i, acc_row, acc_w, n)

    def dependencies(streams, count):
        return _dependencies(
            n, streams, count, g["ptr"], g["write"], g["kind"], g["lo"], g["hi"], g["plo"], g["phi"], g["ref"],
            g["h_tensor"], g["h_base"], g["h_len"], g["h_size"], g["h_stride"], g["t_base"], g["t_nblk"],
            g["hbm_blk"], g["sb_blk"], g["sb_nblk"], g["ps_blk"], g["ps_nblk"], g["quad"], g["n_quad"],
            g["scratch"])

    pred_ptr, preds, dependent = dependencies(stream.astype(np.int64), n_streams)
    # every instruction its own (DMA-like) stream: no edge is left to program order, none pruned by it
    full = dependencies(np.arange(N_COMPUTE, N_COMPUTE + n, dtype=np.int64), N_COMPUTE + n)[:2] if exact else None

    # TensorE LoadStationary: hidden behind the previous TensorE instruction unless the stationary is reused.
    _load_stationary(engine, cycles, ls_cycles, mm_rows, aps)
    # Dependent issue: a Vector/Scalar/GpSimd instruction reading what the previous one on its engine wrote.
    vsg = (engine >= 1) & (engine <= 3) & dependent
    cycles = np.where(vsg, np.maximum(cycles, float(profile.dependent_issue_cycles)), cycles)
    ghz = np.array([profile.clock_ghz(e) for e in ENGINE_NAMES] + [1.0])
    dur_ns = np.where(engine == 4, 0.0, cycles / ghz[engine])

    succ_ptr, succ_idx, pred_count = _successors(n, pred_ptr, preds)
    stream_counts = np.bincount(stream, minlength=n_streams)
    stream_ptr = np.concatenate(([0], np.cumsum(stream_counts))).astype(np.int64)
    stream_instr = np.argsort(stream, kind="stable").astype(np.int32)
    busy = np.bincount(engine, weights=dur_ns, minlength=5)[:4].astype(np.float64)
    counts = np.bincount(engine, minlength=5).astype(np.int64)
    return TimingPlan(profile, n, opcode, engine, stream, cycles, dur_ns, vsg, dma_bytes, dma_engines, dma_bw,
                      pred_count, succ_ptr, succ_idx, n_streams, stream_ptr, stream_instr, busy, counts,
                      int(dma_bytes.sum()), int(geo["hbm_blk"]), exact=full)


def _load_stationary(engine, cycles, ls_cycles, mm_rows, aps: _APs) -> None:
    """Add the exposed part of each matmul's LoadStationary to its cycles (in place).

    The stationary is loaded in the background during the previous TensorE instruction: a matmul whose
    stationary AP differs from the previous TensorE instruction's (a transpose counts as different) adds
    max(0, LS - previous duration); the first TensorE matmul pays LS in full.
    """
    if not mm_rows:
        return
    te = np.flatnonzero(engine == 0)
    is_mm = np.zeros(te.size, bool)
    key = np.full((te.size, 6), -1, np.int64)
    for idx, rows in mm_rows:
        pos = np.searchsorted(te, idx)
        is_mm[pos] = True
        key[pos] = np.stack([aps.space[rows], aps.dtype[rows], aps.partitions[rows], aps.start[rows],
                             aps.offset[rows], aps.fid[rows]], axis=1)
    base = cycles[te]
    same = np.zeros(te.size, bool)
    same[1:] = is_mm[1:] & is_mm[:-1] & np.all(key[1:] == key[:-1], axis=1)
    prev = np.concatenate(([0.0], base[:-1]))
    ls = ls_cycles[te]
    exposed = np.where(np.arange(te.size) == 0, ls, np.maximum(0.0, ls - prev))
    cycles[te] = base + np.where(is_mm & ~same, exposed, 0.0)


def _geometry(program, profile: Profile, aps: _APs, acc_i, acc_row, acc_w, n) -> dict:
    """Per-access geometry for the dependency pass (CSR by instruction).

    On chip: the partition range and the per-partition byte range. HBM: segments (rows x outer free dims),
    each a byte range [base + offsets, ... + len) of the tensor.
    """
    # Drop empty accesses, order by instruction (stable: fields in class order).
    nonempty = (aps.partitions[acc_row] > 0) & (aps.n[acc_row] > 0) if acc_row.size else np.zeros(0, bool)
    acc_i, acc_row, acc_w = acc_i[nonempty], acc_row[nonempty], acc_w[nonempty]
    order = np.argsort(acc_i, kind="stable")
    acc_i, acc_row, acc_w = acc_i[order], acc_row[order], acc_w[order]
    ptr = np.concatenate(([0], np.cumsum(np.bincount(acc_i, minlength=n)))).astype(np.int64)

    space = aps.space[acc_row]
    isz = aps.itemsize[acc_row]
    fid = aps.fid[acc_row]
    fr = aps.free
    n_quad, quad = 1, profile.sbuf_partitions  # blocks span all partitions (records keep partition ranges)
    sb_nblk = -(-profile.sbuf_partition_bytes // DEP_SBUF_BLOCK_BYTES)
    ps_nblk = profile.psum_banks
    psum = space == costs.PSUM
    limit = np.where(psum, profile.psum_partition_bytes, profile.sbuf_partition_bytes)
    lo = np.minimum(np.maximum(aps.offset[acc_row] + fr.lo[fid] * isz, 0), limit - 1)
    hi = np.minimum(np.maximum(aps.offset[acc_row] + fr.hi[fid] * isz, lo + 1), limit)
    plo = np.minimum(np.maximum(aps.start[acc_row], 0), profile.sbuf_partitions - 1)
    phi = np.minimum(np.maximum(aps.start[acc_row] + aps.partitions[acc_row], plo + 1), profile.sbuf_partitions)
    unit = np.where(psum, profile.psum_bank_bytes, DEP_SBUF_BLOCK_BYTES)
    ub = (hi - 1) // unit - lo // unit + 1
    kind = space.astype(np.int8)  # 0 SBUF, 1 PSUM, 2 HBM (fine), 3 HBM (coarse, per tensor), 4 no-op

    # HBM: segments = rows x outer free dims; each segment is a byte range [base, base + len).
    n_tensors = len(program.args)
    tensor_bytes = np.array([a.nbytes for a in program.args], np.int64)
    hbm_blk = DEP_HBM_BLOCK_BYTES
    while int(np.sum(-(-tensor_bytes // hbm_blk))) > HBM_DEP_BLOCKS_MAX:
        hbm_blk *= 2
    t_nblk = np.maximum(-(-tensor_bytes // hbm_blk), 1)
    t_base = np.concatenate(([0], np.cumsum(t_nblk))).astype(np.int64)
    h = np.flatnonzero(space == costs.HBM)
    hr = acc_row[h]
    hf = fid[h]
    hisz = isz[h]
    in_n, in_st = fr.inner_size[hf], fr.inner_stride[hf]
    ilo = np.where(in_n > 1, np.minimum(0, (in_n - 1) * in_st), 0) * hisz
    ihi = (np.where(in_n > 1, np.maximum(0, (in_n - 1) * in_st), 0) + 1) * hisz
    h_len = ihi - ilo
    h_base = aps.offset[hr] + ilo
    h_size = np.ones((h.size, 4), np.int64)
    h_stride = np.zeros((h.size, 4), np.int64)
    h_size[:, 0] = aps.partitions[hr]
    h_stride[:, 0] = aps.pstride[hr] * hisz
    h_size[:, 1:] = fr.outer_size[hf]
    h_stride[:, 1:] = fr.outer_stride[hf] * hisz[:, None]
    # Rows that tile the tensor densely (no outer free dims, row stride = row length) form one segment.
    dense = (np.all(h_size[:, 1:] == 1, axis=1)) & (h_stride[:, 0] == h_len)
    h_len = np.where(dense, h_len * h_size[:, 0], h_len)
    h_size[dense, 0] = 1
    h_tensor = np.minimum(np.maximum(aps.tensor[hr], 0), max(n_tensors - 1, 0))
    h_ub = np.prod(h_size, axis=1) * (h_len // hbm_blk + 2)
    coarse = h_ub > HBM_ACCESS_BLOCKS_MAX
    kind[h[coarse]] = 3
    # Reads of a tensor the program never writes cannot depend on anything: skip them.
    written = np.zeros(max(n_tensors, 1), bool)
    written[h_tensor[acc_w[h] == 1]] = True
    kind[h[(acc_w[h] == 0) & ~written[h_tensor]]] = 4
    ub[h] = np.where(coarse, 0, h_ub)
    ref = np.zeros(acc_row.size, np.int64)
    ref[h] = np.where(coarse, h_tensor, np.arange(h.size))
    return dict(ptr=ptr, write=acc_w.astype(np.int8), kind=kind, lo=lo.astype(np.int64), hi=hi.astype(np.int64),
                plo=plo.astype(np.int64), phi=phi.astype(np.int64), ref=ref, h_tensor=h_tensor.astype(np.int64),
                h_base=h_base.astype(np.int64), h_len=h_len.astype(np.int64), h_size=h_size, h_stride=h_stride,
                t_base=t_base, t_nblk=t_nblk.astype(np.int64), hbm_blk=hbm_blk, sb_blk=DEP_SBUF_BLOCK_BYTES,
                sb_nblk=sb_nblk, ps_blk=profile.psum_bank_bytes, ps_nblk=ps_nblk, quad=quad,
                n_quad=n_quad, scratch=int(ub.max()) if ub.size else 1)


# ---- dependency graph (Numba) -----------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _add_pred(j, i, s, stream, mark, preds, npred):
    """Record j as a dependency of i (once; same compute stream is implied by program order).
    The caller guarantees room in preds."""
    if j < 0 or j == i or mark[j] == i:
        return npred
    mark[j] = i
    if s < N_COMPUTE and stream[j] == s:
        return npred
    preds[npred] = j
    return npred + 1


@numba.njit(cache=True, inline="always", error_model="numpy")
def _grow(arr, used, need):
    if used + need <= arr.shape[0]:
        return arr
    grown = np.empty(max(2 * arr.shape[0], used + need), arr.dtype)
    grown[:used] = arr[:used]
    return grown


@numba.njit(cache=True, inline="always", error_model="numpy")
def _access_blocks(a, kind, lo, hi, plo, phi, ref, h_tensor, h_base, h_len, h_size, h_stride, t_base, t_nblk,
                   hbm_blk, sb_blk, sb_nblk, ps_blk, ps_nblk, quad, n_quad, blk, blo, bhi, bplo, bphi):
    """Fill (blk, blo, bhi, bplo, bphi) with the blocks access a touches and, in each, the byte range
    (relative to the block) and partition range it covers; returns how many (a block may repeat)."""
    cnt = 0
    k = kind[a]
    if k <= 1:
        if k == 0:
            base, qstride, unit = 0, sb_nblk, sb_blk
        else:
            base, qstride, unit = n_quad * sb_nblk, ps_nblk, ps_blk
        p0, p1, x0, x1 = plo[a], phi[a], lo[a], hi[a]
        for q in range(p0 // quad, (p1 - 1) // quad + 1):
            for b in range(x0 // unit, (x1 - 1) // unit + 1):
                blk[cnt] = base + q * qstride + b
                blo[cnt] = max(x0 - b * unit, 0)
                bhi[cnt] = min(x1 - b * unit, unit)
                bplo[cnt] = max(p0, q * quad)
                bphi[cnt] = min(p1, (q + 1) * quad)
                cnt += 1
        return cnt
    r = ref[a]
    t = h_tensor[r]
    tb = n_quad * (sb_nblk + ps_nblk) + t_base[t]
    tensor_end = t_nblk[t] * hbm_blk
    ln = h_len[r]
    s0, s1, s2, s3 = h_size[r, 0], h_size[r, 1], h_size[r, 2], h_size[r, 3]
    d0, d1, d2, d3 = h_stride[r, 0], h_stride[r, 1], h_stride[r, 2], h_stride[r, 3]
    for i0 in range(s0):
        for i1 in range(s1):
            for i2 in range(s2):
                for i3 in range(s3):
                    x0 = min(max(h_base[r] + i0 * d0 + i1 * d1 + i2 * d2 + i3 * d3, 0), tensor_end - 1)
                    x1 = min(max(x0 + ln, x0 + 1), tensor_end)
                    for b in range(x0 // hbm_blk, (x1 - 1) // hbm_blk + 1):
                        r0 = max(x0 - b * hbm_blk, 0)
                        r1 = min(x1 - b * hbm_blk, hbm_blk)
                        if cnt > 0 and blk[cnt - 1] == tb + b and blo[cnt - 1] <= r1 and r0 <= bhi[cnt - 1]:
                            blo[cnt - 1] = min(blo[cnt - 1], r0)  # touches the previous segment: one range
                            bhi[cnt - 1] = max(bhi[cnt - 1], r1)
                            continue
                        blk[cnt] = tb + b
                        blo[cnt] = r0
                        bhi[cnt] = r1
                        bplo[cnt] = 0
                        bphi[cnt] = 1
                        cnt += 1
    return cnt


@numba.njit(cache=True, error_model="numpy")
def _visit_blocks(i, s, prev, phase, cnt, blk, blo, bhi, bplo, bphi, head, recs, n_rec, free_rec, stream, mark,
                  preds, npred):
    """Apply one access (its cnt block ranges) of instruction i to the block records (see _dependencies).
    The caller guarantees room for cnt new records and for every record's instruction as a predecessor.
    Returns (npred, n_rec, free_rec, dependent)."""
    dependent = False
    for c in range(cnt):
        b = blk[c]
        x0, x1, p0, p1 = blo[c], bhi[c], bplo[c], bphi[c]
        mine = -1  # a record of this stream and kind that the new range covers: reused
        n_mine = 0  # other records of this stream and kind in this block
        merge_into = -1
        before = -1
        rec = head[b]
        while rec >= 0:
            nxt = recs[rec, 7]
            overlap = recs[rec, 3] < x1 and x0 < recs[rec, 4] and recs[rec, 5] < p1 and p0 < recs[rec, 6]
            if overlap and (phase == 1 or recs[rec, 2] == 1):
                j = recs[rec, 0]
                if j != i and mark[j] != i:  # _add_pred inlined by hand: a call costs more than the work
                    mark[j] = i
                    if s >= N_COMPUTE or stream[j] != s:
                        preds[npred] = j
                        npred += 1
                if phase == 0 and j == prev:
                    dependent = True
            covered = x0 <= recs[rec, 3] and recs[rec, 4] <= x1 and p0 <= recs[rec, 5] and recs[rec, 6] <= p1
            same = recs[rec, 1] == s and recs[rec, 2] == phase
            if covered and same and mine < 0:
                mine = rec
                before = rec
            elif covered and (same or (phase == 1 and recs[rec, 0] != i)):
                # superseded: later accesses that overlap it overlap this one too
                if before < 0:
                    head[b] = nxt
                else:
                    recs[before, 7] = nxt
                recs[rec, 7] = free_rec
                free_rec = rec
            else:
                if same:
                    n_mine += 1
                    if merge_into < 0 or recs[rec, 0] == i:
                        merge_into = rec  # the newest record (lists are newest first), or this instruction's
                before = rec
            rec = nxt
        if mine < 0 and n_mine >= RECORDS_PER_STREAM_MAX:
            mine = merge_into  # too many: merge into the hull (conservative)
            j = recs[mine, 0]
            if j != i and mark[j] != i:  # the record will stand for i: i must not overtake j (a DMA queue
                mark[j] = i  # orders completions, not starts)
                if s >= N_COMPUTE or stream[j] != s:
                    preds[npred] = j
                    npred += 1
        if mine >= 0:
            recs[mine, 0] = i
            recs[mine, 3] = min(recs[mine, 3], x0)
            recs[mine, 4] = max(recs[mine, 4], x1)
            recs[mine, 5] = min(recs[mine, 5], p0)
            recs[mine, 6] = max(recs[mine, 6], p1)
        else:
            if free_rec >= 0:
                rec = free_rec
                free_rec = recs[rec, 7]
            else:
                rec = n_rec
                n_rec += 1
            recs[rec, 0] = i
            recs[rec, 1] = s
            recs[rec, 2] = phase
            recs[rec, 3] = x0
            recs[rec, 4] = x1
            recs[rec, 5] = p0
            recs[rec, 6] = p1
            recs[rec, 7] = head[b]
            head[b] = rec
    return npred, n_rec, free_rec, dependent


@numba.njit(cache=True, error_model="numpy")
def _dependencies(n, stream, n_streams, ptr, write, kind, lo, hi, plo, phi, ref, h_tensor, h_base, h_len, h_size,
                  h_stride, t_base, t_nblk, hbm_blk, sb_blk, sb_nblk, ps_blk, ps_nblk, quad, n_quad, scratch):
    """Dependencies of every instruction, in program order, from the memory its accesses read and write.

    Memory is cut into blocks; each block keeps a list of access records (instruction, stream, read or
    write, byte range in the block, partition range). A read depends on the overlapping write records, a
    write on all overlapping records; records a write covers are dropped (later accesses reach them through
    the write), and so are a stream's records that its new access of the same kind covers. Beyond
    RECORDS_PER_STREAM_MAX records per stream and kind in a block, the new access merges into one of them
    (instruction := the new one, range := the hull): a stream completes in order, so its latest
    instruction stands for the earlier ones (conservative).
    HBM accesses too large to enumerate are tracked per tensor ("coarse"), ordered against every access to
    that tensor. Returns (pred_ptr, preds, dependent): dependent[i] says i reads what the instruction just
    before it on its engine wrote.
    """
    n_tensors = t_nblk.shape[0]
    n_blocks = n_quad * (sb_nblk + ps_nblk) + t_base[n_tensors]
    head = np.full(n_blocks, -1, np.int32)  # first record of each block
    # Records, one row each (one cache line): instruction, stream, is-write, byte lo, byte hi, partition lo,
    # partition hi, next record of the block.
    cap = 1024
    recs = np.empty((cap, 8), np.int32)
    n_rec = 0
    free_rec = -1
    g_count = max(n_tensors, 1)
    coarse_writer = np.full(g_count, -1, np.int32)
    fine_writer = np.full((g_count, n_streams), -1, np.int32)  # latest fine writer of a tensor per stream
    fine_reader = np.full((g_count, n_streams), -1, np.int32)
    coarse_reader = np.full((g_count, n_streams), -1, np.int32)
    last_on = np.full(n_streams, -1, np.int64)
    mark = np.full(max(n, 1), -1, np.int64)
    pred_ptr = np.zeros(n + 1, np.int64)
    preds = np.empty(max(16, 2 * n), np.int32)
    npred = 0
    dependent = np.zeros(n, np.bool_)
    m = max(scratch, 1)
    blk = np.empty(m, np.int64)
    blo = np.empty(m, np.int64)
    bhi = np.empty(m, np.int64)
    bplo = np.empty(m, np.int64)
    bphi = np.empty(m, np.int64)
    for i in range(n):
        s = stream[i]
        prev = last_on[s]
        for phase in range(2):  # reads first, then writes
            for a in range(ptr[i], ptr[i + 1]):
                if write[a] != phase:
                    continue
                k = kind[a]
                if k == 4:
                    continue
                preds = _grow(preds, npred, 4 * n_streams + 1)  # the per-tensor (coarse) slots
                if k == 3:
                    g = ref[a]
                    if coarse_writer[g] >= 0:
                        npred = _add_pred(coarse_writer[g], i, s, stream, mark, preds, npred)
                    for s2 in range(n_streams):
                        if fine_writer[g, s2] >= 0:
                            npred = _add_pred(fine_writer[g, s2], i, s, stream, mark, preds, npred)
                        if phase == 1:
                            if fine_reader[g, s2] >= 0:
                                npred = _add_pred(fine_reader[g, s2], i, s, stream, mark, preds, npred)
                            if coarse_reader[g, s2] >= 0:
                                npred = _add_pred(coarse_reader[g, s2], i, s, stream, mark, preds, npred)
                    if phase == 0:
                        coarse_reader[g, s] = i
                    else:
                        coarse_writer[g] = i
                        fine_writer[g, :] = -1
                        fine_reader[g, :] = -1
                        coarse_reader[g, :] = -1
                    continue
                if k == 2:
                    g = h_tensor[ref[a]]
                    if coarse_writer[g] >= 0:
                        npred = _add_pred(coarse_writer[g], i, s, stream, mark, preds, npred)
                    if phase == 0:
                        fine_reader[g, s] = i
                    else:
                        for s2 in range(n_streams):
                            if coarse_reader[g, s2] >= 0:
                                npred = _add_pred(coarse_reader[g, s2], i, s, stream, mark, preds, npred)
                        fine_writer[g, s] = i
                cnt = _access_blocks(a, kind, lo, hi, plo, phi, ref, h_tensor, h_base, h_len, h_size, h_stride,
                                     t_base, t_nblk, hbm_blk, sb_blk, sb_nblk, ps_blk, ps_nblk, quad, n_quad,
                                     blk, blo, bhi, bplo, bphi)
                # room for every record of every block (distinct earlier instructions: at most i)
                preds = _grow(preds, npred, min(cnt * 2 * RECORDS_PER_STREAM_MAX * n_streams, i + 1))
                if n_rec + cnt > cap:
                    cap = 2 * (n_rec + cnt)
                    grown = np.empty((cap, 8), np.int32)
                    grown[:n_rec] = recs[:n_rec]
                    recs = grown
                npred, n_rec, free_rec, dep = _visit_blocks(i, s, prev, phase, cnt, blk, blo, bhi, bplo, bphi, head,
                                                            recs, n_rec, free_rec, stream, mark, preds, npred)
                if dep:
                    dependent[i] = True
        pred_ptr[i + 1] = npred
        last_on[s] = i
    return pred_ptr, preds[:npred].copy(), dependent


@numba.njit(cache=True, error_model="numpy")
def _successors(n, pred_ptr, preds):
    """Successor CSR and dependency counts from the predecessor CSR."""
    succ_ptr = np.zeros(n + 1, np.int64)
    for k in range(preds.shape[0]):
        succ_ptr[preds[k] + 1] += 1
    for i in range(n):
        succ_ptr[i + 1] += succ_ptr[i]
    fill = succ_ptr[:n].copy()
    succ_idx = np.empty(preds.shape[0], np.int32)
    pred_count = np.empty(n, np.int32)
    for i in range(n):
        pred_count[i] = pred_ptr[i + 1] - pred_ptr[i]
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            p = preds[k]
            succ_idx[fill[p]] = i
            fill[p] += 1
    return succ_ptr, succ_idx, pred_count


# ---- scheduling (Numba) -----------------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _schedule(n, n_streams, stream_ptr, stream_instr, dur, dma_bytes, dma_engines, dma_bw, pred_count, succ_ptr,
              succ_idx, start_ns, issue_ns, fixed_ns, n_dge, n_dma, want, out_start, out_end):
    """List-schedule the program in time order; returns (end_ns, total DMA-engine busy ns).

    Each step starts, among the streams whose next instruction has all its dependencies done, the one
    that can start earliest (ties: program order). Compute streams run one instruction at a time. A DMA
    queue issues one DMA at a time on a free DGE unit (dma_issue_ns), its data starts dma_fixed_ns later
    and is split evenly over FIFO DMA engines taken round-robin; a queue completes in order.
    """
    remaining = pred_count.copy()
    ready_at = np.full(n, start_ns)
    head = stream_ptr[:n_streams].copy()
    stream_free = np.full(n_streams, start_ns)
    queue_done = np.full(n_streams, start_ns)
    dge_free = np.full(max(n_dge, 1), start_ns)
    engine_free = np.full(max(n_dma, 1), start_ns)
    active = np.empty(n_streams, np.int64)
    n_active = 0
    for s in range(n_streams):
        if stream_ptr[s + 1] > stream_ptr[s]:
            active[n_active] = s
            n_active += 1
    rr = 0
    end_max = start_ns
    dma_busy = 0.0
    for _ in range(n):
        dge_u = 0
        for u in range(1, n_dge):
            if dge_free[u] < dge_free[dge_u]:
                dge_u = u
        best_k, best_i, best_t = -1, n, np.inf
        for k in range(n_active):
            s = active[k]
            i = stream_instr[head[s]]
            if remaining[i] != 0:
                continue
            t = max(stream_free[s], ready_at[i])
            if s >= N_COMPUTE:
                t = max(t, dge_free[dge_u])
            if t < best_t or (t == best_t and i < best_i):
                best_k, best_i, best_t = k, i, t
        if best_k < 0:
            return -1.0, 0.0  # unreachable for a program-ordered graph
        s = active[best_k]
        i = best_i
        t = best_t
        if s < N_COMPUTE:
            e = t + dur[i]
            stream_free[s] = e
        else:
            issued = t + issue_ns
            dge_free[dge_u] = issued
            stream_free[s] = issued
            data = issued + fixed_ns
            parts = dma_engines[i]
            chunk = dma_bytes[i] / parts / dma_bw[i]
            e = data
            for j in range(parts):
                eng = (rr + j) % n_dma
                c_end = max(data, engine_free[eng]) + chunk
                engine_free[eng] = c_end
                e = max(e, c_end)
            rr = (rr + parts) % n_dma
            dma_busy += chunk * parts
            e = max(e, queue_done[s])
            queue_done[s] = e
        if want:
            out_start[i] = t
            out_end[i] = e
        end_max = max(end_max, e)
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            remaining[j] -= 1
            if ready_at[j] < e:
                ready_at[j] = e
        head[s] += 1
        if head[s] == stream_ptr[s + 1]:
            n_active -= 1
            active[best_k] = active[n_active]
    return end_max, dma_busy


def run_timing(plan: TimingPlan, start_ns: float = 0.0, want_events: bool = False) -> TimingResult:
    """Time one execution of a prepared program starting at device time ``start_ns``."""
    if want_events:
        return _run_timing(plan, start_ns, True)
    if plan.untraced is None:
        first = _run_timing(plan, 0.0, False)
        plan.untraced = (first.end_ns, first.engine_busy_ns, first.engine_instructions)
    duration, busy, counts = plan.untraced
    return TimingResult(float(start_ns), float(start_ns) + duration, dict(busy), dict(counts), plan.total_dma_bytes)


def _run_timing(plan: TimingPlan, start_ns: float, want_events: bool) -> TimingResult:
    p = plan.profile
    n = plan.n
    out_start = np.empty(n if want_events else 0, np.float64)
    out_end = np.empty(n if want_events else 0, np.float64)
    end_ns, dma_busy = _schedule(n, plan.n_streams, plan.stream_ptr, plan.stream_instr, plan.dur_ns,
                                 plan.dma_bytes, plan.dma_engines, plan.dma_bw, plan.pred_count, plan.succ_ptr,
                                 plan.succ_idx, float(start_ns), float(p.dma_issue_ns), float(p.dma_fixed_ns),
                                 int(p.dma_dge_units), int(p.dma_engines), want_events, out_start, out_end)
    if end_ns < start_ns:
        raise RuntimeError("timing: scheduler found no runnable instruction (dependency cycle)")
    busy = {name: float(plan.busy_ns[k]) for k, name in enumerate(ENGINE_NAMES)}
    busy["dma"] = dma_busy / p.dma_engines
    counts = {name: int(plan.counts[k]) for k, name in enumerate(ENGINE_NAMES)}
    counts["dma"] = int(plan.counts[4])
    result = TimingResult(float(start_ns), float(end_ns), busy, counts, plan.total_dma_bytes)
    if want_events:
        result.start, result.end, result.track = out_start, out_end, plan.stream
    return result


def chrome_trace(program, plan: TimingPlan, result: TimingResult, device: int = 0) -> dict:
    """Chrome/Perfetto trace of one timed execution (``run_timing(..., want_events=True)``)."""
    from .trace import chrome_trace as _chrome_trace

    return _chrome_trace(program, plan, result, device)
