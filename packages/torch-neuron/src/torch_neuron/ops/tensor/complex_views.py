"""view_as_real / view_as_complex: aliases of the same device memory read as another dtype; conj_physical
as a negation of the imaginary parts seen as reals.

Complex tensors live on the device while their math takes the CPU fallback (no complex arithmetic on the
engines). These two must still be views: ``.real``, ``.imag``, in-place writes through them and the copy
path's handling of conjugate views rely on writes reaching the complex tensor's memory; the boxed CPU
fallback would return copies.
"""

from __future__ import annotations

import torch

from ..core.variants import write_out

_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX = {real: cplx for cplx, real in _REAL.items()}


def _reinterpret(t: torch.Tensor, dtype: torch.dtype, size, stride, offset: int) -> torch.Tensor:
    """A view of ``t``'s whole storage as ``dtype`` with the given geometry (in ``dtype`` elements)."""
    whole = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.as_strided(t, (whole,), (1,), 0).view(dtype)  # 1-d, so the element size may change
    return torch.as_strided(flat, size, stride, offset)


def view_as_real(t):
    if t.is_conj():
        raise RuntimeError(
            "view_as_real doesn't work on unresolved conjugated tensors.  To resolve the conjugate tensor so "
            "you can view it as real, use self.resolve_conj()"
        )
    if t.dtype not in _REAL:
        raise RuntimeError(f"view_as_real is only supported for complex tensors, got {t.dtype}")
    size = (*t.shape, 2)
    stride = (*(2 * s for s in t.stride()), 1)
    return _reinterpret(t, _REAL[t.dtype], size, stride, 2 * t.storage_offset())


def view_as_complex(t):
    if t.dtype not in _COMPLEX:
        raise RuntimeError(
            f"view_as_complex is only supported for floating point tensors of half, float or double, got {t.dtype}"
        )
    if t.dim() == 0 or t.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if t.stride(-1) != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in t.stride()[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    if t.storage_offset() % 2:
        raise RuntimeError("Tensor must have a storage_offset divisible by 2")
    size = tuple(t.shape[:-1])
    stride = tuple(s // 2 for s in t.stride()[:-1])
    return _reinterpret(t, _COMPLEX[t.dtype], size, stride, t.storage_offset() // 2)


def conj_physical_(t):
    # aten's in-place kernel calls a CPU/CUDA-only dispatch stub directly (an internal assert on neuron)
    if t.is_complex():
        view_as_real(t)[..., 1].neg_()  # complex64: a native float32 negation; complex128 falls back
    return t


def conj_physical(t):
    return conj_physical_(t.clone()) if t.is_complex() else t.clone()


def conj_physical_out(t, *, out):
    return write_out(out, conj_physical(t))
