"""nextafter, frexp and ldexp on the neuron device (bit arithmetic on the float bits) against PyTorch CPU, bit for
bit: every float32 bit pattern class (±0, subnormals, normals, ±inf, NaN), bfloat16 and float16, broadcasting,
0-d operands, in-place, out= and empty tensors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
VIEW = {**BITS, torch.float64: torch.int64}
SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 5e-39,
            -5e-39, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 6e-8, 65504.0, 9.2e-41]


def same_bits(got: torch.Tensor, ref: torch.Tensor):
    """Equal dtype, shape and bits (any NaN matches any NaN: C leaves the payload open)."""
    assert got.device.type == DEV and got.dtype == ref.dtype and got.shape == ref.shape
    got = got.cpu()
    if ref.dtype.is_floating_point:
        nan = ref.isnan()
        assert torch.equal(got.isnan(), nan)
        got, ref = got[~nan].view(VIEW[ref.dtype]), ref[~nan].view(VIEW[ref.dtype])
    assert torch.equal(got, ref)


def floats(data, dtype, n):
    """n values: raw bit patterns (every class) mixed with the special values."""
    width = 32 if dtype == torch.float32 else 16
    raw = data.draw(st.lists(st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1), min_size=n, max_size=n))
    x = torch.tensor(raw, dtype=BITS[dtype]).view(dtype)
    picks = data.draw(st.lists(st.sampled_from(SPECIALS), min_size=n, max_size=n))
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    return torch.where(mask, torch.tensor(picks).to(dtype), x)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(list(BITS)))
def test_nextafter_every_value(data, dtype):
    n = 64
    x, y = floats(data, dtype, n), floats(data, dtype, n)
    y[::4] = x[::4]  # equal operands give y (±0 included)
    y[1::8] = -y[1::8]
    with native("nextafter"):
        got = torch.nextafter(x.to(DEV), y.to(DEV))
    same_bits(got, torch.nextafter(x, y))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(list(BITS)))
def test_frexp_every_value(data, dtype):
    x = floats(data, dtype, 64)
    with native("frexp"):
        mant, exp = torch.frexp(x.to(DEV))
    rm, re = torch.frexp(x)
    same_bits(mant, rm)
    finite = x.isfinite()  # C leaves the exponent of inf/NaN open: both give 0 here and on the CPU
    assert torch.equal(exp.cpu()[finite], re[finite])


def test_nextafter_broadcast_0d_inplace_out_and_empty():
    a = torch.tensor([[0.0, -0.0, 1.0, float("inf")]])
    b = torch.tensor([[1.0], [-1.0], [float("nan")]])
    with native("nextafter"):
        got = torch.nextafter(a.to(DEV), b.to(DEV))
        zero_d = torch.nextafter(a.to(DEV), torch.tensor(-2.0))  # a CPU 0-d operand
        out = torch.empty(0, device=DEV)
        torch.nextafter(b.to(DEV), a.to(DEV), out=out)
        inplace = a.to(DEV).expand(3, 4).contiguous()
        inplace.nextafter_(b.to(DEV))
        strided = torch.nextafter(a.to(DEV)[:, ::2], b.to(DEV))
    same_bits(got, torch.nextafter(a, b))
    same_bits(zero_d, torch.nextafter(a, torch.tensor(-2.0)))
    same_bits(out, torch.nextafter(b, a))
    same_bits(inplace, torch.nextafter(a.expand(3, 4), b))
    same_bits(strided, torch.nextafter(a[:, ::2], b))
    e = torch.empty(0, 3)
    same_bits(torch.nextafter(e.to(DEV), e.to(DEV)), torch.nextafter(e, e))
    with pytest.raises(RuntimeError):
        a.to(DEV).nextafter_(b.to(DEV))  # self cannot broadcast in place, as on the CPU


@pytest.mark.parametrize("dtype", list(BITS))
def test_frexp_out_0d_and_strided(dtype):
    x = (torch.randn(6, 5, generator=torch.Generator().manual_seed(0)) * 1e3).to(dtype)
    mant = torch.empty(0, dtype=dtype, device=DEV)
    exp = torch.empty(0, dtype=torch.int32, device=DEV)
    with native("frexp"):
        torch.frexp(x.to(DEV).t(), out=(mant, exp))
        m0, e0 = torch.frexp(x[0, 0].to(DEV))
    rm, re = torch.frexp(x.t())
    same_bits(mant, rm)
    assert torch.equal(exp.cpu(), re)
    same_bits(m0, torch.frexp(x[0, 0])[0])
    assert torch.equal(e0.cpu(), torch.frexp(x[0, 0])[1])


def test_float64_and_integers_take_the_cpu_path():
    x = torch.tensor([1.5, -3.0], dtype=torch.float64)
    before = dict(torch.neuron.metrics()["fallback"])
    same_bits(torch.nextafter(x.to(DEV), x.to(DEV) + 1), torch.nextafter(x, x + 1))
    assert torch.frexp(x.to(DEV))[1].cpu().tolist() == torch.frexp(x)[1].tolist()
    after = torch.neuron.metrics()["fallback"]
    assert after.get("nextafter", 0) > before.get("nextafter", 0) and after.get("frexp.Tensor", 0) > before.get(
        "frexp.Tensor", 0)
    with pytest.raises(RuntimeError):
        torch.frexp(torch.tensor([1, 2]).to(DEV))


EXPONENTS = {torch.int64: (-2 ** 40, 2 ** 40), torch.int32: (-2 ** 31, 2 ** 31 - 1), torch.int16: (-400, 400),
             torch.int8: (-128, 127), torch.uint8: (0, 255)}


@settings(max_examples=20, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(list(BITS)), edtype=st.sampled_from(list(EXPONENTS)))
def test_ldexp_with_integer_exponents_is_cs_ldexp(data, dtype, edtype):
    """x * 2**e exact and rounded once, as the CPU's ldexp(x, int(e)) (an int64 e: its low 32 bits), for e where
    2**e itself overflows or underflows the dtype: ldexp(0.01, 17) is 1311 in float16, not inf."""
    x = floats(data, dtype, 64)
    lo, hi = EXPONENTS[edtype]
    near = data.draw(st.lists(st.integers(max(lo, -300), min(hi, 300)), min_size=64, max_size=64))
    far = data.draw(st.lists(st.integers(lo, hi), min_size=64, max_size=64))
    e = torch.tensor([a if i % 4 else b for i, (a, b) in enumerate(zip(near, far))], dtype=edtype)
    with native("ldexp"):
        got = torch.ldexp(x.to(DEV), e.to(DEV))
    same_bits(got, torch.ldexp(x, e))


def test_ldexp_of_the_fuzzers_cases_and_overloads():
    x16 = torch.tensor([1.024, 0.01, 60000.0, 3e-5], dtype=torch.float16)
    e = torch.tensor([7, 17, -30, 24])
    with native("ldexp"):
        got = torch.ldexp(x16.to(DEV), e.to(DEV))
        inplace = x16.to(DEV)
        inplace.ldexp_(e.to(DEV))
        out = torch.empty(0, dtype=torch.float16, device=DEV)
        torch.ldexp(x16.to(DEV), e.to(DEV), out=out)
        bcast = torch.ldexp(torch.tensor([[1e-30], [2.0]], device=DEV), torch.tensor(130, device=DEV))
    same_bits(got, torch.ldexp(x16, e))
    assert got.cpu()[:2].tolist() == [131.125, 1311.0]
    same_bits(inplace, torch.ldexp(x16, e))
    same_bits(out, torch.ldexp(x16, e))
    same_bits(bcast, torch.ldexp(torch.tensor([[1e-30], [2.0]]), torch.tensor(130)))
    empty = torch.ldexp(torch.empty(0, 3, device=DEV), torch.tensor([1, 2, 3], device=DEV))
    assert empty.shape == (0, 3)


@pytest.mark.parametrize("args", [
    (torch.tensor([0.01, 3.0], dtype=torch.float16), torch.tensor([17.0, 1.5], dtype=torch.float16)),  # 2**e in fp16
    (torch.tensor([0.01, 3.0], dtype=torch.float16), torch.tensor([17.0, 1.5])),
    (torch.tensor([1e-30, 3.0]), torch.tensor([130.0, 0.5])),  # 2**130 overflows float32 first, as on the CPU
    (torch.tensor([2 ** 20, 3]), torch.tensor([-100, 2])),  # integer self: float32 result
], ids=["fp16 exponents", "fp32 exponents", "fp32", "integers"])
def test_ldexp_with_other_operands_is_self_times_pow2(args):
    got = torch.ldexp(*(a.to(DEV) for a in args))
    expect = torch.ldexp(*args)
    assert got.dtype == expect.dtype
    torch.testing.assert_close(got.cpu(), expect, equal_nan=True)


def test_ldexp_float64_and_bool_exponents_take_the_cpu_path():
    same_bits(torch.ldexp(torch.tensor([1e-300], dtype=torch.float64).to(DEV), torch.tensor([1100]).to(DEV)),
              torch.ldexp(torch.tensor([1e-300], dtype=torch.float64), torch.tensor([1100])))
    with pytest.raises(NotImplementedError):  # the CPU's own error
        torch.ldexp(torch.tensor([1.5], device=DEV), torch.tensor([True], device=DEV))
