"""The timing model: every instruction's cost against the documented formula (computed here, independently,
from the profile), DMA costs, overlap and dependencies, a tiled GEMM, and a 1M-instruction program."""

from __future__ import annotations

import math
import time
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN1, TRN2, TRN3, Act, Alu, DType, Engine, Program, Space, TensorArg, isa, validate
from neuron_sim import deps, encode
from neuron_sim.plan import N_COMPUTE
from neuron_sim.timing import prepare_timing, run_timing

PROFILES = [TRN1, TRN2, TRN3]
CASES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
profiles = st.sampled_from(PROFILES)


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


def time_one(ins, p, args=()):
    prog = Program("one", args, [ins])
    validate(prog, p)
    plan = prepare_timing(prog, p)
    return plan, run_timing(plan, want_events=True)


def check_alone(ins, p):
    plan, res = time_one(ins, p)
    engine = ins.engine.value
    want = expected_cycles(ins, p) / p.clock_ghz(engine)
    assert res.end_ns == pytest.approx(want, rel=1e-12), str(ins)
    assert res.engine_busy_ns[engine] == pytest.approx(want, rel=1e-12)
    assert res.engine_instructions[engine] == 1
    assert plan.cycles[0] == pytest.approx(expected_cycles(ins, p), rel=1e-12)


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
@given(p=profiles, parts=partitions_st, n=sizes_st, reduce=st.booleans(), data=st.data())
def test_activation_alone(p, parts, n, reduce, data):
    src = data.draw(on_chip(Engine.SCALAR, parts, n, 0, FLOATS))
    dst = data.draw(on_chip(Engine.SCALAR, parts, n, 1, FLOATS))
    red = AP.sbuf("float32", parts, (1,), offset=150000) if reduce else None
    bias = AP.sbuf("float32", parts, (1,), offset=160000) if data.draw(st.booleans()) else None
    check_alone(isa.Activation(dst, src, Act.exp, scale=0.5, bias=bias, reduce_dst=red), p)


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


def test_dependent_issue_floor():
    p = TRN2
    a, b, c, d = (AP.sbuf("float32", 128, (8,), offset=o) for o in (0, 4096, 8192, 16384))
    other = AP.sbuf("float32", 128, (8,), offset=12288)
    prog = Program("dep", [], [
        isa.TensorCopy(b, a),
        isa.TensorCopy(c, b),  # RAW on the previous VectorE instruction: floored
        isa.TensorCopy(other, a),
        isa.TensorCopy(a, other, engine=Engine.SCALAR),  # RAW on VectorE's instruction: not floored
        isa.TensorCopy(d, a, engine=Engine.SCALAR),  # RAW on the previous ScalarE instruction: floored
        isa.TensorCopy(b, c),  # RAW, but not on the previous VectorE instruction
    ])
    plan = prepare_timing(prog, p)
    res = run_timing(plan, want_events=True)
    dur = res.end - res.start
    assert list(plan.dependent) == [False, True, False, False, True, False]
    ghz = [p.vector_ghz, p.vector_ghz, p.vector_ghz, p.scalar_ghz, p.scalar_ghz, p.vector_ghz]
    cycles = [p.min_ii, p.dependent_issue_cycles, p.min_ii, p.min_ii, p.dependent_issue_cycles, p.min_ii]
    assert list(dur) == pytest.approx([c / g for c, g in zip(cycles, ghz)])


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


def test_field_roles_match_reads_and_writes():
    x = [AP.sbuf("float32", 128, (4,), offset=o) for o in range(0, 4096, 512)]
    idx = AP.sbuf("int32", 128, (1,), offset=8000)
    table = AP.hbm(0, "float32", (1000, 4))
    samples = [
        isa.Matmul(AP.psum("float32", 4, (4,)), x[0], x[1], accumulate=True), isa.Matmul(x[0], x[1], x[2]),
        isa.Activation(x[0], x[1], Act.exp, scale=x[2], bias=x[3], reduce_dst=x[4]),
        isa.Activation(x[0], x[1], Act.exp), isa.TensorScalar(x[0], x[1], Alu.add, x[2], op1=Alu.max, operand1=x[3]),
        isa.TensorScalar(x[0], x[1], Alu.add, 1.0), isa.Select(x[0], x[1], x[2], x[3]),
        isa.Select(x[0], x[1], x[2], 0.0),
        isa.DmaGather(x[0], table, idx), isa.DmaScatter(table, x[0], idx, accumulate=True),
        isa.DmaScatter(table, x[0], idx), isa.TensorTensor(x[0], x[1], x[2], Alu.add),
        isa.ScalarTensorTensor(x[0], x[1], Alu.subtract, x[2], Alu.multiply, x[3]),
        isa.ScalarTensorTensor(x[0], x[1], Alu.subtract, 1.0, Alu.multiply, x[3]),
        isa.DmaTranspose(x[0], table), isa.DmaTranspose(x[0], x[1]),
        isa.TensorTensorScan(x[0], x[1], x[2], x[3], Alu.multiply, Alu.add),
        isa.TensorTensorScan(x[0], x[1], x[2], 0.0, Alu.multiply, Alu.add), isa.BnStats(x[0], x[1]),
        isa.BnAggr(x[0], x[1]),
    ]
    for ins in samples:
        reads, writes = set(), set()
        for name, role in encode._field_roles(type(ins)):
            v = getattr(ins, name)
            if not isinstance(v, AP):
                continue
            if role == "r" or (role == "wr" and getattr(ins, encode._READS_DST_IF[type(ins)])):
                reads.add(name)
            if role in ("w", "wr"):
                writes.add(name)
        assert {id(getattr(ins, n)) for n in reads} == {id(a) for a in ins.reads()}, ins
        assert {id(getattr(ins, n)) for n in writes} == {id(a) for a in ins.writes()}, ins


# ---- DMA ------------------------------------------------------------------------------------------------
def dma_transfer_ns(p, nbytes, bw, runs):
    """Engine time of a transfer: its bytes at the engine bandwidth plus a descriptor cost per contiguous run."""
    return nbytes / bw + runs * p.dma_descriptor_ns


def dma_alone_ns(p, nbytes, engines, bw, runs):
    return p.dma_issue_ns + p.dma_fixed_ns + dma_transfer_ns(p, nbytes, bw, runs) / engines


@pytest.mark.parametrize("p", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("parts,cols,dt", [(128, 512, "bfloat16"), (64, 100, "float32"), (1, 8192, "float32"),
                                           (9, 64, "int8")])
def test_dma_alone(p, parts, cols, dt):
    args = [TensorArg("x", (parts, cols), dt)]
    ins = isa.DmaCopy(AP.sbuf(dt, parts, (cols,)), AP.hbm(0, dt, (parts, cols)))
    plan, res = time_one(ins, p, args)
    nbytes = parts * cols * DType.of(dt).itemsize
    engines = min(p.dma_engines, -(-parts // p.dma_partitions_per_engine))
    assert res.end_ns == pytest.approx(dma_alone_ns(p, nbytes, engines, hbm_bw(p), parts), rel=1e-12)
    assert res.dma_bytes == nbytes
    busy = dma_transfer_ns(p, nbytes, hbm_bw(p), parts) / p.dma_engines
    assert res.engine_busy_ns["dma"] == pytest.approx(busy, rel=1e-12)
    assert res.engine_instructions["dma"] == 1


def test_dma_single_engine_matches_measured_example():
    """32 KiB HBM -> SBUF on one DMA engine: the reference measured ~1,416 ns of transfer on trn2."""
    p = TRN2
    ins = isa.DmaCopy(AP.sbuf("float32", 1, (8192,)), AP.hbm(0, "float32", (1, 8192)))
    _, res = time_one(ins, p, [TensorArg("x", (1, 8192), "float32")])
    transfer = res.end_ns - p.dma_issue_ns - p.dma_fixed_ns
    assert transfer == pytest.approx(dma_transfer_ns(p, 32768, hbm_bw(p), 1))
    assert transfer == pytest.approx(1416, rel=0.05)


def test_dma_short_runs_pay_per_descriptor():
    """An element-granular transposing DMA costs a descriptor per element; a contiguous one per partition row."""
    p = TRN2
    args = [TensorArg("x", (128, 128), "bfloat16")]
    contiguous = isa.DmaCopy(AP.sbuf("bfloat16", 128, (128,)), AP.hbm(0, "bfloat16", (128, 128)))
    transposed = isa.DmaCopy(AP.sbuf("bfloat16", 128, (128,)),
                             AP(Space.HBM, DType.bfloat16, 128, ((128, 128),), partition_stride=1, tensor=0))
    fast, slow = time_one(contiguous, p, args)[1].end_ns, time_one(transposed, p, args)[1].end_ns
    assert fast == pytest.approx(dma_alone_ns(p, 32768, 16, hbm_bw(p), 128))
    assert slow == pytest.approx(dma_alone_ns(p, 32768, 16, hbm_bw(p), 128 * 128))
    assert slow > 5 * (fast - p.dma_issue_ns - p.dma_fixed_ns)


def test_dma_on_chip_hbm_to_hbm_cast_and_indirect():
    p = TRN2
    sb = isa.DmaCopy(AP.sbuf("bfloat16", 128, (256,), offset=8192), AP.sbuf("bfloat16", 128, (256,)))
    assert time_one(sb, p)[1].end_ns == pytest.approx(dma_alone_ns(p, 65536, 16, p.dma_engine_bytes_per_ns, 128))
    args = [TensorArg("a", (64, 64), "float32"), TensorArg("b", (64, 64), "float32", "out")]
    hh = isa.DmaCopy(AP.hbm(1, "float32", (64, 64)), AP.hbm(0, "float32", (64, 64)))
    assert time_one(hh, p, args)[1].end_ns == pytest.approx(dma_alone_ns(p, 16384, p.dma_engines, hbm_bw(p) / 2, 1))
    cast = isa.DmaCopy(AP.sbuf("bfloat16", 64, (64,)), AP.hbm(0, "float32", (64, 64)))  # 4 bytes per element
    assert time_one(cast, p, args)[1].dma_bytes == 64 * 64 * 4
    table = [TensorArg("t", (1000, 32), "float32"), TensorArg("i", (1,), "int32")]
    gather = isa.DmaGather(AP.sbuf("float32", 16, (32,)), AP.hbm(0, "float32", (1000, 32)),
                           AP.sbuf("int32", 16, (1,), offset=4096))
    plan, res = time_one(gather, p, table)
    assert res.dma_bytes == 16 * 32 * 4  # the gathered tile, not the table
    assert res.end_ns == pytest.approx(dma_alone_ns(p, 2048, 2, hbm_bw(p), 16))


@pytest.mark.parametrize("p", [TRN2, TRN3], ids=lambda p: p.name)
@pytest.mark.parametrize("rows,cols,dt", [(128, 128, "bfloat16"), (1024, 128, "bfloat16"), (64, 100, "float32"),
                                          (300, 16, "int16"), (5, 1, "int32")])
@pytest.mark.parametrize("pad", [0, 64])
def test_dma_transpose_alone(p, rows, cols, dt, pad):
    """A DMA transpose is a DMA whose bandwidth is scaled by the profile's fraction: from HBM (rows x cols of
    a matrix whose rows are cols + pad long) and SBUF to SBUF; runs counted on each side as stored, as for
    dma_copy (contiguous rows in HBM merge into one run)."""
    stride = cols + pad
    args = [TensorArg("x", (rows, stride), dt)]
    nbytes = rows * cols * DType.of(dt).itemsize
    engines = min(p.dma_engines, -(-cols // p.dma_partitions_per_engine))
    ins = isa.DmaTranspose(AP.sbuf(dt, cols, (rows,)), AP.hbm(0, dt, (rows, cols), row_stride=stride), queue=3)
    plan, res = time_one(ins, p, args)
    bw = hbm_bw(p) * p.dma_transpose_hbm_fraction
    runs = max(rows if pad else 1, cols)  # src: a run per row unless rows continue each other; dst: per partition
    assert res.end_ns == pytest.approx(dma_alone_ns(p, nbytes, engines, bw, runs), rel=1e-12)
    assert res.dma_bytes == nbytes and res.engine_instructions["dma"] == 1
    assert res.engine_busy_ns["dma"] == pytest.approx(dma_transfer_ns(p, nbytes, bw, runs) / p.dma_engines)
    if rows <= 128 and not pad:
        sb = isa.DmaTranspose(AP.sbuf(dt, cols, (rows,), offset=65536), AP.sbuf(dt, rows, (cols,)))
        engines = min(p.dma_engines, -(-max(rows, cols) // p.dma_partitions_per_engine))
        bw = p.dma_engine_bytes_per_ns * p.dma_transpose_sbuf_fraction
        want = dma_alone_ns(p, nbytes, engines, bw, max(rows, cols))
        assert time_one(sb, p)[1].end_ns == pytest.approx(want, rel=1e-12)


def test_dma_transpose_costs_more_than_a_copy_and_needs_the_profile_flag():
    p = TRN2
    args = [TensorArg("x", (512, 128), "bfloat16")]
    copy = isa.DmaCopy(AP.sbuf("bfloat16", 128, (512,)), AP.hbm(0, "bfloat16", (128, 512)))
    tp = isa.DmaTranspose(AP.sbuf("bfloat16", 128, (512,)), AP.hbm(0, "bfloat16", (512, 128)))
    plan_c, plan_t = prepare_timing(Program("c", args, [copy]), p), prepare_timing(Program("t", args, [tp]), p)
    assert plan_t.dma_bw[0] < plan_c.dma_bw[0]
    with pytest.raises(ValueError, match="trn1 has no DMA transpose"):
        prepare_timing(Program("t", args, [tp]), TRN1)


def test_dma_queue_issue_dge_and_engine_contention():
    p = TRN2
    args = [TensorArg(f"x{k}", (128, 1024), "float32") for k in range(4)]
    loads = [isa.DmaCopy(AP.sbuf("float32", 128, (1024,), offset=4096 * k), AP.hbm(k, "float32", (128, 1024)),
                         queue=q) for k, q in enumerate([0, 0, 1, 2])]
    plan = prepare_timing(Program("q", args, loads), p)
    res = run_timing(plan, want_events=True)
    issue = p.dma_issue_ns
    # Queue 0 issues one at a time; two DGE units serve three queues: the 4th DMA waits for a DGE.
    assert list(res.start) == pytest.approx([0, issue, 0, issue])
    chunk = dma_transfer_ns(p, 128 * 1024 * 4, hbm_bw(p), 128) / 16
    first_data = issue + p.dma_fixed_ns
    # All four use all 16 engines: transfers queue FIFO on the engines in start order.
    ends = sorted(res.end)
    assert ends[0] == pytest.approx(first_data + chunk)
    assert ends[1] == pytest.approx(first_data + 2 * chunk)
    assert ends[3] == pytest.approx(first_data + 4 * chunk)
    assert res.engine_busy_ns["dma"] == pytest.approx(4 * chunk)
    assert res.end[1] >= res.end[0]  # in-order completion on a queue


# ---- overlap and dependencies -----------------------------------------------------------------------------
def _stream_program(p, n_dma, n_vec, dependent, same_buffer=False):
    args = [TensorArg("x", (128, 16 * 2048), "bfloat16")]
    ins = []
    for k in range(max(n_dma, n_vec)):
        buf = AP.sbuf("bfloat16", 128, (2048,), offset=0 if same_buffer else 4096 * (k % 16))
        if k < n_dma:
            src = AP.hbm(0, "bfloat16", (128, 2048), offset=4096 * (k % 16), row_stride=16 * 2048)
            ins.append(isa.DmaCopy(buf, src, queue=k % 2))
        if k < n_vec:
            src = buf if dependent else AP.sbuf("float32", 128, (2048,), offset=100000)
            ins.append(isa.Activation(AP.sbuf("float32", 128, (2048,), offset=140000 + 8192 * (k % 2)), src,
                                      Act.exp))
    return Program("streams", args, ins)


def _total(p, prog):
    return run_timing(prepare_timing(prog, p)).end_ns


@pytest.mark.parametrize("p", PROFILES, ids=lambda p: p.name)
def test_independent_streams_overlap_dependent_serialize(p):
    for n_dma, n_vec in ((24, 12), (6, 24)):
        dma_only = _total(p, _stream_program(p, n_dma, 0, False))
        vec_only = _total(p, _stream_program(p, 0, n_vec, False))
        both = _total(p, _stream_program(p, n_dma, n_vec, False))
        assert both == pytest.approx(max(dma_only, vec_only), rel=0.03)
        assert both < 0.9 * (dma_only + vec_only)
    # One buffer, load -> exp -> next load (WAR) -> ...: nothing overlaps.
    one_dma = _total(p, _stream_program(p, 1, 0, False))
    one_vec = _total(p, _stream_program(p, 0, 1, False))
    chain = _total(p, _stream_program(p, 8, 8, True, same_buffer=True))
    assert chain == pytest.approx(8 * (one_dma + one_vec), rel=1e-9)


def test_war_and_waw_waits():
    p = TRN2
    args = [TensorArg("x", (128, 512), "float32"), TensorArg("y", (128, 1024), "float32", "out")]
    buf = AP.sbuf("float32", 128, (512,))
    out = AP.sbuf("float32", 128, (512,), offset=8192)
    long_read = isa.Activation(out, buf, Act.exp)  # reads buf
    war = isa.DmaCopy(buf, AP.hbm(0, "float32", (128, 512)), queue=0)  # overwrites buf: waits for the read
    store_a = isa.DmaCopy(AP.hbm(1, "float32", (128, 512), row_stride=1024), out, queue=1)
    store_b = isa.DmaCopy(AP.hbm(1, "float32", (128, 512), offset=2048, row_stride=1024), buf, queue=2)
    store_c = isa.DmaCopy(AP.hbm(1, "float32", (128, 512), row_stride=1024), buf, queue=3)  # WAW on store_a
    plan = prepare_timing(Program("war", args, [long_read, war, store_a, store_b, store_c]), p)
    res = run_timing(plan, want_events=True)
    assert res.start[1] == pytest.approx(res.end[0])  # WAR
    assert res.start[2] == pytest.approx(res.end[0])  # RAW on out
    assert res.start[3] == pytest.approx(res.end[1])  # RAW on buf; interleaved columns of y: no false WAW
    assert res.start[4] == pytest.approx(max(res.end[2], res.end[1]))  # WAW on the same columns as store_a


def test_coarse_hbm_tracking_orders_against_fine_accesses(monkeypatch):
    """An HBM access too large to enumerate is tracked per tensor, conservatively."""
    monkeypatch.setattr(deps, "HBM_ACCESS_BLOCKS_MAX", 4)
    p = TRN2
    args = [TensorArg("t", (1024, 64), "float32", "inout")]
    idx = AP.sbuf("int32", 64, (1,), offset=60000)
    tile = AP.sbuf("float32", 64, (64,))
    small_store = isa.DmaCopy(AP.hbm(0, "float32", (1, 64), offset=100 * 256), AP.sbuf("float32", 1, (64,)), queue=0)
    gather = isa.DmaGather(tile, AP.hbm(0, "float32", (1024, 64)), idx, queue=1)  # coarse read of the whole table
    scatter = isa.DmaScatter(AP.hbm(0, "float32", (1024, 64)), tile, idx, queue=2)  # coarse write
    small_load = isa.DmaCopy(AP.sbuf("float32", 1, (64,), offset=30000), AP.hbm(0, "float32", (1, 64)), queue=3)
    res = run_timing(prepare_timing(Program("coarse", args, [small_store, gather, scatter, small_load]), p),
                     want_events=True)
    assert res.start[1] == pytest.approx(res.end[0])  # RAW: fine write then coarse read
    assert res.start[2] >= res.end[1]  # WAR/RAW on the tile and the table
    assert res.start[3] == pytest.approx(res.end[2])  # RAW: coarse write then fine read


# ---- a tiled GEMM ---------------------------------------------------------------------------------------
def gemm_program(p, size: int) -> Program:
    """C[M, N] (fp32) = A[K, M].T @ B[K, N], bf16, M = N = K = size; 128x128 stationary, 512-wide moving,
    PSUM accumulation over the K tiles. Per K step, the A and B tiles are loaded into one of two buffers
    (double buffering) on queues 0/1 and 2/3; results are copied out by VectorE and stored on queue 4."""
    dt, tk, tm, tn = "bfloat16", 128, 128, min(size, 512)
    kt = size // tk
    args = [TensorArg("A", (size, size), dt), TensorArg("B", (size, size), dt),
            TensorArg("C", (size, size), "float32", "out")]
    ins, step, tile_no = [], 0, 0
    for nb in range(size // tn):
        for mb in range(size // tm):
            acc = AP.psum("float32", tm, (tn,), offset=(tile_no % 2) * p.psum_bank_bytes)
            for k in range(kt):
                buf = step % 2
                a = AP.sbuf(dt, tk, (tm,), offset=buf * 256)
                b = AP.sbuf(dt, tk, (tn,), offset=512 + buf * 1024)
                a_src = AP.hbm(0, dt, (tk, tm), offset=(k * tk * size + mb * tm) * 2, row_stride=size)
                b_src = AP.hbm(1, dt, (tk, tn), offset=(k * tk * size + nb * tn) * 2, row_stride=size)
                ins.append(isa.DmaCopy(a, a_src, queue=buf))
                ins.append(isa.DmaCopy(b, b_src, queue=2 + buf))
                ins.append(isa.Matmul(acc, a, b, accumulate=k > 0))
                step += 1
            out = AP.sbuf("float32", tm, (tn,), offset=4096 + (tile_no % 2) * 2048)
            ins.append(isa.TensorCopy(out, acc))
            c_dst = AP.hbm(2, "float32", (tm, tn), offset=(mb * tm * size + nb * tn) * 4, row_stride=size)
            ins.append(isa.DmaCopy(c_dst, out, queue=4 + tile_no % 2))
            tile_no += 1
    return Program(f"gemm{size}", args, ins)


@pytest.mark.parametrize("p", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("size", [512, 1024])
def test_tiled_gemm(p, size):
    prog = gemm_program(p, size)
    validate(prog, p)
    res = run_timing(prepare_timing(prog, p))
    matmuls = (size // 128) * (size // 512) * (size // 128)
    ideal = matmuls * 512  # II = max(min(64, 128), 512) per matmul
    first_ls = math.ceil(128 / p.fast_load_stationary_factor)  # later loads hide behind the previous matmul
    assert res.engine_busy_ns["tensor"] * p.tensor_ghz == pytest.approx(ideal + first_ls, rel=1e-9)
    assert res.engine_instructions["tensor"] == matmuls
    # Every K step reloads its A and B tiles into one of two buffers, so the GEMM is bound by DMA bandwidth,
    # DMA issue (DGE units) or DMA latency (a buffer is refilled only after the matmul two steps earlier).
    steps = matmuls
    bw = min(p.dma_engines * p.dma_engine_bytes_per_ns, p.hbm_gbps / p.cores_per_chip)
    dma_bound = res.dma_bytes / bw
    issue_bound = res.engine_instructions["dma"] * p.dma_issue_ns / p.dma_dge_units
    b_tile = 128 * 512 * 2
    step_latency = p.dma_issue_ns + p.dma_fixed_ns + b_tile / 16 / hbm_bw(p) + 512 / p.tensor_ghz
    latency_bound = steps / 2 * step_latency
    bound = max(ideal / p.tensor_ghz, dma_bound, issue_bound, latency_bound)
    epilogue = 2 * (p.dma_issue_ns + p.dma_fixed_ns) + 512 / p.vector_ghz
    assert max(ideal / p.tensor_ghz, dma_bound, issue_bound) <= res.device_ns <= 1.15 * bound + epilogue


# ---- scale ----------------------------------------------------------------------------------------------
def test_million_instruction_program_runs(capsys):
    p = TRN2
    args = [TensorArg("x", (128, 4096), "bfloat16"), TensorArg("y", (128, 4096), "float32", "out")]
    block = []
    for k in range(8):
        xs = AP.sbuf("bfloat16", 128, (512,), offset=(k % 2) * 1024)
        acc = AP.psum("float32", 128, (512,), offset=(k % 8) * 2048)
        o = AP.sbuf("float32", 128, (512,), offset=8192 + (k % 2) * 2048)
        block += [isa.DmaCopy(xs, AP.hbm(0, "bfloat16", (128, 512), offset=k * 1024, row_stride=4096), queue=k % 2),
                  isa.Matmul(acc, AP.sbuf("bfloat16", 128, (128,), offset=4096), xs),
                  isa.Activation(o, acc, Act.gelu), isa.TensorTensor(o, o, o, Alu.multiply),
                  isa.TensorScalar(o, o, Alu.add, 1.0, engine=Engine.GPSIMD),
                  isa.DmaCopy(AP.hbm(1, "float32", (128, 512), offset=k * 2048, row_stride=4096), o, queue=2 + k % 2)]
    n = 1_000_000
    prog = Program("million", args, (block * (n // len(block) + 1))[:n])
    t0 = time.perf_counter()
    plan = prepare_timing(prog, p)
    t1 = time.perf_counter()
    res = run_timing(plan)
    t2 = time.perf_counter()
    assert plan.n == n and res.end_ns > 0
    assert sum(res.engine_instructions.values()) == n
    assert max(res.engine_busy_ns.values()) <= res.device_ns * (1 + 1e-9)
    with capsys.disabled():
        print(f"\n[timing] 1M instructions: prepare_timing {n / (t1 - t0) / 1e3:.0f}k instr/s, "
              f"run_timing {n / (t2 - t1) / 1e6:.1f}M instr/s (device time {res.device_ns / 1e6:.2f} ms)")


def test_hbm_rows_sharing_a_block_do_not_falsely_depend():
    """Two tiles whose 128-byte rows interleave inside 512-byte blocks: exact byte ranges keep them apart."""
    p = TRN2
    args = [TensorArg("y", (64, 64), "float32", "out")]  # rows of 256 bytes
    left = AP.hbm(0, "float32", (64, 32), row_stride=64)  # columns 0..31: bytes [0, 128) of each row
    right = AP.hbm(0, "float32", (64, 32), offset=128, row_stride=64)  # columns 32..63
    src = AP.sbuf("float32", 64, (32,))
    prog = Program("rows", args, [isa.DmaCopy(left, src, queue=0), isa.DmaCopy(right, src, queue=1),
                                  isa.DmaCopy(left, src, queue=2)])
    res = run_timing(prepare_timing(prog, p), want_events=True)
    assert res.start[1] == pytest.approx(res.start[0])  # independent (two DGE units)
    assert res.start[2] == pytest.approx(res.end[0])  # WAW with the first store only


# ---- the dependency graph against a brute-force reference ----------------------------------------------
def _bytes(ap: AP) -> set:
    """Every (memory, partition, byte) an AP touches, element by element."""
    size = ap.dtype.itemsize
    offsets = [0]
    for s, stride in ap.free:
        offsets = [o + k * stride for o in offsets for k in range(s)]
    out = set()
    for p in range(ap.partitions):
        for o in offsets:
            if ap.space is Space.HBM:
                first = ap.offset + (p * ap.partition_stride + o) * size
                out.update(("hbm", ap.tensor, 0, first + b) for b in range(size))
            else:
                first = ap.offset + o * size
                out.update((ap.space.value, 0, ap.start_partition + p, first + b) for b in range(size))
    return out


def _footprints(prog) -> list[tuple[set, set]]:
    def union(aps):
        return set().union(*map(_bytes, aps)) if aps else set()

    return [(union(ins.reads()), union(ins.writes())) for ins in prog.instructions]


def _conflict(a, b) -> bool:
    (ra, wa), (rb, wb) = a, b
    return bool(wa & rb or ra & wb or wa & wb)


@st.composite
def random_program(draw, exact=True):
    """Random copies between SBUF and two HBM tensors. exact: contiguous on-chip tiles, HBM rows in separate
    512-byte blocks and at most 4 instructions per stream, where the model promises no false dependencies."""
    row = 128 if exact else 64
    args = [TensorArg("a", (8, row), "float32", "inout"), TensorArg("b", (8, row), "float32", "inout")]
    streams = ["vector", "gpsimd", 0, 1, 2]
    used = dict.fromkeys(streams, 0)
    ins = []
    for _ in range(draw(st.integers(2, 14 if exact else 40))):
        where = draw(st.sampled_from([s for s in streams if used[s] < 4 or not exact]))
        used[where] += 1
        parts = draw(st.sampled_from([1, 2, 4, 8]))
        start = draw(st.sampled_from([0, 32, 64, 96])) if isinstance(where, str) else draw(st.integers(0, 8))

        def sbuf(n, parts=parts, start=start):
            stride = 1 if exact else draw(st.sampled_from([1, 2, 3]))
            return AP(Space.SBUF, DType.float32, parts, ((n, stride),), start, 4 * draw(st.integers(0, 200)))

        if isinstance(where, str):  # an SBUF -> SBUF copy on an engine
            n = draw(st.integers(1, 40))
            ins.append(isa.TensorCopy(sbuf(n), sbuf(n), engine=Engine(where)))
            continue
        cols = draw(st.integers(1, 16))
        rows = min(parts, 8)
        hbm = AP.hbm(draw(st.integers(0, 1)), "float32", (rows, cols), row_stride=row,
                     offset=4 * (draw(st.integers(0, 8 - rows)) * row + draw(st.integers(0, row - cols))))
        tile = AP.sbuf("float32", rows, (cols,), offset=4 * draw(st.integers(0, 200)), start=start)
        ins.append(isa.DmaCopy(tile, hbm, queue=where) if draw(st.booleans()) else isa.DmaCopy(hbm, tile, queue=where))
    return Program("random", args, ins)


@settings(max_examples=120, deadline=None)
@given(prog=random_program(), exact=st.just(True))
def test_dependencies_match_brute_force(prog, exact):
    check_dependencies(prog, exact)


@settings(max_examples=60, deadline=None)
@given(prog=random_program(exact=False), coarse_limit=st.sampled_from([deps.HBM_ACCESS_BLOCKS_MAX, 2, 0]))
def test_dependencies_are_sound_when_approximate(prog, coarse_limit):
    """Strided tiles, crowded blocks (merged records) and HBM accesses tracked per tensor: still sound."""
    with mock.patch.object(deps, "HBM_ACCESS_BLOCKS_MAX", coarse_limit):
        check_dependencies(prog, exact=False)


def check_dependencies(prog, exact):
    plan = prepare_timing(prog, TRN2)
    n = plan.n
    foot = _footprints(prog)
    preds = [set() for _ in range(n)]
    for j in range(n):
        for i in plan.succ_idx[plan.succ_ptr[j]:plan.succ_ptr[j + 1]]:
            preds[int(i)].add(j)
    # Precision: every edge joins two instructions that really conflict (no false dependency).
    for i in range(n):
        for j in preds[i]:
            assert j < i and (_conflict(foot[j], foot[i]) or not exact), (j, i)
    # Soundness: every conflicting pair is ordered. ends_by[k]: what has ended when k ends (k, what ended
    # before k started, and every earlier instruction of its engine or queue: both complete in order);
    # started_after[i]: what has ended when i starts (its dependencies' ends_by, and on a compute engine
    # the previous instruction's).
    ends_by = [set() for _ in range(n)]
    last_on = {}
    for i in range(n):
        s = int(plan.stream[i])
        started_after = set()
        for k in preds[i]:
            started_after |= ends_by[k]
        if s in last_on and s < N_COMPUTE:
            started_after |= ends_by[last_on[s]]
        ends_by[i] = started_after | {i} | (ends_by[last_on[s]] if s in last_on else set())
        last_on[s] = i
        for j in range(i):
            if _conflict(foot[j], foot[i]):
                assert j in started_after, (j, i, str(prog.instructions[j]), str(prog.instructions[i]))
