"""Per-instruction cost formulas of the timing model, vectorized over the instructions of one opcode.

Each formula returns engine cycles (float) for an array of instructions. Every number comes from the
:class:`~neuron_hal.Profile`; the formulas are the documented NKI estimates (docs/hardware.md §3) with the
choices written down in the package README ("Timing model"). N is the destination's elements per
partition unless a formula says otherwise.

Operands reach the formulas as :class:`Opnd` columns: one entry per instruction of the group, with
``present`` False where the field holds an immediate or None. The rules that depend on the instruction sequence
(LoadStationary reuse, the dependent-issue drain, activation-table loads) are at the end; contention for engines,
queues and DMA engines is the event loop's (:mod:`.events`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuron_hal.isa import Act, Alu

SBUF, PSUM, HBM, ABSENT = 0, 1, 2, -1  # space codes of Opnd.space

ALU_CODES = {op: k for k, op in enumerate(Alu)}
ACT_CODES = {f: k for k, f in enumerate(Act)}
_IDENTITY = ACT_CODES[Act.identity]


@dataclass
class Opnd:
    """One AP-valued field of a group of instructions, as columns (one row per instruction)."""

    present: np.ndarray  # bool: the field holds an AP
    space: np.ndarray  # int8: SBUF / PSUM / HBM / ABSENT
    itemsize: np.ndarray  # int64 bytes per element
    f16: np.ndarray  # bool: bfloat16 or float16
    bf16: np.ndarray  # bool
    fp32: np.ndarray  # bool
    partitions: np.ndarray  # int64
    start: np.ndarray  # int64 start partition (on chip)
    n: np.ndarray  # int64 elements per partition (free size)
    inner_size: np.ndarray  # int64 size of the innermost free dim of size > 1 (1 if none)
    inner_stride: np.ndarray  # int64 its stride in elements (0 if none)
    run: np.ndarray  # int64 elements of the innermost contiguous run of the free pattern
    pstride: np.ndarray  # int64 elements between rows (HBM)

    @property
    def on_chip(self) -> np.ndarray:
        return (self.space == SBUF) | (self.space == PSUM)

    @property
    def sbuf(self) -> np.ndarray:
        return self.space == SBUF

    @property
    def psum(self) -> np.ndarray:
        return self.space == PSUM

    @property
    def contiguous(self) -> np.ndarray:
        """Unit stride along the innermost free dim that has more than one element."""
        return (self.inner_size <= 1) | (self.inner_stride == 1)

    def strided(self, profile) -> np.ndarray:
        """The stride penalty condition: innermost stride >= stride_penalty_bytes on chip."""
        nbytes = np.abs(self.inner_stride) * self.itemsize
        return self.present & self.on_chip & (self.inner_size > 1) & (nbytes >= profile.stride_penalty_bytes)

    @property
    def num_elements(self) -> np.ndarray:
        return self.partitions * self.n


def _penalty(ops: dict[str, Opnd], profile) -> np.ndarray:
    """2 where any on-chip operand pays the stride penalty, else 1 (multiplies the N-dependent term)."""
    hit = None
    for o in ops.values():
        s = o.strided(profile)
        hit = s if hit is None else hit | s
    return np.where(hit, 2.0, 1.0)


def _floor(cycles, profile) -> np.ndarray:
    return np.maximum(float(profile.min_ii), cycles)


def _op_in(op: np.ndarray, *alus: Alu) -> np.ndarray:
    return np.isin(op, [ALU_CODES[a] for a in alus])


# Engine codes used by the formulas (same numbering as timing.ENGINE_CODES).
TENSOR, VECTOR, SCALAR, GPSIMD, SYNC = 0, 1, 2, 3, 4


# ---- TensorE ----------------------------------------------------------------------------------
def matmul(ops, extra, engine, profile):
    """(II, LoadStationary) in TensorE cycles: II = max(min(mm_init_latency, M), N_moving),
    LS = ceil(M / fast_load_stationary_factor); both x matmul_fp32_factor for fp32 inputs."""
    st, mv = ops["stationary"], ops["moving"]
    factor = np.where(st.fp32 | mv.fp32, float(profile.matmul_fp32_factor), 1.0)
    m = st.n.astype(np.float64)
    ii = np.maximum(np.minimum(float(profile.mm_init_latency), m), mv.n) * factor
    ls = np.ceil(m / profile.fast_load_stationary_factor) * factor
    return ii, ls


def transpose(ops, extra, engine, profile):
    """TensorE: max(P, min(mm_init_latency, F)) of src; VectorE: max(MIN_II, N)."""
    src, dst = ops["src"], ops["dst"]
    pe = np.maximum(src.partitions, np.minimum(profile.mm_init_latency, src.n)).astype(np.float64)
    vec = _floor(dst.n * _penalty(ops, profile), profile)
    return np.where(engine == TENSOR, pe, vec)


# ---- Vector / Scalar / GpSimd -----------------------------------------------------------------
def activation(ops, extra, engine, profile):
    """max(MIN_II, N), plus act_read_accumulator_cycles with reduce_dst."""
    cycles = _floor(ops["dst"].n * _penalty(ops, profile), profile)
    return cycles + np.where(ops["reduce_dst"].present, float(profile.act_read_accumulator_cycles), 0.0)


def tensor_tensor(ops, extra, engine, profile):
    """N when one input is in PSUM and the other in SBUF, or all operands 16-bit float, both inputs in SBUF,
    op add/subtract/multiply, unit innermost stride; else 2N; floored at MIN_II."""
    dst, a, b = ops["dst"], ops["a"], ops["b"]
    split = (a.psum & b.sbuf) | (a.sbuf & b.psum)
    fast16 = (dst.f16 & a.f16 & b.f16 & a.sbuf & b.sbuf & _op_in(extra["op"], Alu.add, Alu.subtract, Alu.multiply)
              & dst.contiguous & a.contiguous & b.contiguous)
    per_elem = np.where(split | fast16, 1.0, 2.0)
    return _floor(per_elem * dst.n * _penalty(ops, profile), profile)


def scalar_tensor_tensor(ops, extra, engine, profile):
    """N when data (src) and operand1 are bfloat16, op0 subtract, op1 multiply and N even, else 2N; floored
    at MIN_II like the other VectorE formulas. Per-partition scalar operands do not count."""
    dst, src, other = ops["dst"], ops["src"], ops["operand1"]
    fast = (src.bf16 & other.bf16 & _op_in(extra["op0"], Alu.subtract) & _op_in(extra["op1"], Alu.multiply)
            & (dst.n % 2 == 0))
    return _floor(np.where(fast, 1.0, 2.0) * dst.n * _penalty(ops, profile), profile)


def tensor_tensor_scan(ops, extra, engine, profile):
    """max(MIN_II, 2N), N = data0 elements per partition (NKI 2.26 docstring)."""
    return _floor(2.0 * ops["data0"].n * _penalty(ops, profile), profile)


def bn_stats(ops, extra, engine, profile):
    """max(MIN_II, N), N = src (data) elements per partition."""
    return _floor(ops["src"].n * _penalty(ops, profile), profile)


def bn_aggr(ops, extra, engine, profile):
    """max(MIN_II, 13 * (N / 3)), N = src elements per partition (13 cycles per aggregated triple)."""
    return _floor(13.0 * (ops["src"].n / 3.0) * _penalty(ops, profile), profile)


def _copy_like(ops, extra, engine, profile):
    """max(MIN_II, N / f): f from the VectorE perf modes or ScalarE 16-bit mode (streamed operands dst, src)."""
    dst, src = ops["dst"], ops["src"]
    all16 = dst.f16 & src.f16
    full = all16 & dst.sbuf & src.sbuf & dst.contiguous & src.contiguous
    vec_f = np.where(full, float(profile.vector_perf_copy_factor),
                     np.where(all16, float(profile.vector_perf_copy_partial_factor), 1.0))
    sca_f = np.where(all16, float(profile.scalar_perf_factor), 1.0)
    f = np.where(engine == VECTOR, vec_f, np.where(engine == SCALAR, sca_f, 1.0))
    return _floor(dst.n * _penalty(ops, profile) / f, profile)


tensor_scalar = _copy_like
tensor_copy = _copy_like


def tensor_reduce(ops, extra, engine, profile):
    """N/2 when src and dst are bfloat16 and op is add or max, else N; N = src elements per partition."""
    src, dst = ops["src"], ops["dst"]
    half = src.bf16 & dst.bf16 & _op_in(extra["op"], Alu.add, Alu.max)
    return _floor(np.where(half, 0.5, 1.0) * src.n * _penalty(ops, profile), profile)


def memset(ops, extra, engine, profile):
    """N/2 when the value is 0 and dst is 16-bit float, else N; floored at MIN_II."""
    dst = ops["dst"]
    half = (extra["value"] == 0) & dst.f16
    return _floor(np.where(half, 0.5, 1.0) * dst.n * _penalty(ops, profile), profile)


def gpsimd_pattern(ops, extra, engine, profile):
    """iota / affine_select: gpsimd_start + N (no MIN_II floor)."""
    return profile.gpsimd_start + ops["dst"].n * _penalty(ops, profile)


iota = gpsimd_pattern
affine_select = gpsimd_pattern


def select(ops, extra, engine, profile):
    """N when predicate and on_true are split between SBUF and PSUM, else 2N; floored at MIN_II."""
    pred, on_true = ops["predicate"], ops["on_true"]
    split = (pred.psum & on_true.sbuf) | (pred.sbuf & on_true.psum)
    return _floor(np.where(split, 1.0, 2.0) * ops["dst"].n * _penalty(ops, profile), profile)


def _tree_passes(partitions: np.ndarray) -> np.ndarray:
    """[INFERRED] a reduction/broadcast tree over P partitions takes ceil(log2 P) passes (at least 1)."""
    p = np.maximum(partitions, 1).astype(np.float64)
    return np.maximum(1.0, np.ceil(np.log2(p)))


def partition_reduce(ops, extra, engine, profile):
    """[INFERRED] gpsimd_start + N * ceil(log2 P), P = src partitions."""
    return profile.gpsimd_start + ops["dst"].n * _penalty(ops, profile) * _tree_passes(ops["src"].partitions)


def partition_broadcast(ops, extra, engine, profile):
    """[INFERRED] gpsimd_start + N * ceil(log2 P), P = dst partitions."""
    return profile.gpsimd_start + ops["dst"].n * _penalty(ops, profile) * _tree_passes(ops["dst"].partitions)


COMPUTE = {
    "nc_transpose": transpose,
    "activation": activation,
    "tensor_tensor": tensor_tensor,
    "tensor_scalar": tensor_scalar,
    "scalar_tensor_tensor": scalar_tensor_tensor,
    "tensor_tensor_scan": tensor_tensor_scan,
    "bn_stats": bn_stats,
    "bn_aggr": bn_aggr,
    "tensor_reduce": tensor_reduce,
    "tensor_copy": tensor_copy,
    "memset": memset,
    "iota": iota,
    "affine_select": affine_select,
    "select": select,
    "partition_reduce": partition_reduce,
    "partition_broadcast": partition_broadcast,
}


# ---- DMA --------------------------------------------------------------------------------------
@dataclass
class Dma:
    """Per-instruction DMA figures (columns); the event loop (:mod:`.events`) times them."""

    nbytes: np.ndarray  # int64 bytes moved
    p0: np.ndarray  # int64 first partition of the on-chip side; -1: rows spread on every engine (no on-chip side
    # or no partition affinity)
    parts: np.ndarray  # int64 partitions of the on-chip side (rows when there is none)
    runs: np.ndarray  # int64 contiguous runs (descriptors) per partition
    bw: np.ndarray  # float64 bytes/ns per engine
    read: np.ndarray  # bool: the source is HBM (the queue's HBM read window applies)


def dma(opcode: str, ops, profile) -> Dma:
    """What each DMA instruction moves, where, in how many runs, at what per-engine bandwidth.

    bytes = moved elements x max(src, dst itemsize); the moved tile is dst for copies, transposes and gathers,
    src for scatters (the table side of an indirect DMA is the whole table). The on-chip side (the wider one when
    both are on chip) decides the engines: partition p is served by engine p // dma_partitions_per_engine
    [DMA-OV] where the profile has partition affinity (NC-v3+); without it (NC-v2), and with no on-chip side
    (HBM to HBM), the rows spread over every engine, and a transfer that is one
    contiguous range on both sides is one piece per engine. Runs per partition: the
    contiguous runs of each side as stored, the larger count (one descriptor per run); indirect DMAs have one
    table row per tile partition. Bandwidth per engine: dma_engine_bytes_per_ns, capped at the engine's share of
    the core's HBM bandwidth when HBM is involved (half of it from HBM to HBM, which reads and writes every byte
    there); a DMA transpose moves at dma_transpose_hbm_fraction (from HBM) or dma_transpose_sbuf_fraction (SBUF
    to SBUF) of that.
    """
    dst, src = ops["dst"], ops["src"]
    tile = src if opcode == "dma_scatter" else dst
    nbytes = tile.num_elements * np.maximum(dst.itemsize, src.itemsize)
    dst_p = np.where(dst.on_chip, dst.partitions, 0)
    src_p = np.where(src.on_chip, src.partitions, 0)
    use_dst = dst_p >= src_p
    parts = np.where(use_dst, dst_p, src_p)
    p0 = np.where(parts > 0, np.where(use_dst, dst.start, src.start), -1)
    if not profile.dma_partition_affinity:  # NC-v2: the compiler spreads every transfer over all engines
        p0 = np.full_like(p0, -1)
    hbm_rows = np.maximum(np.where(dst.space == HBM, dst.partitions, 0), np.where(src.space == HBM, src.partitions, 0))
    parts = np.where(parts > 0, parts, np.maximum(hbm_rows, 1))
    hbm = (dst.space == HBM) | (src.space == HBM)
    both = (dst.space == HBM) & (src.space == HBM)
    share = profile.hbm_gbps_per_core / profile.dma_engines
    capped = min(profile.dma_engine_bytes_per_ns, share)
    capped_both = min(profile.dma_engine_bytes_per_ns, share / 2)  # HBM to HBM reads and writes every byte
    bw = np.where(both, capped_both, np.where(hbm, capped, float(profile.dma_engine_bytes_per_ns)))
    if opcode == "dma_transpose":
        hf, sf = profile.dma_transpose_hbm_fraction, profile.dma_transpose_sbuf_fraction
        if not profile.dma_transpose or hf <= 0 or sf <= 0:
            raise ValueError(f"timing: {profile.name} has no DMA transpose (profile.dma_transpose is False)")
        bw = bw * np.where(hbm, hf, sf)
    if opcode in ("dma_copy", "dma_transpose"):  # a transpose: the runs of each side as stored
        runs = np.maximum(_runs(dst), _runs(src))
    else:  # indirect: one table row per tile partition
        table = dst if opcode == "dma_scatter" else src
        runs = np.maximum(_runs(tile), tile.partitions * _per_row(table))
    # HBM to HBM in one run on each side (however the pattern cuts it into rows): one contiguous range, cut into
    # one piece per engine rather than one per (possibly one-element) row
    whole = ~(dst.on_chip | src.on_chip) & (runs == 1)
    parts = np.where(whole, np.minimum(parts, profile.dma_engines), parts)
    runs_pp = np.maximum(-(-runs // np.maximum(parts, 1)), 1)
    return Dma(nbytes.astype(np.int64), p0.astype(np.int64), parts.astype(np.int64), runs_pp.astype(np.int64),
               bw.astype(np.float64), (src.space == HBM) & src.present)


def _per_row(side: Opnd) -> np.ndarray:
    return -(-np.maximum(side.n, 1) // np.maximum(side.run, 1))


def _runs(side: Opnd) -> np.ndarray:
    """Contiguous runs (descriptor elements) an operand splits a transfer into: one per partition row at
    least on chip; HBM rows that continue each other merge into one run."""
    per_row = _per_row(side)
    whole_rows = (side.space == HBM) & (per_row == 1) & (side.pstride == side.n)
    runs = np.where(whole_rows, 1, side.partitions * per_row)
    return np.where(side.present, np.maximum(runs, 1), 0)


def dma_estimates(plan, profile) -> tuple[np.ndarray, np.ndarray]:
    """(latency to completion, time its engine or queue is held) of each instruction alone, for orderings that
    need a cost per instruction (:mod:`.schedule`): a DMA holds its queue while its descriptors are generated and
    completes after the fixed latency and its busiest engine's share."""
    dma = plan.engine == SYNC
    ppe = profile.dma_partitions_per_engine
    per_engine = np.where(plan.dma_p0 >= 0, np.minimum(plan.dma_parts, ppe), plan.dma_parts / profile.dma_engines)
    bpp = plan.dma_bytes / np.maximum(plan.dma_parts, 1)
    run_t = np.maximum(profile.dma_run_min_ns, bpp / np.maximum(plan.dma_runs, 1) / np.maximum(plan.dma_bw, 1e-9))
    transfer = per_engine * plan.dma_runs * run_t
    issue = profile.dma_issue_ns + profile.dma_issue_desc_ns * plan.dma_parts * plan.dma_runs
    latency = np.where(dma, np.maximum(profile.dma_fixed_ns, issue) + transfer, plan.dur_ns)
    occupancy = np.where(dma, issue, plan.dur_ns)
    return latency, occupancy


# ---- sequence-dependent costs -----------------------------------------------------------------
def load_stationary(cycles, ls_cycles, te, te_mm, te_key) -> np.ndarray:
    """Cycles with each matmul's exposed LoadStationary added.

    The stationary is loaded in the background during the previous TensorE instruction: a matmul whose
    stationary AP differs from the previous TensorE instruction's (a transpose counts as different) adds
    max(0, LS - previous duration); the first TensorE matmul pays LS in full.
    """
    cycles = cycles.copy()
    if not te_mm.any():
        return cycles
    base = cycles[te]
    same = np.zeros(te.size, bool)
    same[1:] = te_mm[1:] & te_mm[:-1] & np.all(te_key[1:] == te_key[:-1], axis=1)
    prev = np.concatenate(([0.0], base[:-1]))
    ls = ls_cycles[te]
    exposed = np.where(np.arange(te.size) == 0, ls, np.maximum(0.0, ls - prev))
    cycles[te] = base + np.where(te_mm & ~same, exposed, 0.0)
    return cycles


def drain_ns(engine, profile) -> np.ndarray:
    """Per instruction, how long after the end of the instruction on its own engine whose output it reads it may
    issue (the engine's pipeline drains first): Vector/Scalar/GpSimd ``*_dependent_cycles`` start to start for a
    tiny dependent pair, i.e. that minus MIN_II after the producer's end, at the engine's clock; 0 elsewhere."""
    cycles = np.array([0.0, profile.vector_dependent_cycles, profile.scalar_dependent_cycles,
                       profile.gpsimd_dependent_cycles, 0.0]) - profile.min_ii
    ghz = np.array([1.0, profile.vector_ghz, profile.scalar_ghz, profile.gpsimd_ghz, 1.0])
    return np.maximum(cycles, 0.0)[engine] / ghz[engine]


def act_table_loads(engine, act_func, profile) -> np.ndarray:
    """Extra ns per instruction: an activation whose function differs from the last table-driven function ScalarE
    ran loads that function's table first (``act_table_load_ns``; the program's first one too). ``identity``
    needs no table and keeps the loaded one."""
    extra = np.zeros(engine.size, np.float64)
    idx = np.flatnonzero((engine == SCALAR) & (act_func >= 0) & (act_func != _IDENTITY))
    if idx.size:
        f = act_func[idx]
        switch = np.ones(idx.size, bool)
        switch[1:] = f[1:] != f[:-1]
        extra[idx[switch]] = profile.act_table_load_ns
    return extra


def durations_ns(cycles, engine, extra_ns, profile) -> np.ndarray:
    """Compute instructions' durations at their engine's clock plus fixed extras (DMA instructions: 0, timed by
    the event loop)."""
    ghz = np.array([profile.clock_ghz(e) for e in ("tensor", "vector", "scalar", "gpsimd")] + [1.0])
    return np.where(engine == SYNC, 0.0, cycles / ghz[engine] + extra_ns)
