"""``nisa.nc_stream_shuffle``: cross-partition movement within each quadrant of 32 partitions, with NKI's
documented semantics (output partition i of a quadrant copies input partition ``shuffle_mask[i]`` of the same
quadrant; 255 leaves it unmodified; the same mask for every quadrant; in place allowed). Composed from the
simulator's instructions, which keep each engine lane on its partition: the data is transposed on TensorE (partitions
become free elements), the columns are copied on VectorE (one strided copy per run of the mask), and transposed back.
Values are exact (float data moves through fp32 unchanged); the device time is the composition's, not VectorE's one
shuffle pass.
"""

from __future__ import annotations

import math

from neuron_hal import DType, Space

from .. import isa as _isa
from .. import language as _lib
from ..errors import KernelError
from ..tensors import View
from .api import NkiNotImplemented

QUADRANT, KEEP = 32, 255


def _runs(mask: list[int]) -> list[tuple[int, int, int, int]]:
    """(first output, count, first input, input step >= 0) runs of the mask, 255s skipped."""
    runs, i = [], 0
    while i < len(mask):
        if mask[i] == KEEP:
            i += 1
            continue
        j, step = i + 1, None
        while j < len(mask) and mask[j] != KEEP and (step is None and mask[j] >= mask[j - 1] or
                                                     step is not None and mask[j] - mask[j - 1] == step):
            step = mask[j] - mask[j - 1] if step is None else step
            j += 1
        runs.append((i, j - i, mask[i], step or 0))
        i = j
    return runs


def _columns(t: View, start: int, count: int, step: int) -> View:
    if count == 1 or step == 1:
        return t[:, start:start + count]
    if step == 0:
        return t[:, start:start + 1].broadcast_to((t.shape[0], count))
    return t[:, start:start + step * (count - 1) + 1:step]


def nc_stream_shuffle(dst: View, src: View, shuffle_mask, name: str | None = None) -> None:
    what = "nisa.nc_stream_shuffle"
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != QUADRANT or any(not (0 <= m < QUADRANT or m == KEEP) for m in mask):
        raise KernelError(f"{what}: shuffle_mask must be {QUADRANT} partitions in 0..31 (or 255), got {mask}")
    for n, t in (("dst", dst), ("src", src)):
        if not isinstance(t, View) or not t.on_chip:
            raise KernelError(f"{what}: {n} must be an SBUF/PSUM tile, got {t!r}")
    if dst.dtype != src.dtype:
        raise KernelError(f"{what}: dst {dst.dtype} and src {src.dtype} must have one dtype")
    if not src.dtype.is_float:
        raise NkiNotImplemented(f"{what} of {src.dtype} data is not implemented by neuron-kernels' NKI front end "
                                f"(float data only)")
    free = math.prod(src.shape[1:])
    if math.prod(dst.shape[1:]) != free:
        raise KernelError(f"{what}: dst {dst!r} and src {src!r} must have the same elements per partition")
    ps, pd = src.shape[0], dst.shape[0]
    for q in range(math.ceil(pd / QUADRANT)):
        for i, m in enumerate(mask):
            if q * QUADRANT + i < pd and m != KEEP and q * QUADRANT + m >= ps:
                raise KernelError(f"{what}: output partition {q * QUADRANT + i} copies input partition "
                                  f"{q * QUADRANT + m}; src {src!r} has {ps}")
    s2 = src if src.ndim == 2 else src.reshape((ps, free))
    d2 = dst if dst.ndim == 2 else dst.reshape((pd, free))
    keep = KEEP in mask or pd % QUADRANT
    for c in range(0, free, 128):
        fc = min(128, free - c)
        cols = _lib.ndarray((fc, ps), DType.float32, Space.PSUM)
        _isa.nc_transpose(cols, s2[:, c:c + fc])
        out = _lib.ndarray((fc, pd), DType.float32, Space.SBUF)
        if keep:  # partitions the mask leaves alone keep dst's data
            old = _lib.ndarray((fc, pd), DType.float32, Space.PSUM)
            _isa.nc_transpose(old, d2[:, c:c + fc])
            _isa.tensor_copy(out, old)
        for q in range(math.ceil(pd / QUADRANT)):
            base = q * QUADRANT
            for i, n, m, step in _runs(mask):
                n = min(n, pd - base - i)
                if n > 0:
                    _isa.tensor_copy(out[:, base + i:base + i + n], _columns(cols, base + m, n, step))
        back = _lib.ndarray((pd, fc), DType.float32, Space.PSUM)
        _isa.nc_transpose(back, out)
        _isa.tensor_copy(d2[:, c:c + fc], back)
