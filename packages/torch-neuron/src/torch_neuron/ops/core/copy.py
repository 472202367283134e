"""Copies between the host and neuron devices and between neuron tensors, and reading scalars.

Host <-> device moves bytes through the HAL (write/read); a strided device view is read as the
span of storage it covers and picked apart on the host. Device -> device copies of contiguous,
same-dtype tensors are driver copies; everything else (strides, casts) is the ``strided_copy_``
kernel.
"""

from __future__ import annotations

import torch

from neuron_hal import Driver
from neuron_kernels.library import movement

from ...runtime import runtime
from . import registry
from .dtypes import device_dtype
from .launch import run


def extent(t: torch.Tensor) -> int:
    """Elements of storage the view spans from its first element (1 for 0-d)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor's bytes as a uint8 tensor (any dtype, 0-d included). Flattened by strides,
    not reshape: a contiguous tensor may keep any stride on a size-1 dimension, which ``view`` refuses."""
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def storage_span(t: torch.Tensor) -> torch.Tensor:
    """A neuron view as a 1-d tensor over the storage it spans (same address as the view)."""
    return torch.as_strided(t, (extent(t),), (1,), t.storage_offset())


def host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same device memory as neuron tensor ``t`` (no copy), on drivers that map
    device memory into the host (the simulator does; hardware does not). Writes through it change
    ``t``. It does not keep ``t``'s storage alive: keep ``t`` while using the alias."""
    n = extent(t)
    if n == 0:
        return torch.empty(t.shape, dtype=t.dtype)
    drv = runtime().driver
    view = drv.map(t.device.index, t.data_ptr(), n * t.element_size())
    if view is None:
        raise RuntimeError(f"the {drv.name!r} driver cannot map device memory into the host; use .cpu()")
    flat = torch.frombuffer(view, dtype=t.dtype, count=n)
    return torch.as_strided(flat, t.shape, t.stride())


def to_host(src: torch.Tensor) -> torch.Tensor:
    """A new host tensor equal to a neuron tensor (any strides)."""
    n = extent(src)
    drv = runtime().driver
    if n and type(drv).map is not Driver.map:  # a mapping driver: one host copy straight from its memory
        return host_alias(src).clone()
    flat = torch.empty(n, dtype=src.dtype)
    if n:
        drv.read(src.device.index, src.data_ptr(), _bytes(flat).numpy())
    if src.dim() == 0:
        return flat.reshape(())
    return torch.as_strided(flat, src.shape, src.stride()).clone()


def write_contiguous(dst: torch.Tensor, host: torch.Tensor) -> None:
    """Host bytes into a contiguous neuron tensor of the same dtype and numel."""
    if host.numel():
        runtime().driver.write(dst.device.index, dst.data_ptr(), _bytes(host.contiguous()).numpy())


def device_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) between neuron tensors of the same shape (dtypes may differ)."""
    if dst.numel() == 0:
        return
    if src.device != dst.device:
        src = src.to("cpu").to(dst.device)
    if dst.dtype == src.dtype and dst.is_contiguous() and src.is_contiguous():
        runtime().driver.copy(dst.device.index, dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size())
        registry.note_native("copy_")
        return
    if device_dtype(dst.dtype) is None or device_dtype(src.dtype) is None:
        if dst.dtype == src.dtype:  # float64 / complex: move the bytes as integers of the same width
            return device_copy(_as_int(dst), _as_int(src))
        return dst.copy_(src.cpu())  # a cast the engines cannot do; the host does it (fallback counted there)
    if _overlaps(dst, src):
        src = src.clone()
    size = tuple(dst.shape) or (1,)
    dstride, sstride = tuple(dst.stride()) or (1,), tuple(src.stride()) or (1,)
    run("copy_", movement.strided_copy_, storage_span(dst), storage_span(src), size, dstride, sstride)


def _as_int(t: torch.Tensor) -> torch.Tensor:
    """The same memory as integers of the element's width (any strides). A complex element is a (real,
    imaginary) pair first, so complex128 (16 bytes) moves as two int64."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1, b1 = a0 + extent(a) * a.element_size(), b0 + extent(b) * b.element_size()
    return a0 < b1 and b0 < a1


_INTERNAL_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single "
                     "memory location. Please clone() the tensor before performing the operation.")
_PARTIAL_OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                    "single memory location. Please clone() the tensor before performing the operation.")


def _dense(t: torch.Tensor) -> bool:
    """aten's is_non_overlapping_and_dense: some order of the dims is contiguous (size-1 dims aside)."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, n in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= n
    return True


def overlaps_itself(t: torch.Tensor) -> bool:
    """Two elements of the view share an address. aten decides only zero strides and dense layouts and writes
    the rest element by element on the CPU (later writes win, in its loop order, which no device reproduces):
    this decides every view exactly, from its element offsets when the strides alone cannot tell."""
    state = torch._debug_has_internal_overlap(t)  # 0 no, 1 yes, 2 cannot tell
    if state != 2 or t.numel() < 2:
        return state == 1
    shape = [1] * t.dim()
    offsets = torch.zeros(shape, dtype=torch.int64)
    for d, (n, st) in enumerate(zip(t.shape, t.stride())):
        offsets = offsets + (torch.arange(n) * st).view(shape[:d] + [n] + shape[d + 1:])
    return offsets.unique().numel() < t.numel()


def _check_overlap(dst: torch.Tensor, src: torch.Tensor) -> None:
    """aten's copy_ checks, which its TensorIterator makes only for CPU/CUDA tensors: dst must not write an
    element twice nor partly overlap src where both are dense. torch cannot tell for other layouts and lets
    them through (``device_copy`` then copies from a clone of an overlapping src)."""
    if dst.numel() == 0:
        return
    if overlaps_itself(dst):
        raise RuntimeError(_INTERNAL_OVERLAP)
    if src.numel() == 0 or dst.untyped_storage().data_ptr() != src.untyped_storage().data_ptr():
        return
    if not (_dense(dst) and _dense(src)):
        return
    d0, s0 = dst.data_ptr(), src.data_ptr()
    d1, s1 = d0 + dst.numel() * dst.element_size(), s0 + src.numel() * src.element_size()
    same_range = (d0, d1) == (s0, s1)
    if (same_range and dst.stride() != src.stride()) or (not same_range and d0 < s1 and s0 < d1):
        raise RuntimeError(_PARTIAL_OVERLAP)


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if src.device.type == "neuron" and dst.device.type == "neuron":
        _check_overlap(dst, src)  # before broadcasting, as TensorIterator checks its operands
    elif dst.device.type == "neuron" and dst.numel() and overlaps_itself(dst):  # host -> device (a CPU fallback's
        raise RuntimeError(_INTERNAL_OVERLAP)  # result written back into an expanded in-place target)
    if src.shape != dst.shape:
        src = src.expand_as(dst)  # raises for shapes that do not broadcast, as copy_ does
    if dst.numel() == 0:
        return dst
    if src.device.type == "neuron" and dst.device.type == "neuron":
        device_copy(dst, src)
    elif dst.device.type == "neuron":  # host -> device
        host = src.to(dst.dtype)
        if dst.is_contiguous():
            write_contiguous(dst, host)
        else:
            tmp = torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)
            write_contiguous(tmp, host)
            device_copy(dst, tmp)
    else:  # device -> host
        host = to_host(src)
        dst.copy_(host)
    return dst


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_from(src, dst)


def _stored(t: torch.Tensor) -> torch.Tensor:
    """The values ``t``'s memory holds: the same view with the lazy conjugate / negative bits cleared."""
    if t.is_conj():
        t = t.conj()  # conj of a conjugate view is the plain view
    if t.is_neg():
        t = torch._neg_view(t)
    return t


def _settle_bits(src: torch.Tensor, dst: torch.Tensor, stored: torch.Tensor) -> None:
    """After the stored values of ``src`` were copied into ``dst``'s memory (``stored``): apply what the
    bits of the two views differ by, so that dst reads as src."""
    if src.is_conj() != dst.is_conj():  # negate the imaginary parts (conj_physical_ has no neuron kernel)
        torch.view_as_real(stored)[..., 1].neg_()
    if src.is_neg() != dst.is_neg():  # complex: negate both parts as reals (the engines have no complex)
        (torch.view_as_real(stored) if stored.is_complex() else stored).neg_()


def copy_from_lazy(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``_copy_from`` when a view has the conjugate or negative bit. PyTorch's fallback for those bits
    would clone the input, and cloning copies through ``_copy_from`` again: an endless recursion that
    overflows the stack (segfault). Copy the stored values, then conjugate / negate in place, as
    copy_ does between CPU tensors."""
    stored = _stored(dst)
    torch.ops.aten._copy_from(_stored(src), stored, non_blocking)
    _settle_bits(src, dst, stored)
    return dst


def copy_from_and_resize_lazy(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != src.shape:
        dst.resize_(src.shape)  # dst itself: a resize through its bit-cleared view would not reach it
    return copy_from_lazy(src, dst)


def local_scalar_dense(t: torch.Tensor):
    return to_host(t).item()
