"""complex64 add, sub and mul on the device: float32 math on the real and imaginary parts (``view_as_real``), the
formulas torch's CPU kernels use: (a + bi)(c + di) = (ac - bd) + (ad + bc)i, each product and sum rounded to
float32. Rotary embeddings written with complex numbers (Llama 4, DeepSeek-V2, TorchTitan's Llama) multiply
complex tensors forward and, against conjugates, backward.

pointwise.base sends a plan here (``Plan.wide``) when the signature's promoted dtype and result are complex64 and
the op is in ``COMPLEX``. Operands: complex64 tensors (conjugate and negative views resolved first), real tensors
and Python numbers (imaginary part 0, as torch promotes them). A complex ``alpha`` and complex128 stay on the CPU.
"""

from __future__ import annotations

import torch

from ..core.fallback import on_cpu
from .base import COMPLEX, target_kwargs


def _parts(v):
    """(real, imaginary) of an operand: float32 tensors or Python floats."""
    if isinstance(v, torch.Tensor):
        if v.is_complex():
            r = torch.view_as_real(v.resolve_conj().resolve_neg())
            return r[..., 0], r[..., 1]
        return v.to(torch.float32), 0.0
    c = complex(v)
    return c.real, c.imag


def _mul(a, b):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return ar * br - ai * bi, ar * bi + ai * br


def _add_like(sign: float):
    def combine(a, b, alpha=1):
        if isinstance(alpha, complex):
            return None
        (ar, ai), (br, bi) = _parts(a), _parts(b)
        scale = sign * alpha
        return ar + br * scale, ai + bi * scale
    return combine


_PARTS = {"mul": _mul, "add": _add_like(1.0), "sub": _add_like(-1.0)}


def run(entry, plan, args, kwargs, target):
    """Functional (target None), in-place or out= call of a complex64 signature."""
    given, kwargs = kwargs, target_kwargs(entry, plan, args, kwargs, target)
    parts = _PARTS[entry.name](*args, **kwargs)
    if parts is None:
        return on_cpu(entry.overload, *args, **given)
    re, im = (torch.as_tensor(p, dtype=torch.float32, device=plan.device).expand(plan.shape) for p in parts)
    result = torch.view_as_complex(torch.stack((re, im), dim=-1))
    if target is None:
        return result
    target.copy_(result)
    return target


COMPLEX.update(dict.fromkeys(_PARTS, run))
