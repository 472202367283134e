"""Functional simulator: every instruction against an independent numpy reference.

The reference side never uses neuron_sim's views: element addresses are computed here from the
AP fields (``addresses``), values are poked/peeked byte by byte, and arithmetic is done in float64
(then rounded once to FP32, which is the correctly rounded FP32 result for + - * /) or with Python
integers.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN2, TRN3, Act, Alu, DType, Engine, Program, ProgramError, Space, TensorArg, isa, validate
from neuron_sim.values import CoreMemory, erf, erfc, load_f32, prepare_values, run_values, widen_to_f32

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])

HBM_BYTES = 16 << 20
FLOATS = [DType.float32, DType.bfloat16, DType.float16]
FP8 = [DType.float8_e4m3, DType.float8_e4m3fn, DType.float8_e5m2]
INTS = [DType.int8, DType.uint8, DType.int16, DType.uint16, DType.int32, DType.uint32]
ENGINE_TYPES = FLOATS + FP8 + INTS
F32 = np.float32

_CORES: dict[str, CoreMemory] = {}


def fresh_core(profile) -> CoreMemory:
    core = _CORES.get(profile.name)
    if core is None:
        core = _CORES[profile.name] = CoreMemory(profile)
    core.sbuf.fill(0xFF)
    core.psum.fill(0xFF)
    core.sbuf_hi = core.psum_hi = 0
    return core


def allowed_starts(partitions: int) -> list[int]:
    if partitions > 64:
        return [0]
    if partitions > 32:
        return [0, 64]
    return [0, 32, 64, 96]


# ------------------------------------------------------------------------------------------------
# The rig: HBM + one core + program tensors, and independent element addressing
# ------------------------------------------------------------------------------------------------
class Rig:
    def __init__(self, profile=TRN2):
        self.profile = profile
        self.core = fresh_core(profile)
        self.hbm = np.zeros(HBM_BYTES, np.uint8)
        self.args: list[TensorArg] = []
        self.addresses: list[int] = []
        self.region = {Space.SBUF: 0, Space.PSUM: 0}
        self.next_address = 512

    # -- placement --------------------------------------------------------------------------
    def tensor(self, nbytes: int) -> int:
        i = len(self.args)
        self.args.append(TensorArg(f"t{i}", (nbytes,), "uint8", "inout"))
        self.addresses.append(self.next_address)
        self.next_address += -(-(nbytes + 64) // 512) * 512
        assert self.next_address <= HBM_BYTES
        return i

    def onchip(self, space: Space, dtype: DType, partitions: int, free, start: int, misalign: int = 0) -> AP:
        free = tuple(free)
        lo, hi = extent(free)
        size = dtype.itemsize
        base = self.region[space]
        offset = base + misalign - lo * size
        end = base + misalign + (hi - lo) * size
        capacity = self.profile.sbuf_partition_bytes if space is Space.SBUF else self.profile.psum_partition_bytes
        if end > capacity:
            assume(False)
        self.region[space] = -(-end // 64) * 64
        return AP(space, dtype, partitions, free, start, offset)

    def hbm_ap(self, dtype: DType, rows: int, free, row_stride: int, misalign: int = 0) -> AP:
        free = tuple(free)
        lo, hi = extent(free)
        span = (rows - 1) * row_stride
        lo, hi = lo + min(0, span), hi + max(0, span)
        t = self.tensor((hi - lo) * dtype.itemsize + misalign + 8)
        return AP(Space.HBM, dtype, rows, free, 0, misalign - lo * dtype.itemsize, row_stride, t)

    # -- independent addressing ---------------------------------------------------------------
    def addresses_of(self, ap: AP) -> tuple[np.ndarray, np.ndarray]:
        """(flat byte array, byte address of every element, shape ap.shape)."""
        size = ap.dtype.itemsize
        if ap.space is Space.HBM:
            flat, base, pstride = self.hbm, self.addresses[ap.tensor] + ap.offset, ap.partition_stride * size
        else:
            mem = self.core.sbuf if ap.space is Space.SBUF else self.core.psum
            # the core's rows are padded (strides[0] > shape[1]): address the bytes through the row stride
            pstride = mem.strides[0]
            flat = np.lib.stride_tricks.as_strided(mem, (mem.shape[0] * pstride,), (1,))
            base = ap.start_partition * pstride + ap.offset
        nd = 1 + len(ap.free)
        addr = np.full(ap.shape, base, np.int64)
        addr += (np.arange(ap.partitions, dtype=np.int64) * pstride).reshape((-1,) + (1,) * (nd - 1))
        for d, (s, stride) in enumerate(ap.free):
            shape = [1] * nd
            shape[d + 1] = s
            addr += (np.arange(s, dtype=np.int64) * stride * size).reshape(shape)
        return flat, addr

    def put(self, ap: AP, values) -> None:
        flat, addr = self.addresses_of(ap)
        size = ap.dtype.itemsize
        vals = np.ascontiguousarray(np.broadcast_to(np.asarray(values, ap.dtype.numpy), ap.shape))
        idx = (addr.reshape(-1, 1) + np.arange(size)).reshape(-1)
        flat[idx] = vals.view(np.uint8).reshape(-1)

    def get(self, ap: AP) -> np.ndarray:
        flat, addr = self.addresses_of(ap)
        size = ap.dtype.itemsize
        idx = (addr.reshape(-1, 1) + np.arange(size)).reshape(-1)
        return flat[idx].copy().view(ap.dtype.numpy).reshape(ap.shape)

    def fill(self, ap: AP, seed: int, **kw) -> np.ndarray:
        """Random values into ap; returns what ap now reads (broadcast patterns collapse)."""
        self.put(ap, random_values(seed, ap.dtype, ap.shape, **kw))
        return self.get(ap)

    # -- running ------------------------------------------------------------------------------
    def program(self, *instructions) -> Program:
        if not self.args:
            self.tensor(16)
        prog = Program("test", self.args, instructions)
        validate(prog, self.profile)
        return prog

    def run(self, *instructions) -> None:
        run_values(self.program(*instructions), self.hbm, self.addresses, self.core, self.profile)


def extent(free) -> tuple[int, int]:
    lo = sum(min(0, (s - 1) * stride) for s, stride in free if s > 0)
    hi = sum(max(0, (s - 1) * stride) for s, stride in free if s > 0)
    return lo, hi + 1


# ------------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------------
@st.composite
def sizes_st(draw, max_dims=3, max_size=6, min_dims=1):
    nd = draw(st.integers(min_dims, max_dims))
    return tuple(draw(st.integers(1, max_size)) for _ in range(nd))


@st.composite
def reshape_st(draw, n: int, max_dims=3):
    """A shape with product n (1..max_dims dims)."""
    dims, rest = [], n
    for _ in range(draw(st.integers(1, max_dims)) - 1):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    dims.append(rest)
    return tuple(dims)


@st.composite
def layout_st(draw, sizes, writable=True, gaps=(1, 1, 1, 2, 3)):
    """Free pattern for sizes: a permuted, gapped, partly reversed row-major layout; read-only
    operands may also broadcast (stride 0)."""
    nd = len(sizes)
    order = draw(st.permutations(list(range(nd))))
    strides = [0] * nd
    acc = 1
    for d in reversed(order):
        gap = draw(st.sampled_from(gaps))
        strides[d] = acc * gap
        acc *= sizes[d] * gap
    for d in range(nd):
        if draw(st.integers(0, 5)) == 0:
            strides[d] = -strides[d]
        if not writable and draw(st.integers(0, 6)) == 0:
            strides[d] = 0
    return tuple(zip(sizes, strides))


@st.composite
def partitions_st(draw, max_p=128):
    p = draw(st.sampled_from([1, 2, 3, 7, 16, 32, 33, 64, 65, 100, 128] + list(range(1, max_p + 1))))
    p = min(p, max_p)
    return p, draw(st.sampled_from(allowed_starts(p)))


SPECIAL_FLOATS = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40, -1e-42, 65504.0, 1e-7, 0.5, 1.5,
                  2.5, -2.5, 1.0, -1.0, 127.5, 1e10]


def random_values(seed: int, dtype: DType, shape, specials: bool = True, scale: float | None = None,
                  positive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    npdt = dtype.numpy
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(npdt)
        x = rng.integers(info.min, info.max, shape, dtype=npdt, endpoint=True)
        small = rng.integers(-10 if dtype.kind == "i" else 0, 10, shape).astype(npdt)
        x = np.where(rng.random(shape) < 0.5, small, x)
        if specials:
            pick = rng.random(shape) < 0.1
            x = np.where(pick, rng.choice(np.array([0, info.min, info.max, 1], dtype=npdt), size=shape), x)
        return x.astype(npdt)
    s = scale if scale is not None else [1.0, 100.0, 1e-3][seed % 3]
    x = rng.standard_normal(shape) * s
    if positive:
        x = np.abs(x)
    if specials:
        pick = rng.random(shape) < 0.12
        x = np.where(pick, rng.choice(SPECIAL_FLOATS, size=shape), x)
    with np.errstate(all="ignore"):
        return x.astype(F32).astype(npdt)


# ------------------------------------------------------------------------------------------------
# Reference numerics
# ------------------------------------------------------------------------------------------------
def ref_to_int(x, dtype: DType) -> np.ndarray:
    """Float -> int: round half to even, saturate, NaN -> 0 (Python integers, element by element)."""
    info = np.iinfo(dtype.numpy)
    out = []
    for v in np.asarray(x, np.float64).reshape(-1):
        if math.isnan(v):
            out.append(0)
        elif math.isinf(v):
            out.append(int(info.max) if v > 0 else int(info.min))
        else:
            out.append(min(max(round(v), int(info.min)), int(info.max)))
    return np.array(out, np.int64).astype(dtype.numpy).reshape(np.shape(x))


def ref_cast(x, dtype: DType) -> np.ndarray:
    """Cast FP32-valued results (held in any float array) to dtype, per the engine rules."""
    x = np.asarray(x)
    if dtype.kind == "b":
        return x != 0
    if dtype.kind in "iu":
        return ref_to_int(x, dtype)
    with np.errstate(all="ignore"):
        return x.astype(F32).astype(dtype.numpy)


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def assert_same(got, want, what="", signed_zero=True):
    """Equal bit patterns, except that any NaN matches any NaN (and -0 matches +0 unless signed_zero)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    ok = bits(got) == bits(want)
    if got.dtype.kind == "V" or got.dtype.kind == "f" or "float" in str(got.dtype):
        with np.errstate(all="ignore"):
            g, w = got.astype(np.float64), want.astype(np.float64)
            ok |= np.isnan(g) & np.isnan(w)
            if not signed_zero:
                ok |= (g == 0) & (w == 0)
    if not ok.all():
        bad = np.argwhere(~ok)[:5]
        rows = [(tuple(b), got[tuple(b)], want[tuple(b)]) for b in bad]
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.size} differ, e.g. (index, got, want) {rows}")


def assert_close(got, want, rtol, atol=0.0, what=""):
    g, w = f64(got), f64(want)
    assert g.shape == w.shape
    with np.errstate(all="ignore"):
        ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= atol + rtol * np.abs(w))
    if not ok.all():
        bad = np.argwhere(~ok)[:5]
        rows = [(tuple(b), g[tuple(b)], w[tuple(b)]) for b in bad]
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.size} differ, e.g. (index, got, want) {rows}")


def ref_alu(op: Alu, a, b) -> np.ndarray:
    """FP32 ALU reference: float64 arithmetic on the FP32 inputs, rounded once to FP32."""
    a, b = f64(a), f64(b)
    with np.errstate(all="ignore"):
        r = {
            Alu.add: lambda: a + b,
            Alu.subtract: lambda: a - b,
            Alu.multiply: lambda: a * b,
            Alu.divide: lambda: a / b,
            Alu.max: lambda: np.where(np.isnan(a) | np.isnan(b), np.nan, np.where(a >= b, a, b)),
            Alu.min: lambda: np.where(np.isnan(a) | np.isnan(b), np.nan, np.where(a <= b, a, b)),
            Alu.pow: lambda: np.power(a, b),  # the simulator's FP32 pow: float64's, rounded once
            Alu.mod: lambda: np.fmod(a, b),
            Alu.abs_max: lambda: np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(np.abs(a), np.abs(b))),
            Alu.equal: lambda: (a == b) * 1.0,
            Alu.not_equal: lambda: (a != b) * 1.0,
            Alu.greater: lambda: (a > b) * 1.0,
            Alu.greater_equal: lambda: (a >= b) * 1.0,
            Alu.less: lambda: (a < b) * 1.0,
            Alu.less_equal: lambda: (a <= b) * 1.0,
            Alu.logical_and: lambda: ((a != 0) & (b != 0)) * 1.0,
            Alu.logical_or: lambda: ((a != 0) | (b != 0)) * 1.0,
            Alu.logical_xor: lambda: ((a != 0) ^ (b != 0)) * 1.0,
            Alu.bypass: lambda: np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)),
        }[op]()
        return np.asarray(r).astype(F32)


FLOAT_ALU = [Alu.add, Alu.subtract, Alu.multiply, Alu.divide, Alu.max, Alu.min, Alu.pow, Alu.mod, Alu.abs_max,
             Alu.equal, Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal,
             Alu.logical_and, Alu.logical_or, Alu.logical_xor, Alu.bypass]
BITWISE = [Alu.bitwise_and, Alu.bitwise_or, Alu.bitwise_xor, Alu.left_shift, Alu.right_shift]


def draw_onchip(draw, rig: Rig, dtype: DType, partitions: int, start: int, sizes, *, writable: bool,
                spaces=(Space.SBUF, Space.PSUM), misalign: int = 0) -> AP:
    space = draw(st.sampled_from(spaces))
    gaps = (1, 1, 1, 2, 3) if space is Space.SBUF else (1, 1, 2)
    free = draw(layout_st(sizes, writable, gaps))
    return rig.onchip(space, dtype, partitions, free, start, misalign)


def engine_spaces(engine: Engine):
    return (Space.SBUF,) if engine is Engine.GPSIMD else (Space.SBUF, Space.PSUM)


# ================================================================================================
# Core memory: poison, repoison, plans
# ================================================================================================
def test_core_memory_starts_poisoned():
    core = CoreMemory(TRN2)
    assert core.sbuf.shape == (TRN2.sbuf_partitions, TRN2.sbuf_partition_bytes)
    assert core.psum.shape == (TRN2.sbuf_partitions, TRN2.psum_partition_bytes)
    assert (core.sbuf == 0xFF).all() and (core.psum == 0xFF).all()
    for dt in FLOATS + FP8:
        assert np.isnan(core.sbuf[:1, :8].view(dt.numpy).astype(np.float64)).all(), dt
    assert (core.sbuf[:1, :8].view(np.int32) == -1).all()


@pytest.mark.parametrize("dtype", [DType.float32, DType.bfloat16, DType.float16, DType.float8_e4m3fn,
                                   DType.float8_e5m2, DType.float8_e4m3, DType.int32])
def test_uninitialized_reads_show(dtype):
    rig = Rig()
    tile = AP.sbuf(dtype, 4, (8,), offset=64)
    out = rig.hbm_ap(DType.float32, 4, ((8, 1),), 8)
    acc = AP.sbuf(DType.float32, 4, (8,), offset=4096)
    rig.run(isa.TensorCopy(acc, tile), isa.DmaCopy(out, acc))
    got = rig.get(out)
    if dtype.is_float:
        assert np.isnan(got).all()
    else:
        assert (got == -1).all()  # int32 0xFFFFFFFF is -1; -1 -> FP32 -1.0
    # Matmul of poison gives NaN in PSUM
    rig2 = Rig()
    mm = isa.Matmul(AP.psum("float32", 8, (8,)), AP.sbuf("bfloat16", 8, (8,)), AP.sbuf("bfloat16", 8, (8,), offset=64))
    rig2.run(mm)
    assert np.isnan(rig2.get(mm.dst)).all()


def test_repoison_restores_only_what_was_written():
    rig = Rig()
    core = rig.core
    tile = AP.sbuf("float32", 128, (16,), offset=256)
    ps = AP.psum("float32", 128, (4,), offset=2048)
    prog = rig.program(isa.Memset(tile, 0.0), isa.Memset(ps, 1.0))
    core.sbuf[:, 10000] = 7  # beyond anything the program writes: repoison must not pay for it
    run_values(prog, rig.hbm, rig.addresses, core, TRN2)
    assert core.sbuf_hi == 256 + 64 and core.psum_hi == 2048 + 16
    assert (core.sbuf[:, 256:320] == 0).all()
    core.repoison()
    assert core.sbuf_hi == 0 and core.psum_hi == 0
    assert (core.sbuf[:, :320] == 0xFF).all() and (core.psum[:, :2064] == 0xFF).all()
    assert (core.sbuf[:, 10000] == 7).all()
    core.repoison()  # nothing written: a no-op
    run_values(prog, rig.hbm, rig.addresses, core, TRN2)  # the cached plan runs again
    assert (core.sbuf[:, 256:320] == 0).all()


def test_plan_reuse_across_addresses_and_cores():
    args = [TensorArg("x", (4, 8), "float32"), TensorArg("y", (4, 8), "float32", "out")]
    t = AP.sbuf("float32", 4, (8,))
    prog = Program("p", args, [isa.DmaCopy(t, AP.hbm(0, "float32", (4, 8))),
                               isa.TensorScalar(t, t, Alu.multiply, 2.0),
                               isa.DmaCopy(AP.hbm(1, "float32", (4, 8)), t)])
    validate(prog, TRN2)
    plan = prepare_values(prog, TRN2)
    hbm = np.zeros(1 << 16, np.uint8)
    cores = [CoreMemory(TRN2), CoreMemory(TRN2)]
    for k, (a, b) in enumerate([(512, 1024), (4096, 2048), (8192, 512)]):
        x = np.arange(32, dtype=np.float32) + k
        hbm[a:a + 128] = x.view(np.uint8)
        plan.run(hbm, [a, b], cores[k % 2])
        np.testing.assert_array_equal(hbm[b:b + 128].view(np.float32), 2 * x)
    with pytest.raises(ValueError, match="2 tensors"):
        plan.run(hbm, [512], cores[0])


def test_plan_caches_do_not_keep_programs_or_cores_alive():
    import gc
    import weakref

    args = [TensorArg("x", (4, 8), "float32")]
    t = AP.sbuf("float32", 4, (8,))
    prog = Program("p", args, [isa.DmaCopy(t, AP.hbm(0, "float32", (4, 8))),
                               isa.Matmul(AP.psum("float32", 8, (8,)), t, t)])
    validate(prog, TRN2)
    core = CoreMemory(TRN2)
    run_values(prog, np.zeros(4096, np.uint8), [512], core, TRN2)
    plan = prepare_values(prog, TRN2)
    plan.bind(core)
    refs = [weakref.ref(prog), weakref.ref(core)]
    del prog, core
    gc.collect()
    assert all(r() is None for r in refs)


# ================================================================================================
# DMA
# ================================================================================================
ALL_TYPES = list(DType)


def ref_int_wrap(values, dtype: DType) -> np.ndarray:
    bits_ = dtype.itemsize * 8
    out = []
    for v in np.asarray(values).reshape(-1).tolist():
        v = int(v) & ((1 << bits_) - 1)
        if dtype.kind == "i" and v >= 1 << (bits_ - 1):
            v -= 1 << bits_
        out.append(v)
    return np.array(out, dtype=object).astype(dtype.numpy).reshape(np.shape(values))


def ref_dma(values: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    if src is dst:
        return values.copy()
    if src.kind in "iub" and dst.kind in "iub":
        if dst.kind == "b":
            return values != 0
        return ref_int_wrap(values.astype(np.int64) if src.kind == "b" else values, dst)
    with np.errstate(all="ignore"):
        return ref_cast(values.astype(F32), dst)


@st.composite
def dma_side(draw, rig: Rig, dtype: DType, space: Space, rows: int, sizes, writable: bool, misalign: int):
    if space is Space.HBM:
        free = draw(layout_st(sizes, writable))
        lo, hi = extent(free)
        row = hi - lo
        stride = draw(st.sampled_from([row, row, row + 3, 2 * row] + ([0, -row] if not writable else [-row])))
        return rig.hbm_ap(dtype, rows, free, stride, misalign)
    start = draw(st.integers(0, 128 - rows))
    return draw_onchip_st(draw, rig, dtype, rows, start, sizes, writable, space, misalign)


def draw_onchip_st(draw, rig, dtype, rows, start, sizes, writable, space, misalign):
    gaps = (1, 1, 1, 2, 3) if space is Space.SBUF else (1, 1, 2)
    free = draw(layout_st(sizes, writable, gaps))
    return rig.onchip(space, dtype, rows, free, start, misalign)


@SETTINGS
@given(st.data())
def test_dma_copy(data):
    draw = data.draw
    rig = Rig()
    spaces = [Space.HBM, Space.SBUF, Space.PSUM]
    sspace, dspace = draw(st.sampled_from(spaces)), draw(st.sampled_from(spaces))
    sdt = draw(st.sampled_from(ALL_TYPES))
    if draw(st.booleans()):
        ddt = sdt
    else:  # 64-bit <-> float casts would double-round in the reference; keep 64-bit to int <-> int
        pool = [d for d in ALL_TYPES if d.itemsize < 8] if sdt.itemsize < 8 else [d for d in ALL_TYPES
                                                                                   if d.kind in "iub"]
        ddt = draw(st.sampled_from(pool))
    misalign_s = draw(st.integers(0, sdt.itemsize - 1)) if sdt is ddt else 0
    misalign_d = draw(st.integers(0, ddt.itemsize - 1)) if sdt is ddt else 0
    rows = draw(st.integers(1, 128 if sspace is not Space.HBM else 40))
    ssizes = draw(sizes_st(max_size=5))
    total = rows * math.prod(ssizes)
    divisors = [d for d in range(1, min(total, 128) + 1) if total % d == 0]
    drows = draw(st.sampled_from(divisors))
    dsizes = draw(reshape_st(total // drows))
    assume(max(dsizes) <= 600)
    src = draw(dma_side(rig, sdt, sspace, rows, ssizes, False, misalign_s))
    dst = draw(dma_side(rig, ddt, dspace, drows, dsizes, True, misalign_d))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    vals = rig.fill(src, seed)
    before_dst = rig.fill(dst, seed + 1)
    del before_dst
    rig.run(isa.DmaCopy(dst, src, queue=draw(st.integers(0, 15))))
    want = ref_dma(vals.reshape(-1), sdt, ddt).reshape(dst.shape)
    assert_same(rig.get(dst), want, f"{src} -> {dst}")


def test_dma_copy_bit_exact_nan_payloads_and_large_tiles():
    rig = Rig()
    payloads = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0x80000000], np.uint32)
    src = rig.hbm_ap(DType.float32, 1, ((5, 1),), 5)
    rig.put(src, payloads.view(np.float32).reshape(1, 5))
    tile = AP.sbuf("float32", 1, (5,), offset=4)
    out = rig.hbm_ap(DType.float32, 1, ((5, 1),), 5)
    rig.run(isa.DmaCopy(tile, src), isa.DmaCopy(out, tile))
    np.testing.assert_array_equal(rig.get(out).view(np.uint32).reshape(-1), payloads)
    # bf16 payloads through SBUF, a [128, 16384] tile
    rig = Rig()
    x = np.random.default_rng(1).integers(0, 1 << 16, (128, 16384), dtype=np.uint16)
    x[0, :4] = [0x7FC1, 0xFF81, 0x7F80, 0x8000]
    src = rig.hbm_ap(DType.bfloat16, 128, ((16384, 1),), 16384)
    rig.put(src, x.view(ml_dtypes.bfloat16))
    tile = AP.sbuf("bfloat16", 128, (16384,))
    out = rig.hbm_ap(DType.bfloat16, 128, ((16384, 1),), 16384)
    rig.run(isa.DmaCopy(tile, src), isa.DmaCopy(out, tile))
    np.testing.assert_array_equal(rig.get(out).view(np.uint16), x)


def test_dma_cast_rules():
    rig = Rig()
    vals = np.array([[2.5, 3.5, -2.5, 1e10, -np.inf, np.nan, -3.0, 255.5]], np.float32)
    src = rig.hbm_ap(DType.float32, 1, ((8, 1),), 8)
    rig.put(src, vals)
    outs = {dt: rig.hbm_ap(dt, 1, ((8, 1),), 8) for dt in (DType.int32, DType.uint8, DType.int8, DType.bfloat16,
                                                              DType.bool_)}
    rig.run(*[isa.DmaCopy(ap, src) for ap in outs.values()])
    assert rig.get(outs[DType.int32]).tolist() == [[2, 4, -2, 2**31 - 1, -2**31, 0, -3, 256]]
    assert rig.get(outs[DType.uint8]).tolist() == [[2, 4, 0, 255, 0, 0, 0, 255]]
    assert rig.get(outs[DType.int8]).tolist() == [[2, 4, -2, 127, -128, 0, -3, 127]]
    assert rig.get(outs[DType.bool_]).tolist() == [[True, True, True, True, True, True, True, True]]
    # int <-> int casts directly (wraps), 64-bit included
    rig = Rig()
    src = rig.hbm_ap(DType.int64, 1, ((4, 1),), 4)
    rig.put(src, np.array([[2**40 + 5, -1, 300, 2**31]], np.int64))
    o32, o8 = rig.hbm_ap(DType.int32, 1, ((4, 1),), 4), rig.hbm_ap(DType.uint8, 1, ((4, 1),), 4)
    rig.run(isa.DmaCopy(o32, src), isa.DmaCopy(o8, src))
    assert rig.get(o32).tolist() == [[5, -1, 300, -2**31]]
    assert rig.get(o8).tolist() == [[5, 255, 44, 0]]


def test_overlapping_operands_read_then_write():
    rig = Rig()
    vals = np.arange(1, 17, dtype=np.float32).reshape(2, 8)
    buf = AP.sbuf("float32", 2, (8,), offset=0)
    rig.put(buf, vals)
    shifted = AP.sbuf("float32", 2, (8,), offset=4)  # one element to the right, overlapping
    rig.run(isa.TensorCopy(shifted, buf))
    np.testing.assert_array_equal(rig.get(shifted), vals)
    # reversed copy onto itself through a negative stride
    rig.put(buf, vals)
    rev = AP(Space.SBUF, DType.float32, 2, ((8, -1),), 0, 28)
    rig.run(isa.TensorTensor(buf, rev, buf, Alu.add))
    np.testing.assert_array_equal(rig.get(buf), vals[:, ::-1] + vals)
    # HBM -> HBM DMA onto an overlapping range
    src = rig.hbm_ap(DType.int32, 1, ((16, 1),), 16)
    rig.put(src, np.arange(16, dtype=np.int32).reshape(1, 16))
    dst = AP(Space.HBM, DType.int32, 1, ((12, 1),), 0, src.offset + 8, 12, src.tensor)
    part = AP(Space.HBM, DType.int32, 1, ((12, 1),), 0, src.offset, 12, src.tensor)
    rig.run(isa.DmaCopy(dst, part))
    assert rig.get(src).tolist() == [[0, 1, *range(12), 14, 15]]
    assert rig.get(dst).tolist() == [list(range(12))]


def test_hbm_view_outside_hbm_is_a_program_error():
    args = [TensorArg("x", (4, 8), "float32")]
    prog = Program("oob", args, [isa.DmaCopy(AP.sbuf("float32", 4, (8,)), AP.hbm(0, "float32", (4, 8)))])
    validate(prog, TRN2)
    with pytest.raises(ProgramError, match="hbm bounds"):
        run_values(prog, np.zeros(4096, np.uint8), [4000], CoreMemory(TRN2), TRN2)


# ================================================================================================
# TensorE: matmul, transpose
# ================================================================================================
MM_TYPES = [DType.bfloat16, DType.float16, *FP8]


@SETTINGS
@given(st.data())
def test_matmul(data):
    draw = data.draw
    profile = draw(st.sampled_from([TRN2, TRN3]))
    rig = Rig(profile)
    if draw(st.integers(0, 4)) == 0:
        sdt = mdt = DType.float32
    else:
        sdt, mdt = draw(st.sampled_from(MM_TYPES)), draw(st.sampled_from(MM_TYPES))
    K, kstart = draw(partitions_st())
    M, mstart = draw(partitions_st())
    ssizes = draw(reshape_st(M, max_dims=2))
    N = draw(st.sampled_from([1, 2, 5, 16, 64, 100, 128, 512]))
    msizes = draw(reshape_st(N, max_dims=2))
    stat = draw_onchip(draw, rig, sdt, K, kstart, ssizes, writable=False, spaces=(Space.SBUF,))
    mov = draw_onchip(draw, rig, mdt, K, kstart, msizes, writable=False, spaces=(Space.SBUF,))
    ddt = DType.bfloat16 if profile.psum_bf16_output and draw(st.booleans()) else DType.float32
    bank = draw(st.integers(0, 7)) * profile.psum_bank_bytes
    dsizes = draw(reshape_st(N, max_dims=2))
    free = draw(layout_st(dsizes, True, (1,)))
    lo, hi = extent(free)
    assume((hi - lo) * ddt.itemsize <= profile.psum_bank_bytes)
    dst = AP(Space.PSUM, ddt, M, free, mstart, bank - lo * ddt.itemsize)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    s = rig.fill(stat, seed, specials=False, scale=1.0)
    m = rig.fill(mov, seed + 1, specials=False, scale=1.0)
    prev = rig.fill(dst, seed + 2, specials=False, scale=10.0)
    accumulate = draw(st.booleans())
    rig.run(isa.Matmul(dst, stat, mov, accumulate=accumulate))
    a, b = f64(s).reshape(K, M), f64(m).reshape(K, N)
    want = (a.T @ b).reshape(dst.shape)
    bound = (np.abs(a).T @ np.abs(b)).reshape(dst.shape)
    if accumulate:
        want = want + f64(prev)
        bound = bound + np.abs(f64(prev))
    got = f64(rig.get(dst))
    tol = (2.0 ** -7 if ddt is DType.bfloat16 else 1e-5) * bound + 1e-30
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) - tol)


def test_matmuls_of_many_shapes_share_one_work_buffer_per_role():
    """The core's work arrays are one per role, grown to the largest size (one per shape would grow with every new
    shape a job runs); results are the matmul's whatever the shapes before."""
    rig = Rig()
    rig.core.scratchpad._arrays.clear()
    for i, (K, M, N) in enumerate([(128, 128, 512), (7, 3, 5), (64, 100, 300), (128, 1, 1), (33, 128, 511)]):
        stat, mov = AP.sbuf("bfloat16", K, (M,)), AP.sbuf("bfloat16", K, (N,), offset=256)
        dst = AP.psum("float32", M, (N,))
        a = random_values(i, DType.bfloat16, (K, M), specials=False)
        b = random_values(i + 10, DType.bfloat16, (K, N), specials=False)
        rig.put(stat, a)
        rig.put(mov, b)
        rig.run(isa.Matmul(dst, stat, mov))
        np.testing.assert_allclose(f64(rig.get(dst)), f64(a).T @ f64(b), rtol=1e-4, atol=1e-3)
    sizes = {k[0]: a.size for k, a in rig.core.scratchpad._arrays.items()}
    assert len(rig.core.scratchpad._arrays) == 3
    assert sizes == {"mm_stationary": 128 * 128, "mm_moving": 128 * 512, "mm_result": 128 * 512}


def test_matmul_fp32_accumulates_across_instructions_and_propagates_nan():
    rig = Rig()
    st_ = AP.sbuf("bfloat16", 128, (128,))
    mv = AP.sbuf("bfloat16", 128, (512,), offset=256)
    dst = AP.psum("float32", 128, (512,), offset=2048)
    a = random_values(1, DType.bfloat16, (128, 128), specials=False)
    b = random_values(2, DType.bfloat16, (128, 512), specials=False)
    b[3, 7] = np.nan
    rig.put(st_, a)
    rig.put(mv, b)
    rig.run(*[isa.Matmul(dst, st_, mv, accumulate=i > 0) for i in range(4)])
    want = 4 * (f64(a).T @ f64(b))
    got = f64(rig.get(dst))
    assert np.isnan(got[:, 7]).all()
    got[:, 7] = want[:, 7] = 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@SETTINGS
@given(st.data())
def test_transpose(data):
    draw = data.draw
    rig = Rig()
    engine = draw(st.sampled_from([Engine.TENSOR, Engine.VECTOR]))
    limit = 128 if engine is Engine.TENSOR else 32
    P, pstart = draw(partitions_st(limit))
    F = draw(st.integers(1, limit))
    sdt = draw(st.sampled_from(ENGINE_TYPES if engine is Engine.VECTOR else MM_TYPES + [DType.float32]))
    if engine is Engine.TENSOR:
        ddt = draw(st.sampled_from([sdt, DType.float32]))
        sspace, dspace = (Space.SBUF,), (Space.PSUM,)
    else:
        ddt = draw(st.sampled_from([sdt, sdt, *ENGINE_TYPES]))
        sspace = dspace = (Space.SBUF, Space.PSUM)
    src = draw_onchip(draw, rig, sdt, P, pstart, draw(reshape_st(F, 2)), writable=False, spaces=sspace)
    dstart = draw(st.sampled_from(allowed_starts(F)))
    dst = draw_onchip(draw, rig, ddt, F, dstart, draw(reshape_st(P, 2)), writable=True, spaces=dspace)
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)))
    rig.run(isa.Transpose(dst, src, engine=engine))
    t = x.reshape(P, F).T.reshape(dst.shape)
    want = t.copy() if sdt is ddt else ref_cast(t.astype(F32), ddt)
    assert_same(rig.get(dst), want)


def test_transpose_is_bit_exact_for_nan_payloads():
    rig = Rig()
    x = np.array([[0x7FC1, 0xFF81], [0x7F80, 0x0001]], np.uint16).view(ml_dtypes.bfloat16)
    src = AP.sbuf("bfloat16", 2, (2,))
    rig.put(src, x)
    dst = AP.psum("bfloat16", 2, (2,))
    rig.run(isa.Transpose(dst, src))
    np.testing.assert_array_equal(rig.get(dst).view(np.uint16), x.view(np.uint16).T)


# ================================================================================================
# ScalarE: activation, erf
# ================================================================================================
_verf = np.vectorize(math.erf, otypes=[np.float64])
_verfc = np.vectorize(math.erfc, otypes=[np.float64])


def _ref_sigmoid(t):
    return 1.0 / (1.0 + np.exp(-t))


REF_ACT = {
    Act.identity: lambda t: t,
    Act.exp: np.exp,
    Act.log: np.log,
    Act.tanh: np.tanh,
    Act.sigmoid: _ref_sigmoid,
    Act.relu: lambda t: np.where(np.isnan(t), np.nan, np.where(t > 0, t, 0.0)),
    Act.gelu: lambda t: 0.5 * t * _verfc(-t / math.sqrt(2.0)),
    Act.gelu_tanh: lambda t: 0.5 * t * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3))),
    Act.silu: lambda t: t * _ref_sigmoid(t),
    Act.sqrt: np.sqrt,
    Act.rsqrt: lambda t: 1.0 / np.sqrt(t),
    Act.reciprocal: lambda t: 1.0 / t,
    Act.square: lambda t: t * t,
    Act.abs: np.abs,
    Act.sign: np.sign,
    Act.sin: np.sin,
    Act.cos: np.cos,
    Act.softplus: lambda t: np.logaddexp(0.0, t),
    Act.erf: _verf,
}

# float32 evaluation may lose relative accuracy where the function cancels; atol scales with |t|
ACT_ATOL = {Act.gelu_tanh: 1e-6, Act.silu: 1e-6, Act.sin: 1e-6, Act.cos: 1e-6, Act.softplus: 1e-7}
DST_RTOL = {DType.float32: 4e-6, DType.bfloat16: 2 ** -7, DType.float16: 2 ** -10}


def activation_input(x, scale, bias):
    """FP32 argument of f: round(round(x * scale) + bias)."""
    with np.errstate(all="ignore"):
        t = (f64(x) * f64(scale)).astype(F32)
        if bias is not None:
            t = (f64(t) + f64(bias)).astype(F32)
    return t


@SETTINGS
@given(st.data())
def test_activation(data):
    draw = data.draw
    rig = Rig()
    func = draw(st.sampled_from(list(Act)))
    P, start = draw(partitions_st())
    sizes = draw(sizes_st(max_size=5))
    sdt = draw(st.sampled_from(FLOATS + [DType.float8_e4m3fn, DType.int16]))
    ddt = draw(st.sampled_from(list(DST_RTOL)))
    src = draw_onchip(draw, rig, sdt, P, start, sizes, writable=False)
    dst = draw_onchip(draw, rig, ddt, P, start, draw(reshape_st(math.prod(sizes))), writable=True)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    big_args = func in (Act.sin, Act.cos)
    x = rig.fill(src, seed, specials=not big_args)
    kind = draw(st.sampled_from(["one", "imm", "ap"]))
    if kind == "ap":
        scale = draw_onchip(draw, rig, DType.float32, P, start, (1,), writable=False)
        scale_v = rig.fill(scale, seed + 1, specials=False)
    else:
        scale = 1.0 if kind == "one" else draw(st.sampled_from([0.5, -2.0, 1e-3, 3.0]))
        scale_v = np.float32(scale)
    bias, bias_v = None, None
    if draw(st.booleans()):
        bias = draw_onchip(draw, rig, draw(st.sampled_from([DType.float32, DType.bfloat16])), P, start, (1,),
                           writable=False)
        bias_v = rig.fill(bias, seed + 2, specials=False)
    rig.run(isa.Activation(dst, src, func, scale=scale, bias=bias))
    bshape = (P,) + (1,) * len(sizes)
    t = activation_input(x, np.reshape(scale_v, bshape) if kind == "ap" else scale_v,
                         None if bias is None else np.reshape(bias_v, bshape))
    if big_args:
        t = np.where(np.abs(t) > 1e4, np.float32(0), t)
        assume(np.array_equal(t, activation_input(x, np.reshape(scale_v, bshape) if kind == "ap" else scale_v,
                                                  None if bias is None else np.reshape(bias_v, bshape)),
                              equal_nan=True))
    with np.errstate(all="ignore"):
        want = REF_ACT[func](f64(t)).reshape(dst.shape)
    got = rig.get(dst)
    with np.errstate(all="ignore"):
        atol = ACT_ATOL.get(func, 0.0) * np.maximum(1.0, np.abs(f64(t))).reshape(dst.shape)
    assert_close(got, ref_cast(want, ddt), rtol=DST_RTOL[ddt], atol=atol, what=f"{func.value}")


@SETTINGS
@given(st.data())
def test_activation_reduce(data):
    draw = data.draw
    rig = Rig()
    func = draw(st.sampled_from([Act.identity, Act.exp, Act.square, Act.gelu, Act.tanh, Act.relu]))
    P, start = draw(partitions_st())
    sizes = draw(sizes_st(max_size=6))
    src = draw_onchip(draw, rig, DType.bfloat16, P, start, sizes, writable=False)
    dst = draw_onchip(draw, rig, DType.bfloat16, P, start, sizes, writable=True)
    rdt = draw(st.sampled_from([DType.float32, DType.bfloat16]))
    red = draw_onchip(draw, rig, rdt, P, start, (1,), writable=True)
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)), specials=False, scale=1.0)
    rig.run(isa.Activation(dst, src, func, scale=0.5, reduce_dst=red))
    y = REF_ACT[func](f64(activation_input(x, np.float32(0.5), None)))
    want = y.reshape(P, -1).sum(axis=1).reshape(P, 1)
    bound = np.abs(y).reshape(P, -1).sum(axis=1).reshape(P, 1)
    got = f64(rig.get(red))
    tol = (2.0 ** -7 if rdt is DType.bfloat16 else 1e-5) * bound + 1e-30
    assert np.all(np.abs(got - want) <= tol)
    assert_close(rig.get(dst), ref_cast(y.reshape(dst.shape), DType.bfloat16), rtol=2 ** -7)


def test_erf_matches_math_erf():
    xs = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-300, 1, 500), -np.logspace(-40, 0.8, 500),
                         [0.0, -0.0, np.inf, -np.inf, 5e-324, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    want = np.array([math.erf(v) for v in xs])
    got = erf(xs)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert np.isnan(erf(np.array([np.nan]))).all()
    assert math.copysign(1.0, erf(np.array([-0.0]))[0]) == -1.0
    ts = np.concatenate([np.linspace(-3, 30, 30001), [np.inf, -np.inf]])
    want_c = np.array([math.erfc(v) for v in ts])
    np.testing.assert_allclose(erfc(ts), want_c, rtol=2e-13, atol=1e-300)
    # as FP32 results (ScalarE's erf), every value matches math.erf rounded to FP32
    x32 = np.random.default_rng(0).standard_normal(20000).astype(F32) * 2
    np.testing.assert_allclose(erf(x32).astype(F32), np.array([math.erf(v) for v in f64(x32)]).astype(F32),
                               rtol=1e-6, atol=1e-7)


# ================================================================================================
# Vector / GpSimd ALU: a tagged-value reference ("i": exact Python ints, "f": FP32 values)
# ================================================================================================
INT_EXACT = [Alu.add, Alu.subtract, Alu.multiply, Alu.max, Alu.min, Alu.abs_max, Alu.mod, Alu.equal,
             Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal, Alu.logical_and,
             Alu.logical_or, Alu.logical_xor, Alu.bypass]


def _py_int_op(op: Alu, a: int, b: int) -> int:
    if op is Alu.add:
        return a + b
    if op is Alu.subtract:
        return a - b
    if op is Alu.multiply:
        return a * b
    if op is Alu.max:
        return max(a, b)
    if op is Alu.min:
        return min(a, b)
    if op is Alu.abs_max:
        return max(abs(a), abs(b))
    if op is Alu.mod:  # C fmod: truncated division, sign of the dividend; x mod 0 -> 0
        if b == 0:
            return 0
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    if op is Alu.bypass:
        return a
    return int({Alu.equal: a == b, Alu.not_equal: a != b, Alu.greater: a > b, Alu.greater_equal: a >= b,
                Alu.less: a < b, Alu.less_equal: a <= b, Alu.logical_and: a != 0 and b != 0,
                Alu.logical_or: a != 0 or b != 0, Alu.logical_xor: (a != 0) != (b != 0)}[op])


def _wrap32(v: int, signed: bool) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if signed and v >= 1 << 31 else v


def _py_bitwise(op: Alu, a: int, b: int, signed: bool) -> int:
    if op is Alu.bitwise_and:
        r = a & b
    elif op is Alu.bitwise_or:
        r = a | b
    elif op is Alu.bitwise_xor:
        r = a ^ b
    elif op is Alu.left_shift:
        r = a << min(max(b, 0), 63)
    else:
        r = a >> min(max(b, 0), 63)
    return _wrap32(r, signed)


class Val:
    """Reference values: tag "i" (object array of Python ints) or "f" (float32 array)."""

    def __init__(self, tag: str, v):
        self.tag, self.v = tag, np.asarray(v, dtype=object if tag == "i" else F32)

    @classmethod
    def load(cls, x: np.ndarray, int_mode: bool = False) -> Val:
        """Integer dtypes load exactly (ref_binary decides between exact and FP32 arithmetic)."""
        if x.dtype.kind in "iub":
            return cls("i", np.vectorize(int, otypes=[object])(x.astype(np.int64)))
        return cls("f", x.astype(F32))

    @classmethod
    def imm(cls, value: float, int_mode: bool, op: Alu | None) -> Val:
        exact = float(value).is_integer() and -(2 ** 31) <= value < 2 ** 32
        if (op is not None and op.is_bitwise) or (int_mode and exact):
            return cls("i", int(value))
        return cls("f", np.float32(value))

    def as_f(self) -> np.ndarray:
        if self.tag == "f":
            return self.v
        return np.vectorize(float, otypes=[np.float64])(self.v).astype(F32)

    def as_i(self) -> np.ndarray:
        if self.tag == "i":
            return self.v
        return np.vectorize(int, otypes=[object])(ref_to_int(self.v, DType.int32).astype(np.int64))


def ref_binary(op: Alu, a: Val, b: Val, int_mode: bool, signed: bool) -> Val:
    if op.is_bitwise:
        f = np.frompyfunc(lambda x, y: _py_bitwise(op, x, y, signed), 2, 1)
        return Val("i", f(a.as_i(), b.as_i()))
    if int_mode and a.tag == "i" and b.tag == "i" and op in INT_EXACT:
        f = np.frompyfunc(lambda x, y: _py_int_op(op, x, y), 2, 1)
        return Val("i", f(a.v, b.v))
    return Val("f", ref_alu(op, a.as_f(), b.as_f()))


def ref_store(r: Val, dst: DType, shape) -> np.ndarray:
    v = np.reshape(r.v, shape)  # callers give full-size values
    if r.tag == "i":
        if dst.kind in "iu":
            return ref_int_wrap(v, dst)
        return ref_cast(np.vectorize(float, otypes=[np.float64])(v).astype(F32), dst)
    return ref_cast(v, dst)


@st.composite
def alu_case(draw, ops_kind: str):
    """(engine, op, operand dtypes, dst dtype, int_mode) for 'float', 'int' or 'bitwise' cases."""
    if ops_kind == "float":
        engine = draw(st.sampled_from([Engine.VECTOR, Engine.VECTOR, Engine.GPSIMD]))
        op = draw(st.sampled_from(FLOAT_ALU))
        types = FLOATS + FP8 + INTS
        return engine, op, draw(st.sampled_from(types)), draw(st.sampled_from(FLOATS + FP8)), \
            draw(st.sampled_from(types))
    if ops_kind == "int":
        op = draw(st.sampled_from(INT_EXACT + [Alu.divide, Alu.pow]))
        return Engine.GPSIMD, op, draw(st.sampled_from(INTS)), draw(st.sampled_from(INTS)), \
            draw(st.sampled_from(INTS))
    op = draw(st.sampled_from(BITWISE))
    return draw(st.sampled_from([Engine.VECTOR, Engine.GPSIMD])), op, draw(st.sampled_from(INTS)), \
        draw(st.sampled_from(INTS)), draw(st.sampled_from(INTS))


@SETTINGS
@given(st.data(), st.sampled_from(["float", "float", "int", "bitwise"]))
def test_tensor_tensor(data, kind):
    draw = data.draw
    rig = Rig()
    engine, op, adt, bdt, ddt = draw(alu_case(kind))
    P, start = draw(partitions_st())
    dsizes = draw(sizes_st())
    n = math.prod(dsizes)
    spaces = engine_spaces(engine)
    a = draw_onchip(draw, rig, adt, P, start, draw(reshape_st(n)), writable=False, spaces=spaces)
    b = draw_onchip(draw, rig, bdt, P, start, draw(reshape_st(n)), writable=False, spaces=spaces)
    dst = draw_onchip(draw, rig, ddt, P, start, dsizes, writable=True, spaces=spaces)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    x, y = rig.fill(a, seed), rig.fill(b, seed + 1)
    if op in (Alu.left_shift, Alu.right_shift):
        y = rig.fill(b, seed + 1, scale=None)
        y = np.abs(y.astype(np.int64)) % 40
        rig.put(b, y.astype(bdt.numpy))
        y = rig.get(b)
    rig.run(isa.TensorTensor(dst, a, b, op, engine=engine))
    int_mode = engine is Engine.GPSIMD and all(d.kind in "iu" for d in (adt, bdt, ddt))
    r = ref_binary(op, Val.load(x.reshape(dst.shape), int_mode), Val.load(y.reshape(dst.shape), int_mode),
                   int_mode, adt.kind == "i")
    want = ref_store(r, ddt, dst.shape)
    got = rig.get(dst)
    assert_same(got, want, f"{engine.value} {op.value}", signed_zero=op not in (Alu.max, Alu.min))


@SETTINGS
@given(st.data(), st.sampled_from(["float", "float", "int", "bitwise"]))
def test_tensor_scalar(data, kind):
    draw = data.draw
    engine, op0, sdt, odt, ddt = draw(alu_case(kind))
    if kind == "float":
        engine = draw(st.sampled_from([Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD]))
    rig = Rig(TRN3 if engine is Engine.SCALAR else TRN2)  # ScalarE tensor_scalar is native from NC-v4
    two = draw(st.booleans())
    op1 = draw(st.sampled_from(FLOAT_ALU if kind == "float" else INT_EXACT + BITWISE if kind == "int"
                               else BITWISE + INT_EXACT)) if two else None
    P, start = draw(partitions_st())
    ssizes = draw(sizes_st())
    spaces = engine_spaces(engine)
    src = draw_onchip(draw, rig, sdt, P, start, ssizes, writable=False, spaces=spaces)
    dst = draw_onchip(draw, rig, ddt, P, start, draw(reshape_st(math.prod(ssizes))), writable=True, spaces=spaces)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    x = rig.fill(src, seed)
    bshape = (P,) + (1,) * len(ssizes)

    def operand(op, k):
        shifts = op in (Alu.left_shift, Alu.right_shift)
        if draw(st.booleans()):
            ap = draw_onchip(draw, rig, odt, P, start, (1,), writable=False, spaces=spaces)
            v = rig.fill(ap, seed + k)
            if shifts:
                rig.put(ap, (np.abs(v.astype(np.int64)) % 40).astype(odt.numpy))
                v = rig.get(ap)
            return ap, v.reshape(bshape)
        if op.is_bitwise or kind != "float":
            imm = float(draw(st.integers(0, 40) if shifts else st.integers(-1000, 1000)))
        else:
            imm = draw(st.sampled_from([0.0, -0.0, 1.0, -2.5, 0.1, 3.0, 1e30, np.inf, np.nan, 7.0]))
        return imm, None

    o0, v0 = operand(op0, 1)
    o1, v1 = operand(op1, 2) if two else (None, None)
    rev0, rev1 = draw(st.booleans()), draw(st.booleans())
    rig.run(isa.TensorScalar(dst, src, op0, o0, rev0, op1, o1, rev1, engine=engine))
    int_mode = engine is Engine.GPSIMD and all(ap.dtype.kind in "iu" for ap in (src, dst, o0, o1)
                                               if isinstance(ap, AP))
    signed = sdt.kind == "i"

    def val(o, v, op):
        return Val.load(v, int_mode) if isinstance(o, AP) else Val.imm(o, int_mode, op)

    xv = Val.load(x, int_mode)
    a0 = val(o0, v0, op0)
    r = ref_binary(op0, a0, xv, int_mode, signed) if rev0 else ref_binary(op0, xv, a0, int_mode, signed)
    if two:
        a1 = val(o1, v1, op1)
        r = ref_binary(op1, a1, r, int_mode, signed) if rev1 else ref_binary(op1, r, a1, int_mode, signed)
    r.v = np.broadcast_to(r.v, x.shape)
    got = rig.get(dst)
    assert_same(got, ref_store(r, ddt, dst.shape), f"{engine.value} {op0} {op1}",
                signed_zero=not {op0, op1} & {Alu.max, Alu.min})


@SETTINGS
@given(st.data(), st.sampled_from(["float", "float", "bitwise"]))
def test_scalar_tensor_tensor(data, kind):
    """dst = op1(op0(src, operand0), operand1) on VectorE in FP32, operand0 an immediate or a [P, 1] column."""
    draw = data.draw
    rig = Rig()
    _, op0, sdt, odt, ddt = draw(alu_case(kind))
    tdt = draw(st.sampled_from(FLOATS + FP8 + INTS if kind == "float" else INTS))
    op1 = draw(st.sampled_from(FLOAT_ALU if kind == "float" else BITWISE + INT_EXACT))
    if kind == "float" and draw(st.booleans()):  # the documented fast case
        op0, op1, sdt, tdt = Alu.subtract, Alu.multiply, DType.bfloat16, DType.bfloat16
    P, start = draw(partitions_st())
    ssizes = draw(sizes_st())
    n = math.prod(ssizes)
    src = draw_onchip(draw, rig, sdt, P, start, ssizes, writable=False)
    other = draw_onchip(draw, rig, tdt, P, start, draw(reshape_st(n)), writable=False)
    dst = draw_onchip(draw, rig, ddt, P, start, draw(reshape_st(n)), writable=True)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    x = rig.fill(src, seed)
    y = rig.fill(other, seed + 3)
    if op1 in (Alu.left_shift, Alu.right_shift):
        rig.put(other, (np.abs(y.astype(np.int64)) % 40).astype(tdt.numpy))
        y = rig.get(other)
    bshape = (P,) + (1,) * len(ssizes)
    shifts = op0 in (Alu.left_shift, Alu.right_shift)
    if draw(st.booleans()):
        o0 = draw_onchip(draw, rig, odt, P, start, (1,), writable=False)
        v0 = rig.fill(o0, seed + 1)
        if shifts:
            rig.put(o0, (np.abs(v0.astype(np.int64)) % 40).astype(odt.numpy))
            v0 = rig.get(o0)
        a0 = Val.load(v0.reshape(bshape), False)
    else:
        if op0.is_bitwise:
            o0 = float(draw(st.integers(0, 40) if shifts else st.integers(-1000, 1000)))
        else:
            o0 = draw(st.sampled_from([0.0, -0.0, 1.0, -2.5, 0.1, 3.0, 1e30, np.inf, np.nan, 7.0]))
        a0 = Val.imm(o0, False, op0)
    rev0, rev1 = draw(st.booleans()), draw(st.booleans())
    rig.run(isa.ScalarTensorTensor(dst, src, op0, o0, op1, other, rev0, rev1))
    signed = sdt.kind == "i"
    xv = Val.load(x, False)
    r = ref_binary(op0, a0, xv, False, signed) if rev0 else ref_binary(op0, xv, a0, False, signed)
    r.v = np.broadcast_to(r.v, x.shape).reshape(dst.shape)
    yv = Val.load(y.reshape(dst.shape), False)
    r = ref_binary(op1, yv, r, False, signed) if rev1 else ref_binary(op1, r, yv, False, signed)
    assert_same(rig.get(dst), ref_store(r, ddt, dst.shape), f"{op0} {op1}",
                signed_zero=not {op0, op1} & {Alu.max, Alu.min})


def test_scalar_tensor_tensor_keeps_the_intermediate_in_fp32():
    rig = Rig()
    src, other = AP.sbuf("bfloat16", 2, (4,)), AP.sbuf("bfloat16", 2, (4,), offset=64)
    dst = AP.sbuf("bfloat16", 2, (4,), offset=128)
    x = np.array([[1.0, 3.0, 100.0, -7.0], [0.5, 0.25, 2.0, 8.0]], ml_dtypes.bfloat16)
    y = np.array([[3.0, 3.0, 3.0, 3.0], [1.0, 1.0, 1.0, 1.0]], ml_dtypes.bfloat16)
    rig.put(src, x)
    rig.put(other, y)
    rig.run(isa.ScalarTensorTensor(dst, src, Alu.subtract, 1.0 / 3.0, Alu.multiply, other))
    want = ((f64(x).astype(F32) - F32(1.0 / 3.0)).astype(F32) * f64(y).astype(F32)).astype(ml_dtypes.bfloat16)
    assert_same(rig.get(dst), want)


def test_bitwise_immediate_must_be_integral():
    rig = Rig()
    t = AP.sbuf("int32", 4, (4,))
    with pytest.raises(ProgramError, match="bitwise immediate"):
        rig.program(isa.TensorScalar(t, t, Alu.bitwise_and, 1.5))


REDUCE = [Alu.add, Alu.max, Alu.min, Alu.multiply, Alu.abs_max]


@SETTINGS
@given(st.data())
def test_tensor_reduce(data):
    draw = data.draw
    rig = Rig()
    op = draw(st.sampled_from(REDUCE))
    engine = draw(st.sampled_from([Engine.VECTOR, Engine.GPSIMD]))
    int_case = draw(st.integers(0, 3)) == 0
    sdt = draw(st.sampled_from(INTS if int_case else FLOATS + FP8))
    ddt = draw(st.sampled_from(INTS if int_case else FLOATS))
    P, start = draw(partitions_st())
    sizes = draw(sizes_st(max_dims=4, max_size=5))
    axes = tuple(draw(st.lists(st.integers(0, len(sizes) - 1), min_size=1, max_size=len(sizes), unique=True)))
    kept = [s for d, s in enumerate(sizes) if d not in axes]
    spaces = engine_spaces(engine)
    src = draw_onchip(draw, rig, sdt, P, start, sizes, writable=False, spaces=spaces)
    dst = draw_onchip(draw, rig, ddt, P, start, draw(reshape_st(math.prod(kept))), writable=True, spaces=spaces)
    int_mode = engine is Engine.GPSIMD and int_case
    lossy = op in (Alu.add, Alu.multiply) and not int_mode
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)), specials=not lossy, scale=1.0 if lossy else None)
    if op is Alu.multiply and int_case:
        rig.put(src, (x.astype(np.int64) % 5).astype(sdt.numpy))  # keep products well inside int64
        x = rig.get(src)
    negate = draw(st.booleans())
    rig.run(isa.TensorReduce(dst, src, op, axes, negate, engine=engine))
    np_axes = tuple(a + 1 for a in axes)
    got = rig.get(dst)
    if int_mode:
        v = x.astype(object)
        fn = {Alu.add: np.sum, Alu.multiply: np.prod, Alu.max: np.max, Alu.min: np.min}.get(op)
        r = fn(v, axis=np_axes) if fn else np.max(np.abs(v), axis=np_axes)
        r = -r if negate else r
        assert_same(got, ref_int_wrap(np.asarray(r, dtype=object).reshape(dst.shape), ddt))
        return
    xf = f64(x.astype(F32))
    with np.errstate(all="ignore"):
        if op is Alu.add:
            r, bound = xf.sum(axis=np_axes), np.abs(xf).sum(axis=np_axes)
        elif op is Alu.multiply:
            r = xf.prod(axis=np_axes)
            bound = np.abs(r)
        elif op is Alu.max:
            r = xf.max(axis=np_axes)
        elif op is Alu.min:
            r = xf.min(axis=np_axes)
        else:
            r = np.abs(xf).max(axis=np_axes)
    r = (-r if negate else r).reshape(dst.shape)
    if lossy:
        g = f64(got)
        rt = {DType.float32: 2e-5, DType.bfloat16: 2 ** -7, DType.float16: 2 ** -10}.get(ddt, 2e-5)
        bound = np.asarray(bound).reshape(dst.shape)
        w = f64(ref_cast(r, ddt))
        with np.errstate(all="ignore"):
            ok = (np.abs(g - w) <= rt * bound + (1.0 if ddt.kind in "iu" else 1e-30)) | (g == w)
        ok |= np.isnan(g) & np.isnan(w)
        assert ok.all(), (g[~ok][:4], w[~ok][:4])
    else:
        assert_same(got, ref_cast(r.astype(F32), ddt), signed_zero=op not in (Alu.max, Alu.min))


@SETTINGS
@given(st.data())
def test_tensor_copy(data):
    draw = data.draw
    rig = Rig()
    engine = draw(st.sampled_from([Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD]))
    sdt = draw(st.sampled_from(ENGINE_TYPES + [DType.bool_]))
    ddt = draw(st.sampled_from([sdt] + ENGINE_TYPES + [DType.bool_]))
    P, start = draw(partitions_st())
    sizes = draw(sizes_st(max_dims=4, max_size=5))
    spaces = engine_spaces(engine)
    src = draw_onchip(draw, rig, sdt, P, start, sizes, writable=False, spaces=spaces)
    dst = draw_onchip(draw, rig, ddt, P, start, draw(reshape_st(math.prod(sizes))), writable=True, spaces=spaces)
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)))
    rig.run(isa.TensorCopy(dst, src, engine=engine))
    xs = x.reshape(dst.shape)
    if sdt is ddt:
        want = xs.copy()
    elif engine is Engine.GPSIMD and sdt.kind in "iub" and ddt.kind in "iub":
        want = ref_int_wrap(xs.astype(np.int64), ddt) if ddt.kind != "b" else xs != 0
    else:
        want = ref_cast(xs.astype(F32), ddt)
    assert_same(rig.get(dst), want)


# ================================================================================================
# memset, iota, affine_select, select
# ================================================================================================
MEMSET_VALUES = [0.0, -0.0, 1.0, -1.5, 2.5, 3.5, 1e10, -1e10, np.inf, -np.inf, np.nan, 65504.0, 1e-40, 300.0,
                 2.0 ** 31 - 1, 16777217.0, -129.0]


@SETTINGS
@given(st.data())
def test_memset(data):
    draw = data.draw
    rig = Rig()
    engine = draw(st.sampled_from([Engine.VECTOR, Engine.GPSIMD]))
    dt = draw(st.sampled_from(ENGINE_TYPES + [DType.bool_]))
    value = draw(st.sampled_from(MEMSET_VALUES))
    P, start = draw(partitions_st())
    dst = draw_onchip(draw, rig, dt, P, start, draw(sizes_st(max_dims=4)), writable=True,
                      spaces=engine_spaces(engine))
    rig.run(isa.Memset(dst, value, engine=engine))
    if dt.kind in "iu":
        want = ref_to_int(np.full(dst.shape, value), dt)
    elif dt.kind == "b":
        want = np.full(dst.shape, value != 0)
    else:
        want = ref_cast(np.full(dst.shape, np.float32(value)), dt)
    assert_same(rig.get(dst), want)


def py_affine(shape, steps, offset, cm):
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        out[index] = offset + cm * index[0] + sum(s * i for s, i in zip(steps, index[1:]))
    return out


@SETTINGS
@given(st.data())
def test_iota(data):
    draw = data.draw
    rig = Rig()
    dt = draw(st.sampled_from([DType.int32, DType.float32, DType.bfloat16, DType.int8, DType.uint16,
                               DType.float16, DType.uint32]))
    P, start = draw(partitions_st())
    sizes = draw(sizes_st(max_dims=3, max_size=7))
    dst = draw_onchip(draw, rig, dt, P, start, sizes, writable=True, spaces=(Space.SBUF,))
    steps = tuple(draw(st.integers(-300, 300)) for _ in sizes)
    offset = draw(st.sampled_from([0, 5, -7, 2 ** 24 + 1, -(2 ** 31), 2 ** 31 + 3]))
    cm = draw(st.integers(-1000, 1000))
    rig.run(isa.Iota(dst, steps, offset, cm))
    v = py_affine(dst.shape, steps, offset, cm)
    if dt.kind in "iu":
        want = ref_int_wrap(v, dt)
    else:
        want = ref_cast(np.vectorize(float, otypes=[np.float64])(v).astype(F32), dt)
    assert_same(rig.get(dst), want)


CMPS = [Alu.equal, Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal]


@SETTINGS
@given(st.data())
def test_affine_select(data):
    draw = data.draw
    rig = Rig()
    sdt = draw(st.sampled_from(FLOATS + INTS))
    ddt = draw(st.sampled_from([sdt] + FLOATS + INTS))
    P, start = draw(partitions_st())
    dsizes = draw(sizes_st(max_dims=3, max_size=6))
    src = draw_onchip(draw, rig, sdt, P, start, draw(reshape_st(math.prod(dsizes))), writable=False,
                      spaces=(Space.SBUF,))
    dst = draw_onchip(draw, rig, ddt, P, start, dsizes, writable=True, spaces=(Space.SBUF,))
    steps = tuple(draw(st.integers(-3, 3)) for _ in dsizes)
    offset, cm = draw(st.integers(-20, 20)), draw(st.integers(-2, 2))
    cmp = draw(st.sampled_from(CMPS))
    fv = draw(st.sampled_from([-np.inf, -1e30, 0.0, -9.0, 7.0, 2.5, np.nan]))
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)))
    rig.run(isa.AffineSelect(dst, src, steps, cmp, fv, offset, cm))
    aff = py_affine(dst.shape, steps, offset, cm)
    cond = np.frompyfunc(lambda v: _py_int_op(cmp, v, 0), 1, 1)(aff).astype(bool)
    xs = x.reshape(dst.shape)
    if sdt.kind in "iu" and ddt.kind in "iu" and float(fv).is_integer() and abs(fv) < 2 ** 31:
        want = ref_int_wrap(np.where(cond, xs.astype(np.int64).astype(object), int(fv)), ddt)
    else:
        want = ref_cast(np.where(cond, xs.astype(F32), np.float32(fv)), ddt)
    assert_same(rig.get(dst), want)


@SETTINGS
@given(st.data())
def test_select(data):
    draw = data.draw
    rig = Rig()
    P, start = draw(partitions_st())
    dsizes = draw(sizes_st())
    n = math.prod(dsizes)
    pdt = draw(st.sampled_from(FLOATS + INTS + [DType.uint8]))
    tdt = draw(st.sampled_from(FLOATS + INTS))
    ddt = draw(st.sampled_from([tdt, tdt] + FLOATS + INTS))
    pred = draw_onchip(draw, rig, pdt, P, start, draw(reshape_st(n)), writable=False)
    on_true = draw_onchip(draw, rig, tdt, P, start, draw(reshape_st(n)), writable=False)
    dst = draw_onchip(draw, rig, ddt, P, start, dsizes, writable=True)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    pv = rig.fill(pred, seed)
    rig.put(pred, np.where(np.random.default_rng(seed).random(pred.shape) < 0.4, 0, pv).astype(pdt.numpy))
    pv = rig.get(pred)
    tv = rig.fill(on_true, seed + 1)
    if draw(st.booleans()):
        fdt = draw(st.sampled_from([ddt] + FLOATS + INTS))
        on_false = draw_onchip(draw, rig, fdt, P, start, draw(reshape_st(n)), writable=False)
        fv = rig.fill(on_false, seed + 2).reshape(dst.shape)
    else:
        on_false = draw(st.sampled_from([0.0, -1e30, np.nan, 3.0, -2.5, 1e10]))
        fdt, fv = None, None
    rig.run(isa.Select(dst, pred, on_true, on_false))
    cond = pv.astype(F32).reshape(dst.shape) != 0
    tvs = tv.reshape(dst.shape)
    native = tdt is ddt and (fdt is None or fdt is ddt)
    if native:
        fb = (bits(fv) if fv is not None else bits(ref_cast(np.array(np.float64(on_false)), ddt)))
        want = np.where(cond, bits(tvs), fb).view(ddt.numpy)
    else:
        f = fv.astype(F32) if fv is not None else np.float32(on_false)
        want = ref_cast(np.where(cond, tvs.astype(F32), f), ddt)
    assert_same(rig.get(dst), want)


def test_select_and_compare_loops_read_before_write_on_any_layout():
    """Bit-exact selects and comparisons into numpy-native destinations run as element loops (destination equal to
    an operand or apart from it; a partly overlapping one takes the whole-array form): every case reads its
    sources before writing, with broadcast predicates, reversed operands and short inner dims."""
    rig = Rig()
    rng = np.random.default_rng(7)
    P = 4  # views of 4 free dims [2, 3, 2, 5], the innermost short
    vals = rng.integers(-3, 4, (P, 60)).astype(F32)
    vals[vals == 3] = np.nan
    buf = AP.sbuf("float32", P, (60,))
    other = AP.sbuf("float32", P, (60,), offset=256)
    rig.put(buf, vals)
    rig.put(other, vals[:, ::-1] * 2)
    view = AP(Space.SBUF, DType.float32, P, ((2, 30), (3, 10), (2, 5), (5, 1)), 0, 0)
    rev = AP(Space.SBUF, DType.float32, P, ((2, -30), (3, -10), (2, -5), (5, -1)), 0, 256 + 59 * 4)
    pred = AP(Space.SBUF, DType.uint8, P, ((2, 0), (3, 10), (2, 5), (5, 1)), 0, 1024)  # broadcast dim
    pv = rng.integers(0, 2, (P, 30)).astype(np.uint8)
    rig.put(AP.sbuf("uint8", P, (30,), offset=1024), pv)
    cond = np.broadcast_to(pv.reshape(P, 1, 3, 2, 5), (P, 2, 3, 2, 5)) != 0
    want = np.where(cond, rig.get(rev), rig.get(view))
    rig.run(isa.Select(view, pred, rev, view))  # in place: dst is on_false
    assert_same(rig.get(view), want)
    for op, ref in ((Alu.greater, np.greater), (Alu.less_equal, np.less_equal), (Alu.not_equal, np.not_equal),
                    (Alu.equal, np.equal)):
        mask = AP(Space.SBUF, DType.uint8, P, ((2, 30), (3, 10), (2, 5), (5, 1)), 0, 2048)
        want = ref(rig.get(view), rig.get(rev)).astype(np.uint8)
        rig.run(isa.TensorTensor(mask, view, rev, op))
        assert_same(rig.get(mask), want)
    a = rig.get(view)
    rig.run(isa.TensorTensor(view, view, rev, Alu.greater_equal))  # in place into FP32
    assert_same(rig.get(view), (a >= rig.get(rev)).astype(F32))
    ints = AP.sbuf("int32", P, (2, 3), offset=3072)  # beyond 2**24: exact in integer mode, rounded in FP32
    rig.put(ints, np.array([[2 ** 24 + 1, -7, 2 ** 31 - 1], [2 ** 24, -7, 2 ** 31 - 2]] * P, np.int32).reshape(P, 2, 3))
    lo_i, hi_i = (AP(Space.SBUF, DType.int32, P, ((3, 1),), 0, 3072 + 12 * k) for k in (0, 1))
    for engine, want in ((Engine.GPSIMD, [1, 0, 1]), (Engine.VECTOR, [0, 0, 0])):
        flags = AP.sbuf("int32", P, (3,), offset=3200)
        rig.run(isa.TensorTensor(flags, lo_i, hi_i, Alu.greater, engine=engine))
        assert rig.get(flags).tolist() == [want] * P, engine
    rig.put(buf, vals)
    shifted = AP.sbuf("float32", P, (59,), offset=4)  # partly overlapping: the whole-array form
    src = AP.sbuf("float32", P, (59,))
    want = np.where(vals[:, :59] > 0, vals[:, :59], vals[:, 1:])
    flag = AP.sbuf("float32", P, (59,), offset=512)
    rig.put(flag, (vals[:, :59] > 0).astype(F32))
    rig.run(isa.Select(shifted, flag, src, shifted))
    assert_same(rig.get(shifted), want)


# ================================================================================================
# partition_reduce, partition_broadcast
# ================================================================================================
@SETTINGS
@given(st.data())
def test_partition_reduce_and_broadcast(data):
    draw = data.draw
    rig = Rig()
    P = draw(st.integers(1, 128))
    sizes = draw(sizes_st(max_size=5))
    int_case = draw(st.booleans())
    sdt = draw(st.sampled_from(INTS if int_case else FLOATS))
    ddt = draw(st.sampled_from(INTS if int_case else FLOATS))
    op = draw(st.sampled_from([Alu.max, Alu.min, Alu.abs_max] + ([Alu.add] if int_case else [Alu.add] * 2)))
    src = draw_onchip(draw, rig, sdt, P, 0, sizes, writable=False, spaces=(Space.SBUF,))
    red = draw_onchip(draw, rig, ddt, 1, draw(st.sampled_from([0, 32, 64, 96])),
                      draw(reshape_st(math.prod(sizes))), writable=True, spaces=(Space.SBUF,))
    BP, bstart = draw(partitions_st())
    bdt = draw(st.sampled_from([ddt] + FLOATS + INTS))
    bc = draw_onchip(draw, rig, bdt, BP, bstart, draw(reshape_st(math.prod(sizes))), writable=True,
                     spaces=(Space.SBUF,))
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)), specials=op is not Alu.add, scale=1.0)
    rig.run(isa.PartitionReduce(red, src, op), isa.PartitionBroadcast(bc, red))
    row = rig.get(red)
    if int_case:
        v = x.astype(np.int64).astype(object).reshape(P, -1)
        r = {Alu.max: v.max(axis=0), Alu.min: v.min(axis=0), Alu.add: v.sum(axis=0),
             Alu.abs_max: np.abs(v).max(axis=0)}[op]
        assert_same(row, ref_int_wrap(r.reshape(red.shape), ddt))
    else:
        v = f64(x.astype(F32)).reshape(P, -1)
        with np.errstate(all="ignore"):
            r = {Alu.max: v.max(axis=0), Alu.min: v.min(axis=0), Alu.add: v.sum(axis=0),
                 Alu.abs_max: np.abs(v).max(axis=0)}[op].reshape(red.shape)
        if op is Alu.add:
            bound = np.abs(v).sum(axis=0).reshape(red.shape)
            rt = {DType.float32: 2e-5, DType.bfloat16: 2 ** -7, DType.float16: 2 ** -10}[ddt]
            assert np.all(np.abs(f64(row) - f64(ref_cast(r, ddt))) <= rt * bound + 1e-30)
        else:
            assert_same(row, ref_cast(r.astype(F32), ddt), signed_zero=op is Alu.abs_max)
    # broadcast of the row to every partition of bc
    rowb = np.broadcast_to(row.reshape(1, -1), (BP, row.size)).reshape(bc.shape)
    want = rowb.copy() if bdt is ddt else (
        ref_int_wrap(rowb.astype(np.int64), bdt) if ddt.kind in "iu" and bdt.kind in "iu"
        else ref_cast(rowb.astype(F32), bdt))
    assert_same(rig.get(bc), want)


# ================================================================================================
# Indirect DMA
# ================================================================================================
@SETTINGS
@given(st.data())
def test_dma_gather(data):
    draw = data.draw
    rig = Rig()
    rows = draw(st.integers(1, 300))
    sizes = draw(sizes_st(max_size=5))
    tdt = draw(st.sampled_from(FLOATS + INTS + FP8))
    ddt = draw(st.sampled_from([tdt, tdt, *FLOATS]))
    free = draw(layout_st(sizes, False))
    lo, hi = extent(free)
    table = rig.hbm_ap(tdt, rows, free, (hi - lo) + draw(st.integers(0, 3)))
    P = draw(st.integers(1, 128))
    istart = draw(st.integers(0, 128 - P))
    idt = draw(st.sampled_from([DType.int32, DType.uint32]))
    index = rig.onchip(Space.SBUF, idt, P, ((1, 1),), istart)
    dst = draw_onchip_st(draw, rig, ddt, P, draw(st.integers(0, 128 - P)), draw(reshape_st(math.prod(sizes))),
                         True, Space.SBUF, 0)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    tv = rig.fill(table, seed)
    idx = np.random.default_rng(seed).integers(0, rows, (P, 1))
    rig.put(index, idx.astype(idt.numpy))
    rig.run(isa.DmaGather(dst, table, index, queue=3))
    g = tv[idx[:, 0]]
    want = ref_dma(g.reshape(-1), tdt, ddt).reshape(dst.shape)
    assert_same(rig.get(dst), want)


@SETTINGS
@given(st.data())
def test_dma_scatter(data):
    draw = data.draw
    rig = Rig()
    rows = draw(st.integers(1, 64))
    sizes = draw(sizes_st(max_size=4))
    accumulate = draw(st.booleans())
    tdt = draw(st.sampled_from([DType.float32, DType.bfloat16, DType.int32, DType.float16]))
    sdt = draw(st.sampled_from([tdt, tdt, DType.float32]))
    free = draw(layout_st(sizes, True))
    lo, hi = extent(free)
    table = rig.hbm_ap(tdt, rows, free, (hi - lo) + draw(st.integers(0, 3)))
    P = draw(st.integers(1, 128))
    idt = draw(st.sampled_from([DType.int32, DType.uint32]))
    index = rig.onchip(Space.SBUF, idt, P, ((1, 1),), draw(st.integers(0, 128 - P)))
    src = draw_onchip_st(draw, rig, sdt, P, draw(st.integers(0, 128 - P)), draw(reshape_st(math.prod(sizes))),
                         False, Space.SBUF, 0)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    before = rig.fill(table, seed, specials=False, scale=1.0)
    sv = rig.fill(src, seed + 1, specials=False, scale=1.0)
    idx = np.random.default_rng(seed).integers(0, rows, P)  # duplicates likely
    rig.put(index, idx.reshape(P, 1).astype(idt.numpy))
    rig.run(isa.DmaScatter(table, src, index, accumulate=accumulate))
    got = rig.get(table)
    svals = sv.reshape((P, *table.sizes))
    if not accumulate:
        want = before.copy()
        for p in range(P):  # in partition order: the last writer wins
            want[idx[p]] = ref_dma(svals[p].reshape(-1), sdt, tdt).reshape(table.sizes)
        assert_same(got, want)
        return
    if tdt.kind in "iu":
        acc = before.astype(np.int64).astype(object)
        for p in range(P):
            acc[idx[p]] = acc[idx[p]] + svals[p].astype(np.int64).astype(object)
        assert_same(got, ref_int_wrap(acc, tdt))
        return
    acc, bound = f64(before.astype(F32)), np.abs(f64(before.astype(F32)))
    for p in range(P):
        acc[idx[p]] += f64(svals[p].astype(F32))
        bound[idx[p]] += np.abs(f64(svals[p].astype(F32)))
    rt = {DType.float32: 1e-5, DType.bfloat16: 2 ** -7, DType.float16: 2 ** -10}[tdt]
    assert np.all(np.abs(f64(got) - f64(ref_cast(acc, tdt))) <= rt * bound + 1e-30)


DMA_TRANSPOSE_TYPES = [DType.bfloat16, DType.float32, DType.float16, DType.int16, DType.uint16, DType.int32,
                       DType.uint32]


@SETTINGS
@given(st.data())
def test_dma_transpose(data):
    """dst[f, p] = src[p, f], bit exact, from HBM rows (any count) or an SBUF tile into an SBUF tile."""
    draw = data.draw
    rig = Rig()
    dt = draw(st.sampled_from(DMA_TRANSPOSE_TYPES))
    sspace = draw(st.sampled_from([Space.HBM, Space.SBUF]))
    P = draw(st.sampled_from([1, 2, 5, 16, 31, 64, 100, 128] + ([129, 200, 300] if sspace is Space.HBM else [])))
    F = draw(st.sampled_from([1, 2, 3, 16, 33, 64, 100, 128]))
    misalign = draw(st.integers(0, dt.itemsize - 1))
    src = draw(dma_side(rig, dt, sspace, P, draw(reshape_st(F, 2)), False, misalign))
    dst = draw(dma_side(rig, dt, Space.SBUF, F, draw(reshape_st(P, 2)), True, draw(st.integers(0, dt.itemsize - 1))))
    x = rig.fill(src, draw(st.integers(0, 2 ** 32 - 1)))
    rig.fill(dst, 7)
    rig.run(isa.DmaTranspose(dst, src, queue=draw(st.integers(0, 15))))
    assert_same(rig.get(dst), x.reshape(P, F).T.reshape(dst.shape), f"{src} -> {dst}")


def test_dma_transpose_is_bit_exact_for_nan_payloads():
    rig = Rig()
    x = np.array([[0x7FC1, 0xFF81, 0x0001], [0x7F80, 0x8000, 0xFFFF]], np.uint16).view(ml_dtypes.bfloat16)
    src = rig.hbm_ap(DType.bfloat16, 2, ((3, 1),), 3)
    rig.put(src, x)
    dst = AP.sbuf("bfloat16", 3, (2,))
    rig.run(isa.DmaTranspose(dst, src))
    np.testing.assert_array_equal(rig.get(dst).view(np.uint16), x.view(np.uint16).T)


@pytest.mark.parametrize("kind", ["gather", "scatter"])
@pytest.mark.parametrize("bad", [7, -1, 2 ** 31 + 5])
def test_indirect_dma_index_out_of_range_names_the_value(kind, bad):
    rig = Rig()
    table = rig.hbm_ap(DType.float32, 7, ((4, 1),), 4)
    idt = DType.uint32 if bad > 2 ** 31 else DType.int32
    index = rig.onchip(Space.SBUF, idt, 3, ((1, 1),), 32)
    tile = rig.onchip(Space.SBUF, DType.float32, 3, ((4, 1),), 0)
    rig.put(index, np.array([[1], [bad], [2]]).astype(idt.numpy))
    rig.put(tile, np.ones((3, 4), F32))
    ins = isa.DmaGather(tile, table, index) if kind == "gather" else isa.DmaScatter(table, tile, index)
    with pytest.raises(ProgramError) as e:
        rig.run(isa.Memset(AP.sbuf("float32", 1, (1,), offset=8192), 0.0), ins)
    err = e.value
    assert err.index == 1 and err.rule == "indirect dma bounds"
    assert f"index value {bad} at partition 1" in err.detail and "7 rows" in err.detail
    assert "on-chip partition 33" in err.detail


def test_uninitialized_index_is_reported():
    rig = Rig()
    table = rig.hbm_ap(DType.float32, 7, ((4, 1),), 4)
    index = rig.onchip(Space.SBUF, DType.int32, 2, ((1, 1),), 0)
    tile = rig.onchip(Space.SBUF, DType.float32, 2, ((4, 1),), 0)
    with pytest.raises(ProgramError, match="index value -1 at partition 0"):
        rig.run(isa.DmaGather(tile, table, index))


# ================================================================================================
# Specific numerics
# ================================================================================================
def _copy_through(rig, values: np.ndarray, src_dt, dst_dt, engine=Engine.VECTOR):
    n = values.size
    src = rig.onchip(Space.SBUF, DType.of(src_dt), 1, ((n, 1),), 0)
    dst = rig.onchip(Space.SBUF, DType.of(dst_dt), 1, ((n, 1),), 0)
    rig.put(src, values.reshape(1, n).astype(DType.of(src_dt).numpy))
    rig.run(isa.TensorCopy(dst, src, engine=engine))
    return rig.get(dst).reshape(-1)


def bf16_rne_reference(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 round to nearest even on the bit pattern (finite inputs)."""
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16).view(ml_dtypes.bfloat16)


def test_fp32_to_bf16_rounds_to_nearest_even_on_ties():
    ulp = 2.0 ** -7
    ties = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 2 + 2 * ulp / 2 * 3, 1 + ulp / 2 + 2 ** -20],
                    np.float64).astype(F32)
    got = _copy_through(Rig(), ties, "float32", "bfloat16")
    assert got.astype(np.float64).tolist() == [1.0, 1 + 2 * ulp, -1.0, bf16_rne_reference(ties[3:4]).astype(
        np.float64)[0], 1 + ulp]
    x = np.random.default_rng(5).standard_normal(4096).astype(F32) * 1e3
    x.view(np.uint32)[::3] = (x.view(np.uint32)[::3] & 0xFFFF0000) | 0x8000  # exact ties
    for engine in (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD):
        got = _copy_through(Rig(), x, "float32", "bfloat16", engine)
        np.testing.assert_array_equal(got.view(np.uint16), bf16_rne_reference(x).view(np.uint16))
    # and through DMA
    rig = Rig()
    src = rig.hbm_ap(DType.float32, 1, ((4096, 1),), 4096)
    dst = rig.hbm_ap(DType.bfloat16, 1, ((4096, 1),), 4096)
    rig.put(src, x.reshape(1, -1))
    rig.run(isa.DmaCopy(dst, src))
    np.testing.assert_array_equal(rig.get(dst).reshape(-1).view(np.uint16), bf16_rne_reference(x).view(np.uint16))


def test_fp8_casts():
    vals = np.array([1.0625, 1.1875, 448.0, 500.0, -0.0, 1e-9, np.nan, 3.0, 0.001953125, 1e6], F32)
    e4m3fn = _copy_through(Rig(), vals, "float32", "float8_e4m3fn").astype(np.float64)
    assert e4m3fn[:3].tolist() == [1.0, 1.25, 448.0]
    assert np.isnan(e4m3fn[3])  # no inf in e4m3fn: overflow is NaN (ml_dtypes)
    assert math.copysign(1, e4m3fn[4]) == -1 and e4m3fn[5] == 0 and np.isnan(e4m3fn[6])
    assert e4m3fn[7] == 3.0 and e4m3fn[8] == 0.001953125  # the smallest e4m3fn subnormal
    e5m2 = _copy_through(Rig(), vals, "float32", "float8_e5m2").astype(np.float64)
    assert e5m2[0] == 1.0 and e5m2[1] == 1.25 and e5m2[9] == np.inf
    x = np.random.default_rng(3).standard_normal(2048).astype(F32) * 50
    for dt in FP8:
        got = _copy_through(Rig(), x, "float32", dt)
        np.testing.assert_array_equal(bits(got), bits(x.astype(DType.of(dt).numpy)))
        back = _copy_through(Rig(), got, dt, "float32")  # fp8 -> fp32 is exact
        np.testing.assert_array_equal(back, got.astype(F32))


def test_float_to_int_casts_round_half_even_saturate_and_zero_nan():
    vals = np.array([2.5, 3.5, -2.5, -3.5, 0.5, 1e10, -1e10, np.inf, -np.inf, np.nan, 255.5, -0.6], F32)
    assert _copy_through(Rig(), vals, "float32", "int32").tolist() == [2, 4, -2, -4, 0, 2**31 - 1, -2**31,
                                                                      2**31 - 1, -2**31, 0, 256, -1]
    assert _copy_through(Rig(), vals, "float32", "uint8").tolist() == [2, 4, 0, 0, 0, 255, 0, 255, 0, 0, 255, 0]
    assert _copy_through(Rig(), vals, "float32", "int16").tolist()[:5] == [2, 4, -2, -4, 0]


def test_gpsimd_integer_arithmetic_is_exact_and_vector_goes_through_fp32():
    rig = Rig()
    a = rig.onchip(Space.SBUF, DType.int32, 1, ((3, 1),), 0)
    b = rig.onchip(Space.SBUF, DType.int32, 1, ((3, 1),), 0)
    out_g = rig.onchip(Space.SBUF, DType.int32, 1, ((3, 1),), 0)
    out_v = rig.onchip(Space.SBUF, DType.int32, 1, ((3, 1),), 0)
    rig.put(a, np.array([[2**30, 16777217, -7]], np.int32))
    rig.put(b, np.array([[2**30, 0, 3]], np.int32))
    rig.run(isa.TensorTensor(out_g, a, b, Alu.add, engine=Engine.GPSIMD),
            isa.TensorTensor(out_v, a, b, Alu.add, engine=Engine.VECTOR))
    assert rig.get(out_g).tolist() == [[-2**31, 16777217, -4]]  # wraps like int32 arithmetic
    assert rig.get(out_v).tolist() == [[2**31 - 1, 16777216, -4]]  # FP32: rounds, then saturates
    rig.run(isa.TensorTensor(out_g, a, b, Alu.mod, engine=Engine.GPSIMD),
            isa.TensorTensor(out_v, a, b, Alu.divide, engine=Engine.GPSIMD))
    assert rig.get(out_g).tolist() == [[0, 0, -1]]  # C fmod; x mod 0 = 0 in integer mode
    assert rig.get(out_v).tolist() == [[1, 2**31 - 1, -2]]  # divide in FP32: -7/3 = -2.33 -> -2; /0 -> inf


def test_bitwise_and_shift_semantics():
    rig = Rig()
    si = rig.onchip(Space.SBUF, DType.int32, 1, ((3, 1),), 0)
    ui = rig.onchip(Space.SBUF, DType.uint32, 1, ((3, 1),), 0)
    so = rig.onchip(Space.SBUF, DType.int32, 1, ((3, 1),), 0)
    uo = rig.onchip(Space.SBUF, DType.uint32, 1, ((3, 1),), 0)
    rig.put(si, np.array([[-8, 2**30, 5]], np.int32))
    rig.put(ui, np.array([[0x80000000, 0xFFFFFFFF, 5]], np.uint32))
    rig.run(isa.TensorScalar(so, si, Alu.right_shift, 1), isa.TensorScalar(uo, ui, Alu.right_shift, 4))
    assert rig.get(so).tolist() == [[-4, 2**29, 2]]  # arithmetic
    assert rig.get(uo).tolist() == [[0x08000000, 0x0FFFFFFF, 0]]  # logical
    rig.run(isa.TensorScalar(so, si, Alu.left_shift, 2), isa.TensorScalar(uo, ui, Alu.bitwise_xor, -1))
    assert rig.get(so).tolist() == [[-32, 0, 20]]  # 2**30 << 2 wraps out of 32 bits
    assert rig.get(uo).tolist() == [[0x7FFFFFFF, 0, 0xFFFFFFFA]]
    rig.run(isa.TensorScalar(so, si, Alu.left_shift, 1, op1=Alu.right_shift, operand1=1, engine=Engine.GPSIMD))
    assert rig.get(so).tolist() == [[-8, -(2**30), 5]]  # the intermediate wrapped to int32


def test_divide_mod_and_nan_semantics_in_fp32():
    rig = Rig()
    a = rig.onchip(Space.SBUF, DType.float32, 1, ((5, 1),), 0)
    b = rig.onchip(Space.SBUF, DType.float32, 1, ((5, 1),), 0)
    o = rig.onchip(Space.SBUF, DType.float32, 1, ((5, 1),), 0)
    rig.put(a, np.array([[1.0, -1.0, 0.0, -7.0, 7.0]], F32))
    rig.put(b, np.array([[0.0, 0.0, 0.0, 3.0, -3.0]], F32))
    rig.run(isa.TensorTensor(o, a, b, Alu.divide))
    r = rig.get(o)[0]
    assert r[0] == np.inf and r[1] == -np.inf and np.isnan(r[2])
    rig.run(isa.TensorTensor(o, a, b, Alu.mod))
    r = rig.get(o)[0]
    assert np.isnan(r[:3]).all() and r[3] == -1.0 and r[4] == 1.0
    rig.put(b, np.array([[np.nan, 2.0, -0.0, np.nan, 1.0]], F32))
    rig.run(isa.TensorTensor(o, a, b, Alu.max))
    r = rig.get(o)[0]
    assert np.isnan(r[0]) and r[1] == 2.0 and np.isnan(r[3]) and r[4] == 7.0
    rig.run(isa.TensorTensor(o, a, b, Alu.logical_and))
    assert rig.get(o)[0].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]  # NaN is true
    rig.run(isa.TensorScalar(o, a, Alu.subtract, 10.0, reverse0=True))
    assert rig.get(o)[0].tolist() == [9.0, 11.0, 10.0, 17.0, 3.0]
    rig.run(isa.TensorScalar(o, a, Alu.bypass, 4.0, reverse0=True))
    assert rig.get(o)[0].tolist() == [4.0] * 5


def test_activation_edge_values():
    rig = Rig()
    x = np.array([-100.0, -20.0, 0.0, -0.0, 20.0, 100.0, np.inf, -np.inf, np.nan, -1e-40], F32)
    src = rig.onchip(Space.SBUF, DType.float32, 1, ((10, 1),), 0)
    dst = rig.onchip(Space.SBUF, DType.float32, 1, ((10, 1),), 0)
    rig.put(src, x.reshape(1, -1))
    out = {}
    for f in (Act.sigmoid, Act.softplus, Act.silu, Act.gelu, Act.exp, Act.relu, Act.rsqrt, Act.reciprocal):
        rig.run(isa.Activation(dst, src, f))
        out[f] = rig.get(dst)[0]
    assert out[Act.sigmoid][:2].tolist() == [np.float32(3.7200760e-44), np.float32(2.0611537e-09)]
    assert out[Act.sigmoid][5] == 1.0 and out[Act.sigmoid][6] == 1.0 and out[Act.sigmoid][7] == 0.0
    assert out[Act.softplus][5] == 100.0 and out[Act.softplus][0] == np.float32(math.exp(-100))
    assert out[Act.gelu][4] == 20.0 and out[Act.gelu][1] == np.float32(-20 * 0.5 * math.erfc(20 / math.sqrt(2)))
    assert out[Act.exp][6] == np.inf and out[Act.exp][7] == 0.0
    assert out[Act.rsqrt][2] == np.inf and out[Act.reciprocal][3] == -np.inf
    assert all(np.isnan(out[f][8]) for f in out)


@pytest.mark.parametrize("dtype", [DType.float16, *FP8, DType.bfloat16, DType.float32])
def test_fast_widening_is_exact_for_every_bit_pattern(dtype):
    n = 1 << (8 * dtype.itemsize) if dtype.itemsize <= 2 else 1 << 16
    raw = np.arange(n, dtype=np.uint64).astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[dtype.itemsize])
    buf = np.zeros(2 * n * dtype.itemsize + 64, np.uint8)
    # a strided, offset 2-D view over every pattern
    view = np.ndarray((2, n // 2), dtype.numpy, buffer=buf, offset=dtype.itemsize,
                      strides=((n // 2 + 7) * dtype.itemsize, dtype.itemsize))
    view.view(raw.dtype)[...] = raw.reshape(2, n // 2)
    want = view.astype(np.float32)
    assert_same(load_f32(view), want)
    out = np.empty(view.shape, np.float32)
    widen_to_f32(view, out)
    assert_same(out, want)


def test_views_share_the_bytes_unaligned_negative_and_broadcast():
    from neuron_sim.views import HbmView, hbm_view, onchip_view

    core = CoreMemory(TRN2)
    ap = AP(Space.SBUF, DType.float32, 3, ((2, -1), (3, 4)), 32, 4 + 1)  # unaligned, reversed inner dim
    v = onchip_view(core.sbuf, ap)
    assert v.shape == (3, 2, 3)
    v[...] = np.arange(18, dtype=np.float32).reshape(3, 2, 3)
    rig = Rig()
    rig.core = core
    np.testing.assert_array_equal(rig.get(ap), np.arange(18, dtype=np.float32).reshape(3, 2, 3))
    assert (core.sbuf[:32] == 0xFF).all() and (core.sbuf[35:] == 0xFF).all()
    hbm = np.zeros(4096, np.uint8)
    hap = AP(Space.HBM, DType.bfloat16, 4, ((3, 0), (2, 1)), 0, 7, -2, 0)  # broadcast dim, rows backwards
    hv = hbm_view(hbm, 100, hap)
    assert hv.shape == (4, 3, 2) and hv.strides == (-4, 0, 2)
    hbm[107:109] = [0x80, 0x3F]  # bf16 1.0 at row 0, element 0
    assert float(hv[0, 2, 0]) == 1.0 and HbmView(hap)(hbm, 100)[0, 1, 0] == 1.0
    with pytest.raises(ValueError):
        hbm_view(hbm, 0, AP(Space.HBM, DType.float32, 2, ((4, 1),), 0, 0, -4, 0))  # reaches below 0
