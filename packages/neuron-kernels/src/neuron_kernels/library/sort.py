"""Stable sort of rows (torch.sort / argsort semantics): a bitonic sorting network along the free dim.

Keys
----
Every element is ``S = D + 1`` *slots*: D key digits, most significant first, then its index, all exact in FP32
(the engines' arithmetic). A compare-exchange orders two elements by (digit 0, ..., digit D-1, index)
lexicographically: a total order without ties, so the network's result is exactly the stable sort.

- float32 / bfloat16 / float16 and bool / uint8 / int8 / int16: one digit, the value (FP32 buffers). -0.0 and 0.0
  tie, as in torch. NaN orders above +inf in both directions (torch's rule): its digit is +inf and its index is
  offset by n, so NaNs follow every +inf in index order; at the end the offset comes off (index mod n) and NaN
  positions get NaN back (the canonical NaN: payloads are not kept).
- int32: two digits, ``x >> 8`` (24-bit signed) and ``x & 255`` (int32 buffers; selects move bits exactly).
- int64, given as its int32 word array ``[B, n, 2]`` (lo, hi): three digits, ``hi >> 8``,
  ``(hi & 255) << 16 | lo >> 16 & 0xffff`` and ``lo & 0xffff``.

Descending sorts the order-reversed key with the same ascending network (-x for floats, NaN becoming -inf with
index offset -n so NaNs come first; ~x for integers) and undoes it at the end.

Network
-------
Bitonic sort in its "flip" form: stage s = 1..k (N = 2**k >= n) first compares i with its mirror in its block
of 2**s, then half-cleaners of strides 2**(s-2), ..., 1 compare i with i + d; every compare-exchange leaves the
smaller element at the lower index. k(k+1)/2 steps of n/2 compare-exchanges: n log^2 n per row.

Layouts (:func:`geometry` picks the cheaper by an estimate of VectorE and DMA time)
---------------------------------------------------------------------------------
- Rows on partitions (``q = 1``): each partition holds ``g`` whole rows (short rows pack several per partition,
  so instructions stay long). Rows are virtually padded to N with elements above everything: an exchange with
  such a partner never moves anything, so it is not issued, and a step costs only its real pairs. A step's pairs
  are affine: its full blocks are one access pattern ``[blocks, d]`` (mirror partners with stride -1), its last
  partial block one more; elements without a partner are copied across.
- Rows across partitions (``q`` = 2..128 partitions per row, ``m = N / q`` elements each, a power of two; the
  row is padded to N with sentinels above everything, index >= N): few or long rows use every partition. Steps
  whose blocks fit ``m`` run inside the partitions as above; the others pair partition p with p ^ delta (or its
  mirror in a block of partitions, with the free dim reversed): the tile goes out to an HBM scratch and comes
  back in the partner order (two DMAs whose patterns step over partition blocks, long runs), and each partition
  keeps the min or the max of itself and its partner by the per-partition flag ``p & delta``.

Per compare-exchange group of C pairs:

1. ``cmp = lo > hi`` over all S slots (one VectorE instruction, [P, S, C]), beside it ``eq = lo == hi`` over the
   D digits on GpSimd;
2. ``swap = cmp[index]``, then for each digit from the last: ``swap = select(eq[j], swap, cmp[j])``;
3. new lo = ``select(swap, hi, lo)``, new hi = ``select(swap, lo, hi)`` over all S slots (swap broadcast; select
   is VectorE's).

In-partition steps ping-pong between two buffers, so new values never overwrite ones still to be read. Cost
per step about ``(6S + 2D) C`` VectorE cycles.

Limits: rows of at most :func:`max_row` elements (a partition holds both buffers and the masks of ``m``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuron_hal import Alu, DType

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View

__all__ = ["sort", "max_row", "key_digits", "network", "geometry", "Geometry"]

F32, I32, I64, U8 = DType.float32, DType.int32, DType.int64, DType.uint8
INF = float("inf")
INT_SENTINEL = float(1 << 24)  # above every integer digit (the top digit is 24-bit signed)
FLOAT_KEYS = nl.COMPUTE_FLOATS
SMALL_INTS = (DType.bool_, DType.uint8, DType.int8, DType.int16)
MIN_SEGMENT = 64  # shortest per-partition share of a row spread across partitions (DMA runs of >= 256 bytes)
ALIGN_SLACK = 4096  # SBUF bytes per partition left to the allocator's alignment and the flag columns


def key_digits(dtype: DType, words: bool = False) -> int:
    """Key digits D of a dtype (``words``: the int32 word array of int64)."""
    if words:
        return 3
    if dtype in FLOAT_KEYS or dtype in SMALL_INTS:
        return 1
    if dtype is I32:
        return 2
    raise KernelError(f"sort: rows of {dtype} are not supported (floats of at most 32 bits, integers of at most 32 "
                      "bits, or int64 as its int32 word array [B, n, 2])")


def _segment_max(digits: int, profile) -> int:
    """Most elements one partition holds: two [S, seg] 4-byte buffers and uint8 masks of seg compares."""
    s = digits + 1
    per = 2 * s * 4 + (s + digits + 1)
    return min((profile.sbuf_partition_bytes - ALIGN_SLACK) // per, profile.free_stride_max // s)


def _pow2_floor(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def max_row(dtype: DType, profile, words: bool = False) -> int:
    """The longest row the kernel sorts: 128 partitions of the longest power-of-two segment."""
    return max_row_of(key_digits(dtype, words), profile)


def max_row_of(digits: int, profile) -> int:
    return profile.pmax * _pow2_floor(_segment_max(digits, profile))


# -- the network ----------------------------------------------------------------------------------------
def network(n: int):
    """The steps sorting n elements: ("flip", h) mirrors within blocks of 2h, ("half", d) pairs i with i + d."""
    k = max(0, (n - 1).bit_length())
    for s in range(1, k + 1):
        yield "flip", 1 << (s - 1)
        for j in range(s - 2, -1, -1):
            yield "half", 1 << j


@dataclass(frozen=True)
class Pairs:
    """One affine group of a step's pairs, in row elements: lo at ``lo + sum(i_k * stride_k)`` over ``dims``,
    its partner at ``hi`` with ``hdims`` (the same sizes)."""

    lo: int
    hi: int
    dims: tuple[tuple[int, int], ...]
    hdims: tuple[tuple[int, int], ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.dims)


def plan_step(kind: str, size: int, n: int) -> tuple[list[Pairs], list[tuple[int, int]]]:
    """(pair groups, element ranges (start, length) without a partner) of one step on a row of n, the row
    virtually padded with elements above everything."""
    block = 2 * size
    nb, s0 = n // block, (n // block) * block
    m = n - s0
    groups, idle = [], []
    if nb:
        if kind == "half":
            dims = ((nb, block), (size, 1))
            groups.append(Pairs(0, size, dims, dims))
        else:
            groups.append(Pairs(0, block - 1, ((nb, block), (size, 1)), ((nb, block), (size, -1))))
    if m > size:  # the partial block holds m - size pairs
        if kind == "half":
            groups.append(Pairs(s0, s0 + size, ((m - size, 1),), ((m - size, 1),)))
            idle.append((s0 + m - size, block - m))
        else:  # lower t in [block - m, size) mirrors upper s0 + block - 1 - t
            groups.append(Pairs(s0 + block - m, s0 + m - 1, ((m - size, 1),), ((m - size, -1),)))
            idle.append((s0, block - m))
    elif m:
        idle.append((s0, m))
    return groups, [r for r in idle if r[1] > 0]


# -- layout ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """How rows of n sit in a tile: ``g`` rows of ``m = n`` per partition (``q = 1``), or one row over ``q``
    partitions of ``m`` (a power of two, ``q * m >= n``)."""

    n: int
    m: int
    q: int
    g: int

    @property
    def seg(self) -> int:
        """Elements per slot per partition."""
        return self.g * self.m

    @property
    def padded(self) -> bool:
        """Rows spread over partitions end in sentinels."""
        return self.q > 1 and self.n < self.q * self.m

    @property
    def rows_per_tile(self) -> int:
        return 128 * self.g if self.q == 1 else 128 // self.q

    @property
    def length(self) -> int:
        """The network's length: n (virtual padding) or q * m (sentinels)."""
        return self.n if self.q == 1 else self.q * self.m

    def steps(self):
        """("in", kind, size) within partitions or ("cross", kind, partitions per block) across them."""
        for kind, size in network(self.length):
            if self.q == 1 or 2 * size <= self.m:
                yield "in", kind, size
            else:
                yield "cross", kind, 2 * size // self.m


def _estimate_ns(geo: Geometry, rows: int, digits: int, profile) -> float:
    """Device time estimate: VectorE cycles of the compare-exchanges (floored at MIN_II, plus the dependent-issue
    drain per instruction; GpSimd's digit compares overlap them) and the two DMAs of each cross-partition step,
    times the tiles."""
    s, d = digits + 1, digits
    drain = max(0, profile.vector_dependent_cycles - profile.min_ii)
    cycles, dma = 0.0, 0.0
    for where, kind, size in geo.steps():
        if where == "in":
            c = sum(math.prod(g.sizes) for g in plan_step(kind, size, geo.m)[0]) * geo.g
            elems = (2 * s, *([2] * d), 2 * s, 2 * s)
        else:
            c = geo.m
            elems = (2 * s, *([2] * d), 1, 2 * s)
            nbytes = min(rows, geo.rows_per_tile) * geo.q * s * geo.m * 4
            dma += 2 * (profile.dma_fixed_ns + nbytes / profile.dma_bytes_per_ns)
        cycles += sum(max(profile.min_ii, e * c) + drain for e in elems)
    tiles = -(-rows // geo.rows_per_tile)
    return tiles * (cycles / profile.vector_ghz + dma)


def geometry(rows: int, n: int, digits: int, profile) -> Geometry:
    """The cheaper layout for ``rows`` rows of ``n`` by :func:`_estimate_ns`."""
    seg_max = _segment_max(digits, profile)
    options = []
    if n <= seg_max:
        g = max(1, min(seg_max // max(n, 1), -(-rows // profile.pmax)))
        options.append(Geometry(n, n, 1, g))
    big = 1 << max(0, (n - 1).bit_length())
    for a in range(1, 8):
        q, m = 1 << a, big >> a
        if m < MIN_SEGMENT:
            break
        if m <= seg_max:
            options.append(Geometry(n, m, q, 1))
    if not options:
        raise KernelError(f"sort: rows of {n} elements exceed the {max_row_of(digits, profile)} the kernel sorts")
    return min(options, key=lambda geo: _estimate_ns(geo, rows, digits, profile))


# -- views ----------------------------------------------------------------------------------------------
def _v(buf: View, offset: int, dims, dtype=None) -> View:
    """A view of tile ``buf`` at element ``offset`` (from the tile's origin) with explicit dims."""
    return type(buf)(buf.owner, dtype or buf.dtype, buf.offset + offset, tuple(dims))


def _part(buf: View, p: int, p0: int = 0):
    """The partition dim of partitions p0 .. p0+p of ``buf``."""
    return (p, buf.dims[0][1]), buf.dims[0][1] * p0


def _slots(buf: View, p: int, geo: Geometry, first: int, count: int, offset: int, dims) -> View:
    """Slots ``first .. first+count`` of a [P, S * seg] buffer, every row of the partition, at row elements
    ``offset`` + ``dims``."""
    pdim, _ = _part(buf, p)
    return _v(buf, first * geo.seg + offset, (pdim, (count, geo.seg), (geo.g, geo.m), *dims))


def _flat(buf: View, p: int, start: int, length: int, dtype=None, stride: int = 1, p0: int = 0) -> View:
    """Elements ``start, start + stride, ...`` (``length`` of them) of partitions p0 .. p0+p."""
    pdim, base = _part(buf, p, p0)
    return _v(buf, base + start, (pdim, (length, stride)), dtype)


@dataclass
class _Masks:
    """uint8 tiles for the compares of one pair group: cmp [P, S, cmax], eq [P, D, cmax], swap [P, cmax]."""

    cmp: View
    eq: View
    swap: View
    cmax: int

    def of(self, t: View, p: int, first: int, count: int, sizes) -> View:
        """Slots ``first .. first+count`` of mask ``t`` shaped ``sizes`` (row-major), like the operands it
        pairs with."""
        dims, step = [], 1
        for size in reversed(sizes):
            dims.append((size, step))
            step *= size
        pdim, _ = _part(t, p)
        return _v(t, first * self.cmax, (pdim, (count, self.cmax), *reversed(dims)))


def _decide(lo: View, hi: View, lo_d: View, hi_d: View, p: int, d: int, sizes, mk: _Masks) -> View:
    """The swap mask of a lexicographic compare: 1 where lo (all S slots; ``lo_d``: its D digits) orders above
    hi. Returns the swap view, shaped ``sizes``."""
    s = d + 1
    nisa.tensor_tensor(mk.of(mk.cmp, p, 0, s, sizes), lo, hi, Alu.greater)
    nisa.tensor_tensor(mk.of(mk.eq, p, 0, d, sizes), lo_d, hi_d, Alu.equal, engine=nisa.gpsimd_engine)
    swap = mk.of(mk.swap, p, 0, 1, sizes)
    prev = mk.of(mk.cmp, p, d, 1, sizes)  # the index compare decides ties of every digit
    for j in reversed(range(d)):
        nisa.select(swap, mk.of(mk.eq, p, j, 1, sizes), prev, mk.of(mk.cmp, p, j, 1, sizes))
        prev = swap
    return swap


def _wide(swap: View, s: int) -> View:
    """A swap mask broadcast over the S slots."""
    return _v(swap, 0, (swap.dims[0], (s, 0), *swap.dims[2:]))


def _exchange(src: View, dst: View, p: int, geo: Geometry, d: int, g: Pairs, mk: _Masks) -> None:
    """One in-partition pair group: compare, then both halves selected into ``dst``."""
    s, sizes = d + 1, (geo.g, *g.sizes)
    lo, hi = _slots(src, p, geo, 0, s, g.lo, g.dims), _slots(src, p, geo, 0, s, g.hi, g.hdims)
    swap = _decide(lo, hi, _slots(src, p, geo, 0, d, g.lo, g.dims), _slots(src, p, geo, 0, d, g.hi, g.hdims),
                   p, d, sizes, mk)
    wide = _wide(swap, s)
    nisa.select(_slots(dst, p, geo, 0, s, g.lo, g.dims), wide, hi, lo)
    nisa.select(_slots(dst, p, geo, 0, s, g.hi, g.hdims), wide, lo, hi)


def _in_step(a: View, b: View, p: int, geo: Geometry, d: int, kind: str, size: int, mk: _Masks) -> bool:
    """One step within the partitions, a -> b; False when it has no pairs (nothing is issued)."""
    groups, idle = plan_step(kind, size, geo.m)
    if not groups:
        return False
    for g in groups:
        _exchange(a, b, p, geo, d, g, mk)
    s = d + 1
    for start, length in idle:
        nisa.tensor_copy(_slots(b, p, geo, 0, s, start, ((length, 1),)), _slots(a, p, geo, 0, s, start, ((length, 1),)))
    return True


def _cross_step(x: View, y: View, scratch: View, p: int, geo: Geometry, d: int, kind: str, span: int,
                mk: _Masks, flags: View) -> None:
    """One step pairing partitions, in place in ``x``: ``y`` gets each partition's partner through the HBM
    scratch (half: p ^ span/2; flip: the mirror of p in its block of ``span`` partitions, read with the free dim
    reversed), then each partition keeps the smaller (lower partition) or the larger of the two elements."""
    s, m, length = d + 1, geo.m, (d + 1) * geo.seg
    nisa.dma_copy(scratch[0:p], _flat(x, p, 0, length))
    if kind == "half":
        delta = span // 2
        src = _v(scratch, delta * length, ((p // span, span * length), (2, -delta * length), (delta, length),
                                           (length, 1)))
    else:
        delta = span // 2
        src = _v(scratch, (span - 1) * length, ((p // span, span * length), (span, -length), (length, 1)))
    nisa.dma_copy(_flat(y, p, 0, length), src)
    mine = _slots(x, p, geo, 0, s, 0, ((m, 1),))
    step = 1 if kind == "half" else -1
    other = _slots(y, p, geo, 0, s, 0 if step == 1 else m - 1, ((m, step),))
    swap = _decide(mine, other, _slots(x, p, geo, 0, d, 0, ((m, 1),)),
                   _slots(y, p, geo, 0, d, 0 if step == 1 else m - 1, ((m, step),)), p, d, (1, m), mk)
    col = _flat(flags, p, delta.bit_length() - 1, 1)
    nisa.tensor_scalar(swap, swap, Alu.not_equal, col)  # upper partitions keep the larger element
    nisa.select(mine, _wide(swap, s), other, mine)


def _flags(q: int) -> View:
    """[128, log2 q] int32 columns: column j is 1 where partition p has bit j set (the upper partition of its
    pair at distance 2**j)."""
    bits = max(1, q.bit_length() - 1)
    p_idx = nl.ndarray((128, 1), I32, name="partition")
    nisa.iota(p_idx, (0,), channel_multiplier=1)
    flags = nl.ndarray((128, bits), I32, name="flags")
    for j in range(bits):
        nisa.tensor_scalar(flags[:, j:j + 1], p_idx, Alu.bitwise_and, 1 << j, op1=Alu.greater, operand1=0)
    return flags


# -- keys in, values out --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Kind:
    digits: int
    nan: bool  # float keys (NaN ordering)
    words: bool  # int64 word array
    dtype: DType  # the buffers' dtype

    @property
    def width(self) -> int:
        """HBM elements per row element (2 for int64 words)."""
        return 2 if self.words else 1


def _kind(x: View) -> _Kind:
    words = len(x.shape) == 3
    if words and (x.dtype is not I32 or x.shape[2] != 2):
        raise KernelError(f"sort: a 3-d input must be the int32 word array [B, n, 2] of int64 rows, got {x!r}")
    if not words and len(x.shape) != 2:
        raise KernelError(f"sort: x must be [B, n] rows (or an int64 word array [B, n, 2]), got {x!r}")
    d = key_digits(x.dtype, words)
    return _Kind(d, x.dtype in FLOAT_KEYS, words, I32 if (words or x.dtype is I32) else F32)


@dataclass(frozen=True)
class _Tile:
    """Rows r0 .. r0+rows of the input in one tile: ``p`` partitions, how they map to HBM."""

    r0: int
    rows: int
    p: int


def _tiles(geo: Geometry, rows: int):
    per = geo.rows_per_tile
    for r0 in range(0, rows, per):
        k = min(per, rows - r0)
        yield _Tile(r0, k, -(-k // geo.g) if geo.q == 1 else k * geo.q)


def _transfers(geo: Geometry, t: _Tile, width: int):
    """(partition, count, element offset in the partition, HBM row, element in the row, elements per
    partition): the DMAs between a tile's stage and rows r0.. of the [B, n * width] HBM rows."""
    n, w = geo.n, width
    if geo.q == 1:
        full, rem = divmod(t.rows, geo.g)
        if full:
            yield 0, full, 0, t.r0, 0, geo.g * n * w
        if rem:
            yield full, 1, 0, t.r0 + full * geo.g, 0, rem * n * w
        return
    qf, rem = divmod(n, geo.m)
    for r in range(t.rows):
        if qf:
            yield r * geo.q, qf, 0, t.r0 + r, 0, geo.m * w
        if rem:
            yield r * geo.q + qf, 1, 0, t.r0 + r, qf * geo.m * w, rem * w


def _hbm_part(x: View, row: int, start: int, parts: int, per: int, width: int) -> View:
    """``parts`` x ``per`` consecutive elements of the flattened rows from (row, start)."""
    flat_row = x.shape[1] * width
    return type(x)(x.owner, x.dtype, x.offset + row * flat_row + start, ((parts, per), (per, 1)))


def _load_stage(x: View, stage: View, geo: Geometry, t: _Tile, kind: _Kind) -> None:
    w = kind.width
    if geo.padded or t.rows % geo.g:
        nisa.memset(_flat(stage, t.p, 0, geo.seg * w), 0.0)  # padding: defined values (replaced by sentinels)
    for p0, parts, off, row, start, per in _transfers(geo, t, w):
        nisa.dma_copy(_flat(stage, parts, off, per, p0=p0), _hbm_part(x, row, start, parts, per, w))


def _store_rows(out: View, src: View, geo: Geometry, t: _Tile, width: int) -> None:
    for p0, parts, off, row, start, per in _transfers(geo, t, width):
        nisa.dma_copy(_hbm_part(out, row, start, parts, per, width), _flat(src, parts, off, per, p0=p0))


def _positions(idx: View, p: int, geo: Geometry) -> None:
    """idx = each element's position in its row."""
    if geo.q == 1:
        nisa.iota(_v(idx, 0, (idx.dims[0], (geo.g, geo.m), (geo.m, 1))), (0, 1))
    else:
        nisa.iota(idx, (1,), channel_multiplier=geo.m)
        nisa.tensor_scalar(idx, idx, Alu.mod, float(geo.q * geo.m))


def _digits(a: View, b: View, p: int, geo: Geometry, kind: _Kind, descending: bool) -> None:
    """Digits and indices into ``a`` from the staged rows at the start of ``b`` (whose rest is scratch)."""
    d, seg, n = kind.digits, geo.seg, geo.n
    idx = _flat(a, p, d * seg, seg)
    _positions(idx, p, geo)
    if kind.words:
        stage = _flat(b, p, 0, 2 * seg)
        if descending:
            nisa.tensor_scalar(stage, stage, Alu.bitwise_xor, -1)
        lo, hi = _flat(b, p, 0, seg, stride=2), _flat(b, p, 1, seg, stride=2)
        d0, d1, d2 = (_flat(a, p, j * seg, seg) for j in range(3))
        nisa.tensor_scalar(d0, hi, Alu.right_shift, 8)
        nisa.tensor_scalar(d2, lo, Alu.right_shift, 16, op1=Alu.bitwise_and, operand1=0xFFFF)
        nisa.tensor_scalar(d1, hi, Alu.bitwise_and, 255, op1=Alu.left_shift, operand1=16)
        nisa.tensor_tensor(d1, d1, d2, Alu.bitwise_or)
        nisa.tensor_scalar(d2, lo, Alu.bitwise_and, 0xFFFF)
    elif kind.dtype is I32:
        stage = _flat(b, p, 0, seg)
        if descending:
            nisa.tensor_scalar(stage, stage, Alu.bitwise_xor, -1)
        nisa.tensor_scalar(_flat(a, p, 0, seg), stage, Alu.right_shift, 8)
        nisa.tensor_scalar(_flat(a, p, seg, seg), stage, Alu.bitwise_and, 255)
    elif not kind.nan:  # small integers: exact in FP32, never NaN
        stage = _flat(b, p, 0, seg)
        nisa.tensor_scalar(_flat(a, p, 0, seg), stage, Alu.multiply, -1.0 if descending else 1.0)
    else:
        stage, ok = _flat(b, p, 0, seg), _flat(b, p, seg, seg)
        nisa.tensor_tensor(ok, stage, stage, Alu.equal)  # 0 for NaN
        if descending:
            nisa.tensor_scalar(stage, stage, Alu.multiply, -1.0)
        nisa.select(_flat(a, p, 0, seg), ok, stage, -INF if descending else INF)
        shift = -float(n) if descending else float(n)  # NaN: index + shift
        if geo.padded:  # the sentinels' test reads positions, not shifted indices
            nisa.tensor_scalar(_flat(b, p, 0, seg), idx, Alu.less, float(n))
        nisa.scalar_tensor_tensor(idx, ok, Alu.multiply, -shift, Alu.add, idx)
        nisa.tensor_scalar(idx, idx, Alu.add, shift)
    if geo.padded:
        _sentinels(a, b, p, geo, kind)


def _sentinels(a: View, b: View, p: int, geo: Geometry, kind: _Kind) -> None:
    """Positions >= n (the padding of a row spread over partitions): digits above every key, index + N."""
    d, seg = kind.digits, geo.seg
    idx = _flat(a, p, d * seg, seg)
    real = _flat(b, p, 0, seg)
    if not kind.nan:  # floats computed it from the positions before the NaN shift
        nisa.tensor_scalar(real, idx, Alu.less, float(geo.n))
    wide = _v(real, 0, (real.dims[0], (d, 0), (seg, 1)))
    digits = _v(a, 0, (real.dims[0], (d, seg), (seg, 1)))
    nisa.select(digits, wide, digits, INF if kind.dtype is F32 else INT_SENTINEL)
    big = float(geo.q * geo.m)
    nisa.scalar_tensor_tensor(idx, real, Alu.multiply, -big, Alu.add, idx)
    nisa.tensor_scalar(idx, idx, Alu.add, big)


def _results(f: View, o: View, p: int, geo: Geometry, kind: _Kind, descending: bool) -> tuple[View, View]:
    """(values, indices) [P, seg (x 2 for words)] views from the sorted buffer ``f`` (``o`` is scratch)."""
    d, seg, n = kind.digits, geo.seg, geo.n
    idx = _flat(f, p, d * seg, seg)
    if kind.words:
        lo, hi = _flat(o, p, 0, seg, stride=2), _flat(o, p, 1, seg, stride=2)
        d0, d1, d2 = (_flat(f, p, j * seg, seg) for j in range(3))
        t = _flat(o, p, 2 * seg, seg)
        nisa.tensor_scalar(hi, d0, Alu.left_shift, 8)
        nisa.tensor_scalar(t, d1, Alu.right_shift, 16)
        nisa.tensor_tensor(hi, hi, t, Alu.bitwise_or)
        nisa.tensor_scalar(lo, d1, Alu.bitwise_and, 0xFFFF, op1=Alu.left_shift, operand1=16)
        nisa.tensor_tensor(lo, lo, d2, Alu.bitwise_or)
        values = _flat(o, p, 0, 2 * seg)
        if descending:
            nisa.tensor_scalar(values, values, Alu.bitwise_xor, -1)
        return values, idx
    if kind.dtype is I32:
        values = _flat(o, p, 0, seg)
        nisa.tensor_scalar(values, _flat(f, p, 0, seg), Alu.left_shift, 8)
        nisa.tensor_tensor(values, values, _flat(f, p, seg, seg), Alu.bitwise_or)
        if descending:
            nisa.tensor_scalar(values, values, Alu.bitwise_xor, -1)
        return values, idx
    key = _flat(f, p, 0, seg)
    if descending:
        nisa.tensor_scalar(key, key, Alu.multiply, -1.0)
    if not kind.nan:
        return key, idx
    ok, values = _flat(o, p, 0, seg), _flat(o, p, seg, seg)
    nisa.tensor_scalar(ok, idx, Alu.greater_equal if descending else Alu.less, 0.0 if descending else float(n))
    nisa.select(values, ok, key, float("nan"))
    fixed = _flat(o, p, 0, seg, I32)
    nisa.tensor_scalar(fixed, idx, Alu.add, float(n), op1=Alu.mod, operand1=float(n))
    return values, fixed


@kernel
def sort(x, descending=False, int64_indices=False):
    """(values, indices) of the stable sort of each row of ``x`` [B, n] (or of the int64 rows of the int32 word
    array [B, n, 2]; values are then the sorted word array), ascending or ``descending``, NaN largest. Indices
    are int32, or int64 with ``int64_indices``."""
    kind = _kind(x)
    rows, n = x.shape[0], x.shape[1]
    values = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm, name="values")
    indices = nl.ndarray((rows, n), I64 if int64_indices else I32, buffer=nl.hbm, name="indices")
    if rows == 0 or n == 0:
        return values, indices
    prof = nl.profile()
    geo = geometry(rows, n, kind.digits, prof)
    d = kind.digits
    s, cmax = d + 1, geo.seg if geo.q > 1 else max(1, geo.seg // 2)
    flags = _flags(geo.q) if geo.q > 1 else None
    scratch = nl.ndarray((128, s * geo.seg), kind.dtype, buffer=nl.private_hbm, name="partners") \
        if geo.q > 1 else None
    for t in _tiles(geo, rows):
        a = nl.ndarray((128, s * geo.seg), kind.dtype, name="keys_a")
        b = nl.ndarray((128, s * geo.seg), kind.dtype, name="keys_b")
        mk = _Masks(nl.ndarray((128, s * cmax), U8, name="cmp"), nl.ndarray((128, d * cmax), U8, name="eq"),
                    nl.ndarray((128, cmax), U8, name="swap"), cmax)
        _load_stage(x, b, geo, t, kind)
        _digits(a, b, t.p, geo, kind, descending)
        for where, step_kind, size in geo.steps():
            if where == "in":
                if _in_step(a, b, t.p, geo, d, step_kind, size, mk):
                    a, b = b, a
            else:
                _cross_step(a, b, scratch, t.p, geo, d, step_kind, size, mk, flags)
        vals, idx = _results(a, b, t.p, geo, kind, descending)
        _store_rows(values, vals, geo, t, kind.width)
        _store_rows(indices, idx, geo, t, 1)
    return values, indices
