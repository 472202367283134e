"""``nki.isa`` (``nisa``) on neuron-kernels' tracer: one call per NeuronCore instruction, destination first.

Instructions whose NKI signature the library already has are the library's very functions (``tensor_tensor``,
``tensor_scalar``, ``tensor_copy``, ``memset``, ``nc_transpose``, ``tensor_tensor_scan``, ``bn_stats``,
``bn_aggr``); the ones whose NKI form differs are defined here once, in NKI's form, on the same tracer
(``tensor_reduce``'s argument order, ``iota``'s and ``affine_select``'s ``pattern``, ``activation``'s float bias
and ``reduce_cmd``, ...). The library keeps its older spellings of those for now (see docs/nki.md). Names of NKI's
API this front end lacks raise NotImplementedError (see :mod:`.api`).
"""

from __future__ import annotations

import enum
import itertools
import math

from neuron_hal import Alu, DType, Engine, Space
from neuron_hal import isa as hal

from .. import isa as _lib
from ..errors import KernelError
from ..tensors import View
from ..tracer import builder
from . import language as nl
from .api import API, NkiNotImplemented, missing
from .shuffle import nc_stream_shuffle  # noqa: F401 (an nki.isa name)
from .top8 import max8, nc_find_index8, nc_match_replace8  # noqa: F401 (nki.isa names)

_MODULE = "nki.isa"

engine = _lib.engine
tensor_engine, vector_engine, scalar_engine, gpsimd_engine = engine.tensor, engine.vector, engine.scalar, engine.gpsimd
unknown_engine, dma_engine = engine.unknown, engine.dma
NkiValidationError = KernelError  # what the tracer raises when a hardware constraint is violated
tensor_tensor, tensor_copy, memset = _lib.tensor_tensor, _lib.tensor_copy, _lib.memset
nc_transpose, tensor_tensor_scan, bn_stats, bn_aggr = (_lib.nc_transpose, _lib.tensor_tensor_scan, _lib.bn_stats,
                                                       _lib.bn_aggr)


class reduce_cmd(enum.Enum):
    """Engine accumulator-register commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


_reduce_cmd = reduce_cmd  # the enum, under a name activation's reduce_cmd parameter does not hide


class dge_mode(enum.Enum):
    """DMA descriptor generation: the simulator costs every mode as static descriptors (addresses are static)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """Out-of-bounds handling of dynamic DMA addresses (all addresses are static here: checked at trace time)."""

    error = 0
    skip = 1


class nc_version(enum.IntEnum):  # ordered, as kernels compare them (get_nc_version() >= nc_version.gen3)
    gen2 = 2
    gen3 = 3
    gen4 = 4


class matmul_perf_mode(enum.Enum):
    none = 0
    double_row = 1


def get_nc_version() -> nc_version:
    return nc_version(nl._profile().nc_version)


def get_nc_sub_version() -> int:
    return 0


def _unsupported(what: str) -> NkiNotImplemented:
    return NkiNotImplemented(f"{what} is not implemented by neuron-kernels' NKI front end (docs/nki.md)")


def nc_matmul(dst: View, stationary: View, moving: View, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate=None, tile_position=(),
              tile_size=(), perf_mode=matmul_perf_mode.none, name: str | None = None) -> None:
    """dst[M, N] (PSUM, fp32) (+)= stationary[K, M].T @ moving[K, N] on TensorE. ``accumulate=None``: the first
    matmul into a PSUM location overwrites it, later ones add. The onezero flags are performance hints only."""
    if tuple(tile_position) or tuple(tile_size):
        _check_tiling(stationary, tuple(tile_position), tuple(tile_size))
    if perf_mode not in (None, matmul_perf_mode.none):
        raise _unsupported(f"nisa.nc_matmul(perf_mode={perf_mode})")
    if is_transpose:  # TensorE's bit-accurate transpose: moving is the identity the docs require
        if moving.shape != (stationary.shape[0], stationary.shape[0]):
            raise KernelError(f"nisa.nc_matmul(is_transpose=True): moving {moving!r} must be the "
                              f"[{stationary.shape[0]}, {stationary.shape[0]}] identity")
        if accumulate:
            raise _unsupported("nisa.nc_matmul(is_transpose=True, accumulate=True)")
        _lib.nc_transpose(dst, stationary)
        return
    _lib.nc_matmul(dst, stationary, moving, accumulate=accumulate)


def _check_tiling(stationary: View, position: tuple, size: tuple) -> None:
    """TensorE row/column tiling: a (row_size, column_size) quadrant of the 128x128 PE array at (start_row,
    start_column). The values are the full array's; the simulator costs the matmul as on the full array (tiles
    that the hardware would run side by side are not overlapped: device time is an upper bound)."""
    what = f"nisa.nc_matmul(tile_position={position}, tile_size={size})"
    if len(position) != 2 or len(size) != 2:
        raise KernelError(f"{what}: both must be set, as (row, column) pairs")
    smallest = 64 if nl._profile().nc_version < 3 else 32
    for (start, extent), axis in zip(zip(position, size), ("row", "column")):
        if extent not in (smallest, 64, 128) or start % extent or not 0 <= start < 128:
            raise KernelError(f"{what}: the {axis} tile size must be one of {sorted({smallest, 64, 128})} and its "
                              f"start a multiple of it below 128")
    if stationary.shape[0] > size[0] or stationary.shape[1] > size[1]:
        raise KernelError(f"{what}: stationary {stationary!r} exceeds the {list(size)} tile")


def _column(value: float, like: View) -> View:
    """An fp32 [P, 1] SBUF column holding ``value``: a float bias becomes a bias vector, as NKI's compiler makes
    one. One GpSimd memset per value and partition count in a kernel (the column lives while it is used)."""
    b = builder()
    consts = b.__dict__.setdefault("nki_constants", {})
    first = like.hal_ap().start_partition if like.on_chip else 0  # the column spans the same partitions
    key = (float(value), first + like.shape[0])
    if key not in consts:
        consts[key] = b.tile((key[1], 1), DType.float32, Space.SBUF, "const", None)
        _lib.memset(consts[key], float(value), engine=Engine.GPSIMD)
    return consts[key][first:key[1], :]


def activation(dst: View, op, data: View, bias=None, scale=1.0, reduce_op=None, reduce_res: View | None = None,
               reduce_cmd=reduce_cmd.idle, engine=engine.scalar, name: str | None = None) -> None:
    """dst = op(data * scale + bias) on ScalarE, in fp32. ``bias``: a float or a [P, 1] column; ``scale``: a float
    or a [P, 1] column. With ``reduce_cmd=reset_reduce`` and ``reduce_res`` ([P, 1]), reduce_res also receives each
    partition's sum of the results (``reduce_op`` must be nl.add)."""
    cmd = _reduce_cmd
    if engine not in (_lib.engine.scalar, _lib.engine.unknown, Engine.SCALAR):
        raise _unsupported(f"nisa.activation(engine={engine}) (GpSimd activation, NeuronCore-v4)")
    if reduce_cmd is cmd.reset_reduce:
        if reduce_res is None:
            raise _unsupported("nisa.activation(reduce_cmd=reset_reduce) without reduce_res (register state "
                               "kept for later instructions)")
        if reduce_op is not None and getattr(reduce_op, "alu", reduce_op) is not Alu.add:
            raise KernelError(f"nisa.activation: reduce_op must be nl.add, got {reduce_op!r}")
    elif reduce_cmd is cmd.idle:
        if reduce_res is not None:
            raise _unsupported("nisa.activation(reduce_res=..., reduce_cmd=idle) (reading accumulator registers "
                               "set by earlier instructions)")
    else:
        raise _unsupported(f"nisa.activation(reduce_cmd={reduce_cmd}) (accumulator registers across instructions)")
    if bias is not None and not isinstance(bias, View):
        bias = None if float(bias) == 0.0 else _column(bias, data)
    target, finish = _repeated_dst(dst)
    _lib.activation(target, op, data, bias=bias, scale=scale, reduce_res=reduce_res)
    finish()


def _repeated_dst(dst: View):
    """A destination with stride-0 free dims (``t.ap([[1, n], [0, F]])``, which kernels use to keep only a fused
    reduction) writes each element several times; the last write stays. The simulator rejects overlapping writes, so
    the instruction writes a scratch tile of dst's shape and the last element along each stride-0 dim is copied to
    dst: (the view to write, the copy to emit after)."""
    repeated = [d for d, (n, st) in enumerate(dst.dims) if d > 0 and st == 0 and n > 1]
    if not dst.on_chip or not repeated:
        return dst, lambda: None
    scratch = builder().tile(dst.shape, dst.dtype, Space.SBUF, "repeated_dst", None)
    last = tuple(slice(n - 1, n) if d in repeated else slice(None) for d, n in enumerate(dst.shape))
    return scratch, lambda: _lib.tensor_copy(dst[last], scratch[last])


def activation_reduce(dst: View, op, data: View, reduce_op, reduce_res: View, bias=None, scale=1.0,
                      name: str | None = None) -> None:
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=reduce_cmd.reset_reduce)


def tensor_reduce(dst: View, op, data: View, axis, negate: bool = False, keepdims: bool = False,
                  name: str | None = None) -> None:
    """dst = op-reduction of data over free ``axis`` (an int or ints: the last free dims, ending at the last one),
    on VectorE in fp32; ``negate`` multiplies the result by -1. ``keepdims`` keeps reduced dims as size 1 in dst."""
    axes = (axis,) if isinstance(axis, int) else tuple(int(a) for a in axis)
    axes = tuple(sorted(a + data.ndim if a < 0 else a for a in axes))
    if not axes or axes[0] < 1 or axes[-1] != data.ndim - 1 or list(axes) != list(range(axes[0], data.ndim)):
        raise KernelError(f"nisa.tensor_reduce: axis {axis} must be the last free dims of {data!r} "
                          f"(ending at {data.ndim - 1}, partition axis 0 excluded)")
    kept = data.shape[:axes[0]]
    want = kept + (1,) * len(axes) if keepdims else kept
    if math.prod(dst.shape) != math.prod(want) or dst.shape[0] != data.shape[0]:
        raise KernelError(f"nisa.tensor_reduce: dst {dst!r} must have shape {list(want)} (or its elements)")
    builder().emit(hal.TensorReduce, dst=dst, src=data, op=_lib._alu(op), axes=tuple(a - 1 for a in axes),
                   negate=bool(negate), engine=Engine.VECTOR)


def tensor_partition_reduce(dst: View, op, data: View, name: str | None = None) -> None:
    """dst[0, :] = op-reduction of data over its partitions, on GpSimd."""
    _lib.partition_reduce(dst, data, op)


def _unary(op, operand, what: str):
    """(op, operand) with NKI's unary ALU operators (nl.abs) as the simulator's ALU op that computes them."""
    name = getattr(op, "name", None)
    if isinstance(op, nl.Operator) and name in nl.UNARY_ALU:
        if isinstance(operand, View) or operand not in (None, 0, 0.0):
            raise KernelError(f"{what}: nl.{name} is unary; its operand must be 0 or None, got {operand!r}")
        return nl.UNARY_ALU[name], 0.0
    return op, operand


def tensor_scalar(dst: View, data: View, op0, operand0, reverse0: bool = False, op1=None, operand1=None,
                  reverse1: bool = False, engine=engine.unknown, name: str | None = None) -> None:
    """dst = (data op0 operand0) op1 operand1 (the library's instruction; NKI's unary nl.abs with operand 0)."""
    op0, operand0 = _unary(op0, operand0, "nisa.tensor_scalar op0")
    if op1 is not None:
        op1, operand1 = _unary(op1, operand1, "nisa.tensor_scalar op1")
    _lib.tensor_scalar(dst, data, op0, operand0, reverse0=reverse0, op1=op1, operand1=operand1, reverse1=reverse1,
                       engine=engine)


def tensor_scalar_reduce(dst: View, data: View, op0, operand0, reduce_op, reduce_res: View | None = None,
                         reverse0: bool = False, reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None,
                         reduce_res_negate: bool = False, name: str | None = None) -> None:
    """dst = data op0 operand0 and reduce_res [P, 1] = reduce_op over all free dims of the fp32 results (before
    their cast to dst, as the simulator's fused reductions do), negated with ``reduce_res_negate``; on VectorE as
    a tensor_scalar and a tensor_reduce (the fused instruction's one pass costed as two)."""
    if reduce_cmd is not _reduce_cmd.reset_reduce or reduce_init is not None:
        raise _unsupported(f"nisa.tensor_scalar_reduce(reduce_cmd={reduce_cmd}) (accumulator registers across "
                           f"instructions)")
    op0, operand0 = _unary(op0, operand0, "nisa.tensor_scalar_reduce op0")
    red = _lib._alu(reduce_op)
    if red not in (Alu.add, Alu.multiply, Alu.max, Alu.min):
        raise KernelError(f"nisa.tensor_scalar_reduce: reduce_op must be nl.add, nl.multiply, nl.maximum or "
                          f"nl.minimum, got {reduce_op!r}")
    res = dst if dst.dtype is DType.float32 or reduce_res is None else \
        builder().tile(dst.shape, DType.float32, Space.SBUF, "tsr", None)
    _lib.tensor_scalar(res, data, op0, operand0, reverse0=reverse0)
    if res is not dst:
        _lib.tensor_copy(dst, res)
    if reduce_res is not None:
        tensor_reduce(reduce_res, red, res, tuple(range(1, res.ndim)), negate=reduce_res_negate)


def scalar_tensor_tensor(dst: View, data: View, op0, operand0, op1, operand1: View, reverse0: bool = False,
                         reverse1: bool = False, reduce_cmd=None, reduce_op=None, reduce_res: View | None = None,
                         name: str | None = None) -> None:
    if reduce_res is not None:
        raise _unsupported("nisa.scalar_tensor_tensor(reduce_res=...) (fused reduction)")
    _lib.scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=reverse0, reverse1=reverse1)


def _pattern(dst: View, pattern) -> tuple[View, tuple[int, ...]]:
    """NKI's [[step, num], ...] free pattern over dst: dst viewed as [P, num...] and the steps."""
    pairs = [(int(step), int(num)) for step, num in pattern]
    if not 1 <= len(pairs) <= 4:
        raise KernelError(f"pattern {pattern}: 1 to 4 [step, num] pairs")
    nums = tuple(num for _, num in pairs)
    if math.prod(nums) != math.prod(dst.shape[1:]):
        raise KernelError(f"pattern {pattern} has {math.prod(nums)} elements per partition; {dst!r} has "
                          f"{math.prod(dst.shape[1:])}")
    view = dst if dst.shape[1:] == nums else dst.reshape((dst.shape[0],) + nums)
    return view, tuple(step for step, _ in pairs)


def iota(dst: View, pattern, offset: int = 0, channel_multiplier: int = 0, name: str | None = None) -> None:
    """dst[p, i...] = offset + channel_multiplier * p + sum(step_k * i_k) for pattern [[step_k, num_k], ...]
    (int32 math, cast to dst's dtype), on GpSimd."""
    view, steps = _pattern(dst, pattern)
    _lib.iota(view, steps, offset=int(offset), channel_multiplier=int(channel_multiplier))


def affine_select(dst: View, pattern, channel_multiplier: int, on_true_tile: View, on_false_value, cmp_op=nl.equal,
                  offset: int = 0, name: str | None = None) -> None:
    """dst = on_true_tile where cmp_op(offset + channel_multiplier * p + sum(step_k * i_k), 0) else
    on_false_value, on GpSimd."""
    view, steps = _pattern(dst, pattern)
    src = on_true_tile if on_true_tile.shape == view.shape else on_true_tile.reshape(view.shape)
    _lib.affine_select(view, src, steps, cmp_op, on_false_value, offset=int(offset),
                       channel_multiplier=int(channel_multiplier))


def select_reduce(dst: View, predicate: View, on_true: View, on_false, reduce_res: View | None = None,
                  reduce_cmd=reduce_cmd.idle, reduce_op=nl.maximum, reverse_pred: bool = False,
                  name: str | None = None) -> None:
    """dst = on_true where predicate != 0 else on_false, on VectorE; ``on_false`` a float or a [P, 1] column (read
    for every element of its partition)."""
    if reduce_res is not None or reduce_cmd is not _reduce_cmd.idle:
        raise _unsupported("nisa.select_reduce(reduce_res=/reduce_cmd=) (the fused max reduction)")
    if reverse_pred:
        raise _unsupported("nisa.select_reduce(reverse_pred=True)")
    if isinstance(on_false, View):
        if on_false.shape[1:] and math.prod(on_false.shape[1:]) != 1:
            raise KernelError(f"nisa.select_reduce: on_false {on_false!r} must be a float or a [P, 1] column")
        on_false = on_false.reshape((on_false.shape[0],) + (1,) * (dst.ndim - 1)).broadcast_to(dst.shape)
    _lib.select(dst, predicate, on_true, on_false)


def reciprocal(dst: View, data: View, name: str | None = None) -> None:
    """dst = 1 / data on VectorE (an exact fp32 divide; costed as a tensor_scalar)."""
    _lib.tensor_scalar(dst, data, Alu.divide, 1.0, reverse0=True)


def dma_copy(dst: View, src: View, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             engine=engine.unknown, name: str | None = None) -> None:
    """dst = src by the DMA engines (HBM or SBUF on both sides; a dtype change casts). An indirect (vector_offset)
    src gathers rows, an indirect dst scatters them (``dst_rmw_op=nl.add``: adds into them)."""
    if src.vector_index is not None and dst.vector_index is None and dst_rmw_op is None:
        return _lib.dma_gather(dst, src, src.vector_index)
    rmw = getattr(dst_rmw_op, "alu", dst_rmw_op)
    if dst.vector_index is not None and src.vector_index is None and rmw in (None, Alu.add):
        return _lib.dma_scatter(dst, src, dst.vector_index, accumulate=dst_rmw_op is not None)
    if dst_rmw_op is not None or src.vector_index is not None or dst.vector_index is not None:
        raise _unsupported(f"nisa.dma_copy(dst_rmw_op={dst_rmw_op!r}) (read-modify-write DMA other than an "
                           f"indirect scatter with nl.add) or indirect access on both sides")
    _lib.dma_copy(dst, src)


_DMA_PERMUTATIONS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}  # NKI's fixed permutation per rank


def dma_transpose(dst: View, src: View, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error,
                  name: str | None = None) -> None:
    """dst = src permuted by the DMA engines: 2-D [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0] (NKI's rules; ``axes``
    may name that permutation). 3-D and 4-D sources are one 2-D DMA transpose per middle index."""
    perm = _DMA_PERMUTATIONS.get(src.ndim)
    if perm is None:
        raise KernelError(f"nisa.dma_transpose: src {src!r} must have 2 to 4 dims")
    if axes is not None and tuple(axes) != perm:
        raise _unsupported(f"nisa.dma_transpose(axes={tuple(axes)}) (only the {src.ndim}-d permutation {perm})")
    want = tuple(src.shape[a] for a in perm)
    if dst.shape != want and (dst.ndim != 2 or src.ndim != 2):
        raise KernelError(f"nisa.dma_transpose: dst {dst!r} must be {list(want)} (src {list(src.shape)} permuted "
                          f"{list(perm)})")
    if src.ndim == 2:
        _lib.dma_transpose(dst, src)
        return
    for mid in itertools.product(*(range(n) for n in src.shape[1:-1])):
        _lib.dma_transpose(dst[(slice(None), *mid, slice(None))], src[(slice(None), *mid, slice(None))])


for _name, (_status, _why) in API[_MODULE].items():
    if _status == "missing" and _name not in globals():
        globals()[_name] = missing(f"{_MODULE}.{_name}", _why)


def __getattr__(name: str):
    raise AttributeError(f"module {_MODULE!r} has no attribute {name!r}")
