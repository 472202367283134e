"""Counter-based random numbers on the device, and dropout whose mask can be recomputed.

The generator
-------------
Every output element gets 32 random bits from its flat (row-major) index ``i`` and a state tensor
``seed = int32[2] = (seed, offset)`` that lives in HBM (so changing it never retraces a kernel)::

    c  = (offset + i) mod 2**32
    k0 = seed,  k1 = fmix32(seed ^ 0x9E3779B9)       # two 32-bit round keys
    x  = lowbias32(c ^ k0) ^ k1
    bits = fmix32(x)

``lowbias32`` (Wellons' "hash prospector" mixer: x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
x *= 0x846ca68b; x ^= x >> 16) and ``fmix32`` (MurmurHash3's finalizer: shifts 16/13/16, multipliers
0x85ebca6b and 0xc2b2ae35) are bijections of 32-bit words built only from xor, logical right shift and
wrapping 32-bit multiplication, which the ISA computes exactly: multiplications on GpSimd (integer mode
wraps), shifts and xors on VectorE or GpSimd (bitwise ops act on 32-bit patterns on any engine). No
multiply-high is needed (Philox needs one).

Quality, stated plainly: this is a keyed two-round integer hash of a counter, not a cryptographic or a
BigCrush-certified generator. Both rounds are well-studied full-avalanche mixers (lowbias32 came out of
Wellons' hash-prospector search for low-bias two-multiply 32-bit mixers; fmix32 is MurmurHash3's
finalizer), the second round takes a second key derived from the seed, and for one key the map from
counter to bits is a bijection, so a stream never repeats within 2**32 counters. The tests check what dropout
and initialization need: uniformity (chi-square over 256 bins), per-bit balance, lag-1 serial
correlation, and the correlation between streams of neighbouring seeds and of distant offsets. Counters
wrap after 2**32 elements per (seed, offset).

Speed: the generator costs ~17 instructions per element, split between VectorE (shifts, some xors)
and GpSimd (multiplies, other xors); each tile is cut into column pieces whose instruction chains are
issued staggered, so the two engines overlap. It is engine bound: dropout of 16 MiB of float32 takes
~550 us on trn2 (~19% of its DMA roofline), ``rand`` ~490 us.

Uniform floats use the top bits: ``u = (bits >> (32 - m)) * 2**-m`` with m = 24 for float32, 8 for
bfloat16 and 11 for float16, so u is exact in the output dtype and always in [0, 1).

Dropout keeps an element when ``(bits >> 8) >= round(p * 2**24)`` (so P(keep) = 1 - p to 2**-24) and
scales kept values by 1 / (1 - p), as ``torch.nn.functional.dropout``; the mask is a function of
(seed, offset, index) alone, so backward can recompute it (:func:`dropout_mask`) instead of storing it.
The caller advances ``offset`` by the number of elements drawn (``numel``) between calls.
"""

from __future__ import annotations

import numpy as np

from neuron_hal import Act, Alu, DType, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View
from . import elementwise as ew
from . import promote

__all__ = ["rand", "random_bits", "dropout", "dropout_mask", "dropout_backward", "random_bits_reference",
           "rand_reference", "GOLDEN", "LOWBIAS32", "FMIX32"]

U32, I32, F32, BOOL = DType.uint32, DType.int32, DType.float32, DType.bool_
VECTOR, GPSIMD = Engine.VECTOR, Engine.GPSIMD
GOLDEN = 0x9E3779B9
LOWBIAS32 = ((16, 0x7FEB352D), (15, 0x846CA68B), 16)  # (shift, multiplier), (shift, multiplier), shift
FMIX32 = ((16, 0x85EBCA6B), (13, 0xC2B2AE35), 16)
_MANTISSA = {DType.float32: 24, DType.bfloat16: 8, DType.float16: 11}
KEEP_BITS = 24  # dropout compares the top 24 bits with round(p * 2**24)


# ================================================================================================
# Host reference (numpy), bit exact with the kernels
# ================================================================================================
def _mix_np(x: np.ndarray, mixer) -> np.ndarray:
    (s1, m1), (s2, m2), s3 = mixer
    x = x.astype(np.uint64)
    x ^= x >> np.uint64(s1)
    x = (x * np.uint64(m1)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(s2)
    x = (x * np.uint64(m2)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(s3)
    return x.astype(np.uint32)


def random_bits_reference(n: int, seed: int, offset: int = 0) -> np.ndarray:
    """The generator's first ``n`` uint32 words for (seed, offset), on the host."""
    seed = np.uint32(np.int64(seed) & 0xFFFFFFFF)
    k1 = _mix_np(np.array([seed ^ np.uint32(GOLDEN)], np.uint32), FMIX32)[0]
    c = ((np.arange(n, dtype=np.uint64) + np.uint64(np.int64(offset) & 0xFFFFFFFF)) & np.uint64(0xFFFFFFFF))
    x = _mix_np(c.astype(np.uint32) ^ seed, LOWBIAS32) ^ k1
    return _mix_np(x, FMIX32)


def rand_reference(shape, seed: int, offset: int = 0, dtype=DType.float32) -> np.ndarray:
    """Uniform [0, 1) values of ``dtype`` as :func:`rand` makes them."""
    dt = DType.of(dtype)
    m = _MANTISSA[dt]
    bits = random_bits_reference(int(np.prod(shape, dtype=np.int64)), seed, offset)
    u = (bits >> np.uint32(32 - m)).astype(np.float64) * 2.0 ** -m
    return u.astype(dt.numpy).reshape(shape)


# ================================================================================================
# Device
# ================================================================================================
def _seed_cols(seed: View) -> tuple[View, View, View]:
    """[P, 1] uint32 tiles of k0 (the seed), the offset, and k1, replicated on every partition."""
    if not isinstance(seed, View) or seed.on_chip:
        raise KernelError("random: seed must be an HBM int32 tensor [seed, offset]")
    if seed.dtype not in (I32, U32) or seed.shape != (2,):
        raise KernelError(f"random: seed must be an int32 tensor of shape [2] = (seed, offset), got "
                          f"{list(seed.shape)} {seed.dtype}")
    P = nl.tile_size.pmax
    st = nl.ndarray((P, 2), U32, name="seed")
    # replicated on every partition; the int32 -> uint32 DMA cast keeps the bits
    nisa.dma_copy(st, type(seed)(seed.owner, seed.dtype, seed.offset, ((P, 0), (2, 1))))
    k0, off = st[:, 0:1], st[:, 1:2]
    k1 = nl.ndarray((P, 1), U32, name="key")
    nisa.tensor_scalar(k1, k0, Alu.bitwise_xor, GOLDEN, engine=GPSIMD)
    _run(_chain(k1, k1, FMIX32, (GPSIMD, GPSIMD, GPSIMD)))
    return k0, off, k1


def _chain(dst: View, x: View, mixer, xor_engines, last_key: View | None = None):
    """Emit dst = mixer(x) [^ last_key], one instruction per step (a generator, so pieces can interleave).

    Shifts run on VectorE, multiplies on GpSimd (exact, wrapping to 32 bits), the three ``x ^= x >> s``
    xors on ``xor_engines`` (bitwise ops are exact on either engine), chosen to balance the two.
    """
    (s1, m1), (s2, m2), s3 = mixer
    for (shift, mult), eng in zip(((s1, m1), (s2, m2)), xor_engines):
        t = _ts(x, Alu.right_shift, shift, VECTOR)
        yield
        y = nl.ndarray(x.shape, U32, name="rng_x")
        nisa.tensor_tensor(y, x, t, Alu.bitwise_xor, engine=eng)
        yield
        x = _ts(y, Alu.multiply, mult, GPSIMD)
        yield
    t = nl.ndarray(x.shape, U32, name="rng_t")
    if last_key is None:
        nisa.tensor_scalar(t, x, Alu.right_shift, s3, engine=VECTOR)
    else:  # (x >> s3) ^ key, so the final xor also applies the next round's key
        nisa.tensor_scalar(t, x, Alu.right_shift, s3, op1=Alu.bitwise_xor, operand1=last_key, engine=VECTOR)
    yield
    nisa.tensor_tensor(dst, x, t, Alu.bitwise_xor, engine=xor_engines[2])
    yield


def _ts(x: View, op: Alu, operand, engine) -> View:
    t = nl.ndarray(x.shape, U32, name="rng_t")
    nisa.tensor_scalar(t, x, op, operand, engine=engine)
    return t


def _run(gen) -> None:
    for _ in gen:
        pass


def _interleave(gens) -> None:
    """Emit several instruction chains staggered by one step (piece j does step s at round s + j), so while
    one engine runs a step of one piece, the other engine runs the neighbouring step of the next piece."""
    pending, active = list(gens), []
    while pending or active:
        if pending:
            active.append(pending.pop(0))
        for g in list(active):
            try:
                next(g)
            except StopIteration:
                active.remove(g)


PIECES = 4  # column pieces per tile whose instruction chains interleave across VectorE and GpSimd
_MIN_PIECE = 512  # elements per partition below which a tile is not split (the 64-cycle instruction floor)


def _generate(ctx: ew.TileCtx, keys, tail, bits_out: View | None = None) -> None:
    """Make the generator's words for this tile (into ``bits_out`` when given) and hand each column piece to
    ``tail(a, b, bits)``, a generator emitting what consumes columns a:b."""
    k0, off, k1 = keys
    p, f = ctx.partitions, ctx.free_size
    c = nl.ndarray((p, f), U32, name="rng_c")
    nisa.iota(c, [1], offset=ctx.out_offset, channel_multiplier=ctx.pstride)
    n = PIECES if f >= PIECES * _MIN_PIECE else 1
    cuts = [f * i // n for i in range(n + 1)]

    def piece(a, b):
        x = nl.ndarray((p, b - a), U32, name="rng_x")
        nisa.tensor_scalar(x, c[:, a:b], Alu.add, off[0:p], op1=Alu.bitwise_xor, operand1=k0[0:p], engine=GPSIMD)
        yield
        y = nl.ndarray((p, b - a), U32, name="rng_x")
        yield from _chain(y, x, LOWBIAS32, (GPSIMD, GPSIMD, VECTOR), last_key=k1[0:p])
        bits = nl.ndarray((p, b - a), U32, name="rng_bits") if bits_out is None else bits_out[:, a:b]
        yield from _chain(bits, y, FMIX32, (GPSIMD, GPSIMD, VECTOR))
        yield from tail(a, b, bits)

    _interleave(piece(a, b) for a, b in zip(cuts, cuts[1:]))


def _bits(ctx: ew.TileCtx, keys) -> View:
    """The generator's uint32 words for this tile's elements, as a flat [P, F] tile."""
    out = nl.ndarray((ctx.partitions, ctx.free_size), U32, name="bits")
    _generate(ctx, keys, lambda a, b, bits: iter(()), out)
    return out


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)


@kernel(tunables={"tile_bytes": (8192, 4096, 16384)})
def random_bits(shape, seed, tile_bytes=8192):
    """uint32 words of the generator for every element of ``shape`` (row-major index), state ``seed``
    = int32[2] (seed, offset)."""
    shape = _shape(shape)
    keys = _seed_cols(seed)
    return ew.run_elementwise("random_bits", shape, [], [U32], lambda ctx, ins: [_bits(ctx, keys)], tile_bytes,
                              temps=4)[0]


@kernel(tunables={"tile_bytes": (8192, 4096, 16384)})
def rand(shape, seed, dtype=DType.float32, tile_bytes=8192):
    """Uniform [0, 1) values (torch.rand) of ``shape`` and float ``dtype``, from state ``seed`` = int32[2]."""
    shape, dt = _shape(shape), DType.of(dtype)
    if dt not in _MANTISSA:
        raise KernelError(f"rand: dtype must be float32, bfloat16 or float16, got {dt}")
    keys = _seed_cols(seed)
    m = _MANTISSA[dt]

    def body(ctx, ins):
        u = nl.ndarray((ctx.partitions, ctx.free_size), dt, name="rand")

        def tail(a, b, bits):
            top = _ts(bits, Alu.right_shift, 32 - m, GPSIMD)
            yield
            nisa.activation(u[:, a:b], Act.identity, top, scale=2.0 ** -m)  # exact: top < 2**m
            yield

        _generate(ctx, keys, tail)
        return [u]

    return ew.run_elementwise("rand", shape, [], [dt], body, tile_bytes, temps=4)[0]


def _threshold(p: float) -> int:
    if not 0.0 <= p <= 1.0:
        raise KernelError(f"dropout: p must be in [0, 1], got {p}")
    return int(np.round(p * 2.0 ** KEEP_BITS))


def _keep_tail(mask: View, thr: int):
    def tail(a, b, bits):
        nisa.tensor_scalar(mask[:, a:b], bits, Alu.right_shift, 32 - KEEP_BITS, op1=Alu.greater_equal, operand1=thr,
                           engine=VECTOR)
        yield
    return tail


def _keep(ctx, keys, thr: int) -> View:
    m = nl.ndarray((ctx.partitions, ctx.free_size), BOOL, name="mask")
    _generate(ctx, keys, _keep_tail(m, thr))
    return m


@kernel(tunables={"tile_bytes": (8192, 4096, 16384)})
def dropout(input, p, seed, train=True, tile_bytes=8192):
    """(output, mask) of dropout with probability ``p``: output = input * mask / (1 - p), mask a bool tensor
    from the counter-based generator with state ``seed`` = int32[2] (see the module docstring);
    ``train=False`` returns (input, all-true mask), as torch.native_dropout. ``p`` is a compile-time
    constant, the seed is data."""
    x = ew.operand(input, "dropout", "input")
    if x.is_scalar or promote.category(x.dtype) != 2:
        raise KernelError(f"dropout: input must be a floating-point tensor, got {input!r}")
    p = float(p)
    thr = _threshold(p)
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    dt = x.dtype
    keys = _seed_cols(seed) if train else None

    def body(ctx, ins):
        xin = ins[0]
        flat = (ctx.partitions, ctx.free_size)
        if not train:
            m = nl.ndarray(flat, BOOL, name="mask")
            nisa.memset(m, 1, engine=GPSIMD)
            out = nl.ndarray(ctx.shape, dt)
            nisa.tensor_copy(out, xin.full, engine=VECTOR)
            return [out, m]
        m = nl.ndarray(flat, BOOL, name="mask")
        out = ctx.result(dt, xin)
        o, xf = out.reshape(flat), xin.full.reshape(flat)
        keep = _keep_tail(m, thr)

        def tail(a, b, bits):
            yield from keep(a, b, bits)
            factor = nl.ndarray((flat[0], b - a), F32, name="factor")
            nisa.activation(factor, Act.identity, m[:, a:b], scale=scale)  # ScalarE is otherwise idle
            yield
            nisa.tensor_tensor(o[:, a:b], xf[:, a:b], factor, Alu.multiply, engine=VECTOR)
            yield

        _generate(ctx, keys, tail)
        return [out, m]

    return ew.run_elementwise("dropout", x.shape, [x], [dt, BOOL], body, tile_bytes, temps=5)


@kernel(tunables={"tile_bytes": (8192, 4096, 16384)})
def dropout_mask(shape, p, seed, tile_bytes=8192):
    """The bool keep-mask :func:`dropout` uses for ``shape``, ``p`` and state ``seed`` (for backward)."""
    shape = _shape(shape)
    thr = _threshold(float(p))
    keys = _seed_cols(seed)
    return ew.run_elementwise("dropout_mask", shape, [], [BOOL], lambda ctx, ins: [_keep(ctx, keys, thr)],
                              tile_bytes, temps=4)[0]


@kernel(tunables={"tile_bytes": ew.TILE_BYTES})
def dropout_backward(grad_output, mask, scale, tile_bytes=ew.TILE_BYTES[0]):
    """grad_output * mask * scale (torch.native_dropout_backward; scale = 1 / (1 - p))."""
    g, m = ew.operand(grad_output, "dropout_backward", "grad_output"), ew.operand(mask, "dropout_backward", "mask")
    if g.is_scalar or m.is_scalar or g.shape != m.shape:
        raise KernelError("dropout_backward: grad_output and mask must be tensors of the same shape")
    dt = g.dtype

    def body(ctx, ins):
        factor = ctx.tile(F32)
        nisa.tensor_scalar(factor, ins[1].full, Alu.not_equal, 0, op1=Alu.multiply, operand1=float(scale),
                           engine=GPSIMD)
        out = ctx.result(dt, ins[0])
        nisa.tensor_tensor(out, ins[0].full, factor, Alu.multiply, engine=VECTOR)
        return [out]

    return ew.run_elementwise("dropout_backward", g.shape, [g, m], [dt], body, tile_bytes, temps=1)[0]
