"""Pointwise aten ops on the elementwise kernels of the library: unary math, binary arithmetic, bitwise and
logical ops, comparisons, where, clamp (functional, in-place and ``out=`` overloads).

The kernels follow torch's type promotion themselves (tensors, 0-d tensors and Python scalars rank as in
``torch.result_type``); pointwise.base makes the plan and the operands. What stays on the CPU, and why:
integer floor/trunc division, remainder and fmod by a tensor (a zero divisor must raise, as torch does;
the engines would give an unspecified value), integer powers with tensor exponents (FP32 is inexact above
2**24), shifts by tensor counts (torch's out-of-range counts give 0 or the sign, the kernels clamp),
and every signature whose promoted dtype is int64, float64 or complex.
"""

from __future__ import annotations

import numpy as np
import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library.formula import Expr, abs_, act, fmod, inputs, node_of, where

from ..core.dtypes import FLOATS
from .base import INTS, Raw, dynamic, pointwise, scalar_to
from .expr import call, rounded


def _floats(plan, *args, **kwargs) -> bool:
    return plan.R in FLOATS


def _not_bool(plan, *args, **kwargs) -> bool:
    return plan.R is not torch.bool


def _names(op: str, inplace: bool = True) -> dict:
    return dict(functional_names=[f"{op}.default"], inplace_names=[f"{op}_.default"] if inplace else [],
                out_names=[f"{op}.out"])


# -- unary ---------------------------------------------------------------------------------------------
def _unary(kernel):
    return lambda plan, self: (kernel, (self,), {})


# float functions (integer and bool inputs give float32, as in torch)
for _op in ("exp", "expm1", "log", "log2", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh",
            "sigmoid", "erf"):
    pointwise(_op, **_names(_op), promoted=(0,))(_unary(getattr(ew, _op)))
# float-only activations, and ops exact on integers too (bool excluded where torch refuses it)
for _op in ("silu",):
    pointwise(_op, **_names(_op), promoted=(0,), supports=_floats)(_unary(getattr(ew, _op)))
for _op in ("neg", "abs", "relu", "floor", "ceil", "trunc"):
    pointwise(_op, **_names(_op), promoted=(0,), supports=_not_bool)(_unary(getattr(ew, _op)))
pointwise("round", **_names("round"), promoted=(0,), supports=_not_bool)(_unary(ew.round))
pointwise("logical_not", **_names("logical_not"), promoted=(0,))(_unary(ew.logical_not))
pointwise("bitwise_not", **_names("bitwise_not"), promoted=(0,),
          supports=lambda plan, *a: plan.R in INTS or plan.R is torch.bool)(_unary(ew.bitwise_not))


# 2 ** x by VectorE's power (exact for integral x; the library's exp(x * ln 2) loses |x| * 2**-24)
pointwise("exp2", **_names("exp2"), promoted=(0,))(lambda plan, self: (ew.pow, (2.0, self), {}))


@pointwise("round", ["round.decimals"], ["round_.decimals"], ["round.decimals_out"], promoted=(0,),
           supports=_not_bool)
def _round_decimals(plan, self, *, decimals):
    if decimals == 0:
        return ew.round, (self,), {}
    if plan.R not in FLOATS:
        return None
    # torch's CPU kernel in its own order, in FP32 (opmath): t = x * 10**d (x / 10**-d for d < 0), nearbyint(t),
    # then / 10**d (* 10**-d); nearbyint as (t + c) - c with c = copysign(2**23, t), which rounds half to even
    # for |t| < 2**23 (larger floats are integral already); a zero keeps t's sign as nearbyint does
    (x,) = inputs(1)
    p = float(np.float32(10.0 ** abs(decimals)))
    t = x * p if decimals > 0 else x / p
    c = act("sign", t) * _TWO23
    r = where(abs_(t).lt(_TWO23), (t + c) - c, t)
    r = where(r.eq(0.0), t * 0.0, r)
    return call(r / p if decimals > 0 else r * p, (self,), plan.dtype)


_TWO23 = 8388608.0


@pointwise("frac", **_names("frac"), promoted=(0,), supports=_floats)
def _frac(plan, self):
    return ew.fmod, (self, 1.0), {}  # x - trunc(x) == fmod(x, 1) exactly, inf and nan included


@pointwise("gelu", **_names("gelu"), promoted=(0,), supports=_floats)
def _gelu(plan, self, *, approximate="none"):
    return ew.gelu, (self,), {"approximate": approximate}


@pointwise("softplus", **_names("softplus", False), promoted=(0,), supports=_floats)
def _softplus(plan, self, beta=1, threshold=20):
    return ew.softplus, (self,), {"beta": float(beta), "threshold": float(threshold)}


@pointwise("hardtanh", **_names("hardtanh"), promoted=(0,), supports=_floats)
def _hardtanh(plan, self, min_val=-1, max_val=1):
    return ew.clamp, (self,), {"min": float(min_val), "max": float(max_val)}


# -- binary arithmetic -----------------------------------------------------------------------------------
def _check_fits(v, dtype) -> None:
    """torch's error for a scalar argument (alpha) that does not fit an integral dtype. c10's check lets an
    unsigned type take negatives down to -max (they wrap: uint8 alpha -1 subtracts), as the CPU does."""
    if dtype in INTS and v.__class__ is int:
        info = torch.iinfo(dtype)
        low = -info.max if info.min == 0 else info.min
        if not low <= v <= info.max:
            raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dtype]} without overflow")


_C_NAMES = {torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int32_t"}


def _second(b):
    """torch's CPU mul/div read a 0-d second operand at full precision (its opmath value), not converted to
    a bfloat16/float16 result dtype first (add/sub/comparisons convert it)."""
    return Raw(b) if isinstance(b, torch.Tensor) and b.dim() == 0 else b


def _opmath_call(plan, kernel, a, b, formula):
    """``kernel(a, b)`` with ``b`` read at full precision. Between two 0-d tensors the kernel would promote to
    the converted ``b``'s dtype (an int64 count becomes float32, so bf16_sum / count gave float32; so would a
    changing float scalar, passed as a 0-d float32 tensor): a formula then computes in FP32 and rounds once to
    the result dtype, as torch's CPU kernel does."""
    if (isinstance(b, torch.Tensor) and b.dim() == 0 and b.dtype is not plan.dtype and isinstance(a, torch.Tensor)
            and a.dim() == 0):
        x, y = inputs(2)
        return call(formula(x, y), (a, Raw(b)), plan.dtype)
    return kernel, (a, _second(b)), {}


def _add_like(kernel, swap=False):
    def adapter(plan, self, other, alpha=1):  # positional in rsub.Scalar's schema, keyword-only elsewhere
        _check_fits(alpha, plan.R)
        a, b = (other, self) if swap else (self, other)
        # torch rounds a float alpha (and scalars) to a bfloat16/float16 dtype, then computes in FP32
        a, b, alpha = scalar_to(a, plan.R), scalar_to(b, plan.R), scalar_to(alpha, plan.R)
        if plan.R in FLOATS:
            a, b = (_dynamic_operand(plan, n, v, plan.R) for n, v in (("a", a), ("b", b)))
            if alpha != 1 and isinstance(b, torch.Tensor):
                alpha = dynamic(plan, "alpha", alpha, plan.R)
                if isinstance(alpha, torch.Tensor):  # a changing alpha: the formula takes it as an input
                    x, y, w = inputs(3)
                    return call(x + y * w if kernel is ew.add else x - y * w, (a, b, alpha), plan.dtype)
        return kernel, (a, b), {"alpha": alpha}
    return adapter


def _dynamic_operand(plan, slot, v, dtype):
    return dynamic(plan, slot, v, dtype) if v.__class__ is float else v


_BIN = dict(promoted=(0, 1))
pointwise("add", ["add.Tensor", "add.Scalar"], ["add_.Tensor", "add_.Scalar"], ["add.out", "add.Scalar_out"],
          **_BIN)(_add_like(ew.add))
pointwise("sub", ["sub.Tensor", "sub.Scalar"], ["sub_.Tensor", "sub_.Scalar"], ["sub.out", "sub.Scalar_out"],
          **_BIN)(_add_like(ew.sub))
pointwise("rsub", ["rsub.Tensor", "rsub.Scalar"], [], ["rsub.Tensor_out", "rsub.Scalar_out"],
          **_BIN)(_add_like(ew.sub, swap=True))


def _binary(kernel):
    return lambda plan, self, other: (kernel, (scalar_to(self, plan.R), scalar_to(other, plan.R)), {})


def _opmath_second(kernel):
    def adapter(plan, self, other):
        if plan.R in INTS:
            self, other = scalar_to(self, plan.R), scalar_to(other, plan.R)
        elif plan.R in FLOATS:  # a changing float scalar becomes a 0-d float32 operand (torch's opmath value)
            self = _dynamic_operand(plan, "a", scalar_to(self, plan.R), plan.R)  # a first operand is converted
            other = _dynamic_operand(plan, "b", other, torch.float32)
            return _opmath_call(plan, kernel, self, other, lambda x, y: x * y)
        return kernel, (self, _second(other)), {}
    return adapter


pointwise("mul", ["mul.Tensor", "mul.Scalar"], ["mul_.Tensor", "mul_.Scalar"], ["mul.out", "mul.Scalar_out"],
          **_BIN)(_opmath_second(ew.mul))
pointwise("maximum", **_names("maximum", False), **_BIN)(_binary(ew.maximum))
pointwise("minimum", **_names("minimum", False), **_BIN)(_binary(ew.minimum))


def _int_divisor_ok(plan, self, other, *rest, **kwargs) -> bool:
    """Integer division by a tensor must raise for zero divisors: the CPU does it."""
    return plan.R in FLOATS or (plan.R in INTS and not isinstance(other, torch.Tensor))


def _int_scalar_divisor(plan, other):
    other = scalar_to(other, plan.R)
    if plan.R in INTS and other == 0:
        raise RuntimeError("ZeroDivisionError")  # torch's error for an integer division by zero
    return other


def _true_div(plan, self, other):
    """True division computes in float: an int scalar is a float (not wrapped into an integer dtype)."""
    if plan.R in INTS:
        self, other = (float(v) if v.__class__ is int else v for v in (self, other))
    elif plan.R in FLOATS:
        self = _dynamic_operand(plan, "a", scalar_to(self, plan.R), plan.R)
        other = _dynamic_operand(plan, "b", other, torch.float32)
        return _opmath_call(plan, ew.div, self, other, lambda x, y: x / y)
    return ew.div, (self, _second(other)), {}


pointwise("div", ["div.Tensor", "div.Scalar"], ["div_.Tensor", "div_.Scalar"], ["div.out", "div.Scalar_out"],
          **_BIN)(_true_div)


def _divisor(plan, other, opmath: bool):
    """The divisor as torch's CPU reads it: with ``opmath`` (floor and trunc division) a float one, Python or
    0-d, at its opmath value (FP32 for bfloat16/float16, as mul/div read theirs: ``1.0 // 0.1`` is 9 in
    float16, not 10 from the rounded 0.0999755859375); otherwise (fmod, remainder) converted to the dtype.
    An int scalar wraps into an integral dtype (zero raises)."""
    if opmath and plan.R in FLOATS:
        return _second(other)
    return other if isinstance(other, torch.Tensor) else _int_scalar_divisor(plan, other)


def _trunc_div_reduced(plan, self, other):
    """torch rounds a bfloat16/float16 quotient by a dimensioned tensor to its dtype before truncating it (by a
    scalar it truncates the FP32 quotient: the kernel's way)."""
    tensors = [v for v in (self, other) if isinstance(v, torch.Tensor)]
    xs = iter(inputs(len(tensors)))
    a = next(xs) if isinstance(self, torch.Tensor) else float(scalar_to(self, plan.R))
    q = rounded(Expr(("alu", "divide", node_of(a), node_of(next(xs)))), plan.R)
    return call(where(abs_(q).lt(2.0 ** 23), q - fmod(q, 1.0), q), tensors, plan.dtype)


def _division(kernel, mode_arg=False, opmath=False):
    def adapter(plan, self, other, *, rounding_mode=None):
        if mode_arg and rounding_mode is None:
            return _true_div(plan, self, other)
        if (mode_arg and rounding_mode == "trunc" and plan.R in (torch.bfloat16, torch.float16)
                and isinstance(other, torch.Tensor) and other.dim()):
            return _trunc_div_reduced(plan, self, other)
        consts = {"rounding_mode": rounding_mode} if mode_arg else {}
        return kernel, (scalar_to(self, plan.R), _divisor(plan, other, opmath)), consts
    return adapter


def _mode_ok(plan, self, other, *, rounding_mode=None) -> bool:
    return rounding_mode is None or _int_divisor_ok(plan, self, other)


pointwise("div", ["div.Tensor_mode", "div.Scalar_mode"], ["div_.Tensor_mode", "div_.Scalar_mode"],
          ["div.out_mode", "div.Scalar_mode_out"], supports=_mode_ok,
          **_BIN)(_division(ew.div, mode_arg=True, opmath=True))
pointwise("floor_divide", ["floor_divide.default", "floor_divide.Scalar"],
          ["floor_divide_.Tensor", "floor_divide_.Scalar"], ["floor_divide.out", "floor_divide.Scalar_out"],
          supports=_int_divisor_ok, **_BIN)(_division(ew.floor_divide, opmath=True))
def _remainder(plan, self, other):
    """Floats: torch's formula, fmod(a, b) + b where the remainder is nonzero and its sign differs from b's
    (as a formula: the library's form multiplies the correction by b, nan for b = +-inf)."""
    if plan.R not in FLOATS:
        return _division(ew.remainder)(plan, self, other)
    tensors = [v for v in (self, other) if isinstance(v, torch.Tensor)]
    xs = iter(inputs(len(tensors)))
    a, b = (next(xs) if isinstance(v, torch.Tensor) else float(scalar_to(v, plan.R)) for v in (self, other))
    m = Expr(("alu", "mod", node_of(a), node_of(b)))
    wrong = m.ne(0.0) * m.lt(0.0).ne(b.lt(0.0) if isinstance(b, Expr) else float(b < 0))
    return call(where(wrong, m + b, m), tensors, plan.dtype)


pointwise("remainder", ["remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor"],
          ["remainder_.Tensor", "remainder_.Scalar"],
          ["remainder.Tensor_out", "remainder.Scalar_out", "remainder.Scalar_Tensor_out"],
          supports=_int_divisor_ok, **_BIN)(_remainder)
pointwise("fmod", ["fmod.Tensor", "fmod.Scalar"], ["fmod_.Tensor", "fmod_.Scalar"],
          ["fmod.Tensor_out", "fmod.Scalar_out"], supports=_int_divisor_ok, **_BIN)(_division(ew.fmod))


def _pow_ok(plan, self, exponent) -> bool:
    """Integer powers are exact only for a scalar exponent (repeated squaring, wrapping like torch)."""
    return plan.R in FLOATS or (plan.R in INTS and not isinstance(exponent, torch.Tensor))


@pointwise("pow", ["pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar"], ["pow_.Tensor", "pow_.Scalar"],
           ["pow.Tensor_Tensor_out", "pow.Tensor_Scalar_out", "pow.Scalar_out"], supports=_pow_ok, **_BIN)
def _pow(plan, self, exponent):
    if plan.R in INTS and (not isinstance(exponent, int) or exponent < 0):
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if plan.R in FLOATS:  # a Python float base or exponent is rounded to bfloat16/float16 first, as torch does
        self, exponent = scalar_to(self, plan.R), scalar_to(exponent, plan.R)
    return ew.pow, (self, exponent), {}


# -- bitwise and logical -----------------------------------------------------------------------------------
def _int_or_bool(plan, *args, **kwargs) -> bool:
    return plan.R in INTS or plan.R is torch.bool


def _bitwise_names(op: str) -> dict:
    return dict(functional_names=[f"{op}.Tensor", f"{op}.Scalar", f"{op}.Scalar_Tensor"],
                inplace_names=[f"{op}_.Tensor", f"{op}_.Scalar"],
                out_names=[f"{op}.Tensor_out", f"{op}.Scalar_out", f"{op}.Scalar_Tensor_out"])


for _op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    pointwise(_op, **_bitwise_names(_op), supports=_int_or_bool, **_BIN)(_binary(getattr(ew, _op)))
for _op in ("logical_and", "logical_or", "logical_xor"):
    pointwise(_op, **_names(_op), **_BIN)(_binary(getattr(ew, _op)))


def _shift(kernel):
    def adapter(plan, self, other):
        if plan.R is torch.bool:
            return None
        count = scalar_to(other, plan.R)
        # torch: counts outside [0, bits) give 0 (left) or the sign (right); the 64-bit shift by 63 gives both
        return kernel, (scalar_to(self, plan.R), count if 0 <= count <= 63 else 63), {}
    return adapter


def _scalar_count(plan, self, other) -> bool:
    return plan.R in INTS and not isinstance(other, torch.Tensor)


for _op, _dunder in (("bitwise_left_shift", "__lshift__"), ("bitwise_right_shift", "__rshift__")):
    pointwise(_op, [f"{_op}.Tensor_Scalar", f"{_dunder}.Scalar"],
              [f"{_op}_.Tensor_Scalar", f"__i{_dunder[2:]}.Scalar"],
              [f"{_op}.Tensor_Scalar_out", f"{_dunder}.Scalar_out"], supports=_scalar_count,
              **_BIN)(_shift(getattr(ew, _op)))


# -- comparisons ---------------------------------------------------------------------------------------------
def _compare(kernel):
    def adapter(plan, self, other):
        if plan.R is torch.int64:  # a bool tensor against a Python int: 0/1 compare exactly in FP32
            return kernel, tuple(float(v) if v.__class__ is int else v for v in (self, other)), {}
        return kernel, (scalar_to(self, plan.R), scalar_to(other, plan.R)), {}
    return adapter


def _bool_vs_int(plan, self, other) -> bool:
    tensors = [v for v in (self, other) if isinstance(v, torch.Tensor)]
    return plan.R is not torch.int64 or all(t.dtype is torch.bool for t in tensors)


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    pointwise(_op, [f"{_op}.Tensor", f"{_op}.Scalar"], [f"{_op}_.Tensor", f"{_op}_.Scalar"],
              [f"{_op}.Tensor_out", f"{_op}.Scalar_out"], supports=_bool_vs_int, **_BIN)(_compare(getattr(ew, _op)))


# -- where, clamp ----------------------------------------------------------------------------------------
@pointwise("where", ["where.self"], [], ["where.self_out"], promoted=(1, 2))
def _where(plan, condition, self, other):
    return ew.where, (condition, self, other), {}


def _clamp(plan, self, min=None, max=None):  # noqa: A002
    return ew.clamp, (self, min, max), {}


def _numeric(plan, *args, **kwargs) -> bool:
    return plan.R is not torch.bool


for _op, _promoted in (("clamp", (0, 1, 2)), ("clamp_min", (0, 1)), ("clamp_max", (0, 1))):
    _adapter = _clamp if _op == "clamp" else (
        (lambda plan, self, min: _clamp(plan, self, min=min)) if _op == "clamp_min"
        else (lambda plan, self, max: _clamp(plan, self, max=max)))
    pointwise(_op, [f"{_op}.default", f"{_op}.Tensor"], [f"{_op}_.default", f"{_op}_.Tensor"],
              [f"{_op}.out", f"{_op}.Tensor_out"], promoted=_promoted, supports=_numeric)(_adapter)
