"""The NeuronCore instruction set as plain data, modelled on NKI's ``nki.isa``.

Every operand is an access pattern (:class:`AP`) over one memory space. Instructions are frozen
dataclasses: hashable, comparable, serializable (see :mod:`neuron_hal.program`) and printable.
Semantics are stated per instruction; costs and rules live in the simulator and in
:mod:`neuron_hal.validate`.

Conventions (as on the hardware, docs/hardware.md §2.2):
- SBUF/PSUM operands span ``partitions`` consecutive partitions from ``start_partition``; every
  partition uses the same free pattern. ``offset`` is the byte offset inside each partition.
- HBM operands address program argument ``tensor``: ``offset`` bytes from its base, then row ``p``
  at ``p * partition_stride`` elements, then the free pattern.
- Free patterns are ``((size, stride), ...)`` outermost first, strides in elements, up to 4 dims.
- Vector/Scalar/GpSimd compute in FP32; results are cast to the destination dtype with
  round-to-nearest-even (float -> int: half to even, saturating, NaN -> 0). On GpSimd, when every
  operand is an integer, arithmetic is exact and wraps to the destination width (divide and pow
  stay FP32). Bitwise ops work on 32-bit integer patterns on any engine.
- ``p`` in iota/affine_select is the partition index within the operand (0..partitions-1).
- Operands with equal element counts but different free shapes pair up in row-major order.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from .dtypes import DType


class Space(enum.Enum):
    __hash__ = object.__hash__  # members are singletons: identity hash (Enum's hashes the name in Python)

    HBM = "hbm"
    SBUF = "sbuf"
    PSUM = "psum"


class Engine(enum.Enum):
    __hash__ = object.__hash__  # members are singletons: identity hash (Enum's hashes the name in Python)

    TENSOR = "tensor"
    VECTOR = "vector"
    SCALAR = "scalar"
    GPSIMD = "gpsimd"
    SYNC = "sync"  # the sequencer without a datapath that triggers DMA queues


COMPUTE_ENGINES = (Engine.TENSOR, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)


class Act(enum.Enum):
    """ScalarE activation functions: dst = f(src * scale + bias)."""

    identity = "identity"
    exp = "exp"
    log = "log"
    tanh = "tanh"
    sigmoid = "sigmoid"
    relu = "relu"
    gelu = "gelu"  # erf form
    gelu_tanh = "gelu_tanh"  # tanh approximation
    silu = "silu"
    sqrt = "sqrt"
    rsqrt = "rsqrt"
    reciprocal = "reciprocal"
    square = "square"
    abs = "abs"
    sign = "sign"
    sin = "sin"
    cos = "cos"
    softplus = "softplus"
    erf = "erf"


class Alu(enum.Enum):
    """Vector/GpSimd ALU operations. Comparisons and logical ops produce 1.0 / 0.0."""

    add = "add"
    subtract = "subtract"
    multiply = "multiply"
    divide = "divide"
    max = "max"
    min = "min"
    pow = "pow"
    mod = "mod"
    abs_max = "abs_max"
    equal = "equal"
    not_equal = "not_equal"
    greater = "greater"
    greater_equal = "greater_equal"
    less = "less"
    less_equal = "less_equal"
    logical_and = "logical_and"
    logical_or = "logical_or"
    logical_xor = "logical_xor"
    bitwise_and = "bitwise_and"
    bitwise_or = "bitwise_or"
    bitwise_xor = "bitwise_xor"
    left_shift = "left_shift"
    right_shift = "right_shift"  # arithmetic for signed, logical for unsigned
    bypass = "bypass"  # result = first operand (tensor_scalar pass-through)

    @property
    def is_bitwise(self) -> bool:
        return self in _BITWISE


_BITWISE = frozenset({Alu.bitwise_and, Alu.bitwise_or, Alu.bitwise_xor, Alu.left_shift, Alu.right_shift})
COMPARISONS = frozenset(
    {Alu.equal, Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal}
)
REDUCE_OPS = frozenset({Alu.add, Alu.max, Alu.min, Alu.multiply, Alu.abs_max})


@dataclass(frozen=True)
class AP:
    """An access pattern: which elements of which memory an operand reads or writes."""

    space: Space
    dtype: DType
    partitions: int
    free: tuple[tuple[int, int], ...] = ()
    start_partition: int = 0
    offset: int = 0
    partition_stride: int = 0
    tensor: int = -1

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def sbuf(cls, dtype, partitions: int, shape=(), *, offset: int = 0, start: int = 0, space=Space.SBUF) -> AP:
        """A contiguous row-major tile: ``partitions`` x ``shape`` starting at byte ``offset``."""
        return cls(space, DType.of(dtype), partitions, _row_major(shape), start, offset)

    @classmethod
    def psum(cls, dtype, partitions: int, shape=(), *, offset: int = 0, start: int = 0) -> AP:
        return cls.sbuf(dtype, partitions, shape, offset=offset, start=start, space=Space.PSUM)

    @classmethod
    def hbm(cls, tensor: int, dtype, shape, *, offset: int = 0, row_stride: int | None = None) -> AP:
        """Rows of a row-major HBM tensor: ``shape[0]`` rows of ``shape[1:]`` elements."""
        rows, inner = shape[0], tuple(shape[1:])
        free = _row_major(inner)
        stride = row_stride if row_stride is not None else math.prod(inner)
        return cls(Space.HBM, DType.of(dtype), rows, free, 0, offset, stride, tensor)

    # -- shape --------------------------------------------------------------------------------
    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.free)

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(st for _, st in self.free)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.partitions, *self.sizes)

    @property
    def free_size(self) -> int:
        """N: elements per partition."""
        return math.prod(self.sizes)

    @property
    def num_elements(self) -> int:
        return self.partitions * self.free_size

    @property
    def nbytes(self) -> int:
        return self.num_elements * self.dtype.itemsize

    @property
    def on_chip(self) -> bool:
        return self.space is not Space.HBM

    @property
    def end_partition(self) -> int:
        return self.start_partition + self.partitions

    def free_extent(self) -> tuple[int, int]:
        """(lowest, highest+1) element index touched in one partition or row, relative to offset."""
        lo = sum(min(0, (s - 1) * st) for s, st in self.free if s > 0)
        hi = sum(max(0, (s - 1) * st) for s, st in self.free if s > 0)
        return lo, hi + 1

    def byte_range(self) -> tuple[int, int]:
        """On-chip: byte range used inside each partition. HBM: byte range from the tensor base."""
        lo, hi = self.free_extent()
        if self.space is Space.HBM and self.partitions > 0:
            span = (self.partitions - 1) * self.partition_stride
            lo, hi = lo + min(0, span), hi + max(0, span)
        size = self.dtype.itemsize
        return self.offset + lo * size, self.offset + hi * size

    def contiguous_inner(self) -> bool:
        return not self.free or self.free[-1][1] == 1 or self.free[-1][0] == 1

    def with_dtype(self, dtype) -> AP:
        return replace(self, dtype=DType.of(dtype))

    def __str__(self) -> str:
        pat = ",".join(f"{s}:{st}" for s, st in self.free)
        if self.space is Space.HBM:
            where = f"hbm%{self.tensor}+{self.offset:#x} [{self.partitions}:{self.partition_stride}]"
        else:
            where = f"{self.space.value}[{self.start_partition}:{self.end_partition}]+{self.offset:#x}"
        return f"{where}{{{pat}}} {self.dtype}"


def _row_major(shape) -> tuple[tuple[int, int], ...]:
    shape = tuple(int(s) for s in shape)
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(zip(shape, reversed(strides)))


Operand = AP | float


class Instruction:
    """Base of all instructions. Subclasses are frozen dataclasses with ``dst`` first."""

    opcode: ClassVar[str]
    engines: ClassVar[tuple[Engine, ...]]
    operand_fields: ClassVar[tuple[str, ...]]  # the fields that may hold an AP (AP or Operand, maybe None)

    def reads(self) -> tuple[AP, ...]:
        return tuple(
            v for f in fields(self) if f.name != "dst" and f.name not in self._extra_writes
            for v in [getattr(self, f.name)] if isinstance(v, AP)
        )

    def writes(self) -> tuple[AP, ...]:
        extra = tuple(getattr(self, n) for n in self._extra_writes if getattr(self, n) is not None)
        return (self.dst, *extra)

    _extra_writes: ClassVar[tuple[str, ...]] = ()

    def __str__(self) -> str:
        args = []
        for f in fields(self):
            if f.name in ("dst", "engine"):
                continue
            v = getattr(self, f.name)
            if v is None or v is False:
                continue
            args.append(f"{f.name}={v.value if isinstance(v, enum.Enum) else v}")
        return f"{self.engine.value:<6} {self.opcode:<20} {self.dst} <- {', '.join(args)}"


def _instruction(opcode: str, engines: tuple[Engine, ...]):
    def wrap(cls):
        cls = dataclass(frozen=True)(cls)
        cls.opcode, cls.engines = opcode, engines
        cls.operand_fields = tuple(f.name for f in fields(cls) if str(f.type).split(" |")[0] in ("AP", "Operand"))
        OPCODES[opcode] = cls
        return cls

    return wrap


OPCODES: dict[str, type[Instruction]] = {}
_VSG = (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)


@_instruction("nc_matmul", (Engine.TENSOR,))
class Matmul(Instruction):
    """dst[M, N] (PSUM) = stationary[K, M].T @ moving[K, N] in FP32; ``accumulate`` adds to dst."""

    dst: AP
    stationary: AP
    moving: AP
    accumulate: bool = False
    engine: Engine = Engine.TENSOR

    def reads(self) -> tuple[AP, ...]:
        extra = (self.dst,) if self.accumulate else ()
        return (self.stationary, self.moving, *extra)


@_instruction("nc_transpose", (Engine.TENSOR, Engine.VECTOR))
class Transpose(Instruction):
    """dst[F, P] = src[P, F]. TensorE: up to 128x128 into PSUM; VectorE: up to 32x32."""

    dst: AP
    src: AP
    engine: Engine = Engine.TENSOR


@_instruction("activation", (Engine.SCALAR,))
class Activation(Instruction):
    """dst = func(src * scale + bias); scale is an immediate or a [P, 1] AP, bias a [P, 1] AP.

    With ``reduce_dst`` ([P, 1]), the sum of each partition's results is also written there.
    """

    dst: AP
    src: AP
    func: Act
    scale: Operand = 1.0
    bias: AP | None = None
    reduce_dst: AP | None = None
    engine: Engine = Engine.SCALAR
    _extra_writes: ClassVar[tuple[str, ...]] = ("reduce_dst",)


@_instruction("tensor_tensor", (Engine.VECTOR, Engine.GPSIMD))
class TensorTensor(Instruction):
    """dst = op(a, b) elementwise; a and b have dst's shape."""

    dst: AP
    a: AP
    b: AP
    op: Alu
    engine: Engine = Engine.VECTOR


@_instruction("tensor_scalar", _VSG)
class TensorScalar(Instruction):
    """dst = op1(op0(src, operand0), operand1); operands are immediates or [P, 1] APs.

    ``reverse`` swaps an op's operands (operand op src).
    """

    dst: AP
    src: AP
    op0: Alu
    operand0: Operand
    reverse0: bool = False
    op1: Alu | None = None
    operand1: Operand | None = None
    reverse1: bool = False
    engine: Engine = Engine.VECTOR


@_instruction("scalar_tensor_tensor", (Engine.VECTOR,))
class ScalarTensorTensor(Instruction):
    """dst = op1(op0(src, operand0), operand1): operand0 an immediate or a [P, 1] AP, operand1 a tensor
    with dst's elements (VectorE; NKI's ``scalar_tensor_tensor``).

    ``reverse0`` / ``reverse1`` swap an op's operands (operand0 op0 src; operand1 op1 intermediate).
    """

    dst: AP
    src: AP
    op0: Alu
    operand0: Operand
    op1: Alu
    operand1: AP
    reverse0: bool = False
    reverse1: bool = False
    engine: Engine = Engine.VECTOR


@_instruction("tensor_tensor_scan", (Engine.VECTOR,))
class TensorTensorScan(Instruction):
    """A scan of two tiles along the free dims, per partition, in FP32 (VectorE; NKI's ``tensor_tensor_scan``).

    With the free dims flattened in row-major order (the order the access patterns step through them):
    ``s = initial``, then for each i ``s = op1(op0(data0[i], s), data1[i])`` and ``dst[i] = s``. ``reverse0`` swaps
    op0's operands (``op0(s, data0[i])``), ``reverse1`` op1's (``op1(data1[i], .)``). ``initial`` is an immediate
    or a [P, 1] AP. The state stays FP32 from element to element; each output element is rounded once to dst's
    dtype. data0, data1 and dst have the same partitions and elements per partition; data0 and data1 are not both
    in PSUM; op0 and op1 are arithmetic (not bitwise) ops.
    """

    dst: AP
    data0: AP
    data1: AP
    initial: Operand
    op0: Alu
    op1: Alu
    reverse0: bool = False
    reverse1: bool = False
    engine: Engine = Engine.VECTOR


@_instruction("tensor_reduce", (Engine.VECTOR, Engine.GPSIMD))
class TensorReduce(Instruction):
    """dst = op-reduction of src over the free ``axes`` (indices into src.free); ``negate`` negates."""

    dst: AP
    src: AP
    op: Alu
    axes: tuple[int, ...]
    negate: bool = False
    engine: Engine = Engine.VECTOR


@_instruction("bn_stats", (Engine.VECTOR,))
class BnStats(Instruction):
    """Mean/variance statistics of each partition of src (VectorE; NKI's ``bn_stats``), dst [P, 6]:
    ``(count, mean, variance * count)`` of the even-indexed elements, then the same of the odd-indexed ones
    (indices of the free dims flattened in row-major order). At most ``bn_stats_fmax`` elements per partition.

    NKI documents the record, not the algorithm; the choice here: FP32 Welford's update, element by element in
    order within each half (``n += 1; d = x - mean; mean += d / n; M2 += d * (x - mean)``, each operation rounded
    to FP32), then cast to dst's dtype (a float dtype). A half without elements gives (0, 0, 0).
    """

    dst: AP
    src: AP
    engine: Engine = Engine.VECTOR


@_instruction("bn_aggr", (Engine.VECTOR,))
class BnAggr(Instruction):
    """Aggregate ``(count, mean, variance * count)`` triples (the records of one or more ``bn_stats``: src
    [P, 3k]) into dst [P, 2] = (mean, population variance) per partition (VectorE; NKI's ``bn_aggr``).

    NKI does not state the combination; the choice here: FP32 Chan's parallel formula, triple by triple in order
    from a state (n, mean, M2) = (0, 0, 0): a triple of count 0 is skipped, else ``n' = n + nb; w = nb / n';
    d = mb - mean; mean += d * w; M2 = (M2 + M2b) + (d * d) * (n * w); n = n'``, each operation rounded to FP32; then
    variance = M2 / n (mean and variance both NaN when the total count is 0), cast to dst's dtype (a float dtype).
    """

    dst: AP
    src: AP
    engine: Engine = Engine.VECTOR


@_instruction("tensor_copy", _VSG)
class TensorCopy(Instruction):
    """dst = src, cast to dst's dtype."""

    dst: AP
    src: AP
    engine: Engine = Engine.VECTOR


@_instruction("memset", (Engine.VECTOR, Engine.GPSIMD))
class Memset(Instruction):
    dst: AP
    value: float
    engine: Engine = Engine.VECTOR


@_instruction("iota", (Engine.GPSIMD,))
class Iota(Instruction):
    """dst[p, i...] = offset + channel_multiplier * p + sum(steps[d] * i[d])."""

    dst: AP
    steps: tuple[int, ...]
    offset: int = 0
    channel_multiplier: int = 0
    engine: Engine = Engine.GPSIMD


@_instruction("affine_select", (Engine.GPSIMD,))
class AffineSelect(Instruction):
    """dst = src where cmp(offset + channel_multiplier * p + sum(steps[d] * i[d]), 0) else false_value."""

    dst: AP
    src: AP
    steps: tuple[int, ...]
    cmp: Alu
    false_value: float
    offset: int = 0
    channel_multiplier: int = 0
    engine: Engine = Engine.GPSIMD


@_instruction("select", (Engine.VECTOR,))
class Select(Instruction):
    """dst = on_true where predicate != 0 else on_false (an AP or an immediate)."""

    dst: AP
    predicate: AP
    on_true: AP
    on_false: Operand
    engine: Engine = Engine.VECTOR


@_instruction("partition_reduce", (Engine.GPSIMD,))
class PartitionReduce(Instruction):
    """dst[0, :] = op-reduction of src[:, :] over partitions (dst has one partition)."""

    dst: AP
    src: AP
    op: Alu
    engine: Engine = Engine.GPSIMD


@_instruction("partition_broadcast", (Engine.GPSIMD,))
class PartitionBroadcast(Instruction):
    """dst[p, :] = src[0, :] for every partition p of dst (src has one partition)."""

    dst: AP
    src: AP
    engine: Engine = Engine.GPSIMD


@_instruction("dma_copy", (Engine.SYNC,))
class DmaCopy(Instruction):
    """dst = src between any of HBM/SBUF/PSUM on DMA ``queue``; elements pair up in row-major order.

    Same dtype: bit exact. Integer to integer: direct (wrapping) cast. Otherwise through FP32.
    """

    dst: AP
    src: AP
    queue: int = 0
    engine: Engine = Engine.SYNC


@_instruction("dma_transpose", (Engine.SYNC,))
class DmaTranspose(Instruction):
    """dst[f, p] = src[p, f] on DMA ``queue``: src [P, F] (HBM rows or an SBUF tile) into an SBUF tile [F, P].

    The transpose is done by the DMA engines (NC-v3 and later, profile flag ``dma_transpose``); 2- and
    4-byte dtypes, dst and src of the same dtype, bit exact. Free patterns flatten in row-major order
    (F = src's elements per row, P = dst's elements per partition).
    """

    dst: AP
    src: AP
    queue: int = 0
    engine: Engine = Engine.SYNC


@_instruction("dma_gather", (Engine.SYNC,))
class DmaGather(Instruction):
    """dst[p, :] = src row ``index[p, 0]``; src's ``partitions`` is the table's row count."""

    dst: AP
    src: AP
    index: AP
    queue: int = 0
    engine: Engine = Engine.SYNC


@_instruction("dma_scatter", (Engine.SYNC,))
class DmaScatter(Instruction):
    """dst row ``index[p, 0]`` = src[p, :]; duplicate rows: the highest partition wins.

    With ``accumulate`` rows add (in FP32, rounded once; integer tables add exactly), duplicates all add.
    """

    dst: AP
    src: AP
    index: AP
    accumulate: bool = False
    queue: int = 0
    engine: Engine = Engine.SYNC

    def reads(self) -> tuple[AP, ...]:
        return (self.src, self.index, self.dst) if self.accumulate else (self.src, self.index)


DMA_OPCODES = frozenset({"dma_copy", "dma_transpose", "dma_gather", "dma_scatter"})
