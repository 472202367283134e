"""Copying shape ops: cat, flip, roll, tril/triu, constant_pad_nd (functional, out=, in-place), and the
tril_indices/triu_indices factories.

Views (transpose, permute, slice, select, expand, unsqueeze, ...) are metadata in the C++ core and are
not registered here; ``stack`` (cat of unsqueezed views) and ``repeat`` (a copy of an expanded view) are
CompositeExplicit in aten and reach ``cat`` / ``copy_``. Everything here moves bytes with the movement
kernels (no arithmetic), so every device dtype is exact; float64 moves as int64 words and other dtypes
the engines cannot address (complex) take ``on_cpu``.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import movement

from ..core.checks import constant, full, meta_result, same_device, upload
from ..core.copy import storage_span
from ..core.dtypes import device_dtype
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.registry import impl
from ..core.variants import contig, write_out

aten = torch.ops.aten
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32, 16: torch.int32}


def movable(dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the movement kernels carry ``dtype``'s bytes as: itself, int64 for float64, else None."""
    if device_dtype(dtype) is not None:
        return dtype
    return torch.int64 if dtype == torch.float64 else None


def copy_into(op: str, dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) for same-shape, non-overlapping neuron views (casting to dst's dtype), recorded as ``op``."""
    if dst.numel() == 0:
        return
    if dst.dtype == src.dtype and device_dtype(dst.dtype) is None:
        dst, src = dst.view(movable(dst.dtype)), src.view(movable(src.dtype))
    size = tuple(dst.shape) or (1,)
    run(op, movement.strided_copy_, storage_span(dst), storage_span(src), size, tuple(dst.stride()) or (1,),
        tuple(src.stride()) or (1,))


# -- cat -------------------------------------------------------------------------------------------
def _cat_native(tensors, dtype) -> bool:
    """The kernels can build this cat: every dtype is the engines' (casts included), or all inputs share a
    dtype whose bytes move as integers (float64)."""
    if device_dtype(dtype) is not None:
        return all(device_dtype(t.dtype) is not None for t in tensors)
    return movable(dtype) is not None and all(t.dtype == dtype for t in tensors)


def cat(tensors, dim=0):
    tensors = list(tensors)
    meta = meta_result(aten.cat.default, tensors, dim)
    device = same_device(*tensors)
    dtype = meta.dtype
    if not _cat_native(tensors, dtype):
        return on_cpu(aten.cat.default, tensors, dim)
    out = torch.empty(meta.shape, dtype=dtype, device=device)
    live = [t for t in tensors if t.numel()]  # empties add nothing (1-d ones may not even match)
    if not live:
        return out
    d = dim % out.dim()
    if all(t.is_contiguous() and t.dtype == dtype for t in live):
        carrier = movable(dtype)
        got = run("cat", movement.cat.kernel(len(live)), *[t.view(carrier) for t in live], dim=d, dtype=carrier)[0]
        return got.view(dtype)
    at = 0
    for t in live:  # strided or casting pieces: one strided copy each, straight into place
        w = t.shape[d]
        copy_into("cat", out.narrow(d, at, w), t)
        at += w
    return out


def cat_out(tensors, dim=0, *, out):
    result = cat(tensors, dim)
    if not torch.can_cast(result.dtype, out.dtype):
        raise TypeError(f"torch.cat(): input types can't be cast to the desired output type {out.dtype}")
    return write_out(out, result)


# -- flip / roll ------------------------------------------------------------------------------------
def _reversed(n: int, device) -> torch.Tensor:
    return constant(("reversed32", n), device, lambda: torch.arange(n - 1, -1, -1, dtype=torch.int32))


def flip(x, dims):
    meta_result(aten.flip.default, x, dims)
    carrier = movable(x.dtype)
    if carrier is None:
        return on_cpu(aten.flip.default, x, dims)
    nd = max(x.dim(), 1)
    todo = sorted({d % nd for d in dims if x.dim() and x.shape[d % nd] > 1})
    y = contig(x).view(carrier)
    if x.numel() == 0 or not todo:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        copy_into("flip", out, x)
        return out
    for d in todo:  # each flipped dim gathers its rows in reverse order
        y = run("flip", movement.index_select, y, d, _reversed(x.shape[d], x.device))[0]
    return y.view(x.dtype)


def _roll_dim(x: torch.Tensor, shift: int, d: int) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[d]
    s = shift % n if n else 0
    copy_into("roll", out.narrow(d, s, n - s), x.narrow(d, 0, n - s))
    if s:
        copy_into("roll", out.narrow(d, 0, s), x.narrow(d, n - s, s))
    return out


def roll(x, shifts, dims=()):
    meta_result(aten.roll.default, x, shifts, dims)
    if movable(x.dtype) is None:
        return on_cpu(aten.roll.default, x, shifts, dims)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if len(dims) == 0:
        return _roll_dim(x.reshape(-1), int(shifts[0]), 0).view(x.shape)
    for s, d in zip(shifts, dims):
        x = _roll_dim(x, int(s), d % x.dim())
    return x


# -- tril / triu -------------------------------------------------------------------------------------
def _tri_mask(rows: int, cols: int, k: int, lower: bool, per: int, device) -> torch.Tensor:
    """bool [rows, cols * per]: the kept triangle, each entry repeated for the ``per`` words of an element."""
    def build():
        ones = torch.ones(rows, cols, dtype=torch.bool)
        keep = ones.tril(k) if lower else ones.triu(k)
        return keep.repeat_interleave(per, dim=1)

    return constant(("tri", rows, cols, k, lower, per), device, build)


def _tri(op: str, x: torch.Tensor, k: int, lower: bool) -> torch.Tensor:
    """x with the other triangle zeroed: ``where(mask, x, 0)`` on x's bytes as 1/2/4-byte integer words (zero
    bits are 0 in every dtype), so it is exact for any dtype, int64 and float64 included."""
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    word = _WORDS[x.element_size()]
    per = x.element_size() // word.itemsize
    rows, cols = x.shape[-2:]
    words = contig(x).view(word)
    return run(op, ew.where, _tri_mask(rows, cols, int(k), lower, per, x.device), words, 0)[0].view(x.dtype)


def _register_tri(name: str, lower: bool) -> None:
    functional = getattr(aten, name).default

    @impl(name)
    def tri(x, diagonal=0):
        meta_result(functional, x, diagonal)
        return _tri(name, x, diagonal, lower)

    @impl(f"{name}.out")
    def tri_out(x, diagonal=0, *, out):
        return write_out(out, tri(x, diagonal))

    @impl(f"{name}_")
    def tri_(x, diagonal=0):
        meta_result(functional, x, diagonal)
        return x.copy_(_tri(name, x, diagonal, lower))




def _register_tri_indices(name: str) -> None:
    factory = getattr(aten, name).default

    @impl(name)
    def tri_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
        """[2, N] row and column indices of the triangle: a function of the Python ints alone (no device data),
        made on the host by torch's own kernel (its checks and order) and written to the device in one DMA."""
        host = factory(row, col, offset, dtype=dtype, layout=layout, pin_memory=pin_memory)
        return upload(host, device)




# -- constant_pad_nd ---------------------------------------------------------------------------------
def constant_pad_nd(x, pad, value=0):
    meta = meta_result(aten.constant_pad_nd.default, x, pad, value)
    if device_dtype(x.dtype) is None:
        return on_cpu(aten.constant_pad_nd.default, x, pad, value)
    pairs = [(int(pad[2 * i]), int(pad[2 * i + 1])) for i in range(len(pad) // 2)]
    grows = any(b > 0 or a > 0 for b, a in pairs)
    out = full("constant_pad_nd", meta.shape, value, x.dtype, x.device) if grows else \
        torch.empty(meta.shape, dtype=x.dtype, device=x.device)
    dst, src = out, x
    for i, (before, after) in enumerate(pairs):  # pad[0:2] pads the last dim, pad[2:4] the one before, ...
        d = x.dim() - 1 - i
        n = x.shape[d] + min(before, 0) + min(after, 0)
        if n <= 0:
            return out
        dst = dst.narrow(d, max(before, 0), n)
        src = src.narrow(d, max(-before, 0), n)
    copy_into("constant_pad_nd", dst, src)
    return out
