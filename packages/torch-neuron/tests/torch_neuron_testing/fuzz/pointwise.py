"""Pointwise families: unary (floating, integer and bool), binary with broadcasting, type promotion, Python
scalars and CPU 0-d tensors, and the ternary ops (where, lerp, addcmul, clamp by tensors)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from .op import Op, magnitude
from .spec import Case
from .strategies import broadcast_partner, shapes, tensors
from .values import INTS, edges

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SIGNED = (torch.int64, torch.int32, torch.int16, torch.int8)
NUMERIC = FLOATS + INTS
EVERY = NUMERIC + (torch.bool,)
ARITH = NUMERIC + (torch.complex64,)


@st.composite
def _unary(draw, cap, dtypes, params):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    return Case((draw(tensors(shape, dtype)),), draw(params) if params is not None else {})


def unary(name, fn, dtypes=FLOATS, params=None, **kw) -> Op:
    return Op(name, fn, lambda cap: _unary(cap, dtypes, params), **kw)


def _scalar_of(dtype):
    """Python scalars of ``dtype``'s kind, edge values included."""
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point or dtype.is_complex:
        return st.sampled_from((2.0, -0.5, 3.0) + tuple(float(v) for v in edges(torch.float32)))
    return st.sampled_from((2, 0, -3, 7, 1))


@st.composite
def _other(draw, shape, dtype, dtypes, scalar_ok):
    """The second operand: a tensor of a broadcasting shape (maybe another dtype: promotion, maybe the
    larger of the two), a Python scalar, or a 0-d CPU tensor."""
    kind = draw(st.sampled_from(("tensor", "scalar", "cpu0d") if scalar_ok else ("tensor",)))
    other_dtype = draw(st.sampled_from((dtype,) + tuple(d for d in dtypes if d != dtype)))
    if kind == "scalar":
        return draw(_scalar_of(other_dtype))
    if kind == "cpu0d":
        return draw(tensors((), other_dtype, layouts=("contiguous",), cpu=True))
    partner = draw(broadcast_partner(shape))
    if draw(st.booleans()):  # the partner is the larger one: the result takes its shape
        return draw(tensors(shape, other_dtype)), draw(tensors(partner, dtype))
    return draw(tensors(partner, other_dtype))


@st.composite
def _binary(draw, cap, dtypes, scalar_ok, params):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    a = draw(tensors(shape, dtype))
    b = draw(_other(shape, dtype, dtypes, scalar_ok))
    if isinstance(b, tuple):  # (a larger other, a smaller self)
        a, b = b[1], b[0]
    return Case((a, b), draw(params) if params is not None else {})


def binary(name, fn, dtypes=NUMERIC, scalar_ok=True, params=None, **kw) -> Op:
    return Op(name, fn, lambda cap: _binary(cap, dtypes, scalar_ok, params), **kw)


@st.composite
def _ternary(draw, cap, dtypes, first_bool):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    first = draw(tensors(draw(broadcast_partner(shape)), torch.bool if first_bool else dtype))
    return Case((first, draw(tensors(shape, dtype)), draw(tensors(draw(broadcast_partner(shape)), dtype))))


def ternary(name, fn, dtypes=FLOATS, first_bool=False, **kw) -> Op:
    return Op(name, fn, lambda cap: _ternary(cap, dtypes, first_bool), **kw)


def _method(name):
    return lambda *a, **k: getattr(torch, name)(*a, **k)


_UNARY_FLOAT = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "sin",
                "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
                "sigmoid", "erf", "erfc", "erfinv", "lgamma", "digamma", "frac", "logit", "sinc", "i0",
                "deg2rad", "rad2deg", "angle")
_UNARY_ANY = ("abs", "neg", "sign", "square", "floor", "ceil", "round", "trunc", "signbit", "isnan", "isinf",
              "isfinite", "isposinf", "isneginf", "positive")
_ACTIVATIONS = {
    "relu": F.relu, "relu6": F.relu6, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "mish": F.mish, "softplus": F.softplus, "elu": F.elu, "selu": F.selu, "celu": F.celu,
    "leaky_relu": F.leaky_relu, "hardtanh": F.hardtanh, "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish, "logsigmoid": F.logsigmoid, "softsign": F.softsign, "tanhshrink": F.tanhshrink,
    "hardshrink": F.hardshrink, "softshrink": F.softshrink,
}
_CLAMP = st.fixed_dictionaries({"min": st.sampled_from((None, -1.0, 0.0, -math.inf, 0.5)),
                                "max": st.sampled_from((1.0, None, 0.0, math.inf, 2.5))})

UNARY = (
    [unary(n, _method(n)) for n in _UNARY_FLOAT]
    + [unary(n, _method(n), NUMERIC + (torch.bool,) if n in ("isnan", "isinf", "isfinite") else NUMERIC)
       for n in _UNARY_ANY]
    + [unary(n, f) for n, f in _ACTIVATIONS.items()]
    + [unary("sgn", torch.sgn, FLOATS + SIGNED + (torch.complex64,)),
       unary("abs_complex", torch.abs, (torch.complex64,)),
       unary("exp_complex", torch.exp, (torch.complex64,)),
       unary("bitwise_not", torch.bitwise_not, INTS + (torch.bool,)),
       unary("logical_not", torch.logical_not, EVERY),
       unary("nan_to_num", torch.nan_to_num, FLOATS),
       unary("clamp", lambda x, **k: torch.clamp(x, **k) if k["min"] is not None or k["max"] is not None
             else x.clone(), FLOATS, _CLAMP),
       unary("round_decimals", lambda x, decimals: torch.round(x, decimals=decimals), FLOATS,
             st.fixed_dictionaries({"decimals": st.sampled_from((1, -1, 2, 3))})),
       unary("pow_scalar", lambda x, exponent: torch.pow(x, exponent), FLOATS,
             st.fixed_dictionaries({"exponent": st.sampled_from((2, 0.5, 3, -1, 0, -2.5, 1.0 / 3))})),
       unary("relu_int", torch.relu, INTS),
       unary("abs_", lambda x: x.abs_(), NUMERIC, inplace=True),
       unary("mul_scalar_", lambda x: x.mul_(3), NUMERIC, inplace=True)]
)

_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
    "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}
_BINARY_FLOAT = {
    "atan2": torch.atan2, "fmax": torch.fmax, "fmin": torch.fmin, "hypot": torch.hypot,
    "copysign": torch.copysign, "xlogy": torch.xlogy, "logaddexp": torch.logaddexp, "nextafter": torch.nextafter,
    "heaviside": torch.heaviside, "ldexp_float": torch.ldexp,
}
_BINARY_INT = {"bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
               "bitwise_xor": torch.bitwise_xor, "bitwise_left_shift": torch.bitwise_left_shift,
               "bitwise_right_shift": torch.bitwise_right_shift}
_LOGICAL = {"logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor}

def _real(t):
    return t.real if isinstance(t, complex) or (isinstance(t, torch.Tensor) and t.is_complex()) else t


def _imag(t):
    if isinstance(t, complex) or (isinstance(t, torch.Tensor) and t.is_complex()):
        return t.imag
    return torch.zeros_like(t) if isinstance(t, torch.Tensor) else 0.0


def _by_parts(op):
    """The arbiter of add / sub: complex operands summed part by part. The CPU multiplies the second operand by
    alpha = 1 as a complex number, so inf + 0j gains a NaN imaginary part ((1 + 0j)(inf + 0j) = inf + nan j),
    in float64 as well, which the sum itself does not have."""
    def reference(a, b):
        if _real(a) is a and _real(b) is b:
            return op(a, b)
        re, im = op(_real(a), _real(b)), op(_imag(a), _imag(b))
        re, im = torch.broadcast_tensors(torch.as_tensor(re), torch.as_tensor(im))
        return torch.complex(re, im)
    return reference


BINARY = (
    [binary(n, f, ARITH if n in ("add", "sub", "mul", "div") else NUMERIC + (torch.bool,),
            reference=_by_parts(f) if n in ("add", "sub") else None)
     for n, f in _BINARY.items()]
    + [binary(n, f, FLOATS) for n, f in _BINARY_FLOAT.items()]
    + [binary(n, f, INTS + (torch.bool,) if "shift" not in n else INTS) for n, f in _BINARY_INT.items()]
    + [binary(n, f, EVERY) for n, f in _LOGICAL.items()]
    + [binary("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), NUMERIC),
       binary("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), NUMERIC),
       binary("floor_divide", torch.floor_divide, NUMERIC),
       binary("remainder", torch.remainder, NUMERIC),
       binary("fmod", torch.fmod, NUMERIC),
       binary("pow", torch.pow, FLOATS + SIGNED),
       binary("add_alpha", lambda a, b, alpha: torch.add(a, b, alpha=alpha), NUMERIC,
              params=st.fixed_dictionaries({"alpha": st.sampled_from((2, -1, 3))})),
       binary("sub_alpha", lambda a, b, alpha: torch.sub(a, b, alpha=alpha), FLOATS,
              params=st.fixed_dictionaries({"alpha": st.sampled_from((0.5, -2.0, 1e-3))})),
       binary("isclose", torch.isclose, FLOATS),
       binary("add_", lambda a, b: a.add_(b), NUMERIC, inplace=True),
       binary("mul_", lambda a, b: a.mul_(b), NUMERIC, inplace=True),
       binary("maximum_", lambda a, b: torch.maximum(a, b, out=a), FLOATS, scalar_ok=False, inplace=True)]
)

def _addcmul(a, b, c):
    return torch.addcmul(a, b, c, value=0.5)


def _addcdiv(a, b, c):
    return torch.addcdiv(a, b, c, value=2)


TERNARY = [
    ternary("where", torch.where, EVERY, first_bool=True),
    ternary("lerp", torch.lerp, (torch.float32, torch.bfloat16, torch.float16, torch.float64)),
    ternary("addcmul", _addcmul, FLOATS, scale=magnitude(_addcmul)),
    ternary("addcdiv", _addcdiv, FLOATS, scale=magnitude(_addcdiv)),
    ternary("clamp_tensors", lambda lo, x, hi: torch.clamp(x, lo, hi), FLOATS + INTS),
]
