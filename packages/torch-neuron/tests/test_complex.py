"""Complex tensors on neuron against PyTorch CPU: they live on the device (complex64 add/sub/mul compute there,
other math takes the CPU fallback), so copies in every direction, conjugate / negative views, view_as_real /
view_as_complex aliasing, .real/.imag writes, conj_physical and the FFTs (whose inverse transforms return
conjugate views) must be exact; the arithmetic matches to float32 rounding."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

DEV = "neuron"
COMPLEX = (torch.complex64, torch.complex128)


def _rand(shape, dtype):
    return torch.randn(shape, dtype=dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_conjugate_view_to_host(dtype):
    # a conjugate view's copy used to recurse (clone -> _copy_from -> clone ...) until the stack overflowed
    a = _rand((3, 4), dtype)
    d = a.to(DEV).conj()
    assert d.is_conj()
    h = d.cpu()
    assert not h.is_conj() and torch.equal(h, a.conj().resolve_conj())
    assert torch.equal(d.resolve_conj().cpu(), a.conj().resolve_conj())
    assert torch.equal(d.t().contiguous().cpu(), a.conj().t().contiguous())


@pytest.mark.parametrize("dtype", (*COMPLEX, torch.float32))
def test_negative_view_to_host(dtype):
    a = _rand((5,), dtype)
    d = torch._neg_view(a.to(DEV))
    assert torch.equal(d.cpu(), -a)
    if dtype.is_complex:
        assert torch.equal(torch._neg_view(a.to(DEV).conj()).cpu(), -a.conj())


@pytest.mark.parametrize("dtype", COMPLEX)
def test_copy_into_conjugate_and_from_conjugate(dtype):
    a = _rand((4, 3), dtype)
    n = torch.empty(4, 3, dtype=dtype, device=DEV)
    n.copy_(a.conj())  # host conjugate view -> device
    assert torch.equal(n.cpu(), a.conj().resolve_conj())
    c = torch.zeros(4, 3, dtype=dtype, device=DEV).conj()
    c.copy_(a)  # into a device conjugate view: reads back as a
    assert c.is_conj() and torch.equal(c.cpu(), a)
    m = torch.empty(4, 3, dtype=dtype, device=DEV)
    m.copy_(a.to(DEV).conj())  # device -> device
    assert torch.equal(m.cpu(), a.conj().resolve_conj())


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 5), dtype=st.sampled_from(COMPLEX), start=st.integers(0, 1))
def test_strided_device_copy(rows, cols, dtype, start):
    # complex128 elements are 16 bytes: the device copy moves them as int64 pairs ("KeyError: 16" before)
    a = _rand((rows + 1, cols), dtype)
    d = a.to(DEV)[start:start + rows].t()
    assert torch.equal(d.contiguous().cpu(), a[start:start + rows].t())
    assert torch.equal(d.cpu(), a[start:start + rows].t())


@pytest.mark.parametrize("dtype", COMPLEX)
def test_view_as_real_aliases(dtype):
    a = _rand((4, 3), dtype)
    d = a.to(DEV)
    r = torch.view_as_real(d.t()[1:])
    assert r.data_ptr() == d.t()[1:].data_ptr()
    assert torch.equal(r.cpu(), torch.view_as_real(a.t()[1:]))
    d.imag.add_(1)
    d[1:].real.mul_(2)
    a.imag.add_(1)
    a[1:].real.mul_(2)
    assert torch.equal(d.cpu(), a)
    with pytest.raises(RuntimeError, match="conjugate"):
        torch.view_as_real(d.conj())


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_view_as_complex_aliases(dtype):
    x = torch.randn(5, 2, dtype=dtype)
    d = x.to(DEV)
    c = torch.view_as_complex(d[1:])
    assert c.data_ptr() == d[1:].data_ptr()
    assert torch.equal(c.cpu(), torch.view_as_complex(x[1:]))
    c.mul_(2)
    x[1:].mul_(2)
    assert torch.equal(d.cpu(), x)
    with pytest.raises(RuntimeError, match="stride 1"):
        torch.view_as_complex(d.t().contiguous().t())
    with pytest.raises(RuntimeError, match="size 2"):
        torch.view_as_complex(d[:, :1])


@pytest.mark.parametrize("dtype", COMPLEX)
def test_conj_physical(dtype):
    a = _rand((3, 4), dtype)
    d = a.to(DEV)
    assert torch.equal(torch.conj_physical(d).cpu(), torch.conj_physical(a))
    assert torch.equal(d.t().clone().conj_physical_().cpu(), a.t().conj_physical())  # aten's kernel asserted
    out = torch.empty(0, dtype=dtype, device=DEV)
    torch.conj_physical(d, out=out)
    assert torch.equal(out.cpu(), a.conj_physical())
    assert torch.equal(torch.conj_physical(d.real).cpu(), a.real)


@pytest.mark.parametrize("fn,kwargs", [
    (torch.fft.ifft, {"dim": 1}),
    (torch.fft.ifft, {"n": 10, "dim": 1, "norm": "ortho"}),
    (torch.fft.hfft, {}),
    (torch.fft.ihfft, {"dim": 0}),
    (torch.fft.hfft2, {}),
    (torch.fft.ihfftn, {}),
])
def test_fft_inverse_results(fn, kwargs):
    # these return conjugate views of the transform; reading them back crashed the process
    x = torch.randn(5, 6, 7)
    got = fn(x.to(DEV), **kwargs).cpu()
    torch.testing.assert_close(got, fn(x, **kwargs), rtol=1.3e-6, atol=1e-5)


# -- arithmetic on the device: complex64 add / sub / mul ----------------------------------------------------
OPERANDS = ("complex", "conj", "from_negative_view", "real", "scalar", "complex_scalar")


def _operand(kind, shape, g):
    c = torch.randn(shape, dtype=torch.complex64, generator=g)
    if kind == "complex":
        return c, c.to(DEV)
    if kind == "conj":
        return c.conj(), c.to(DEV).conj()
    if kind == "from_negative_view":  # the imaginary part of a conjugate view is a negative view (resolved here)
        return torch.conj(c).imag.neg().to(torch.complex64), torch.conj(c.to(DEV)).imag.neg().to(torch.complex64)
    if kind == "real":
        r = torch.randn(shape, generator=g)
        return r, r.to(DEV)
    if kind == "scalar":
        return 2.5, 2.5
    return 0.5 - 1.5j, 0.5 - 1.5j


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["mul", "add", "sub"]), st.sampled_from(OPERANDS[:4]), st.sampled_from(OPERANDS),
       st.sampled_from([((3, 4), (4,)), ((2, 1, 5), (3, 5)), ((6,), (6,)), ((), (2, 2))]),
       st.sampled_from(["functional", "inplace", "out"]), st.integers(0, 5))
def test_complex64_arithmetic_runs_on_the_device(op, kind_a, kind_b, shapes, variant, seed):
    """add/sub/mul of complex64 with complex, conjugate, real and scalar operands (broadcast), in-place and out=,
    against the CPU: float32 math on the parts, each product rounded as torch's vectorized kernels round it."""
    g = torch.Generator().manual_seed(seed)
    (a, ad), (b, bd) = _operand(kind_a, shapes[0], g), _operand(kind_b, shapes[1], g)
    fn = getattr(torch, op)
    want = fn(a, b)
    if want.dtype != torch.complex64:
        return  # real op real: not this test's
    torch.neuron.set_strict(True)
    try:
        if variant == "functional":
            got = fn(ad, bd)
        elif variant == "out":
            got = torch.empty(0, dtype=torch.complex64, device=DEV)
            fn(ad, bd, out=got)
        else:
            if want.shape != torch.broadcast_shapes(getattr(a, "shape", ()), ()) or not isinstance(a, torch.Tensor) \
                    or not a.is_complex():
                return
            got = ad.clone().resolve_conj()
            getattr(got, op + "_")(bd)
    finally:
        torch.neuron.set_strict(False)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want.resolve_conj(), rtol=2e-7, atol=1e-7)


def test_complex_rotary_embedding_forward_and_backward_run_on_the_device():
    """TorchTitan's / Llama 4's rotary embedding: view_as_complex, a complex multiply, view_as_real; its backward
    multiplies by the conjugate. No CPU fallback, equal to the CPU."""
    def rope(x, freqs):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs.view(1, xc.shape[1], 1, xc.shape[-1])).flatten(3).type_as(x)

    torch.manual_seed(0)
    b, s, h, d = 2, 16, 4, 32
    angles = torch.outer(torch.arange(s).float(), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
    freqs = torch.polar(torch.ones(s, d // 2), angles)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(b, s, h, d, dtype=dtype)
        w = torch.randn(b, s, h, d)
        xc = x.clone().requires_grad_()
        (rope(xc, freqs).float() * w).sum().backward()
        xd = x.to(DEV).requires_grad_()
        torch.neuron.set_strict(True)
        try:
            yd = rope(xd, freqs.to(DEV))
            (yd.float() * w.to(DEV)).sum().backward()
        finally:
            torch.neuron.set_strict(False)
        torch.testing.assert_close(yd.cpu(), rope(x, freqs), rtol=2e-7, atol=1e-7)
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=2e-7, atol=1e-7)
