"""``nisa``: one call per NeuronCore instruction, destination first, as in NKI's ``nki.isa``.

Operands are views of HBM tensors or on-chip tiles; ``op`` arguments accept the ``nl`` operators
(``nl.add``, ``nl.exp``, ...) or the HAL enums.
"""

from __future__ import annotations

import enum

from neuron_hal import Act, Alu, Engine, Space
from neuron_hal import isa as hal

from .errors import KernelError
from .tensors import View
from .tracer import builder

tensor_engine, vector_engine, scalar_engine, gpsimd_engine = Engine.TENSOR, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD


class engine(enum.Enum):
    """NKI's ``nisa.engine``: ``engine=`` of an instruction (the HAL enum is accepted too); ``unknown`` lets the
    instruction take its default engine, as NKI's compiler chooses one."""

    tensor = Engine.TENSOR
    vector = Engine.VECTOR
    scalar = Engine.SCALAR
    gpsimd = Engine.GPSIMD
    sync = Engine.SYNC
    dma = "dma"
    unknown = None


def _engine(e, default: Engine) -> Engine:
    e = e.value if isinstance(e, engine) else e
    if e is None:
        return default
    if not isinstance(e, Engine):
        raise KernelError(f"engine={e!r} is not a compute engine of this instruction (nisa.engine.vector, ...)")
    return e


def _alu(op) -> Alu:
    op = getattr(op, "alu", op)
    if not isinstance(op, Alu):
        raise KernelError(f"{op!r} is not an ALU operator (nl.add, nl.maximum, ...)")
    return op


def _act(op) -> Act:
    op = getattr(op, "act", op)
    if not isinstance(op, Act):
        raise KernelError(f"{op!r} is not an activation function (nl.exp, nl.tanh, ...)")
    return op


def _scalar(v):
    return v if isinstance(v, View) else float(v)


def nc_matmul(dst: View, stationary: View, moving: View, accumulate: bool | None = None) -> None:
    """dst[M, N] (PSUM) (+)= stationary[K, M].T @ moving[K, N].

    ``accumulate=None`` follows NKI: the first matmul into a PSUM tile overwrites, later ones add.
    """
    b = builder()
    if accumulate is None:
        key = (dst.owner.id, dst.offset)
        accumulate = key in b.psum_written
        b.psum_written.add(key)
    b.emit(hal.Matmul, dst=dst, stationary=stationary, moving=moving, accumulate=bool(accumulate))


def nc_transpose(dst: View, data: View, engine=engine.unknown, name: str | None = None) -> None:
    """dst[F, P] = data[P, F] on TensorE (by default) or VectorE (at most 32x32)."""
    builder().emit(hal.Transpose, dst=dst, src=data, engine=_engine(engine, Engine.TENSOR))


def activation(dst: View, op, data: View, bias: View | None = None, scale=1.0, reduce_res: View | None = None) -> None:
    """dst = op(data * scale + bias); ``reduce_res`` [P, 1] also receives each partition's sum."""
    builder().emit(hal.Activation, dst=dst, src=data, func=_act(op), scale=_scalar(scale), bias=bias,
                   reduce_dst=reduce_res)


def tensor_tensor(dst: View, data1: View, data2: View, op, engine=engine.unknown, name: str | None = None) -> None:
    builder().emit(hal.TensorTensor, dst=dst, a=data1, b=data2, op=_alu(op), engine=_engine(engine, Engine.VECTOR))


def tensor_scalar(dst: View, data: View, op0, operand0, reverse0: bool = False, op1=None, operand1=None,
                  reverse1: bool = False, engine=engine.unknown, name: str | None = None) -> None:
    """dst = (data op0 operand0) op1 operand1; operands are immediates or [P, 1] columns."""
    engine = _engine(engine, Engine.VECTOR)
    builder().emit(hal.TensorScalar, dst=dst, src=data, op0=_alu(op0), operand0=_scalar(operand0), reverse0=reverse0,
                   op1=None if op1 is None else _alu(op1), operand1=None if operand1 is None else _scalar(operand1),
                   reverse1=reverse1, engine=engine)


def scalar_tensor_tensor(dst: View, data: View, op0, operand0, op1, operand1: View, reverse0: bool = False,
                         reverse1: bool = False) -> None:
    """dst = op1(op0(data, operand0), operand1) on VectorE, in FP32.

    ``operand0`` is an immediate or a [P, 1] column; ``operand1`` a tile with dst's elements. ``reverse0`` /
    ``reverse1`` swap an op's operands. Costs N VectorE cycles when data and operand1 are bfloat16, op0 is
    subtract, op1 multiply and N even; 2N otherwise (at least MIN_II).
    """
    if not isinstance(operand1, View):
        raise KernelError(f"scalar_tensor_tensor: operand1 must be a tile, got {operand1!r} "
                          "(for two immediates or columns use tensor_scalar)")
    builder().emit(hal.ScalarTensorTensor, dst=dst, src=data, op0=_alu(op0), operand0=_scalar(operand0),
                   op1=_alu(op1), operand1=operand1, reverse0=reverse0, reverse1=reverse1)


def tensor_tensor_scan(dst: View, data0: View, data1: View, initial, op0, op1, reverse0: bool = False,
                       reverse1: bool = False, name: str | None = None) -> None:
    """A scan along the free dims (flattened row-major) on VectorE, in FP32: ``dst[:, 0] = op1(op0(data0[:, 0],
    initial), data1[:, 0])``, ``dst[:, i] = op1(op0(data0[:, i], dst[:, i-1]), data1[:, i])``, with the state kept
    in FP32 and each element rounded once to dst's dtype.

    ``initial`` is an immediate or a [P, 1] column; ``reverse0`` / ``reverse1`` swap an op's operands (data0 the rhs
    of op0; data1 the lhs of op1). data0 and data1 are not both in PSUM. Costs max(MIN_II, 2N) VectorE cycles.
    """
    for name, v in (("data0", data0), ("data1", data1)):
        if not isinstance(v, View):
            raise KernelError(f"tensor_tensor_scan: {name} must be a tile, got {v!r}")
    builder().emit(hal.TensorTensorScan, dst=dst, data0=data0, data1=data1, initial=_scalar(initial), op0=_alu(op0),
                   op1=_alu(op1), reverse0=bool(reverse0), reverse1=bool(reverse1))


def tensor_reduce(dst: View, data: View, op, axis, negate: bool = False, engine=engine.unknown) -> None:
    """Reduce over free ``axis`` (an int or tuple of tile dims, 1 = first free dim)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if any(a < 1 or a >= data.ndim for a in axes):
        raise KernelError(f"tensor_reduce axis {axis} must name free dims 1..{data.ndim - 1} of {data!r}")
    builder().emit(hal.TensorReduce, dst=dst, src=data, op=_alu(op), axes=tuple(a - 1 for a in axes), negate=negate,
                   engine=_engine(engine, Engine.VECTOR))


def bn_stats(dst: View, data: View, name: str | None = None) -> None:
    """dst [P, 6] = (count, mean, variance * count) of the even-indexed, then of the odd-indexed elements of each
    partition of ``data`` (free dims flattened row-major; at most ``nl.tile_size.bn_stats_fmax`` elements), in FP32
    on VectorE (Welford's update). Costs max(MIN_II, N) VectorE cycles."""
    builder().emit(hal.BnStats, dst=dst, src=data)


def bn_aggr(dst: View, data: View, name: str | None = None) -> None:
    """dst [P, 2] = (mean, population variance) per partition from the (count, mean, variance * count) triples of
    one or more ``bn_stats`` records in ``data`` [P, 3k], in FP32 on VectorE (Chan's combination). Costs
    max(MIN_II, 13 * N / 3) VectorE cycles, N = data's elements per partition."""
    builder().emit(hal.BnAggr, dst=dst, src=data)


def tensor_copy(dst: View, src: View, engine=engine.unknown, name: str | None = None) -> None:
    builder().emit(hal.TensorCopy, dst=dst, src=src, engine=_engine(engine, Engine.VECTOR))


def memset(dst: View, value, engine=engine.unknown, name: str | None = None) -> None:
    builder().emit(hal.Memset, dst=dst, value=float(value), engine=_engine(engine, Engine.VECTOR))


def iota(dst: View, steps, offset: int = 0, channel_multiplier: int = 0) -> None:
    """dst[p, i...] = offset + channel_multiplier * p + sum(steps[d] * i[d])."""
    builder().emit(hal.Iota, dst=dst, steps=tuple(int(s) for s in steps), offset=int(offset),
                   channel_multiplier=int(channel_multiplier))


def affine_select(dst: View, data: View, steps, cmp_op, on_false_value, offset: int = 0,
                  channel_multiplier: int = 0) -> None:
    """dst = data where cmp_op(offset + channel_multiplier * p + sum(steps[d] * i[d]), 0) else on_false_value."""
    builder().emit(hal.AffineSelect, dst=dst, src=data, steps=tuple(int(s) for s in steps), cmp=_alu(cmp_op),
                   false_value=float(on_false_value), offset=int(offset), channel_multiplier=int(channel_multiplier))


def select(dst: View, predicate: View, on_true: View, on_false) -> None:
    builder().emit(hal.Select, dst=dst, predicate=predicate, on_true=on_true, on_false=_scalar(on_false))


def partition_reduce(dst: View, data: View, op) -> None:
    builder().emit(hal.PartitionReduce, dst=dst, src=data, op=_alu(op))


def partition_broadcast(dst: View, data: View) -> None:
    builder().emit(hal.PartitionBroadcast, dst=dst, src=data)


def _queue(queue: int | None, dst: View) -> int:
    """The given queue, else round robin over half the queues for loads and the other half for stores
    (queues complete in order: a load must not wait behind a store that waits for compute)."""
    if queue is not None:
        return int(queue)
    b = builder()
    half = max(1, b.profile.dma_queues // 2)
    kind = "store" if dst.space is Space.HBM else "load"
    n = b.next_queue[kind]
    b.next_queue[kind] = n + 1
    return n % half + (half if kind == "store" and b.profile.dma_queues > 1 else 0)


def dma_copy(dst: View, src: View, queue: int | None = None) -> None:
    builder().emit(hal.DmaCopy, dst=dst, src=src, queue=_queue(queue, dst))


def dma_transpose(dst: View, src: View, queue: int | None = None) -> None:
    """dst[f, p] = src[p, f] by the DMA engines: src [P, F] (HBM rows or an SBUF tile) into an SBUF tile [F, P].

    NC-v3 and later (``nl.profile().dma_transpose``); 2- and 4-byte dtypes, no cast, F <= 128. Costs a DMA
    whose bandwidth is ``dma_transpose_hbm_fraction`` (from HBM) or ``dma_transpose_sbuf_fraction`` (from
    SBUF) of a copy's.
    """
    builder().emit(hal.DmaTranspose, dst=dst, src=src, queue=_queue(queue, dst))


def dma_gather(dst: View, src: View, index: View, queue: int | None = None) -> None:
    """dst[p, :] = src[index[p, 0], :] (src an HBM table)."""
    builder().emit(hal.DmaGather, dst=dst, src=src, index=index, queue=_queue(queue, dst))


def dma_scatter(dst: View, src: View, index: View, accumulate: bool = False, queue: int | None = None) -> None:
    """dst[index[p, 0], :] = src[p, :] (``accumulate``: +=) into an HBM table."""
    builder().emit(hal.DmaScatter, dst=dst, src=src, index=index, accumulate=accumulate, queue=_queue(queue, dst))
