"""Elementwise aten ops of a graph as formula nodes (``ops.pointwise.expr.Expr``).

A fused region evaluates its ops in FP32 on each tile and rounds only the values it hands out (Inductor
does the same); an explicit dtype conversion inside the region (autocast's casts) is kept as a rounding.
Tensor operands are float (float32, bfloat16, float16) or bool masks; integer values are never fused (FP32
is inexact above 2**24). Each entry takes the node's arguments with tensors as ``Expr`` and returns an
``Expr``, or None when that call is not expressible (it then runs as an eager op).
"""

from __future__ import annotations

import torch

from neuron_kernels.library.formula import Expr, act, where

from ..ops.core.dtypes import FLOATS
from ..ops.pointwise.expr import rounded

aten = torch.ops.aten
prims = torch.ops.prims
VALUE_DTYPES = (*FLOATS, torch.bool)


def _number(v) -> bool:
    return isinstance(v, bool | int | float) and not isinstance(v, complex)


def _operand(v) -> bool:
    return isinstance(v, Expr) or _number(v)


def _scaled(b, alpha):
    return b if alpha == 1 else b * float(alpha)


def _add(a, b, alpha=1):
    if not (_operand(a) and _operand(b) and _number(alpha)):
        return None
    return _as_expr(a) + _scaled(b, alpha)


def _sub(a, b, alpha=1):
    if not (_operand(a) and _operand(b) and _number(alpha)):
        return None
    return _as_expr(a) - _scaled(b, alpha)


def _rsub(a, b, alpha=1):
    return _sub(b, a, alpha)


def _binary(fn):
    def lower(a, b):
        if not (_operand(a) and _operand(b)) or not (isinstance(a, Expr) or isinstance(b, Expr)):
            return None
        return fn(_as_expr(a), b) if isinstance(a, Expr) else fn(_as_expr(b), a, swap=True)
    return lower


def _as_expr(v):
    return v if isinstance(v, Expr) else Expr(float(v))


def _div(a, b, rounding_mode=None):
    return None if rounding_mode is not None else _binary(lambda x, y, swap=False: y / x if swap else x / y)(a, b)


def _compare(method: str, swapped: str):
    return _binary(lambda x, y, swap=False: getattr(x, swapped if swap else method)(y))


def _activation(func: str):
    return lambda x: act(func, x) if isinstance(x, Expr) else None


def _gelu(x, approximate="none"):
    return act("gelu" if approximate == "none" else "gelu_tanh", x) if isinstance(x, Expr) else None


def _pow(x, exponent):
    if not isinstance(x, Expr) or not _number(exponent):
        return None
    e = float(exponent)
    if e == 2.0:
        return x * x
    if e == 1.0:
        return x
    if e == 0.5:
        return act("sqrt", x)
    if e == -0.5:
        return act("rsqrt", x)
    if e == -1.0:
        return act("reciprocal", x)
    return None  # the library's pow (VectorE) in eager keeps its own edge cases


def _where(cond, a, b):
    if not isinstance(cond, Expr) or not (_operand(a) and _operand(b)):
        return None
    return where(cond, a, b)


def _convert(x, dtype):
    if not isinstance(x, Expr) or dtype not in VALUE_DTYPES:
        return None
    if dtype is torch.bool:
        return x.ne(0.0)
    return x if dtype is torch.float32 else rounded(x, dtype)


def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    # the device, when named, is the operands' own (``fusion`` fuses only nodes on one device)
    if layout not in (None, torch.strided) or memory_format not in (None, torch.preserve_format) or (
            device is not None and torch.device(device).type != "neuron"):
        return None
    return x if dtype is None and isinstance(x, Expr) else _convert(x, dtype)


def _identity(x, *args, **kwargs):
    return x if isinstance(x, Expr) and not args and not kwargs.get("memory_format") else None


LOWERINGS = {
    aten.add.Tensor: _add, aten.add.Scalar: _add,
    aten.sub.Tensor: _sub, aten.sub.Scalar: _sub, aten.rsub.Scalar: _rsub, aten.rsub.Tensor: _rsub,
    aten.mul.Tensor: _binary(lambda x, y, swap=False: x * y), aten.mul.Scalar: _binary(lambda x, y, swap=False: x * y),
    aten.div.Tensor: _div, aten.div.Scalar: _div, aten.div.Tensor_mode: _div,
    aten.neg.default: lambda x: -x if isinstance(x, Expr) else None,
    aten.exp.default: _activation("exp"), aten.log.default: _activation("log"),
    aten.tanh.default: _activation("tanh"), aten.sigmoid.default: _activation("sigmoid"),
    aten.relu.default: _activation("relu"), aten.silu.default: _activation("silu"),
    aten.sqrt.default: _activation("sqrt"), aten.rsqrt.default: _activation("rsqrt"),
    aten.reciprocal.default: _activation("reciprocal"), aten.abs.default: _activation("abs"),
    aten.sin.default: _activation("sin"), aten.cos.default: _activation("cos"), aten.erf.default: _activation("erf"),
    aten.gelu.default: _gelu,
    aten.pow.Tensor_Scalar: _pow,
    aten.eq.Tensor: _compare("eq", "eq"), aten.eq.Scalar: _compare("eq", "eq"),
    aten.ne.Tensor: _compare("ne", "ne"), aten.ne.Scalar: _compare("ne", "ne"),
    aten.lt.Tensor: _compare("lt", "gt"), aten.lt.Scalar: _compare("lt", "gt"),
    aten.le.Tensor: _compare("le", "ge"), aten.le.Scalar: _compare("le", "ge"),
    aten.gt.Tensor: _compare("gt", "lt"), aten.gt.Scalar: _compare("gt", "lt"),
    aten.ge.Tensor: _compare("ge", "le"), aten.ge.Scalar: _compare("ge", "le"),
    aten.logical_not.default: lambda x: x.eq(0.0) if isinstance(x, Expr) else None,
    aten.where.self: _where,
    prims.convert_element_type.default: _convert,
    aten._to_copy.default: _to_copy,
    aten.clone.default: _identity, aten.alias.default: _identity,
}


def lower(target, args, kwargs) -> Expr | None:
    """The formula of ``target(*args, **kwargs)`` over ``Expr`` operands, or None."""
    fn = LOWERINGS.get(target)
    if fn is None:
        return None
    try:
        return fn(*args, **kwargs)
    except TypeError:  # an argument form the entry does not take
        return None
