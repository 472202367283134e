"""tensor_tensor_scan, bn_stats and bn_aggr on the simulated bytes against independent numpy references.

- Exact: each instruction's documented FP32 definition (neuron_hal.isa docstrings) re-evaluated here in numpy, one
  partition-vector at a time, every FP32 operation as a float64 operation on FP32 values rounded once to FP32
  (the correctly rounded FP32 result for + - * / and pow (float64's, rounded once), exact for fmod and comparisons),
  then cast to the destination dtype with numpy / ml_dtypes: bit for bit, any NaN matching any NaN.
- Meaning: the same results against float64 math (prefix sums, mean, population variance) within the error bounds
  of the FP32 algorithms (recursive summation: n u sum|x|; Welford / Chan: mean n u max|x|, M2 n u sum x^2, since
  the updating algorithm's error n kappa u S is at most n u sum x^2).

Element addresses are computed here from the AP fields (never through neuron_sim's views); values are poked and
peeked byte by byte.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN2, Alu, DType, Program, Space, TensorArg, isa, validate
from neuron_sim.values import CoreMemory, run_values

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
F32, F64 = np.float32, np.float64
U = 2.0 ** -24  # FP32 unit roundoff
FLOATS = [DType.float32, DType.bfloat16, DType.float16]
OTHER_INPUTS = [DType.float8_e4m3, DType.float8_e5m2, DType.int32, DType.int8, DType.uint16]
ARITH = [Alu.add, Alu.subtract, Alu.multiply, Alu.divide, Alu.max, Alu.min, Alu.pow, Alu.mod, Alu.abs_max,
         Alu.equal, Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal, Alu.logical_and,
         Alu.logical_or, Alu.logical_xor, Alu.bypass]
PAIRS = [(Alu.multiply, Alu.add), (Alu.add, Alu.add), (Alu.max, Alu.max), (Alu.subtract, Alu.multiply),
         (Alu.min, Alu.add), (Alu.divide, Alu.subtract), (Alu.abs_max, Alu.bypass)]
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40, 65504.0, 1.0, -1.0, 0.5, 2.5]


# ------------------------------------------------------------------------------------------------
# The rig: one core, operands placed apart, values by byte address
# ------------------------------------------------------------------------------------------------
_CORE: list = []


class Rig:
    def __init__(self, profile=TRN2):
        self.profile = profile
        if not _CORE:
            _CORE.append(CoreMemory(profile))
        self.core = _CORE[0]
        self.core.sbuf.fill(0xFF)
        self.core.psum.fill(0xFF)
        self.core.sbuf_hi = self.core.psum_hi = 0
        self.hbm = np.zeros(4096, np.uint8)
        self.region = {Space.SBUF: 0, Space.PSUM: 0}

    def onchip(self, space: Space, dtype: DType, partitions: int, free, start: int = 0) -> AP:
        free = tuple(free)
        lo = sum(min(0, (s - 1) * st) for s, st in free if s > 0)
        hi = sum(max(0, (s - 1) * st) for s, st in free if s > 0) + 1
        base = self.region[space]
        end = base + (hi - lo) * dtype.itemsize
        cap = self.profile.sbuf_partition_bytes if space is Space.SBUF else self.profile.psum_partition_bytes
        if end > cap:
            assume(False)
        self.region[space] = -(-end // 64) * 64
        return AP(space, dtype, partitions, free, start, base - lo * dtype.itemsize)

    def addresses(self, ap: AP):
        mem = self.core.sbuf if ap.space is Space.SBUF else self.core.psum
        pstride = mem.strides[0]  # rows are padded: address through the row stride
        flat = np.lib.stride_tricks.as_strided(mem, (mem.shape[0] * pstride,), (1,))
        nd = 1 + len(ap.free)
        addr = np.full(ap.shape, ap.start_partition * pstride + ap.offset, np.int64)
        addr += (np.arange(ap.partitions, dtype=np.int64) * pstride).reshape((-1,) + (1,) * (nd - 1))
        for d, (s, stride) in enumerate(ap.free):
            shape = [1] * nd
            shape[d + 1] = s
            addr += (np.arange(s, dtype=np.int64) * stride * ap.dtype.itemsize).reshape(shape)
        return flat, addr

    def put(self, ap: AP, values) -> None:
        flat, addr = self.addresses(ap)
        vals = np.ascontiguousarray(np.broadcast_to(np.asarray(values, ap.dtype.numpy), ap.shape))
        idx = (addr.reshape(-1, 1) + np.arange(ap.dtype.itemsize)).reshape(-1)
        flat[idx] = vals.view(np.uint8).reshape(-1)

    def get(self, ap: AP) -> np.ndarray:
        flat, addr = self.addresses(ap)
        idx = (addr.reshape(-1, 1) + np.arange(ap.dtype.itemsize)).reshape(-1)
        return flat[idx].copy().view(ap.dtype.numpy).reshape(ap.shape)

    def fill(self, ap: AP, values) -> np.ndarray:
        """Write values (in ap's shape); return what ap reads back (broadcast dims collapse to their last write)."""
        self.put(ap, values)
        return self.get(ap)

    def run(self, *instructions) -> None:
        prog = Program("scan", [TensorArg("t", (4096,), "uint8", "inout")], instructions)
        validate(prog, self.profile)
        run_values(prog, self.hbm, [0], self.core, self.profile)


def values(seed: int, dtype: DType, shape, specials: bool = True, scale: float = 1.0, positive=False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind in "iu":
        info = np.iinfo(dtype.numpy)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype.numpy)
    x = rng.standard_normal(shape) * scale
    if positive:
        x = np.abs(x)
    if specials:
        x = np.where(rng.random(shape) < 0.1, rng.choice(SPECIALS, size=shape), x)
    with np.errstate(all="ignore"):
        return x.astype(F32).astype(dtype.numpy)


# ------------------------------------------------------------------------------------------------
# Reference numerics
# ------------------------------------------------------------------------------------------------
def f64(x):
    return np.asarray(x).astype(F64)


def r32(x):
    """Round float64 results to FP32 (RNE, overflow to inf)."""
    with np.errstate(all="ignore"):
        return np.asarray(x, F64).astype(F32)


def as_f32(x) -> np.ndarray:
    """Stored values as the engine reads them: exact for floats, ints rounded to nearest even."""
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(F64).astype(F32)


def ref_alu(op: Alu, a, b) -> np.ndarray:
    """One FP32 ALU op: float64 arithmetic on the FP32 inputs, rounded once."""
    a, b = np.broadcast_arrays(f64(a), f64(b))
    nan = np.isnan(a) | np.isnan(b)
    with np.errstate(all="ignore"):
        if op is Alu.add:
            r = a + b
        elif op is Alu.subtract:
            r = a - b
        elif op is Alu.multiply:
            r = a * b
        elif op is Alu.divide:
            r = a / b
        elif op is Alu.max:
            r = np.where(nan, np.nan, np.where(a >= b, a, b))
        elif op is Alu.min:
            r = np.where(nan, np.nan, np.where(a <= b, a, b))
        elif op is Alu.pow:  # the simulator's FP32 pow: the float64 power rounded once
            r = np.power(a, b)
        elif op is Alu.mod:
            r = np.fmod(a, b)
        elif op is Alu.abs_max:
            r = np.where(nan, np.nan, np.maximum(np.abs(a), np.abs(b)))
        elif op is Alu.bypass:
            r = a
        else:
            r = {Alu.equal: a == b, Alu.not_equal: a != b, Alu.greater: a > b, Alu.greater_equal: a >= b,
                 Alu.less: a < b, Alu.less_equal: a <= b, Alu.logical_and: (a != 0) & (b != 0),
                 Alu.logical_or: (a != 0) | (b != 0), Alu.logical_xor: (a != 0) ^ (b != 0)}[op] * 1.0
    return r32(r)


def ref_scan(x0, x1, init, op0, op1, rev0=False, rev1=False) -> np.ndarray:
    """NKI's definition on FP32 [P, N]: s = init; s = op1(op0(x0[:, i], s), x1[:, i]) (reverse swaps); FP32 state."""
    s = np.asarray(init, F32).reshape(-1)
    out = np.empty(x0.shape, F32)
    for i in range(x0.shape[1]):
        t = ref_alu(op0, s, x0[:, i]) if rev0 else ref_alu(op0, x0[:, i], s)
        s = ref_alu(op1, x1[:, i], t) if rev1 else ref_alu(op1, t, x1[:, i])
        out[:, i] = s
    return out


def ref_welford(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, M2) of FP32 [P, n] rows: n += 1; d = x - mean; mean += d / n; M2 += d * (x - mean)."""
    P = x.shape[0]
    n, mean, m2 = np.zeros(P, F32), np.zeros(P, F32), np.zeros(P, F32)
    for i in range(x.shape[1]):
        v = f64(x[:, i])
        n = r32(f64(n) + 1)
        d = r32(v - mean)
        mean = r32(f64(mean) + r32(f64(d) / n))
        m2 = r32(f64(m2) + r32(f64(d) * r32(v - mean)))
    return n, mean, m2


def ref_bn_stats(x) -> np.ndarray:
    even, odd = ref_welford(x[:, 0::2]), ref_welford(x[:, 1::2])
    return np.stack([*even, *odd], axis=1)


def ref_bn_aggr(rec) -> np.ndarray:
    """Chan's combination of FP32 (count, mean, M2) triples [P, 3k], as the ISA docstring states it."""
    P = rec.shape[0]
    n, mean, m2 = np.zeros(P, F32), np.zeros(P, F32), np.zeros(P, F32)
    with np.errstate(all="ignore"):
        for j in range(0, rec.shape[1], 3):
            nb, mb, m2b = rec[:, j], rec[:, j + 1], rec[:, j + 2]
            use = nb != 0
            nab = r32(f64(n) + nb)
            w = r32(f64(nb) / nab)
            d = r32(f64(mb) - mean)
            new_mean = r32(f64(mean) + r32(f64(d) * w))
            new_m2 = r32(f64(r32(f64(m2) + m2b)) + r32(f64(r32(f64(d) * d)) * r32(f64(n) * w)))
            n, mean, m2 = np.where(use, nab, n), np.where(use, new_mean, mean), np.where(use, new_m2, m2)
        var = r32(f64(m2) / n)
    empty = n == 0
    return np.stack([np.where(empty, np.nan, mean), np.where(empty, np.nan, var)], axis=1).astype(F32)


def cast(x, dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x, F32).astype(dtype.numpy)


def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def assert_same(got, want, what=""):
    """Equal bit patterns (signed zeros included), except that any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    with np.errstate(all="ignore"):
        ok = (bits(got) == bits(want)) | (np.isnan(got.astype(F64)) & np.isnan(want.astype(F64)))
    if not ok.all():
        bad = [tuple(b) for b in np.argwhere(~ok)[:5]]
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.size} differ, e.g. "
                             f"{[(b, got[b], want[b]) for b in bad]}")


def assert_within(got, want, atol, what=""):
    err = np.abs(f64(got) - f64(want))
    bad = ~(err <= atol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: |{f64(got)[i]} - {f64(want)[i]}| > {np.broadcast_to(atol, bad.shape)[i]}")


# ------------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------------
@st.composite
def partitions_st(draw):
    p = draw(st.sampled_from([1, 2, 3, 7, 31, 32, 33, 64, 65, 100, 127, 128]))
    starts = [0] if p > 64 else [0, 64] if p > 32 else [0, 32, 64, 96]
    return p, draw(st.sampled_from(starts))


@st.composite
def shape_st(draw, n: int):
    """A free shape of n elements (1..3 dims)."""
    dims, rest = [], n
    for _ in range(draw(st.integers(0, 2))):
        d = draw(st.sampled_from([d for d in range(1, min(rest, 40) + 1) if rest % d == 0]))
        dims.append(d)
        rest //= d
    return tuple(draw(st.permutations(dims + [rest])))


@st.composite
def layout_st(draw, sizes, writable: bool):
    """A permuted, gapped, partly reversed layout of sizes; read-only operands may broadcast (stride 0)."""
    order = draw(st.permutations(list(range(len(sizes)))))
    strides, acc = [0] * len(sizes), 1
    for d in reversed(order):
        gap = draw(st.sampled_from([1, 1, 1, 2, 3]))
        strides[d] = acc * gap
        acc *= sizes[d] * gap
    for d in range(len(sizes)):
        if draw(st.integers(0, 5)) == 0:
            strides[d] = -strides[d]
        if not writable and draw(st.integers(0, 7)) == 0:
            strides[d] = 0
    return tuple(zip(sizes, strides))


def tile(draw, rig: Rig, dtype: DType, P: int, start: int, n: int, writable: bool, space=None) -> AP:
    sizes = draw(shape_st(n))
    if space is None:
        space = draw(st.sampled_from([Space.SBUF, Space.SBUF, Space.PSUM]))
    return rig.onchip(space, dtype, P, draw(layout_st(sizes, writable)), start)


free_sizes = st.one_of(st.sampled_from([1, 2, 3, 5, 127, 128, 129, 255, 300]), st.integers(1, 200))


# ================================================================================================
# tensor_tensor_scan
# ================================================================================================
@SETTINGS
@given(st.data())
def test_tensor_tensor_scan_matches_the_fp32_definition(data):
    draw = data.draw
    rig = Rig()
    P, start = draw(partitions_st())
    n = draw(free_sizes)
    in_types = st.sampled_from(FLOATS * 3 + OTHER_INPUTS)
    op0, op1 = draw(st.one_of(st.sampled_from(PAIRS), st.tuples(st.sampled_from(ARITH), st.sampled_from(ARITH))))
    rev0, rev1 = draw(st.booleans()), draw(st.booleans())
    d0 = tile(draw, rig, draw(in_types), P, start, n, writable=False)
    d1 = tile(draw, rig, draw(in_types), P, start, n, writable=False,
              space=Space.SBUF if d0.space is Space.PSUM else None)  # not both in PSUM
    dst = tile(draw, rig, draw(st.sampled_from(FLOATS * 2 + [DType.float8_e4m3])), P, start, n, writable=True)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    specials = draw(st.booleans())
    scale = 0.9 if op0 is Alu.multiply else 4.0
    x0 = rig.fill(d0, values(seed, d0.dtype, d0.shape, specials, scale))
    x1 = rig.fill(d1, values(seed + 1, d1.dtype, d1.shape, specials))
    if draw(st.booleans()):
        col = rig.onchip(Space.SBUF, draw(st.sampled_from(FLOATS)), P, ((1, 1),), start)
        init = initial = as_f32(rig.fill(col, values(seed + 2, col.dtype, (P, 1), specials))).reshape(P)
        initial = col
    else:
        initial = draw(st.sampled_from([0.0, 1.0, -2.5, 1e-3, np.inf, -np.inf, np.nan, -0.0, 1e39]))
        with np.errstate(over="ignore"):
            init = np.full(P, F32(initial))
    rig.run(isa.TensorTensorScan(dst, d0, d1, initial, op0, op1, rev0, rev1))
    want = ref_scan(as_f32(x0).reshape(P, n), as_f32(x1).reshape(P, n), init, op0, op1, rev0, rev1)
    assert_same(rig.get(dst), cast(want, dst.dtype).reshape(dst.shape), f"{op0.value}/{op1.value} {rev0} {rev1}")


@SETTINGS
@given(st.data())
def test_prefix_sums_against_float64(data):
    """add/add (and multiply-by-one/add, the NKI cumsum idiom) is a prefix sum: within the recursive-summation
    bound of float64, plus one rounding into dst."""
    draw = data.draw
    rig = Rig()
    P, start = draw(partitions_st())
    n = draw(st.sampled_from([1, 2, 100, 128, 1000, 4097]))
    d0 = tile(draw, rig, draw(st.sampled_from(FLOATS)), P, start, n, writable=False, space=Space.SBUF)
    d1 = tile(draw, rig, draw(st.sampled_from(FLOATS)), P, start, n, writable=False, space=Space.SBUF)
    dst = tile(draw, rig, draw(st.sampled_from(FLOATS)), P, start, n, writable=True, space=Space.SBUF)
    cumsum_idiom = draw(st.booleans())
    seed = draw(st.integers(0, 2 ** 32 - 1))
    x0 = rig.fill(d0, np.ones(d0.shape) if cumsum_idiom else values(seed, d0.dtype, d0.shape, False))
    x1 = rig.fill(d1, values(seed + 1, d1.dtype, d1.shape, False))
    initial = float(draw(st.sampled_from([0.0, 3.0])))
    op0 = Alu.multiply if cumsum_idiom else Alu.add
    rig.run(isa.TensorTensorScan(dst, d0, d1, initial, op0, Alu.add))
    a, b = f64(x0).reshape(P, n), f64(x1).reshape(P, n)
    terms = b if cumsum_idiom else a + b
    exact = initial + np.cumsum(terms, axis=1)
    bound = 2 * np.arange(1, n + 1) * U * (abs(initial) + np.cumsum(np.abs(a) + np.abs(b), axis=1))
    got = f64(rig.get(dst)).reshape(P, n)
    eps_dst = {DType.float32: U, DType.bfloat16: 2.0 ** -8, DType.float16: 2.0 ** -11}[dst.dtype]
    assert_within(got, exact, bound * (1 + eps_dst) + eps_dst * np.abs(exact) + 1e-30, "prefix sum")


def test_scan_nki_examples_and_edges():
    rig = Rig()
    P, n = 128, 1024
    rng = np.random.default_rng(7)
    a, b = rng.random((P, n)).astype(F32), rng.random((P, n)).astype(F32)
    ta, tb = rig.onchip(Space.SBUF, DType.float32, P, ((n, 1),)), rig.onchip(Space.SBUF, DType.float32, P, ((n, 1),))
    c = rig.onchip(Space.SBUF, DType.float32, P, ((n, 1),))
    rig.put(ta, a)
    rig.put(tb, b)
    half = n // 2
    lo = AP(Space.SBUF, DType.float32, P, ((half, 1),), 0, c.offset)
    hi = AP(Space.SBUF, DType.float32, P, ((half, 1),), 0, c.offset + half * 4)
    carry = AP(Space.SBUF, DType.float32, P, ((1, 1),), 0, c.offset + (half - 1) * 4)
    a_lo, a_hi = (AP(Space.SBUF, DType.float32, P, ((half, 1),), 0, ta.offset + k * half * 4) for k in (0, 1))
    b_lo, b_hi = (AP(Space.SBUF, DType.float32, P, ((half, 1),), 0, tb.offset + k * half * 4) for k in (0, 1))
    # NKI's example: two scans of 512, the second starting from the first's last column
    rig.run(isa.TensorTensorScan(lo, a_lo, b_lo, 0.0, Alu.multiply, Alu.add),
            isa.TensorTensorScan(hi, a_hi, b_hi, carry, Alu.multiply, Alu.add))
    want = ref_scan(a, b, np.zeros(P, F32), Alu.multiply, Alu.add)
    assert_same(rig.get(c), want, "chunked scan")
    golden = np.zeros((P, n))
    golden[:, 0] = b[:, 0]
    for i in range(1, n):
        golden[:, i] = f64(a[:, i]) * golden[:, i - 1] + b[:, i]
    np.testing.assert_allclose(rig.get(c), golden, rtol=1e-5, atol=1e-5)  # NKI's own check
    # in place (dst is data0): every instruction reads all it needs before writing
    rig.run(isa.TensorTensorScan(ta, ta, tb, 0.5, Alu.add, Alu.max))
    assert_same(rig.get(ta), ref_scan(a, b, np.full(P, 0.5, F32), Alu.add, Alu.max), "in place")
    # inf / nan / zeros flow through the state as FP32 does
    x = np.array([[1.0, np.inf, -np.inf, 2.0], [0.0, -0.0, np.nan, 1.0]], F32)
    d = rig.onchip(Space.SBUF, DType.float32, 2, ((4, 1),))
    o = rig.onchip(Space.SBUF, DType.float32, 2, ((4, 1),))
    rig.put(d, x)
    rig.run(isa.TensorTensorScan(o, d, d, -0.0, Alu.add, Alu.multiply))
    # row 1: (0 + -0) * 0 = +0, then (-0 + +0) * -0 = -0 (signed zeros checked), then NaN for good
    want = np.array([[1.0, np.inf, np.nan, np.nan], [0.0, -0.0, np.nan, np.nan]], F32)
    assert_same(rig.get(o), want, "specials")
    assert_same(want, ref_scan(x, x, np.full(2, -0.0, F32), Alu.add, Alu.multiply), "reference")


def test_scan_bf16_output_rounds_each_element_once_from_the_fp32_state():
    """The state is not re-read from dst: a running sum of 0.75 per step stays exact in the FP32 state, while a
    state rounded to bf16 at every step would stick at 256 (bf16 spacing 2 there)."""
    rig = Rig()
    n = 400
    d0 = rig.onchip(Space.SBUF, DType.float32, 1, ((n, 1),))
    d1 = rig.onchip(Space.SBUF, DType.float32, 1, ((n, 1),))
    dst = rig.onchip(Space.SBUF, DType.bfloat16, 1, ((n, 1),))
    rig.put(d0, np.ones((1, n), F32))
    rig.put(d1, np.full((1, n), 0.75, F32))
    rig.run(isa.TensorTensorScan(dst, d0, d1, 0.0, Alu.multiply, Alu.add))
    state = 0.75 * np.arange(1, n + 1)  # exact in FP32
    assert_same(rig.get(dst), cast(state.astype(F32), DType.bfloat16).reshape(1, n))
    assert rig.get(dst).astype(F64)[0, -1] == 300


def test_scan_speed_at_the_largest_tile():
    """128 partitions x 65535 elements (the largest free size): the scan is one Numba loop, not a Python one."""
    rig = Rig()
    n = TRN2.free_size_max
    t = rig.onchip(Space.SBUF, DType.bfloat16, 128, ((n, 1),))  # in place: three such tiles do not fit
    x = values(3, DType.bfloat16, (128, n), False)
    rig.put(t, x)
    ins = isa.TensorTensorScan(t, t, t, 1.0, Alu.max, Alu.max)  # a running max (exact): max(1, x[0..i])
    rig.run(ins)
    want = np.maximum.accumulate(np.concatenate([np.ones((128, 1)), f64(x)], axis=1), axis=1)[:, 1:]
    assert_same(rig.get(t), cast(want, DType.bfloat16), "largest tile")
    start = time.perf_counter()
    rig.run(ins)  # compiled now
    assert time.perf_counter() - start < 2.0


# ================================================================================================
# bn_stats / bn_aggr
# ================================================================================================
@SETTINGS
@given(st.data())
def test_bn_stats_matches_welford_and_float64(data):
    draw = data.draw
    rig = Rig()
    P, start = draw(partitions_st())
    n = draw(st.one_of(st.sampled_from([1, 2, 3, 4, 5, 127, 128, 129, 511, 512]), st.integers(1, 512)))
    specials = draw(st.integers(0, 3)) == 0
    src = tile(draw, rig, draw(st.sampled_from(FLOATS * 3 + OTHER_INPUTS)), P, start, n, writable=False)
    dst = tile(draw, rig, draw(st.sampled_from(FLOATS + [DType.float32] * 3)), P, start, 6, writable=True)
    scale = draw(st.sampled_from([1.0, 1e-3, 100.0]))
    shift = draw(st.sampled_from([0.0, 0.0, 10.0])) * scale  # a mean well away from 0 (kappa > 1)
    x = rig.fill(src, values(draw(st.integers(0, 2 ** 32 - 1)), src.dtype, src.shape, specials, scale) + shift)
    rig.run(isa.BnStats(dst, src))
    xf = as_f32(x).reshape(P, n)
    want = ref_bn_stats(xf)
    got = rig.get(dst)
    assert_same(got, cast(want, dst.dtype).reshape(dst.shape), "bn_stats")
    if specials or dst.dtype is not DType.float32 or not np.isfinite(xf).all():  # (fp8 inputs may overflow)
        return
    got = f64(got).reshape(P, 6)
    for h, half in enumerate((f64(xf[:, 0::2]), f64(xf[:, 1::2]))):
        k = half.shape[1]
        assert (got[:, 3 * h] == k).all()
        if k == 0:
            assert (got[:, 3 * h + 1:3 * h + 3] == 0).all()
            continue
        mean = half.mean(axis=1)
        m2 = ((half - mean[:, None]) ** 2).sum(axis=1)
        assert_within(got[:, 3 * h + 1], mean, 4 * k * U * np.abs(half).max(axis=1), "mean")
        assert_within(got[:, 3 * h + 2], m2, 8 * k * U * (half ** 2).sum(axis=1), "M2")


@SETTINGS
@given(st.data())
def test_bn_aggr_matches_chan_on_any_records(data):
    draw = data.draw
    rig = Rig()
    P, start = draw(partitions_st())
    k = draw(st.one_of(st.sampled_from([1, 2, 3, 4, 100]), st.integers(1, 40)))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    counts = rng.integers(0, 300, (P, k)).astype(F32)
    counts[rng.random((P, k)) < 0.2] = 0  # empty halves (bn_stats of 1 element, say)
    means = values(int(rng.integers(2 ** 31)), DType.float32, (P, k), draw(st.booleans()), 10.0)
    m2 = values(int(rng.integers(2 ** 31)), DType.float32, (P, k), False, 100.0, positive=True) * (counts > 1)
    rec = np.stack([counts, means, m2], axis=2).reshape(P, 3 * k)
    rec[rng.random(P) < 0.05, :] = 0  # whole partitions without elements: NaN, NaN
    src = tile(draw, rig, draw(st.sampled_from([DType.float32] * 3 + [DType.bfloat16])), P, start, 3 * k,
               writable=False)
    dst = tile(draw, rig, draw(st.sampled_from(FLOATS + [DType.float32])), P, start, 2, writable=True)
    stored = rig.fill(src, rec.reshape(src.shape))
    rig.run(isa.BnAggr(dst, src))
    want = ref_bn_aggr(as_f32(stored).reshape(P, 3 * k))
    assert_same(rig.get(dst), cast(want, dst.dtype).reshape(dst.shape), "bn_aggr")


@SETTINGS
@given(st.data())
def test_bn_stats_then_bn_aggr_is_mean_and_population_variance(data):
    """NKI's example 2: bn_stats on chunks of at most bn_stats_fmax into one record tile, one bn_aggr."""
    draw = data.draw
    rig = Rig()
    P, start = draw(partitions_st())
    n = draw(st.one_of(st.sampled_from([1, 2, 512, 513, 1024, 1500, 4096]), st.integers(1, 2000)))
    fmax = TRN2.bn_stats_fmax
    chunks = math.ceil(n / fmax)
    sdt = draw(st.sampled_from(FLOATS))
    src = rig.onchip(Space.SBUF, sdt, P, ((n, 1),), start)
    stats = rig.onchip(draw(st.sampled_from([Space.SBUF, Space.PSUM])), DType.float32, P, ((6 * chunks, 1),), start)
    out = rig.onchip(Space.SBUF, draw(st.sampled_from([DType.float32, DType.float32, DType.bfloat16])), P,
                     ((2, 1),), start)
    scale = draw(st.sampled_from([1.0, 100.0, 1e-2]))
    x = rig.fill(src, values(draw(st.integers(0, 2 ** 32 - 1)), sdt, (P, n), False, scale) + 3 * scale)
    ins = []
    for c in range(chunks):
        lo, hi = c * fmax, min(n, (c + 1) * fmax)
        part = AP(Space.SBUF, sdt, P, ((hi - lo, 1),), start, src.offset + lo * sdt.itemsize)
        rec = AP(stats.space, DType.float32, P, ((6, 1),), start, stats.offset + 24 * c)
        ins.append(isa.BnStats(rec, part))
    rig.run(*ins, isa.BnAggr(out, stats))
    xf = as_f32(x)
    want = ref_bn_aggr(np.concatenate([ref_bn_stats(xf[:, c * fmax:(c + 1) * fmax]) for c in range(chunks)], axis=1))
    got = rig.get(out)
    assert_same(got, cast(want, out.dtype), "pipeline")
    x64 = f64(xf)
    mean, var = x64.mean(axis=1), x64.var(axis=1)
    rel = U if out.dtype is DType.float32 else 2.0 ** -8
    assert_within(got[:, 0], mean, 4 * n * U * np.abs(x64).max(axis=1) + rel * np.abs(mean), "mean")
    assert_within(got[:, 1], var, 8 * U * (x64 ** 2).sum(axis=1) + rel * var, "variance")


def test_bn_edges():
    rig = Rig()
    # one element: the odd half is empty (0, 0, 0); aggregating gives (x, 0)
    src = rig.onchip(Space.SBUF, DType.float32, 3, ((1, 1),))
    rec = rig.onchip(Space.SBUF, DType.float32, 3, ((6, 1),))
    mv = rig.onchip(Space.SBUF, DType.float32, 3, ((2, 1),))
    rig.put(src, np.array([[2.5], [-0.0], [np.inf]], F32))
    rig.run(isa.BnStats(rec, src), isa.BnAggr(mv, rec))
    # (-0: mean = 0 + (-0 - 0) / 1 = +0 under round-to-nearest; inf: d * (x - mean) = inf * (inf - inf) = NaN)
    assert_same(rig.get(rec), np.array([[1, 2.5, 0, 0, 0, 0], [1, 0.0, 0, 0, 0, 0], [1, np.inf, np.nan, 0, 0, 0]],
                                       F32))
    assert_same(rig.get(mv), np.array([[2.5, 0.0], [0.0, 0.0], [np.inf, np.nan]], F32))
    # constant rows: M2 exactly 0, mean exact; a NaN poisons its half and the aggregate
    src = rig.onchip(Space.SBUF, DType.bfloat16, 2, ((8, 1),))
    rig.put(src, np.array([[3.0] * 8, [1.0, np.nan, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], F32).astype(DType.bfloat16.numpy))
    rec = rig.onchip(Space.SBUF, DType.float32, 2, ((6, 1),))
    mv = rig.onchip(Space.SBUF, DType.float32, 2, ((2, 1),))
    rig.run(isa.BnStats(rec, src), isa.BnAggr(mv, rec))
    assert_same(rig.get(rec), np.array([[4, 3, 0, 4, 3, 0], [4, 1, 0, 4, np.nan, np.nan]], F32))
    assert_same(rig.get(mv), np.array([[3, 0], [np.nan, np.nan]], F32))
    # records with no elements at all: mean and variance NaN
    z = rig.onchip(Space.SBUF, DType.float32, 1, ((12, 1),))
    rig.put(z, np.zeros((1, 12), F32))
    one = AP(Space.SBUF, DType.float32, 1, ((2, 1),), 0, mv.offset)
    rig.run(isa.BnAggr(one, z))
    assert np.isnan(rig.get(one)).all()


@pytest.mark.parametrize("op", [Alu.bitwise_and, Alu.right_shift])
def test_scan_rejects_bitvec_ops_before_running(op):
    rig = Rig()
    t = rig.onchip(Space.SBUF, DType.int32, 4, ((8, 1),))
    with pytest.raises(Exception, match="scan op"):
        rig.run(isa.TensorTensorScan(t, t, t, 0.0, op, Alu.add))
