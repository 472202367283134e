"""Float special functions as single formula programs (pointwise.expr): inverse trigonometric and hyperbolic
functions, atan2, hypot, heaviside, angle (real input), erfc/erfcx/erfinv/ndtri, lgamma, digamma and
polygamma (n <= 8). The Bessel functions are in pointwise.bessel.

ScalarE evaluates exp, log, sqrt, sin, cos, tanh and erf; everything else is range reduction plus a polynomial
evaluated in FP32 (Horner). The inverse trigonometric/hyperbolic kernels use the classic single-precision
minimax polynomials (Cephes' published coefficients); the erfc, erfinv and Bessel tails are least-squares fits
on Chebyshev nodes against float64 references (about 1.5e-7 relative in FP32). Special values (NaN, +-inf,
domain edges, poles) are selected explicitly where the formula would not produce torch's value by itself.
Integer/bool inputs are read as FP32, which is torch's promotion for these ops; float64 stays on the CPU.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library.formula import Expr, abs_, act, fmod, inputs, maximum, minimum, where

from ..core.dtypes import FLOATS
from ..core.registry import impl
from ..core.variants import check_cast
from .base import pointwise
from .expr import call_named

_INF, _NAN = math.inf, math.nan
_PI, _PIO2, _PIO4 = math.pi, math.pi / 2, math.pi / 4
_LN2 = math.log(2.0)
_EULER_GAMMA = 0.5772156649015329


def poly(t: Expr, coeffs) -> Expr:
    """Horner's scheme, highest power first."""
    p = t * float(coeffs[0]) + float(coeffs[1])
    for c in coeffs[2:]:
        p = p * t + float(c)
    return p


def neg(x: Expr, r: Expr) -> Expr:
    """``r`` with the sign of ``x`` (for the odd functions, computed on |x|)."""
    return where(x.lt(0.0), -r, r)


def frac_near(x: Expr) -> Expr:
    """x - nearest integer, in [-0.5, 0.5] (exact: fmod is exact; NaN for +-inf)."""
    r = fmod(x, 1.0)
    return where(r.gt(0.5), r - 1.0, where(r.lt(-0.5), r + 1.0, r))


def cot_pi(x: Expr) -> Expr:
    """cot(pi x) from the exact fraction r of x; for |r| > 1/4 as tan(pi (1/2 - |r|)) (1/2 - |r| is exact), so
    no cosine is taken near its zero at pi/2, where the rounding of pi r would cost relative accuracy."""
    r = frac_near(x)
    a = abs_(r)
    big = a.gt(0.25)
    u = where(big, 0.5 - a, a) * _PI
    s, c = act("sin", u), act("cos", u)
    return neg(r, where(big, s / c, c / s))


def is_int(x: Expr) -> Expr:
    return fmod(x, 1.0).eq(0.0)


# -- inverse trigonometric -----------------------------------------------------------------------------------
_ATAN = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)  # |t| <= tan(pi/8)
_ASIN = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)  # |x| <= 0.5
_TAN_PI_8, _TAN_3PI_8 = math.tan(math.pi / 8), math.tan(3 * math.pi / 8)


def _atan_small(t):
    z = t * t
    return t + t * z * poly(z, _ATAN)


def atan(x):
    a = abs_(x)
    big, mid = a.gt(_TAN_3PI_8), a.gt(_TAN_PI_8)
    t = where(big, -1.0 / a, where(mid, (a - 1.0) / (a + 1.0), a))
    return neg(x, where(big, _PIO2, where(mid, _PIO4, 0.0)) + _atan_small(t))


def _negative(v):
    """v < 0 or v is -0.0 (1 / -0.0 = -inf): atan2 tells the zeros apart."""
    return maximum(v.lt(0.0), (1.0 / v).lt(0.0))


def atan2(y, x):
    ax, ay = abs_(x), abs_(y)
    mx, mn = maximum(ax, ay), minimum(ax, ay)  # NaN propagates through both
    q = where(mn.eq(_INF), 1.0, where(mx.eq(0.0), 0.0, mn / mx))  # in [0, 1]
    mid = q.gt(_TAN_PI_8)
    r = where(mid, _PIO4, 0.0) + _atan_small(where(mid, (q - 1.0) / (q + 1.0), q))
    r = where(ay.gt(ax), _PIO2 - r, r)
    r = where(_negative(x), _PI - r, r)
    return where(_negative(y), -r, r)


def _asin_parts(x):
    """|x| > 0.5 and asin(u), u = sqrt((1 - |x|) / 2) there, else |x| (asin(|x|) = pi/2 - 2 asin(u))."""
    a = abs_(x)
    hi = a.gt(0.5)
    u = where(hi, act("sqrt", 1.0 - a, 0.5), a)  # sqrt of a negative: NaN beyond |x| = 1
    z = u * u
    return hi, u + u * z * poly(z, _ASIN)


def asin(x):
    hi, p = _asin_parts(x)
    return neg(x, where(hi, _PIO2 - (p + p), p))


def acos(x):
    hi, p = _asin_parts(x)
    return where(hi, where(x.lt(0.0), _PI - (p + p), p + p), _PIO2 - neg(x, p))


# -- hyperbolic ----------------------------------------------------------------------------------------------
_SINH = (2.03721912945e-4, 8.33028376239e-3, 1.66667160211e-1)  # |x| <= 1
_ASINH = (2.0122003309e-2, -4.2699340972e-2, 7.4847586088e-2, -1.6666288134e-1)  # |x| < 0.5
_ACOSH = (1.7596881071e-3, -7.5272886713e-3, 2.6454905019e-2, -1.1784741703e-1, 1.4142135263e0)  # x - 1 < 0.5
_ATANH = (1.81740078349e-1, 8.24370301058e-2, 1.46691431730e-1, 1.99782164500e-1, 3.33337300303e-1)  # |x| < 0.5


def _exp_half_sq(a):
    """exp(a) / 2 for large a without overflowing before the result does: (exp(a/2) / 2) * exp(a/2)."""
    h = act("exp", a, 0.5)
    return (h * 0.5) * h


def sinh(x):
    a = abs_(x)
    z = a * a
    e = act("exp", a)
    mid = e * 0.5 - 0.5 / e
    r = where(a.le(1.0), a + a * z * poly(z, _SINH), where(a.gt(10.0), _exp_half_sq(a), mid))
    return neg(x, r)


def cosh(x):
    a = abs_(x)
    e = act("exp", a)
    return where(a.gt(10.0), _exp_half_sq(a), e * 0.5 + 0.5 / e)


def asinh(x):
    a = abs_(x)
    z = a * a
    small = a + a * z * poly(z, _ASINH)
    big = act("log", a) + _LN2  # a*a would overflow; the 1/(4a^2) term is below FP32 resolution
    mid = act("log", a + act("sqrt", z + 1.0))
    return neg(x, where(a.lt(0.5), small, where(a.gt(1e4), big, mid)))


def acosh(x):
    z = x - 1.0
    near = poly(z, _ACOSH) * act("sqrt", z)  # sqrt of a negative: NaN below 1
    mid = act("log", x + act("sqrt", z * (x + 1.0)))
    return where(z.lt(0.5), near, where(x.gt(1e4), act("log", x) + _LN2, mid))


def atanh(x):
    a = abs_(x)
    z = a * a
    small = a + a * z * poly(z, _ATANH)
    big = act("log", (1.0 + a) / (1.0 - a)) * 0.5  # inf at 1, NaN beyond
    return neg(x, where(a.lt(0.5), small, big))


def hypot(x, y):
    ax, ay = abs_(x), abs_(y)
    mx, mn = maximum(ax, ay), minimum(ax, ay)
    r = mn / mx
    h = mx * act("sqrt", r * r + 1.0)
    inf = maximum(ax.eq(_INF), ay.eq(_INF))  # hypot(inf, nan) is inf
    return where(inf, _INF, where(mx.eq(0.0), 0.0, h))


# -- error function family -------------------------------------------------------------------------------------
# erfcx(x) = exp(x^2) erfc(x): on [0.5, 2.5] a polynomial in x - 1.5; beyond, x * erfcx(x) in z = 1/x^2
_ERFCX_MID = (2.774700317e-05, -9.466513339e-05, 2.206089418e-04, -6.393129210e-04, 1.885620038e-03,
              -5.155815927e-03, 1.337803497e-02, -3.292918482e-02, 7.615091725e-02, -1.636230002e-01,
              3.215854193e-01)
_ERFCX_TAIL = (8.786195394e+00, -7.060211251e+00, 2.946082595e+00, -1.022577852e+00, 4.223009598e-01,
               -2.820869643e-01, 5.641895714e-01)


def _erfcx_pos(x):
    """erfcx for x >= 0.5 (other lanes: finite garbage or NaN, selected away)."""
    t = 1.0 / x
    return where(x.lt(2.5), poly(x - 1.5, _ERFCX_MID), poly(t * t, _ERFCX_TAIL) * t)


def _exp_sq(x, sign):
    """exp(sign * x^2) with x^2 split exactly: x = h + l with h of 12 bits, x^2 = h^2 + l (x + h)."""
    s = x * 4097.0
    h = s - (s - x)
    return act("exp", h * h, sign) * act("exp", (x - h) * (x + h), sign)


def erfc(x):
    tail = _exp_sq(x, -1.0) * _erfcx_pos(x)
    return where(x.lt(0.5), 1.0 - act("erf", x), where(x.gt(10.1), 0.0, tail))  # erfc(10.1) < 2**-149


def erfcx(x):
    near = _exp_sq(x, 1.0) * (1.0 - act("erf", x))
    return where(x.lt(0.5), where(x.lt(-9.5), _INF, near), _erfcx_pos(x))  # 2 exp(x^2) overflows


# erfinv(x) = x * p(w), w = -log((1 - x)(1 + x)): p a polynomial in w - 2.5 (w < 5), else in s = sqrt(w)
_ERFINV_C = (-8.941414114e-09, 2.326480004e-08, 4.682669739e-07, -3.463093069e-06, -4.973069671e-06,
             2.183458868e-04, -1.252725227e-03, -4.177388474e-03, 2.466402785e-01, 1.501409360e+00)
_ERFINV_T1 = (-1.996558993e-04, 1.007447938e-04, 1.348571297e-03, -3.673246834e-03, 5.739847908e-03,
              -7.622500363e-03, 9.438821953e-03, 1.001674099e+00, 2.832976920e+00)  # s - 3, s in [sqrt 5, 4]
_ERFINV_T2 = (-8.094508477e-08, 5.588272047e-07, -1.478118748e-06, 4.330302693e-06, 6.001332466e-06,
              -5.089064136e-04, 1.008595905e+00, 6.869018391e+00)  # s - 7, s in [4, 10.5]


def _erfinv_p(w):
    s = act("sqrt", w)
    tail = where(s.lt(4.0), poly(s - 3.0, _ERFINV_T1), poly(s - 7.0, _ERFINV_T2))
    return where(w.lt(5.0), poly(w - 2.5, _ERFINV_C), tail)


def erfinv(x):
    w = -act("log", (1.0 - x) * (1.0 + x))  # NaN beyond |x| = 1
    return where(abs_(x).eq(1.0), x * _INF, x * _erfinv_p(w))


def ndtri(p):
    """sqrt(2) erfinv(2p - 1), with w = -log(4 p (1 - p)) taken from p directly (2p - 1 rounds to -1 for tiny
    p, where the tail needs p's own precision)."""
    y = p * 2.0 - 1.0
    w = -act("log", (p * 4.0) * (1.0 - p))
    r = y * _erfinv_p(w) * math.sqrt(2.0)
    return where(p.eq(0.0), -_INF, where(p.eq(1.0), _INF, r))


# -- gamma family -----------------------------------------------------------------------------------------------
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SHIFT = 8.0  # the asymptotic series are used from 8 on; smaller arguments are shifted up by recurrence


def _shifted(x):
    """(w, small): w = x + 8 where x < 8, else x."""
    small = x.lt(_SHIFT)
    return where(small, x + _SHIFT, x), small


def _lgamma_pos(x):
    """lgamma for x > 0: Stirling's series at w >= 8, minus log(x (x+1) ... (x+7)) for x < 8."""
    w, small = _shifted(x)
    iw = 1.0 / w
    iw2 = iw * iw
    series = iw * (1.0 / 12 - iw2 * (1.0 / 360 - iw2 * (1.0 / 1260)))
    stirling = (w - 0.5) * (act("log", w) - 1.0) + (_HALF_LOG_2PI - 0.5) + series  # no early overflow
    prod = x
    for k in range(1, int(_SHIFT)):
        prod = prod * (x + float(k))
    return stirling - where(small, act("log", prod), 0.0)


def lgamma(x):
    """Reflection below 0: lgamma(x) = log(pi) - log|sin(pi x)| - lgamma(1 - x); inf at the poles (and +-0)."""
    refl = x.lt(0.0)
    pos = _lgamma_pos(where(refl, 1.0 - x, x))
    s = abs_(act("sin", frac_near(x), _PI))  # sin(pi x) up to sign, from the exact fraction (0 at the poles)
    r = where(refl, (math.log(_PI) - pos) - act("log", s), pos)  # log(s), not log(pi / s): s may be denormal
    r = where(refl, where(s.eq(0.0), _INF, where(x.eq(-_INF), _INF, r)), r)
    # near 0: -log|x| - euler_gamma x (pi x would lose digits for denormal x)
    r = where(abs_(x).lt(1e-8), -act("log", abs_(x)) - x * _EULER_GAMMA, r)
    return where(x.ge(_LGAMMA_INF), _INF, r)


_LGAMMA_INF = 4.0371103180829464e36  # from here on torch's (libm's) lgammaf is inf, slightly before FLT_MAX


def _digamma_pos(x):
    """digamma for x > 0 (x = +-0 give -+inf through 1/x, as torch)."""
    w, small = _shifted(x)
    iw = 1.0 / w
    z = iw * iw
    series = z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132)))))
    asym = act("log", w) - iw * 0.5 - series
    acc = 1.0 / x
    for k in range(1, int(_SHIFT)):
        acc = acc + 1.0 / (x + float(k))
    return asym - where(small, acc, 0.0)


def digamma(x):
    """Reflection below 0: digamma(x) = digamma(1 - x) - pi / tan(pi x); NaN at the negative integers. Near 0
    pi / tan(pi x) is 1 / x: torch evaluates it in double, while pi x in FP32 loses digits for denormal x (at
    x = -2**-128 the result stayed just below FLT_MAX where torch's overflows to inf)."""
    refl = x.lt(0.0)
    pos = _digamma_pos(where(refl, 1.0 - x, x))
    pi_cot = where(abs_(x).lt(1e-8), 1.0 / x, cot_pi(x) * _PI)
    return where(refl, where(is_int(x), _NAN, pos - pi_cot), pos)


def _trigamma_pos(x):
    w, small = _shifted(x)
    iw = 1.0 / w
    z = iw * iw
    series = iw * (1.0 + iw * 0.5 + z * (1.0 / 6 - z * (1.0 / 30 - z * (1.0 / 42 - z * (1.0 / 30)))))
    acc = 1.0 / (x * x)
    for k in range(1, int(_SHIFT)):
        acc = acc + 1.0 / ((x + float(k)) * (x + float(k)))
    return series + where(small, acc, 0.0)


def trigamma(x):
    """Below 0.5 torch reflects with sin(pi * x) of the rounded product (not range reduced): same here."""
    refl = x.lt(0.5)
    pos = _trigamma_pos(where(refl, 1.0 - x, x))
    s = act("sin", x, _PI)
    return where(refl, (_PI * _PI) / (s * s) - pos, pos)


def _cot_derivative(n: int) -> tuple:
    """Coefficients (highest power first) of P_n with d^n/dx^n cot(pi x) = pi^n P_n(cot(pi x)):
    P_0 = c, P_(k+1) = -(1 + c^2) P_k'(c)."""
    p = [0.0, 1.0]  # lowest power first while building
    for _ in range(n):
        d = [k * p[k] for k in range(1, len(p))] or [0.0]
        q = [0.0] * (len(d) + 2)
        for k, v in enumerate(d):
            q[k] -= v
            q[k + 2] -= v
        p = q
    return tuple(reversed(p))


def _zeta_pos(x, s: int):
    """Hurwitz zeta(s, x) for x >= 0 and integer s >= 2: the first 8 terms where x < 8, then Euler-Maclaurin
    at w >= 8 (Bernoulli terms to B10)."""
    w, small = _shifted(x)
    iw = 1.0 / w
    lead = iw
    for _ in range(s - 2):
        lead = lead * iw  # w^(1 - s)
    coef, rising = [], float(s)
    for j, b in enumerate((1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66), start=1):
        coef.append(b / math.factorial(2 * j) * rising)
        rising *= (s + 2 * j - 1) * (s + 2 * j)
    z = iw * iw
    tail = lead * (1.0 / (s - 1) + iw * (0.5 + iw * poly(z, coef[::-1])))
    acc = None
    for k in range(int(_SHIFT)):
        inv = 1.0 / (x + float(k)) if k else 1.0 / x
        term = inv
        for _ in range(s - 1):
            term = term * inv
        acc = term if acc is None else acc + term
    return tail + where(small, acc, 0.0)


def polygamma_n(x, n: int):
    """polygamma(n >= 2, x) = (-1)^(n+1) n! zeta(n+1, x); below 0 by the reflection
    psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) P_n(cot(pi x)); +-inf (torch's sign) at the non-positive integers
    and NaN at +inf (torch's zeta gives 0 * inf there)."""
    sign = math.factorial(n) * (1.0 if n % 2 else -1.0)
    refl = x.lt(0.0)
    pos = _zeta_pos(where(refl, 1.0 - x, x), n + 1) * sign
    neg_side = pos * (-1.0 if n % 2 else 1.0) - poly(cot_pi(x), _cot_derivative(n)) * _PI ** (n + 1)
    pole = maximum(minimum(is_int(x), x.le(0.0)), x.eq(-_INF))  # -0.0 included
    return where(pole, sign * _INF, where(x.eq(_INF), _NAN, where(refl, neg_side, pos)))  # torch: NaN at inf


# -- registration ---------------------------------------------------------------------------------------------
def _float_result(plan, *args, **kwargs) -> bool:
    return plan.dtype in FLOATS


def _float32_result(plan, *args, **kwargs) -> bool:
    """Ops torch's CPU has no bfloat16/float16 kernel for: those calls go to the CPU for torch's error."""
    return plan.dtype is torch.float32


def register_unary(op, formula, inplace=True):
    def adapter(plan, self):
        return call_named(f"special.{op}", lambda: formula(inputs(1)[0]), (self,), plan.dtype)
    names = dict(functional_names=[op], inplace_names=[f"{op}_"] if inplace else [], out_names=[f"{op}.out"])
    supports = _float_result if inplace or op in _REDUCED_OK else _float32_result
    pointwise(op, **names, promoted=(0,), supports=supports)(adapter)


_REDUCED_OK = frozenset({"special_i0e", "special_i1", "special_i1e", "angle"})  # others: float32 only on CPU


def _binary(op, formula):
    def adapter(plan, self, other):
        return call_named(f"special.{op}", lambda: formula(*inputs(2)), (self, other), plan.dtype)
    pointwise(op, [op], [f"{op}_"], [f"{op}.out"], promoted=(0, 1), supports=_float_result)(adapter)


for _op, _f in (("asin", asin), ("acos", acos), ("atan", atan), ("sinh", sinh), ("cosh", cosh),
                ("asinh", asinh), ("acosh", acosh), ("atanh", atanh), ("erfc", erfc), ("erfinv", erfinv),
                ("lgamma", lgamma), ("digamma", digamma)):
    register_unary(_op, _f)
for _op, _f in (("special_erfcx", erfcx), ("special_ndtri", ndtri),
                ("angle", lambda x: where(x.isnan(), x, where(x.lt(0.0), _PI, 0.0)))):  # real input (complex: CPU)
    register_unary(_op, _f, inplace=False)
_binary("atan2", atan2)


def _same_float_dtype(plan, self, values) -> bool:
    """heaviside: torch requires equal dtypes (its meta function does not say so: the CPU raises the error)."""
    return plan.dtype in FLOATS and getattr(values, "dtype", None) is self.dtype


@pointwise("heaviside", ["heaviside"], ["heaviside_"], ["heaviside.out"], supports=_same_float_dtype)
def _heaviside(plan, self, values):
    x, v = inputs(2)
    return call_named("special.heaviside", lambda: where(x.eq(0.0), v, x.gt(0.0)), (self, values), plan.dtype)
_binary("hypot", hypot)


_MAX_POLYGAMMA = 8  # n! and the Bernoulli terms stay within FP32 accuracy


@pointwise("polygamma", ["polygamma"], [], ["polygamma.out"], promoted=(1,), supports=_float_result)
def _polygamma(plan, n, self):
    if not 0 <= n <= _MAX_POLYGAMMA:
        return None  # n > 8 (rare): CPU
    (x,) = inputs(1)
    build = (lambda: digamma(x)) if n == 0 else (lambda: trigamma(x)) if n == 1 else (lambda: polygamma_n(x, n))
    return call_named(f"special.polygamma{n}", build, (self,), plan.dtype)


@impl("polygamma_")
def _polygamma_inplace(self, n):
    """``polygamma_(self, n)`` takes its arguments in the other order than ``polygamma(n, self)``, so the pointwise
    machinery cannot derive it: it is the out= form into ``self`` (same cast check and error as torch)."""
    floating = self.dtype.is_floating_point or self.dtype.is_complex
    check_cast(self.dtype if floating else torch.get_default_dtype(), self)  # torch's in-place message
    return torch.polygamma(n, self, out=self)
