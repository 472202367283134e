"""Exact int64 pointwise ops on the neuron device against PyTorch CPU: every int64 value (carries, borrows,
sign changes, INT64_MIN/MAX, wrapping overflow), broadcasting, Python-int scalars, 0-d tensors, mixed
integer dtypes, in-place, out= and strided operands. All run natively (strict mode)."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

LO, HI = -(2 ** 63), 2 ** 63 - 1
EDGES = [0, 1, -1, LO, HI, LO + 1, HI - 1, 2 ** 32, 2 ** 32 - 1, -(2 ** 32), 2 ** 31, -(2 ** 31), 2 ** 31 - 1,
         0xFFFFFFFF, 0x1_0000_FFFF, 0x7FFF_FFFF_0000_0000]
I64 = st.one_of(st.sampled_from(EDGES), st.integers(LO, HI), st.integers(-(2 ** 33), 2 ** 33))
SETTINGS = settings(max_examples=20, deadline=None)
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "rsub": torch.rsub, "maximum": torch.maximum,
    "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "clamp_min": torch.clamp_min, "clamp_max": torch.clamp_max,
}
SCALAR_OK = {"add", "sub", "mul", "rsub", "eq", "ne", "lt", "le", "gt", "ge", "clamp_min", "clamp_max"}


@pytest.fixture(autouse=True)
def strict():
    torch.neuron.set_strict(True)
    yield
    torch.neuron.set_strict(False)


def values(shape, data) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.tensor(data.draw(st.lists(I64, min_size=n, max_size=n)), dtype=torch.int64).reshape(shape)


def check(got, expected):
    assert got.device.type == "neuron"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.cpu(), expected)


def dev(v):
    return v.to("neuron") if isinstance(v, torch.Tensor) else v


@pytest.fixture(scope="module")
def grid():
    """Every pair of edge values plus random pairs over the whole range."""
    e = torch.tensor(EDGES, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    rnd = torch.randint(LO, HI, (2, 200), generator=g, dtype=torch.int64)
    return torch.cat([e.repeat_interleave(len(e)), rnd[0]]), torch.cat([e.repeat(len(e)), rnd[1]])


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_all_values(grid, name):
    a, b = grid
    check(BINARY[name](dev(a), dev(b)), BINARY[name](a, b))


@pytest.mark.parametrize("fn", [torch.neg, torch.abs], ids=["neg", "abs"])
def test_unary_all_values(grid, fn):
    check(fn(dev(grid[0])), fn(grid[0]))


@pytest.mark.parametrize("alpha", [2, -3, 2 ** 40 + 1, LO])
@pytest.mark.parametrize("fn", [torch.add, torch.sub, torch.rsub], ids=["add", "sub", "rsub"])
def test_alpha(grid, fn, alpha):
    a, b = grid
    check(fn(dev(a), dev(b), alpha=alpha), fn(a, b, alpha=alpha))
    check(fn(dev(a), 12345, alpha=alpha), fn(a, 12345, alpha=alpha))


@SETTINGS
@given(st.sampled_from(sorted(BINARY)), st.sampled_from([((3, 1, 4), (5, 1)), ((), (2, 3)), ((6,), ()),
                                                          ((2, 1), (1, 130)), ((0, 3), (3,))]), st.data())
def test_broadcast(name, shapes, data):
    a, b = values(shapes[0], data), values(shapes[1], data)
    check(BINARY[name](dev(a), dev(b)), BINARY[name](a, b))


@SETTINGS
@given(st.sampled_from(sorted(SCALAR_OK)), I64, st.data())
def test_python_int(name, s, data):
    a = values((5,), data)
    check(BINARY[name](dev(a), s), BINARY[name](a, s))


def test_many_scalar_values():
    """A signature that sees many scalar values switches to a 0-d operand: still exact."""
    a = torch.tensor([LO, -1, 0, HI])
    for s in [3, -(2 ** 40), HI, LO, 7, 2 ** 33, -5, 1]:
        check(dev(a) + s, a + s)
        check(dev(a) < s, a < s)


@SETTINGS
@given(st.sampled_from([torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]),
       st.sampled_from(["add", "mul", "lt", "maximum", "sub"]), st.data())
def test_mixed_dtypes(dtype, name, data):
    """A smaller integer operand (tensor or 0-d tensor) is promoted to int64 exactly."""
    a = values((4, 3), data)
    g = torch.Generator().manual_seed(1)
    b = (torch.randint(0, 2, (3,), generator=g) > 0 if dtype is torch.bool
         else torch.randint(torch.iinfo(dtype).min, torch.iinfo(dtype).max, (3,), generator=g, dtype=dtype))
    if name == "sub" and dtype is torch.bool:
        b = b.to(torch.int8)
    check(BINARY[name](dev(b), dev(a)), BINARY[name](b, a))
    check(BINARY[name](dev(a), torch.tensor(-(2 ** 35))), BINARY[name](a, torch.tensor(-(2 ** 35))))
    check(BINARY[name](dev(b), torch.tensor(2 ** 35)), BINARY[name](b, torch.tensor(2 ** 35)))


@SETTINGS
@given(I64, I64, st.data())
def test_clamp(lo, hi, data):
    a = values((2, 9), data)
    check(dev(a).clamp(lo, hi), a.clamp(lo, hi))
    check(dev(a).clamp(min=lo), a.clamp(min=lo))
    check(dev(a).clamp(max=hi), a.clamp(max=hi))
    mn, mx = values((9,), data), values((2, 1), data)
    check(dev(a).clamp(dev(mn), dev(mx)), a.clamp(mn, mx))
    check(dev(a).clamp(max=dev(mx)), a.clamp(max=mx))


@SETTINGS
@given(st.data())
def test_where(data):
    a, b = values((3, 4), data), values((4,), data)
    cond = torch.tensor(data.draw(st.lists(st.booleans(), min_size=12, max_size=12))).reshape(3, 4)
    check(torch.where(dev(cond), dev(a), dev(b)), torch.where(cond, a, b))
    check(torch.where(dev(cond), dev(a), 2 ** 40), torch.where(cond, a, 2 ** 40))
    check(torch.where(dev(cond), -(2 ** 40), dev(b)), torch.where(cond, -(2 ** 40), b))


def test_inplace_and_views(grid):
    a, b = grid
    x = dev(a).clone()
    x += dev(b)
    check(x, a + b)
    x.mul_(dev(b))
    check(x, (a + b) * b)
    y = dev(a).clone()
    y.clamp_(-5, 2 ** 40)
    check(y, a.clamp(-5, 2 ** 40))
    m = torch.zeros(len(a), 3, dtype=torch.int64, device="neuron")
    m[:, 1] -= dev(b)  # a strided in-place target
    ref = torch.zeros(len(a), 3, dtype=torch.int64)
    ref[:, 1] -= b
    check(m, ref)
    t = dev(a[:16]).view(4, 4).t()  # non-contiguous operands
    check(t + t.t(), a[:16].view(4, 4).t() + a[:16].view(4, 4))
    check(torch.lt(t, 3), a[:16].view(4, 4).t() < 3)


def test_out(grid):
    a, b = grid
    out = torch.empty(len(a), dtype=torch.int64, device="neuron")
    torch.sub(dev(a), dev(b), out=out)
    check(out, a - b)
    r = torch.empty(3, dtype=torch.int64, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about resizing a non-empty out
        torch.maximum(dev(a), dev(b), out=r)
    check(r, torch.maximum(a, b))
    f = torch.empty(len(a), device="neuron")
    torch.add(dev(a), dev(b), out=f)  # cast on the way out, as torch
    check(f, (a + b).float())
    c = torch.empty(len(a), dtype=torch.bool, device="neuron")
    torch.ge(dev(a), dev(b), out=c)
    check(c, a >= b)
    i = torch.empty(len(a), dtype=torch.int32, device="neuron")
    torch.add(dev(a), dev(b), out=i)  # int64 -> int32 wraps, as torch
    check(i, torch.add(a, b, out=torch.empty(len(a), dtype=torch.int32)))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(dev(a), dev(b), out=torch.empty(len(a), dtype=torch.bool, device="neuron"))


def test_errors_match_torch():
    a = torch.tensor([1, 2], device="neuron")
    with pytest.raises(RuntimeError):
        torch.add(a, torch.ones(3, dtype=torch.int64, device="neuron"))
    x = torch.arange(6, device="neuron")
    with pytest.raises(RuntimeError, match="single memory location"):
        x[1:].add_(x[:-1])


def test_index_arithmetic():
    """What decompositions and models do with int64 indices."""
    i = torch.arange(10, device="neuron")
    check((i * 3 + 1).clamp(max=20) - 2, (torch.arange(10) * 3 + 1).clamp(max=20) - 2)
    check(torch.where(i > 4, i - 5, i + 5), torch.where(torch.arange(10) > 4, torch.arange(10) - 5,
                                                         torch.arange(10) + 5))


DIVISION = {
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
    "div_floor": lambda a, d: torch.div(a, d, rounding_mode="floor"),
    "div_trunc": lambda a, d: torch.div(a, d, rounding_mode="trunc"),
}


@pytest.mark.parametrize("name", sorted(DIVISION))
@pytest.mark.parametrize("d", [1, 3, 1000, 2 ** 15])
def test_division_by_python_int(grid, name, d):
    """Index math (i // w, i % w) by a positive Python int up to 2**15 is native and exact."""
    a = torch.cat([grid[0], torch.arange(-70000, 70000, 997)])
    check(DIVISION[name](dev(a), d), DIVISION[name](a, d))


@SETTINGS
@given(st.sampled_from(sorted(DIVISION)), st.integers(1, 2 ** 15), st.data())
def test_division_hypothesis(name, d, data):
    a = values((3, 2), data)
    check(DIVISION[name](dev(a), d), DIVISION[name](a, d))
    x = dev(a).t()  # non-contiguous
    check(DIVISION[name](x, d), DIVISION[name](a.t(), d))


def test_division_inplace():
    a = torch.tensor([-7, 7, LO, HI])
    x = dev(a).clone()
    x //= 3
    check(x, a // 3)
    x = dev(a).clone()
    x %= 5
    check(x, a % 5)


@pytest.mark.parametrize("d", [-3, 2 ** 15 + 1, 0])
def test_other_divisors_take_the_cpu(d):
    """Divisors the kernels do not take run on the CPU: loud and correct (zero raises, as torch)."""
    torch.neuron.set_strict(False)
    a = torch.tensor([-7, 7, LO, HI])
    before = sum(torch.neuron.metrics()["fallback"].values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if d == 0:
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                dev(a) // d
        else:
            check(dev(a) // d, a // d)
    assert sum(torch.neuron.metrics()["fallback"].values()) == before + 1


@SETTINGS
@given(st.sampled_from(sorted(SCALAR_OK - {"clamp_min", "clamp_max"})), st.integers(2 ** 63, 2 ** 64 - 1), st.data())
def test_python_int_above_int64_wraps(name, s, data):
    """torch takes Python ints in [2**63, 2**64) for arithmetic and comparisons, wrapped to int64."""
    a = values((4,), data)
    check(BINARY[name](dev(a), s), BINARY[name](a, s))


def test_bounds_and_alpha_outside_int64_raise():
    a = dev(torch.tensor([1, -5]))
    with pytest.raises(RuntimeError, match="without overflow"):
        a.clamp(max=2 ** 63)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.add(a, a, alpha=2 ** 63)


@pytest.mark.parametrize("fn", [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor], ids=lambda f: f.__name__)
def test_bitwise_all_values_scalars_broadcasts_and_in_place(grid, fn):
    """Word by word (generate() keeps its finished-sequence flags in int64 and ands them)."""
    a, b = grid
    check(fn(dev(a), dev(b)), fn(a, b))
    for other in (0x0F0F0F0F0F0F0F0F, -2, True, torch.tensor(HI), b[:1].to(torch.int32), (b % 2).bool()):
        check(fn(dev(a), dev(other) if isinstance(other, torch.Tensor) and other.dim() else other), fn(a, other))
    x = dev(a.clone())
    getattr(x, fn.__name__ + "_")(dev(b))
    check(x, fn(a, b))
    check(~dev(a), ~a)



def test_masked_fill_all_values_scalars_and_tensor_values(grid):
    a, b = grid
    mask = (b % 3) == 0
    for value in (-7, HI, LO, torch.tensor(2 ** 40)):
        check(dev(a).masked_fill(dev(mask), value), a.masked_fill(mask, value))
    x = dev(a.clone())
    x.masked_fill_(dev(mask), LO)
    check(x, a.masked_fill(mask, LO))


CAST_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int32, torch.int16, torch.int8,
               torch.uint8, torch.int64, torch.float8_e4m3fn, torch.float8_e5m2]
LAYOUTS = {
    "transposed": lambda x: x.view(513, 16).t(), "sliced": lambda x: x.view(513, 16)[1:400:2, 3:11],
    "expanded": lambda x: x[:7].view(7, 1).expand(7, 300), "permuted": lambda x: x.view(27, 19, 16).permute(2, 0, 1),
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.is_floating_point and t.itemsize == 1 else t  # float8 NaNs by bits


@pytest.fixture(scope="module")
def wide_values():
    """513 * 16 int64 values over the whole range, with the edges and values that round beyond 2**24/2**32."""
    g = torch.Generator().manual_seed(2)
    v = torch.randint(LO, HI, (513 * 16,), generator=g)
    v[:64] = torch.arange(-32, 32)
    v[64:128] = torch.randint(-(2 ** 25), 2 ** 25, (64,), generator=g)
    v[128:128 + len(EDGES)] = torch.tensor(EDGES)
    v[200:204] = torch.tensor([2 ** 24 + 1, 2 ** 30 + 2 ** 22 + 1, 2 ** 60 + 2 ** 36 + 1, -(2 ** 53) - 1])
    return v


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", CAST_DTYPES, ids=str)
def test_cast_non_contiguous_int64_matches_cpu(wide_values, layout, dtype):
    """Casts of strided int64 views to every dtype (float: round to nearest, also beyond 2**24 and 2**32),
    into torch's layout and into a contiguous result."""
    x = LAYOUTS[layout](wide_values)
    d = LAYOUTS[layout](dev(wide_values))
    got = d.to(dtype)
    assert got.stride() == x.to(dtype).stride()
    assert torch.equal(_bits(got.cpu()), _bits(x.to(dtype)))
    out = torch.empty(x.shape, dtype=dtype, device="neuron")
    out.copy_(d)
    assert torch.equal(_bits(out.cpu()), _bits(x.to(dtype)))


def test_promotion_of_int64_views_with_floats_matches_cpu(wide_values):
    a = wide_values.view(513, 16).t()
    b = torch.randn(16, 513, generator=torch.Generator().manual_seed(3))
    check(dev(a) + dev(b), a + b)
    check(dev(a)[:, ::3] * dev(b)[:, ::3], a[:, ::3] * b[:, ::3])
    check(torch.cat([dev(a), dev(b)]), torch.cat([a, b]))
