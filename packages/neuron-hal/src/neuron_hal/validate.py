"""Static rules every driver enforces before running a program (docs/hardware.md §2.2, §2.3, §2.4).

Each broken rule raises :class:`ProgramError` naming the program, the instruction (index and
listing), the rule and the values, so a kernel author sees exactly what to change.
"""

from __future__ import annotations

import math

import numpy as np

from . import isa
from .dtypes import ENGINE_DTYPES, MATMUL_DTYPES, DType
from .errors import ProgramError
from .isa import AP, Engine, Space
from .profiles import Profile

# (program digest, profile) pairs known to pass (the rules are a function of the two alone), so a program the
# tracer validated is not checked again when a driver loads it. Bounded: oldest first out.
_PASSED: dict = {}
PASSED_MAX = 1 << 16


def validate(program, profile: Profile) -> None:
    """Raise ProgramError for the first instruction that breaks a rule."""
    key = (program.digest, profile)
    if key in _PASSED:
        return
    seen: set = set()  # operands already checked for an engine: programs reuse tiles heavily
    for index, ins in enumerate(program.instructions):
        try:
            _check(ins, program, profile, seen)
        except _Broken as b:
            raise ProgramError(program.name, index, str(ins), b.rule, b.detail) from None
    passed(program, profile)


def passed(program, profile: Profile) -> None:
    """Record that ``program`` passes every rule for ``profile``, so ``validate`` does not check it again. For
    callers that know it without checking: a store holding only programs that passed under this neuron_hal and
    profile, whose entry's content digest matches."""
    _PASSED[(program.digest, profile)] = None
    while len(_PASSED) > PASSED_MAX:
        del _PASSED[next(iter(_PASSED))]


class _Broken(Exception):
    def __init__(self, rule: str, detail: str):
        self.rule, self.detail = rule, detail


def _require(ok: bool, rule: str, detail) -> None:
    """Raise when not ok; ``detail`` may be a callable so messages are only built on failure."""
    if not ok:
        raise _Broken(rule, detail() if callable(detail) else detail)


def _operands(ins) -> list[tuple[str, AP]]:
    return [(n, v) for n in ins.operand_fields if isinstance(v := getattr(ins, n), AP)]


def _check(ins: isa.Instruction, program, profile: Profile, seen: set) -> None:
    if ins.engine not in ins.engines:
        raise _Broken(
            "engine", f"{ins.opcode} runs on {', '.join(e.value for e in ins.engines)}, not {ins.engine.value}"
        )
    is_dma = ins.engine is Engine.SYNC
    for dst in ins.writes():
        _require(_writes_once(dst), "destination overlap", lambda: f"destination {dst} writes some element twice")
    for name, ap in _operands(ins):
        key = (ap, ins.engine)
        if key not in seen:
            _check_ap(name, ap, ins, program, profile, is_dma)
            seen.add(key)
    if is_dma:
        _require(
            0 <= ins.queue < profile.dma_queues,
            "dma queue",
            lambda: f"queue {ins.queue} outside 0..{profile.dma_queues - 1}",
        )
    _SHAPE_RULES.get(type(ins), lambda i, p: None)(ins, profile)


def _check_ap(name: str, ap: AP, ins, program, profile: Profile, is_dma: bool) -> None:
    where = _Where(name, ap)
    _require(
        len(ap.free) <= profile.free_dims_max,
        "access pattern rank",
        lambda: f"{where}: {len(ap.free)} free dims > {profile.free_dims_max}",
    )
    _require(
        ap.partitions >= 0 and all(s >= 0 for s in ap.sizes), "access pattern size", lambda: f"{where}: negative size"
    )
    if ap.space is Space.HBM:
        _require(
            is_dma, "engine memory access", lambda: f"{where}: {ins.engine.value} engine cannot address HBM; use DMA"
        )
        _require(
            0 <= ap.tensor < len(program.args),
            "hbm tensor",
            lambda: f"{where}: tensor %{ap.tensor} is not one of the program's {len(program.args)} tensors",
        )
        if ap.num_elements == 0:
            return
        lo, hi = ap.byte_range()
        arg = program.args[ap.tensor]
        _require(
            lo >= 0 and hi <= arg.nbytes,
            "hbm bounds",
            lambda: f"{where}: bytes [{lo}, {hi}) outside tensor {arg.name!r} of {arg.nbytes} bytes",
        )
        return
    _check_on_chip(where, ap, ins, profile, is_dma)


def _check_on_chip(where: _Where, ap: AP, ins, profile: Profile, is_dma: bool) -> None:
    _require(
        1 <= ap.partitions <= profile.pmax,
        "partition limit",
        lambda: f"{where}: {ap.partitions} partitions, limit {profile.pmax}",
    )
    _require(
        0 <= ap.start_partition and ap.end_partition <= profile.sbuf_partitions,
        "partition range",
        lambda: f"{where}: partitions [{ap.start_partition}, {ap.end_partition}) outside 0..{profile.sbuf_partitions}",
    )
    if not is_dma:
        allowed = allowed_starts(ap.partitions)
        _require(
            ap.start_partition in allowed,
            "start partition",
            lambda: (
                f"{where}: an access of {ap.partitions} partitions must start at one of {allowed}, "
                f"not {ap.start_partition}"
            ),
        )
        _require(
            all(s <= profile.free_size_max for s in ap.sizes),
            "free size",
            lambda: f"{where}: free sizes {ap.sizes} exceed {profile.free_size_max}",
        )
        _require(
            all(abs(st) <= profile.free_stride_max for s, st in ap.free if s > 1),  # a size-1 dim never steps
            "free stride",
            lambda: f"{where}: strides {ap.strides} exceed {profile.free_stride_max}",
        )
        _require(
            ap.dtype in ENGINE_DTYPES,
            "engine dtype",
            lambda: f"{where}: {ins.engine.value} engine does not compute on {ap.dtype}",
        )
    capacity = profile.sbuf_partition_bytes if ap.space is Space.SBUF else profile.psum_partition_bytes
    lo, hi = ap.byte_range()
    _require(
        lo >= 0 and hi <= capacity,
        f"{ap.space.value} capacity",
        lambda: f"{where}: bytes [{lo}, {hi}) per partition outside the {capacity} bytes of {ap.space.value}",
    )
    if ap.space is Space.PSUM:
        _require(ins.engine is not Engine.GPSIMD, "engine memory access", lambda: f"{where}: GpSimd cannot access PSUM")
        if ins.engine is Engine.VECTOR:
            _require(
                ap.free_size <= profile.vector_fmax_psum,
                "vector psum free size",
                lambda: f"{where}: {ap.free_size} elements per partition from PSUM > {profile.vector_fmax_psum}",
            )


def _writes_once(ap: AP) -> bool:
    """Every element of the pattern has its own address (rows count as a dim in HBM). Nested dims decide it
    at once: taken from the smallest stride up, each stride clears the span of the dims before it.
    Interleaved ones ([3:2]{2:3} is 0 2 4 3 5 7) are decided from the addresses themselves."""
    dims = [(s, abs(st)) for s, st in ap.free if s > 1]
    if ap.space is Space.HBM and ap.partitions > 1:
        dims.append((ap.partitions, abs(ap.partition_stride)))
    span = 0
    for size, stride in sorted(dims, key=lambda d: d[1]):
        if stride == 0:
            return False
        if stride <= span:
            return _distinct(dims)
        span += (size - 1) * stride
    return True


def _distinct(dims: list[tuple[int, int]]) -> bool:
    offsets = np.zeros((), dtype=np.int64)
    for size, stride in dims:
        offsets = np.add.outer(offsets, np.arange(size, dtype=np.int64) * stride)
    return np.unique(offsets).size == offsets.size


class _Where:
    """'operand NAME (AP)', formatted only when a message is needed."""

    __slots__ = ("name", "ap")

    def __init__(self, name, ap):
        self.name, self.ap = name, ap

    def __format__(self, spec):
        return f"operand {self.name} ({self.ap})"


def allowed_starts(partitions: int) -> tuple[int, ...]:
    """Partitions an on-chip compute operand of ``partitions`` partitions may start at: >64 at 0; 33..64 at 0 or
    64; <=32 at any quadrant (docs/hardware.md §2.2). Kernels packing several small operands into one tile ask it."""
    if partitions > 64:
        return (0,)
    if partitions > 32:
        return (0, 64)
    return (0, 32, 64, 96)


def _same_shape(dst: AP, *aps: AP, rule="shape") -> None:
    for ap in aps:
        _require(
            ap.partitions == dst.partitions and ap.free_size == dst.free_size,
            rule,
            f"operand {ap.shape} does not match destination {dst.shape}",
        )


def _per_partition(dst: AP, v, name: str) -> None:
    if isinstance(v, AP):
        _require(
            v.partitions == dst.partitions and v.free_size == 1,
            "per-partition operand",
            lambda: f"{name} must be [{dst.partitions}, 1], got {list(v.shape)}",
        )


def _integer_operands(ins, op, *immediates) -> None:
    if op is not None and op.is_bitwise:
        for name, ap in _operands(ins):
            _require(
                not ap.dtype.is_float,
                "bitwise dtype",
                lambda: f"{op.value} needs integer operands; {name} is {ap.dtype}",
            )
        for v in immediates:
            _require(
                isinstance(v, AP) or float(v).is_integer(),
                "bitwise immediate",
                lambda: f"{op.value} needs an integer immediate, got {v!r}",
            )


def _matmul(ins: isa.Matmul, profile: Profile) -> None:
    st, mv, dst = ins.stationary, ins.moving, ins.dst
    _require(
        st.space is Space.SBUF and mv.space is Space.SBUF,
        "tensor engine reads SBUF",
        "stationary and moving must be in SBUF",
    )
    _require(
        dst.space is Space.PSUM, "tensor engine writes PSUM", lambda: f"dst must be in PSUM, not {dst.space.value}"
    )
    for name, ap in (("stationary", st), ("moving", mv)):
        _require(
            ap.dtype in MATMUL_DTYPES,
            "matmul dtype",
            lambda: f"{name} is {ap.dtype}; TensorE takes {', '.join(sorted(map(str, MATMUL_DTYPES)))}",
        )
    _require(
        (st.dtype is DType.float32) == (mv.dtype is DType.float32),
        "matmul dtype",
        lambda: f"stationary {st.dtype} and moving {mv.dtype} must both be fp32 or both not",
    )
    out_ok = {DType.float32} | ({DType.bfloat16} if profile.psum_bf16_output else set())
    _require(
        dst.dtype in out_ok,
        "matmul output dtype",
        lambda: f"PSUM output is {dst.dtype}; {profile.name} writes {', '.join(sorted(map(str, out_ok)))}",
    )
    _require(
        st.partitions == mv.partitions and st.start_partition == mv.start_partition,
        "contraction",
        lambda: (
            f"stationary K={st.partitions}@{st.start_partition} and "
            f"moving K={mv.partitions}@{mv.start_partition} differ"
        ),
    )
    _require(
        st.free_size <= profile.gemm_stationary_fmax,
        "stationary free size",
        lambda: f"stationary has {st.free_size} columns > {profile.gemm_stationary_fmax}",
    )
    _require(
        mv.free_size <= profile.gemm_moving_fmax,
        "moving free size",
        lambda: f"moving has {mv.free_size} columns > {profile.gemm_moving_fmax}",
    )
    _require(
        dst.partitions == st.free_size and dst.free_size == mv.free_size,
        "shape",
        lambda: f"dst {list(dst.shape)} must be [{st.free_size}, {mv.free_size}]",
    )
    lo, hi = dst.byte_range()
    bank = profile.psum_bank_bytes
    _require(
        lo // bank == (hi - 1) // bank,
        "psum bank",
        lambda: f"dst bytes [{lo}, {hi}) cross a {bank}-byte PSUM bank boundary",
    )


def _transpose(ins: isa.Transpose, profile: Profile) -> None:
    src, dst = ins.src, ins.dst
    limit = profile.pmax if ins.engine is Engine.TENSOR else 32
    _require(
        src.partitions <= limit and src.free_size <= limit,
        "transpose size",
        lambda: f"{ins.engine.value} transposes up to {limit}x{limit}, got {list(src.shape)}",
    )
    _require(
        dst.partitions == src.free_size and dst.free_size == src.partitions,
        "shape",
        lambda: f"dst {list(dst.shape)} must be [{src.free_size}, {src.partitions}]",
    )
    if ins.engine is Engine.TENSOR:
        _require(
            src.space is Space.SBUF and dst.space is Space.PSUM,
            "tensor engine reads SBUF",
            "TensorE transpose reads SBUF and writes PSUM",
        )
        _require(
            dst.dtype in (src.dtype, DType.float32),
            "transpose dtype",
            lambda: f"dst {dst.dtype} must be {src.dtype} or float32",
        )


def _activation(ins: isa.Activation, profile: Profile) -> None:
    _same_shape(ins.dst, ins.src)
    _per_partition(ins.dst, ins.scale, "scale")
    _per_partition(ins.dst, ins.bias, "bias")
    _per_partition(ins.dst, ins.reduce_dst, "reduce_dst")


def _tensor_tensor(ins: isa.TensorTensor, profile: Profile) -> None:
    _same_shape(ins.dst, ins.a, ins.b)
    _integer_operands(ins, ins.op)


def _tensor_scalar(ins: isa.TensorScalar, profile: Profile) -> None:
    _same_shape(ins.dst, ins.src)
    _per_partition(ins.dst, ins.operand0, "operand0")
    _per_partition(ins.dst, ins.operand1, "operand1")
    _require((ins.op1 is None) == (ins.operand1 is None), "tensor_scalar operands", "op1 and operand1 go together")
    _integer_operands(ins, ins.op0, ins.operand0)
    _integer_operands(ins, ins.op1, ins.operand1)
    if ins.engine is Engine.SCALAR:
        _require(
            profile.scalar_tensor_scalar,
            "engine",
            lambda: f"ScalarE runs tensor_scalar natively only from NC-v4; {profile.name} is NC-v{profile.nc_version}",
        )


def _scalar_tensor_tensor(ins: isa.ScalarTensorTensor, profile: Profile) -> None:
    _same_shape(ins.dst, ins.src, ins.operand1)
    _per_partition(ins.dst, ins.operand0, "operand0")
    _integer_operands(ins, ins.op0, ins.operand0)
    _integer_operands(ins, ins.op1)


def _tensor_tensor_scan(ins: isa.TensorTensorScan, profile: Profile) -> None:
    d0, d1 = ins.data0, ins.data1
    _same_shape(ins.dst, d0, d1)
    _per_partition(ins.dst, ins.initial, "initial")
    _require(
        not (d0.space is Space.PSUM and d1.space is Space.PSUM),
        "scan operands",
        "data0 and data1 are both in PSUM; at most one of them may be (put the other in SBUF)",
    )
    for name, op in (("op0", ins.op0), ("op1", ins.op1)):
        _require(
            not op.is_bitwise,
            "scan op",
            lambda: f"{name} is {op.value}, a bitvec op; the scan computes in FP32 and takes arithmetic ops only",
        )


def _bn_stats(ins: isa.BnStats, profile: Profile) -> None:
    src, dst = ins.src, ins.dst
    _require(
        src.free_size <= profile.bn_stats_fmax,
        "bn_stats free size",
        lambda: (
            f"src has {src.free_size} elements per partition > bn_stats_fmax {profile.bn_stats_fmax}; run bn_stats "
            f"on chunks of at most {profile.bn_stats_fmax} into one record tile and combine them with bn_aggr"
        ),
    )
    _require(
        dst.partitions == src.partitions and dst.free_size == 6,
        "shape",
        lambda: f"dst {list(dst.shape)} must be [{src.partitions}, 6] (count, mean, variance*count of even, odd)",
    )
    _float_record(dst, "bn_stats")


def _bn_aggr(ins: isa.BnAggr, profile: Profile) -> None:
    src, dst = ins.src, ins.dst
    _require(
        src.free_size >= 3 and src.free_size % 3 == 0,
        "bn_aggr input",
        lambda: (
            f"src has {src.free_size} elements per partition; bn_aggr takes whole (count, mean, variance*count) "
            "triples: a positive multiple of 3 (a bn_stats record is 6)"
        ),
    )
    _require(
        dst.partitions == src.partitions and dst.free_size == 2,
        "shape",
        lambda: f"dst {list(dst.shape)} must be [{src.partitions}, 2] (mean, variance)",
    )
    _float_record(dst, "bn_aggr")


def _float_record(dst: AP, opcode: str) -> None:
    _require(
        dst.dtype.is_float,
        "statistics dtype",
        lambda: f"{opcode} writes means and variances; dst is {dst.dtype}, use a float dtype (float32 keeps counts "
                "exact)",
    )


def _tensor_reduce(ins: isa.TensorReduce, profile: Profile) -> None:
    src, dst = ins.src, ins.dst
    _require(ins.op in isa.REDUCE_OPS, "reduce op", lambda: f"{ins.op.value} is not a reduction")
    _require(
        len(set(ins.axes)) == len(ins.axes) and all(0 <= a < len(src.free) for a in ins.axes),
        "reduce axes",
        f"axes {ins.axes} are not distinct free axes of {list(src.shape)}",
    )
    kept = math.prod(s for d, s in enumerate(src.sizes) if d not in ins.axes)
    _require(
        dst.partitions == src.partitions and dst.free_size == kept,
        "shape",
        lambda: f"dst {list(dst.shape)} must have {src.partitions} partitions of {kept} elements",
    )


def _tensor_copy(ins: isa.TensorCopy, profile: Profile) -> None:
    _same_shape(ins.dst, ins.src)
    if ins.engine is Engine.SCALAR:
        _require(
            profile.scalar_tensor_copy,
            "engine",
            lambda: (
                f"ScalarE tensor_copy needs NC-v3 or later; {profile.name} is NC-v{profile.nc_version} "
                "(use activation identity)"
            ),
        )


def _select(ins: isa.Select, profile: Profile) -> None:
    _same_shape(ins.dst, ins.predicate, ins.on_true, *([ins.on_false] if isinstance(ins.on_false, AP) else []))


def _affine(ins, profile: Profile) -> None:
    _require(
        len(ins.steps) == len(ins.dst.free),
        "pattern rank",
        lambda: f"{len(ins.steps)} steps for {len(ins.dst.free)} free dims",
    )
    if isinstance(ins, isa.AffineSelect):
        _same_shape(ins.dst, ins.src)
        _require(ins.cmp in isa.COMPARISONS, "affine_select comparison", lambda: f"{ins.cmp.value} is not a comparison")


def _partition_reduce(ins: isa.PartitionReduce, profile: Profile) -> None:
    _require(ins.op in isa.REDUCE_OPS, "reduce op", lambda: f"{ins.op.value} is not a reduction")
    _require(
        ins.dst.partitions == 1 and ins.dst.free_size == ins.src.free_size,
        "shape",
        lambda: f"dst {list(ins.dst.shape)} must be [1, {ins.src.free_size}]",
    )


def _partition_broadcast(ins: isa.PartitionBroadcast, profile: Profile) -> None:
    _require(
        ins.src.partitions == 1 and ins.dst.free_size == ins.src.free_size,
        "shape",
        lambda: f"src {list(ins.src.shape)} must be [1, {ins.dst.free_size}]",
    )


def _dma_copy(ins: isa.DmaCopy, profile: Profile) -> None:
    _require(
        ins.dst.num_elements == ins.src.num_elements,
        "shape",
        lambda: f"dst has {ins.dst.num_elements} elements, src {ins.src.num_elements}",
    )


def _dma_transpose(ins: isa.DmaTranspose, profile: Profile) -> None:
    src, dst = ins.src, ins.dst
    _require(
        profile.dma_transpose,
        "dma transpose",
        lambda: (
            f"{profile.name} (NC-v{profile.nc_version}) has no DMA transpose (it arrived with NC-v3); "
            "transpose on TensorE (nc_transpose) instead"
        ),
    )
    _require(
        dst.space is Space.SBUF,
        "dma transpose",
        lambda: f"dst must be in SBUF, not {dst.space.value}",
    )
    _require(
        src.space in (Space.HBM, Space.SBUF),
        "dma transpose",
        lambda: f"src must be in HBM or SBUF, not {src.space.value}",
    )
    _require(
        src.dtype is dst.dtype,
        "dma transpose dtype",
        lambda: f"src is {src.dtype} and dst {dst.dtype}; a DMA transpose does not cast",
    )
    _require(
        src.dtype.itemsize in (2, 4),
        "dma transpose dtype",
        lambda: f"{src.dtype} has {src.dtype.itemsize}-byte elements; DMA transposes 2- and 4-byte dtypes only",
    )
    _require(
        dst.partitions == src.free_size and dst.free_size == src.partitions,
        "shape",
        lambda: f"dst {list(dst.shape)} must be [{src.free_size}, {src.partitions}] (the transpose of src "
                f"[{src.partitions}, {src.free_size}]; dst partitions = src elements per row, at most {profile.pmax})",
    )


def _dma_indirect(ins, profile: Profile) -> None:
    table, tile = (ins.src, ins.dst) if isinstance(ins, isa.DmaGather) else (ins.dst, ins.src)
    _require(table.space is Space.HBM, "indirect dma", "the indexed table must be in HBM")
    _require(tile.on_chip and ins.index.on_chip, "indirect dma", "the tile and the index must be on chip")
    _require(
        ins.index.dtype in (DType.int32, DType.uint32), "index dtype", lambda: f"index is {ins.index.dtype}, not int32"
    )
    _require(
        ins.index.partitions == tile.partitions and ins.index.free_size == 1,
        "shape",
        lambda: f"index {list(ins.index.shape)} must be [{tile.partitions}, 1]",
    )
    _require(
        table.free_size == tile.free_size,
        "shape",
        lambda: f"table rows have {table.free_size} elements, the tile {tile.free_size}",
    )


_SHAPE_RULES = {
    isa.Matmul: _matmul,
    isa.Transpose: _transpose,
    isa.Activation: _activation,
    isa.TensorTensor: _tensor_tensor,
    isa.TensorScalar: _tensor_scalar,
    isa.ScalarTensorTensor: _scalar_tensor_tensor,
    isa.TensorTensorScan: _tensor_tensor_scan,
    isa.TensorReduce: _tensor_reduce,
    isa.BnStats: _bn_stats,
    isa.BnAggr: _bn_aggr,
    isa.TensorCopy: _tensor_copy,
    isa.Memset: lambda i, p: None,
    isa.Iota: _affine,
    isa.AffineSelect: _affine,
    isa.Select: _select,
    isa.PartitionReduce: _partition_reduce,
    isa.PartitionBroadcast: _partition_broadcast,
    isa.DmaCopy: _dma_copy,
    isa.DmaTranspose: _dma_transpose,
    isa.DmaGather: _dma_indirect,
    isa.DmaScatter: _dma_indirect,
}
