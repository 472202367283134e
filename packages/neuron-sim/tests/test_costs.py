"""The cost model (neuron_sim.costs): every formula against an independent statement of it written here from the
package README's tables and the profile's fields. Per-instruction cycles (the three scan / batch-norm
instructions included), the stride penalty and perf modes, LoadStationary reuse and exposure, the dependent-issue
floor of each engine, activation-table loads, durations at the engine clocks, what each DMA moves (bytes, on-chip
side and first partition, runs per partition, bandwidth caps, transpose fractions) and the per-instruction DMA
estimates the scheduler uses. How DMAs and instructions are then timed together is test_events.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN1, TRN2, TRN3, Act, Alu, DType, Engine, Program, Space, TensorArg, isa, validate
from neuron_sim import costs
from neuron_sim.timing import prepare_timing, run_timing

PROFILES = [TRN1, TRN2, TRN3]
CASES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
profiles = st.sampled_from(PROFILES)
by_profile = pytest.mark.parametrize("p", PROFILES, ids=lambda p: p.name)


# ---- an independent statement of the cost formulas ----------------------------------------------
def inner_dim(ap: AP) -> tuple[int, int]:
    dims = [(s, st) for s, st in ap.free if s > 1]
    return dims[-1] if dims else (1, 1)


def unit_stride(ap: AP) -> bool:
    return inner_dim(ap)[1] == 1


def is16(ap: AP) -> bool:
    return ap.dtype in (DType.bfloat16, DType.float16)


def penalty(ins, p) -> int:
    def strided(ap):
        size, stride = inner_dim(ap)
        return ap.on_chip and size > 1 and abs(stride) * ap.dtype.itemsize >= p.stride_penalty_bytes

    return 2 if any(strided(ap) for ap in (*ins.reads(), *ins.writes())) else 1


def split(x: AP, y: AP) -> bool:
    return {x.space, y.space} == {Space.SBUF, Space.PSUM}


def expected_cycles(ins, p) -> float:
    """Cycles of one instruction alone (a first matmul pays its LoadStationary in full)."""
    lo = p.min_ii
    if isinstance(ins, isa.Matmul):
        m, n = ins.stationary.free_size, ins.moving.free_size
        f = p.matmul_fp32_factor if ins.stationary.dtype is DType.float32 else 1
        return max(min(p.mm_init_latency, m), n) * f + math.ceil(m / p.fast_load_stationary_factor) * f
    if isinstance(ins, isa.Transpose):
        if ins.engine is Engine.TENSOR:
            return max(ins.src.partitions, min(p.mm_init_latency, ins.src.free_size))
        return max(lo, ins.dst.free_size * penalty(ins, p))
    n = ins.dst.free_size * penalty(ins, p)
    if isinstance(ins, isa.Activation):
        return max(lo, n) + (p.act_read_accumulator_cycles if ins.reduce_dst is not None else 0)
    if isinstance(ins, isa.TensorTensor):
        operands = (ins.dst, ins.a, ins.b)
        fast = split(ins.a, ins.b) or (
            all(is16(x) for x in operands) and ins.a.space is ins.b.space is Space.SBUF
            and ins.op in (Alu.add, Alu.subtract, Alu.multiply) and all(unit_stride(x) for x in operands))
        return max(lo, n if fast else 2 * n)
    if isinstance(ins, isa.ScalarTensorTensor):
        fast = (ins.src.dtype is ins.operand1.dtype is DType.bfloat16 and ins.op0 is Alu.subtract
                and ins.op1 is Alu.multiply and ins.dst.free_size % 2 == 0)
        return max(lo, n if fast else 2 * n)
    if isinstance(ins, isa.TensorTensorScan):
        return max(lo, 2 * ins.data0.free_size * penalty(ins, p))
    if isinstance(ins, isa.BnStats):
        return max(lo, ins.src.free_size * penalty(ins, p))
    if isinstance(ins, isa.BnAggr):
        return max(lo, 13 * (ins.src.free_size / 3) * penalty(ins, p))
    if isinstance(ins, (isa.TensorScalar, isa.TensorCopy)):
        both16 = is16(ins.dst) and is16(ins.src)
        f = 1
        if ins.engine is Engine.VECTOR and both16:
            full = (ins.dst.space is ins.src.space is Space.SBUF and unit_stride(ins.dst) and unit_stride(ins.src))
            f = p.vector_perf_copy_factor if full else p.vector_perf_copy_partial_factor
        elif ins.engine is Engine.SCALAR and both16:
            f = p.scalar_perf_factor
        return max(lo, n / f)
    if isinstance(ins, isa.TensorReduce):
        nsrc = ins.src.free_size * penalty(ins, p)
        half = ins.src.dtype is ins.dst.dtype is DType.bfloat16 and ins.op in (Alu.add, Alu.max)
        return max(lo, nsrc / 2 if half else nsrc)
    if isinstance(ins, isa.Memset):
        return max(lo, n / 2 if ins.value == 0 and is16(ins.dst) else n)
    if isinstance(ins, (isa.Iota, isa.AffineSelect)):
        return p.gpsimd_start + n
    if isinstance(ins, isa.Select):
        return max(lo, n if split(ins.predicate, ins.on_true) else 2 * n)
    if isinstance(ins, (isa.PartitionReduce, isa.PartitionBroadcast)):
        parts = ins.src.partitions if isinstance(ins, isa.PartitionReduce) else ins.dst.partitions
        return p.gpsimd_start + n * max(1, math.ceil(math.log2(parts)))
    raise AssertionError(f"no formula for {ins.opcode}")


def hbm_bw(p) -> float:
    return min(p.dma_engine_bytes_per_ns, p.hbm_gbps / p.cores_per_chip / p.dma_engines)


def table_load_ns(ins, p) -> float:
    """An activation alone loads its function's table first, unless the function is identity."""
    return p.act_table_load_ns if isinstance(ins, isa.Activation) and ins.func is not Act.identity else 0.0


def time_one(ins, p, args=()):
    prog = Program("one", args, [ins])
    validate(prog, p)
    plan = prepare_timing(prog, p)
    return plan, run_timing(plan, want_events=True)


def check_alone(ins, p):
    """One instruction alone: its cycles, its duration at its engine's clock (plus an activation's table load),
    its engine's busy time, and the program's device time: launch start-up, the instruction, launch tear-down."""
    plan, res = time_one(ins, p)
    engine = ins.engine.value
    want = expected_cycles(ins, p) / p.clock_ghz(engine) + table_load_ns(ins, p)
    assert plan.cycles[0] == pytest.approx(expected_cycles(ins, p), rel=1e-12), str(ins)
    assert plan.dur_ns[0] == pytest.approx(want, rel=1e-12)
    assert plan.producer[0] == -1 and plan.drain_ns[0] == 0
    assert res.start[0] == pytest.approx(p.launch_pre_ns, rel=1e-12)
    assert res.end[0] - res.start[0] == pytest.approx(want, rel=1e-12)
    assert res.end_ns == pytest.approx(p.launch_pre_ns + want + p.launch_post_ns, rel=1e-12)
    assert res.engine_busy_ns[engine] == pytest.approx(want, rel=1e-12)
    assert res.engine_instructions[engine] == 1


# ---- operand strategies ---------------------------------------------------------------------------
SIZES = [1, 2, 7, 33, 64, 100, 128, 512, 1000]
FLOATS = ["float32", "bfloat16", "float16"]
ENGINE_DTYPES = FLOATS + ["int32", "int16", "int8", "float8_e4m3"]
PSUM_DTYPES = ["float32", "bfloat16"]


@st.composite
def free_pattern(draw, n: int):
    """A free pattern of n elements: contiguous, strided, 2-D with padding, or with a trailing unit dim."""
    kind = draw(st.sampled_from(["contig", "strided", "2d", "unit_tail"]))
    if kind == "strided" and n > 1:
        return ((n, draw(st.sampled_from([2, 4, 8]))),)
    if kind == "2d" and n % 2 == 0:
        return ((2, n // 2 + draw(st.sampled_from([0, 3]))), (n // 2, 1))
    if kind == "unit_tail":
        return ((n, 1), (1, 1))
    return ((n, 1),)


@st.composite
def tile(draw, space: Space, dtype: str, partitions: int, n: int, slot: int = 0):
    free = draw(free_pattern(n))
    ap = AP(space, DType.of(dtype), partitions, free)
    size = DType.of(dtype).itemsize
    extent = (ap.free_extent()[1]) * size
    if space is Space.PSUM:  # slots are PSUM banks apart where possible
        offset = min(slot * 2048, 16384 - extent)
    else:
        offset = slot * 40000
    return AP(space, DType.of(dtype), partitions, free, 0, max(offset, 0))


def psum_ok(n, dtype, free_hint=8):
    return n * free_hint * DType.of(dtype).itemsize <= 16384


@st.composite
def on_chip(draw, engine: Engine, partitions: int, n: int, slot: int, dtypes=ENGINE_DTYPES):
    psum = engine is not Engine.GPSIMD and psum_ok(n, "float32") and draw(st.booleans())
    if psum:
        return draw(tile(Space.PSUM, draw(st.sampled_from(PSUM_DTYPES)), partitions, n, slot))
    return draw(tile(Space.SBUF, draw(st.sampled_from(dtypes)), partitions, n, slot))


partitions_st = st.sampled_from([1, 32, 64, 128])
sizes_st = st.sampled_from(SIZES)


# ---- every instruction alone --------------------------------------------------------------------------
@CASES
@given(p=profiles, n=st.sampled_from([16, 64, 128, 256, 512]), m=st.sampled_from([1, 32, 64, 100, 128]),
       k=st.sampled_from([1, 64, 128]), dt=st.sampled_from(["bfloat16", "float32", "float16", "float8_e4m3"]))
def test_matmul_alone(p, n, m, k, dt):
    ins = isa.Matmul(AP.psum("float32", m, (n,)), AP.sbuf(dt, k, (m,)), AP.sbuf(dt, k, (n,), offset=4096))
    check_alone(ins, p)


@CASES
@given(p=profiles, parts=st.sampled_from([1, 5, 32, 64, 128]), f=st.sampled_from([1, 16, 63, 64, 100, 128]),
       dt=st.sampled_from(["bfloat16", "float32"]))
def test_tensor_transpose_alone(p, parts, f, dt):
    ins = isa.Transpose(AP.psum(dt, f, (parts,)), AP.sbuf(dt, parts, (f,)), engine=Engine.TENSOR)
    check_alone(ins, p)


@CASES
@given(p=profiles, parts=st.sampled_from([1, 8, 32]), f=st.sampled_from([1, 8, 32]), data=st.data())
def test_vector_transpose_alone(p, parts, f, data):
    dt = data.draw(st.sampled_from(FLOATS))
    src = data.draw(tile(Space.SBUF, dt, parts, f, 0))
    dst = data.draw(tile(Space.SBUF, dt, f, parts, 1))
    check_alone(isa.Transpose(dst, src, engine=Engine.VECTOR), p)


@CASES
@given(p=profiles, parts=partitions_st, n=sizes_st, reduce=st.booleans(),
       func=st.sampled_from([Act.exp, Act.identity, Act.gelu, Act.relu, Act.rsqrt]), data=st.data())
def test_activation_alone(p, parts, n, reduce, func, data):
    src = data.draw(on_chip(Engine.SCALAR, parts, n, 0, FLOATS))
    dst = data.draw(on_chip(Engine.SCALAR, parts, n, 1, FLOATS))
    red = AP.sbuf("float32", parts, (1,), offset=150000) if reduce else None
    bias = AP.sbuf("float32", parts, (1,), offset=160000) if data.draw(st.booleans()) else None
    check_alone(isa.Activation(dst, src, func, scale=0.5, bias=bias, reduce_dst=red), p)


@CASES
@given(p=profiles, parts=partitions_st, n=sizes_st, op=st.sampled_from([Alu.add, Alu.multiply, Alu.max, Alu.divide]),
       engine=st.sampled_from([Engine.VECTOR, Engine.GPSIMD]), data=st.data())
def test_tensor_tensor_alone(p, parts, n, op, engine, data):
    a = data.draw(on_chip(engine, parts, n, 0, FLOATS))
    b = data.draw(on_chip(engine, parts, n, 1, FLOATS))
    dst = data.draw(on_chip(engine, parts, n, 2, FLOATS))
    check_alone(isa.TensorTensor(dst, a, b, op, engine=engine), p)


@CASES
@given(p=profiles, parts=partitions_st, n=sizes_st,
       engine=st.sampled_from([Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD]), copy=st.booleans(), data=st.data())
def test_tensor_scalar_and_copy_alone(p, parts, n, engine, copy, data):
    allowed = p.scalar_tensor_copy if copy else p.scalar_tensor_scalar
    assume(engine is not Engine.SCALAR or allowed)  # ScalarE runs these natively only on newer cores
    src = data.draw(on_chip(engine, parts, n, 0))
    dst = data.draw(on_chip(engine, parts, n, 1))
    if copy:
        ins = isa.TensorCopy(dst, src, engine=engine)
    else:
        operand = AP.sbuf("float32", parts, (1,), offset=150000) if data.draw(st.booleans()) else 2.0
        ins = isa.TensorScalar(dst, src, Alu.multiply, operand, op1=Alu.add, operand1=1.0, engine=engine)
    check_alone(ins, p)


@CASES
@given(p=profiles, parts=partitions_st, n=st.sampled_from(SIZES + [3, 511]), data=st.data())
def test_scalar_tensor_tensor_alone(p, parts, n, data):
    fast = data.draw(st.booleans())
    dts = ["bfloat16"] if fast else FLOATS
    src = data.draw(on_chip(Engine.VECTOR, parts, n, 0, dts))
    other = data.draw(on_chip(Engine.VECTOR, parts, n, 1, dts))
    dst = data.draw(on_chip(Engine.VECTOR, parts, n, 2, FLOATS))
    op0, op1 = (Alu.subtract, Alu.multiply) if fast else data.draw(st.sampled_from(
        [(Alu.subtract, Alu.multiply), (Alu.add, Alu.multiply), (Alu.subtract, Alu.add), (Alu.max, Alu.divide)]))
    operand0 = AP.sbuf("float32", parts, (1,), offset=150000) if data.draw(st.booleans()) else 0.5
    check_alone(isa.ScalarTensorTensor(dst, src, op0, operand0, op1, other), p)


def test_scalar_tensor_tensor_cost_cases():
    """N for bf16 data and operand1, subtract then multiply, N even; 2N otherwise; at least MIN_II."""
    p = TRN2
    col = AP.sbuf("float32", 128, (1,), offset=150000)

    def cycles(n, dt="bfloat16", odt="bfloat16", op0=Alu.subtract, op1=Alu.multiply):
        ins = isa.ScalarTensorTensor(AP.sbuf("float32", 128, (n,), offset=100000), AP.sbuf(dt, 128, (n,)), op0, col,
                                     op1, AP.sbuf(odt, 128, (n,), offset=40000))
        return time_one(ins, p)[0].cycles[0]

    assert cycles(512) == 512
    assert cycles(511) == 2 * 511  # N odd
    assert cycles(512, dt="float32") == 1024 and cycles(512, odt="float16") == 1024
    assert cycles(512, op0=Alu.add) == 1024 and cycles(512, op1=Alu.add) == 1024
    assert cycles(16) == p.min_ii and cycles(40, dt="float32") == 80


@CASES
@given(p=profiles, parts=partitions_st, n=st.sampled_from(SIZES + [3, 129, 2047]), data=st.data())
def test_tensor_tensor_scan_alone(p, parts, n, data):
    d0 = data.draw(on_chip(Engine.VECTOR, parts, n, 0, FLOATS))
    d1 = data.draw(on_chip(Engine.VECTOR, parts, n, 1, FLOATS))
    assume(not (d0.space is d1.space is Space.PSUM))
    dst = data.draw(on_chip(Engine.VECTOR, parts, n, 2, FLOATS))
    initial = AP.sbuf("float32", parts, (1,), offset=150000) if data.draw(st.booleans()) else 0.0
    op0, op1 = data.draw(st.sampled_from([(Alu.multiply, Alu.add), (Alu.add, Alu.add), (Alu.max, Alu.subtract)]))
    check_alone(isa.TensorTensorScan(dst, d0, d1, initial, op0, op1, reverse1=data.draw(st.booleans())), p)


@CASES
@given(p=profiles, parts=partitions_st, n=st.sampled_from([1, 2, 7, 33, 64, 100, 128, 511, 512]), data=st.data())
def test_bn_stats_alone(p, parts, n, data):
    src = data.draw(on_chip(Engine.VECTOR, parts, n, 0, FLOATS))
    dst = data.draw(on_chip(Engine.VECTOR, parts, 6, 1, FLOATS))
    check_alone(isa.BnStats(dst, src), p)


@CASES
@given(p=profiles, parts=partitions_st, k=st.sampled_from([1, 2, 4, 5, 16, 33, 100, 1000]), data=st.data())
def test_bn_aggr_alone(p, parts, k, data):
    src = data.draw(on_chip(Engine.VECTOR, parts, 3 * k, 0, FLOATS))
    dst = data.draw(on_chip(Engine.VECTOR, parts, 2, 1, FLOATS))
    check_alone(isa.BnAggr(dst, src), p)


def test_scan_and_batch_norm_cost_cases():
    """The documented formulas themselves: scan 2N, bn_stats N, bn_aggr 13 per triple; all at least MIN_II,
    the N term doubled by the stride penalty."""
    p = TRN2

    def cycles(ins):
        return time_one(ins, p)[0].cycles[0]

    def scan(n, d0=None):
        d0 = d0 or AP.sbuf("bfloat16", 128, (n,))
        return cycles(isa.TensorTensorScan(AP.sbuf("float32", 128, (n,), offset=100000), d0,
                                           AP.sbuf("float32", 128, (n,), offset=40000), 0.0, Alu.multiply, Alu.add))

    assert scan(512) == 1024 and scan(33) == 66 and scan(32) == p.min_ii == 64 and scan(1) == 64
    assert scan(512, AP(Space.SBUF, DType.float32, 128, ((512, 4),))) == 2048  # 16-byte stride: penalty
    assert scan(512, AP.psum("float32", 128, (512,))) == 1024  # no PSUM/SBUF split fast mode documented

    def stats(n, dt="float32"):
        return cycles(isa.BnStats(AP.sbuf("float32", 128, (6,), offset=100000), AP.sbuf(dt, 128, (n,))))

    assert stats(512) == 512 and stats(100, "bfloat16") == 100 and stats(63) == 64 and stats(1) == 64

    def aggr(n):
        return cycles(isa.BnAggr(AP.sbuf("float32", 128, (2,), offset=100000), AP.sbuf("float32", 128, (n,))))

    assert aggr(6) == 64 and aggr(12) == 64 and aggr(15) == 65 and aggr(384) == 13 * 128 and aggr(3000) == 13000


def test_perf_modes_by_profile():
    """The documented factors themselves: 4x / 2x VectorE copies on trn2+, ScalarE 2x on trn3 only."""
    src, dst = AP.sbuf("bfloat16", 128, (1024,)), AP.sbuf("bfloat16", 128, (1024,), offset=8192)
    for p, vec, sca in ((TRN1, 1024, 1024), (TRN2, 256, 1024), (TRN3, 256, 512)):
        assert time_one(isa.TensorCopy(dst, src), p)[0].cycles[0] == vec
        if p.scalar_tensor_copy:
            assert time_one(isa.TensorCopy(dst, src, engine=Engine.SCALAR), p)[0].cycles[0] == sca
        psum = AP.psum("bfloat16", 128, (1024,))
        assert time_one(isa.TensorCopy(dst, psum), p)[0].cycles[0] == 1024 / p.vector_perf_copy_partial_factor
        f32 = AP.sbuf("float32", 128, (1024,), offset=16384)
        assert time_one(isa.TensorCopy(f32, src), p)[0].cycles[0] == 1024  # not all 16-bit: no perf mode


def test_stride_penalty_and_fp32_matmul():
    p = TRN2
    strided = AP(Space.SBUF, DType.float32, 128, ((512, 4),))  # 16-byte stride: penalty
    narrow = AP(Space.SBUF, DType.bfloat16, 128, ((512, 4),), offset=16384)  # 8-byte stride: none
    dst = AP.sbuf("float32", 128, (512,), offset=32768)
    assert time_one(isa.Activation(dst, strided, Act.relu), p)[0].cycles[0] == 1024
    assert time_one(isa.Activation(dst, narrow, Act.relu), p)[0].cycles[0] == 512
    mm32 = isa.Matmul(AP.psum("float32", 128, (512,)), AP.sbuf("float32", 128, (128,)),
                      AP.sbuf("float32", 128, (512,), offset=4096))
    assert time_one(mm32, p)[0].cycles[0] == (512 + 32) * p.matmul_fp32_factor


@CASES
@given(p=profiles, parts=partitions_st, op=st.sampled_from([Alu.add, Alu.max, Alu.min]),
       shape=st.sampled_from([(64,), (4, 128), (512,), (8, 3)]), data=st.data())
def test_tensor_reduce_alone(p, parts, op, shape, data):
    sdt = data.draw(st.sampled_from(["bfloat16", "float32"]))
    ddt = data.draw(st.sampled_from(["bfloat16", "float32"]))
    src = AP.sbuf(sdt, parts, shape)
    axes = (len(shape) - 1,)
    kept = math.prod(shape[:-1])
    dst = AP.sbuf(ddt, parts, (kept,), offset=100000)
    engine = data.draw(st.sampled_from([Engine.VECTOR, Engine.GPSIMD]))
    check_alone(isa.TensorReduce(dst, src, op, axes, engine=engine), p)


@CASES
@given(p=profiles, parts=partitions_st, n=sizes_st, value=st.sampled_from([0.0, 1.5]),
       engine=st.sampled_from([Engine.VECTOR, Engine.GPSIMD]), data=st.data())
def test_memset_alone(p, parts, n, value, engine, data):
    check_alone(isa.Memset(data.draw(on_chip(engine, parts, n, 0)), value, engine=engine), p)


@CASES
@given(p=profiles, parts=partitions_st, n=sizes_st, data=st.data())
def test_iota_and_affine_select_alone(p, parts, n, data):
    dst = data.draw(tile(Space.SBUF, data.draw(st.sampled_from(["int32", "float32"])), parts, n, 0))
    steps = tuple(1 for _ in dst.free)
    check_alone(isa.Iota(dst, steps, offset=3, channel_multiplier=1), p)
    src = data.draw(tile(Space.SBUF, "float32", parts, n, 1))
    check_alone(isa.AffineSelect(dst, src, steps, Alu.greater_equal, -1e9), p)


@CASES
@given(p=profiles, parts=partitions_st, n=sizes_st, data=st.data())
def test_select_alone(p, parts, n, data):
    pred = data.draw(on_chip(Engine.VECTOR, parts, n, 0, FLOATS))
    on_true = data.draw(on_chip(Engine.VECTOR, parts, n, 1, FLOATS))
    dst = data.draw(tile(Space.SBUF, "float32", parts, n, 2))
    on_false = AP.sbuf("float32", parts, (n,), offset=150000) if data.draw(st.booleans()) else 0.0
    check_alone(isa.Select(dst, pred, on_true, on_false), p)


@CASES
@given(p=profiles, parts=st.sampled_from([1, 2, 3, 32, 100, 128]), n=sizes_st)
def test_partition_reduce_and_broadcast_alone(p, parts, n):
    multi, single = AP.sbuf("float32", parts, (n,)), AP.sbuf("float32", 1, (n,), offset=100000)
    check_alone(isa.PartitionReduce(single, multi, Alu.add), p)
    check_alone(isa.PartitionBroadcast(multi, single), p)




# ---- LoadStationary ---------------------------------------------------------------------------------
def test_load_stationary_reuse_and_exposure():
    p = TRN2.replace(fast_load_stationary_factor=1)  # LS = M cycles: longer than a short matmul
    st1, st2 = AP.sbuf("bfloat16", 128, (128,)), AP.sbuf("bfloat16", 128, (128,), offset=256)
    mv = AP.sbuf("bfloat16", 128, (64,), offset=1024)
    acc = AP.psum("float32", 128, (64,))
    prog = Program("ls", [], [isa.Matmul(acc, st1, mv), isa.Matmul(acc, st1, mv, accumulate=True),
                              isa.Matmul(acc, st2, mv, accumulate=True),
                              isa.Transpose(AP.psum("bfloat16", 1, (1,), offset=2048), AP.sbuf("bfloat16", 1, (1,))),
                              isa.Matmul(acc, st2, mv)])
    plan = prepare_timing(prog, p)
    ii = 64  # max(min(64, 128), 64)
    assert list(plan.cycles) == [ii + 128, ii, ii + (128 - ii), 1, ii + (128 - 1)]
    # Default profile: LS = 32 cycles, hidden behind any matmul of II >= 32.
    plan = prepare_timing(prog, TRN2)
    assert list(plan.cycles) == [ii + 32, ii, ii, 1, ii + 31]



def test_load_stationary_counts_tensor_engine_instructions_only():
    """Only the previous TensorE instruction matters: other engines' instructions in between change nothing; a
    first TensorE instruction that is a transpose hides part of the next matmul's LoadStationary."""
    p = TRN2.replace(fast_load_stationary_factor=1)  # LS = M = 128 cycles
    st1 = AP.sbuf("bfloat16", 128, (128,))
    mv = AP.sbuf("bfloat16", 128, (64,), offset=1024)
    acc = AP.psum("float32", 128, (64,))
    other = AP.sbuf("float32", 128, (8,), offset=8192)
    prog = Program("ls", [], [isa.Matmul(acc, st1, mv), isa.Memset(other, 1.0), isa.Matmul(acc, st1, mv)])
    ii = 64  # max(min(mm_init_latency, M), N_moving)
    assert list(prepare_timing(prog, p).cycles) == [ii + 128, p.min_ii, ii]
    tp = isa.Transpose(AP.psum("bfloat16", 8, (16,), offset=2048), AP.sbuf("bfloat16", 16, (8,), offset=4096))
    tp_cycles = max(16, min(p.mm_init_latency, 8))  # max(P, min(MM_INIT_LATENCY, F))
    plan = prepare_timing(Program("ls", [], [tp, isa.Matmul(acc, st1, mv)]), p)
    assert list(plan.cycles) == [tp_cycles, ii + (128 - tp_cycles)]
    # fp32: II and LS both x matmul_fp32_factor; a new stationary after a short fp32 matmul shows LS - II
    f = p.matmul_fp32_factor
    s32a, s32b = AP.sbuf("float32", 128, (128,)), AP.sbuf("float32", 128, (128,), offset=512)
    m32 = AP.sbuf("float32", 128, (64,), offset=2048)
    plan = prepare_timing(Program("ls32", [], [isa.Matmul(acc, s32a, m32), isa.Matmul(acc, s32b, m32)]), p)
    assert list(plan.cycles) == [(ii + 128) * f, ii * f + max(0, 128 * f - ii * f)]


# ---- dependent issue ----------------------------------------------------------------------------------
def _scalar_copy(dst, src, p):
    """A ScalarE copy: tensor_copy where the core has it, else activation identity (same cost, no table)."""
    if p.scalar_tensor_copy:
        return isa.TensorCopy(dst, src, engine=Engine.SCALAR)
    return isa.Activation(dst, src, Act.identity)


def _drain(p, engine):
    """ns after its producer's end that a dependent instruction of ``engine`` may issue (README: start to start
    ``*_dependent_cycles`` for a tiny pair, so that minus MIN_II after the producer's end)."""
    cycles = {"vector": p.vector_dependent_cycles, "scalar": p.scalar_dependent_cycles,
              "gpsimd": p.gpsimd_dependent_cycles}.get(engine, p.min_ii)
    return max(cycles - p.min_ii, 0) / p.clock_ghz(engine)


@by_profile
def test_dependent_issue_drain(p):
    """A Vector/Scalar/GpSimd instruction reading what an earlier instruction of its own engine wrote issues no
    earlier than that one's end plus the engine's drain; another engine's producer, or none, gives no drain."""
    a, b, c, d = (AP.sbuf("float32", 128, (8,), offset=o) for o in (0, 4096, 8192, 16384))
    other = AP.sbuf("float32", 128, (8,), offset=12288)
    prog = Program("dep", [], [
        isa.TensorCopy(b, a),  # 0 vector
        isa.TensorCopy(c, b),  # 1 vector: reads 0 (its engine): drains
        isa.TensorCopy(other, a),  # 2 vector: independent
        _scalar_copy(a, other, p),  # 3 scalar: reads VectorE's 2: no drain (cross-engine: a semaphore)
        _scalar_copy(d, a, p),  # 4 scalar: reads 3 (its engine): drains
        isa.TensorCopy(b, c),  # 5 vector: reads 1 (its engine, three instructions back): drains
    ])
    plan = prepare_timing(prog, p)
    res = run_timing(plan, want_events=True)
    assert list(plan.producer) == [-1, 0, -1, -1, 3, 1]
    n8 = max(p.min_ii, 8)  # N = 8 elements: MIN_II, whatever the dependency (durations are not floored)
    ghz = [p.vector_ghz, p.vector_ghz, p.vector_ghz, p.scalar_ghz, p.scalar_ghz, p.vector_ghz]
    assert list(plan.cycles) == pytest.approx([n8] * 6, rel=1e-12)
    dur = [n8 / g for g in ghz]
    assert list(res.end - res.start) == pytest.approx(dur, rel=1e-12)
    vdrain, sdrain = _drain(p, "vector"), _drain(p, "scalar")
    t0 = p.launch_pre_ns
    assert res.start[1] == pytest.approx(t0 + dur[0] + vdrain, rel=1e-12)
    assert res.start[2] == pytest.approx(res.end[1], rel=1e-12)  # in order behind 1
    assert res.start[4] == pytest.approx(res.end[3] + sdrain, rel=1e-12)
    assert res.start[5] == pytest.approx(max(res.end[2], res.end[1] + vdrain), rel=1e-12)


@by_profile
def test_an_independent_instruction_between_dependent_ones_fills_the_drain(p):
    """The drain is a wait after the producer, not a longer instruction: independent work issued in between uses
    it, so inserting it never shortens the program (README: dependent issue)."""
    a, b, c, x, y = (AP.sbuf("float32", 128, (8,), offset=o) for o in (0, 4096, 8192, 12288, 16384))
    pair = [isa.TensorCopy(b, a), isa.TensorCopy(c, b)]
    spaced = [pair[0], isa.TensorCopy(y, x), pair[1]]
    t_pair = run_timing(prepare_timing(Program("p", [], pair), p)).end_ns
    t_spaced = run_timing(prepare_timing(Program("s", [], spaced), p)).end_ns
    one = max(p.min_ii, 8) / p.vector_ghz
    assert t_pair == pytest.approx(p.launch_ns + 2 * one + _drain(p, "vector"), rel=1e-12)
    assert t_spaced == pytest.approx(p.launch_ns + 2 * one + max(one, _drain(p, "vector")), rel=1e-12)
    assert t_spaced >= t_pair


@by_profile
def test_dependent_issue_drain_is_per_engine(p):
    """Each engine's own drain (VectorE, ScalarE, GpSimd); TensorE and DMA have none; a long instruction keeps its
    cycles (the drain is a wait, not a floor on its duration)."""
    t = [AP.sbuf("float32", 128, (8,), offset=1024 * k) for k in range(9)]
    big = [AP.sbuf("float32", 128, (1024,), offset=16384 + 4096 * k) for k in range(3)]
    acc = AP.psum("float32", 128, (64,))
    st1, mv = AP.sbuf("bfloat16", 128, (128,), offset=40000), AP.sbuf("bfloat16", 128, (64,), offset=41000)
    prog = Program("dep", [TensorArg("y", (128, 8), "float32", "out")], [
        isa.TensorCopy(t[1], t[0]),  # 0 vector
        isa.TensorCopy(t[4], t[3], engine=Engine.GPSIMD),  # 1 gpsimd
        isa.Activation(t[7], t[6], Act.identity),  # 2 scalar
        isa.TensorCopy(t[2], t[1]),  # 3 vector, reads 0
        isa.Activation(t[8], t[7], Act.identity),  # 4 scalar, reads 2
        isa.TensorCopy(t[5], t[4], engine=Engine.GPSIMD),  # 5 gpsimd, reads 1
        isa.Matmul(acc, st1, mv),  # 6 tensor
        isa.Matmul(acc, st1, mv, accumulate=True),  # 7 tensor, reads 6's output: no drain
        isa.TensorCopy(big[1], big[0]),  # 8 vector
        isa.TensorCopy(big[2], big[1]),  # 9 vector, reads 8: drains after its 1024 cycles
        isa.DmaCopy(AP.hbm(0, "float32", (128, 8)), t[8]),  # 10 dma, reads 4's output: no drain
    ])
    plan = prepare_timing(prog, p)
    assert list(plan.producer) == [-1, -1, -1, 0, 2, 1, -1, 6, -1, 8, -1]  # 7: TensorE, which drains nothing
    for i, engine in ((3, "vector"), (4, "scalar"), (5, "gpsimd"), (9, "vector")):
        assert plan.drain_ns[i] == pytest.approx(_drain(p, engine), rel=1e-12)
    assert plan.drain_ns[7] == plan.drain_ns[10] == 0  # TensorE and DMA: none
    n8 = max(p.min_ii, 8)
    assert list(plan.cycles[[3, 4, 5]]) == [n8] * 3
    assert plan.cycles[9] == 1024
    assert plan.cycles[10] == 0 and plan.dur_ns[10] == 0


def test_drain_function():
    """costs.drain_ns on columns: the engine's dependent cycles minus MIN_II at its clock, 0 off Vector/Scalar/GpSimd
    and never negative."""
    p = TRN2.replace(vector_dependent_cycles=100, scalar_dependent_cycles=200, gpsimd_dependent_cycles=30, min_ii=64)
    engine = np.array([0, 1, 2, 3, 4], np.int8)
    out = costs.drain_ns(engine, p)
    assert list(out) == pytest.approx([0.0, 36 / p.vector_ghz, 136 / p.scalar_ghz, 0.0, 0.0])


# ---- activation tables --------------------------------------------------------------------------------
@by_profile
def test_activation_table_loads(p):
    """The first table-driven activation and every switch of function load a table (act_table_load_ns);
    identity needs none and keeps the loaded table; other engines' work in between changes nothing."""
    funcs = [Act.identity, Act.exp, Act.exp, Act.gelu, Act.identity, Act.gelu, Act.exp, None, Act.exp, Act.relu]
    loads = [0, 1, 0, 1, 0, 0, 1, 0, 0, 1]
    ins = []
    for k, f in enumerate(funcs):
        dst, src = AP.sbuf("float32", 128, (64,), offset=512 * k), AP.sbuf("float32", 128, (64,), offset=8192 + 512 * k)
        ins.append(isa.Memset(dst, 0.0) if f is None else isa.Activation(dst, src, f))
    plan = prepare_timing(Program("tables", [], ins), p)
    res = run_timing(plan, want_events=True)
    cycles = max(p.min_ii, 64)
    for k, f in enumerate(funcs):
        if f is None:
            continue
        assert plan.cycles[k] == cycles  # the load is time, not cycles
        assert plan.dur_ns[k] == pytest.approx(cycles / p.scalar_ghz + loads[k] * p.act_table_load_ns, rel=1e-12)
        assert res.end[k] - res.start[k] == pytest.approx(plan.dur_ns[k], rel=1e-12)
    scalar = [k for k, f in enumerate(funcs) if f is not None]
    busy = len(scalar) * cycles / p.scalar_ghz + sum(loads) * p.act_table_load_ns
    assert res.engine_busy_ns["scalar"] == pytest.approx(busy, rel=1e-12)
    only_identity = prepare_timing(Program("id", [], ins[:1] + ins[4:5]), p)
    assert list(only_identity.dur_ns) == pytest.approx([cycles / p.scalar_ghz] * 2, rel=1e-12)


# ---- durations ----------------------------------------------------------------------------------------
def test_durations_at_engine_clocks():
    p = TRN2
    engine = np.array([0, 1, 2, 3, 4], np.int8)
    cycles = np.array([240.0, 96.0, 120.0, 120.0, 7.0])
    extra = np.array([0.0, 0.0, 5.0, 0.0, 3.0])
    want = [240 / p.tensor_ghz, 96 / p.vector_ghz, 120 / p.scalar_ghz + 5.0, 120 / p.gpsimd_ghz, 0.0]
    assert list(costs.durations_ns(cycles, engine, extra, p)) == pytest.approx(want, rel=1e-12)


# ---- DMA: what each instruction moves, where and how ----------------------------------------------------
def bandwidths(p):
    """(SBUF/PSUM only, HBM on one side, HBM to HBM) bytes/ns per DMA engine, from the README's rule."""
    share = p.hbm_gbps / p.cores_per_chip / p.dma_engines
    return p.dma_engine_bytes_per_ns, min(p.dma_engine_bytes_per_ns, share), min(p.dma_engine_bytes_per_ns, share / 2)


def dma_columns(ins, p, args):
    plan = prepare_timing(Program("dma", args, [ins]), p)
    return (int(plan.dma_bytes[0]), int(plan.dma_p0[0]), int(plan.dma_parts[0]), int(plan.dma_runs[0]),
            float(plan.dma_bw[0]), bool(plan.dma_read[0]))


def _dma_cases(p):
    """(instruction, (bytes, first partition of the on-chip side or -1, partitions or rows, runs per partition,
    bytes/ns per engine, reads HBM)) written from the README's DMA rules."""
    chip, hbm, hbm2 = bandwidths(p)
    idx = AP.sbuf("int32", 16, (1,), offset=150000)
    el = AP(Space.HBM, DType.bfloat16, 128, ((128, 128),), partition_stride=1, tensor=0)  # a column per partition
    gap = AP(Space.HBM, DType.float32, 8, ((4, 32), (16, 1)), partition_stride=128, tensor=0)  # 4 runs of 16
    strided_table = AP(Space.HBM, DType.float32, 1000, ((32, 2),), partition_stride=64, tensor=0)
    return [
        # contiguous load: HBM rows continue each other (1 run), SBUF 1 per partition
        (isa.DmaCopy(AP.sbuf("float32", 128, (512,)), AP.hbm(0, "float32", (128, 512))),
         (128 * 512 * 4, 0, 128, 1, hbm, True)),
        # padded HBM rows (a run each), tile at partition 32
        (isa.DmaCopy(AP.sbuf("float32", 64, (100,), start=32), AP.hbm(0, "float32", (64, 100), row_stride=128)),
         (64 * 100 * 4, 32, 64, 1, hbm, True)),
        # store: the on-chip side is the source; HBM writes are not reads
        (isa.DmaCopy(AP.hbm(1, "bfloat16", (16, 256)), AP.sbuf("bfloat16", 16, (256,), start=8)),
         (16 * 256 * 2, 8, 16, 1, hbm, False)),
        # on chip both sides: the wider side decides the engines (dst here), no HBM cap
        (isa.DmaCopy(AP.sbuf("float32", 32, (8,), start=64), AP.sbuf("float32", 16, (16,), offset=4096)),
         (32 * 8 * 4, 64, 32, 1, chip, False)),
        (isa.DmaCopy(AP.sbuf("float32", 16, (16,)), AP.sbuf("float32", 64, (4,), start=32, offset=4096)),
         (16 * 16 * 4, 32, 64, 1, chip, False)),
        (isa.DmaCopy(AP.sbuf("float32", 8, (4,), start=16), AP.psum("float32", 8, (4,), start=40)),  # a tie: dst
         (8 * 4 * 4, 16, 8, 1, chip, False)),
        # HBM to HBM: no on-chip side (rows over every engine), half the HBM share; one contiguous range on
        # both sides is one piece per engine however the rows cut it
        (isa.DmaCopy(AP.hbm(1, "float32", (32, 128)), AP.hbm(0, "float32", (64, 64), row_stride=128)),
         (64 * 64 * 4, -1, 64, 1, hbm2, True)),
        (isa.DmaCopy(AP.hbm(1, "float32", (32, 128)), AP.hbm(0, "float32", (64, 64))),
         (64 * 64 * 4, -1, p.dma_engines, 1, hbm2, True)),
        # a cast moves the wider itemsize
        (isa.DmaCopy(AP.sbuf("bfloat16", 64, (64,)), AP.hbm(0, "float32", (64, 64))),
         (64 * 64 * 4, 0, 64, 1, hbm, True)),
        # element-granular HBM side: a run per element, 128 per partition
        (isa.DmaCopy(AP.sbuf("bfloat16", 128, (128,)), el), (128 * 128 * 2, 0, 128, 128, hbm, True)),
        # strided SBUF source: a run per element there; contiguous HBM rows: 1
        (isa.DmaCopy(AP.hbm(1, "float32", (8, 16)), AP(Space.SBUF, DType.float32, 8, ((16, 2),))),
         (8 * 16 * 4, 0, 8, 16, hbm, False)),
        # outer HBM dims that continue the inner one are one run per row; a gap makes 4
        (isa.DmaCopy(AP.sbuf("float32", 8, (64,)), AP.hbm(0, "float32", (8, 4, 16), row_stride=128)),
         (8 * 64 * 4, 0, 8, 1, hbm, True)),
        (isa.DmaCopy(AP.sbuf("float32", 8, (64,)), gap), (8 * 64 * 4, 0, 8, 4, hbm, True)),
        # indirect: the tile's bytes, one table row per tile partition (a strided table row: a run per element)
        (isa.DmaGather(AP.sbuf("float32", 16, (32,), start=8), AP.hbm(0, "float32", (1000, 32)), idx),
         (16 * 32 * 4, 8, 16, 1, hbm, True)),
        (isa.DmaGather(AP.sbuf("float32", 16, (32,)), strided_table, idx), (16 * 32 * 4, 0, 16, 32, hbm, True)),
        (isa.DmaScatter(AP.hbm(0, "float32", (1000, 32)), AP.sbuf("float32", 16, (32,)), idx),
         (16 * 32 * 4, 0, 16, 1, hbm, False)),
    ]


@by_profile
def test_dma_figures(p):
    args = [TensorArg("a", (1024, 256), "float32", "inout"), TensorArg("b", (1024, 256), "float32", "inout")]
    for ins, want in _dma_cases(p):
        got = dma_columns(ins, p, args)
        if not p.dma_partition_affinity:  # NC-v2: every transfer spreads over all engines
            want = (want[0], -1, *want[2:])
        assert got[:4] == want[:4] and got[5] == want[5], str(ins)
        assert got[4] == pytest.approx(want[4], rel=1e-12), str(ins)


@pytest.mark.parametrize("p", [TRN2, TRN3], ids=lambda p: p.name)
@pytest.mark.parametrize("rows,cols,dt", [(128, 128, "bfloat16"), (1024, 128, "bfloat16"), (64, 100, "float32"),
                                          (300, 16, "int16"), (5, 1, "int32")])
@pytest.mark.parametrize("pad", [0, 64])
def test_dma_transpose_figures(p, rows, cols, dt, pad):
    """A DMA transpose: a DMA at dma_transpose_hbm_fraction (from HBM) or dma_transpose_sbuf_fraction (SBUF to
    SBUF) of the copy bandwidth; runs counted on each side as stored, as for dma_copy (contiguous HBM rows merge
    into one run; the SBUF side has one per partition)."""
    chip, hbm, _ = bandwidths(p)
    stride = cols + pad
    args = [TensorArg("x", (rows, stride), dt)]
    nbytes = rows * cols * DType.of(dt).itemsize
    ins = isa.DmaTranspose(AP.sbuf(dt, cols, (rows,)), AP.hbm(0, dt, (rows, cols), row_stride=stride), queue=3)
    runs = max(rows if pad else 1, cols)  # src: a run per row unless rows continue each other; dst: per partition
    got = dma_columns(ins, p, args)
    assert got[:4] == (nbytes, 0, cols, -(-runs // cols)) and got[5] is True
    assert got[4] == pytest.approx(hbm * p.dma_transpose_hbm_fraction, rel=1e-12)
    if rows <= 128 and not pad:
        sb = isa.DmaTranspose(AP.sbuf(dt, cols, (rows,), offset=65536), AP.sbuf(dt, rows, (cols,)))
        wide = max(rows, cols)
        got = dma_columns(sb, p, [])
        assert got[:4] == (nbytes, 0, wide, 1) and got[5] is False
        assert got[4] == pytest.approx(chip * p.dma_transpose_sbuf_fraction, rel=1e-12)


def test_dma_transpose_costs_more_than_a_copy_and_needs_the_profile_flag():
    p = TRN2
    args = [TensorArg("x", (512, 128), "bfloat16")]
    copy = isa.DmaCopy(AP.sbuf("bfloat16", 128, (512,)), AP.hbm(0, "bfloat16", (128, 512)))
    tp = isa.DmaTranspose(AP.sbuf("bfloat16", 128, (512,)), AP.hbm(0, "bfloat16", (512, 128)))
    plan_c, plan_t = prepare_timing(Program("c", args, [copy]), p), prepare_timing(Program("t", args, [tp]), p)
    assert plan_t.dma_bw[0] < plan_c.dma_bw[0]
    with pytest.raises(ValueError, match="trn1 has no DMA transpose"):
        prepare_timing(Program("t", args, [tp]), TRN1)
    with pytest.raises(ValueError, match="has no DMA transpose"):  # the flag without its fractions
        prepare_timing(Program("t", args, [tp]), TRN2.replace(dma_transpose_sbuf_fraction=0.0))


@by_profile
def test_profile_dma_helpers_agree_with_the_model(p):
    """The Profile helpers the kernels estimate with give the figures the simulator uses."""
    chip, hbm, _ = bandwidths(p)
    assert p.dma_engine_hbm_bytes_per_ns == pytest.approx(hbm, rel=1e-12)
    assert p.dma_issue_time_ns(128) == p.dma_issue_ns + 128 * p.dma_issue_desc_ns
    assert p.dma_issuers == (p.dma_dge_units if p.dma_dge_units else p.dma_queues)
    assert p.launch_ns == p.launch_pre_ns + p.launch_post_ns
    for run, on_hbm in ((2048, True), (4, True), (512, False)):
        bw = hbm if on_hbm else chip
        want = 128 * max(p.dma_run_min_ns, run / bw) / p.dma_engines  # 128 runs spread over every engine
        assert p.dma_transfer_ns(128 * run, run, hbm=on_hbm) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p", [p.replace(dma_partition_affinity=True) for p in PROFILES], ids=lambda p: p.name)
def test_dma_estimates(p):
    """Each instruction alone, for the scheduler: a DMA holds its queue while its descriptors are generated
    (occupancy) and completes after max(fixed latency, issue) and its busiest engine's runs (latency); a compute
    instruction holds its engine for its duration and completes then."""
    _, hbm, hbm2 = bandwidths(p)
    args = [TensorArg("a", (128, 2048), "bfloat16"), TensorArg("b", (128, 2048), "float32", "out")]
    el = AP(Space.HBM, DType.bfloat16, 128, ((128, 2048),), partition_stride=1, tensor=0)
    prog = Program("est", args, [
        isa.Memset(AP.sbuf("float32", 128, (512,), offset=100000), 1.0),
        isa.DmaCopy(AP.sbuf("bfloat16", 128, (1024,)), AP.hbm(0, "bfloat16", (128, 1024), row_stride=2048)),
        isa.DmaCopy(AP.sbuf("bfloat16", 4, (4096,), offset=4096), AP.hbm(0, "bfloat16", (4, 4096))),
        isa.DmaCopy(AP.hbm(1, "float32", (64, 64)), AP.hbm(0, "bfloat16", (64, 64), row_stride=2048)),
        isa.DmaCopy(AP.sbuf("bfloat16", 128, (128,), offset=20000), el),
    ])
    plan = prepare_timing(prog, p)
    latency, occupancy = costs.dma_estimates(plan, p)
    f, rmin = p.dma_fixed_ns, p.dma_run_min_ns

    def issue(descriptors):
        return p.dma_issue_ns + p.dma_issue_desc_ns * descriptors

    want = [
        (plan.dur_ns[0], plan.dur_ns[0]),
        # 128 rows of 2048 bytes, 8 per engine
        (max(f, issue(128)) + 8 * max(rmin, 2048 / hbm), issue(128)),
        # 4 partitions of 8192 bytes: one engine
        (max(f, issue(4)) + 4 * max(rmin, 8192 / hbm), issue(4)),
        # HBM to HBM, 64 rows of 256 bytes (4-byte dst elements) over every engine
        (max(f, issue(64)) + 64 / p.dma_engines * max(rmin, 256 / hbm2), issue(64)),
        # a 2-byte run per element: 128 per partition, 8 partitions per engine
        (max(f, issue(128 * 128)) + 8 * 128 * max(rmin, 2 / hbm), issue(128 * 128)),
    ]
    assert list(latency) == pytest.approx([w[0] for w in want], rel=1e-12)
    assert list(occupancy) == pytest.approx([w[1] for w in want], rel=1e-12)
