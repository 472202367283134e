"""Exact int64 arithmetic from 32-bit words: add/sub/rsub (with alpha), neg, abs, mul, comparisons,
maximum/minimum, clamp, where, and floor/trunc division and remainder/fmod by a constant in [1, 2**15],
each ONE elementwise program.

The engines have no 64-bit arithmetic, but GpSimd's integer mode is exact int32 arithmetic that wraps
(see :mod:`.elementwise`). An int64 tensor is passed as its word array: an int32 HBM tensor of shape
``[..., 2]`` holding the low and the high 32-bit word of each value (little endian, i.e. the int64
tensor's bytes viewed as int32). Each word is loaded as its own stride-2 operand of the ordinary
elementwise tiler, so broadcasting works as for any elementwise kernel (the trailing word dim is not
broadcast). Python ints (any int64 value) are split into two int32 immediates.

Word math (all exact, results wrap modulo 2**64 like torch):
- unsigned ``x < y`` of two words is the signed compare of ``x ^ 2**31`` and ``y ^ 2**31``;
- add: low = al + bl (wraps), carry = low <u al, high = ah + bh + carry; sub likewise with a borrow;
- signed compare: high words signed, then low words unsigned where the high words are equal;
- mul (low 64 bits): low = al * bl (the int32 wrap of the exact product), high = mulhi_u(al, bl)
  + al * bh + ah * bl, with the unsigned high half of al * bl from 16-bit partial products;
- min/max/clamp/where select both words with one predicate;
- division by a constant d <= 2**15: long division of the unsigned value by 16-bit chunks (every partial
  dividend is below 2**31; each chunk's quotient is the FP32 quotient rounded, fixed by the exact
  remainder's sign), negative values via floor(x / d) = ~(~x // d) (floor) or |x| (trunc).

A word-array result is ``[..., 2]`` int32 (view it as int64); comparisons give bool of the broadcast shape.
"""

from __future__ import annotations

import numbers

from neuron_hal import Alu, DType, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from .elementwise import TILE_BYTES, Loaded, Operand, Tiler, broadcast_shapes, emit, operand, run_elementwise, val

__all__ = ["add", "sub", "rsub", "neg", "abs", "mul", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum",
           "clamp", "clamp_min", "clamp_max", "where", "floor_divide", "remainder", "trunc_divide", "fmod", "DIV_MAX"]

I32, U8, BOOL = DType.int32, DType.uint8, DType.bool_
G = Engine.GPSIMD
SIGN = -(2 ** 31)  # XOR with the sign bit maps unsigned order onto signed order


def _s32(v: int) -> int:
    """The low 32 bits of ``v`` as a signed int32 value."""
    return ((v & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


# -- operands ------------------------------------------------------------------------------------------
def _wide_operands(x, op: str, name: str) -> tuple[list[Operand], tuple[int, ...]]:
    """The low and high word operands of a word array or a Python int, and the value shape."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        v = int(x)
        if not -(2 ** 63) <= v < 2 ** 63:
            raise OverflowError(f"{op}: {name} = {v} does not fit int64")
        return [Operand(None, _s32(v), I32), Operand(None, _s32(v >> 32), I32)], ()
    o = operand(x, op, name)
    if o.is_scalar or o.dtype is not I32 or not o.shape or o.shape[-1] != 2:
        raise KernelError(f"{op}: {name} must be an int32 word array of shape [..., 2] (an int64 tensor viewed "
                          f"as int32) or a Python int, got {x!r}")
    v = o.view
    lo = type(v)(v.owner, I32, v.offset, v.dims[:-1])
    hi = type(v)(v.owner, I32, v.offset + v.dims[-1][1], v.dims[:-1])
    return [Operand(lo, None, I32, I32), Operand(hi, None, I32, I32)], o.shape[:-1]


def _run(op: str, wides: list, body, wide_out: bool, tile_bytes: int, temps: int, cond=None):
    """Lay ``body(ctx, cond, [(lo, hi), ...]) -> (lo, hi) | bool tile`` over the broadcast shape."""
    inputs, shapes = [], []
    for i, x in enumerate(wides):
        ops, shape = _wide_operands(x, op, f"operand {i}")
        inputs += ops
        shapes.append(shape)
    if all(o.is_scalar for o in inputs):
        raise KernelError(f"{op}: at least one operand must be a tensor")
    c = None
    if cond is not None:
        c = operand(cond, op, "condition")
        if c.is_scalar:
            raise KernelError(f"{op}: condition must be a tensor")
        shapes.append(c.shape)
        inputs.append(c)
    shape = broadcast_shapes(*shapes, op=op)

    def pairs(ins):
        words = ins[: 2 * len(wides)]
        return [(words[2 * i], words[2 * i + 1]) for i in range(len(wides))], (ins[-1] if c is not None else None)

    if not wide_out:
        return run_elementwise(op, shape, inputs, [BOOL], lambda ctx, ins: [body(ctx, *pairs(ins)[::-1])],
                               tile_bytes, temps)[0]
    out = nl.ndarray((*shape, 2), I32, buffer=nl.hbm, name="out")

    def store(ctx, ins):
        lo, hi = body(ctx, *pairs(ins)[::-1])
        pt, row = ctx.partitions, ctx.free_size
        for w, t in enumerate((lo, hi)):  # each word to every other int32 of the output
            t = t.full if isinstance(t, Loaded) else t
            dst = type(out)(out.owner, I32, 2 * ctx.out_offset + w, ((pt, 2 * row), (row, 2)))
            nisa.dma_copy(dst, t.reshape(pt, row))
        return []

    Tiler(op, shape, inputs, [I32, I32], tile_bytes, temps).run(store, [])
    return out


# -- word helpers (x, y: Loaded or Python ints; results are tiles) ---------------------------------------
def _t(ctx, dtype=I32):
    return ctx.tile(dtype)


def _op(ctx, x, y, alu: Alu, dtype=I32):
    return emit(_t(ctx, dtype), x, y, alu, G)


def _flip(ctx, x):
    """x ^ 2**31: unsigned order as signed order."""
    x = val(x)
    if x.imm is not None:
        return _s32(int(x.imm) ^ 0x80000000)
    return _op(ctx, x, SIGN, Alu.bitwise_xor)


def _ult(ctx, x, y, dtype=U8):
    """Unsigned x < y of two words."""
    return _op(ctx, _flip(ctx, x), _flip(ctx, y), Alu.less, dtype)


def _add(ctx, a, b):
    (al, ah), (bl, bh) = a, b
    lo = _op(ctx, al, bl, Alu.add)
    carry = _ult(ctx, lo, al if val(al).imm is None else bl)  # the sum wrapped below an addend
    hi = _op(ctx, ah, bh, Alu.add)
    return lo, _op(ctx, hi, carry, Alu.add)


def _sub(ctx, a, b):
    (al, ah), (bl, bh) = a, b
    lo = _op(ctx, al, bl, Alu.subtract)
    borrow = _ult(ctx, al, bl)
    hi = _op(ctx, ah, bh, Alu.subtract)
    return lo, _op(ctx, hi, borrow, Alu.subtract)


def _lt(ctx, a, b, dtype=BOOL):
    """Signed a < b: the high words decide unless equal, then the low words unsigned."""
    (al, ah), (bl, bh) = a, b
    low = _ult(ctx, al, bl)
    same = _op(ctx, ah, bh, Alu.equal, U8)
    low = _op(ctx, low, same, Alu.bitwise_and, U8)
    high = _op(ctx, ah, bh, Alu.less, U8)
    return _op(ctx, high, low, Alu.bitwise_or, dtype)


def _not(ctx, m, dtype=BOOL):
    return _op(ctx, m, 1, Alu.bitwise_xor, dtype)


def _eq(ctx, a, b, dtype=BOOL):
    (al, ah), (bl, bh) = a, b
    return _op(ctx, _op(ctx, al, bl, Alu.equal, U8), _op(ctx, ah, bh, Alu.equal, U8), Alu.bitwise_and, dtype)


def _pick(ctx, m, x, y):
    """m ? x : y for one word (m a mask tile; x, y Loaded or ints)."""
    x, y = val(x), val(y)
    if x.full is None:
        if y.full is None:  # both immediates: materialize the true side
            t = _t(ctx)
            nisa.memset(t, x.imm, engine=G)
            x = val(t)
        else:
            m, x, y = _not(ctx, m, U8), y, x
    out = _t(ctx)
    nisa.select(out, m, x.full, y.full if y.full is not None else y.imm)
    return out


def _select(ctx, m, a, b):
    return _pick(ctx, m, a[0], b[0]), _pick(ctx, m, a[1], b[1])


def _halves(ctx, x):
    """The unsigned 16-bit halves (low, high) of a word."""
    x = val(x)
    if x.imm is not None:
        v = int(x.imm) & 0xFFFFFFFF
        return v & 0xFFFF, v >> 16
    lo = _op(ctx, x, 0xFFFF, Alu.bitwise_and)
    hi = _t(ctx)
    nisa.tensor_scalar(hi, x.full, Alu.right_shift, 16, op1=Alu.bitwise_and, operand1=0xFFFF, engine=G)
    return lo, hi


def _mul16(ctx, x, y):
    if isinstance(x, int) and isinstance(y, int):
        return _s32(x * y)
    return _op(ctx, x, y, Alu.multiply)


def _mulhi_u(ctx, x, y):
    """The high word of the unsigned 64-bit product of two words (16-bit partial products, exact)."""
    (x0, x1), (y0, y1) = _halves(ctx, x), _halves(ctx, y)
    p00, p01, p10, p11 = _mul16(ctx, x0, y0), _mul16(ctx, x0, y1), _mul16(ctx, x1, y0), _mul16(ctx, x1, y1)
    def high16(p):  # p >>> 16 (a partial product is a tensor here: one operand of mul is)
        if isinstance(p, int):
            return (p & 0xFFFFFFFF) >> 16
        t = _t(ctx)
        nisa.tensor_scalar(t, val(p).full, Alu.right_shift, 16, op1=Alu.bitwise_and, operand1=0xFFFF, engine=G)
        return t

    mid = _op(ctx, high16(p00), _op(ctx, p01, 0xFFFF, Alu.bitwise_and), Alu.add)
    mid = _op(ctx, mid, _op(ctx, p10, 0xFFFF, Alu.bitwise_and), Alu.add)
    hi = _op(ctx, p11, high16(p01), Alu.add)
    hi = _op(ctx, hi, high16(p10), Alu.add)
    return _op(ctx, hi, high16(mid), Alu.add)


def _mul(ctx, a, b):
    (al, ah), (bl, bh) = a, b
    lo = _op(ctx, al, bl, Alu.multiply)  # the int32 wrap of the exact product: its low word
    hi = _op(ctx, _mulhi_u(ctx, al, bl), _op(ctx, al, bh, Alu.multiply), Alu.add)
    return lo, _op(ctx, hi, _op(ctx, ah, bl, Alu.multiply), Alu.add)


# -- kernels -------------------------------------------------------------------------------------------
_TUNE = {"tile_bytes": TILE_BYTES}


def _scaled(ctx, b, alpha: int):
    """alpha * b (alpha a Python int in the int64 range)."""
    if alpha == 1:
        return b
    return _loaded(_mul(ctx, b, (_s32(alpha), _s32(alpha >> 32))))


def _check_alpha(alpha) -> int:
    if not isinstance(alpha, numbers.Integral) or not -(2 ** 63) <= int(alpha) < 2 ** 63:
        raise KernelError(f"alpha must be an int64 value, got {alpha!r}")
    return int(alpha)


@kernel(tunables=_TUNE)
def add(input, other, alpha=1, tile_bytes=TILE_BYTES[0]):
    """input + alpha * other (int64, wraps)."""
    alpha = _check_alpha(alpha)
    return _run("add64", [input, other], lambda ctx, c, w: _add(ctx, w[0], _scaled(ctx, w[1], alpha)), True,
                tile_bytes, 6 if alpha == 1 else 30)


@kernel(tunables=_TUNE)
def sub(input, other, alpha=1, tile_bytes=TILE_BYTES[0]):
    """input - alpha * other (int64, wraps)."""
    alpha = _check_alpha(alpha)
    return _run("sub64", [input, other], lambda ctx, c, w: _sub(ctx, w[0], _scaled(ctx, w[1], alpha)), True,
                tile_bytes, 6 if alpha == 1 else 30)


@kernel(tunables=_TUNE)
def rsub(input, other, tile_bytes=TILE_BYTES[0]):
    """other - input (int64, wraps)."""
    return _run("rsub64", [input, other], lambda ctx, c, w: _sub(ctx, w[1], w[0]), True, tile_bytes, 6)


@kernel(tunables=_TUNE)
def neg(input, tile_bytes=TILE_BYTES[0]):
    """-input (int64; -INT64_MIN wraps to itself, as torch)."""
    return _run("neg64", [input], lambda ctx, c, w: _sub(ctx, (0, 0), w[0]), True, tile_bytes, 6)


@kernel(tunables=_TUNE)
def abs(input, tile_bytes=TILE_BYTES[0]):  # noqa: A001
    """|input| (int64; abs(INT64_MIN) wraps to itself, as torch)."""

    def body(ctx, c, w):
        m = _op(ctx, w[0][1], 0, Alu.less, U8)
        return _select(ctx, m, tuple(map(val, _sub(ctx, (0, 0), w[0]))), w[0])

    return _run("abs64", [input], body, True, tile_bytes, 8)


@kernel(tunables=_TUNE)
def mul(input, other, tile_bytes=TILE_BYTES[0]):
    """input * other, the low 64 bits of the product (int64, wraps as torch)."""
    return _run("mul64", [input, other], lambda ctx, c, w: _mul(ctx, *w), True, tile_bytes, 24)


def _cmp_kernel(name: str, fn):
    def k(input, other, tile_bytes=TILE_BYTES[0]):
        return _run(f"{name}64", [input, other], lambda ctx, c, w: fn(ctx, *w), False, tile_bytes, 8)

    k.__name__ = k.__qualname__ = name
    k.__doc__ = f"torch.{name} of int64 values, as bool."
    return kernel(k, name=f"{name}64", tunables=_TUNE)


eq = _cmp_kernel("eq", _eq)
ne = _cmp_kernel("ne", lambda ctx, a, b: _not(ctx, _eq(ctx, a, b, U8)))
lt = _cmp_kernel("lt", _lt)
gt = _cmp_kernel("gt", lambda ctx, a, b: _lt(ctx, b, a))
le = _cmp_kernel("le", lambda ctx, a, b: _not(ctx, _lt(ctx, b, a, U8)))
ge = _cmp_kernel("ge", lambda ctx, a, b: _not(ctx, _lt(ctx, a, b, U8)))


def _loaded(pair):
    return tuple(map(val, pair))


def _max(ctx, a, b):
    return _loaded(_select(ctx, _lt(ctx, a, b, U8), b, a))


def _min(ctx, a, b):
    return _loaded(_select(ctx, _lt(ctx, b, a, U8), b, a))


@kernel(tunables=_TUNE)
def maximum(input, other, tile_bytes=TILE_BYTES[0]):
    """Elementwise maximum of int64 values."""
    return _run("maximum64", [input, other], lambda ctx, c, w: _max(ctx, *w), True, tile_bytes, 10)


@kernel(tunables=_TUNE)
def minimum(input, other, tile_bytes=TILE_BYTES[0]):
    """Elementwise minimum of int64 values."""
    return _run("minimum64", [input, other], lambda ctx, c, w: _min(ctx, *w), True, tile_bytes, 10)


@kernel(tunables=_TUNE)
def clamp(input, min=None, max=None, tile_bytes=TILE_BYTES[0]):  # noqa: A002
    """min(max(input, min), max) of int64 values, either bound optional (min > max gives max, as torch)."""
    bounds = [(f, b) for f, b in ((_max, min), (_min, max)) if b is not None]
    if not bounds:
        raise KernelError("clamp: at least one of min and max must not be None")

    def body(ctx, c, w):
        x = w[0]
        for (f, _), b in zip(bounds, w[1:]):
            x = f(ctx, x, b)
        return x

    return _run("clamp64", [input, *[b for _, b in bounds]], body, True, tile_bytes, 20)


@kernel(tunables=_TUNE)
def clamp_min(input, min, tile_bytes=TILE_BYTES[0]):  # noqa: A002
    """max(input, min) of int64 values (torch.clamp_min; ``clamp`` with positional operands only)."""
    return _run("clamp_min64", [input, min], lambda ctx, c, w: _max(ctx, *w), True, tile_bytes, 10)


@kernel(tunables=_TUNE)
def clamp_max(input, max, tile_bytes=TILE_BYTES[0]):  # noqa: A002
    """min(input, max) of int64 values."""
    return _run("clamp_max64", [input, max], lambda ctx, c, w: _min(ctx, *w), True, tile_bytes, 10)


@kernel(tunables=_TUNE)
def where(condition, input, other, tile_bytes=TILE_BYTES[0]):
    """input where condition is nonzero else other (int64 values, bit exact)."""
    return _run("where64", [input, other], lambda ctx, c, w: _select(ctx, c.full, *w), True, tile_bytes, 4,
                cond=condition)


# -- division by a small positive constant -------------------------------------------------------------
DIV_MAX = 2 ** 15  # divisors in [1, DIV_MAX]: every partial dividend r * 2**16 + chunk stays below 2**31


def _udiv_chunk(ctx, cur, d: int):
    """(cur // d, cur % d) of a nonnegative int32 word below d * 2**16, exactly: the FP32 quotient rounded
    to an integer is floor(cur / d) or one more (its error is below 2**-7), which the remainder's sign fixes."""
    q = _t(ctx)
    nisa.tensor_scalar(q, val(cur).full, Alu.divide, float(d), engine=G)  # the int32 store rounds to nearest
    r = _op(ctx, cur, _op(ctx, q, d, Alu.multiply), Alu.subtract)
    over = _op(ctx, r, 0, Alu.less)
    q = _op(ctx, q, over, Alu.subtract)
    r = _op(ctx, r, _op(ctx, over, d, Alu.multiply), Alu.add)
    return q, r


def _udivmod(ctx, u, d: int):
    """(u // d, u % d) of an unsigned 64-bit value (two words) by 1 <= d <= DIV_MAX: long division by
    16-bit chunks, high to low."""
    lo, hi = u
    chunks = [*reversed(_halves(ctx, hi)), *reversed(_halves(ctx, lo))]
    qs, r = [], None
    for c in chunks:
        cur = c if r is None else _op(ctx, _op(ctx, r, 65536, Alu.multiply), c, Alu.add)
        q, r = _udiv_chunk(ctx, cur, d)
        qs.append(q)

    def join(h, low):  # h * 2**16 + low, wrapping into the word's sign bit
        return _op(ctx, _op(ctx, h, 16, Alu.left_shift), low, Alu.bitwise_or)

    return (join(qs[2], qs[3]), join(qs[0], qs[1])), r


def _check_divisor(d) -> int:
    if not isinstance(d, numbers.Integral) or isinstance(d, bool) or not 1 <= int(d) <= DIV_MAX:
        raise KernelError(f"the divisor must be an int in [1, {DIV_MAX}], got {d!r}")
    return int(d)


def _floor_parts(ctx, x, d: int):
    """floor(x / d) and x mod d (in [0, d)) for d > 0: for negative x, floor(x / d) = ~(~x // d) and
    x mod d = d - 1 - (~x mod d), with ~x >= 0."""
    m = _t(ctx)
    nisa.tensor_scalar(m, val(x[1]).full, Alu.right_shift, 31, engine=G)  # 0 or -1 (arithmetic shift)
    u = (_op(ctx, x[0], m, Alu.bitwise_xor), _op(ctx, x[1], m, Alu.bitwise_xor))
    (ql, qh), r = _udivmod(ctx, u, d)
    q = (_op(ctx, ql, m, Alu.bitwise_xor), _op(ctx, qh, m, Alu.bitwise_xor))
    return q, _op(ctx, _op(ctx, r, m, Alu.bitwise_xor), _op(ctx, m, d, Alu.bitwise_and), Alu.add), m


def _trunc_parts(ctx, x, d: int):
    """trunc(x / d) and fmod(x, d) for d > 0: |x| as an unsigned value (INT64_MIN is 2**63), then the
    quotient and the remainder take x's sign."""
    neg = _op(ctx, x[1], 0, Alu.less)
    ux = _loaded(_select(ctx, neg, _loaded(_sub(ctx, (0, 0), x)), x))
    q, r = _udivmod(ctx, ux, d)
    q = _loaded(_select(ctx, neg, _loaded(_sub(ctx, (0, 0), _loaded(q))), _loaded(q)))
    return q, val(_pick(ctx, neg, val(_op(ctx, 0, r, Alu.subtract)), val(r))), neg


def _sign_word(ctx, r):
    """The high word of a remainder in (-2**31, 2**31): its sign extension."""
    t = _t(ctx)
    nisa.tensor_scalar(t, val(r).full, Alu.right_shift, 31, engine=G)
    return t


@kernel(tunables=_TUNE)
def floor_divide(input, divisor, tile_bytes=TILE_BYTES[0]):
    """floor(input / divisor) of int64 values by a Python int divisor in [1, DIV_MAX] (exact)."""
    d = _check_divisor(divisor)
    return _run("floor_divide64", [input], lambda ctx, c, w: _floor_parts(ctx, w[0], d)[0], True, tile_bytes, 60)


@kernel(tunables=_TUNE)
def remainder(input, divisor, tile_bytes=TILE_BYTES[0]):
    """input mod divisor in [0, divisor) (torch.remainder) of int64 values by a Python int in [1, DIV_MAX]."""
    d = _check_divisor(divisor)

    def body(ctx, c, w):
        r = _floor_parts(ctx, w[0], d)[1]
        return r, _sign_word(ctx, r)

    return _run("remainder64", [input], body, True, tile_bytes, 60)


@kernel(tunables=_TUNE)
def trunc_divide(input, divisor, tile_bytes=TILE_BYTES[0]):
    """trunc(input / divisor) of int64 values by a Python int divisor in [1, DIV_MAX] (exact)."""
    d = _check_divisor(divisor)
    return _run("trunc_divide64", [input], lambda ctx, c, w: _trunc_parts(ctx, w[0], d)[0], True, tile_bytes, 70)


@kernel(tunables=_TUNE)
def fmod(input, divisor, tile_bytes=TILE_BYTES[0]):
    """fmod(input, divisor) (the sign of input) of int64 values by a Python int in [1, DIV_MAX] (exact)."""
    d = _check_divisor(divisor)

    def body(ctx, c, w):
        r = _trunc_parts(ctx, w[0], d)[1]
        return r, _sign_word(ctx, r)

    return _run("fmod64", [input], body, True, tile_bytes, 70)
