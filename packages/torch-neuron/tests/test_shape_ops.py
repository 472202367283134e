"""Copying shape ops on the neuron device against PyTorch CPU: cat / stack, flip, roll, tril / triu,
constant_pad_nd, repeat. They move bytes only, so results must be bit-identical for every dtype."""

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
SETTINGS = settings(max_examples=15, deadline=None)
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
          torch.uint8, torch.bool, torch.float64]


def sample(shape, dtype) -> torch.Tensor:
    """Values that exercise every byte: large int64 (beyond 32 bits), signed zeros, inf, nan."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(shape, dtype=torch.float64) * 100
        flat = x.view(-1)
        for i, v in enumerate([-0.0, float("inf"), float("nan")][:flat.numel()]):
            flat[i] = v
        return x.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, dtype=dtype)


def same(got, want):
    assert got.device.type == DEV and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def strided(t: torch.Tensor) -> torch.Tensor:
    """t on the device as a non-contiguous view (every other element of a wider tensor)."""
    if t.dim() == 0:
        return t.to(DEV)
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., 1::2] = t
    return wide.to(DEV)[..., 1::2]


SHAPES = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@SETTINGS
@given(SHAPES, st.data(), st.sampled_from(DTYPES), st.booleans())
def test_cat_matches_cpu(shape, data, dtype, strided_inputs):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    widths = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    parts = []
    for w in widths:
        s = list(shape)
        s[dim] = w
        parts.append(sample(s, dtype))
    want = torch.cat(parts, dim)
    with native("cat" if want.numel() else None):
        got = torch.cat([strided(p) if strided_inputs else p.to(DEV) for p in parts], dim)
    same(got, want)


def test_cat_promotes_casts_and_skips_legacy_empties():
    a, b = torch.randn(2, 3), torch.randint(-5, 5, (2, 2), dtype=torch.int32)
    with native("cat"):
        promoted = torch.cat([a.to(DEV), b.to(DEV), torch.empty(0).to(DEV)], 1)
        out = torch.empty(0, dtype=torch.float16, device=DEV)
        torch.cat([a.to(DEV), b.to(DEV)], 1, out=out)
        stacked = torch.stack([a.to(DEV), strided(a)], 1)
    same(promoted, torch.cat([a, b, torch.empty(0)], 1))
    same(out, torch.cat([a, b], 1).half())
    same(stacked, torch.stack([a, a], 1))
    with pytest.raises(TypeError, match="can't be cast"):
        torch.cat([a.to(DEV)], out=torch.empty(0, dtype=torch.int64, device=DEV))
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([a.to(DEV), torch.randn(3, 3).to(DEV)], 1)


@SETTINGS
@given(SHAPES, st.data(), st.sampled_from(DTYPES))
def test_flip_matches_cpu(shape, data, dtype):
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    x = sample(shape, dtype)
    with native("flip"):
        got = torch.flip(strided(x), dims)  # flips nothing still copies
    same(got, torch.flip(x, dims))


@SETTINGS
@given(SHAPES, st.data(), st.sampled_from(DTYPES))
def test_roll_matches_cpu(shape, data, dtype):
    x = sample(shape, dtype)
    if data.draw(st.booleans()):
        shifts, dims = data.draw(st.integers(-30, 30)), None
        want = torch.roll(x, shifts)
    else:
        dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=3))
        shifts = data.draw(st.lists(st.integers(-9, 9), min_size=len(dims), max_size=len(dims)))
        want = torch.roll(x, shifts, dims)
    with native("roll"):
        got = torch.roll(strided(x), shifts) if dims is None else torch.roll(strided(x), shifts, dims)
    same(got, want)


@SETTINGS
@given(st.lists(st.integers(1, 7), min_size=2, max_size=4), st.integers(-8, 8), st.sampled_from(DTYPES),
       st.booleans())
def test_tril_triu_match_cpu(shape, k, dtype, lower):
    x = sample(shape, dtype)
    name = "tril" if lower else "triu"
    with native(name):
        got = getattr(torch, name)(strided(x), k)
    same(got, getattr(torch, name)(x, k))


def test_tril_triu_out_and_in_place_on_a_view():
    x = torch.randn(5, 6)
    base = x.to(DEV)
    out = torch.empty(0, device=DEV)
    with native("tril", "triu"):
        torch.tril(base, -1, out=out)
        view = base[1:, 2:]
        view.triu_(1)
    same(out, torch.tril(x, -1))
    want = x.clone()
    want[1:, 2:].triu_(1)
    same(base, want)


@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=1, max_size=3), st.data(), st.sampled_from(DTYPES))
def test_constant_pad_nd_matches_cpu(shape, data, dtype):
    pad = []
    for n in reversed(shape[-data.draw(st.integers(1, len(shape))):]):
        pad += [data.draw(st.integers(-(n // 2), 3)), data.draw(st.integers(-(n - n // 2), 3))]
    value = data.draw(st.sampled_from([0, 1, -3])) if not dtype.is_floating_point else 2.5
    value = True if dtype == torch.bool else value
    x = sample(shape, dtype)
    if dtype == torch.float64:
        ctx = contextlib.nullcontext()  # float64 pads on the CPU (no engine dtype to fill with)
    else:
        ctx = native("constant_pad_nd" if torch.constant_pad_nd(x, pad, value).numel() else None)
    with ctx:
        got = torch.constant_pad_nd(strided(x) if x.numel() else x.to(DEV), pad, value)
    same(got, torch.constant_pad_nd(x, pad, value))


def test_repeat_and_stack_compose_from_native_ops():
    x = sample((2, 3), torch.int64)
    with native("copy_", "cat"):
        rep = strided(x).repeat(2, 1, 3)
        st_ = torch.stack([x.to(DEV), strided(x)], -1)
    same(rep, x.repeat(2, 1, 3))
    same(st_, torch.stack([x, x], -1))


def test_gradients_flow_through_shape_ops():
    x = torch.randn(3, 4, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    grad = torch.randn(6, 4)
    for t, g in ((x, grad), (xd, grad.to(DEV))):
        y = torch.cat([torch.flip(t, (0,)), torch.roll(t.tril(), 1, 1)], 0)
        y.backward(g)
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
