"""Exact int64 sums from byte sums: the last step of summing int64 values on engines without 64-bit
arithmetic.

The caller sums the 8 bytes of every value separately (an int64 tensor viewed as uint8 ``[..., 8]``,
reduced over the value dims with the ordinary ``reduce.sum``, exact in int32 while ``count * 255 < 2**31``),
so byte sum ``B_k`` (k = 0 least significant) is the sum of byte k over the reduced values, and the
wrapped int64 total is ``sum_k B_k * 2**(8k) mod 2**64`` (two's complement: the unsigned total mod 2**64 is
the signed wrapping total, exactly as torch's int64 sum wraps).

:func:`combine_bytes` forms that total with a carry chain on GpSimd's exact int32 arithmetic:
``t = B_k + c; byte_k = t & 255; c = t >> 8``. With ``B_k <= 255 * count`` and ``c <= count`` (induction:
``t <= 256 * count`` so the next carry is at most ``count``), every ``t`` stays below ``2**31`` when
``count < 2**23`` = :data:`MAX_COUNT`; the carry out of byte 7 is dropped (the wrap mod 2**64). Bytes are
then joined into the low and high 32-bit words (shifts and ors, wrapping into the sign bit).
"""

from __future__ import annotations

from neuron_hal import Alu, DType, Engine

from .. import isa as nisa
from ..errors import KernelError
from ..jit import kernel
from .elementwise import TILE_BYTES, operand
from .wide_int import _op, _run, _t, val

__all__ = ["combine_bytes", "MAX_COUNT"]

I32 = DType.int32
MAX_COUNT = 2 ** 23  # values summed per result: below it every carry-chain step fits int32 (module docstring)


def _byte_sum_views(sums, op: str):
    """The 8 word-array views ``[..., 2]`` of byte sums k = 0..7 inside the ``[..., 8, 2]`` word array."""
    o = operand(sums, op, "sums")
    if o.dtype is not I32 or len(o.shape) < 2 or o.shape[-2:] != (8, 2):
        raise KernelError(f"{op}: sums must be the int32 word array [..., 8, 2] of int64 byte sums, got {sums!r}")
    v = o.view
    stride = v.dims[-2][1]
    return [type(v)(v.owner, I32, v.offset + k * stride, (*v.dims[:-2], v.dims[-1])) for k in range(8)]


def _join(ctx, parts):
    """b0 | b1 << 8 | b2 << 16 | b3 << 24 (each b in [0, 255]; the last shift wraps into the sign bit)."""
    word = parts[0]
    for i, b in enumerate(parts[1:], 1):
        word = _op(ctx, word, _op(ctx, b, 8 * i, Alu.left_shift), Alu.bitwise_or)
    return word


@kernel(tunables={"tile_bytes": TILE_BYTES})
def combine_bytes(sums, tile_bytes=TILE_BYTES[0]):
    """The int64 word array ``[..., 2]`` of ``sum_k sums[..., k] * 2**(8k) mod 2**64`` from the int64 byte sums
    ``sums`` (as their int32 words ``[..., 8, 2]``; each must be in [0, 255 * MAX_COUNT))."""
    views = _byte_sum_views(sums, "combine_bytes")

    def body(ctx, cond, words):
        carry, parts = None, []
        for k, (lo, _hi) in enumerate(words):  # a byte sum is below 2**31: its high word is 0
            t = lo if carry is None else val(_op(ctx, lo, carry, Alu.add))
            parts.append(_op(ctx, t, 255, Alu.bitwise_and))
            if k < 7:
                carry = _t(ctx)  # t >> 8 (t >= 0)
                nisa.tensor_scalar(carry, val(t).full, Alu.right_shift, 8, engine=Engine.GPSIMD)
        return _join(ctx, parts[:4]), _join(ctx, parts[4:])

    return _run("combine_bytes", views, body, True, tile_bytes, 24)
