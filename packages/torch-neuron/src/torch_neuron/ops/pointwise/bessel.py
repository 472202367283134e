"""The Bessel functions as single formula programs (see pointwise.special): i0/i1, j0/j1, y0/y1, k0/k1, their
exponentially scaled forms, and spherical_bessel_j0.

Near 0 the power series (positive terms for I, with the logarithmic parts for K and Y) or least-squares fits with
J's first zeros factored out; far out the asymptotic forms e^x / sqrt(x) P(1/x) (I, K) and Hankel's
sqrt(2 / (pi x)) (P cos chi -+ Q sin chi) (J, Y) with fitted P, Q. Torch's own roundings are followed where they
decide a value: the phase x - pi/4 is rounded in FP32, I overflows with e^x, Y1 with 1/x, I(+-inf) is NaN.
"""

from __future__ import annotations

import math

from neuron_kernels.library.formula import abs_, act, where

from .special import _EULER_GAMMA, _INF, _NAN, _PIO4, neg, poly, register_unary

# -- Bessel ---------------------------------------------------------------------------------------------------
# |x| <= 8: the power series in y = x^2 / 4 (positive terms, stable); beyond, sqrt(x) e^-x I(x) in t = 1/x
_I0_TAIL = (1.821116023e+00, -3.026361224e-01, 8.461951051e-02, 2.729004484e-02, 2.809345914e-02,
            4.986743614e-02, 3.989422809e-01)
_I1_TAIL = (-9.610850877e+00, 2.145642017e+00, -3.920136834e-01, -4.074142745e-02, -4.143018942e-02,
            -4.674322216e-02, -1.496033992e-01, 3.989422804e-01)
_I0_SERIES = tuple(1.0 / math.factorial(k) ** 2 for k in range(20, -1, -1))
_I1_SERIES = tuple(0.5 / (math.factorial(k) * math.factorial(k + 1)) for k in range(20, -1, -1))


def _bessel_i(x, series, tail, scaled):
    """I0/I1 (odd: sign of x) or e^-|x| I, from the series for |x| <= 8 and the asymptotic fit beyond."""
    a = abs_(x)
    near = poly(a * a * 0.25, series)
    if series is _I1_SERIES:
        near = near * a
    t = 1.0 / a
    far = poly(t, tail) * act("sqrt", t)
    if scaled:
        r = where(a.le(8.0), near * act("exp", a, -1.0), far)
    else:
        # far * e^a overflows with e^a (|x| > 88.72), a little before I itself, and is NaN at +-inf (inf/inf):
        # torch's kernels do the same
        r = where(a.le(8.0), near, where(a.eq(_INF), _NAN, far * act("exp", a)))
    return neg(x, r) if series is _I1_SERIES else r


# K0/K1 for x <= 2: the power series with the logarithmic term (A&S 9.6.13, 9.6.11); beyond, sqrt(x) e^x K(x) in
# t = 1/x (least-squares fits)
_K0_TAIL = (-4.863574106e-02, 1.213760762e-01, -1.429216351e-01, 1.166291557e-01, -8.930017651e-02,
            8.798662648e-02, -1.566612801e-01, 1.253314126e+00)
_K1_TAIL = (6.104453021e-02, -1.527297284e-01, 1.817247618e-01, -1.527056002e-01, 1.256132518e-01,
            -1.467153796e-01, 4.699894297e-01, 1.253314149e+00)


def _harmonic(k: int) -> float:
    return sum(1.0 / j for j in range(1, k + 1))


_K0_SERIES = tuple(_harmonic(k) / math.factorial(k) ** 2 for k in range(11, 0, -1))  # y^11 .. y^1
_K1_SERIES = tuple((_harmonic(k) + _harmonic(k + 1) - 2 * _EULER_GAMMA) / (math.factorial(k) * math.factorial(k + 1))
                   for k in range(11, -1, -1))


def _bessel_k(x, order: int, scaled: bool):
    """K0/K1 (or e^x K) for x > 0; inf at 0, NaN below, torch's conventions."""
    y = x * x * 0.25
    # log(x/2): torch's K0 takes it exactly; its K1 and scaled K0 round x/2 first, which flushes the smallest
    # denormal to 0 (K1 there: 1/x + log(0) * 0 = NaN, as torch)
    logh = act("log", x) - math.log(2.0) if order == 0 and not scaled else act("log", x, 0.5)
    if order == 0:
        near = -(logh + _EULER_GAMMA) * poly(y, _I0_SERIES[-12:]) + y * poly(y, _K0_SERIES)
    else:
        i1 = x * poly(y, _I1_SERIES[-12:])
        near = 1.0 / x + logh * i1 - x * 0.25 * poly(y, _K1_SERIES)
    t = 1.0 / x
    far = poly(t, _K0_TAIL if order == 0 else _K1_TAIL) * act("sqrt", t)  # e^x K(x)
    r = where(x.le(2.0), near * act("exp", x) if scaled else near, far if scaled else far * act("exp", x, -1.0))
    return where(x.lt(0.0), _NAN, where(x.eq(0.0), _INF, where(x.eq(_INF), 0.0, r)))


# J/Y for |x| <= 5: fits in u = (x^2 - 12.5) / 12.5, with J's first two zeros factored out and Y's logarithmic part
# (2/pi) log(x) J(x) (and -2/(pi x) for Y1) added; beyond, Hankel's P, Q in z = 25 / x^2 with the phase x - pi/4
# (x - 3pi/4) rounded in FP32 as torch's kernels do
_J0_ZEROS = (5.78318596294678452118, 30.4712623436620863991)
_J1_ZEROS = (14.6819706421238932572, 49.2184563216946036703)
_J0 = (2.405460033e-08, -4.723018061e-07, 6.855354161e-06, -7.121624631e-05, 4.876825633e-04, -1.921087138e-03,
       3.187355639e-03)
_J1 = (-2.788006574e-08, 4.645151770e-07, -5.515843484e-06, 4.421799094e-05, -2.093266310e-04, 4.323699097e-04)
_Y0 = (1.306029034e-04, -1.816808036e-03, 1.763485270e-02, -1.115080672e-01, 3.885165365e-01, -4.705781170e-01,
       -4.326558326e-01, 4.837249126e-01)
_Y1 = (-1.422424084e-04, 1.684120484e-03, -1.343291844e-02, 6.633928913e-02, -1.631203067e-01, 9.108746680e-02,
       1.397493936e-01)
_P0 = (-2.022029084e-05, 1.712348746e-04, -2.811021594e-03, 9.999999564e-01)
_Q0 = (1.383209396e-06, -6.720653645e-06, 1.994286069e-05, -7.224747330e-05, 5.859047170e-04, -2.499999959e-02)
_P1 = (2.444867294e-05, -2.212411683e-04, 4.685791129e-03, 1.000000050e+00)
_Q1 = (3.732498336e-06, -1.971713390e-05, 8.713501240e-05, -8.201237208e-04, 7.499999647e-02)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


def _hankel(a, order: int, kind: str):
    """|x| > 5: sqrt(2/(pi x)) (P cos chi - (5/x) Q sin chi) for J, (P sin chi + (5/x) Q cos chi) for Y."""
    z = 25.0 / (a * a)
    p, q = poly(z, _P0 if order == 0 else _P1), poly(z, _Q0 if order == 0 else _Q1) * (5.0 / a)
    chi = a - (_PIO4 if order == 0 else 3 * _PIO4)
    c, s = act("cos", chi), act("sin", chi)
    return ((p * c - q * s) if kind == "j" else (p * s + q * c)) * _SQRT_2_PI / act("sqrt", a)


def _j_near(a, order: int):
    y = a * a
    u = y * 0.08 - 1.0
    z1, z2 = _J0_ZEROS if order == 0 else _J1_ZEROS
    r = (y - z1) * (y - z2) * poly(u, _J0 if order == 0 else _J1)
    return r if order == 0 else r * a


def bessel_j(x, order: int):
    a = abs_(x)
    r = where(a.le(5.0), _j_near(a, order), _hankel(a, order, "j"))
    return r if order == 0 else neg(x, r)


def bessel_y(x, order: int):
    """Y0/Y1: NaN below 0 (log of a negative), -inf at +-0."""
    u = x * x * 0.08 - 1.0
    logx = act("log", x)
    if order == 0:
        near = poly(u, _Y0) + logx * _j_near(x, 0) * (2.0 / math.pi)
    else:  # 1/x first, as torch: it overflows to -inf below 2.9e-39 (where -2/(pi x) would not yet)
        near = x * poly(u, _Y1) + (logx * _j_near(x, 1) - 1.0 / x) * (2.0 / math.pi)
    return where(x.eq(0.0), -_INF, where(x.le(5.0), near, _hankel(x, order, "y")))


def spherical_bessel_j0(x):
    z = x * x
    small = poly(z, (1.0 / 362880, -1.0 / 5040, 1.0 / 120, -1.0 / 6, 1.0))  # sin(x)/x near 0
    return where(abs_(x).eq(_INF), 0.0, where(abs_(x).lt(0.5), small, act("sin", x) / x))


for _op, _f in (("i0", lambda x: _bessel_i(x, _I0_SERIES, _I0_TAIL, False)),
                ("special_i0e", lambda x: _bessel_i(x, _I0_SERIES, _I0_TAIL, True)),
                ("special_i1", lambda x: _bessel_i(x, _I1_SERIES, _I1_TAIL, False)),
                ("special_i1e", lambda x: _bessel_i(x, _I1_SERIES, _I1_TAIL, True)),
                ("special_modified_bessel_i0", lambda x: _bessel_i(x, _I0_SERIES, _I0_TAIL, False)),
                ("special_modified_bessel_i1", lambda x: _bessel_i(x, _I1_SERIES, _I1_TAIL, False)),
                ("special_spherical_bessel_j0", spherical_bessel_j0),
                ("special_bessel_j0", lambda x: bessel_j(x, 0)), ("special_bessel_j1", lambda x: bessel_j(x, 1)),
                ("special_bessel_y0", lambda x: bessel_y(x, 0)), ("special_bessel_y1", lambda x: bessel_y(x, 1)),
                ("special_modified_bessel_k0", lambda x: _bessel_k(x, 0, False)),
                ("special_modified_bessel_k1", lambda x: _bessel_k(x, 1, False)),
                ("special_scaled_modified_bessel_k0", lambda x: _bessel_k(x, 0, True)),
                ("special_scaled_modified_bessel_k1", lambda x: _bessel_k(x, 1, True))):
    register_unary(_op, _f, inplace=_op == "i0")
