"""Argument checks and device constants shared by the linalg, conv, attention, shape and indexing ops.

torch's own shape/dtype rules (and error messages) come from running the op on meta tensors once per
signature; devices are checked here because meta tensors cannot tell a neuron tensor from a CPU one.
Constants that depend only on shapes (aranges, triangle masks) are built on the host once, uploaded,
and cached per device, like the immediates of a kernel.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.utils._pytree import tree_map

from neuron_kernels.library import movement

from .copy import write_contiguous
from .launch import run

_META_CACHE_SIZE = 4096
_meta_cache: OrderedDict = OrderedDict()
_const_cache: OrderedDict = OrderedDict()
_CONST_CACHE_SIZE = 64


def _sig(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.dtype)  # strides: some meta results follow the input's layout
    if isinstance(v, list | tuple):
        return (type(v).__name__, *map(_sig, v))
    if isinstance(v, dict):
        return tuple((k, _sig(x)) for k, x in v.items())
    return (type(v).__name__, v)  # 1 and 1.0 and True differ in type promotion


def _meta(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, torch.device):  # a factory's device= (tril_indices): else the call comes back to us
        return torch.device("meta")
    return v


_STANDIN_MAX = 1 << 16  # elements up to which an error-path stand-in is a real tensor (else an expanded scalar)


def _standin(v):
    if isinstance(v, torch.Tensor):
        if v.numel() <= _STANDIN_MAX:
            return torch.zeros(v.shape, dtype=v.dtype)
        return torch.zeros((), dtype=v.dtype).expand(v.shape)
    if isinstance(v, torch.device):
        return torch.device("cpu")
    return v


def _raise_cpu_error(op, args, kwargs) -> None:
    """The meta check failed: raise the CPU kernel's error for the same shapes instead (its wording is what
    users and PyTorch's tests expect; meta kernels word some checks differently). Only on the error path."""
    try:
        op(*tree_map(_standin, args), **tree_map(_standin, kwargs))
    except Exception as cpu_error:
        raise cpu_error.with_traceback(None) from None


def in_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Contiguous kernel output ``t`` in the memory layout aten gives the result (``like``, its meta tensor):
    the attention output follows the query's layout (``out.transpose(1, 2).view(b, t, c)`` works as on the CPU
    and CUDA), a pool's output a channels_last input's."""
    if t.stride() == like.stride() or t.numel() <= 1:
        return t
    return torch.empty_strided(like.shape, like.stride(), dtype=t.dtype, device=t.device).copy_(t)


def meta_result(op, *args, **kwargs):
    """``op`` evaluated on meta copies of the arguments: raises torch's error for bad shapes or dtypes and
    returns the meta result (shapes and dtypes). Cached per signature of shapes, dtypes and constants."""
    key = (op, _sig(args), _sig(kwargs))
    hit = _meta_cache.get(key)
    if hit is None:
        try:
            hit = op(*tree_map(_meta, args), **tree_map(_meta, kwargs))
        except Exception as meta_error:
            _raise_cpu_error(op, args, kwargs)
            raise meta_error
        if len(_meta_cache) >= _META_CACHE_SIZE:
            _meta_cache.popitem(last=False)
        _meta_cache[key] = hit
    return hit


def out_dtype_error(overload, out: torch.Tensor, result: torch.Tensor, *args, **kwargs):
    """Raise torch's own error for an ``out=`` tensor whose dtype the op refuses (the out= overload run on meta
    tensors words it exactly as the CPU would)."""
    meta_out = torch.empty(result.shape, dtype=out.dtype, device="meta")
    overload(*tree_map(_meta, args), **tree_map(_meta, kwargs), out=meta_out)
    raise RuntimeError(f"Expected out tensor to have dtype {result.dtype}, but got {out.dtype} instead")


def same_device(*tensors) -> torch.device:
    """The neuron device all tensor arguments share (None entries skipped); torch's error otherwise."""
    device = None
    for t in tensors:
        if t is None:
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{device} and {t.device}!")
    return device


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    out = torch.empty(host.shape, dtype=host.dtype, device=device)
    write_contiguous(out, host)
    return out


_FILL_ROW = 2048  # elements of the constant row a fill broadcasts (long DMA runs)


def fill_(op: str, out: torch.Tensor, value) -> torch.Tensor:
    """Fill a contiguous neuron tensor with ``value`` on the device: DMA copies of a cached constant row
    (rows of up to 2048 elements broadcast with stride 0, then the tail). Recorded under ``op``."""
    n = out.numel()
    if n == 0:
        return out
    w = min(n, _FILL_ROW)
    row = constant(("row", w, out.dtype, repr(value)), out.device, lambda: torch.full((w,), value, dtype=out.dtype))
    flat = out.view(-1)
    q, r = divmod(n, w)
    run(op, movement.strided_copy_, flat, row, (q, w), (w, 1), (0, 1))
    if r:
        run(op, movement.strided_copy_, flat[q * w:], row, (r,), (1,), (1,))
    return out


def full(op: str, shape, value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return fill_(op, torch.empty(shape, dtype=dtype, device=device), value)


def zeros(op: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return full(op, shape, 0, dtype, device)


def constant(key: tuple, device: torch.device, build) -> torch.Tensor:
    """A device tensor that depends only on ``key`` (shapes, never data): ``build()`` makes it on the host
    once per device; callers must not write to it."""
    full = (key, device)
    hit = _const_cache.get(full)
    if hit is None:
        hit = upload(build(), device)
        if len(_const_cache) >= _CONST_CACHE_SIZE:
            _const_cache.popitem(last=False)
        _const_cache[full] = hit
    else:
        _const_cache.move_to_end(full)
    return hit


def arange32(n: int, device: torch.device) -> torch.Tensor:
    """int32 [0, 1, ..., n - 1] on the device (positions for nonzero, reversed indices for flip)."""
    return constant(("arange32", n), device, lambda: torch.arange(n, dtype=torch.int32))
