"""The float special functions (inverse trigonometric/hyperbolic, atan2, hypot, heaviside, erfc/erfcx/erfinv/ndtri,
lgamma, digamma/polygamma, the Bessel functions j0/j1/y0/y1/i0/i1/k0/k1 and their scaled forms,
spherical_bessel_j0, the orthogonal polynomials special.*_polynomial_*) on the neuron device against PyTorch CPU:
values over the whole float32 line (NaN, +-inf, +-0, denormals, domain edges, poles), reduced-precision and
integer inputs, non-contiguous inputs, in-place and out=. Tolerances are op_db's (test_compare_cpu)."""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

SP = torch.special
UNARY = {
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erfc": torch.erfc, "erfinv": torch.erfinv,
    "lgamma": torch.lgamma, "digamma": torch.digamma, "i0": torch.i0, "special.erfcx": SP.erfcx,
    "special.ndtri": SP.ndtri, "special.log_ndtr": SP.log_ndtr, "special.i0e": SP.i0e, "special.i1": SP.i1,
    "special.i1e": SP.i1e, "special.modified_bessel_i0": SP.modified_bessel_i0,
    "special.modified_bessel_i1": SP.modified_bessel_i1, "special.spherical_bessel_j0": SP.spherical_bessel_j0,
    "special.bessel_j0": SP.bessel_j0, "special.bessel_j1": SP.bessel_j1, "special.bessel_y0": SP.bessel_y0,
    "special.bessel_y1": SP.bessel_y1, "special.modified_bessel_k0": SP.modified_bessel_k0,
    "special.modified_bessel_k1": SP.modified_bessel_k1,
    "special.scaled_modified_bessel_k0": SP.scaled_modified_bessel_k0,
    "special.scaled_modified_bessel_k1": SP.scaled_modified_bessel_k1, "angle": torch.angle,
}
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, -3.0, -2.5, 1e-30, -1e-30, 1e-40, -1e-40, 1.4e-45, 4.2e-45,
         0.9999999, -0.9999999, 1.0000001, 1e-7, 1 - 1e-7, 8.0, 7.9999995, 9.5, -9.5, 10.2, 30.0, -30.5, 88.0, -88.0,
         1e4, 1e30, -1e30, 4.03711e36, 4.04e36, 3.4e38, -3.4e38, math.inf, -math.inf, math.nan]
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}  # (rtol, atol)
# torch's vectorized CPU sinh/cosh overflow with exp (|x| > 88.72) while its scalar path and this kernel follow
# the true value up to 89.4: values there are compared against float64 instead (test_sinh_cosh_near_overflow)
_OVERFLOW_GAP = {"sinh", "cosh"}


@pytest.fixture(autouse=True)
def strict():
    torch.neuron.set_strict(True)  # a CPU fallback fails the test: these ops must run natively
    yield
    torch.neuron.set_strict(False)


def check(got, expected, dtype=torch.float32):
    assert got.device.type == "neuron" and got.dtype == expected.dtype and got.shape == expected.shape
    rtol, atol = TOL[expected.dtype if expected.dtype in TOL else dtype]
    torch.testing.assert_close(got.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True)


def rand(*shape, lo=-4.0, hi=4.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (hi - lo) + lo).to(dtype)


def _filtered(name, x):
    return x[~((x.abs() > 88.7) & (x.abs() < 89.5))] if name in _OVERFLOW_GAP else x


floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_edges_and_ranges(name):
    f = UNARY[name]
    x = torch.cat([torch.tensor(EDGES), rand(200, seed=1), rand(200, lo=-1, hi=1, seed=2),
                   rand(100, lo=0, hi=1, seed=3), rand(100, lo=-60, hi=60, seed=4),
                   torch.exp(rand(100, lo=-80, hi=80, seed=5)), -torch.exp(rand(100, lo=-80, hi=80, seed=6))])
    x = _filtered(name, x)
    check(f(x.to("neuron")), f(x))


@pytest.mark.parametrize("name", list(UNARY))
@settings(max_examples=12, deadline=None)
@given(values=st.lists(floats32, min_size=1, max_size=40))
def test_unary_hypothesis(name, values):
    f = UNARY[name]
    x = _filtered(name, torch.tensor(values, dtype=torch.float32))
    check(f(x.to("neuron")), f(x))


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_random_bit_patterns(name):
    """Every float32 exponent equally likely: the whole line, NaN payloads and denormals included."""
    f = UNARY[name]
    bits = torch.randint(-2**31, 2**31 - 1, (4096,), generator=torch.Generator().manual_seed(20), dtype=torch.int64)
    x = _filtered(name, bits.to(torch.int32).view(torch.float32))
    check(f(x.to("neuron")), f(x))


def test_digamma_of_subnormals_overflows_where_the_cpu_does():
    """digamma(x) ~ -1/x near 0: the CPU's pi / tan(pi x) (in double) overflows from |x| <= 2**-128 on, where the
    device's FP32 pi x lost digits and stayed at FLT_MAX. Every subnormal around that edge, both signs."""
    edge = torch.tensor(2.0 ** -128).view(torch.int32).item()
    bits = torch.cat([torch.arange(edge - 20000, edge + 20000, dtype=torch.int32),
                      torch.arange(1, 2 ** 23, 4099, dtype=torch.int32)])
    x = torch.cat([bits.view(torch.float32), -bits.view(torch.float32)])
    got, ref = torch.digamma(x.to("neuron")).cpu(), torch.digamma(x)
    assert torch.equal(got.isinf(), ref.isinf()) and torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(got[ref.isinf()], ref[ref.isinf()])
    check(got.to("neuron"), ref)


def test_sinh_cosh_near_overflow():
    x = torch.tensor([88.5, 88.8, 89.1, 89.4, -88.9, -89.3, 89.5, -90.0])
    for f in (torch.sinh, torch.cosh):
        check(f(x.to("neuron")), f(x.double()).float())


@pytest.mark.parametrize("name", [n for n in UNARY if n != "special.log_ndtr"])  # log_ndtr: a decomposition
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32, torch.bool])
def test_unary_dtypes(name, dtype):
    """bfloat16/float16 compute in FP32 and round once; integer and bool inputs promote to float32."""
    f = UNARY[name]
    lo, hi = (-1.0, 1.0) if name in ("asin", "acos", "atanh", "erfinv") else (0.0, 1.0) if name == "special.ndtri" \
        else (-6.0, 6.0)
    x = rand(7, 9, lo=lo, hi=hi, seed=7).to(dtype) if dtype is not torch.bool else rand(7, 9, seed=7) > 0
    if name == "special.i0e" and dtype in TOL:
        # torch's CPU i0e evaluates its series in the reduced dtype itself (2 ulp off in float16); the reference
        # is torch's float32 result rounded once, which is what this backend computes
        check(f(x.to("neuron")), f(x.float()).to(dtype))
        return
    same_error_or_close(f, x)


def same_error_or_close(f, *args):
    """The device matches torch's CPU result, or raises where torch's CPU has no kernel for the dtype."""
    try:
        expected = f(*args)
    except (RuntimeError, NotImplementedError) as e:
        torch.neuron.set_strict(False)  # the CPU fallback is what raises torch's error
        with pytest.raises(type(e)):
            f(*[a.to("neuron") for a in args])
        return
    check(f(*[a.to("neuron") for a in args]), expected, dtype=args[0].dtype)


@pytest.mark.parametrize("name", ["atan", "acos", "erfinv", "lgamma", "special.i1e", "digamma"])
def test_unary_views_out_and_inplace(name):
    f = UNARY[name]
    base = rand(6, 10, lo=-0.99, hi=0.99, seed=8)
    d = base.to("neuron")
    check(f(d.t()), f(base.t()))  # non-contiguous input
    check(f(d[:, ::3]), f(base[:, ::3]))
    out = torch.empty(3, device="neuron")  # resized, as torch does
    f(d, out=out)
    check(out, f(base))
    out = torch.zeros(10, 6, device="neuron").t()  # non-contiguous out
    f(d, out=out)
    check(out, f(base))
    out = torch.zeros(6, 10, dtype=torch.bfloat16, device="neuron")  # result cast into the out dtype
    f(d, out=out)
    check(out, f(base).bfloat16())
    with pytest.raises(RuntimeError):
        f(d, out=torch.empty(6, 10, dtype=torch.int32, device="neuron"))  # float result cannot go to int


@pytest.mark.parametrize("name", ["asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfc",
                                  "erfinv", "lgamma", "digamma", "i0"])
def test_unary_inplace_on_views(name):
    base = rand(4, 8, lo=-0.9, hi=0.9, seed=9)
    d = base.to("neuron")
    getattr(d[:, 1::2], f"{name}_")()  # in place on a strided view
    expected = base.clone()
    getattr(expected[:, 1::2], f"{name}_")()
    check(d, expected)
    b16 = base.bfloat16()
    check(getattr(b16.to("neuron"), f"{name}_")(), getattr(b16.clone(), f"{name}_")())
    with pytest.raises(RuntimeError):  # an int tensor cannot hold the float result
        getattr(torch.ones(3, dtype=torch.int32, device="neuron"), f"{name}_")()


# -- polygamma ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", range(6))
def test_polygamma(n):
    edges = [0.0, -0.0, -1.0, -2.0, -3.5, -0.5001, 1e-3, 1.0, 7.9999, 8.0, 30.0, 1e4, math.inf, -math.inf, math.nan]
    x = torch.cat([torch.tensor(edges), rand(300, lo=-10, hi=10, seed=n), rand(100, lo=0, hi=3, seed=10)])
    check(torch.polygamma(n, x.to("neuron")), torch.polygamma(n, x))
    check(SP.polygamma(n, x.to("neuron")), SP.polygamma(n, x))
    xi = torch.arange(1, 9, dtype=torch.int32)
    check(torch.polygamma(n, xi.to("neuron")), torch.polygamma(n, xi))
    out = torch.empty(0, dtype=torch.bfloat16, device="neuron")
    torch.polygamma(n, x.to("neuron"), out=out)
    check(out, torch.polygamma(n, x).bfloat16())


@pytest.mark.parametrize("n", [0, 1, 3])
def test_polygamma_inplace(n):
    x = rand(4, 6, seed=16)
    d = x.to("neuron")
    d[:, ::2].polygamma_(n)  # on a strided view
    expected = x.clone()
    expected[:, ::2].polygamma_(n)
    check(d, expected)
    torch.neuron.set_strict(False)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int32, device="neuron").polygamma_(n)


def test_polygamma_high_order_falls_back_loudly():
    torch.neuron.set_strict(False)
    x = rand(5, lo=0.5, hi=3.0)
    before = torch.neuron.metrics()["fallback"].get("polygamma", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warned once per process: counted every time
        got = torch.polygamma(12, x.to("neuron"))
    check(got, torch.polygamma(12, x))
    assert torch.neuron.metrics()["fallback"].get("polygamma", 0) == before + 1


# -- binary ------------------------------------------------------------------------------------------------------
BINARY = {"atan2": torch.atan2, "hypot": torch.hypot}
SPECIAL2 = [0.0, -0.0, 1.0, -1.0, 2.5, -1e-30, 1e30, -3.4e38, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_special_pairs_and_broadcast(name):
    f = BINARY[name]
    a = torch.tensor(SPECIAL2).view(-1, 1)
    b = torch.tensor(SPECIAL2).view(1, -1)
    check(f(a.to("neuron"), b.to("neuron")), f(a, b))  # every pair of special values
    x, y = rand(5, 1, 7, seed=11), rand(3, 1, seed=12)
    check(f(x.to("neuron"), y.to("neuron")), f(x, y))
    check(f(x.to("neuron"), torch.tensor(-2.0)), f(x, torch.tensor(-2.0)))  # 0-d CPU operand


@pytest.mark.parametrize("name", list(BINARY))
@settings(max_examples=15, deadline=None)
@given(pairs=st.lists(st.tuples(floats32, floats32), min_size=1, max_size=30))
def test_binary_hypothesis(name, pairs):
    f = BINARY[name]
    a, b = (torch.tensor([p[i] for p in pairs], dtype=torch.float32) for i in (0, 1))
    check(f(a.to("neuron"), b.to("neuron")), f(a, b))


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_promotion_out_and_inplace(name):
    f = BINARY[name]
    x, y = rand(4, 6, seed=13), rand(4, 6, seed=14)
    ints = torch.arange(24, dtype=torch.int32).view(4, 6) - 9
    pairs = ((x.bfloat16(), y.bfloat16()), (x.half(), y.bfloat16()), (ints, y.half()),
             (torch.arange(6, dtype=torch.int16) - 3, torch.arange(6, dtype=torch.int64)),
             (x.bfloat16(), y[0, 0].clone()))  # a 0-d float32 tensor does not promote a bfloat16 tensor
    for a, b in pairs:
        same_error_or_close(f, a, b)
    out = torch.empty(0, device="neuron")
    f(x.to("neuron").t(), y.to("neuron").t(), out=out)
    check(out, f(x.t(), y.t()))
    d = x.to("neuron")
    getattr(d[::2], f"{name}_")(y[::2].to("neuron"))
    expected = x.clone()
    getattr(expected[::2], f"{name}_")(y[::2])
    check(d, expected)


# -- heaviside ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_heaviside(dtype):
    x = torch.tensor([math.nan, 0.0, -0.0, -1.0, 2.0, math.inf, -math.inf, 1e-45, -1e-45], dtype=dtype)
    for v in (torch.tensor([0.5], dtype=dtype), torch.tensor(math.nan, dtype=dtype), rand(9, seed=15).to(dtype)):
        check(torch.heaviside(x.to("neuron"), v.to("neuron")), torch.heaviside(x, v))
    d = x.to("neuron")
    d.heaviside_(torch.tensor(2.0, dtype=dtype).to("neuron"))
    check(d, torch.heaviside(x, torch.tensor(2.0, dtype=dtype)))


def test_heaviside_needs_equal_dtypes():
    torch.neuron.set_strict(False)  # torch's error comes from its CPU kernel
    with pytest.raises(RuntimeError, match="different dtypes"):
        torch.heaviside(torch.ones(3, device="neuron"), torch.tensor(0.5, dtype=torch.bfloat16, device="neuron"))


def test_float64_and_complex_stay_on_the_cpu():
    """Policy: float64 is never computed in float32; complex angle is not a real-input formula."""
    torch.neuron.set_strict(False)
    before = sum(torch.neuron.metrics()["fallback"].values())
    x = torch.tensor([0.3, -0.7, 1e-300], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warned once per process: counted every time
        for f in (torch.asin, torch.lgamma, SP.erfcx, SP.bessel_j0):
            got = f(x.to("neuron"))
            assert got.dtype == torch.float64
            torch.testing.assert_close(got.cpu(), f(x), rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(torch.atan2(x.to("neuron"), x.to("neuron")).cpu(), torch.atan2(x, x), rtol=0, atol=0)
        c = torch.tensor([1 + 1j, -1 - 0.5j])
        torch.testing.assert_close(torch.angle(c.to("neuron")).cpu(), torch.angle(c))
    assert sum(torch.neuron.metrics()["fallback"].values()) >= before + 6


# -- orthogonal polynomials (special.*_polynomial_*) -----------------------------------------------------------------
POLYNOMIALS = [f"chebyshev_polynomial_{k}" for k in "tuvw"] + [f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"] \
    + ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]
# torch's CPU returns an uninitialized value for x = NaN and n >= 2 in these kinds (its recurrence never runs): the
# device gives NaN, so NaN x is compared for the others only
_NAN_UNDEFINED = {n for n in POLYNOMIALS if n not in ("chebyshev_polynomial_t", "hermite_polynomial_h",
                                                      "hermite_polynomial_he")}
POLY_X = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.25, 0.75, 2.0, -2.0, -3.0, 1e-30, 1.0000001, -1.0000001, 9.0, -7.5, 30.0,
          1e20, -1e20, math.inf, -math.inf]
POLY_N = [-3.0, -0.5, 0.0, 0.7, 1.0, 1.9, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 20.0, 31.0, 127.0, 128.0,
          129.0, 1e20, -1e20, math.nan, math.inf, -math.inf]


def _poly(name, x, n, **kwargs):
    """torch.special.<name> on neuron (no CPU fallback) against the CPU."""
    f = getattr(SP, name)
    dev = [v.to("neuron") if isinstance(v, torch.Tensor) else v for v in (x, n)]
    with native(f"special_{name}"):
        got = f(*dev, **kwargs)
    check(got, f(x, n))
    return got


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_special_values_and_degrees(name):
    """Every pair of special x (|x| == 1, 0, beyond [-1, 1], huge, +-inf) and degree (negative, fractional,
    0, 1, the closed-form thresholds, the Hermite limit 128, NaN/inf/out of int64 range)."""
    xs = POLY_X + ([] if name in _NAN_UNDEFINED else [math.nan])
    x, n = torch.broadcast_tensors(torch.tensor(xs).view(-1, 1), torch.tensor(POLY_N).view(1, -1))
    _poly(name, x.contiguous(), n.contiguous())


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_ranges(name):
    """op_db's range (x in [-9, 9], small degrees), the interval at moderate degrees (closed forms), and |x| just
    above 1 at high degrees (long recurrences: the FMA steps reproduce the CPU's roundings)."""
    g = torch.Generator().manual_seed(21)
    _poly(name, rand(300, lo=-9, hi=9, seed=22), torch.randint(-2, 13, (300,), generator=g).float())
    lo = 0.0 if name.startswith("shifted") else -1.0
    _poly(name, rand(300, lo=lo + 0.01, hi=0.99, seed=23), torch.randint(0, 25, (300,), generator=g).float())
    _poly(name, rand(300, lo=1.0, hi=1.01, seed=24), torch.randint(0, 64, (300,), generator=g).float())


@pytest.mark.parametrize("name", POLYNOMIALS)
@settings(max_examples=8, deadline=None)
@given(pairs=st.lists(st.tuples(floats32, st.integers(-2, 4)), min_size=1, max_size=30))
def test_polynomial_hypothesis(name, pairs):
    """Any float32 x with the low degrees every kind computes by its special values and recurrence."""
    x = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
    n = torch.tensor([float(p[1]) for p in pairs])
    if name in _NAN_UNDEFINED:
        x = torch.nan_to_num(x, nan=0.5)
    _poly(name, x, n)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_u", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
                                  "laguerre_polynomial_l"])
def test_polynomial_scalars_promotion_and_out(name):
    f = getattr(SP, name)
    x, n = rand(4, 1, 5, seed=25), torch.arange(-1, 5).float().view(1, 6, 1)
    _poly(name, x, n)  # broadcast
    _poly(name, 0.3, n)  # Python x
    _poly(name, x, 3)  # Python n
    _poly(name, x, 2.9)  # truncated to 2
    _poly(name, x, 12)  # a degree past the closed-form thresholds, on the host
    _poly(name, torch.arange(-3, 4), torch.arange(7))  # int64 operands: a float32 result
    _poly(name, torch.tensor([True, False]), torch.tensor([3, 2], dtype=torch.int32))
    out = torch.empty(6, 4, device="neuron").t()  # non-contiguous out, resized from the wrong shape
    with native(f"special_{name}"):
        f(x[0].to("neuron"), n[0].to("neuron"), out=out)
    check(out, f(x[0], n[0]))
    empty = torch.empty(0, 3)
    check(f(empty.to("neuron"), empty.to("neuron")), f(empty, empty))


def test_polynomial_long_recurrence_falls_back_loudly():
    """Past 128 unrolled steps (|x| > 1 at a high degree) the CPU's loop runs, counted as a fallback; a high degree
    inside (-1, 1) is a closed form and stays on the device."""
    x, n = torch.tensor([1.0001, 0.5]), torch.tensor([300.0, 300.0])
    _poly("chebyshev_polynomial_t", x[1:], n[1:])
    torch.neuron.set_strict(False)
    before = torch.neuron.metrics()["fallback"].get("special_chebyshev_polynomial_t", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warned once per process: counted every time
        got = SP.chebyshev_polynomial_t(x.to("neuron"), n.to("neuron"))
    check(got, SP.chebyshev_polynomial_t(x, n))
    assert torch.neuron.metrics()["fallback"].get("special_chebyshev_polynomial_t", 0) == before + 1


def test_polynomial_reduced_precision_is_torchs_error():
    """torch's CPU has float32/float64 kernels only: bfloat16/float16 calls go to it for its error."""
    torch.neuron.set_strict(False)
    with pytest.raises(RuntimeError, match="not implemented for 'BFloat16'"):
        SP.legendre_polynomial_p(torch.ones(3, dtype=torch.bfloat16, device="neuron"), 2)
