"""Stable sort of rows (torch.sort / argsort semantics): a bitonic sorting network along the free dim.

Layout
------
Rows on partitions, 128 per tile, each row whole in its partition as ``S = D + 1`` *slots* of n elements
(a tile ``[P, S, n]``): D key digits, most significant first, then the element's index. A compare-exchange
orders two elements by (digit 0, ..., digit D-1, index) lexicographically: a total order without ties, so the
network's result is exactly the stable sort (equal keys keep their index order).

Keys (every digit is exact in FP32, the engines' arithmetic)
-----------------------------------------------------------
- float32 / bfloat16 / float16 and bool / uint8 / int8 / int16: one digit, the value (FP32 tile). -0.0 and 0.0
  tie, as in torch. NaN orders above +inf in both directions (torch's rule): its digit is +inf and its index
  is offset by n, so NaNs follow every +inf in index order; at the end the offset comes off (index mod n) and
  NaN positions get NaN back (the canonical NaN: payloads are not kept).
- int32: two digits, ``x >> 8`` (24-bit signed) and ``x & 255`` (int32 tile; selects move bits exactly).
- int64, given as its int32 word array ``[B, n, 2]`` (lo, hi): three digits, ``hi >> 8``,
  ``(hi & 255) << 16 | lo >> 16 & 0xffff`` and ``lo & 0xffff``.

Descending sorts the order-reversed key with the same ascending network (-x for floats, NaN becoming -inf with
index offset -n so NaNs come first; ~x for integers) and undoes it at the end.

Network
-------
Bitonic sort in its "flip" form: stage s = 1..k (N = 2**k >= n) first compares i with its mirror in its block
of 2**s, then half-cleaners of strides 2**(s-2), ..., 1 compare i with i + d; every compare-exchange leaves the
smaller element at the lower index. Rows are virtually padded to N with elements above everything: an exchange
with such a partner never moves anything, so it is not issued, and a step costs only its real pairs (at most
n/2). k(k+1)/2 steps of O(n) work: n log^2 n per row.

A step's pairs are affine: its full blocks are one access pattern ``[blocks, d]`` (mirror partners with
stride -1), its last partial block one more. Per group of C pairs, on VectorE:

1. ``cmp = lo > hi`` over all S slots (one instruction, [P, S, C]), ``eq = lo == hi`` over the D digits;
2. ``swap = cmp[index]``, then for each digit from the last: ``swap = select(eq[j], swap, cmp[j])``;
3. new lo = ``select(swap, hi, lo)``, new hi = ``select(swap, lo, hi)`` over all S slots (swap broadcast).

Steps ping-pong between two buffers, so new values never overwrite ones still to be read; elements without a
partner in a step are copied across. Cost per step: about ``(6S + 4D) C`` VectorE cycles.

Limits: rows of at most :func:`max_row` elements (both buffers and the masks in one partition's SBUF).
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_hal import Alu, DType

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View

__all__ = ["sort", "max_row", "key_digits", "network"]

F32, I32, U8 = DType.float32, DType.int32, DType.uint8
INF = float("inf")
FLOAT_KEYS = (DType.float32, DType.bfloat16, DType.float16)
SMALL_INTS = (DType.bool_, DType.uint8, DType.int8, DType.int16)


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


def _row_bytes(n: int, digits: int) -> int:
    """SBUF bytes per partition: two [S, n] 4-byte buffers and the uint8 masks of n/2 pairs."""
    s = digits + 1
    return 2 * s * n * 4 + (s + digits + 1) * max(1, n // 2)


def max_row(dtype: DType, profile, words: bool = False) -> int:
    """The longest row the kernel sorts (both buffers and the masks fit one partition's SBUF)."""
    d = key_digits(dtype, words)
    budget = profile.sbuf_partition_bytes - 4096  # alignment slack of the allocator
    per = 2 * (d + 1) * 4 + (2 * d + 2) / 2
    return min(int(budget // per), profile.free_stride_max)


# -- the network ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pairs:
    """One affine group of a step's pairs, in row elements: lo at ``lo + sum(i_k * stride_k)`` over ``dims``,
    its partner at ``hi`` with ``hdims`` (the same sizes)."""

    lo: int
    hi: int
    dims: tuple[tuple[int, int], ...]
    hdims: tuple[tuple[int, int], ...]

    @property
    def count(self) -> int:
        c = 1
        for s, _ in self.dims:
            c *= s
        return c


def network(n: int):
    """The steps sorting n elements: ("flip", h) mirrors within blocks of 2h, ("half", d) pairs i with i + d."""
    k = max(0, (n - 1).bit_length())
    for s in range(1, k + 1):
        yield "flip", 1 << (s - 1)
        for j in range(s - 2, -1, -1):
            yield "half", 1 << j


def plan_step(kind: str, size: int, n: int) -> tuple[list[Pairs], list[tuple[int, int]]]:
    """(pair groups, element ranges (start, length) without a partner) of one step on a row of n."""
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


# -- views ----------------------------------------------------------------------------------------------
def _slots(buf: View, p: int, n: int, first: int, count: int, offset: int, dims) -> View:
    """Slots ``first .. first+count`` of a [P, S * n] buffer at row elements ``offset`` + ``dims``."""
    return type(buf)(buf.owner, buf.dtype, buf.offset + first * n + offset,
                     ((p, buf.dims[0][1]), (count, n)) + tuple(dims))


def _row(buf: View, p: int, start: int, length: int, dtype=None, stride: int = 1) -> View:
    """Elements ``start, start + stride, ...`` (``length`` of them) of each of the first p partitions."""
    return type(buf)(buf.owner, dtype or buf.dtype, buf.offset + start, ((p, buf.dims[0][1]), (length, stride)))


@dataclass
class _Masks:
    """uint8 [P, S, C], [P, D, C] and [P, C] tiles for the compares of one pair group."""

    cmp: View
    eq: View
    swap: View
    cmax: int

    def of(self, t: View, p: int, first: int, count: int, g: Pairs) -> View:
        """Slots ``first .. first+count`` of mask ``t`` shaped like the group's pairs (row-major), so every
        operand of an instruction has the same shape."""
        sizes = [size for size, _ in g.dims]
        dims, step = [], 1
        for size in reversed(sizes):
            dims.append((size, step))
            step *= size
        return type(t)(t.owner, t.dtype, t.offset + first * self.cmax,
                       ((p, t.dims[0][1]), (count, self.cmax), *reversed(dims)))


def _exchange(src: View, dst: View, p: int, n: int, d: int, g: Pairs, mk: _Masks) -> None:
    """One pair group: the lexicographic compare of its S slots, then both halves selected into ``dst``."""
    s = d + 1
    lo, hi = _slots(src, p, n, 0, s, g.lo, g.dims), _slots(src, p, n, 0, s, g.hi, g.hdims)
    cmp, eq = mk.of(mk.cmp, p, 0, s, g), mk.of(mk.eq, p, 0, d, g)
    nisa.tensor_tensor(cmp, lo, hi, Alu.greater)
    nisa.tensor_tensor(eq, _slots(src, p, n, 0, d, g.lo, g.dims), _slots(src, p, n, 0, d, g.hi, g.hdims), Alu.equal)
    swap = mk.of(mk.swap, p, 0, 1, g)
    prev = mk.of(mk.cmp, p, d, 1, g)  # the index compare decides ties of every digit
    for j in reversed(range(d)):
        nisa.select(swap, mk.of(mk.eq, p, j, 1, g), prev, mk.of(mk.cmp, p, j, 1, g))
        prev = swap
    wide = type(swap)(swap.owner, swap.dtype, swap.offset, ((p, swap.dims[0][1]), (s, 0), *swap.dims[2:]))
    nisa.select(_slots(dst, p, n, 0, s, g.lo, g.dims), wide, hi, lo)
    nisa.select(_slots(dst, p, n, 0, s, g.hi, g.hdims), wide, lo, hi)


def _run_network(a: View, b: View, p: int, n: int, d: int, mk: _Masks) -> tuple[View, View]:
    """Every step of the network, ping-ponging a -> b; (the buffer holding the result, the other)."""
    s = d + 1
    for kind, size in network(n):
        groups, idle = plan_step(kind, size, n)
        if not groups:
            continue
        for g in groups:
            _exchange(a, b, p, n, d, g, mk)
        for start, length in idle:
            nisa.tensor_copy(_slots(b, p, n, 0, s, start, ((length, 1),)), _slots(a, p, n, 0, s, start, ((length, 1),)))
        a, b = b, a
    return a, b


# -- keys in, values out --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Kind:
    digits: int
    nan: bool  # float keys (NaN ordering)
    words: bool  # int64 word array
    dtype: DType  # the buffers' dtype


def _kind(x: View) -> _Kind:
    words = len(x.shape) == 3
    if words and (x.dtype is not I32 or x.shape[2] != 2):
        raise KernelError(f"sort: a 3-d input must be the int32 word array [B, n, 2] of int64 rows, got {x!r}")
    if not words and len(x.shape) != 2:
        raise KernelError(f"sort: x must be [B, n] rows (or an int64 word array [B, n, 2]), got {x!r}")
    d = key_digits(x.dtype, words)
    return _Kind(d, x.dtype in FLOAT_KEYS, words, I32 if (words or x.dtype is I32) else F32)


def _load_keys(x: View, r0: int, p: int, n: int, a: View, b: View, kind: _Kind, descending: bool) -> None:
    """Digits and indices of rows r0 .. r0+p into slots of ``a`` (``b`` is scratch)."""
    d = kind.digits
    idx = _row(a, p, d * n, n)
    nisa.iota(idx, (1,))
    if kind.words:
        stage = _row(b, p, 0, 2 * n)
        nisa.dma_copy(stage, x[r0:r0 + p].reshape(p, 2 * n))
        if descending:
            nisa.tensor_scalar(stage, stage, Alu.bitwise_xor, -1)
        lo, hi = _row(b, p, 0, n, stride=2), _row(b, p, 1, n, stride=2)
        d0, d1, d2 = (_row(a, p, j * n, n) for j in range(3))
        nisa.tensor_scalar(d0, hi, Alu.right_shift, 8)
        nisa.tensor_scalar(d2, lo, Alu.right_shift, 16, op1=Alu.bitwise_and, operand1=0xFFFF)
        nisa.tensor_scalar(d1, hi, Alu.bitwise_and, 255, op1=Alu.left_shift, operand1=16)
        nisa.tensor_tensor(d1, d1, d2, Alu.bitwise_or)
        nisa.tensor_scalar(d2, lo, Alu.bitwise_and, 0xFFFF)
        return
    if kind.dtype is I32:
        stage = _row(b, p, 0, n)
        nisa.dma_copy(stage, x[r0:r0 + p])
        if descending:
            nisa.tensor_scalar(stage, stage, Alu.bitwise_xor, -1)
        nisa.tensor_scalar(_row(a, p, 0, n), stage, Alu.right_shift, 8)
        nisa.tensor_scalar(_row(a, p, n, n), stage, Alu.bitwise_and, 255)
        return
    key = _row(a, p, 0, n)
    if not kind.nan:  # small integers: exact in FP32, never NaN
        nisa.dma_copy(key, x[r0:r0 + p])
        if descending:
            nisa.tensor_scalar(key, key, Alu.multiply, -1.0)
        return
    stage, ok = _row(b, p, 0, n), _row(b, p, n, n)
    nisa.dma_copy(stage, x[r0:r0 + p])
    nisa.tensor_tensor(ok, stage, stage, Alu.equal)  # 0 for NaN
    if descending:
        nisa.tensor_scalar(stage, stage, Alu.multiply, -1.0)
    nisa.select(key, ok, stage, -INF if descending else INF)
    shift = -float(n) if descending else float(n)  # NaN: index + shift
    nisa.scalar_tensor_tensor(idx, ok, Alu.multiply, -shift, Alu.add, idx)
    nisa.tensor_scalar(idx, idx, Alu.add, shift)


def _store(values: View, indices: View, r0: int, p: int, n: int, f: View, o: View, kind: _Kind,
           descending: bool) -> None:
    """Rows r0 .. r0+p of the results from the sorted buffer ``f`` (``o`` is scratch)."""
    d = kind.digits
    idx = _row(f, p, d * n, n)
    out_rows = values[r0:r0 + p]
    if kind.words:
        stage = _row(o, p, 0, 2 * n)
        lo, hi = _row(o, p, 0, n, stride=2), _row(o, p, 1, n, stride=2)
        d0, d1, d2 = (_row(f, p, j * n, n) for j in range(3))
        t = _row(o, p, 2 * n, n)
        nisa.tensor_scalar(hi, d0, Alu.left_shift, 8)
        nisa.tensor_scalar(t, d1, Alu.right_shift, 16)
        nisa.tensor_tensor(hi, hi, t, Alu.bitwise_or)
        nisa.tensor_scalar(lo, d1, Alu.bitwise_and, 0xFFFF, op1=Alu.left_shift, operand1=16)
        nisa.tensor_tensor(lo, lo, d2, Alu.bitwise_or)
        if descending:
            nisa.tensor_scalar(stage, stage, Alu.bitwise_xor, -1)
        nisa.dma_copy(out_rows.reshape(p, 2 * n), stage)
    elif kind.dtype is I32:
        v = _row(o, p, 0, n)
        nisa.tensor_scalar(v, _row(f, p, 0, n), Alu.left_shift, 8)
        nisa.tensor_tensor(v, v, _row(f, p, n, n), Alu.bitwise_or)
        if descending:
            nisa.tensor_scalar(v, v, Alu.bitwise_xor, -1)
        nisa.dma_copy(out_rows, v)
    else:
        key = _row(f, p, 0, n)
        if descending:
            nisa.tensor_scalar(key, key, Alu.multiply, -1.0)
        if kind.nan:
            ok, v = _row(o, p, 0, n), _row(o, p, n, n)
            nisa.tensor_scalar(ok, idx, Alu.greater_equal if descending else Alu.less, 0.0 if descending else n)
            nisa.select(v, ok, key, float("nan"))
            nisa.dma_copy(out_rows, v)
            fixed = _row(o, p, 0, n, I32)
            nisa.tensor_scalar(fixed, idx, Alu.add, float(n), op1=Alu.mod, operand1=float(n))
            idx = fixed
        else:
            nisa.dma_copy(out_rows, key)
    nisa.dma_copy(indices[r0:r0 + p], idx)


@kernel
def sort(x, descending=False):
    """(values, int32 indices) of the stable sort of each row of ``x`` [B, n] (or of the int64 rows of the int32
    word array [B, n, 2]; values are then the sorted word array), ascending or ``descending``; NaN largest."""
    kind = _kind(x)
    rows, n = x.shape[0], x.shape[1]
    limit = max_row(x.dtype, nl.profile(), kind.words)
    if n > limit:
        raise KernelError(f"sort: rows of {n} elements exceed the {limit} one partition holds for {x.dtype} keys")
    values = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm, name="values")
    indices = nl.ndarray((rows, n), I32, buffer=nl.hbm, name="indices")
    if rows == 0 or n == 0:
        return values, indices
    d, pmax = kind.digits, nl.tile_size.pmax
    s, cmax = d + 1, max(1, n // 2)
    for r0 in range(0, rows, pmax):
        p = min(pmax, rows - r0)
        a = nl.ndarray((pmax, s * n), kind.dtype, name="keys_a")
        b = nl.ndarray((pmax, s * n), kind.dtype, name="keys_b")
        mk = _Masks(nl.ndarray((pmax, s * cmax), U8, name="cmp"), nl.ndarray((pmax, d * cmax), U8, name="eq"),
                    nl.ndarray((pmax, cmax), U8, name="swap"), cmax)
        _load_keys(x, r0, p, n, a, b, kind, descending)
        f, o = _run_network(a, b, p, n, d, mk)
        _store(values, indices, r0, p, n, f, o, kind, descending)
    return values, indices

