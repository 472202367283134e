"""Embedding lookup and its gradient (torch ``embedding`` / ``embedding_dense_backward`` semantics).

Forward: rows of the table are gathered by indirect DMA (``dma_gather``: one table row per partition,
up to 128 rows per instruction) into SBUF and stored in large blocks. Backward: ``dma_scatter`` with
``accumulate=True`` adds each gradient row into its table row (duplicate indices add), into a
zero-initialized float32 table (the output itself for float32 gradients, else a scratch table that is
rounded once into the output at the end).

Indices may be int32, uint32 or int64 (int64 values must be below 2**31: the low 32-bit word of each
is used, as the DMA indexes with 32-bit values). An index outside ``[0, num_weights)`` is a run-time
error raised by the device (the simulator's ``ProgramError`` names the value and the partition).

Index layout: ``N = 128 * T + r`` indices; the first ``128 * T`` are loaded as ``[128, T]`` with
partition p holding indices ``p * T .. p * T + T - 1`` (contiguous runs), so gather number t fills
output rows ``p * T + t`` and a block of consecutive gathers is stored as one DMA of contiguous rows
per partition. The last ``r`` indices are one partial gather.
"""

from __future__ import annotations

import math

from neuron_hal import DType

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import HBMTensor, View
from ..tracer import builder

_INDEX_DTYPES = (DType.int32, DType.uint32, DType.int64)
BLOCK_BYTES = 32 << 10  # bytes per partition of one gathered block (one store DMA)
IDX_COLS = 2048  # index columns loaded per index DMA


def _check_indices(name: str, indices: View) -> None:
    if indices.dtype not in _INDEX_DTYPES:
        raise KernelError(f"{name}: indices are {indices.dtype}; use int32, uint32 or int64")


def _words(indices: View) -> int:
    """32-bit words per index."""
    return indices.dtype.itemsize // 4


def _index_words(indices: View) -> View:
    """The indices as a flat HBM vector of 32-bit words (int64: [low, high] pairs)."""
    n = math.prod(indices.shape)
    w = _words(indices)
    dt = nl.uint32 if indices.dtype is nl.uint32 else nl.int32
    return HBMTensor(indices.owner, dt, indices.offset * w, ((n * w, 1),))


class _Indices:
    """Loads index blocks on demand: ``col(t)`` is the [128, 1] index column of gather t of the main
    part, ``rest()`` the [r, 1] column of the partial last gather."""

    def __init__(self, indices: View, parts: int):
        self.n = math.prod(indices.shape)
        self.P = parts
        self.T = self.n // parts
        self.r = self.n - self.T * parts
        self.w = _words(indices)
        self.words = _index_words(indices)
        self.block = None
        self.b0 = -1

    def col(self, t: int) -> View:
        b0 = t // IDX_COLS * IDX_COLS
        if b0 != self.b0:
            nb = min(IDX_COLS, self.T - b0)
            w, T = self.w, self.T
            self.block = nl.ndarray((self.P, nb * w), self.words.dtype, name="idx")
            src = self.words[:self.P * T * w].reshape(self.P, T * w)[:, b0 * w:(b0 + nb) * w]
            nisa.dma_copy(self.block, src)
            self.b0 = b0
        c = (t - b0) * self.w
        return self.block[:, c:c + 1]

    def rest(self) -> View:
        w = self.w
        t = nl.ndarray((self.r, w), self.words.dtype, name="idx_rest")
        nisa.dma_copy(t, self.words[self.P * self.T * w:].reshape(self.r, w))
        return t[:, 0:1]


class _DmaQueues:
    """Indirect DMAs and stores on disjoint queue sets."""

    def __init__(self):
        q = nl.profile().dma_queues
        self.a = list(range(max(1, q * 3 // 4)))
        self.b = list(range(len(self.a), q)) or [0]
        self.na = self.nb = 0

    def first(self) -> int:
        self.na += 1
        return self.a[(self.na - 1) % len(self.a)]

    def second(self) -> int:
        self.nb += 1
        return self.b[(self.nb - 1) % len(self.b)]


@kernel(version=1)
def embedding(weight, indices):
    """torch ``embedding(weight, indices)``: ``out[..., :] = weight[indices[...], :]``.

    ``weight`` [V, D] (any dtype), ``indices`` of any shape (int32, uint32 or int64); returns
    ``indices.shape + (D,)`` in weight's dtype. padding_idx does not affect the forward.
    """
    _check_indices("embedding", indices)
    if weight.ndim != 2:
        raise KernelError(f"embedding: weight must be [num_embeddings, dim], got {list(weight.shape)}")
    v, d = weight.shape
    n = math.prod(indices.shape)
    out = nl.ndarray(tuple(indices.shape) + (d,), weight.dtype, buffer=nl.hbm, name="out")
    if n == 0 or d == 0:
        return out
    if v == 0:
        raise KernelError("embedding: the table is empty, every index is out of range")
    P = nl.tile_size.pmax
    out2 = out.reshape(n, d)
    idx = _Indices(indices, P)
    q = _DmaQueues()
    isz = weight.dtype.itemsize
    dc = min(d, max(1, BLOCK_BYTES // isz))  # columns per gather
    k = max(1, BLOCK_BYTES // (dc * isz))  # gathers per store
    for c0 in range(0, d, dc):
        cn = min(dc, d - c0)
        table = weight[:, c0:c0 + cn]
        if idx.T:
            main = out2[:P * idx.T].reshape(P, idx.T, d)
            for t0 in range(0, idx.T, k):
                kb = min(k, idx.T - t0)
                blk = nl.ndarray((P, kb, cn), weight.dtype, name="rows")
                for i in range(kb):
                    nisa.dma_gather(blk[:, i, :], table, idx.col(t0 + i), queue=q.first())
                nisa.dma_copy(main[:, t0:t0 + kb, c0:c0 + cn], blk, queue=q.second())
        if idx.r:
            blk = nl.ndarray((idx.r, cn), weight.dtype, name="rows_rest")
            nisa.dma_gather(blk, table, idx.rest(), queue=q.first())
            nisa.dma_copy(out2[P * idx.T:, c0:c0 + cn], blk, queue=q.second())
    return out


def _zero_rows(dst2: View, q: _DmaQueues) -> None:
    """dst2 [rows, D] = 0, in large DMAs from one zeroed SBUF tile."""
    P = nl.tile_size.pmax
    rows, d = dst2.shape
    isz = dst2.dtype.itemsize
    per = max(1, BLOCK_BYTES // isz)  # elements per partition of the zero tile
    zero = nl.ndarray((P, per), dst2.dtype, name="zero")
    nisa.memset(zero, 0.0, engine=nisa.gpsimd_engine)
    flat = dst2.reshape(rows * d)
    total = rows * d
    e0 = 0
    while e0 < total:
        if total - e0 >= P:
            f = min(per, (total - e0) // P)
            nisa.dma_copy(flat[e0:e0 + P * f].reshape(P, f), zero[:, :f], queue=q.second())
            e0 += P * f
        else:
            r = total - e0
            nisa.dma_copy(flat[e0:].reshape(1, r), zero[0:1, :r], queue=q.second())
            e0 = total


@kernel(version=1)
def embedding_backward(grad, indices, num_weights, padding_idx=None, scale_grad_by_freq=False):
    """torch ``embedding_dense_backward``: ``grad_weight[indices[i]] += grad[i]`` over all i.

    ``grad`` is ``indices.shape + (D,)``; returns ``grad_weight`` [num_weights, D] in grad's dtype,
    zero where no index points. Duplicate indices add (float32 accumulation, one rounding for 16-bit
    grads). Rows equal to ``padding_idx`` get no gradient (None or a negative value: none, the aten
    convention). ``scale_grad_by_freq`` divides each row's contribution by its index's count.
    """
    _check_indices("embedding_backward", indices)
    if grad.dtype not in nl.COMPUTE_FLOATS:
        raise KernelError(f"embedding_backward: grad is {grad.dtype}; use float32, bfloat16 or float16")
    n = math.prod(indices.shape)
    if tuple(grad.shape[:-1]) != tuple(indices.shape) or grad.ndim != indices.ndim + 1:
        raise KernelError(f"embedding_backward: grad {list(grad.shape)} must be indices.shape "
                          f"{list(indices.shape)} + [dim]")
    v, d = int(num_weights), grad.shape[-1]
    pad = None if padding_idx is None or padding_idx < 0 else int(padding_idx)
    if pad is not None and pad >= v:
        raise KernelError(f"embedding_backward: padding_idx {pad} is not below num_weights {v}")
    out = nl.ndarray((v, d), grad.dtype, buffer=nl.hbm, name="grad_weight")
    if v == 0 or d == 0:
        return out
    q = _DmaQueues()
    acc = out if grad.dtype is nl.float32 else builder().tensor("acc", (v, d), nl.float32, "scratch")
    _zero_rows(acc, q)
    if n:
        _scatter_rows(grad.reshape(n, d), indices, acc, scale_grad_by_freq, q)
    if pad is not None:
        zrow = nl.ndarray((1, d), nl.float32, name="zrow")
        nisa.memset(zrow, 0.0, engine=nisa.vector_engine)
        nisa.dma_copy(acc[pad:pad + 1], zrow, queue=q.second())
    if acc is not out:  # one rounding of the float32 sums, HBM to HBM
        rows_per = max(1, (4 << 20) // (d * 4))
        for r0 in range(0, v, rows_per):
            r1 = min(v, r0 + rows_per)
            nisa.dma_copy(out[r0:r1], acc[r0:r1], queue=q.second())
    return out


def _scatter_rows(grad2: View, indices: View, acc: View, by_freq: bool, q: _DmaQueues) -> None:
    P = nl.tile_size.pmax
    n, d = grad2.shape
    v = acc.shape[0]
    idx = _Indices(indices, P)
    counts = None
    if by_freq:  # counts[i] = occurrences of index i: scatter-add ones
        counts = builder().tensor("counts", (v, 1), nl.float32, "scratch")
        _zero_rows(counts, q)
        ones = nl.ndarray((P, 1), nl.float32, name="ones")
        nisa.memset(ones, 1.0, engine=nisa.gpsimd_engine)
        for t in range(idx.T):
            nisa.dma_scatter(counts, ones, idx.col(t), accumulate=True, queue=q.first())
        if idx.r:
            nisa.dma_scatter(counts, ones[:idx.r], idx.rest(), accumulate=True, queue=q.first())
    isz = grad2.dtype.itemsize
    dc = min(d, max(1, BLOCK_BYTES // max(isz, 4)))
    k = max(1, BLOCK_BYTES // (dc * max(isz, 4)))

    def scaled(rows: View, col: View, np_: int) -> View:
        if counts is None:
            return rows
        cnt = nl.ndarray((np_, 1), nl.float32, name="cnt")
        nisa.dma_gather(cnt, counts, col, queue=q.first())
        nisa.activation(cnt, nl.reciprocal, cnt)
        res = nl.ndarray(rows.shape, nl.float32, name="scaled")
        nisa.tensor_scalar(res, rows, nl.multiply, cnt, engine=nisa.vector_engine)
        return res

    for c0 in range(0, d, dc):
        cn = min(dc, d - c0)
        table = acc[:, c0:c0 + cn]
        if idx.T:
            main = grad2[:P * idx.T].reshape(P, idx.T, d)
            for t0 in range(0, idx.T, k):
                kb = min(k, idx.T - t0)
                blk = nl.ndarray((P, kb, cn), grad2.dtype, name="grows")
                nisa.dma_copy(blk, main[:, t0:t0 + kb, c0:c0 + cn], queue=q.second())
                for i in range(kb):
                    col = idx.col(t0 + i)
                    nisa.dma_scatter(table, scaled(blk[:, i, :], col, P), col, accumulate=True, queue=q.first())
        if idx.r:
            blk = nl.ndarray((idx.r, cn), grad2.dtype, name="grows_rest")
            nisa.dma_copy(blk, grad2[P * idx.T:, c0:c0 + cn], queue=q.second())
            col = idx.rest()
            nisa.dma_scatter(table, scaled(blk, col, idx.r), col, accumulate=True, queue=q.first())
