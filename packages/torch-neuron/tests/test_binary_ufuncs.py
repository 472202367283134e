"""Binary pointwise ops on the neuron device against PyTorch CPU: broadcasting, type promotion with tensors,
0-d tensors (CPU and neuron) and Python scalars, in-place and out= overloads, strided and overlapping
operands; what runs on the CPU by design does so loudly and correctly."""

import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.fixture
def strict():
    torch.neuron.set_strict(True)
    yield
    torch.neuron.set_strict(False)


def sample(dtype, shape, seed=0, nonzero=False):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 4
        if x.numel() >= 4 and not nonzero:
            x.view(-1)[:4] = torch.tensor([math.nan, math.inf, -math.inf, 0.0])
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    lo, hi = (1, 60) if dtype == torch.uint8 else (-60, 60)
    x = torch.randint(lo, hi, shape, generator=g, dtype=dtype)
    return torch.where(x == 0, torch.ones((), dtype=dtype), x) if nonzero else x


def check(got, expected):
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


def neuron(v):
    return v.to("neuron") if isinstance(v, torch.Tensor) else v


SHAPES = [((4, 5), (4, 5)), ((4, 1), (1, 5)), ((3, 4, 5), (5,)), ((), (4, 5)), ((4, 5), ()), ((2, 1, 3), (4, 1))]
DTYPE_PAIRS = ([(d, d) for d in FLOATS + INTS] + [(torch.bool, torch.bool)]
               + [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16), (torch.int32, torch.float16),
                  (torch.uint8, torch.int8), (torch.bool, torch.int32), (torch.int16, torch.float32),
                  (torch.int8, torch.int32)])

# (name, function, accepts(dtype_a, dtype_b), nonzero divisor)
NUMERIC = lambda a, b: torch.bool not in (a, b)  # noqa: E731
ANY = lambda a, b: True  # noqa: E731
FLOAT_RESULT = lambda a, b: torch.promote_types(a, b).is_floating_point  # noqa: E731
INTEGRAL = lambda a, b: not a.is_floating_point and not b.is_floating_point  # noqa: E731
OPS = [
    ("add", torch.add, ANY, False),
    ("sub", torch.sub, NUMERIC, False),
    ("mul", torch.mul, ANY, False),
    ("div", torch.div, ANY, False),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), FLOAT_RESULT, False),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), FLOAT_RESULT, False),
    ("floor_divide", torch.floor_divide, FLOAT_RESULT, False),
    ("remainder", torch.remainder, FLOAT_RESULT, False),
    ("fmod", torch.fmod, FLOAT_RESULT, False),
    ("pow", torch.pow, FLOAT_RESULT, False),
    ("maximum", torch.maximum, ANY, False),
    ("minimum", torch.minimum, ANY, False),
    ("fmax", torch.fmax, ANY, False),
    ("fmin", torch.fmin, ANY, False),
    ("eq", torch.eq, ANY, False), ("ne", torch.ne, ANY, False), ("lt", torch.lt, ANY, False),
    ("le", torch.le, ANY, False), ("gt", torch.gt, ANY, False), ("ge", torch.ge, ANY, False),
    ("logical_and", torch.logical_and, ANY, False), ("logical_or", torch.logical_or, ANY, False),
    ("logical_xor", torch.logical_xor, ANY, False),
    ("bitwise_and", torch.bitwise_and, INTEGRAL, False), ("bitwise_or", torch.bitwise_or, INTEGRAL, False),
    ("bitwise_xor", torch.bitwise_xor, INTEGRAL, False),
    ("copysign", torch.copysign, ANY, False),
]


@pytest.mark.parametrize("name,fn,accepts,nonzero", OPS, ids=[o[0] for o in OPS])
def test_tensor_tensor_broadcasting_and_promotion(strict, name, fn, accepts, nonzero):
    for da, db in DTYPE_PAIRS:
        if not accepts(da, db):
            continue
        for i, (sa, sb) in enumerate(SHAPES):
            a, b = sample(da, sa, seed=i), sample(db, sb, seed=i + 7)
            check(fn(a.to("neuron"), b.to("neuron")), fn(a, b))


SCALARS = [3, -2, 2.5, -0.3337, True, 1000]


@pytest.mark.parametrize("name,fn,accepts,nonzero", OPS, ids=[o[0] for o in OPS])
def test_python_scalars_both_sides(strict, name, fn, accepts, nonzero):
    """Scalars promote as torch's wrapped numbers do; ints wrap into narrow integer dtypes and floats round
    to bfloat16/float16 where torch converts them (add, sub, comparisons), not where it keeps them (mul,
    div)."""
    for dtype in FLOATS + INTS + [torch.bool]:
        x = sample(dtype, (3, 4), nonzero=True)
        for s in SCALARS:
            for args in ((x, s), (s, x)):
                try:
                    expected = fn(*args)
                except (RuntimeError, TypeError):
                    continue
                if _cpu_by_design(name, args, expected):
                    continue
                check(fn(*map(neuron, args)), expected)


def _cpu_by_design(name, args, expected) -> bool:
    """int64 arithmetic, integer division/powers by a tensor and bool powers run on the CPU (tested below)."""
    if torch.result_type(*args) == torch.int64 and expected.dtype != torch.bool:
        return True
    integral = not expected.is_floating_point()
    return integral and (name == "pow" or (isinstance(args[1], torch.Tensor) and name in (
        "div_floor", "div_trunc", "floor_divide", "remainder", "fmod")))


@pytest.mark.parametrize("dtype0", [torch.float64, torch.int64, torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("on_device", [False, True])
def test_zero_dim_tensor_operands(strict, dtype0, on_device):
    """0-d tensors rank below dimensioned tensors in promotion; CPU 0-d tensors may join neuron tensors."""
    z = torch.tensor(3 if not dtype0.is_floating_point else 1.5, dtype=dtype0)
    zz = z.to("neuron") if on_device else z
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.uint8):
        x = sample(dtype, (3, 4), nonzero=True)
        for fn in (torch.add, torch.mul, torch.sub, torch.maximum, torch.lt, torch.div):
            for a, b, da, db in ((x, z, x.to("neuron"), zz), (z, x, zz, x.to("neuron"))):
                expected = fn(a, b)
                if torch.result_type(a, b) in (torch.int64, torch.float64):
                    continue  # computes in a 64-bit dtype: the CPU's (tested below)
                check(fn(da, db), expected)


CPU_0D_FAMILY = {
    "copysign": torch.copysign, "atan2": torch.atan2, "hypot": torch.hypot, "fmod": torch.fmod,
    "remainder": torch.remainder, "nextafter": torch.nextafter, "xlogy": torch.xlogy, "pow": torch.pow,
    "logaddexp": torch.logaddexp, "logaddexp2": torch.logaddexp2, "fmax": torch.fmax, "fmin": torch.fmin,
    "maximum": torch.maximum, "heaviside": torch.heaviside, "ldexp": torch.ldexp,
    "special_xlog1py": torch.special.xlog1py,
}


@pytest.mark.parametrize("name", sorted(CPU_0D_FAMILY))
def test_binary_ops_take_a_cpu_0d_operand_on_either_side(strict, name):
    """A CPU 0-d tensor joins a neuron tensor as in add (TensorIterator's scalars): on either side, in-place
    and out= (copysign's decomposition required both on one device)."""
    fn = CPU_0D_FAMILY[name]
    x = torch.tensor([0.5, -1.5, 2.0, 3.0, -0.0, 0.0])
    for z in (torch.tensor(-1.0), torch.tensor(2.0), torch.tensor(-0.0)):
        check(fn(x.to("neuron"), z), fn(x, z))
        check(fn(z, x.to("neuron")), fn(z, x))
        out = torch.empty(0, device="neuron")
        check(fn(x.to("neuron"), z, out=out), fn(x, z))
        if hasattr(torch.Tensor, f"{name}_"):
            d, c = x.to("neuron"), x.clone()
            getattr(d, f"{name}_")(z)
            check(d, getattr(c, f"{name}_")(z))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_copysign_matches_cpu_bits(strict, dtype):
    """Natively, bit for bit: signed zeros, infinities, NaN signs and payloads, subnormals; CPU 0-d tensors and
    Python numbers on either side, integer operands (a float result), in-place and out=."""
    nan = math.nan
    x = torch.tensor([0.5, -1.5, 0.0, -0.0, math.inf, -math.inf, nan, -nan, 1e-40, 3.0]).to(dtype)
    y = torch.tensor([1.0, 1.0, -0.0, 0.0, -2.0, 3.0, -1.0, 1.0, -nan, nan]).to(dtype)

    def same(got, ref):
        assert got.device.type == "neuron" and got.dtype == ref.dtype and got.shape == ref.shape
        assert torch.equal(_bits(got.cpu()), _bits(ref))

    same(torch.copysign(x.to("neuron"), y.to("neuron")), torch.copysign(x, y))
    same(torch.copysign(x.to("neuron").view(2, 5).t(), y.to("neuron")[:2]), torch.copysign(x.view(2, 5).t(), y[:2]))
    for z in (torch.tensor(-1.0), torch.tensor(-0.0), torch.tensor(-nan), torch.tensor(-2), torch.tensor(True)):
        same(torch.copysign(x.to("neuron"), z), torch.copysign(x, z))
        same(torch.copysign(z, x.to("neuron")), torch.copysign(z, x))
    for s in (-1.0, -0.0, 2, -3):
        same(torch.copysign(x.to("neuron"), s), torch.copysign(x, s))
    d = x.to("neuron")
    d.copysign_(torch.tensor(-1.0))
    same(d, x.clone().copysign_(torch.tensor(-1.0)))
    out = torch.empty(0, dtype=dtype, device="neuron")
    same(torch.copysign(x.to("neuron"), torch.tensor(-1.0), out=out), torch.copysign(x, torch.tensor(-1.0)))
    i = torch.tensor([3, -4, 0, 7], dtype=torch.int32)
    same(torch.copysign(i.to("neuron"), i.flip(0).to("neuron")), torch.copysign(i, i.flip(0)))
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.to("neuron").copysign_(torch.tensor(-1.0))


@pytest.mark.parametrize("big", [9223372036854775806, -(2**40) - 3, 300])
def test_true_division_by_a_wide_zero_dim_int_converts_it_to_the_float(big):
    """int8 / int64 0-d (and the reverse) is a float division of the int64's value (TensorIterator promotes
    integer inputs to the float result), not of that value wrapped into the int8 promotion first (-2 for
    9223372036854775806); an integer result still wraps the 0-d operand, as on the CPU."""
    a, b = torch.tensor([4, -7], dtype=torch.int8), torch.tensor(big)
    check(a.to("neuron") / b.to("neuron"), a / b)
    check(b.to("neuron") / a.to("neuron"), b / a)
    check(a.to("neuron") + b.to("neuron"), a + b)


def test_zero_dim_results():
    a, b = torch.tensor(2.5), torch.tensor(-1.0)
    check(a.to("neuron") * b.to("neuron"), a * b)
    check(torch.add(a.to("neuron"), 3), a + 3)


def test_cpu_tensor_with_dims_is_a_device_mismatch():
    with pytest.raises(RuntimeError, match="same device"):
        torch.add(torch.ones(3).to("neuron"), torch.ones(3))


def test_alpha(strict):
    a, b = torch.randn(4, 6), torch.randn(6)
    for alpha in (2, -0.5, 0.3337):
        check(torch.add(a.to("neuron"), b.to("neuron"), alpha=alpha), torch.add(a, b, alpha=alpha))
        check(torch.sub(a.to("neuron"), b.to("neuron"), alpha=alpha), torch.sub(a, b, alpha=alpha))
        check(torch.rsub(a.to("neuron"), b.to("neuron"), alpha=alpha), torch.rsub(a, b, alpha=alpha))
    x, y = torch.randint(-50, 50, (5,), dtype=torch.int32), torch.randint(-50, 50, (5,), dtype=torch.int32)
    check(torch.add(x.to("neuron"), y.to("neuron"), alpha=3), torch.add(x, y, alpha=3))
    with pytest.raises((ValueError, RuntimeError), match="alpha"):  # (torch's meta check says RuntimeError)
        torch.add(x.to("neuron"), y.to("neuron"), alpha=0.5)


@pytest.mark.parametrize("alpha", [-1, -255, 255, -256, 256])
def test_alpha_for_unsigned_dtypes_takes_negatives_down_to_minus_max(alpha):
    """c10's overflow check lets uint8 take alpha in [-255, 255] (a negative one wraps: alpha -1 subtracts);
    beyond that, torch's overflow error, as on the CPU."""
    x = torch.tensor([5, 0, 200], dtype=torch.uint8)
    if abs(alpha) > 255:
        for t in (x, x.to("neuron")):
            with pytest.raises(RuntimeError, match="without overflow"):
                torch.add(t, 2, alpha=alpha)
        return
    check(torch.add(x.to("neuron"), 2, alpha=alpha), torch.add(x, 2, alpha=alpha))


def test_alpha_in_reduced_precision(strict):
    """torch rounds alpha to the dtype and computes a + alpha * b in float32, rounding once. (Its CPU
    kernel's scalar tail loop rounds alpha * b to the dtype too, so short CPU tensors can differ from
    long ones by an ulp; the reference here is the vectorized loop's formula.)"""
    for dtype in (torch.bfloat16, torch.float16):
        a, b = (torch.randn(300) * 3).to(dtype), (torch.randn(300) * 3).to(dtype)
        for alpha in (3, -0.3337):
            ar = torch.tensor(alpha, dtype=dtype).float()
            check(torch.add(a.to("neuron"), b.to("neuron"), alpha=alpha), (a.float() + ar * b.float()).to(dtype))
            check(torch.sub(a.to("neuron"), b.to("neuron"), alpha=alpha), (a.float() - ar * b.float()).to(dtype))


def test_integer_wraparound_and_overflow_checks(strict):
    a = torch.tensor([1, -100, 127], dtype=torch.int8)
    for fn in (lambda t: t + 1000, lambda t: t * 1000, lambda t: t - 1000, lambda t: t < 1000,
               lambda t: t == 1000 - 256, lambda t: t & 1000, lambda t: torch.maximum(t, torch.tensor(1000))):
        check(fn(a.to("neuron")), fn(a))
    for fn in (lambda t: t.clamp(max=1000), lambda t: torch.add(t, t, alpha=1000)):
        with pytest.raises(RuntimeError, match="overflow"):
            fn(a.to("neuron"))


def test_shifts_by_scalars(strict):
    for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
        x = sample(dtype, (4, 5))
        for count in (0, 1, 3, 7, 15, 31, 40, -1):
            check(x.to("neuron") << count, x << count)
            check(x.to("neuron") >> count, x >> count)
        y = x.to("neuron")
        y <<= 2
        check(y, x << 2)


@pytest.mark.parametrize("method", ["add_", "sub_", "mul_", "div_", "fmod_", "remainder_", "pow_", "lt_",
                                    "logical_and_", "clamp_min_", "clamp_max_"])
def test_inplace_broadcast_views(strict, method):
    x, y = torch.randn(6, 8), torch.rand(8) + 0.5
    for view in (lambda t: t, lambda t: t.t()[:, :6].t(), lambda t: t[::2]):
        expected = x.clone()
        getattr(view(expected), method)(y)
        got = x.to("neuron")
        v = view(got)
        assert getattr(v, method)(y.to("neuron")) is v
        check(got, expected)


def test_inplace_aliasing_operands(strict):
    x = torch.randn(5, 5)
    expected, got = x.clone(), x.to("neuron")
    expected.add_(expected)
    got.add_(got)  # the identical view: fine
    check(got, expected)
    for fn in (lambda t: t.mul_(t.t()), lambda t: t[1:].sub_(t[:-1]), lambda t: torch.add(t[1:], 1, out=t[:-1]),
               lambda t: torch.exp(t[1:], out=t[:-1]), lambda t: torch.where(t > 0, t[0], t, out=t)):
        with pytest.raises(RuntimeError, match="single memory location"):
            fn(x.clone())
        with pytest.raises(RuntimeError, match="single memory location"):
            fn(x.to("neuron"))


def test_inplace_result_cast_rules(strict):
    x = torch.arange(5, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="add/sub_"):
        x.to("neuron").add_(1.5)
    y = torch.randn(5).bfloat16()
    got = y.to("neuron")
    got.add_(torch.randn(5).to("neuron"))  # float32 result cast back into bfloat16
    z = torch.arange(4.0).to("neuron")
    z.lt_(2)  # bool result stored as float
    check(z, torch.arange(4.0).lt_(2))
    with pytest.raises(RuntimeError):
        torch.ones(3).to("neuron").add_(torch.ones(2, 3).to("neuron"))  # the result would not fit self


def test_out_variants(strict):
    a, b = torch.randn(4, 5), torch.randn(5)
    for fn in (torch.add, torch.mul, torch.maximum, torch.lt, torch.div):
        expected = fn(a, b)
        out = torch.empty(0, dtype=expected.dtype, device="neuron")
        assert fn(a.to("neuron"), b.to("neuron"), out=out) is out
        check(out, expected)
        strided = torch.empty(5, 4, dtype=expected.dtype, device="neuron").t()
        fn(a.to("neuron"), b.to("neuron"), out=strided)
        check(strided, expected)
    out = torch.empty(4, 5, dtype=torch.float16, device="neuron")
    torch.add(a.to("neuron"), b.to("neuron"), out=out)  # a float32 result into a float16 out: cast
    check(out, torch.add(a, b).half())
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(a.to("neuron"), b.to("neuron"), out=torch.empty(4, 5, dtype=torch.int32, device="neuron"))
    out = a.to("neuron")
    torch.mul(out, 2, out=out)  # out aliasing an input
    check(out, a * 2)


@pytest.mark.parametrize("fn", [torch.maximum, torch.add, torch.mul])
def test_out_aliasing_an_input_must_have_the_broadcast_shape(fn):
    """out= that is also an operand is read by TensorIterator, so it is not resized to the broadcast shape:
    torch's error, as on the CPU (an out= that is not an operand is resized)."""
    for x, other in ((torch.randn(()), torch.randn(3)), (torch.randn(1, 4), torch.randn(3, 1))):
        for device in ("cpu", "neuron"):
            a, b = x.to(device), other.to(device)
            with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
                fn(a, b, out=a)
            torch.testing.assert_close(a.cpu(), x)
    out = torch.empty((), device="neuron")
    with pytest.warns(UserWarning, match="resized"):
        fn(torch.randn(()).to("neuron"), torch.randn(3).to("neuron"), out=out)
    assert out.shape == (3,)


def test_zero_size(strict):
    for fn in (torch.add, torch.mul, torch.lt, torch.div):
        a, b = torch.randn(0, 3), torch.randn(1, 3)
        got = fn(a.to("neuron"), b.to("neuron"))
        assert got.shape == (0, 3) and got.dtype == fn(a, b).dtype
        x = torch.empty(0, device="neuron")
        assert x.add_(1) is x


def test_divisions_on_integers(strict):
    a = torch.tensor([7, -7, 9, -9, 0, 2**31 - 1, -2**31], dtype=torch.int32)
    for d in (2, -2, 3, 7, -1000):
        for mode in ("floor", "trunc"):
            check(torch.div(a.to("neuron"), d, rounding_mode=mode), torch.div(a, d, rounding_mode=mode))
        check(torch.remainder(a.to("neuron"), d), torch.remainder(a, d))
        check(torch.fmod(a.to("neuron"), d), torch.fmod(a, d))
        check(a.to("neuron") / d, a / d)
    check(a.to("neuron") ** 3, a ** 3)


def test_cpu_by_design_is_loud_and_correct():
    """Integer division by a tensor (a zero divisor must raise), integer powers with tensor exponents and
    int64 shifts and division by a tensor run on the CPU: counted, correct."""
    a = torch.tensor([7, -7, 9], dtype=torch.int32)
    b = torch.tensor([2, 3, 0], dtype=torch.int32)
    cases = [(lambda x, y: torch.div(x, y, rounding_mode="floor"), (a, torch.tensor([2, 3, -4], dtype=torch.int32))),
             (lambda x, y: x ** y, (a, torch.tensor([2, 3, 1], dtype=torch.int32))),
             (lambda x, y: x << y, (torch.tensor([1, 2]), torch.tensor([3, 40]))),
             (lambda x, y: x // y, (torch.tensor([2**40, -7]), torch.tensor([3, 2])))]
    before = sum(torch.neuron.metrics()["fallback"].values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn, (x, y) in cases:
            check(fn(x.to("neuron"), y.to("neuron")), fn(x, y))
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.div(a.to("neuron"), b.to("neuron"), rounding_mode="trunc")
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            a.to("neuron") // 0
    assert sum(torch.neuron.metrics()["fallback"].values()) >= before + len(cases)


def test_float64_computes_on_the_cpu():
    x = torch.randn(3, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.sub(x.to("neuron"), 1e-300) / 1e300  # float32 would flush 1e-300 and overflow 1e300
    check(got, torch.sub(x, 1e-300) / 1e300)


@st.composite
def broadcast_pair(draw):
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    other = [draw(st.sampled_from([n, 1])) for n in shape][draw(st.integers(0, ndim)):]
    if draw(st.booleans()):
        shape, other = other, shape
    return tuple(shape), tuple(other)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=broadcast_pair(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int32]),
       transpose=st.booleans(), op=st.sampled_from(["add", "mul", "maximum", "sub", "ge", "where"]))
def test_hypothesis_broadcast_strides(shapes, dtype, transpose, op):
    torch.neuron.set_strict(True)
    try:
        sa, sb = shapes
        a, b = sample(dtype, sa, seed=len(sa)), sample(dtype, sb, seed=len(sb) + 3)
        if transpose and a.dim() >= 2:  # a non-contiguous operand with the same shape
            a = a.transpose(0, 1).contiguous().transpose(0, 1)
        if op == "where":
            cond = sample(torch.bool, torch.broadcast_shapes(sa, sb))
            fn = lambda x, y: torch.where(cond if x.device.type == "cpu" else cond.to("neuron"), x, y)  # noqa: E731
        else:
            fn = getattr(torch, op)
        check(fn(a.to("neuron"), b.to("neuron")), fn(a, b))
    finally:
        torch.neuron.set_strict(False)


def test_changing_scalars_stop_tracing(strict):
    """A scalar that changes every call (a learning rate, a bias correction) becomes a device operand after a
    few values: one program serves them all, results unchanged."""
    x, g = torch.randn(64, 33), torch.randn(64, 33)
    for dtype in (torch.float32, torch.bfloat16):
        xd, gd, xc = x.to(dtype).to("neuron"), g.to(dtype).to("neuron"), x.to(dtype).clone()
        sizes = []
        for step in range(12):
            lr = 0.01 / (step + 1)
            for fn in (lambda t, u, lr=lr: t.add_(u, alpha=-lr), lambda t, u, lr=lr: t.mul_(1 - lr),
                       lambda t, u, lr=lr: t.div_(1 + lr), lambda t, u, lr=lr: t.addcdiv_(u, u.abs() + 1, value=-lr),
                       lambda t, u, lr=lr: t.lerp_(u, lr), lambda t, u, lr=lr: t.sub_(lr)):
                fn(xd, gd)
                fn(xc, g.to(dtype))
            sizes.append(torch.neuron.metrics()["caches"]["launch"]["misses"])
        check(xd, xc)
        assert sizes[-1] == sizes[-4], sizes  # no new launches once the values are operands


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_changing_scalars_on_zero_dim_reduced_tensors(strict, dtype):
    """Once a changing float scalar is a 0-d float32 operand, a 0-d bf16/fp16 tensor times it still gives the
    tensor's dtype (two 0-d operands would otherwise promote to float32), with the CPU's values."""
    x = torch.tensor(1.7, dtype=dtype)
    for v in (0.3, 0.7, 1.1, 1.9, 2.3, 3.1, 0.7071067811865476):
        for fn in (torch.mul, torch.div):
            got, expected = fn(x.to("neuron"), v), fn(x, v)
            assert got.dtype == expected.dtype, (fn, v)
            torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pow_rounds_python_float_operands_to_the_reduced_dtype(strict, dtype):
    x = torch.linspace(0.1, 4, 50).to(dtype)
    for v in (2.3, 0.3, 1.9, 3.3):
        for fn in (lambda a, v=v: torch.pow(a, v), lambda a, v=v: torch.pow(v, a)):
            torch.testing.assert_close(fn(x.to("neuron")).cpu(), fn(x), rtol=0, atol=0)


FLOOR_TRUNC = {
    "floor_divide": lambda a, b: torch.floor_divide(a, b),
    "div floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "//=": lambda a, b: a.clone().floor_divide_(b),
    "div_ trunc": lambda a, b: a.clone().div_(b, rounding_mode="trunc"),
}


@pytest.mark.parametrize("name", list(FLOOR_TRUNC))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(divisor=st.floats(1e-3, 50).map(lambda v: round(v, 3)), negative=st.booleans(), as_tensor=st.booleans())
@example(divisor=0.1, negative=False, as_tensor=False)
def test_floor_and_trunc_division_read_a_float_scalar_divisor_at_full_precision(strict, name, dtype, divisor,
                                                                                   negative, as_tensor):
    """The CPU divides a bfloat16/float16 tensor by a Python float (or 0-d tensor) divisor at its float32 value:
    float16(1.0) // 0.1 is 9; the divisor rounded to the dtype (0.0999755859375) gave 10."""
    fn = FLOOR_TRUNC[name]
    noise = torch.randn(200, generator=torch.Generator().manual_seed(1)) * 10
    x = torch.cat([torch.tensor([1.0, 3.0, 0.3, -1.0, 7.0]), noise]).to(dtype)
    b = -divisor if negative else divisor
    b = torch.tensor(b) if as_tensor else b
    got = fn(x.to("neuron"), neuron(b))
    expected = fn(x, b)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    if name == "floor_divide" and dtype == torch.float16 and b == 0.1:
        assert got.cpu()[0].item() == 9.0
