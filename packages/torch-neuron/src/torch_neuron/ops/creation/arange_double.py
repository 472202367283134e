"""Aranges with fractional start/step, bit for bit as torch's CPU computes them (the arange kernel in
``creation.fill`` sends what its exact paths cannot do here first; what this cannot do runs on the CPU).

torch's CPU arange is not ``start + i * step`` rounded once: it forms values in its accumulate type (double
for float32, float32 for bfloat16/float16) and, within each ``at::parallel_for`` chunk (ranges longer than
the grain size split over the intra-op threads), runs a vectorised loop over blocks of 2V elements whose lanes
are ``base + j * step`` with ``base`` the value at the lane-0 index rounded to the result dtype, then a scalar
loop ``start + step * i`` for the rest. ``plan`` lays out the same regions; ``neuron_kernels.library.
arange_f64`` computes each: float32 in exact integer arithmetic (values scaled by 2**-q to 64-bit integers,
roundings to 53 and 24 bits by bit length), bfloat16/float16 as the same float32 ops on the VectorE.
V, the CPU kernel's lanes per dtype, is measured once against the models it can be (see ``vector_width``).
Limits (else the CPU path): not -0.0 start with a negative step; values below 2**100; float32: every scaled
value below 2**62 (so n * |step| below about 2**9 units of the finest bit of start and step) and normal
results; 16-bit dtypes: fewer than 2**24 values.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch

from neuron_kernels.library import arange_f64 as kf

from ..core.dtypes import FLOATS
from ..core.launch import run

GRAIN = 32768  # at::internal::GRAIN_SIZE: parallel_for splits only longer ranges


def _lsb(f: Fraction) -> int | None:
    """The exponent of the lowest set bit of a dyadic rational (None for 0)."""
    if f == 0:
        return None
    if f.denominator > 1:
        return -(f.denominator.bit_length() - 1)
    v = abs(f.numerator)
    return (v & -v).bit_length() - 1


def _regions(n: int, width: int, threads: int) -> list[tuple[int, int, int]]:
    """(begin, end, lanes or 0) of torch's loops: parallel_for chunks, each a vector part then a scalar tail."""
    chunks = [(0, n)]
    if n > GRAIN and threads > 1:
        nt = min(threads, -(-n // GRAIN))
        size = -(-n // nt)
        chunks = [(b, min(n, b + size)) for b in range(0, n, size)]
    out = []
    for b, e in chunks:
        v = b + (e - b) // (2 * width) * (2 * width) if width else b
        out += [r for r in ((b, v, width), (v, e, 0)) if r[1] > r[0]]
    return out


def _model(start: float, step: float, n: int, width: int, dtype: torch.dtype) -> np.ndarray:
    """torch's CPU loop for one chunk, in numpy (float32: double math; 16-bit dtypes: float32 math), only to
    recognise the CPU's lane count."""
    acc = np.float64 if dtype is torch.float32 else np.float32
    s, t = acc(start), acc(step)

    def rounded(v):  # to the result dtype and back
        return torch.from_numpy(np.asarray(v, np.float32)).to(dtype).to(torch.float32).numpy().astype(acc)

    out = np.empty(n, acc)
    for b, e, w in _regions(n, width, 1):
        i = np.arange(b, e)
        if w:
            j = ((i - b) % w).astype(acc)
            out[b:e] = rounded(s + t * (i - b - (i - b) % w + b).astype(acc)) + j * t
        else:
            out[b:e] = s + t * i.astype(acc)
    return torch.from_numpy(out.astype(np.float32)).to(dtype).view(torch.int16 if dtype.itemsize == 2 else
                                                                    torch.int32).numpy()


@lru_cache(maxsize=4)
def vector_width(dtype: torch.dtype = torch.float32) -> int | None:
    """The lanes of the CPU's arange loop for ``dtype`` (float32: 8 with AVX2 kernels, 16 with AVX512;
    16-bit dtypes twice that; 0: scalar only), recognised on a 96-element probe whose candidates differ;
    None (the CPU path) if none matches."""
    start, step, n = 0.1, 0.3, 96
    cpu = torch.arange(start, start + step * (n - 0.5), step, dtype=dtype, device="cpu")
    cpu = cpu.view(torch.int16 if dtype.itemsize == 2 else torch.int32).numpy()
    for w in (8, 16, 32, 4, 0):
        if np.array_equal(cpu, _model(start, step, n, w, dtype)):
            return w
    return None


def plan(start, step, n: int, dtype: torch.dtype):
    """The launches' arguments (see ``fill``), or None when this path cannot give torch's bits."""
    if dtype not in FLOATS or not n or isinstance(start, complex) or isinstance(step, complex):
        return None
    start, step = float(start), float(step)  # torch's Scalar -> double
    if start == 0 and math.copysign(1.0, start) < 0:
        if step < 0:
            return None  # -0.0 + (-0.0) keeps the sign: not a scaled integer
        start = 0.0  # -0.0 + 0.0 and -0.0 + x are +0.0 and x: as if +0.0
    width = vector_width(dtype)
    if width is None or abs(start) + abs(step) * (n + 64) >= 2.0 ** 100:
        return None
    regions = _regions(n, width, torch.get_num_threads())
    if dtype is not torch.float32:  # float32 math on the VectorE: exact indices below 2**24 are all it needs
        return ("f32acc", regions, (start, step)) if n + 2 * width < 2 ** 24 else None
    fs, fk = Fraction(start), Fraction(step)
    q = min((e for e in (_lsb(fs), _lsb(fk)) if e is not None), default=0)
    if q < -126:
        return None
    a, k = int(fs / Fraction(2) ** q), int(fk / Fraction(2) ** q)
    if abs(a) + abs(k) * (n + 2 * max(width, 1)) >= kf.LIMIT:
        return None
    odd = abs(k) >> (_lsb(Fraction(k)) or 0) if k else 0
    exact = odd.bit_length() + (n + 2 * width).bit_length() <= 53  # every step * index is a double: no rounding
    return ("f64", regions, (a, k, q, exact))




def fill(target: torch.Tensor, p) -> None:
    """Write the planned arange into the contiguous ``target`` (one launch per region; start and step are
    data, so the programs are reused across values)."""
    kind, regions, args = p
    if kind == "f32acc":
        start, step = args
        words = torch.tensor([[start, step, b] for b, _, _ in regions], dtype=torch.float32).to(target.device)
        for r, (b, e, width) in enumerate(regions):
            run("arange", kf.arange_f32acc, target[b:e], words[r], width=width)
        return
    a, k, q, exact = args
    words = torch.tensor([kf.params(a, k, q, b) for b, _, _ in regions], dtype=torch.int32).to(target.device)
    bits = target.view(torch.int32)
    for r, (b, e, width) in enumerate(regions):
        run("arange", kf.arange_f64, bits[b:e], words[r], width=width, exact_products=exact)
