"""The orthogonal polynomials of torch.special (Chebyshev T/U/V/W and their shifted forms, Hermite H/He, Laguerre L,
Legendre P) of a tensor or scalar ``x`` and degree ``n``, as one program per call.

torch's CPU kernels (ATen's Math.h ``*_polynomial_*_forward``, float32 only) truncate ``n`` to int64 (NaN, inf and
out-of-range values become negative: result 0), select special values (``n < 0``, ``|x| == 1`` or ``x == 0``, ...),
use a closed form for the Chebyshev kinds at larger ``n`` inside the interval (``cos(n acos x)``, ...) and else run a
three-term recurrence up to ``n``. The same branches are taken here, per element, in the same order.

A library formula has no loops, so the recurrence is unrolled: the host reads the largest degree any element
runs the recurrence for (one small formula, a max and a device-to-host read; free for a Python ``n``), rounds the step
count up to a power of two (a few traces per kind) and the kernel runs that many steps, each masked to the elements
whose degree reaches it. Above ``_MAX_STEPS`` steps the call takes the CPU path (loudly): the program would grow
without bound (Hermite never needs it: torch gives NaN above degree 128).

The CPU compiles each step's ``a * q - c`` into one fused multiply-add; cancellation near the roots makes the two
roundings of a plain multiply and subtract differ visibly (up to 1e-3 relative at degree 8), so every step is an FMA
emulated exactly in FP32 (Dekker's product and a TwoSum): the recurrences reproduce the CPU's results bit for bit
(except below about 1e-34, where the emulation's 2**-12 scaling underflows: there to a few ulp).

Where torch differs from itself the device does not follow: for x = NaN and n >= 2 its U/V/W, shifted, Laguerre and
Legendre kernels return an uninitialized variable (the recurrence never runs), here NaN. The closed forms go through
acos (pointwise.special: within an ulp of glibc's acosf, not always equal), so at degree n they agree with the CPU to
about n ulp of the angle (the CPU's own error against the exact polynomial is of that size too).
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library.formula import (
    Expr,
    Recurrence,
    abs_,
    act,
    fmod,
    inputs,
    polynomial,
    where,
)

from .base import launch, pointwise, prep
from .expr import call_named
from .special import _float32_result, acos

_MAX_STEPS = 128  # unrolled recurrence steps at most (power of two); more: CPU
_HERMITE_LIMIT = 128.0  # torch's float Hermite: NaN above this degree
_INT64_RANGE = 2.0 ** 63
_SPLIT = 4097.0  # Veltkamp's splitter for FP32: 2**12 + 1
_DOWN, _UP = 2.0 ** -12, 2.0 ** 12  # the FMA's scaling: v * 4097 stays finite


# -- exact FP32 fused multiply-add ----------------------------------------------------------------------------------
def _split(v: Expr) -> tuple[Expr, Expr]:
    t = v * _SPLIT
    hi = t - (t - v)
    return hi, v - hi


def fma(a: Expr, b: Expr, c: Expr, a_split=None) -> Expr:
    """a * b + c rounded once: a * b = ph + pl exactly (Dekker), ph + c = s + e exactly (TwoSum), then s + (e + pl).
    b and c are scaled by 2**-12 first (exact) so that neither b's split nor a product just past the float range
    overflows while c would bring the sum back (Hermite's terms cancel near overflow); where a part still overflows
    (NaN), the product is out of range and the plain ph + c is the FMA's value too."""
    b, c = b * _DOWN, c * _DOWN
    ah, al = a_split or _split(a)
    bh, bl = _split(b)
    ph = a * b
    pl = (((ah * bh - ph) + ah * bl) + al * bh) + al * bl
    s = ph + c
    bv = s - ph
    e = (ph - (s - bv)) + (c - bv)
    exact = s + (e + pl)
    return where(exact.isnan(), s, exact) * _UP


# -- the degree -----------------------------------------------------------------------------------------------------
def truncated(n: Expr) -> Expr:
    """torch's static_cast<int64_t>(n) as a float: toward zero; NaN, inf and |n| >= 2**63 give -1 (negative: 0)."""
    return where(abs_(n).lt(_INT64_RANGE), n - fmod(n, 1.0), -1.0)


def _odd(v: Expr, nt: Expr) -> Expr:
    """v for even n, -v for odd n (fmod is exact; every float >= 2**24 is even, as its int64 is)."""
    return where(fmod(nt, 2.0).eq(0.0), v, -v)


# -- the kinds ------------------------------------------------------------------------------------------------------
class Kind:
    """One polynomial: ``branches(x, nt)`` the ordered (condition, value) pairs before the recurrence (the first
    true one wins), ``init(x)`` its value at n = 1, ``coef(x)`` the constant multiplier of the Chebyshev steps
    (else None) and ``step(x, p, q, j, a)`` step j (1-based) giving degree j + 1 from q (degree j) and p, with
    ``a`` = (coef, its split) computed once per element (None without ``coef``)."""

    def __init__(self, branches, init, step, coef=None):
        self.branches, self.init, self.step, self.coef = branches, init, step, coef


def _cheb_step(x, p, q, j, a):
    """(coef * q - p): a is (coef, its split), precomputed once per element."""
    return fma(a[0], q, -p, a[1:])


def _two(x):
    return x + x


def _closed_t(x, nt):
    return act("cos", nt * acos(x))


def _closed_u(x, nt):
    a = acos(x)
    s, m = act("sin", a), nt + 1.0
    return where(s.ne(0.0), act("sin", m * a) / s, m * act("cos", m * a) / x)


def _closed_v(x, nt):
    a = acos(x)
    h = a / 2.0
    return where(act("sin", h).ne(1.0), act("cos", (nt + 0.5) * a) / act("cos", h), _odd(nt + nt + 1.0, nt))


def _closed_w(x, nt, at_one):
    a = acos(x)
    h = a / 2.0
    return where(act("cos", h).ne(1.0), act("sin", (nt + 0.5) * a) / act("sin", h), at_one)


def _both(a: Expr, b: Expr) -> Expr:
    """Logical and of two 0/1 masks."""
    return a._bin("min", b)


def _chebyshev(kind: str):
    """T, U, V, W on x; special values at |x| == 1, the closed form for n > 6 (T) / n > 8 inside (-1, 1)."""
    def branches(x, nt):
        pos, big, inside = x.gt(0.0), nt.gt(6.0 if kind == "t" else 8.0), abs_(x).lt(1.0)
        twice = nt + nt + 1.0
        at_one = {"t": where(pos, 1.0, _odd(1.0, nt)), "u": where(pos, nt + 1.0, _odd(nt + 1.0, nt)),
                  "v": where(pos, 1.0, _odd(twice, nt)), "w": where(pos, twice, _odd(1.0, nt))}[kind]
        closed = {"t": lambda: _closed_t(x, nt), "u": lambda: _closed_u(x, nt), "v": lambda: _closed_v(x, nt),
                  "w": lambda: _closed_w(x, nt, where(pos, twice, _odd(1.0, nt)))}[kind]()
        return [(abs_(x).eq(1.0), at_one), (_both(big, inside), closed)]
    init = {"t": lambda x: x, "u": _two, "v": lambda x: x + x - 1.0, "w": lambda x: x + x + 1.0}[kind]
    return Kind(branches, init, _cheb_step, coef=_two)


def _shifted(kind: str):
    """The shifted forms in y = 2x - 1: special values at x == 1 and x == 0, the closed form in y for n > 6
    (W: n > 4) inside (-1, 1), the recurrence with 2y."""
    def branches(x, nt):
        y = x + x - 1.0
        twice = nt + nt + 1.0
        at_one = {"t": 1.0, "u": nt + 1.0, "v": 1.0, "w": twice}[kind]
        at_zero = _odd({"t": 1.0, "u": nt + 1.0, "v": twice, "w": 1.0}[kind], nt)
        closed = {"t": lambda: _closed_t(y, nt), "u": lambda: _closed_u(y, nt),
                  "v": lambda: _closed_v(y, nt), "w": lambda: _closed_w(y, nt, _odd(1.0, nt))}[kind]()
        big = nt.gt(4.0 if kind == "w" else 6.0)
        return [(x.eq(1.0), at_one), (x.eq(0.0), at_zero), (_both(big, abs_(y).lt(1.0)), closed)]

    def init(x):
        y = x + x - 1.0
        return {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]

    def coef(x):
        y = x + x - 1.0
        return y + y
    return Kind(branches, init, _cheb_step, coef=coef)


def _hermite_branches(x, nt):
    return [(nt.gt(_HERMITE_LIMIT), math.nan)]


_KINDS = {
    **{f"special_chebyshev_polynomial_{k}": _chebyshev(k) for k in "tuvw"},
    **{f"special_shifted_chebyshev_polynomial_{k}": _shifted(k) for k in "tuvw"},
    "special_hermite_polynomial_h": Kind(_hermite_branches, _two,
                                         lambda x, p, q, j, a: fma(a[0], q, -(p * float(2 * j)), a[1:]), coef=_two),
    "special_hermite_polynomial_he": Kind(_hermite_branches, lambda x: x,
                                          lambda x, p, q, j, a: fma(a[0], q, -(p * float(j)), a[1:]), coef=lambda x: x),
    "special_laguerre_polynomial_l": Kind(
        lambda x, nt: [(x.eq(0.0), 1.0)], lambda x: 1.0 - x,
        lambda x, p, q, j, a: fma(float(2 * j) + (1.0 - x), q, -(p * float(j))) / float(j + 1)),
    "special_legendre_polynomial_p": Kind(
        lambda x, nt: [(abs_(x).eq(1.0), where(x.gt(0.0), 1.0, _odd(1.0, nt)))], lambda x: x,
        lambda x, p, q, j, a: fma(x * float(2 * j + 1), q, -(p * float(j))) / float(j + 1)),
}


def _all_branches(kind: Kind, x, nt):
    """Every non-recurrence case in torch's order: n < 0, the kind's special values and closed forms, NaN x (the
    recurrence gives NaN from its first step), n == 0."""
    return [(nt.lt(0.0), 0.0), *kind.branches(x, nt), (_both(x.isnan(), nt.ge(2.0)), math.nan),
            (nt.eq(0.0), 1.0)]


def _fold(cases, default):
    r = default
    for cond, value in reversed(cases):
        r = where(cond, value, r)
    return r


def degrees(kind: Kind) -> Expr:
    """Per element the degree its recurrence runs to (0 where a branch decides), for the host's step count."""
    x, n = inputs(2)
    nt = truncated(n)
    return _fold([(c, 0.0) for c, _ in _all_branches(kind, x, nt)], nt)


# -- the recurrence the library's polynomial kernel runs --------------------------------------------------------------
_X, _NT, _P, _Q, _A, _AH, _AL = inputs(7)  # the step formulas' inputs (x, degree, p, q, coefficient and its split)


def _step_exprs(kind: Kind, j: int) -> tuple[Expr, Expr]:
    """The new p and q of step j: q and the recurrence value where the degree reaches j + 1, else p and q."""
    r = kind.step(_X, _P, _Q, j, (_A, _AH, _AL) if kind.coef else None)
    on = _NT.ge(float(j + 1))
    return where(on, _Q, _P), where(on, r, _Q)


def _recurrence(kind: Kind) -> Recurrence:
    """Kind as the library's recurrence: the degree, q at degree 1 and the coefficient (with its split) once per
    element, then the masked steps and the branches over the result."""
    x0, n0 = inputs(2)
    coef = kind.coef(x0) if kind.coef else None
    pre = [truncated(n0), kind.init(x0)] + ([coef, *_split(coef)] if coef is not None else [])
    return Recurrence(pre, lambda j: _step_exprs(kind, j), _fold(_all_branches(kind, _X, _NT), _Q))


# -- registration ---------------------------------------------------------------------------------------------------
def _operand(v, plan):
    """A Python scalar as a 0-d float32 tensor (the formulas need tensors; torch computes in float32 too)."""
    if isinstance(v, torch.Tensor):
        return prep(v, plan)
    return prep(torch.tensor(float(v), dtype=torch.float32), plan)


def _host_degree(v) -> float:
    """A Python n as torch reads it: rounded to float32, then truncated (out of the int64 range: -1)."""
    f = float(torch.tensor(float(v), dtype=torch.float32))
    return math.trunc(f) if abs(f) < _INT64_RANGE else -1.0


def _steps(op: str, plan, n, xs, ns) -> int | None:
    """Recurrence steps this call needs, rounded up to a power of two; None above _MAX_STEPS."""
    top = _host_degree(n) if not isinstance(n, torch.Tensor) else None
    if top is None or top - 1 > _MAX_STEPS:
        call = call_named(f"polynomial.degrees.{op}", lambda: degrees(_KINDS[op]), (xs, ns), torch.float32)
        top = float(torch.amax(launch(op, *call, plan=plan)[0]))
    need = int(top) - 1
    if need <= 0:
        return 0
    if need > _MAX_STEPS:
        return None  # a long recurrence (|x| > 1 at a high degree): the CPU's loop
    return 1 << (need - 1).bit_length()


def _register(op: str):
    def adapter(plan, x, n):
        xs, ns = _operand(x, plan), _operand(n, plan)
        steps = _steps(op, plan, n, xs, ns)
        if steps is None:
            return None
        return polynomial, (xs, ns), {"key": op, "steps": steps, "out_dtype": plan.dtype}

    names = [op, f"{op}.x_scalar", f"{op}.n_scalar"]
    outs = [f"{op}.out", f"{op}.x_scalar_out", f"{op}.n_scalar_out"]
    # float32 results only: torch's CPU has no bfloat16/float16 kernel (those calls go to it for its error) and
    # float64 is never computed in float32
    pointwise(op, names, [], outs, promoted=(0, 1), supports=_float32_result)(adapter)
