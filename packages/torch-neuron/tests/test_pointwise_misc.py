"""where, clamp, lerp, addcmul/addcdiv, fill_/zero_ and the factories built on them, masked_fill, arange, and
the activation backward helpers (through autograd) on the neuron device against PyTorch CPU."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

FLOATS = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def strict():
    torch.neuron.set_strict(True)
    yield
    torch.neuron.set_strict(False)


def check(got, expected, **kw):
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True, **kw)


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- where ------------------------------------------------------------------------------------------------
def test_where(strict):
    cond = randn(4, 1, 5) > 0
    for a, b in ((randn(4, 3, 5), randn(3, 5, seed=1)), (randn(5, dtype=torch.bfloat16), randn(4, 3, 5, seed=2)),
                 (torch.arange(15, dtype=torch.int32).reshape(3, 5), torch.tensor(-1, dtype=torch.int8)),
                 (randn(3, 5), 2.5), (7, torch.arange(5, dtype=torch.int16))):
        dev = [v.to("neuron") if isinstance(v, torch.Tensor) else v for v in (cond, a, b)]
        check(torch.where(*dev), torch.where(cond, a, b))
    out = torch.empty(0, device="neuron")
    a, b = randn(4, 3, 5), randn(5, seed=4)
    torch.where(cond.to("neuron"), a.to("neuron"), b.to("neuron"), out=out)
    check(out, torch.where(cond, a, b))


def test_where_is_bit_exact_and_keeps_special_values(strict):
    x = torch.tensor([math.nan, -0.0, math.inf, 1e-45])
    cond = torch.tensor([True, True, False, True])
    got = torch.where(cond.to("neuron"), x.to("neuron"), 3.0).cpu()
    assert torch.equal(got.view(torch.int32)[[1, 3]], x.view(torch.int32)[[1, 3]]) and got[0].isnan()


# -- clamp ------------------------------------------------------------------------------------------------
def test_clamp_scalars_tensors_and_promotion(strict):
    x = randn(4, 5) * 3
    x[0, 0] = math.nan
    check(x.to("neuron").clamp(-1.0, 2.0), x.clamp(-1.0, 2.0))
    check(x.to("neuron").clamp(min=0.5), x.clamp(min=0.5))
    check(x.to("neuron").clamp(max=-0.5), x.clamp(max=-0.5))
    check(x.to("neuron").clamp(2.0, -1.0), x.clamp(2.0, -1.0))  # min > max gives max
    lo, hi = randn(5, seed=1) - 1, randn(4, 1, seed=2) + 1
    check(x.to("neuron").clamp(lo.to("neuron"), hi.to("neuron")), x.clamp(lo, hi))
    check(torch.clamp_min(x.to("neuron"), lo.to("neuron")), torch.clamp_min(x, lo))
    check(torch.clamp_max(x.to("neuron"), hi.to("neuron")), torch.clamp_max(x, hi))
    i = torch.arange(-6, 6, dtype=torch.int32)
    check(i.to("neuron").clamp(-2, 3), i.clamp(-2, 3))
    check(i.to("neuron").clamp(min=0.5), i.clamp(min=0.5))  # promotes to float32, as torch
    check(x.bfloat16().to("neuron").clamp(-1.0, 1.0), x.bfloat16().clamp(-1.0, 1.0))


def test_clamp_inplace_and_out(strict):
    x = randn(6, 4) * 3
    expected = x.clone()
    expected.t().clamp_(-1, 1)
    got = x.to("neuron")
    got.t().clamp_(-1, 1)
    check(got, expected)
    out = torch.empty(0, dtype=torch.bfloat16, device="neuron")
    with pytest.raises(RuntimeError):
        torch.clamp(x.to("neuron"), 0, 1, out=torch.empty(6, 4, dtype=torch.int32, device="neuron"))
    torch.clamp(x.to("neuron"), min=randn(4).to("neuron"), out=out.float())
    y = x.to("neuron")
    F.hardtanh_(y, -0.5, 0.5)
    check(y, F.hardtanh(x, -0.5, 0.5))


def test_clamp_overflowing_bound_is_torchs_error(strict):
    with pytest.raises(RuntimeError, match="overflow"):
        torch.arange(5, dtype=torch.int8).to("neuron").clamp(max=1000)


# -- lerp, addcmul, addcdiv ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_lerp(strict, dtype):
    a, b = randn(4, 5, dtype=dtype), randn(5, dtype=dtype, seed=1)
    for w in (0.25, 0.75, -1.5):
        check(torch.lerp(a.to("neuron"), b.to("neuron"), w), torch.lerp(a, b, w))
    w = randn(4, 1, dtype=dtype, seed=3)
    check(torch.lerp(a.to("neuron"), b.to("neuron"), w.to("neuron")), torch.lerp(a, b, w))
    got = a.to("neuron")
    got.lerp_(b.to("neuron"), 0.1)
    check(got, a.clone().lerp_(b, 0.1))


@pytest.mark.parametrize("dtype", FLOATS)
def test_addcmul_addcdiv(strict, dtype):
    s, t1, t2 = randn(4, 5, dtype=dtype), randn(5, dtype=dtype, seed=1), randn(4, 1, dtype=dtype, seed=2) + 3
    for value in (1, -0.5, 2.0):
        check(torch.addcmul(s.to("neuron"), t1.to("neuron"), t2.to("neuron"), value=value),
              torch.addcmul(s, t1, t2, value=value))
        check(torch.addcdiv(s.to("neuron"), t1.to("neuron"), t2.to("neuron"), value=value),
              torch.addcdiv(s, t1, t2, value=value))
    got = s.to("neuron")
    got.addcdiv_(t1.to("neuron"), t2.to("neuron"), value=-0.1)  # the optimizer step form
    check(got, s.clone().addcdiv_(t1, t2, value=-0.1))
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.addcmul(s.to("neuron"), t1.to("neuron"), t2.to("neuron"), out=out)
    check(out, torch.addcmul(s, t1, t2))


# -- fill_, zero_, factories -------------------------------------------------------------------------------------
FILL_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16, torch.int32,
               torch.int64, torch.bool, torch.float64, torch.complex64, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", FILL_DTYPES, ids=str)
def test_fill_every_dtype(strict, dtype):
    values = [0, 1, -3, 2.7, 1e10, -2**40 - 3, math.nan, math.inf, True, 0.1]
    for value in values:
        try:
            expected = torch.empty(3, 5, dtype=dtype).fill_(value)
        except (RuntimeError, OverflowError):
            continue
        got = torch.empty(3, 5, dtype=dtype, device="neuron").fill_(value)
        assert torch.equal(got.cpu().view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8)) or (
            dtype.is_floating_point and math.isnan(value)), (dtype, value)


def test_fill_views_zero_dim_empty_and_tensor_values(strict):
    x = randn(4, 6)
    for view in (lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t[:, 2], lambda t: t[0, 0]):
        expected = x.clone()
        view(expected).fill_(-7.5)
        got = x.to("neuron")
        view(got).fill_(-7.5)
        check(got, expected)
    e = torch.zeros(3).to("neuron")
    e.expand(4, 3).fill_(2.0)  # an expanded view: its distinct elements, as torch
    check(e, torch.full((3,), 2.0))
    assert torch.empty(0, device="neuron").fill_(1).numel() == 0
    for value in (torch.tensor(2.5), torch.tensor(3, dtype=torch.int64).to("neuron")):
        got = torch.empty(2, 2, device="neuron").fill_(value)
        check(got, torch.full((2, 2), float(value)))
    with pytest.raises(RuntimeError):
        torch.empty(2, device="neuron").fill_(torch.ones(2))


def test_factories_are_native(strict):
    check(torch.zeros(3, 4, device="neuron"), torch.zeros(3, 4))
    check(torch.ones(2, 3, dtype=torch.int64, device="neuron"), torch.ones(2, 3, dtype=torch.int64))
    check(torch.full((5,), -1.25, dtype=torch.bfloat16, device="neuron"), torch.full((5,), -1.25, dtype=torch.bfloat16))
    x = randn(3, 2).to("neuron")
    check(torch.zeros_like(x), torch.zeros(3, 2))
    check(torch.ones_like(x, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool))
    check(torch.full_like(x, 7), torch.full((3, 2), 7.0))
    check(x.zero_(), torch.zeros(3, 2))
    check(torch.zeros((), device="neuron"), torch.zeros(()))


# -- masked_fill ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8, torch.bool])
def test_masked_fill(strict, dtype):
    x = (randn(4, 5) * 10).to(dtype)
    mask = randn(5, seed=1) > 0
    for value in (3, -0.5, True):
        if dtype == torch.uint8 and value == -0.5:
            continue
        check(x.to("neuron").masked_fill(mask.to("neuron"), value), x.masked_fill(mask, value))
    value = torch.tensor(2.0)
    check(x.to("neuron").masked_fill(mask.to("neuron"), value), x.masked_fill(mask, value))
    check(x.to("neuron").masked_fill(mask.to("neuron"), value.to("neuron")), x.masked_fill(mask, value))
    expected = x.clone()
    expected.t()[1:].masked_fill_(mask[:, None][1:], 1)
    got = x.to("neuron")
    got.t()[1:].masked_fill_(mask[:, None][1:].to("neuron"), 1)
    check(got, expected)


def test_masked_fill_errors_are_torchs(strict):
    x = torch.arange(4, dtype=torch.int8).to("neuron")
    with pytest.raises(RuntimeError, match="overflow"):
        x.masked_fill(x > 1, 1000)
    with pytest.raises(RuntimeError, match="bool"):
        x.masked_fill(torch.ones(4, dtype=torch.int32, device="neuron"), 1)


# -- arange ------------------------------------------------------------------------------------------------------------
def test_arange_native(strict):
    for args, kw in (((10,), {}), ((3, 40, 7), {}), ((5, -9, -2), {}), ((0, 70000), {}),
                     ((2, 20, 3), {"dtype": torch.float32}), ((-4, 4), {"dtype": torch.bfloat16}),
                     ((0, 3000, 5), {"dtype": torch.float16}), ((1, 7), {"dtype": torch.int32}), ((0,), {})):
        check(torch.arange(*args, device="neuron", **kw), torch.arange(*args, **kw))
    out = torch.empty(3, dtype=torch.int64, device="neuron")
    torch.arange(6, out=out)
    check(out, torch.arange(6))


def test_arange_that_is_not_exact_on_the_engines_runs_on_the_cpu():
    before = torch.neuron.metrics()["fallback"].get("arange.start_out", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(torch.arange(0.01, 1e4, 3.3, device="neuron"), torch.arange(0.01, 1e4, 3.3))  # see arange_double
        check(torch.arange(2**31, 2**31 + 4, device="neuron"), torch.arange(2**31, 2**31 + 4))
    assert torch.neuron.metrics()["fallback"]["arange.start_out"] == before + 2


# -- backward helpers through autograd ---------------------------------------------------------------------------------
ACTIVATIONS = [
    ("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")), ("silu", F.silu),
    ("softplus", lambda x: F.softplus(x, beta=1.5, threshold=3.0)), ("mish", F.mish), ("sigmoid", torch.sigmoid),
    ("tanh", torch.tanh), ("hardtanh", lambda x: F.hardtanh(x, -1.0, 0.5)), ("hardsigmoid", F.hardsigmoid),
    ("hardswish", F.hardswish), ("leaky_relu", lambda x: F.leaky_relu(x, 0.1)), ("elu", F.elu),
    ("elu_result", lambda x: F.elu(x.clone(), inplace=True)), ("selu", F.selu),
    ("celu", lambda x: F.celu(x, 0.8)), ("threshold", lambda x: F.threshold(x, 0.3, -1.0)), ("relu6", F.relu6),
]


@pytest.mark.parametrize("name,fn", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_gradients(strict, name, fn, dtype):
    x = (randn(6, 7) * 3).to(dtype)
    x.view(-1)[:4] = torch.tensor([0.0, -3.0, 3.0, 0.3]).to(dtype)  # the kinks and thresholds
    g = randn(6, 7, seed=5).to(dtype)
    xc = x.clone().requires_grad_()
    fn(xc).backward(g)
    xd = x.to("neuron").requires_grad_()
    fn(xd).backward(g.to("neuron"))
    check(xd.grad, xc.grad)


def test_backward_helpers_out_variants(strict):
    g, y = randn(3, 4), torch.sigmoid(randn(3, 4, seed=1))
    for op, args in ((torch.ops.aten.sigmoid_backward.grad_input, (g, y)),
                     (torch.ops.aten.tanh_backward.grad_input, (g, y)),
                     (torch.ops.aten.threshold_backward.grad_input, (g, y, 0.5))):
        out = torch.empty(0, device="neuron")
        op(*[a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args], grad_input=out)
        check(out, op(*args, grad_input=torch.empty(0)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("decimals", [3, -3, 1, -1, 6])
def test_round_decimals_native_and_bitwise_like_cpu(dtype, decimals):
    torch.manual_seed(decimals + 10)
    x = torch.cat([torch.randn(4000) * 1000, torch.tensor([0.0005, -0.0005, 0.0015, 0.0025, -0.0, 12345.6785,
                                                             0.0125, 1e30, float("inf"), -float("inf")])]).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.neuron.NeuronFallbackWarning)
        got = torch.round(x.to("neuron"), decimals=decimals).cpu()
    want = torch.round(x, decimals=decimals)
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())


def test_equal_natively():
    nan = float("nan")
    cases = [(torch.ones(3), torch.ones(3)), (torch.ones(3), torch.ones(4)), (torch.tensor([1.0, nan]),) * 2,
             (torch.tensor([0.0]), torch.tensor([-0.0])), (torch.ones(2), torch.ones(2, dtype=torch.int32)),
             (torch.arange(5), torch.arange(5)), (torch.arange(5), torch.arange(5) + 1),
             (torch.empty(0), torch.empty(0)), (torch.tensor(True), torch.tensor(True))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.neuron.NeuronFallbackWarning)
        for a, b in cases:
            assert torch.equal(a.to("neuron"), b.to("neuron")) == torch.equal(a, b), (a, b)
