"""Device copies and casts (``ops/copy.py`` and the movement kernels' casts) against PyTorch CPU: float -> int
casts of every value class (NaN, inf and out-of-range values give the CPU's results, which are x86's: the
range's minimum, whose low bits the narrow types keep), float8 casts, and copy_'s overlap checks."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 127.5, 128.0, -129.0, 255.9, 256.0,
            40000.0, -40000.0, 70000.0, 2.0 ** 31, -2.0 ** 31, 2147483520.0, 3e9, -3e9, 9.2e18, -9.3e18, 2.0 ** 63,
            -2.0 ** 63, 1e20, -1e20, 3.4e38]


def floats(data, dtype, n):
    """n values: raw bit patterns (every class) mixed with the special values."""
    width = 32 if dtype == torch.float32 else 16
    raw = data.draw(st.lists(st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1), min_size=n, max_size=n))
    x = torch.tensor(raw, dtype=BITS[dtype]).view(dtype)
    picks = torch.tensor(data.draw(st.lists(st.sampled_from(SPECIALS), min_size=n, max_size=n))).to(dtype)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    return torch.where(mask, picks, x)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), src=st.sampled_from(list(BITS)), dst=st.sampled_from(INTS))
def test_float_to_int_casts_match_the_cpu(data, src, dst):
    x = floats(data, src, 64)
    with native("copy_"):
        got = x.to(DEV).to(dst)
        strided = torch.zeros(64, 2, dtype=dst, device=DEV)
        strided[:, 1].copy_(x.to(DEV))
    assert got.dtype == dst and torch.equal(got.cpu(), x.to(dst))
    assert torch.equal(strided.cpu()[:, 1], x.to(dst)) and not strided.cpu()[:, 0].any()


def test_a_nan_index_raises_like_the_cpu():
    """x[nan.long()] read element 0 when the device cast NaN to 0; the CPU's int64 minimum is out of bounds."""
    nan = torch.tensor([math.nan])
    with pytest.raises(IndexError, match="index -9223372036854775808 is out of bounds"):
        torch.arange(3.0)[nan.long()]
    with pytest.raises(IndexError, match="index -9223372036854775808 is out of bounds"):
        torch.arange(3.0, device=DEV)[nan.to(DEV).long()]


FP8_VALUES = [440.0, 448.0, 449.0, 463.9, 464.0, 464.1, 470.0, 479.9, 480.0, 500.0, 1e4, 57344.0, 61439.0, 61440.0,
              65504.0, 3e38, math.inf, math.nan, 0.0, 1.0, 0.3, 2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17, 1e-30]


@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("src", list(BITS))
def test_float8_casts_match_the_cpu(src, dst):
    """float8_e4m3fn saturates at +-448 as torch's does (inf too); float8_e5m2 overflows to inf."""
    x = torch.tensor(FP8_VALUES + [-v for v in FP8_VALUES]).to(src)
    with native("copy_"):
        got = x.to(DEV).to(dst)
    assert got.dtype == dst
    torch.testing.assert_close(got.cpu().float(), x.to(dst).float(), rtol=0, atol=0, equal_nan=True)


OVERLAPS = {
    "shift forward": lambda t: t[1:].copy_(t[:-1]),
    "shift back": lambda t: t[:-1].copy_(t[1:]),
    "itself": lambda t: t.copy_(t),
    "the same view": lambda t: t[2:5].copy_(t[2:5]),
    "disjoint halves": lambda t: t[:6].copy_(t[6:]),
    "broadcast source inside": lambda t: t[0:2].copy_(t[1:2]),
    "broadcast source outside": lambda t: t[1:3].copy_(t[0:1]),
    "transposed, same range": lambda t: t.view(3, 4).t().copy_(t.view(4, 3)),
    "strided source": lambda t: t[1:7].copy_(t[::2]),
    "expanded destination": lambda t: t[:1].expand(3).copy_(t[3:6]),
    "expanded size-1 destination": lambda t: t[:1].expand(1).copy_(t[3:4]),
    "empty expanded destination": lambda t: t[:0].view(0, 1).expand(0, 3).copy_(t[:0].view(0, 1).expand(0, 3)),
    "another dtype's view": lambda t: t[:4].view(torch.int32).copy_(t[2:6].view(torch.int32)),
    "a cast": lambda t: t[:4].view(torch.int32).copy_(t[2:6]),
    "a cast over the same range": lambda t: t[:4].view(torch.int32).copy_(t[:4]),
}


@pytest.mark.parametrize("name", list(OVERLAPS))
def test_copy_overlap_checks_match_the_cpu(name):
    """copy_ refuses a destination that writes an element twice or partly overlaps its (dense) source, as
    TensorIterator does on the CPU; other overlaps copy as the CPU does."""
    results = []
    for device in ("cpu", DEV):
        t = torch.arange(12.0, device=device)
        try:
            OVERLAPS[name](t)
            results.append(t.cpu())
        except RuntimeError as e:
            results.append(str(e))
    cpu, dev = results
    if isinstance(cpu, str):
        assert dev == cpu
    else:
        assert isinstance(dev, torch.Tensor) and torch.equal(dev, cpu)
