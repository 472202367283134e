"""erf / erfc in float64 for the simulator's ScalarE, and the fused gelu / erf activation loop.

The functions are piecewise Chebyshev interpolants of ``math.erf`` / ``math.erfc`` (relative error ~1e-13), built
at import (~2 ms):

- ``|x| < 1``: ``erf(x) = x * q0(x^2)`` (relative accuracy down to subnormals);
- ``1 <= t < 2``: ``erfc(t) = exp(-t^2) * h1(t)``;
- ``t >= 2``: ``erfc(t) = exp(-t^2) * q2(1 / t^2) / t``.

Each series is evaluated with Clenshaw's recurrence in numpy's ``chebval`` operation order. The Numba loops run a
block of elements at a time with the coefficient loop outside, so the recurrences of neighbouring elements
proceed in parallel (SIMD) instead of one long dependency chain per element; every element still sees exactly
the same floating-point operations, so results do not depend on the blocking.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.polynomial import chebyshev as _cheb

F64 = np.dtype(np.float64)
# elements per block: each series costs a few ns per coefficient and block (loop set-up, remainders: ~0.25 us a
# block in all), so blocks are large; their work arrays (~128 bytes per element) still fit in L2
_BLOCK = 2048
_NEG_INV_SQRT2 = -(1.0 / math.sqrt(2.0))  # gelu's erfc argument is x * this (one float64 multiply)

__all__ = ["erf", "erfc", "gelu_erf_inplace"]


def _erfcx_reference(t: float) -> float:
    """exp(t^2) * erfc(t) for t >= 1: from math.erfc, or its asymptotic series where that underflows."""
    if t < 20.0:
        return math.erfc(t) * math.exp(t * t)
    u, total, term = 1.0 / (2.0 * t * t), 0.0, 1.0
    for n in range(12):  # next term < 1e-15 relative at t = 20
        total += term
        term *= -(2 * n + 1) * u
    return total / (t * math.sqrt(math.pi))


def _build():
    verf = np.vectorize(math.erf, otypes=[np.float64])
    verfcx = np.vectorize(_erfcx_reference, otypes=[np.float64])
    q0 = _cheb.Chebyshev.interpolate(lambda z: verf(np.sqrt(z)) / np.sqrt(z), 14, domain=[0.0, 1.0])
    h1 = _cheb.Chebyshev.interpolate(verfcx, 20, domain=[1.0, 2.0])
    # q2 is smooth on (0, 1/4] with q2(0) = 1/sqrt(pi)
    q2 = _cheb.Chebyshev.interpolate(lambda z: verfcx(1.0 / np.sqrt(z)) / np.sqrt(z), 24, domain=[0.0, 0.25])
    coefs = tuple(np.ascontiguousarray(s.coef, F64) for s in (q0, h1, q2))
    # series(x) = chebval(offset + scale * x): (offset, scale) of each series, in order
    maps = np.array([v for s in (q0, h1, q2) for v in s.mapparms()], F64)
    return coefs, maps


(_Q0, _H1, _Q2), _MAPS = _build()


# Module-level so Numba's on-disk cache finds them in the next process (a function defined inside another gets
# a new cache entry per process and compiles again).
@numba.njit(cache=True, nogil=True)
def _chebval_many(c, off, scl, z, n, out, x2, b0, b1):
    """out[j] = chebval(c, off + scl * z[j]) for j < n (z is overwritten); c has at least 2 coefficients. Each
    element goes through chebval's recurrence (b0, b1 <- c[k] - b1, b0 + b1 * 2u) one coefficient at a time."""
    m = c.size
    for j in range(n):
        u = off + scl * z[j]
        z[j] = u
        x2[j] = 2 * u
        b0[j] = c[m - 2]
        b1[j] = c[m - 1]
    i = 3
    while i + 3 <= m:  # four recurrence steps per pass over the block: a quarter of the loads and stores
        ca, cb, cc, cd = c[m - i], c[m - i - 1], c[m - i - 2], c[m - i - 3]
        for j in range(n):
            y, a, b = x2[j], b0[j], b1[j]
            a, b = ca - b, a + b * y
            a, b = cb - b, a + b * y
            a, b = cc - b, a + b * y
            a, b = cd - b, a + b * y
            b0[j], b1[j] = a, b
        i += 4
    while i <= m:
        ck = c[m - i]
        for j in range(n):
            a, b = b0[j], b1[j]
            b0[j], b1[j] = ck - b, a + b * x2[j]
        i += 1
    for j in range(n):
        out[j] = b0[j] + b1[j] * z[j]


@numba.njit(cache=True, nogil=True)
def _erf_erfc_block(t, n, erf_, erfc_, q0, h1, q2, maps, z, p, idx, x2, b0, b1):
    """(erf(t[j]), erfc(t[j])) for j < n <= _BLOCK, t[j] = |x| >= 0 or NaN. z, p: float64 [3, _BLOCK], idx: int64
    [3, _BLOCK], x2, b0, b1: float64 [_BLOCK] work arrays."""
    k0 = k1 = k2 = np.int64(0)  # not a literal: one compiled signature of _chebval_many
    for i in range(n):
        ti = t[i]
        if ti != ti:
            erf_[i] = np.nan
            erfc_[i] = np.nan
        elif ti < 1.0:
            idx[0, k0] = i
            z[0, k0] = ti * ti
            k0 += 1
        elif ti < 2.0:
            idx[1, k1] = i
            z[1, k1] = ti
            k1 += 1
        elif ti == np.inf:
            erf_[i] = 1.0
            erfc_[i] = 0.0
        else:
            idx[2, k2] = i
            z[2, k2] = 1.0 / (ti * ti)
            k2 += 1
    _chebval_many(q0, maps[0], maps[1], z[0], k0, p[0], x2, b0, b1)
    _chebval_many(h1, maps[2], maps[3], z[1], k1, p[1], x2, b0, b1)
    _chebval_many(q2, maps[4], maps[5], z[2], k2, p[2], x2, b0, b1)
    for j in range(k0):
        i = idx[0, j]
        e = t[i] * p[0, j]
        erf_[i] = e
        erfc_[i] = 1.0 - e
    for j in range(k1):
        i = idx[1, j]
        ti = t[i]
        c = np.exp(-ti * ti) * p[1, j]
        erf_[i] = 1.0 - c
        erfc_[i] = c
    for j in range(k2):
        i = idx[2, j]
        ti = t[i]
        c = np.exp(-ti * ti) * p[2, j] / ti
        erf_[i] = 1.0 - c
        erfc_[i] = c


@numba.njit(cache=True, nogil=True)
def _erf_erfc_abs_kernel(t, erf_, erfc_, q0, h1, q2, maps):
    """erf_[i], erfc_[i] = erf(t[i]), erfc(t[i]) for 1-D contiguous t >= 0 (or NaN)."""
    z, p, idx = np.empty((3, _BLOCK)), np.empty((3, _BLOCK)), np.empty((3, _BLOCK), np.int64)
    tb, eb, cb = np.empty(_BLOCK), np.empty(_BLOCK), np.empty(_BLOCK)
    x2, b0, b1 = np.empty(_BLOCK), np.empty(_BLOCK), np.empty(_BLOCK)
    for lo in range(0, t.size, _BLOCK):
        n = min(_BLOCK, t.size - lo)
        for j in range(n):
            tb[j] = t[lo + j]
        _erf_erfc_block(tb, n, eb, cb, q0, h1, q2, maps, z, p, idx, x2, b0, b1)
        for j in range(n):
            erf_[lo + j] = eb[j]
            erfc_[lo + j] = cb[j]


@numba.njit(cache=True, nogil=True)
def _gelu_erf_kernel(flat, gelu, q0, h1, q2, maps):
    """In place on 1-D FP32: gelu(v) = 0.5 v erfc(-v / sqrt 2) or erf(v), in float64, rounded to FP32."""
    z, p, idx = np.empty((3, _BLOCK)), np.empty((3, _BLOCK)), np.empty((3, _BLOCK), np.int64)
    wide, tb, eb, cb = np.empty(_BLOCK), np.empty(_BLOCK), np.empty(_BLOCK), np.empty(_BLOCK)
    x2, b0, b1 = np.empty(_BLOCK), np.empty(_BLOCK), np.empty(_BLOCK)
    for lo in range(0, flat.size, _BLOCK):
        n = min(_BLOCK, flat.size - lo)
        for j in range(n):
            w = np.float64(flat[lo + j])
            wide[j] = w
            tb[j] = abs(w * _NEG_INV_SQRT2) if gelu else abs(w)
        _erf_erfc_block(tb, n, eb, cb, q0, h1, q2, maps, z, p, idx, x2, b0, b1)
        for j in range(n):
            w = wide[j]
            if gelu:
                c = cb[j]
                if w * _NEG_INV_SQRT2 < 0:
                    c = 2.0 - c
                # NaN in, NaN out: the input's own (quieted) NaN, whichever way the multiply is compiled
                y = 0.5 * w if w != w else (0.5 * w) * c
            else:
                y = math.copysign(eb[j], w)
            flat[lo + j] = np.float32(y)


def _abs_f64(x) -> np.ndarray:
    return np.ascontiguousarray(np.abs(np.asarray(x, F64))).reshape(-1)


def erf(x) -> np.ndarray:
    """Vectorized error function in float64 (relative error ~1e-14 against math.erf)."""
    x = np.asarray(x, F64)
    t = _abs_f64(x)
    e, c = np.empty_like(t), np.empty_like(t)
    _erf_erfc_abs_kernel(t, e, c, _Q0, _H1, _Q2, _MAPS)
    return np.copysign(e.reshape(x.shape), x)


def erfc(x) -> np.ndarray:
    """Vectorized complementary error function in float64 (relative error ~1e-13 against math.erfc)."""
    x = np.asarray(x, F64)
    t = _abs_f64(x)
    e, c = np.empty_like(t), np.empty_like(t)
    _erf_erfc_abs_kernel(t, e, c, _Q0, _H1, _Q2, _MAPS)
    c = c.reshape(x.shape)
    return np.where(x < 0, 2.0 - c, c)


def gelu_erf_inplace(x: np.ndarray, gelu: bool) -> np.ndarray:
    """ScalarE's gelu or erf of a C-contiguous FP32 array, in place (and returned): evaluated in float64 and
    rounded once to FP32."""
    _gelu_erf_kernel(x.reshape(-1), gelu, _Q0, _H1, _Q2, _MAPS)
    return x
