"""Filling: fill_ / zero_ (so full, zeros, ones and their _like forms, which aten builds from empty + fill_),
masked_fill, eye (zeros, then ones on the diagonal view: every dtype, as fill_) and arange.

``fill_`` writes a bit pattern, it computes nothing: the value is converted to the tensor's dtype on the host
exactly as torch converts it, and its bytes are replicated over the tensor viewed as integers (an 8-byte
element is a pair of int32 words), so every dtype fills natively, int64, float64 and complex included.
``arange`` is one iota per tile: exact where torch's result is (integral start and step, values within
int32, and below 2**24 in magnitude for float results; float results of dyadic start/step whose values
are all exact in the result dtype, see ``_dyadic``; other fractional float32 aranges through double as the
CPU rounds them, in exact integer arithmetic, see :mod:`.arange_double`; anything else runs on the CPU).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library.fill import arange_into, fill_pattern

from ..core.copy import extent
from ..core.fallback import on_cpu
from ..core.launch import run
from . import arange_double

_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


# -- fill_ ---------------------------------------------------------------------------------------------------
def _words(value, dtype: torch.dtype) -> tuple[torch.dtype, tuple[int, ...]]:
    """The integer view dtype and the words of ``value`` converted to ``dtype`` as torch converts it."""
    host = torch.tensor(value, dtype=dtype).reshape(1)
    size = host.element_size()
    word = _WORDS.get(size, torch.int32)
    return word, tuple(int(w) for w in host.view(word).tolist())


def _dense(t: torch.Tensor) -> bool:
    """Its elements are exactly the storage span it covers (contiguous up to a permutation of dims)."""
    return extent(t) == t.numel() and torch._debug_has_internal_overlap(t) == 0


def _fill_flat(t: torch.Tensor, word: torch.dtype, pattern) -> None:
    span = torch.as_strided(t, (t.numel(),), (1,), t.storage_offset())
    run("fill_", fill_pattern, span.view(word), pattern)


def fill_value(self: torch.Tensor, value) -> torch.Tensor:
    if self.numel() == 0:
        return self
    word, pattern = _words(value, self.dtype)
    if _dense(self):
        _fill_flat(self, word, pattern)
        return self
    if any(st == 0 and n > 1 for n, st in zip(self.shape, self.stride())):  # an expanded view: its elements
        distinct = torch.as_strided(self, [1 if st == 0 else n for n, st in zip(self.shape, self.stride())],
                                    self.stride(), self.storage_offset())
        fill_value(distinct, value)
        return self
    tmp = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    _fill_flat(tmp, word, pattern)
    self.copy_(tmp)
    return self


def fill_scalar(self, value):
    return fill_value(self, value)


def fill_tensor(self, value):
    if value.dim() != 0:
        return on_cpu(torch.ops.aten.fill_.Tensor, self, value)  # torch's error
    return fill_value(self, value.item())


def zero_(self):
    return fill_value(self, 0)


# -- eye ---------------------------------------------------------------------------------------------------------
def eye_m_out(n, m, *, out):
    """aten's eye: ``out`` resized to [n, m], zeroed, its diagonal set to one. (torch's decomposition would
    compare aranges of uint16 for 256 <= max(n, m) < 65536, a dtype torch's arange does not take.)"""
    meta = torch.empty(0, dtype=out.dtype, device="meta")  # empty: resized without a warning, as aten's eye
    torch.ops.aten.eye.m_out(n, m, out=meta)  # torch's checks and shape
    if out.shape != meta.shape:
        out.resize_(meta.shape)
    fill_value(out, 0)
    fill_value(out.diagonal(), 1)
    return out


def eye_out(n, *, out):
    return eye_m_out(n, n, out=out)


# -- masked_fill ------------------------------------------------------------------------------------------------
def _masked_fill(plan, self, mask, value):
    if isinstance(value, torch.Tensor):  # a 0-d tensor: converted to self's dtype as torch converts it
        value = value.to(device=self.device, dtype=self.dtype)
    else:
        value = torch.tensor(value, dtype=self.dtype).item()  # rounded once to the dtype (and range-checked)
    return ew.where, (mask, value, self), {}




# -- arange ------------------------------------------------------------------------------------------------------
_ARANGE_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64})


def _exact_arange(start, step, n: int, dtype: torch.dtype) -> bool:
    if dtype not in _ARANGE_DTYPES or not all(float(v).is_integer() for v in (start, step)):
        return False
    # floats: every value (and so the CPU's rounded block bases) exact in the dtype; 16-bit floats beyond that
    # round twice on the CPU (base, then base + j * step): arange_double
    limit = 2 ** _DYADIC[dtype][0] if dtype.is_floating_point else 2 ** 31
    last = start + (n - 1) * step
    return max(abs(start), abs(last)) < limit


# -- dyadic aranges: fractional start/step whose every value is exact in the result dtype (begin) --
# dtype: (significand bits, largest m): |a + i * k| < 2**bits is exact in the dtype, and m keeps every nonzero
# value at or above the dtype's smallest normal (no subnormal, no flush can matter)
_DYADIC = {torch.float32: (24, 100), torch.bfloat16: (8, 100), torch.float16: (11, 14)}


def _dyadic(start, step, n: int, dtype: torch.dtype) -> tuple[int, int, int] | None:
    """(a, k, m) with start = a / 2**m, step = k / 2**m and every |a + i * k| < 2**bits (i < n; bits: the
    result dtype's significand, ``_DYADIC``); None otherwise. Then each value is exactly representable in
    the result dtype, and so are all of torch's CPU intermediates (step * i and start + step * i in its
    accumulate type, the block bases of its vectorised loop rounded to the dtype, base + j * step): nothing
    rounds, on the CPU or here, so the device's ``(a + i * k) * 2**-m`` (an exact float32 iota, times a
    power of two, stored exactly) is the CPU's result bit for bit."""
    if dtype not in _DYADIC or isinstance(start, complex) or isinstance(step, complex):
        return None
    fa, fk = Fraction(start), Fraction(step if n > 1 else 0)
    m = max(fa.denominator, fk.denominator).bit_length() - 1  # float denominators are powers of two
    digits, max_shift = _DYADIC[dtype]
    if m > max_shift:
        return None
    a, k = int(fa * 2 ** m), int(fk * 2 ** m)
    return (a, k, m) if max(abs(a), abs(a + (n - 1) * k)) < 2 ** digits else None
# -- dyadic aranges (end) --


def arange_start_out(start, end, step=1, *, out):
    meta = torch.empty(out.shape, dtype=out.dtype, device="meta")
    torch.ops.aten.arange.start_out(start, end, step, out=meta)  # torch's checks and length
    n = meta.numel()
    if out.dtype.is_floating_point and float(start) == 0 and math.copysign(1.0, start) < 0 and step < 0:
        return on_cpu(torch.ops.aten.arange.start_out, start, end, step, out=out)  # -0.0 + -0.0 stays -0.0
    exact = n == 0 or _exact_arange(start, step, n, out.dtype)  # no values: nothing to round
    dyadic = None if exact else _dyadic(start, step, n, out.dtype)
    double = None if exact or dyadic is not None else arange_double.plan(start, step, n, out.dtype)
    if not exact and dyadic is None and double is None:
        return on_cpu(torch.ops.aten.arange.start_out, start, end, step, out=out)
    if out.shape != meta.shape:
        out.resize_(meta.shape)
    if n:
        target = out if out.is_contiguous() else torch.empty(meta.shape, dtype=out.dtype, device=out.device)
        if double is not None:  # fractional values through double, as the CPU (arange_double)
            arange_double.fill(target, double)
        elif dyadic is None:
            run("arange", arange_into, target, int(start), int(step))
        else:
            run("arange", arange_into, target, dyadic[0], dyadic[1], 2.0 ** -dyadic[2])
        if target is not out:
            out.copy_(target)
    return out
