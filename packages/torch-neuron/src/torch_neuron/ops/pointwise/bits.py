"""nextafter, frexp, ldexp and copysign on the float bits (``neuron_kernels.library.float_bits``: exact integer
arithmetic on GpSimd for every value, ±0/subnormals/inf/NaN included) for float32, bfloat16 and float16; other
dtypes (float64, and the integer inputs torch rejects with its own error) take the CPU path. A 0-d CPU tensor
operand is taken as the other binary ops take it (uploaded, promoted as a 0-d tensor).
"""

from __future__ import annotations

import torch

from neuron_kernels.library import float_bits

from ..core.compose import write_outs
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import check_cast, contig
from .base import operand_device

aten = torch.ops.aten
_FMT = {torch.float32: ("float32", torch.int32), torch.bfloat16: ("bfloat16", torch.int16),
        torch.float16: ("float16", torch.int16)}


def _bits(t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = t.to(device=device, dtype=dtype)  # a 0-d CPU operand is uploaded; promotion casts on the device
    return contig(t).view(_FMT[dtype][1])


def nextafter(self, other):
    dtype = torch.result_type(self, other)
    if dtype not in _FMT:
        return on_cpu(aten.nextafter.default, self, other)
    device = operand_device([self, other])
    shape = torch.broadcast_shapes(self.shape, other.shape)
    if 0 in shape:
        return torch.empty(shape, dtype=dtype, device=device)
    a, b = _bits(self, dtype, device), _bits(other, dtype, device)
    return run("nextafter", float_bits.nextafter, a, b, fmt=_FMT[dtype][0])[0].view(dtype)


def nextafter_(self, other):
    result = nextafter(self, other)
    check_cast(result.dtype, self)
    return self.copy_(result)  # a result larger than self (broadcasting) makes copy_ raise, as torch does


def copysign(self, other):
    """torch.copysign: ``self``'s magnitude with ``other``'s sign bit, in the promoted float dtype (integers
    promote to the default float dtype, as torch's)."""
    dtype = torch.result_type(self, other)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype not in _FMT:
        return on_cpu(aten.copysign.Tensor, self, other)
    if not isinstance(other, torch.Tensor):  # a Python number (torch.copysign(x, -1.0)): only its sign counts
        other = torch.tensor(float(other), dtype=dtype)
    device = operand_device([self, other])
    shape = torch.broadcast_shapes(self.shape, other.shape)
    if 0 in shape:
        return torch.empty(shape, dtype=dtype, device=device)
    a, b = _bits(self, dtype, device), _bits(other, dtype, device)
    return run("copysign", float_bits.copysign, a, b, fmt=_FMT[dtype][0])[0].view(dtype).view(shape)


def frexp(self):
    if self.dtype not in _FMT:
        return on_cpu(aten.frexp.Tensor, self)
    if self.numel() == 0:
        return torch.empty(self.shape, dtype=self.dtype, device=self.device), torch.empty(
            self.shape, dtype=torch.int32, device=self.device)
    fmt, bits = _FMT[self.dtype]
    mant, exp = run("frexp", float_bits.frexp, contig(self).view(bits), fmt=fmt)
    return mant.view(self.dtype).view(self.shape), exp.view(self.shape)


def _frexp_out(self, *, mantissa, exponent):
    if self.dtype not in _FMT or mantissa.dtype != self.dtype or exponent.dtype != torch.int32:
        return on_cpu(aten.frexp.Tensor_out, self, mantissa=mantissa, exponent=exponent)  # or torch's error
    return write_outs((mantissa, exponent), frexp(self))


_EXPONENTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)  # the CPU's exact ldexp


def ldexp(self, other):
    """torch's CPU: a float ``self`` with an integer ``other`` is C's ldexp(x, int(e)), exact and rounded once
    (an int64 exponent converted to int as C converts it: its low 32 bits), so ldexp(0.01, 17) is 1311 in
    float16 where 2**17 in float16 would overflow; otherwise self * 2**other, with 2**other in float32 for
    integer and float32 ``self`` and in self's dtype for the others (aten's general ldexp)."""
    if self.dtype in _FMT and other.dtype in _EXPONENTS:
        return _exact_ldexp(self, other)
    if self.is_floating_point() and not other.is_floating_point():  # float64, bool/uint exponents: torch's own
        return on_cpu(aten.ldexp.Tensor, self, other)
    two = 2.0 if self.dtype == torch.float32 or not self.is_floating_point() else \
        torch.tensor(2.0, dtype=self.dtype, device=self.device)
    return torch.mul(self, torch.pow(two, other))


def _exact_ldexp(self, other):
    device = self.device if self.device.type == "neuron" else other.device  # one may be a 0-d CPU tensor
    shape = torch.broadcast_shapes(self.shape, other.shape)
    if 0 in shape:
        return torch.empty(shape, dtype=self.dtype, device=device)
    e = other.to(device=device, dtype=torch.int32)  # int64 wraps to its low word, as C's int conversion
    return run("ldexp", float_bits.ldexp, contig(self.to(device)), contig(e))[0].view(shape)
