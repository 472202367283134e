"""float32 arange values as torch's CPU computes them through double, bit for bit, in exact integer
arithmetic on GpSimd (the engines have no double precision).

The caller scales every value to an integer: ``start = A * 2**q`` and ``step = K * 2**q`` (q the lowest set
bit of either), so every double the CPU forms on the way is an integer multiple of 2**q too, and its
rounding to 53 (double) or 24 (float) significant bits is a rounding of a 64-bit integer (two int32 words,
the arithmetic of :mod:`.wide_int`) at a bit position that depends on the value's bit length. Rounding to
nearest even is ``t = |x| + (2**(d-1) - 1) + bit_d(|x|)`` with its low d bits cleared (d = dropped bits).

Elements of one launch are a region of the CPU loop (``torch``'s arange kernel, see the caller):
- ``width == 0`` (its scalar loop): value i is ``f32(f64(start + f64(step * i)))`` with ``i = first + l``;
- ``width == V`` (its vectorised loop, V lanes): lane j of the block at ``u = first + l - j`` is
  ``f32(f64(base + f64(j * step)))`` with ``base = f32(f64(start + f64(step * u)))``.
The caller guarantees ``|A| + |K| * (last index + V) < 2**62`` and that every nonzero result is a normal
float32 (``q >= -126``, values below 2**126), so nothing here can overflow or go subnormal.
The output (written in place) is the float32 bit patterns (int32).
"""

from __future__ import annotations

from neuron_hal import Alu, DType, Engine

from .. import isa as nisa
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View
from .elementwise import TILE_BYTES, Operand, Tiler, emit, val
from .wide_int import _add, _mulhi_u, _op, _pick, _s32, _select, _sub, _t, _ult

__all__ = ["arange_f64", "arange_f32acc", "params", "LIMIT", "PARAMS"]

I32, U8, F32 = DType.int32, DType.uint8, DType.float32
G = Engine.GPSIMD
LIMIT = 2 ** 62  # bound on every scaled intermediate (module docstring)
PARAMS = ("a_lo", "a_hi", "k_lo", "k_hi", "first", "e0")  # the int32 words of ``params``


def _w(v: int) -> tuple[int, int]:
    """A Python int in the int64 range as its two words."""
    return _s32(v), _s32(v >> 32)


def _v(pair):
    return tuple(map(val, pair))


def _mul_index(ctx, u, kw):
    """u * K, the low 64 bits, for a nonnegative int32 tile u and K given as its two words."""
    lo = _op(ctx, u, kw[0], Alu.multiply)  # the int32 wrap of the exact product: its low word
    return val(lo), val(_op(ctx, _mulhi_u(ctx, u, kw[0]), _op(ctx, u, kw[1], Alu.multiply), Alu.add))


def _abs(ctx, x):
    neg = _op(ctx, x[1], 0, Alu.less, U8)
    return neg, _v(_select(ctx, neg, _v(_sub(ctx, (0, 0), x)), x))


def _bitlen(ctx, ax):
    """The bit length of a nonnegative 64-bit value (0 for 0): a binary search of shifts on its top word."""
    hz = _op(ctx, ax[1], 0, Alu.equal, U8)
    w = val(_pick(ctx, hz, ax[0], ax[1]))
    nz = _op(ctx, w, 0, Alu.not_equal)
    z = None
    for k in (16, 8, 4, 2, 1):
        small = _ult(ctx, w, 1 << (32 - k), I32)  # the top k bits of w are empty
        ks = _op(ctx, small, k, Alu.multiply)
        w = val(_op(ctx, w, ks, Alu.left_shift))
        z = ks if z is None else _op(ctx, z, ks, Alu.add)
    top = _op(ctx, _op(ctx, hz, -32, Alu.multiply), 64, Alu.add)  # 64, or 32 when the high word is 0
    return _op(ctx, _op(ctx, top, z, Alu.subtract), nz, Alu.multiply)


def _shifts(ctx, d):
    """(min(d, 31), max(d - 32, 0), d >= 32 as 0/1) for a per-element shift d in [0, 63]."""
    dlo = _op(ctx, d, 31, Alu.min)
    dhi = _op(ctx, _op(ctx, d, 32, Alu.subtract), 0, Alu.max)
    return dlo, dhi, _op(ctx, d, 31, Alu.greater)


def _round(ctx, x, bits: int):
    """x (signed, |x| < 2**62) rounded to ``bits`` significant bits, ties to even."""
    neg, ax = _abs(ctx, x)
    d = _op(ctx, _op(ctx, _bitlen(ctx, ax), bits, Alu.subtract), 0, Alu.max)
    dlo, dhi, big = _shifts(ctx, d)
    one_lo = _op(ctx, 1, dlo, Alu.left_shift)
    mask_lo = _op(ctx, _op(ctx, one_lo, 1, Alu.subtract), _op(ctx, 0, big, Alu.subtract), Alu.bitwise_or)
    mask_hi = _op(ctx, _op(ctx, _op(ctx, 1, dhi, Alu.left_shift), 1, Alu.subtract), big, Alu.multiply)
    # 2**(d-1) - 1 = mask >> 1 (64-bit, logical)
    t = _t(ctx)
    nisa.tensor_scalar(t, mask_lo, Alu.right_shift, 1, op1=Alu.bitwise_and, operand1=0x7FFFFFFF, engine=G)
    half_lo = _op(ctx, t, _op(ctx, mask_hi, 31, Alu.left_shift), Alu.bitwise_or)
    half_hi = _op(ctx, mask_hi, 1, Alu.right_shift)
    # bit d of |x| (0 when d = 0: nothing is dropped)
    b_lo = _op(ctx, _op(ctx, ax[0], dlo, Alu.right_shift), 1, Alu.bitwise_and)
    b_hi = _op(ctx, _op(ctx, ax[1], dhi, Alu.right_shift), 1, Alu.bitwise_and)
    lsb = _op(ctx, b_lo, _op(ctx, big, _op(ctx, b_hi, b_lo, Alu.subtract), Alu.multiply), Alu.add)
    lsb = _op(ctx, lsb, _op(ctx, d, 0, Alu.greater), Alu.multiply)
    bias = _v(_add(ctx, _v((half_lo, half_hi)), (val(lsb), 0)))
    s = _add(ctx, ax, bias)
    r = (_op(ctx, s[0], _op(ctx, mask_lo, -1, Alu.bitwise_xor), Alu.bitwise_and),
         _op(ctx, s[1], _op(ctx, mask_hi, -1, Alu.bitwise_xor), Alu.bitwise_and))
    return _v(_select(ctx, neg, _v(_sub(ctx, (0, 0), _v(r))), _v(r)))


def _pack(ctx, z, e0):
    """The float32 bits of z * 2**q, e0 = q + 125 (z rounded to 24 significant bits already; the result is
    normal or 0)."""
    neg, az = _abs(ctx, z)
    L = _bitlen(ctx, az)
    s = _op(ctx, L, 24, Alu.subtract)  # right shift of |z| onto the 24-bit significand (negative: left)
    left = _op(ctx, az[0], _op(ctx, _op(ctx, 0, s, Alu.subtract), 0, Alu.max), Alu.left_shift)
    sr = _op(ctx, _op(ctx, s, 1, Alu.max), 31, Alu.min)  # 0 < s < 32
    low = _op(ctx, _op(ctx, az[0], sr, Alu.right_shift),
              _op(ctx, _op(ctx, 1, _op(ctx, 32, sr, Alu.subtract), Alu.left_shift), 1, Alu.subtract),
              Alu.bitwise_and)
    mid = _op(ctx, low, _op(ctx, az[1], _op(ctx, 32, sr, Alu.subtract), Alu.left_shift), Alu.bitwise_or)
    high = _op(ctx, az[1], _op(ctx, _op(ctx, s, 32, Alu.subtract), 0, Alu.max), Alu.right_shift)
    m = _pick(ctx, _op(ctx, s, 0, Alu.greater, U8), mid, left)
    m = _pick(ctx, _op(ctx, s, 31, Alu.greater, U8), high, m)
    # bits = (E + 126) << 23 + m, E = L - 1 + q the exponent (m in [2**23, 2**24] carries into it)
    e = _op(ctx, _op(ctx, L, e0, Alu.add), 23, Alu.left_shift)
    bits = _op(ctx, e, m, Alu.add)
    bits = _op(ctx, bits, _op(ctx, neg, 31, Alu.left_shift), Alu.bitwise_or)
    return _op(ctx, bits, _op(ctx, L, 0, Alu.not_equal), Alu.multiply)  # zero: +0.0


def _product(ctx, k, u, exact: bool):
    """round53(K * u); ``exact``: the caller knows K * u has at most 53 significant bits (no rounding)."""
    p = _mul_index(ctx, u, k)
    return p if exact else _round(ctx, p, 53)


def _scaled_value(ctx, a, k, u, exact: bool):
    """round24(round53(A + round53(K * u))) for a nonnegative int32 index tile u."""
    return _round(ctx, _round(ctx, _v(_add(ctx, a, _product(ctx, k, u, exact))), 53), 24)


def _body(ctx, params, width: int, exact: bool):
    aw, kw, first, e0 = (params[0], params[1]), (params[2], params[3]), params[4], params[5]
    P, g = ctx.partitions, ctx.free_size
    l = _t(ctx)  # noqa: E741  the local index of each element
    nisa.iota(l.reshape(P, g), (1,), offset=ctx.out_offset, channel_multiplier=ctx.pstride)
    if not width:
        return [_pack(ctx, _scaled_value(ctx, aw, kw, _op(ctx, l, first, Alu.add), exact), e0)]
    j = _op(ctx, l, width - 1, Alu.bitwise_and)
    u = _op(ctx, _op(ctx, l, j, Alu.subtract), first, Alu.add)
    base = _scaled_value(ctx, aw, kw, u, exact)
    w = _product(ctx, kw, j, exact)
    return [_pack(ctx, _round(ctx, _round(ctx, _v(_add(ctx, base, w)), 53), 24), e0)]


def _param_operands(params) -> list[Operand]:
    if not isinstance(params, View) or params.dtype is not I32 or params.shape != (len(PARAMS),):
        raise KernelError(f"arange_f64: params must be an int32 tensor [{len(PARAMS)}] ({', '.join(PARAMS)}), "
                          f"got {params!r}")
    step = params.dims[0][1]
    return [Operand(View(params.owner, I32, params.offset + i * step, ()), None, I32, I32) for i in range(len(PARAMS))]


@kernel(tunables={"tile_bytes": TILE_BYTES})
def arange_f64(dst, params, width=0, exact_products=False, tile_bytes=TILE_BYTES[0]):
    """Write into the int32 tensor ``dst`` [n] the float32 bits of one region of torch's CPU arange (module
    docstring). ``params``: int32 [6], see :data:`PARAMS` (start = a * 2**q, step = k * 2**q, indices
    ``first + l``, ``e0 = q + 125``; data, so one program serves every start and step); ``width``: 0 (the
    scalar loop) or the vector lanes (a power of two); ``exact_products``: every ``step * index`` is exact in
    double (the caller's promise: K's significant bits plus the indices' bit length fit 53 bits), so those
    roundings are skipped."""
    if width < 0 or width & (width - 1):
        raise KernelError(f"arange_f64: width must be 0 or a power of two, got {width}")
    if not isinstance(dst, View) or dst.dtype is not I32 or len(dst.shape) != 1:
        raise KernelError(f"arange_f64: dst must be a 1-d int32 tensor, got {dst!r}")
    ops = _param_operands(params)
    body = lambda ctx, ins: _body(ctx, ins, int(width), bool(exact_products))  # noqa: E731
    # ~600 instructions per tile, few tiles live at once (the allocator reuses freed tiles): 32 sizes the tiles
    Tiler("arange_f64", dst.shape, ops, [I32], tile_bytes, 32).run(body, [dst])


def params(a: int, k: int, q: int, first: int) -> list[int]:
    """The ``params`` words for start = a * 2**q, step = k * 2**q (|a|, |k| < LIMIT, q >= -126) from index
    ``first``."""
    if not (abs(a) < LIMIT and abs(k) < LIMIT and -126 <= q and 0 <= first < 2 ** 31):
        raise KernelError(f"arange_f64: a={a}, k={k}, q={q}, first={first} out of range")
    return [*_w(a), *_w(k), first, q + 125]


# -- bfloat16 / float16: torch's CPU accumulates these in float32, which the VectorE computes as it does -------
@kernel(tunables={"tile_bytes": TILE_BYTES})
def arange_f32acc(dst, params, width=0, tile_bytes=TILE_BYTES[0]):
    """Write into the bfloat16/float16 tensor ``dst`` [n] one region of torch's CPU arange for those dtypes,
    whose accumulate type is float32: ``params`` float32 [3] = (start, step, first) as floats (first < 2**24);
    the scalar loop's value i is ``start + step * float(first + l)`` (each op rounded to float32, then once to
    dst's dtype); with ``width`` lanes, lane j is ``float(base) + float(j) * step`` with base the dtype's
    rounding of the value at the block's lane 0. Every op is one IEEE float32 op on the VectorE, as on the CPU."""
    if width < 0 or width & (width - 1):
        raise KernelError(f"arange_f32acc: width must be 0 or a power of two, got {width}")
    if not isinstance(dst, View) or dst.dtype not in (DType.bfloat16, DType.float16) or len(dst.shape) != 1:
        raise KernelError(f"arange_f32acc: dst must be a 1-d bfloat16 or float16 tensor, got {dst!r}")
    if not isinstance(params, View) or params.dtype is not F32 or params.shape != (3,):
        raise KernelError(f"arange_f32acc: params must be a float32 tensor [3] (start, step, first), got {params!r}")
    step = params.dims[0][1]
    ops = [Operand(View(params.owner, F32, params.offset + i * step, ()), None, F32, F32) for i in range(3)]

    def body(ctx, ins):
        start, step, first = ins
        P, g = ctx.partitions, ctx.free_size
        l = ctx.tile(F32)  # noqa: E741  local index (exact: below 2**24)
        nisa.iota(l.reshape(P, g), (1,), offset=ctx.out_offset, channel_multiplier=ctx.pstride)
        if not width:
            i = emit(ctx.tile(F32), l, first, Alu.add)
            return [emit(ctx.tile(dst.dtype), emit(ctx.tile(F32), i, step, Alu.multiply), start, Alu.add)]
        j = ctx.tile(F32)
        nisa.tensor_scalar(j, l, Alu.mod, float(width), engine=Engine.VECTOR)
        u = emit(ctx.tile(F32), emit(ctx.tile(F32), l, j, Alu.subtract), first, Alu.add)
        base = emit(ctx.tile(dst.dtype), emit(ctx.tile(F32), u, step, Alu.multiply), start, Alu.add)
        return [emit(ctx.tile(dst.dtype), base, emit(ctx.tile(F32), j, step, Alu.multiply), Alu.add)]

    Tiler("arange_f32acc", dst.shape, ops, [dst.dtype], tile_bytes, 8).run(body, [dst])
