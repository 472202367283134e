"""Exact int64 pointwise ops on the device: add/sub/rsub (any integral alpha), mul, neg, abs, comparisons,
maximum/minimum, clamp/clamp_min/clamp_max, where, masked_fill, bitwise and/or/xor/not (word by word), and
floor_divide/remainder/fmod/div(rounding_mode) by a Python int in [1, 2**15], for every signature whose
promoted dtype is int64.

The engines have no 64-bit arithmetic; the kernels of ``neuron_kernels.library.wide_int`` compute on the
two 32-bit words of each value with GpSimd's exact, wrapping int32 arithmetic (carries, borrows, unsigned
compares of the low words, 16-bit partial products for mul), so results equal torch's for every int64
value, overflow wrapping included. An int64 tensor reaches a kernel as its word array (its bytes viewed
as int32, shape ``[..., 2]``); operands of smaller integer dtypes are cast to int64 first (a DMA cast,
sign extending), Python ints are kernel constants (a 0-d operand once a signature sees many values).

pointwise.base sends a plan here (``plan.wide``) when the signature would otherwise run on the CPU, its
promoted dtype is int64, its result int64 or bool and its op name is in ``WIDE``; the runner returns None
from an adapter for the CPU. Shifts, powers and division by tensors or other divisors stay on the CPU.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import wide_int as wk

from ..core.fallback import on_cpu
from .base import WIDE, _separate, check_overlap, dynamic, launch, target_kwargs

_EXACT = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})
_MASK = 2 ** 64


def _wrap(v: int) -> int:
    """A Python int wrapped to int64, as torch's int64 arithmetic wraps."""
    return (v + 2 ** 63) % _MASK - 2 ** 63


# -- the runner ------------------------------------------------------------------------------------------
def _words(t: torch.Tensor) -> torch.Tensor:
    """The [..., 2] int32 word array of a contiguous int64 tensor (a view, no copy)."""
    return t.unsqueeze(-1).view(torch.int32)


def _operand(x, plan, slot: str):
    """A kernel operand: a word array (tensors cast to int64 on the device, 0-d CPU tensors uploaded) or an
    int constant."""
    if isinstance(x, torch.Tensor):
        if x.dtype is not torch.int64:
            x = x.to(device=plan.device, dtype=torch.int64)
        elif x.device != plan.device:
            x = x.to(plan.device)
        return _words(x if x.is_contiguous() else x.contiguous())
    # torch takes ints in [2**63, 2**64) too, wrapped; many distinct values: one program with a 0-d operand
    v = dynamic(plan, slot, _wrap(int(x)), torch.int64)
    return _words(v) if isinstance(v, torch.Tensor) else v


def _prepare(plan, operands) -> list | None:
    out = []
    for i, x in enumerate(operands):
        if isinstance(x, _Cond):
            t = x.t.to(plan.device) if x.t.device != plan.device else x.t
            out.append(t if t.is_contiguous() else t.contiguous())
        elif isinstance(x, torch.Tensor) and x.dtype not in _EXACT:
            return None  # unsigned 16..64-bit operands: the CPU
        else:
            out.append(_operand(x, plan, f"w{i}"))
    return out


class _Cond:
    """where's condition: passed as it is (bool), not as words."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


def _result(plan, r: torch.Tensor) -> torch.Tensor:
    return r.view(torch.int64).view(plan.shape) if plan.dtype is torch.int64 else r.view(plan.shape)


def _direct(plan, target: torch.Tensor):
    """The kernel output view of a target it can write directly (contiguous, the result dtype)."""
    if not target.is_contiguous() or target.dtype is not plan.dtype:
        return None
    return _words(target) if plan.dtype is torch.int64 else target.view(plan.shape)


def run(entry, plan, args, kwargs, target):
    """Functional (target None), in-place or out= call of an int64 signature."""
    given, kwargs = kwargs, target_kwargs(entry, plan, args, kwargs, target)
    call = ADAPTERS[entry.name](*args, **kwargs)
    operands = None if call is None else _prepare(plan, call[1])
    if operands is None:
        return on_cpu(entry.overload, *args, **given)
    if plan.numel == 0:
        return torch.empty(plan.shape, dtype=plan.dtype, device=plan.device) if target is None else target
    kernel, consts = call[0], call[2]
    if target is None:
        return _result(plan, launch(entry.name, kernel, operands, consts, plan=plan)[0])
    check_overlap(target, [x for x in call[1] if isinstance(x, torch.Tensor)])
    direct = _direct(plan, target)
    if direct is not None:
        launch(entry.name, kernel, _separate(direct, operands), consts, outs=[direct], plan=plan)
        return target
    if torch._debug_has_internal_overlap(target) == 1:
        raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                           "single memory location. Please clone() the tensor before performing the operation.")
    target.copy_(_result(plan, launch(entry.name, kernel, operands, consts, plan=plan)[0]))
    return target


# -- adapters: the aten arguments -> (kernel, operands, constants) ----------------------------------------
def _int(v):
    return int(v) if isinstance(v, bool | int) else v


def _fits(v):
    """torch's error for an alpha or a clamp bound outside int64 (operands wrap instead, see ``_operand``)."""
    if isinstance(v, int) and not -(2 ** 63) <= v < 2 ** 63:
        raise RuntimeError("value cannot be converted to type int64_t without overflow")
    return v


def _add_like(kernel, swap=False):
    def adapter(self, other, alpha=1):  # rsub.Scalar takes alpha positionally
        alpha = _fits(_int(alpha))
        if not isinstance(alpha, int):
            return None
        a, b = _int(self), _int(other)
        if swap:
            a, b = b, a
        if alpha != 1:
            if not isinstance(b, int):
                return kernel, (a, b), {"alpha": _wrap(alpha)}
            b = _wrap(b * alpha)
        return kernel, (a, b), {}
    return adapter


def _binary(kernel):
    return lambda self, other: (kernel, (_int(self), _int(other)), {})


def _unary(kernel):
    return lambda self: (kernel, (self,), {})


def _clamp(self, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        return None
    min, max = _fits(_int(min)), _fits(_int(max))  # noqa: A001
    if max is None:
        return wk.clamp_min, (self, _int(min)), {}
    if min is None:
        return wk.clamp_max, (self, _int(max)), {}
    return wk.clamp, (self, _int(min), _int(max)), {}


def _by_constant(kernel):
    """Division-like ops by a Python int in [1, wk.DIV_MAX] (index math: ``i // w``, ``i % w``); tensor,
    zero (torch raises), negative or larger divisors run on the CPU."""
    def adapter(self, other):
        if not isinstance(self, torch.Tensor) or other.__class__ is not int or not 1 <= other <= wk.DIV_MAX:
            return None
        return kernel, (self,), {"divisor": other}
    return adapter


def _div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return None  # true division has a float result: never an int64 plan
    return _by_constant(wk.floor_divide if rounding_mode == "floor" else wk.trunc_divide)(self, other)


def _words_of(v):
    """A Python int as a 0-d int64 tensor: word-wise kernels need both words of a constant."""
    return torch.tensor(_wrap(int(v)), dtype=torch.int64) if isinstance(v, bool | int) else v


def _bitwise(kernel):
    """Bitwise ops act on each 32-bit word independently: the int32 kernel on the word arrays is exact."""
    return lambda self, other: (kernel, (_words_of(self), _words_of(other)), {})


ADAPTERS = {
    "add": _add_like(wk.add), "sub": _add_like(wk.sub), "rsub": _add_like(wk.sub, swap=True),
    "mul": _binary(wk.mul), "maximum": _binary(wk.maximum), "minimum": _binary(wk.minimum),
    "neg": _unary(wk.neg), "abs": _unary(wk.abs),
    "where": lambda condition, self, other: (wk.where, (_Cond(condition), _int(self), _int(other)), {}),
    "clamp": _clamp, "clamp_min": lambda self, min: _clamp(self, min=min),
    "clamp_max": lambda self, max: _clamp(self, max=max),
    **{op: _binary(getattr(wk, op)) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    "floor_divide": _by_constant(wk.floor_divide), "remainder": _by_constant(wk.remainder),
    "fmod": _by_constant(wk.fmod), "div": _div_mode,
    **{op: _bitwise(getattr(ew, op)) for op in ("bitwise_and", "bitwise_or", "bitwise_xor")},
    "bitwise_not": _unary(ew.bitwise_not),
    "masked_fill": lambda self, mask, value: (wk.where, (_Cond(mask), _fits(_int(value)), self), {}),
}
WIDE.update(dict.fromkeys(ADAPTERS, run))
