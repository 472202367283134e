"""Composite pointwise ops as single formula programs (pointwise.expr): sign, tan, log10, the hard/leaky/elu/mish
activations, threshold, fmax/fmin, lerp, addcmul, addcdiv, nan_to_num, the special-value tests, the
backward helpers autograd calls for the activations, and torch.equal.

Formulas follow torch's CPU kernels term by term (same operation order where it matters for rounding),
computed in FP32 and rounded once to the result dtype, as torch does for bfloat16/float16. All of them are
float-only (integer versions, where torch has them, take the CPU path: FP32 is inexact above 2**24).
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import movement
from neuron_kernels.library.formula import abs_, act, inputs, maximum, minimum, where

from ..core.checks import same_device
from ..core.dtypes import FLOATS
from ..core.registry import impl
from .base import INTS, Raw, dynamic, pointwise
from .expr import call

_INF = math.inf


def _floats(plan, *args, **kwargs) -> bool:
    return plan.R in FLOATS


def _names(op: str, inplace=True, out="out") -> dict:
    return dict(functional_names=[op], inplace_names=[f"{op}_"] if inplace else [],
                out_names=[f"{op}.{out}"] if out else [])


def _unary(e_fn):
    """An adapter for a one-input formula ``e_fn(x, *consts)``."""
    def adapter(plan, self, *consts, **kw):
        (x,) = inputs(1)
        return call(e_fn(x, *consts, **kw), (self,), plan.dtype)
    return adapter


def _float_result(plan, *args, **kwargs) -> bool:
    """Float results of any input: integer inputs are read as FP32, the conversion torch applies first."""
    return plan.dtype in FLOATS


def _register_unary(op, e_fn, inplace=True, out="out"):
    pointwise(op, **_names(op, inplace, out), promoted=(0,), supports=_float_result)(_unary(e_fn))


# -- unary -------------------------------------------------------------------------------------------------
def _sign(x):
    return x.gt(0.0) - x.lt(0.0)  # nan compares false both ways: sign(nan) == 0, as torch


def _sign_adapter(plan, self):
    if plan.R in INTS:
        return ew.sign, (self,), {}  # exact on GpSimd
    return call(_sign(inputs(1)[0]), (self,), plan.dtype)


for _op in ("sign", "sgn"):
    pointwise(_op, **_names(_op), promoted=(0,), supports=lambda plan, *a: plan.R in FLOATS or plan.R in INTS)(
        _sign_adapter)
_register_unary("tan", lambda x: act("sin", x) / act("cos", x))
_register_unary("log1p", lambda x: where(x.eq(_INF), _INF, where(  # log(u) * x / (u - 1), u = 1 + x rounded
    ((x + 1.0) - 1.0).eq(0.0), x, act("log", x + 1.0) * (x / ((x + 1.0) - 1.0)))))
_register_unary("log10", lambda x: act("log", x) * (1.0 / math.log(10.0)))
_register_unary("mish", lambda x: x * act("tanh", act("softplus", x)))
_register_unary("hardsigmoid", lambda x: minimum(maximum(x + 3.0, 0.0), 6.0) / 6.0)
_register_unary("hardswish", lambda x: x * minimum(maximum(x + 3.0, 0.0), 6.0) / 6.0)
_register_unary("leaky_relu", lambda x, negative_slope=0.01: where(x.gt(0.0), x, x * float(negative_slope)))
_register_unary("threshold", lambda x, threshold, value: where(x.le(float(threshold)), float(value), x))


def _expm1(x):
    """exp(x) - 1 accurate near 0 (the library's expm1 formula): 2t / (1 - t), t = tanh(x / 2), for |x| < 0.5."""
    t = act("tanh", x, 0.5)
    return where(abs_(x).lt(0.5), (t + t) / (1.0 - t), act("exp", x) - 1.0)


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = _expm1(x * float(input_scale)) * (float(alpha) * float(scale))
    return where(x.le(0.0), neg, x * float(scale))


_register_unary("elu", _elu)


def _nan_to_num(plan, self, nan=None, posinf=None, neginf=None):
    if plan.R not in FLOATS:
        return movement.copy, (self,), {}  # integers have no nan or inf: a copy
    info = torch.finfo(plan.dtype)
    (x,) = inputs(1)
    e = where(x.eq(_INF), info.max if posinf is None else posinf,
              where(x.eq(-_INF), info.min if neginf is None else neginf, x))
    return call(where(x.isnan(), 0.0 if nan is None else nan, e), (self,), plan.dtype)


pointwise("nan_to_num", **_names("nan_to_num"), promoted=(0,),
          supports=lambda plan, *a, **k: plan.R in FLOATS or plan.R in INTS or plan.R is torch.bool)(_nan_to_num)


# -- special values: exact comparisons on the library kernels ------------------------------------------------
pointwise("isnan", ["isnan"], [], [], promoted=(0,))(lambda plan, self: (ew.ne, (self, self), {}))
pointwise("isinf", ["isinf"], [], ["isinf.out"], promoted=(0,))(
    lambda plan, self: call(abs_(inputs(1)[0]).eq(_INF), (self,), torch.bool) if plan.R in FLOATS
    else (ew.ne, (self, self), {}))  # integers are never infinite
pointwise("isposinf", ["isposinf"], [], ["isposinf.out"], promoted=(0,))(
    lambda plan, self: (ew.eq, (self, _INF), {}))
pointwise("isneginf", ["isneginf"], [], ["isneginf.out"], promoted=(0,))(
    lambda plan, self: (ew.eq, (self, -_INF), {}))


def _signbit(plan, self):
    if plan.R in FLOATS:  # the sign bit itself (-0.0 and -nan included): the bits as a signed integer
        self = Raw(self.view(torch.int32 if self.element_size() == 4 else torch.int16))
    return ew.lt, (self, 0), {}


pointwise("signbit", ["signbit"], [], ["signbit.out"], promoted=(0,),
          supports=lambda plan, *a: plan.R is not torch.bool)(_signbit)


# -- binary formulas -------------------------------------------------------------------------------------------
def _fminmax(pick):
    def adapter(plan, self, other):
        if plan.R not in FLOATS:
            return (ew.maximum if pick == "max" else ew.minimum), (self, other), {}
        a, b = inputs(2)
        m = maximum(a, b) if pick == "max" else minimum(a, b)
        return call(where(a.isnan(), b, where(b.isnan(), a, m)), (self, other), plan.dtype)
    return adapter


pointwise("fmax", ["fmax"], [], ["fmax.out"])(_fminmax("max"))
pointwise("fmin", ["fmin"], [], ["fmin.out"])(_fminmax("min"))


def _lerp(plan, self, end, weight):
    if not isinstance(weight, torch.Tensor):
        weight = dynamic(plan, "weight", float(weight), torch.float32)  # torch's opmath value: Raw, not rounded
        weight = Raw(weight) if isinstance(weight, torch.Tensor) else weight
    if isinstance(weight, torch.Tensor | Raw):
        s, e, w = inputs(3)
        small = abs_(w).lt(0.5)
        return call(where(small, s + w * (e - s), e - (e - s) * (1.0 - w)), (self, end, weight), plan.dtype)
    s, e = inputs(2)
    w = float(weight)
    res = s + w * (e - s) if abs(w) < 0.5 else e - (e - s) * (1.0 - w)
    return call(res, (self, end), plan.dtype)


pointwise("lerp", ["lerp.Scalar", "lerp.Tensor"], ["lerp_.Scalar", "lerp_.Tensor"],
          ["lerp.Scalar_out", "lerp.Tensor_out"], promoted=(0, 1), supports=_floats)(_lerp)


def _addc(div):
    def adapter(plan, self, tensor1, tensor2, *, value=1):
        value = dynamic(plan, "value", float(value), torch.float32)  # torch's opmath value
        s, t1, t2, v = inputs(4)
        scaled = t1 * (v if isinstance(value, torch.Tensor) else value)
        tensors = (self, tensor1, tensor2) + ((Raw(value),) if isinstance(value, torch.Tensor) else ())
        return call(s + (scaled / t2 if div else scaled * t2), tensors, plan.dtype)
    return adapter


pointwise("addcmul", **_names("addcmul"), promoted=(0, 1, 2), supports=_floats)(_addc(False))
pointwise("addcdiv", **_names("addcdiv"), promoted=(0, 1, 2), supports=_floats)(_addc(True))


# -- backward helpers (grad_output first; out= variants are named grad_input) ------------------------------------
def _backward(op, formula, out="grad_input"):
    def adapter(plan, grad, x, *consts, **kw):
        g, v = inputs(2)
        return call(formula(g, v, *consts, **kw), (grad, x), plan.dtype)
    names = dict(functional_names=[op], inplace_names=[], out_names=[f"{op}.{out}"] if out else [])
    pointwise(op, **names, promoted=(0, 1), supports=_floats)(adapter)


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_GELU_ALPHA = 1.0 / math.sqrt(2.0 * math.pi)  # M_2_SQRTPI * M_SQRT1_2 * 0.5
_GELU_BETA = math.sqrt(2.0 / math.pi)  # M_SQRT2 * M_2_SQRTPI * 0.5
_GELU_KAPPA = 0.044715


def _gelu_backward(g, x, *, approximate="none"):
    if approximate == "tanh":
        x_sq = x * x
        inner = (x + x_sq * x * _GELU_KAPPA) * _GELU_BETA
        t = act("tanh", inner)
        left = x * 0.5
        right_derivative = left * (1.0 - t * t) * ((x_sq * (3.0 * _GELU_KAPPA) + 1.0) * _GELU_BETA)
        return g * ((t + 1.0) * 0.5 + right_derivative)
    cdf = (act("erf", x, _SQRT1_2) + 1.0) * 0.5
    pdf = act("exp", x * x, -0.5) * _GELU_ALPHA
    return g * (cdf + x * pdf)


def _silu_backward(g, x):
    s = act("sigmoid", x)
    return g * s * (x * (1.0 - s) + 1.0)


def _softplus_backward(g, x, beta, threshold):
    z = act("exp", x, float(beta))
    return where((x * float(beta)).gt(float(threshold)), g, g * z / (z + 1.0))


def _mish_backward(g, x):
    sp = act("softplus", x)
    t = act("tanh", sp)
    s = act("sigmoid", x)
    return g * (t + x * s * (1.0 - t * t))


def _elu_backward(g, v, alpha, scale, input_scale, is_result):
    negcoef, poscoef, negiptcoef = float(alpha) * float(scale), float(scale), float(input_scale)
    if is_result:
        neg = g * negiptcoef * (v + negcoef)
    else:
        neg = g * negiptcoef * negcoef * act("exp", v, negiptcoef)
    return where(v.le(0.0), neg, g * poscoef)


_backward("threshold_backward", lambda g, x, threshold: where(x.le(float(threshold)), 0.0, g))
_backward("sigmoid_backward", lambda g, y: g * (1.0 - y) * y)
_backward("tanh_backward", lambda g, y: g * (1.0 - y * y))
_backward("gelu_backward", _gelu_backward)
_backward("silu_backward", _silu_backward)
_backward("softplus_backward", _softplus_backward)
_backward("mish_backward", _mish_backward, out=None)
_backward("hardtanh_backward", lambda g, x, min_val, max_val: where(
    x.le(float(min_val)), 0.0, where(x.ge(float(max_val)), 0.0, g)))
_backward("hardsigmoid_backward", lambda g, x: where(x.gt(-3.0), where(x.lt(3.0), g / 6.0, 0.0), 0.0))
_backward("hardswish_backward", lambda g, x: where(x.le(-3.0), 0.0, where(x.lt(3.0), g * (x / 3.0 + 0.5), g)),
          out="out")
_backward("leaky_relu_backward", lambda g, x, negative_slope, self_is_result: where(
    x.gt(0.0), g, g * float(negative_slope)))


@pointwise("elu_backward", ["elu_backward"], [], ["elu_backward.grad_input"], promoted=(0, 5), supports=_floats)
def _elu_backward_adapter(plan, grad, alpha, scale, input_scale, is_result, self_or_result):
    g, v = inputs(2)
    return call(_elu_backward(g, v, alpha, scale, input_scale, is_result), (grad, self_or_result), plan.dtype)



# -- torch.equal: same shape and every element equal, as one comparison and one reduction on the device ------
@impl("equal")
def equal(self, other):
    same_device(self, other)
    if self.shape != other.shape:
        return False
    if self.numel() == 0:
        return True
    return bool(torch.eq(self, other).all().item())
