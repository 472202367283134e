"""int64 kernels built from 32-bit words against numpy int64 (which wraps like torch)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError
from neuron_kernels.library import wide_int as W

SETTINGS = settings(max_examples=25, deadline=None)
LO, HI = -(2 ** 63), 2 ** 63 - 1
# values where words carry, borrow or change sign
EDGES = [0, 1, -1, LO, HI, LO + 1, HI - 1, 2 ** 32, 2 ** 32 - 1, -(2 ** 32), 2 ** 31, -(2 ** 31), 2 ** 31 - 1,
         0xFFFFFFFF, -0xFFFFFFFF, 0x1_0000_FFFF, 0x7FFF_FFFF_0000_0000]
I64 = st.one_of(st.sampled_from(EDGES), st.integers(LO, HI), st.integers(-(2 ** 33), 2 ** 33))
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
          "rsub": lambda a, b: np.subtract(b, a)}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal}


def words(a) -> np.ndarray:
    """An int64 array as its [..., 2] int32 word array."""
    a = np.ascontiguousarray(np.asarray(a, dtype=np.int64))
    return a.view(np.int32).reshape(*a.shape, 2)


def value(r: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(r).view(np.int64).reshape(r.shape[:-1])


def arrays(shape, data):
    return np.array(data.draw(st.lists(I64, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                    dtype=np.int64).reshape(shape)


@pytest.fixture(scope="module")
def grid():
    """Every pair of edge values plus random pairs."""
    rng = np.random.default_rng(0)
    e = np.array(EDGES, dtype=np.int64)
    a = np.concatenate([e.repeat(len(e)), rng.integers(LO, HI, 300, dtype=np.int64, endpoint=True)])
    b = np.concatenate([np.tile(e, len(e)), rng.integers(LO, HI, 300, dtype=np.int64, endpoint=True)])
    return a, b


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_edges(grid, name):
    a, b = grid
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(value(getattr(W, name)(words(a), words(b))), BINARY[name](a, b))


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_compare_edges(grid, name):
    a, b = grid
    r = getattr(W, name)(words(a), words(b))
    assert r.dtype == np.bool_
    np.testing.assert_array_equal(r, COMPARE[name](a, b))


def test_unary_edges(grid):
    a = grid[0]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(value(W.neg(words(a))), -a)
        np.testing.assert_array_equal(value(W.abs(words(a))), np.abs(a))


@SETTINGS
@given(st.sampled_from(sorted(BINARY) + sorted(COMPARE)), st.sampled_from([((3, 1, 4), (5, 1)), ((), (2, 3)),
                                                                            ((6,), ()), ((2, 1), (1, 130))]),
       st.data())
def test_broadcast(name, shapes, data):
    a, b = arrays(shapes[0], data), arrays(shapes[1], data)
    ref = BINARY.get(name) or COMPARE[name]
    with np.errstate(over="ignore"):
        r = getattr(W, name)(words(a), words(b))
        np.testing.assert_array_equal(r if name in COMPARE else value(r), ref(a, b))


@SETTINGS
@given(st.sampled_from(sorted(BINARY) + sorted(COMPARE)), I64, st.booleans(), st.data())
def test_python_int(name, s, left, data):
    a = arrays((7,), data)
    ref = BINARY.get(name) or COMPARE[name]
    args = (s, words(a)) if left else (words(a), s)
    nargs = (np.int64(s), a) if left else (a, np.int64(s))
    with np.errstate(over="ignore"):
        r = getattr(W, name)(*args)
        np.testing.assert_array_equal(r if name in COMPARE else value(r), ref(*nargs))


@SETTINGS
@given(I64, I64, st.booleans(), st.data())
def test_clamp(lo, hi, tensor_bounds, data):
    a = arrays((2, 9), data)
    if tensor_bounds:
        mn, mx = arrays((9,), data), arrays((2, 1), data)
        r = W.clamp(words(a), words(mn), words(mx))
    else:
        mn, mx = np.int64(lo), np.int64(hi)
        r = W.clamp(words(a), lo, hi)
    np.testing.assert_array_equal(value(r), np.minimum(np.maximum(a, mn), mx))
    np.testing.assert_array_equal(value(W.clamp(words(a), min=lo)), np.maximum(a, np.int64(lo)))
    np.testing.assert_array_equal(value(W.clamp(words(a), max=hi)), np.minimum(a, np.int64(hi)))


@SETTINGS
@given(I64, st.data())
def test_where(s, data):
    a, b = arrays((3, 4), data), arrays((4,), data)
    cond = np.array(data.draw(st.lists(st.booleans(), min_size=12, max_size=12))).reshape(3, 4)
    np.testing.assert_array_equal(value(W.where(cond, words(a), words(b))), np.where(cond, a, b))
    np.testing.assert_array_equal(value(W.where(cond, s, words(b))), np.where(cond, np.int64(s), b))
    np.testing.assert_array_equal(value(W.where(cond[:1], words(a), s)), np.where(cond[:1], a, np.int64(s)))


def test_large_tiles():
    """Several tiles per partition and a remainder chunk."""
    rng = np.random.default_rng(1)
    a = rng.integers(LO, HI, (3, 70001), dtype=np.int64, endpoint=True)
    b = rng.integers(LO, HI, (70001,), dtype=np.int64, endpoint=True)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(value(W.add(words(a), words(b))), a + b)
        np.testing.assert_array_equal(value(W.mul(words(a), words(b))), a * b)


def test_errors():
    with pytest.raises(KernelError, match="word array"):
        W.add(np.zeros((3,), np.int32), 1)
    with pytest.raises(KernelError, match="at least one"):
        W.add(1, 2)
    with pytest.raises(OverflowError):
        W.add(words([1]), 2 ** 63)
    with pytest.raises(KernelError, match="min and max"):
        W.clamp(words([1]))


def _torch_like_division(a: np.ndarray, d: int):
    """floor/trunc quotient and remainder/fmod with Python's exact integers (numpy's wrap differently)."""
    xs = [int(v) for v in a.ravel()]
    wrap = [((v + 2 ** 63) % 2 ** 64) - 2 ** 63 for v in (x // d for x in xs)]
    trunc = [abs(x) // d * (1 if x >= 0 else -1) for x in xs]
    out = {"floor_divide": wrap, "remainder": [x % d for x in xs],
           "trunc_divide": [((v + 2 ** 63) % 2 ** 64) - 2 ** 63 for v in trunc],
           "fmod": [x - t * d for x, t in zip(xs, trunc)]}
    return {k: np.array(v, dtype=np.int64).reshape(a.shape) for k, v in out.items()}


@pytest.mark.parametrize("d", [1, 2, 3, 7, 10, 256, 1000, 12345, W.DIV_MAX - 1, W.DIV_MAX])
def test_division_by_constant_edges(grid, d):
    a = np.concatenate([grid[0], np.arange(-70000, 70000, 997)])
    ref = _torch_like_division(a, d)
    for name, expected in ref.items():
        np.testing.assert_array_equal(value(getattr(W, name)(words(a), d)), expected, err_msg=name)


@SETTINGS
@given(st.integers(1, W.DIV_MAX), st.sampled_from(["floor_divide", "remainder", "trunc_divide", "fmod"]), st.data())
def test_division_by_constant(d, name, data):
    a = arrays((2, 5), data)
    np.testing.assert_array_equal(value(getattr(W, name)(words(a), d)), _torch_like_division(a, d)[name])


@pytest.mark.parametrize("d", [0, -1, W.DIV_MAX + 1, 2.0, True])
def test_division_divisor_range(d):
    with pytest.raises(KernelError, match="divisor"):
        W.floor_divide(words([5]), d)
