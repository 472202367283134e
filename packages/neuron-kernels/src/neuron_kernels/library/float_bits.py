"""Float operations done on the bit patterns: nextafter, frexp and copysign, exact for every value (±0,
subnormals, ±inf, NaN), each ONE elementwise program of GpSimd's exact int32 arithmetic.

A float32 tensor is passed as its bits (the tensor viewed as int32), a bfloat16/float16 one as int16 (loaded
sign-extended into int32 tiles, stored back as int16): ``fmt`` names which. In both, a value's int is
negative exactly when its sign bit is set, and ``mag = bits & MAX_MAG`` is the magnitude's bits.

- Order: ``key = bits ^ ((bits >> 31) & MAX_MAG)`` is monotonic in the float value (``-1 - mag`` for negative
  values, ``mag`` otherwise; -0 just below +0), so ``x < y`` of non-NaN floats is ``key(x) < key(y)`` and the
  next float toward y is the bits of ``key(x) ± 1`` (the inverse map is the same xor).
- nextafter(x, y) (C semantics): NaN if either is NaN; y if x == y (so ±0 gives y's zero); the smallest
  subnormal with y's sign if x is ±0; else one key step toward y (inf steps to the largest finite).
- copysign(x, y) = x's magnitude bits with y's sign bit (``mag(x) | (y & ~MAX_MAG)``): the sign of -0.0 and of
  a NaN counts, a NaN's payload stays, as C's copysign.
- frexp(x) = (m, e) with x = m * 2**e, |m| in [0.5, 1): the significand (with the implicit bit of normal
  values) is normalised into [2**MB, 2**(MB+1)) by a binary search of left shifts (``s`` bits), then
  ``e = max(E, 1) - (BIAS - 1) - s`` and m's bits are x's sign, exponent BIAS - 1 and the shifted fraction.
  Zero, inf and NaN give (x, 0) like C's frexp.
- ldexp(x, e) = x * 2**e rounded once (C's ldexp), for float32/bfloat16/float16 x and int32 e: e is clamped to
  [-300, 300] (beyond it every finite nonzero value overflows or underflows anyway) and split into three steps
  in [-126, 127], each a normal power of two built from its exponent bits, ``(s + 127) << 23``, and multiplied
  in FP32. Only the last multiply can round: positive steps are exact until they overflow (then so does the
  result), and before a negative last step (-126 when e < -126) every value that can round to nonzero is at
  least 2**-24, a normal float. bfloat16/float16 values have at most 11 significant bits, so their FP32
  products are exact wherever the store's rounding to their dtype can tell.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_hal import Alu, DType, Engine

from .. import isa as nisa
from ..errors import KernelError
from ..jit import kernel
from .elementwise import TILE_BYTES, Operand, broadcast_shapes, emit, operand, run_elementwise, val

__all__ = ["copysign", "frexp", "ldexp", "nextafter"]

I32, U8 = DType.int32, DType.uint8
G = Engine.GPSIMD


@dataclass(frozen=True)
class _Fmt:
    bits: DType  # the integer view dtype
    mb: int  # stored fraction bits
    eb: int  # exponent bits

    @property
    def max_mag(self) -> int:
        return (1 << (self.mb + self.eb)) - 1

    @property
    def inf(self) -> int:
        return ((1 << self.eb) - 1) << self.mb

    @property
    def nan(self) -> int:
        return self.inf | (1 << (self.mb - 1))

    @property
    def bias(self) -> int:
        return (1 << (self.eb - 1)) - 1


FORMATS = {"float32": _Fmt(DType.int32, 23, 8), "bfloat16": _Fmt(DType.int16, 7, 8),
           "float16": _Fmt(DType.int16, 10, 5)}


def _fmt(fmt: str) -> _Fmt:
    if fmt not in FORMATS:
        raise KernelError(f"fmt must be one of {sorted(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def _bits_operand(x, f: _Fmt, op: str, name: str) -> Operand:
    o = operand(x, op, name)
    if o.is_scalar or o.dtype is not f.bits:
        raise KernelError(f"{op}: {name} must be a {f.bits} tensor (the float bits), got {x!r}")
    return Operand(o.view, None, f.bits, I32)  # loaded sign-extended into int32 tiles


def _op(ctx, x, y, alu: Alu, dtype=I32):
    return emit(ctx.tile(dtype), x, y, alu, G)


def _sel(ctx, m, x, y):
    """m ? x : y (x a tile or an int, y a tile)."""
    x = val(x)
    if x.full is None:
        t = ctx.tile(I32)
        nisa.memset(t, x.imm, engine=G)
        x = val(t)
    out = ctx.tile(I32)
    nisa.select(out, m, x.full, val(y).full)
    return out


def _key(ctx, b, f: _Fmt):
    """The order key of float bits (self-inverse: applied to a key it gives the bits)."""
    sign = ctx.tile(I32)
    nisa.tensor_scalar(sign, val(b).full, Alu.right_shift, 31, op1=Alu.bitwise_and, operand1=f.max_mag, engine=G)
    return _op(ctx, b, sign, Alu.bitwise_xor)


def _nextafter_body(ctx, bx, by, f: _Fmt):
    magx, magy = _op(ctx, bx, f.max_mag, Alu.bitwise_and), _op(ctx, by, f.max_mag, Alu.bitwise_and)
    nan = _op(ctx, _op(ctx, magx, f.inf, Alu.greater, U8), _op(ctx, magy, f.inf, Alu.greater, U8),
              Alu.bitwise_or, U8)
    kx, ky = _key(ctx, bx, f), _key(ctx, by, f)
    step = _op(ctx, _op(ctx, ky, kx, Alu.greater), 2, Alu.multiply)  # 2 toward larger values, else 0
    moved = _key(ctx, _op(ctx, _op(ctx, kx, step, Alu.add), 1, Alu.subtract), f)
    zero_x = _op(ctx, magx, 0, Alu.equal, U8)
    tiny = _op(ctx, _op(ctx, by, ~f.max_mag, Alu.bitwise_and), 1, Alu.bitwise_or)  # y's sign, fraction 1
    r = _sel(ctx, zero_x, tiny, moved)
    same = _op(ctx, _op(ctx, kx, ky, Alu.equal, U8), _op(ctx, zero_x, _op(ctx, magy, 0, Alu.equal, U8),
                                                          Alu.bitwise_and, U8), Alu.bitwise_or, U8)
    r = _sel(ctx, same, by, r)
    return _sel(ctx, nan, f.nan, r)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def nextafter(input, other, fmt="float32", tile_bytes=TILE_BYTES[0]):
    """The bits of torch.nextafter(input, other) from the bits of both (int32 for float32, int16 for
    bfloat16/float16; broadcasting)."""
    f = _fmt(fmt)
    return _bits_binary("nextafter", input, other, f, lambda ctx, x, y: _nextafter_body(ctx, x, y, f), tile_bytes, 24)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def copysign(input, other, fmt="float32", tile_bytes=TILE_BYTES[0]):
    """The bits of torch.copysign(input, other) from the bits of both (int32 for float32, int16 for
    bfloat16/float16; broadcasting)."""
    f = _fmt(fmt)

    def body(ctx, x, y):
        mag, sign = _op(ctx, x, f.max_mag, Alu.bitwise_and), _op(ctx, y, ~f.max_mag, Alu.bitwise_and)
        return _op(ctx, mag, sign, Alu.bitwise_or)
    return _bits_binary("copysign", input, other, f, body, tile_bytes, 3)


def _bits_binary(name: str, input, other, f: _Fmt, body, tile_bytes: int, temps: int):  # noqa: A002
    """One broadcasting elementwise program over the bits of two operands of format ``f``, giving the bits of
    ``body(ctx, x_bits, y_bits)``; ``temps`` as run_elementwise takes it."""
    a, b = _bits_operand(input, f, name, "input"), _bits_operand(other, f, name, "other")
    shape = broadcast_shapes(a.shape, b.shape, op=name)
    return run_elementwise(name, shape, [a, b], [f.bits], lambda ctx, ins: [body(ctx, *ins)], tile_bytes, temps)[0]


def _normalise(ctx, m, f: _Fmt):
    """(m << s, s) with m << s in [2**mb, 2**(mb+1)) for 1 <= m < 2**(mb+1) (a binary search of shifts)."""
    s = None
    k = 1 << (f.mb.bit_length() - 1)
    while k:
        small = _op(ctx, m, 1 << (f.mb + 1 - k), Alu.less)  # 1 where the top k bits are empty
        m = _shift_where(ctx, m, small, k)
        ks = _op(ctx, small, k, Alu.multiply)
        s = ks if s is None else _op(ctx, s, ks, Alu.add)
        k >>= 1
    return m, s


def _shift_where(ctx, m, small, k: int):
    """m << k where ``small`` (0/1) else m: m << (small * k)."""
    return _op(ctx, m, _op(ctx, small, k, Alu.multiply), Alu.left_shift)


def _frexp_body(ctx, b, f: _Fmt):
    mag = _op(ctx, b, f.max_mag, Alu.bitwise_and)
    e_biased = _op(ctx, mag, f.mb, Alu.right_shift)
    normal = _op(ctx, e_biased, 0, Alu.greater)
    m = _op(ctx, _op(ctx, mag, (1 << f.mb) - 1, Alu.bitwise_and), _op(ctx, normal, f.mb, Alu.left_shift),
            Alu.bitwise_or)
    m, s = _normalise(ctx, m, f)
    e = _op(ctx, _op(ctx, e_biased, 1, Alu.max), s, Alu.subtract)
    e = _op(ctx, e, f.bias - 1, Alu.subtract)
    mant = _op(ctx, _op(ctx, m, (1 << f.mb) - 1, Alu.bitwise_and), (f.bias - 1) << f.mb, Alu.bitwise_or)
    mant = _op(ctx, mant, _op(ctx, b, ~f.max_mag, Alu.bitwise_and), Alu.bitwise_or)
    special = _op(ctx, _op(ctx, mag, 0, Alu.equal, U8), _op(ctx, mag, f.inf, Alu.greater_equal, U8),
                  Alu.bitwise_or, U8)  # ±0, ±inf, NaN: (x, 0)
    return [_sel(ctx, special, b, mant), _sel(ctx, special, 0, e)]


@kernel(tunables={"tile_bytes": TILE_BYTES})
def frexp(input, fmt="float32", tile_bytes=TILE_BYTES[0]):
    """(mantissa bits, exponent int32) of torch.frexp(input) from input's bits (int32 for float32, int16
    for bfloat16/float16)."""
    f = _fmt(fmt)
    a = _bits_operand(input, f, "frexp", "input")
    body = lambda ctx, ins: _frexp_body(ctx, ins[0], f)  # noqa: E731
    return run_elementwise("frexp", a.shape, [a], [f.bits, I32], body, tile_bytes, 40)


_LDEXP_CLAMP = 300
_POW2_STEP = (-126, 127)  # the exponents of normal FP32 powers of two


def _pow2(ctx, s):
    """2**s (FP32) for int32 s in [-126, 127]: the exponent bits alone."""
    t = ctx.tile(I32)
    nisa.tensor_scalar(t, val(s).full, Alu.add, 127, op1=Alu.left_shift, operand1=23, engine=G)
    return t.with_dtype(DType.float32)


def _clamp(ctx, e, lo: int, hi: int):
    t = ctx.tile(I32)
    nisa.tensor_scalar(t, val(e).full, Alu.max, lo, op1=Alu.min, operand1=hi, engine=G)
    return t


def _ldexp_body(ctx, x, e):
    e = _clamp(ctx, e, -_LDEXP_CLAMP, _LDEXP_CLAMP)
    last = _clamp(ctx, e, *_POW2_STEP)
    rest = _op(ctx, e, last, Alu.subtract)
    second = _clamp(ctx, rest, *_POW2_STEP)
    y = val(x).full
    for step in (_op(ctx, rest, second, Alu.subtract), second, last):  # the one that can round goes last
        out = ctx.tile(DType.float32)
        nisa.tensor_tensor(out, y, _pow2(ctx, step), Alu.multiply, engine=Engine.VECTOR)
        y = out
    return [y]


@kernel(tunables={"tile_bytes": TILE_BYTES})
def ldexp(input, exponent, tile_bytes=TILE_BYTES[0]):
    """input * 2**exponent as C's ldexp (exact, rounded once into input's dtype) for a float32/bfloat16/float16
    input and an int32 exponent (broadcasting)."""
    a, b = operand(input, "ldexp", "input"), operand(exponent, "ldexp", "exponent")
    if a.is_scalar or a.dtype.name not in FORMATS:
        raise KernelError(f"ldexp: input must be a float32, bfloat16 or float16 tensor, got {input!r}")
    if b.is_scalar or b.dtype is not I32:
        raise KernelError(f"ldexp: exponent must be an int32 tensor, got {exponent!r}")
    shape = broadcast_shapes(a.shape, b.shape, op="ldexp")
    body = lambda ctx, ins: _ldexp_body(ctx, ins[0], ins[1])  # noqa: E731
    return run_elementwise("ldexp", shape, [a, b], [a.dtype], body, tile_bytes, 12)[0]
