"""arange with fractional start/step (dyadic ones exactly; others through double as torch's CPU rounds them),
eye, tril_indices/triu_indices, and nonzero_static, on the neuron device against PyTorch CPU, bit for bit.
(Integral aranges are in test_pointwise_misc.py.)"""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def same_bits(got: torch.Tensor, ref: torch.Tensor):
    assert got.device.type == DEV and got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype in BITS:
        got, ref = got.cpu().view(BITS[ref.dtype]), ref.view(BITS[ref.dtype])
    assert torch.equal(got.cpu(), ref)


# -- arange: start = a / 2**m, step = k / 2**m, every value exact in the dtype ------------------------------------
@settings(max_examples=25, deadline=None)
@given(a=st.integers(-3000, 3000), k=st.integers(-64, 64).filter(bool), m=st.integers(0, 12),
       n=st.integers(1, 300))
def test_dyadic_arange_float32(a, k, m, n):
    start, step = a / 2**m, k / 2**m
    end = start + (n - 0.5) * step  # n values
    with native("arange"):
        got = torch.arange(start, end, step, device=DEV)
    same_bits(got, torch.arange(start, end, step))


@pytest.mark.parametrize("dtype,args", [
    (torch.float32, (-2.0, 0.5, 0.5)), (torch.float32, (-3.5, 40000 * 0.25 - 3.5, 0.25)),  # > 32768: CPU threads
    (torch.float32, (2**-90, 2**-80, 2**-95)), (torch.float32, (100.75, -20.0, -0.125)),
    (torch.bfloat16, (-2.0, 0.5, 0.5)), (torch.bfloat16, (0.25, 30.0, 0.125)),
    (torch.float16, (-8.0, 8.0, 0.0625)), (torch.float16, (0.5, 1000.0, 1.0)),
])
def test_dyadic_arange_cases(dtype, args):
    with native("arange"):
        got = torch.arange(*args, dtype=dtype, device=DEV)
    same_bits(got, torch.arange(*args, dtype=dtype))


def test_dyadic_arange_out_and_mvlgamma():
    out = torch.empty(3, 4, device=DEV).t()  # wrong shape, not contiguous: resized like torch
    x = torch.rand(7, generator=torch.Generator().manual_seed(0)) + 3
    with native("arange"):
        torch.arange(-1.0, 0.5, 0.5, out=out)
        got = torch.mvlgamma(x.to(DEV), 5)
    ref = torch.empty(3, 4).t()
    torch.arange(-1.0, 0.5, 0.5, out=ref)
    same_bits(out, ref)
    torch.testing.assert_close(got.cpu(), torch.mvlgamma(x, 5))


# -- arange: fractional values through double, as torch's CPU loops round them (arange_double) -------------------
@settings(max_examples=25, deadline=None)
@given(start=st.one_of(st.just(0.0), st.floats(0.25, 4.0), st.floats(-4.0, -0.25)),
       step=st.one_of(st.floats(0.25, 2.0), st.floats(-2.0, -0.25)), n=st.integers(1, 60))
def test_fractional_arange_float32_matches_the_cpu_bits(start, step, n):
    end = start + (n - 0.5) * step
    with native("arange"):
        got = torch.arange(start, end, step, device=DEV)
    same_bits(got, torch.arange(start, end, step))


@pytest.mark.parametrize("args", [
    (0.1, 1.1, 1.0), (-0.9, 2.1, 2.0), (2.1, -2.9, -1.0), (0.1, -7.9, -4.0), (0.1, 100.0, 0.3), (-3.7, 50.2, 0.11),
    (0.1, 0.1 + 40000 / 1024, 1 / 1024),  # > 32768 values: the CPU's per-thread chunks
    (1.1, 1.1, 1.0), (-0.0, 2.5, 1.1),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fractional_arange_cases(args, dtype):
    with native("arange" if torch.arange(*args).numel() else None):
        got = torch.arange(*args, dtype=dtype, device=DEV)
    same_bits(got, torch.arange(*args, dtype=dtype))


@settings(max_examples=25, deadline=None)
@given(start=st.one_of(st.floats(-7e4, 7e4), st.integers(-3000, 3000)).map(lambda v: v + 0.0),
       step=st.one_of(st.floats(1e-6, 500.0), st.floats(-500.0, -1e-6), st.integers(-40, 40).filter(bool)),
       n=st.integers(1, 80), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_fractional_arange_16_bit_matches_the_cpu_bits(start, step, n, dtype):
    """float32 accumulation as on the CPU, then the dtype's rounding (float16 overflow to inf and subnormals
    included; a -0.0 start, mapped to +0.0 here, takes the CPU path with a negative step)."""
    end = start + (n - 0.5) * step
    with native("arange"):
        got = torch.arange(start, end, step, dtype=dtype, device=DEV)
    same_bits(got, torch.arange(start, end, step, dtype=dtype))


def test_fractional_arange_out_is_resized_and_written():
    out = torch.empty(2, 3, device=DEV).t()
    with native("arange"):
        torch.arange(0.1, 2.0, 0.3, out=out)
    ref = torch.empty(2, 3).t()
    torch.arange(0.1, 2.0, 0.3, out=ref)
    same_bits(out, ref)


def test_arange_beyond_exact_values_runs_on_the_cpu():
    before = torch.neuron.metrics()["fallback"].get("arange.start_out", 0)
    with warnings.catch_warnings():  # counted, and warned once per process (maybe by an earlier test)
        warnings.simplefilter("ignore")
        # past 2**62 units of the finest input bit (arange_f64.LIMIT)
        same_bits(torch.arange(0.01, 1e4, 3.3, device=DEV), torch.arange(0.01, 1e4, 3.3))
    same_bits(torch.arange(-0.0, -3.0, -0.5, device=DEV), torch.arange(-0.0, -3.0, -0.5))  # -0.0 + -0.0 is -0.0
    assert torch.neuron.metrics()["fallback"]["arange.start_out"] == before + 2


# -- eye ------------------------------------------------------------------------------------------------------------
EYE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.complex128,
              torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float8_e4m3fn,
              torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


def same_bytes(got: torch.Tensor, ref: torch.Tensor):
    assert got.device.type == DEV and got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got.cpu().contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8))


@pytest.mark.parametrize("n,m", [(1, None), (255, None), (256, None), (300, None), (300, 7), (7, 300), (65535, 3),
                                 (3, 65535), (65536, 2), (0, None), (0, 4)])
@pytest.mark.parametrize("dtype", EYE_DTYPES, ids=str)
def test_eye_every_size_and_dtype_matches_cpu(n, m, dtype):
    """Natively for every size (torch's decomposition made uint16 aranges for 256 <= n < 65536)."""
    args = (n,) if m is None else (n, m)
    with native():
        got = torch.eye(*args, dtype=dtype, device=DEV)
    same_bytes(got, torch.eye(*args, dtype=dtype))


def test_eye_out_is_resized_and_keeps_its_strides():
    out = torch.empty(2, device=DEV)
    with native(), warnings.catch_warnings():
        warnings.simplefilter("error")  # resized without a warning, as torch's
        torch.eye(300, out=out)
    same_bytes(out, torch.eye(300))
    t = torch.empty(4, 6, dtype=torch.int64, device=DEV).t()
    with native():
        torch.eye(6, 4, out=t)
    same_bytes(t, torch.eye(6, 4, dtype=torch.int64))
    assert t.stride() == (1, 6)
    with pytest.raises(RuntimeError, match="n must be greater or equal to 0, got -1"):
        torch.eye(-1, device=DEV)
    with pytest.raises(RuntimeError, match="m must be greater or equal to 0, got -2"):
        torch.eye(3, -2, device=DEV)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices], ids=lambda f: f.__name__)
def test_tri_indices_match_cpu(fn):
    """These factories used to recurse without end (their decomposition's meta check called back into it with
    device='neuron')."""
    with native():
        for args in [(4, 5), (4, 5, 1), (4, 5, -2), (0, 3), (300, 7, 2), (3, 3, 10), (3, 3, -10)]:
            same_bits(fn(*args, device=DEV), fn(*args))
        same_bits(fn(6, 4, 1, dtype=torch.int32, device=DEV), fn(6, 4, 1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="row must be non-negative, got-1"):
        fn(-1, 5, device=DEV)
    with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        fn(3, 3, dtype=torch.float32, device=DEV)


# -- nonzero_static --------------------------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(0, 5), max_size=3), size=st.integers(0, 40), fill=st.integers(-5, 5),
       dtype=st.sampled_from([torch.float32, torch.bool, torch.int64, torch.int32, torch.bfloat16]),
       seed=st.integers(0, 99))
def test_nonzero_static(shape, size, fill, dtype, seed):
    x = (torch.randint(-1, 2, shape, generator=torch.Generator().manual_seed(seed))).to(dtype)
    with native():
        got = torch.nonzero_static(x.to(DEV), size=size, fill_value=fill)
    same_bits(got, torch.nonzero_static(x, size=size, fill_value=fill))


def test_nonzero_static_out_and_errors():
    x = torch.tensor([[0.0, float("nan")], [-0.0, 2.0]])
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    with native():
        torch.nonzero_static(x.to(DEV), size=3, out=out)
    same_bits(out, torch.nonzero_static(x, size=3))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.nonzero_static(x.to(DEV), size=-1)
