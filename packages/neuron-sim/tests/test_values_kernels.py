"""The simulator's Numba fast paths against independent numpy references, bit for bit.

- activation gelu / erf (one fused Numba pass: load, scale, bias, float64 function, FP32 rounding): the reference
  evaluates the same piecewise Chebyshev series with numpy's own ``Chebyshev`` objects (``mapdomain`` + ``chebval``,
  the operation order the simulator documents) and ``math.exp``, scale and bias in float64 rounded once to FP32
  (exact for one FP32 multiply or add), and casts with numpy / ml_dtypes;
- the FP32 -> BF16 cast kernel against ml_dtypes on every upper half-word with the rounding-relevant lower halves;
- on-chip rows padded to spread partitions over cache sets: views still address only their own row.

Element addresses are computed here from the AP fields, not through neuron_sim's views.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from numpy.polynomial import chebyshev as cheb

from neuron_hal import AP, TRN2, Act, DType, Program, Space, TensorArg, isa, validate
from neuron_sim import erf as erf_module
from neuron_sim.values import CoreMemory, cast_to, prepare_values
from neuron_sim.views import onchip_view

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
F32, F64 = np.float32, np.float64
SRC_TYPES = [DType.float32, DType.bfloat16, DType.float16, DType.float8_e4m3fn, DType.float8_e5m2, DType.int16,
             DType.int32, DType.uint8]
DST_TYPES = [DType.float32, DType.bfloat16, DType.float16, DType.float8_e4m3, DType.int16, DType.uint8]


# ------------------------------------------------------------------------------------------------
# Reference: the documented series, evaluated by numpy.polynomial
# ------------------------------------------------------------------------------------------------
def _series():
    """numpy Chebyshev objects of the simulator's coefficients on their documented domains."""
    q0, h1, q2 = (cheb.Chebyshev(c, domain=d) for c, d in
                  zip((erf_module._Q0, erf_module._H1, erf_module._Q2), ([0.0, 1.0], [1.0, 2.0], [0.0, 0.25])))
    return q0, h1, q2


_Q0, _H1, _Q2 = _series()
_vexp = np.vectorize(math.exp, otypes=[F64])  # libm exp, as the Numba kernel calls it


def ref_erf_erfc_abs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(erf, erfc) of t = |x| (float64): |x| < 1: erf = t q0(t^2); [1, 2): erfc = exp(-t^2) h1(t);
    [2, inf): erfc = exp(-t^2) q2(1 / t^2) / t; NaN stays NaN."""
    t = np.asarray(t, F64)
    e, c = np.full(t.shape, np.nan), np.full(t.shape, np.nan)
    r0, r1, r2 = t < 1.0, (t >= 1.0) & (t < 2.0), (t >= 2.0) & (t < np.inf)
    e[r0] = t[r0] * _Q0(t[r0] * t[r0])
    c[r0] = 1.0 - e[r0]
    c[r1] = _vexp(-t[r1] * t[r1]) * _H1(t[r1]) if r1.any() else c[r1]
    c[r2] = _vexp(-t[r2] * t[r2]) * _Q2(1.0 / (t[r2] * t[r2])) / t[r2] if r2.any() else c[r2]
    e[r1 | r2] = 1.0 - c[r1 | r2]
    e[t == np.inf], c[t == np.inf] = 1.0, 0.0
    return e, c


def ref_gelu(x32: np.ndarray) -> np.ndarray:
    w = x32.astype(F64)
    arg = w * -(1.0 / math.sqrt(2.0))
    _, c = ref_erf_erfc_abs(np.abs(arg))
    c = np.where(arg < 0, 2.0 - c, c)
    return (0.5 * w * c).astype(F32)


def ref_erf32(x32: np.ndarray) -> np.ndarray:
    w = x32.astype(F64)
    e, _ = ref_erf_erfc_abs(np.abs(w))
    return np.copysign(e, w).astype(F32)


def ref_store(y32: np.ndarray, dt: DType) -> np.ndarray:
    """FP32 results in dt: floats round to nearest even (numpy / ml_dtypes), ints round half even, saturate,
    NaN -> 0."""
    if dt.kind in "iu":
        info = np.iinfo(dt.numpy)
        r = np.clip(np.rint(y32.astype(F64)), info.min, info.max)
        return np.where(np.isnan(r), 0, r).astype(dt.numpy)
    return y32.astype(dt.numpy)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal bit patterns; a NaN matches any NaN (numpy's own NaN payloads depend on an element's position in its
    SIMD loops)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    ok = bits(got) == bits(want)
    if got.dtype.kind not in "iub":
        with np.errstate(invalid="ignore"):
            ok |= np.isnan(got.astype(F64)) & np.isnan(want.astype(F64))
    if not ok.all():
        i = np.argwhere(~ok)[:4]
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.size} differ, e.g. "
                             f"{[(tuple(j), got[tuple(j)], want[tuple(j)]) for j in i]}")


# ------------------------------------------------------------------------------------------------
# A small rig: one core, APs placed in SBUF/PSUM, bytes poked and peeked by computed address
# ------------------------------------------------------------------------------------------------
class Rig:
    def __init__(self):
        self.core = CoreMemory(TRN2)
        self.next = {Space.SBUF: 0, Space.PSUM: 0}

    def place(self, space: Space, dtype: DType, partitions: int, free, start: int = 0) -> AP:
        lo = sum(min(0, (s - 1) * d) for s, d in free)
        hi = sum(max(0, (s - 1) * d) for s, d in free) + 1
        offset = self.next[space] - lo * dtype.itemsize
        end = self.next[space] + (hi - lo) * dtype.itemsize
        limit = TRN2.sbuf_partition_bytes if space is Space.SBUF else TRN2.psum_partition_bytes
        assume(end <= limit and all(abs(d) <= TRN2.free_stride_max for s, d in free if s > 1))
        self.next[space] = -(-end // 64) * 64
        return AP(space, dtype, partitions, tuple(free), start, offset)

    def _addresses(self, ap: AP):
        mem = self.core.sbuf if ap.space is Space.SBUF else self.core.psum
        row = mem.strides[0]
        flat = np.lib.stride_tricks.as_strided(mem, (mem.shape[0] * row,), (1,))
        addr = np.full(ap.shape, (ap.start_partition * row + ap.offset), np.int64)
        nd = len(ap.shape)
        addr += (np.arange(ap.partitions) * row).reshape((-1,) + (1,) * (nd - 1))
        for d, (s, stride) in enumerate(ap.free):
            shape = [1] * nd
            shape[d + 1] = s
            addr += (np.arange(s) * stride * ap.dtype.itemsize).reshape(shape)
        idx = (addr.reshape(-1, 1) + np.arange(ap.dtype.itemsize)).reshape(-1)
        return flat, idx

    def put(self, ap: AP, values: np.ndarray) -> None:
        flat, idx = self._addresses(ap)
        flat[idx] = np.ascontiguousarray(np.broadcast_to(values, ap.shape)).astype(ap.dtype.numpy).view(np.uint8)\
            .reshape(-1)

    def get(self, ap: AP) -> np.ndarray:
        flat, idx = self._addresses(ap)
        return flat[idx].copy().view(ap.dtype.numpy).reshape(ap.shape)

    def run(self, *instructions) -> None:
        prog = Program("t", [TensorArg("t0", (16,), "uint8", "inout")], instructions)
        validate(prog, TRN2)
        prepare_values(prog, TRN2).run(np.zeros(64, np.uint8), [0], self.core)


SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-42, 1e-45, 3e38, -3e38, 1.0, -1.0, 2.0, -2.0,
            math.sqrt(2.0), -math.sqrt(2.0), 2 * math.sqrt(2.0), -2 * math.sqrt(2.0), 0.99999994, 1.0000001, 5.9,
            -5.9, 26.0, -26.0, 7.0, -7.0]


def values(rng, dtype: DType, shape) -> np.ndarray:
    """Normal values at a mix of scales, special values, and (for floats) random bit patterns."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype.numpy)
        return rng.integers(max(info.min, -300), min(info.max, 300), shape, endpoint=True).astype(dtype.numpy)
    x = rng.standard_normal(shape) * rng.choice([0.3, 1.0, 3.0, 30.0], shape)
    x = np.where(rng.random(shape) < 0.15, rng.choice(SPECIALS, shape), x)
    with np.errstate(all="ignore"):
        x = x.astype(F32).astype(dtype.numpy)
    raw = rng.integers(0, 1 << (8 * dtype.itemsize), shape, dtype=np.uint64).astype(bits(x).dtype).view(dtype.numpy)
    return np.where(rng.random(shape) < 0.05, raw, x)


@st.composite
def free_layout(draw, sizes, writable: bool):
    """A permuted, gapped, partly reversed row-major pattern; read-only patterns may broadcast (stride 0)."""
    order = draw(st.permutations(list(range(len(sizes)))))
    strides, acc = [0] * len(sizes), 1
    for d in reversed(order):
        gap = draw(st.sampled_from([1, 1, 2, 3]))
        strides[d] = acc * gap
        acc *= sizes[d] * gap
    for d in range(len(sizes)):
        if draw(st.integers(0, 4)) == 0:
            strides[d] = -strides[d]
        if not writable and draw(st.integers(0, 8)) == 0:
            strides[d] = 0
    return tuple(zip(sizes, strides))


def scalar_input(x: np.ndarray, scale, bias) -> np.ndarray:
    """FP32 round(round(x * scale) + bias): one float64 operation rounded to FP32 is the correctly rounded FP32
    result."""
    with np.errstate(all="ignore"):
        t = x.astype(F32)
        if scale is not None:
            t = (t.astype(F64) * np.asarray(scale, F64)).astype(F32)
        if bias is not None:
            t = (t.astype(F64) + np.asarray(bias, F64)).astype(F32)
    return t


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data())
def test_gelu_and_erf_activations_are_bit_exact(data):
    draw = data.draw
    rig = Rig()
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    func = draw(st.sampled_from([Act.gelu, Act.erf]))
    P = draw(st.sampled_from([1, 2, 7, 32, 64, 128]))
    sizes = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    if draw(st.booleans()):
        sizes = sizes[:-1] + (draw(st.sampled_from([255, 256, 257, 600])),)  # across the kernel's 256-blocks
    n = math.prod(sizes)
    assume(P * n <= 40000)
    sdt, ddt = draw(st.sampled_from(SRC_TYPES)), draw(st.sampled_from(DST_TYPES))
    space = draw(st.sampled_from([Space.SBUF, Space.PSUM]))
    src = rig.place(space, sdt, P, draw(free_layout(sizes, False)))
    in_place = sdt.itemsize == ddt.itemsize and all(s for s in src.strides) and draw(st.integers(0, 3)) == 0
    if in_place:  # read-then-write on the same bytes
        dst = AP(src.space, ddt, P, src.free, 0, src.offset)
    else:
        dst = rig.place(draw(st.sampled_from([Space.SBUF, Space.PSUM])), ddt, P, draw(free_layout(sizes, True)))
    x = values(rng, sdt, src.shape)
    rig.put(src, x)
    x = rig.get(src)
    bshape = (P,) + (1,) * len(sizes)
    scale_kind = draw(st.sampled_from(["one", "imm", "ap"]))
    scale, scale_v = 1.0, None
    if scale_kind == "imm":
        scale = draw(st.sampled_from([0.5, -2.0, 1.0 / math.sqrt(2.0), 1e-3, 3e38, 0.0, np.nan]))
        scale_v = F32(scale)  # an immediate is an FP32 register value
    elif scale_kind == "ap":
        scale = rig.place(Space.SBUF, draw(st.sampled_from([DType.float32, DType.bfloat16])), P, ((1, 1),))
        rig.put(scale, values(rng, scale.dtype, scale.shape))
        scale_v = rig.get(scale).astype(F32).reshape(bshape)
    bias, bias_v = None, None
    if draw(st.booleans()):
        bias = rig.place(Space.SBUF, draw(st.sampled_from([DType.float32, DType.bfloat16])), P, ((1, 1),))
        rig.put(bias, values(rng, bias.dtype, bias.shape))
        bias_v = rig.get(bias).astype(F32).reshape(bshape)
    red = None
    if draw(st.booleans()):
        red = rig.place(Space.SBUF, draw(st.sampled_from([DType.float32, DType.bfloat16])), P, ((1, 1),))
    rig.run(isa.Activation(dst, src, func, scale=scale, bias=bias, reduce_dst=red))

    t = scalar_input(x, scale_v, bias_v)
    y = ref_gelu(t) if func is Act.gelu else ref_erf32(t)
    assert_bits(rig.get(dst), ref_store(y.reshape(dst.shape), ddt), f"{func.value} {sdt.name}->{ddt.name}")
    if red is not None:
        total = np.add.reduce(y.reshape(P, n), axis=1, dtype=F32).reshape(P, 1)
        assert_bits(rig.get(red), ref_store(total, red.dtype), "reduce_dst")


def test_erf_and_erfc_functions_are_the_documented_series():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(30000) * 3, rng.standard_normal(3000) * 1e-200,
                        np.linspace(-30, 30, 20001), np.array(SPECIALS, F64),
                        rng.integers(0, 2 ** 64, 5000, dtype=np.uint64).view(F64)])
    e, c = ref_erf_erfc_abs(np.abs(x))
    assert_bits(erf_module.erf(x), np.copysign(e, x), "erf")
    assert_bits(erf_module.erfc(x), np.where(x < 0, 2.0 - c, c), "erfc")
    assert erf_module.erf(np.float64(0.5)).shape == ()
    # the kernel's window maps are those of numpy's series
    assert list(erf_module._MAPS) == [v for s in (_Q0, _H1, _Q2) for v in s.mapparms()]


@pytest.mark.parametrize("lows", [(0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000, 0x0001)])
def test_fp32_to_bf16_kernel_matches_ml_dtypes(lows):
    """Every upper half-word (all signs, exponents, NaN/inf/subnormal) with the lower halves that decide RNE:
    0, just below/at/above the tie, all ones, and a few others; arrays large enough to take the Numba kernel."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    x = (hi[:, None] | np.array(lows, np.uint32)[None, :]).reshape(-1).view(F32)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16)
        got = cast_to(x, DType.bfloat16)
        strided = cast_to(x.reshape(-1, 8)[:, ::-2], DType.bfloat16)  # non-contiguous input
    np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(strided), bits(x.reshape(-1, 8)[:, ::-2].astype(ml_dtypes.bfloat16)))


def test_padded_rows_keep_views_in_their_partition_row():
    core = CoreMemory(TRN2)
    assert core.sbuf.strides[0] > core.sbuf.shape[1] and core.sbuf.shape == (128, TRN2.sbuf_partition_bytes)
    last = AP(Space.SBUF, DType.float32, 2, ((4, 1),), 5, TRN2.sbuf_partition_bytes - 16)
    v = onchip_view(core.sbuf, last)
    v[...] = 1.5
    assert (core.sbuf[5:7, -16:].view(F32) == 1.5).all() and (core.sbuf[7, :16] == 0xFF).all()
    with pytest.raises(ValueError):  # one element past the end of the row: not the next partition's bytes
        onchip_view(core.sbuf, AP(Space.SBUF, DType.float32, 1, ((5, 1),), 0, TRN2.sbuf_partition_bytes - 16))
    with pytest.raises(ValueError):
        onchip_view(core.psum, AP(Space.PSUM, DType.float32, 4, ((1, 1),), 126, 0))
