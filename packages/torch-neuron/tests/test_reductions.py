"""Reductions on neuron against PyTorch CPU: sum/mean/prod/amax/amin/max/min/argmax/argmin/var/std/var_mean/
std_mean/logsumexp/cumsum/linalg_vector_norm/all/any over any dims, keepdim, dtype=, out=, non-contiguous,
0-d and empty inputs, NaN/inf, the exact-integer policy (native or counted CPU path), exact int64 sums (every
int64 value, wrapping like torch), and gradients."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (2e-3, 1e-3)}


def fallbacks() -> dict:
    return torch.neuron.metrics()["fallback"]


def check(dev, ref, dtype=None):
    """dev (neuron) equals ref (CPU): dtype, shape, values (NaN in the same places)."""
    if isinstance(ref, tuple):
        assert isinstance(dev, tuple) and len(dev) == len(ref)
        for a, b in zip(dev, ref):
            check(a, b, dtype)
        return
    assert dev.device.type == DEV
    assert dev.dtype == ref.dtype and dev.shape == ref.shape, (dev.dtype, dev.shape, ref.dtype, ref.shape)
    rtol, atol = TOL.get(dtype or ref.dtype, (0, 0))
    torch.testing.assert_close(dev.cpu(), ref, rtol=rtol, atol=atol, equal_nan=True)


def data(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


# -- float reductions over any dims ------------------------------------------------------------------
REDUCERS = {
    "sum": lambda x, d, k: torch.sum(x, d, keepdim=k),
    "mean": lambda x, d, k: torch.mean(x, d, keepdim=k),
    "amax": lambda x, d, k: torch.amax(x, d, keepdim=k),
    "amin": lambda x, d, k: torch.amin(x, d, keepdim=k),
    "var": lambda x, d, k: torch.var(x, d, keepdim=k),
    "std0": lambda x, d, k: torch.std(x, d, correction=0, keepdim=k),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
    "norm2": lambda x, d, k: torch.linalg.vector_norm(x, 2, d, keepdim=k),
    "norm1": lambda x, d, k: torch.linalg.vector_norm(x, 1, d, keepdim=k),
    "norm_inf": lambda x, d, k: torch.linalg.vector_norm(x, math.inf, d, keepdim=k),
    "norm3": lambda x, d, k: torch.linalg.vector_norm(x, 3, d, keepdim=k),
    "var_mean": lambda x, d, k: torch.var_mean(x, d, keepdim=k),
    "std_mean": lambda x, d, k: torch.std_mean(x, d, correction=2, keepdim=k),
}


@st.composite
def shape_and_dims(draw):
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=4)))
    dims = draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda d: d % len(shape),
                         min_size=1, max_size=len(shape)))
    return shape, tuple(dims), draw(st.booleans())


@pytest.mark.parametrize("name", sorted(REDUCERS))
@settings(max_examples=12, deadline=None)
@given(case=shape_and_dims(), dtype=st.sampled_from(FLOATS))
def test_float_reductions_over_any_dims(name, case, dtype):
    shape, dims, keepdim = case
    x = data(shape, dtype, seed=len(shape))
    fn = REDUCERS[name]
    xd = x.to(DEV)
    with native():
        got = fn(xd, dims, keepdim)
    check(got, fn(x, dims, keepdim), dtype)


@pytest.mark.parametrize("shape, dim", [((300, 70), 0), ((3, 500), 1), ((4, 130, 5), 1), ((2, 3, 4, 5), (0, 2)),
                                        ((70000,), 0), ((6, 40000), None)])
def test_sum_mean_var_larger_shapes(shape, dim):
    x = data(shape) * 3 + 1
    xd = x.to(DEV)
    with native("sum", "mean", "var"):
        got = (xd.sum(dim), xd.mean(dim), xd.var(dim))
    check(got, (x.sum(dim), x.mean(dim), x.var(dim)), torch.float32)


def test_full_reductions_and_default_overloads():
    x = data((5, 6))
    xd = x.to(DEV)
    with native():
        got = (xd.sum(), xd.mean(), xd.prod(), xd.amax(), xd.max(), xd.min(), xd.var(), xd.std(), xd.norm(),
               xd.logsumexp((0, 1)))
    check(got, (x.sum(), x.mean(), x.prod(), x.amax(), x.max(), x.min(), x.var(), x.std(), x.norm(),
                x.logsumexp((0, 1))))


@pytest.mark.parametrize("dtype", FLOATS)
def test_prod_and_cumsum(dtype):
    x = (data((4, 37), dtype) * 0.5 + 1).to(dtype)
    xd = x.to(DEV)
    with native("prod", "cumsum"):
        got = (xd.prod(1), xd.prod(0, keepdim=True), xd.cumsum(1), xd.cumsum(0), xd.cumsum(-1, dtype=torch.float32))
    check(got[:2], (x.prod(1), x.prod(0, keepdim=True)), dtype)
    check(got[2:], (x.cumsum(1), x.cumsum(0), x.cumsum(-1, dtype=torch.float32)), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e20])
@pytest.mark.parametrize("shape, dim, at", [((3, 128), 1, (2, 127)), ((3, 700), 1, (1, 300)), ((200, 70), 0, (150, 3))])
def test_cumsum_inf_stays_after_its_position(dtype, bad, shape, dim, at):
    """A non-finite (or huge) element reaches only the outputs from its position on, forward and backward (the
    reversed cumsum of the gradient), as on the CPU: a triangular 0/1 matmul once made 0 * inf = NaN of the rest."""
    x, g = torch.ones(shape, dtype=dtype), data(shape, dtype)
    x[at], g[at] = bad, bad
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    with native("cumsum"):
        got = xd.cumsum(dim)
        got.backward(g.to(DEV))
    want = xc.cumsum(dim)
    want.backward(g)
    check(got, want.detach(), dtype)
    check(xd.grad, xc.grad, dtype)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float32]),
       st.sampled_from([torch.int32, torch.int16, torch.int8, torch.uint8]),
       st.lists(st.integers(1, 70), min_size=0, max_size=2), st.integers(0, 3))
def test_cumsum_into_a_narrow_integer_dtype_wraps_like_torch(src_dtype, dtype, shape, seed):
    """cumsum(dtype=int32) (MoE routing's expert offsets) and other narrow integer results: torch casts, then sums
    in that dtype, wrapping; the device computes the exact int64 scan and casts it down."""
    g = torch.Generator().manual_seed(seed)
    if src_dtype.is_floating_point:  # in every target's range (out-of-range float -> int casts are undefined)
        x = torch.rand(shape, generator=g) * 100
    else:
        info = torch.iinfo(src_dtype) if src_dtype != torch.bool else None
        low, high = (0, 2) if info is None else (info.min, info.max)
        x = torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(src_dtype)
    dim = len(shape) - 1 if shape else 0
    with native("cumsum" if x.numel() > 1 else None):  # a 0-d or 1-element cumsum is a cast
        got = torch.cumsum(x.to(DEV), dim, dtype=dtype)
    check(got, torch.cumsum(x, dim, dtype=dtype))


def test_cumsum_long_rows_and_in_place():
    x = data((3, 1000))
    xd = x.to(DEV)
    check(xd.cumsum(1), x.cumsum(1), torch.float32)
    y, yd = x.clone(), xd.clone()
    y.cumsum_(0)
    yd.cumsum_(0)
    check(yd, y)


def test_dtype_argument_casts_first():
    x = data((4, 9), torch.bfloat16)
    xd = x.to(DEV)
    with native():
        got = (xd.sum(1, dtype=torch.float32), xd.mean(0, dtype=torch.float32), xd.prod(dtype=torch.float32))
    check(got, (x.sum(1, dtype=torch.float32), x.mean(0, dtype=torch.float32), x.prod(dtype=torch.float32)))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("dim", [0, 1, None])
def test_16bit_sums_into_float32_in_one_program(dtype, dim):
    """A bias gradient under autocast: sum(dtype=float32) of a 16-bit tensor, summed with no float32 copy."""
    x = data((512, 96), dtype) * 3
    xd = x.to(DEV)
    torch.neuron.reset_metrics()
    with native("sum"):
        got = xd.sum(dim, dtype=torch.float32)
    assert torch.neuron.metrics()["programs"] == {"sum": 1}
    check(got, x.sum(dim, dtype=torch.float32), torch.float32)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_16bit_sums_over_an_outer_dim_keep_their_precision(dtype):
    """The outer-dim sum runs on TensorE: its operand tiles must keep the input's dtype (float16 was loaded
    as bfloat16, ~8x the error of the float16 result's own rounding)."""
    x = data((700, 200), dtype) * 3
    want = x.float().sum(0)
    got = x.to(DEV).sum(0).cpu().float()
    cpu_rounding = (x.sum(0).float() - want).abs().max()
    assert (got - want).abs().max() <= 2 * cpu_rounding


# -- shapes, layouts, out= -----------------------------------------------------------------------------
def test_non_contiguous_inputs():
    x = data((6, 8, 4))
    views = [lambda t: t.transpose(0, 2), lambda t: t[:, ::2], lambda t: t[1:4, :, 1],
             lambda t: t[:, :1].expand(6, 5, 4)]
    xd = x.to(DEV)
    for view in views:
        check(view(xd).sum((0, 1)), view(x).sum((0, 1)), torch.float32)
        check(view(xd).amax(-1), view(x).amax(-1))
        check(view(xd).var(0), view(x).var(0), torch.float32)


def test_zero_dim_tensors():
    x = torch.tensor(2.5)
    xd = x.to(DEV)
    with native():
        got = (xd.sum(), xd.sum(0), xd.mean(-1, keepdim=True), xd.amax(), xd.max(0), xd.argmax(), xd.cumsum(0),
               xd.logsumexp(0), torch.linalg.vector_norm(xd), xd.prod(0))
    check(got, (x.sum(), x.sum(0), x.mean(-1, keepdim=True), x.amax(), x.max(0), x.argmax(), x.cumsum(0),
                x.logsumexp(0), torch.linalg.vector_norm(x), x.prod(0)))
    check(xd.var(), x.var())  # nan: one element, correction 1


def test_empty_inputs():
    x = torch.empty(0, 3)
    xd = x.to(DEV)
    with native():
        got = (xd.sum(), xd.sum(0), xd.sum(1), xd.prod(0), xd.mean(0), xd.var(0), xd.logsumexp(0), xd.amax(1),
               xd.cumsum(0), xd.all(), xd.any(0))
    check(got, (x.sum(), x.sum(0), x.sum(1), x.prod(0), x.mean(0), x.var(0), x.logsumexp(0), x.amax(1), x.cumsum(0),
                x.all(), x.any(0)))


def test_empty_dim_errors_like_torch():
    xd = torch.empty(0, 3, device=DEV)
    with pytest.raises(IndexError):
        xd.amax(0)
    with pytest.raises((IndexError, RuntimeError)):
        xd.max()
    with pytest.raises(IndexError):
        xd.argmax(0)


def test_bad_dims_raise_torch_errors():
    xd = torch.zeros(2, 3, device=DEV)
    with pytest.raises(IndexError, match="Dimension out of range"):
        xd.sum(2)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        xd.sum((0, -2))


def test_out_variants():
    x = data((5, 7))
    xd = x.to(DEV)
    out = torch.empty(0, device=DEV)
    torch.sum(xd, 1, out=out)
    check(out, x.sum(1))
    out16 = torch.empty(5, dtype=torch.bfloat16, device=DEV)
    torch.mean(xd, 1, out=out16)  # out= casts to its dtype
    check(out16, x.mean(1).bfloat16())
    values, indices = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    torch.max(xd, 0, out=(values, indices))
    check((values, indices), tuple(x.max(0)))
    v, m = torch.empty(0, device=DEV), torch.empty(0, device=DEV)
    torch.ops.aten.var_mean.correction_out(xd, [0], correction=1, out0=v, out1=m)
    check((v, m), torch.var_mean(x, 0))
    o = torch.empty(7, device=DEV)
    torch.logsumexp(xd, 0, out=o)
    check(o, x.logsumexp(0))


# -- indices and NaN -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", (*FLOATS, torch.int32, torch.int16, torch.uint8))
def test_max_min_argmax_with_indices(dtype):
    x = (data((6, 11), seed=3) * 4).to(dtype)
    x[2, 3] = x[2, 7] = x[2].max()  # ties: first index
    xd = x.to(DEV)
    with native():
        got = (xd.max(1), xd.min(0, keepdim=True), xd.argmax(), xd.argmin(1), xd.argmax(0, keepdim=True),
               xd.argmax(None, keepdim=True))
    check(got, (tuple(x.max(1)), tuple(x.min(0, keepdim=True)), x.argmax(), x.argmin(1), x.argmax(0, keepdim=True),
                x.argmax(None, keepdim=True)))


def test_nan_is_the_extreme_and_its_first_index_wins():
    nan, inf = math.nan, math.inf
    x = torch.tensor([[1.0, inf, nan, 2.0, nan], [1, 2, 3, 4, 5], [-inf, nan, 0, inf, -inf], [5, 5, 1, 1, 5]])
    xd = x.to(DEV)
    for fn in (lambda t: t.argmax(1), lambda t: t.argmin(1), lambda t: t.max(1), lambda t: t.min(1),
               lambda t: t.argmax(), lambda t: t.amax(1), lambda t: t.amin(0), lambda t: t.max(0)):
        got, ref = fn(xd), fn(x)
        check(tuple(got) if isinstance(ref, tuple) else got, tuple(ref) if isinstance(ref, tuple) else ref)


@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_and_lse_propagate_specials(dtype):
    x = torch.tensor([[1.0, math.inf, 2.0], [math.nan, 1.0, 0.0], [-math.inf, -math.inf, -math.inf]]).to(dtype)
    xd = x.to(DEV)
    check(xd.sum(1), x.sum(1))
    check(xd.logsumexp(1), x.logsumexp(1))
    check(xd.amax(1), x.amax(1))


# -- integers and the exactness policy ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", (torch.bool, torch.uint8, torch.int8, torch.int16))
def test_small_int_sums_are_exact_and_native(dtype):
    lo, hi = (0, 2) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max + 1)
    x = torch.randint(lo, hi, (9, 301), generator=torch.Generator().manual_seed(1)).to(dtype)
    xd = x.to(DEV)
    with native("sum", "cumsum"):
        got = (xd.sum(), xd.sum(1), xd.sum(0, keepdim=True), xd.cumsum(1))
    check(got, (x.sum(), x.sum(1), x.sum(0, keepdim=True), x.cumsum(1)))


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_wide_int_sums_and_cumsums_are_native_and_prod_takes_the_counted_cpu_path(dtype):
    x = torch.tensor([[2**30, 2**30, 2**30], [-5, 7, 1]], dtype=dtype)
    xd = x.to(DEV)
    with native("sum", "cumsum"):
        check(xd.sum(1), x.sum(1))
        check(xd.cumsum(1), x.cumsum(1))
    torch.neuron.reset_metrics()
    check(xd.prod(1), x.prod(1))
    assert "prod.dim_int" in fallbacks()


# -- exact int64-result sums (reduction_int64: byte sums carried into int64) ---------------------------------
I64 = torch.iinfo(torch.int64)
I64_EDGES = (0, 1, -1, 2, I64.max, I64.min, I64.max - 1, I64.min + 1, 2**31, -(2**31), 2**32 - 1, 2**32, 255, 256,
             -256, 0x00FF00FF00FF00FF, -0x0101010101010101)


@st.composite
def int64_case(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    n = math.prod(shape)
    vals = draw(st.lists(st.one_of(st.sampled_from(I64_EDGES), st.integers(I64.min, I64.max)), min_size=n, max_size=n))
    dims = draw(st.one_of(st.none(), st.lists(st.integers(-ndim, ndim - 1), unique_by=lambda d: d % ndim, max_size=ndim)
                          if ndim else st.just([])))
    return torch.tensor(vals, dtype=torch.int64).reshape(shape), dims, draw(st.booleans())


@settings(max_examples=25, deadline=None)
@given(case=int64_case())
def test_int64_sums_are_exact_and_wrap_like_torch(case):
    x, dims, keepdim = case
    xd = x.to(DEV)
    with native("sum" if x.dim() else None):  # a 0-d sum is a copy
        got = xd.sum() if dims is None else xd.sum(dims, keepdim=keepdim)
    ref = x.sum() if dims is None else x.sum(dims, keepdim=keepdim)
    check(got, ref)


@settings(max_examples=25, deadline=None)
@given(case=int64_case(), dtype=st.sampled_from((torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool)))
def test_int64_cumsums_are_exact_and_wrap_like_torch(case, dtype):
    """MoE routers count tokens per expert with int64 cumsums: exact byte-plane scans carried into int64."""
    x, dims, _ = case
    x = x.to(dtype) if dtype is not torch.bool else x % 2 == 0
    dim = dims[0] if dims else 0
    with native("cumsum" if x.numel() > 0 and x.dim() else None):
        got = torch.cumsum(x.to(DEV), dim)
    check(got, torch.cumsum(x, dim))


def test_int64_sum_carries_across_every_byte():
    """Many values whose bytes are all 0xff: every byte sum is large, so each carry step is exercised."""
    x = torch.full((3, 70001), -1, dtype=torch.int64)
    x[1] = I64.max
    x[2, ::2] = I64.min
    xd = x.to(DEV)
    with native("sum", "cumsum"):
        got = (xd.sum(1), xd.sum(), xd.t().sum(0), xd.sum(0), xd.cumsum(1))
    check(got, (x.sum(1), x.sum(), x.t().sum(0), x.sum(0), x.cumsum(1)))


@pytest.mark.parametrize("dtype", (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32))
def test_small_int_sums_beyond_int32_partials_are_exact(dtype):
    """Counts where int32 partial sums could overflow (int16: 70000 * 32768 > 2**31) and dtype=int64."""
    info = (0, 2) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max + 1)
    x = torch.randint(*info, (2, 70000), generator=torch.Generator().manual_seed(3)).to(dtype)
    x[0] = info[0] if dtype != torch.bool else True
    xd = x.to(DEV)
    with native("sum"):
        got = (xd.sum(1), xd.sum(), xd.sum(0, dtype=torch.int64), torch.nansum(xd, 1))
    check(got, (x.sum(1), x.sum(), x.sum(0, dtype=torch.int64), torch.nansum(x, 1)))


def test_int64_sum_out_empty_0d_and_bound():
    from torch_neuron.ops.reduction import int64 as reduction_int64

    x = torch.tensor([[I64.max, 3], [I64.max, -7]])
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    with native("sum"):
        torch.sum(x.to(DEV), 0, out=out)
        zero_d = torch.tensor(I64.min).to(DEV).sum()
    check(out, x.sum(0))
    check(zero_d, torch.tensor(I64.min).sum())
    empty = torch.empty(0, 4, dtype=torch.int64)
    check(empty.to(DEV).sum(0), empty.sum(0))
    # the carry-chain proof holds below 2**23 values per result; beyond it the CPU path (not allocated here)
    assert reduction_int64.exact(torch.int64, 2**23 - 1) and not reduction_int64.exact(torch.int64, 2**23)


def test_int_max_min_are_native_and_int64_argmax_falls_back():
    x = torch.tensor([[2**31 - 1, -(2**31), 5]], dtype=torch.int32)
    xd = x.to(DEV)
    with native():
        got = (xd.amax(1), xd.amin(1), xd.max(1), xd.argmin(1))
    check(got, (x.amax(1), x.amin(1), tuple(x.max(1)), x.argmin(1)))
    big = torch.tensor([2**40, -(2**40), 3])
    torch.neuron.reset_metrics()
    check(big.to(DEV).argmax(0), big.argmax(0))
    assert fallbacks()


@settings(max_examples=25, deadline=None)
@given(case=int64_case())
def test_int64_amax_amin_max_min_are_exact(case):
    """From the 32-bit words: the extreme high word, then the extreme low word (unsigned) among its holders."""
    x, dims, keepdim = case
    if x.dim() == 0 or x.numel() == 0:
        return
    xd = x.to(DEV)
    with native():
        got = (xd.amax(dims or (), keepdim=keepdim), xd.amin(dims or (), keepdim=keepdim), xd.max(), xd.min())
    check(got, (x.amax(dims or (), keepdim=keepdim), x.amin(dims or (), keepdim=keepdim), x.max(), x.min()))


def test_float64_takes_the_cpu_path():
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.neuron.reset_metrics()
    got = x.to(DEV).sum(1)
    assert got.dtype == torch.float64 and got.device.type == DEV
    torch.testing.assert_close(got.cpu(), x.sum(1))
    assert fallbacks() == {"sum.dim_IntList": 1}
    torch.neuron.reset_metrics()
    y = x.float()
    got = y.to(DEV).sum(dtype=torch.float64)  # a float64 sum is not done in float32
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), y.sum(dtype=torch.float64))
    assert "sum.dim_IntList" in fallbacks()


@pytest.mark.parametrize("dtype", (torch.bool, torch.uint8, torch.float32, torch.int32))
def test_all_any(dtype):
    x = torch.tensor([[0, 1, 2], [3, 4, 5], [0, 0, 0]]).to(dtype)
    xd = x.to(DEV)
    with native():
        got = (xd.all(), xd.any(), xd.all(1), xd.any(0, keepdim=True), torch.all(xd, (0, 1)), torch.any(xd, ()))
    check(got, (x.all(), x.any(), x.all(1), x.any(0, keepdim=True), torch.all(x, (0, 1)), torch.any(x, ())))


def test_all_nan_is_true():
    x = torch.tensor([math.nan, 1.0])
    check(x.to(DEV).all(), x.all())


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.int32, torch.uint8))
def test_aminmax_count_nonzero_nansum(dtype):
    x = (data((5, 6), seed=4) * 3).to(dtype)
    x[1, 2] = 0
    if dtype.is_floating_point:
        x[0, 1] = x[3, 3] = math.nan
    xd = x.to(DEV)
    with native():
        got = (torch.aminmax(xd, dim=1), torch.count_nonzero(xd),
               torch.count_nonzero(xd, (0,)), torch.count_nonzero(xd, 1))
    check((tuple(got[0]), *got[1:]), (tuple(torch.aminmax(x, dim=1)), torch.count_nonzero(x),
                                      torch.count_nonzero(x, (0,)), torch.count_nonzero(x, 1)))
    if dtype.is_floating_point:
        with native():
            got = (torch.nansum(xd), torch.nansum(xd, 1, keepdim=True))
        check(got, (torch.nansum(x), torch.nansum(x, 1, keepdim=True)), dtype)


def test_vector_norm_orders_and_dtype():
    x = data((4, 6), torch.bfloat16)
    xd = x.to(DEV)
    with native():
        got = [torch.linalg.vector_norm(xd, o, 1) for o in (0, 1, 2, 0.5, -math.inf)]
        got.append(torch.linalg.vector_norm(xd, dim=0, dtype=torch.float32))
    ref = [torch.linalg.vector_norm(x, o, 1) for o in (0, 1, 2, 0.5, -math.inf)]
    ref.append(torch.linalg.vector_norm(x, dim=0, dtype=torch.float32))
    check(tuple(got), tuple(ref), torch.bfloat16)


MOMENTS = {
    "var": lambda x, d, k: torch.var(x, d, keepdim=k),
    "std": lambda x, d, k: torch.std(x, d, keepdim=k),
    "std0": lambda x, d, k: torch.std(x, d, correction=0, keepdim=k),
    "var_mean": lambda x, d, k: torch.var_mean(x, d, keepdim=k)[0],
    "std_mean": lambda x, d, k: torch.std_mean(x, d, keepdim=k)[0],
    "std all": lambda x, d, k: torch.std(x),
}


@pytest.mark.parametrize("name", sorted(MOMENTS))
@settings(max_examples=12, deadline=None)
@given(case=shape_and_dims(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       exponent=st.one_of(st.integers(-35, -15), st.integers(17, 34)))
def test_var_std_of_huge_and_tiny_values_like_the_cpu(name, case, dtype, exponent):
    """The CPU accumulates float32 moments in double: squared deviations of values from ~1.8e19 up (and below
    ~1e-19) left FP32's range, giving inf (0) where the CPU's std is finite. Relative tolerance, and one
    subnormal ulp for variances that land among the subnormals."""
    shape, dims, keepdim = case
    x = (data(shape, seed=exponent % 7) * 10.0 ** exponent).to(dtype)
    with native():
        got = MOMENTS[name](x.to(DEV), dims, keepdim)
    ref = MOMENTS[name](x, dims, keepdim)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    info = torch.finfo(dtype)
    torch.testing.assert_close(got.cpu(), ref, rtol=TOL[dtype][0], atol=info.tiny * info.eps, equal_nan=True)


@pytest.mark.parametrize("ord", [2, 3, 0.5, 1, -1, -2, math.inf, 0])
def test_vector_norm_of_one_element_is_its_magnitude(ord):
    """torch's CPU gives |x| when one element is reduced: |x|**ord overflowed (2e19 ** 2) or underflowed on the
    device for values the result holds."""
    v = torch.tensor([1e-30, -3e-39, 1.4e-45, -2e19, 3e38, math.nan, -math.inf, 0.0, -0.0, 1.5])
    with native():
        got = [torch.linalg.vector_norm(v.to(DEV)[i:i + 1], ord) for i in range(v.numel())]
        rows = torch.linalg.vector_norm(v.to(DEV).view(-1, 1), ord, dim=1, keepdim=True)
        bf16 = torch.linalg.vector_norm(v.to(DEV).to(torch.bfloat16).view(-1, 1, 1), ord, dim=(1, 2))
    for i, g in enumerate(got):
        check(g, torch.linalg.vector_norm(v[i:i + 1], ord), torch.float64)  # exact
    check(rows, torch.linalg.vector_norm(v.view(-1, 1), ord, dim=1, keepdim=True), torch.float64)
    check(bf16, torch.linalg.vector_norm(v.to(torch.bfloat16).view(-1, 1, 1), ord, dim=(1, 2)), torch.float64)


# -- autograd -------------------------------------------------------------------------------------------
GRADS = {
    "sum": lambda x: x.sum(1).pow(2).sum(),
    "mean": lambda x: x.mean((0, 2)).sum(),
    "amax": lambda x: x.amax(1).sum(),
    "max": lambda x: x.max(2).values.sum(),
    "var": lambda x: x.var(1).sum(),
    "std": lambda x: x.std().sum(),
    "logsumexp": lambda x: x.logsumexp(2).sum(),
    "norm": lambda x: x.norm(),
    "prod": lambda x: x.prod(2).sum(),
    "cumsum": lambda x: (x.cumsum(1) * x).sum(),
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradients_match_cpu(name):
    x = data((3, 4, 5), seed=7)
    xd = x.to(DEV).requires_grad_()
    x.requires_grad_()
    GRADS[name](x).backward()
    GRADS[name](xd).backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mean_of_0d_16_bit_keeps_its_dtype(dtype):
    # nanmean / masked.mean divide a 0-d 16-bit sum by a 0-d int64 count: the result stays 16-bit (was float32)
    x = torch.tensor(-8.5, dtype=dtype)
    for fn in (torch.nanmean, torch.masked.mean, lambda t: t / torch.tensor(3, device=t.device),
               lambda t: t * torch.tensor(257, device=t.device)):
        got, want = fn(x.to(DEV)), fn(x)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    v = torch.tensor([1.0, math.nan, 4.0], dtype=dtype)
    assert torch.equal(torch.nanmean(v.to(DEV)).cpu(), torch.nanmean(v))
