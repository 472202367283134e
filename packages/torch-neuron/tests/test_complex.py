"""Complex tensors on neuron against PyTorch CPU: they live on the device (math takes the CPU fallback), so
copies in every direction, conjugate / negative views, view_as_real / view_as_complex aliasing, .real/.imag
writes, conj_physical and the FFTs (whose inverse transforms return conjugate views) must be exact."""

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
