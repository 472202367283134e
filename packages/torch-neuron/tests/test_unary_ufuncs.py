"""Unary pointwise ops on the neuron device against PyTorch CPU: values (special values included), dtypes,
in-place and out= overloads, non-contiguous, 0-d and empty inputs — all native (strict mode)."""

import math

import pytest
import torch
import torch.nn.functional as F

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int16, torch.int8, torch.uint8]
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 2.5, -2.5, 1e-8, 1e4, -1e4]


@pytest.fixture(autouse=True)
def strict():
    """Every op here must run natively: a CPU fallback is an error."""
    torch.neuron.set_strict(True)
    yield
    torch.neuron.set_strict(False)


def sample(dtype, shape=(5, 7), finite=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 3
        specials = [v for v in SPECIAL if not finite or math.isfinite(v)]
        x.view(-1)[: len(specials)] = torch.tensor(specials)[: x.numel()]
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    lo, hi = (0, 256) if dtype == torch.uint8 else (-120, 120)
    return torch.randint(lo, hi, shape, generator=g, dtype=dtype)


def check(got, expected):
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


# (name, function, dtypes, finite inputs only)
OPS = [
    ("neg", torch.neg, FLOATS + INTS, False),
    ("abs", torch.abs, FLOATS + INTS, False),
    ("sign", torch.sign, FLOATS + INTS, False),
    ("sgn", torch.sgn, FLOATS + INTS, False),
    ("floor", torch.floor, FLOATS + INTS, False),
    ("ceil", torch.ceil, FLOATS + INTS, False),
    ("round", torch.round, FLOATS + INTS, False),
    ("trunc", torch.trunc, FLOATS + INTS, False),
    ("frac", torch.frac, FLOATS, False),
    ("exp", torch.exp, FLOATS + INTS + [torch.bool], False),
    ("exp2", torch.exp2, FLOATS + [torch.int32], False),
    ("expm1", torch.expm1, FLOATS, False),
    ("log", torch.log, FLOATS + [torch.int32], False),
    ("log2", torch.log2, FLOATS, False),
    ("log10", torch.log10, FLOATS + [torch.int16], False),
    ("log1p", torch.log1p, FLOATS + [torch.uint8], False),
    ("sqrt", torch.sqrt, FLOATS + [torch.int32], False),
    ("rsqrt", torch.rsqrt, FLOATS, False),
    ("reciprocal", torch.reciprocal, FLOATS, False),
    ("sin", torch.sin, FLOATS, False),
    ("cos", torch.cos, FLOATS, False),
    ("tan", torch.tan, FLOATS, False),
    ("tanh", torch.tanh, FLOATS, False),
    ("sigmoid", torch.sigmoid, FLOATS + [torch.int8], False),
    ("erf", torch.erf, FLOATS, False),
    ("relu", torch.relu, FLOATS + INTS, False),
    # torch's CPU gelu gives nan at +inf (its vectorized erf); the device gives the limit, inf
    ("gelu", F.gelu, FLOATS, True),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), FLOATS, False),
    ("silu", F.silu, FLOATS, False),
    ("softplus", F.softplus, FLOATS, False),
    ("softplus_beta", lambda x: F.softplus(x, beta=2.0, threshold=5.0), FLOATS, False),
    ("mish", F.mish, FLOATS, False),
    ("hardtanh", lambda x: F.hardtanh(x, -2.0, 1.5), FLOATS, False),
    ("relu6", F.relu6, FLOATS, False),
    ("hardsigmoid", F.hardsigmoid, FLOATS, False),
    ("hardswish", F.hardswish, FLOATS, False),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), FLOATS, False),
    ("elu", lambda x: F.elu(x, alpha=0.7), FLOATS, False),
    ("selu", F.selu, FLOATS, False),
    ("celu", lambda x: F.celu(x, alpha=1.3), FLOATS, False),
    ("threshold", lambda x: F.threshold(x, 0.5, -2.0), FLOATS, False),
    ("logical_not", torch.logical_not, FLOATS + INTS + [torch.bool], False),
    ("bitwise_not", torch.bitwise_not, INTS + [torch.bool], False),
    ("isnan", torch.isnan, FLOATS + INTS, False),
    ("isinf", torch.isinf, FLOATS + INTS, False),
    ("isfinite", torch.isfinite, FLOATS + INTS, False),
    ("isposinf", torch.isposinf, FLOATS + INTS, False),
    ("isneginf", torch.isneginf, FLOATS + INTS, False),
    ("signbit", torch.signbit, FLOATS + INTS, False),
    ("nan_to_num", torch.nan_to_num, FLOATS + INTS, False),
    ("nan_to_num_values", lambda x: torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-3.0), FLOATS, False),
    ("square", torch.square, FLOATS + INTS, False),
    ("round_decimals0", lambda x: torch.round(x, decimals=0), FLOATS, False),
]


@pytest.mark.parametrize("name,fn,dtypes,finite", OPS, ids=[o[0] for o in OPS])
def test_values_match_cpu(name, fn, dtypes, finite):
    for dtype in dtypes:
        x = sample(dtype, finite=finite)
        check(fn(x.to("neuron")), fn(x))


INPLACE = ["neg_", "abs_", "floor_", "ceil_", "round_", "trunc_", "frac_", "exp_", "expm1_", "log1p_", "sqrt_",
           "rsqrt_", "sin_", "tan_", "tanh_", "sigmoid_", "erf_", "relu_", "sign_", "sgn_", "logical_not_",
           "nan_to_num_", "log10_"]


@pytest.mark.parametrize("method", INPLACE)
def test_inplace_on_views(method):
    x = sample(torch.float32, (6, 8))
    for view in (lambda t: t, lambda t: t.t(), lambda t: t[1:, ::2]):
        expected = x.clone()
        getattr(view(expected), method)()
        y = x.to("neuron")
        v = view(y)
        assert getattr(v, method)() is v
        check(y, expected)  # the view's base sees the result, elsewhere untouched


@pytest.mark.parametrize("op", ["exp", "neg", "sigmoid", "floor", "tan", "signbit", "logical_not", "bitwise_not"])
def test_out_resizes_and_casts(op):
    fn = getattr(torch, op)
    dtype = torch.int32 if op == "bitwise_not" else torch.float32
    x = sample(dtype, (5, 3))
    expected = fn(x)
    out = torch.empty(0, dtype=expected.dtype, device="neuron")
    assert fn(x.to("neuron"), out=out) is out
    check(out, expected)
    strided = torch.empty(3, 5, dtype=expected.dtype, device="neuron").t()  # non-contiguous target
    fn(x.to("neuron"), out=strided)
    check(strided, expected)
    if op == "logical_not":  # a bool result into a float target casts, as torch does
        out = torch.empty(5, 3, device="neuron")
        fn(x.to("neuron"), out=out)
        check(out, fn(x, out=torch.empty(5, 3)))


def test_out_that_needs_a_resize_warns_like_torch():
    x = torch.randn(4)
    out = torch.empty(2, device="neuron")
    with pytest.warns(UserWarning, match="resized"):
        torch.exp(x.to("neuron"), out=out)
    check(out, torch.exp(x))


def test_out_dtype_rules_are_torchs():
    x = torch.randn(4).to("neuron")
    with pytest.raises(RuntimeError, match="dtype"):
        torch.floor(x, out=torch.empty(4, dtype=torch.bfloat16, device="neuron"))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.exp(x, out=torch.empty(4, dtype=torch.int32, device="neuron"))


@pytest.mark.parametrize("op", ["exp", "neg", "abs", "sigmoid", "tan", "logical_not", "hardswish", "isinf"])
def test_zero_dim_empty_and_strided(op):
    fn = getattr(torch, op, None) or getattr(F, op)
    x0 = torch.tensor(-0.7)
    check(fn(x0.to("neuron")), fn(x0))
    empty = torch.empty(0, 3)
    got = fn(empty.to("neuron"))
    assert got.shape == (0, 3) and got.dtype == fn(empty).dtype
    x = torch.randn(6, 8)
    for view in (lambda t: t[::2, 1::3], lambda t: t.t(), lambda t: t[:, :1].expand(6, 5)):
        check(fn(view(x.to("neuron"))), fn(view(x)))


def test_inplace_on_expanded_tensor_is_an_error_like_torch():
    y = torch.zeros(3).to("neuron").expand(2, 3)
    with pytest.raises(RuntimeError, match="single memory location"):
        y.exp_()


def test_integer_results_stay_exact_at_the_extremes():
    x = torch.tensor([-2**31, 2**31 - 1, -5, 0, 7], dtype=torch.int32)
    for fn in (torch.neg, torch.abs, torch.sign, torch.bitwise_not, torch.relu, torch.floor):
        check(fn(x.to("neuron")), fn(x))


def test_int64_inputs_of_float_functions_convert_on_the_device():
    x = torch.tensor([3, -2, 2**40 + 1, 0])
    for fn in (torch.exp, torch.sigmoid, torch.sqrt):
        check(fn(x.to("neuron")), fn(x))


def test_runs_natively_and_records_device_time():
    before = torch.neuron.metrics()["native"].get("tanh", 0)
    torch.tanh(torch.randn(64, 64).to("neuron"))
    m = torch.neuron.metrics()
    assert m["native"]["tanh"] == before + 1 and m["device_ns"]["tanh"] > 0
