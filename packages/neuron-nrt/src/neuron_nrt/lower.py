"""Lowering a neuron-hal ``Program`` to the source of one ``@nki.jit`` kernel in NKI's current API.

``to_nki(program, profile)`` is pure and deterministic (the same program gives the same text). The kernel:

- takes the program's ``in`` and ``inout`` HBM tensors as parameters (in program order), makes its ``out`` tensors
  with ``nl.ndarray(..., buffer=nl.shared_hbm)`` and returns them, and its ``scratch`` tensors with
  ``buffer=nl.private_hbm`` (not returned: per-run scratch, as NKI defines it);
- makes one ``nl.ndarray`` of bytes per on-chip space the program uses (SBUF, PSUM), placed at
  ``address=(0, 0)``, spanning the partitions and bytes the program touches; every on-chip operand is an access
  pattern over it at the program's own partition and byte offset, so the program's placement is kept exactly;
- issues one ``nisa`` call per instruction, in order, every operand an NKI access pattern
  ``tensor.ap(pattern=[[step, num], ...], offset=..., dtype=...)`` (partition pair first, steps and offset in
  elements of ``dtype``).

What NKI cannot express is not lowered: ``LOWERING`` is the one table of instruction -> status, and an instruction
(or an operand of one) outside it raises :class:`LoweringError` naming the instruction, its index and why.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re

from neuron_hal import AP, Act, Alu, DType, Engine, Profile, Program, Space, get_profile, isa, validate

LOWERED, NOT_LOWERED = "lowered", "not lowered"

# opcode -> (status, the NKI call or why there is none). README.md's table is this one.
LOWERING: dict[str, tuple[str, str]] = {
    "nc_matmul": (LOWERED, "`nisa.nc_matmul(dst, stationary, moving, accumulate=)`"),
    "nc_transpose": (LOWERED, "`nisa.nc_transpose(dst, data, engine=tensor|vector)`"),
    "activation": (LOWERED, "`nisa.activation(dst, op, data, bias=, scale=)`; with a fused sum: "
                            "`reduce_op=nl.add, reduce_res=, reduce_cmd=reset_reduce`"),
    "tensor_tensor": (LOWERED, "`nisa.tensor_tensor(dst, data1, data2, op, engine=)`"),
    "tensor_scalar": (LOWERED, "`nisa.tensor_scalar(dst, data, op0, operand0, reverse0, op1, operand1, reverse1, "
                               "engine=)`"),
    "scalar_tensor_tensor": (LOWERED, "`nisa.scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, "
                                      "reverse0, reverse1)`"),
    "tensor_tensor_scan": (LOWERED, "`nisa.tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0, "
                                    "reverse1)`"),
    "tensor_reduce": (LOWERED, "`nisa.tensor_reduce(dst, op, data, axis, negate)` (VectorE and GpSimd: NKI's "
                               "tensor_reduce names no engine, so a GpSimd reduction is issued without one); "
                               "reduced axes that are not the trailing free dims are moved there "
                               "(`trailing_reduce`)"),
    "bn_stats": (LOWERED, "`nisa.bn_stats(dst, data)`"),
    "bn_aggr": (LOWERED, "`nisa.bn_aggr(dst, data)`"),
    "tensor_copy": (LOWERED, "`nisa.tensor_copy(dst, src, engine=)`"),
    "memset": (LOWERED, "`nisa.memset(dst, value, engine=)`"),
    "iota": (LOWERED, "`nisa.iota(dst, pattern=[[step, num], ...], offset, channel_multiplier)`"),
    "affine_select": (LOWERED, "`nisa.affine_select(dst, pattern, offset, channel_multiplier, on_true_tile, "
                               "on_false_value, cmp_op)`"),
    "partition_reduce": (LOWERED, "`nisa.tensor_partition_reduce(dst, op, data)`"),
    "dma_copy": (LOWERED, "`nisa.dma_copy(dst, src)`; the DMA queue is the NKI compiler's choice (NKI has no queue "
                          "index)"),
    "dma_transpose": (LOWERED, "`nisa.dma_transpose(dst, src)`; queue as dma_copy"),
    "select": (LOWERED, "`nisa.select_reduce(dst, predicate, on_true, on_false)` without its reduction; on_false "
                        "an immediate or a per-partition column (an AP reading one element per partition); an "
                        "on_false tile of other values is not lowered (NKI takes a float or a [P, 1] vector). NKI's "
                        "documented dtype limits (integer predicate, on_true not a 32-bit integer) are not checked"),
    "partition_broadcast": (NOT_LOWERED, "no NKI instruction copies one partition to all (a ones-matmul or "
                                         "`nc_stream_shuffle` would change the instruction sequence)"),
    "dma_gather": (LOWERED, "`nisa.dma_copy(dst, src=table.ap(pattern=, offset=, vector_offset=index, "
                            "indirect_dim=0))`; the gather must be bounded by its tensor (NKI bounds an indirect "
                            "access by the tensor, the HAL by the AP's rows); the index tile keeps the program's "
                            "dtype (int32 from the library; NKI's examples use uint32)"),
    "dma_scatter": (LOWERED, "`nisa.dma_copy(dst=table.ap(..., vector_offset=index, indirect_dim=0), src)`, "
                             "`dst_rmw_op=nl.add` when it accumulates; bounded as dma_gather"),
}
assert set(LOWERING) == set(isa.OPCODES), "every opcode of the ISA has a lowering status"

# ALU ops and activation functions by their nki.language names; None: no NKI name with the HAL's semantics.
ALU_NAMES: dict[Alu, str | None] = {
    Alu.add: "add", Alu.subtract: "subtract", Alu.multiply: "multiply", Alu.divide: "divide",
    Alu.max: "maximum", Alu.min: "minimum", Alu.pow: "power", Alu.mod: "fmod",  # the HAL's mod is C fmod
    Alu.abs_max: None, Alu.equal: "equal", Alu.not_equal: "not_equal", Alu.greater: "greater",
    Alu.greater_equal: "greater_equal", Alu.less: "less", Alu.less_equal: "less_equal",
    Alu.logical_and: "logical_and", Alu.logical_or: "logical_or", Alu.logical_xor: "logical_xor",
    Alu.bitwise_and: "bitwise_and", Alu.bitwise_or: "bitwise_or", Alu.bitwise_xor: "bitwise_xor",
    Alu.left_shift: "left_shift", Alu.right_shift: "right_shift", Alu.bypass: "bypass",
}
ALU_WHY = {Alu.abs_max: "NKI's nl.abs_max (NeuronCore-v4) returns the operand of larger magnitude with its sign; "
                        "the HAL's abs_max is max(|a|, |b|)"}
ACT_NAMES: dict[Act, str] = {
    Act.identity: "copy", Act.exp: "exp", Act.log: "log", Act.tanh: "tanh", Act.sigmoid: "sigmoid",
    Act.relu: "relu", Act.gelu: "gelu", Act.gelu_tanh: "gelu_apprx_tanh", Act.silu: "silu", Act.sqrt: "sqrt",
    Act.rsqrt: "rsqrt", Act.reciprocal: "reciprocal", Act.square: "square", Act.abs: "abs", Act.sign: "sign",
    Act.sin: "sin", Act.cos: "cos", Act.softplus: "softplus", Act.erf: "erf",
}
assert set(ALU_NAMES) == set(Alu) and set(ACT_NAMES) == set(Act)
DTYPE_NAMES: dict[DType, str | None] = {d: d.name for d in DType} | {DType.int64: None, DType.uint64: None}
ENGINE_NAMES = {Engine.TENSOR: "tensor", Engine.VECTOR: "vector", Engine.SCALAR: "scalar", Engine.GPSIMD: "gpsimd"}
_SPACE_NAMES = {Space.SBUF: "sbuf", Space.PSUM: "psum"}
_ALIGN = 64  # bytes: each on-chip allocation's size per partition is rounded to this (any dtype divides it)


class LoweringError(NotImplementedError):
    """A program holds something NKI cannot express (the message names the instruction and why)."""


def to_nki(program: Program, profile: Profile | str | None = None) -> str:
    """The source of one ``@nki.jit`` kernel issuing ``program``'s instructions in order (module docstring)."""
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    validate(program, prof)
    names = _tensor_names(program)
    spaces = _on_chip_extents(program, prof)
    ctx = _Context(program, names, spaces)
    body = [_instruction(ctx, i, ins) for i, ins in enumerate(program.instructions)]
    return "\n".join(_header(program, prof, names, spaces) + ["    " + line for line in body] + _footer(program, names))


# -- names and allocations ------------------------------------------------------------------------------------------
_RESERVED = {"nki", "nl", "nisa", "sbuf", "psum"}


def _identifier(name: str, taken: set[str], fallback: str) -> str:
    ident = re.sub(r"\W", "_", name) or fallback
    if ident[0].isdigit():
        ident = "_" + ident
    if keyword.iskeyword(ident) or ident in _RESERVED:
        ident += "_"
    base, n = ident, 1
    while ident in taken:
        ident, n = f"{base}_{n}", n + 1
    taken.add(ident)
    return ident


def _tensor_names(program: Program) -> list[str]:
    """A Python identifier per program tensor (its own name where it is one; the front end names tensors after
    them, so a re-traced kernel keeps the program's names)."""
    taken = {_identifier(program.name, set(), "kernel")}
    return [_identifier(a.name, taken, f"t{i}") for i, a in enumerate(program.args)]


def _on_chip_extents(program: Program, prof: Profile) -> dict[Space, tuple[int, int]]:
    """(partitions, bytes per partition) each on-chip space's allocation must span."""
    ext: dict[Space, list[int]] = {}
    for ins in program.instructions:
        for ap in (*ins.reads(), *ins.writes()):
            if ap.on_chip:
                e = ext.setdefault(ap.space, [0, 0])
                e[0] = max(e[0], ap.end_partition)
                e[1] = max(e[1], ap.byte_range()[1])
    limit = {Space.SBUF: prof.sbuf_partition_bytes, Space.PSUM: prof.psum_partition_bytes}
    return {s: (p, min(limit[s], -(-b // _ALIGN) * _ALIGN)) for s, (p, b) in sorted(ext.items(), key=_space_key)}


def _space_key(item) -> str:
    return item[0].value


def _header(program: Program, prof: Profile, names: list[str], spaces) -> list[str]:
    kname = _identifier(program.name, set(), "kernel")
    params = [n for n, a in zip(names, program.args) if a.role in ("in", "inout")]
    lines = [f"# NKI kernel lowered from neuron-hal program {program.name!r} for profile {prof.name!r}",
             f"# (program digest {program.digest}) by neuron_nrt.lower.to_nki", "import nki",
             "import nki.isa as nisa", "import nki.language as nl", "", "", "@nki.jit",
             f"def {kname}({', '.join(params)}):"]
    for name, a in zip(names, program.args):
        if a.role in ("out", "scratch"):
            buf = "nl.shared_hbm" if a.role == "out" else "nl.private_hbm"
            lines.append(f"    {name} = nl.ndarray({_shape(a.shape)}, dtype={_dtype(a.dtype, a.name)}, "
                         f"buffer={buf}, name={a.name!r})")
    for space, (parts, nbytes) in spaces.items():
        s = _SPACE_NAMES[space]
        lines.append(f"    {s} = nl.ndarray(({parts}, {nbytes}), dtype=nl.uint8, buffer=nl.{s}, name={s!r}, "
                     f"address=(0, 0))")
    return lines


def _footer(program: Program, names: list[str]) -> list[str]:
    outs = [n for n, a in zip(names, program.args) if a.role == "out"]
    if not outs:
        return []
    return [f"    return {outs[0]}" if len(outs) == 1 else f"    return {', '.join(outs)}", ""]


def _shape(shape) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"  # () for a 0-d tensor


def _dtype(dt: DType, where: str) -> str:
    name = DTYPE_NAMES[dt]
    if name is None:
        raise LoweringError(f"{where}: dtype {dt} has no NKI equivalent (nki.language has no 64-bit integers)")
    return f"nl.{name}"


# -- operands -------------------------------------------------------------------------------------------------------
class _Context:
    def __init__(self, program: Program, names: list[str], spaces):
        self.program, self.names, self.spaces = program, names, spaces
        self.where = ""

    def fail(self, why: str) -> LoweringError:
        return LoweringError(f"{self.where}: {why}")

    def ap(self, ap: AP) -> str:
        """The NKI access pattern of ``ap``: ``tensor.ap(pattern=[[step, num], ...], offset=, dtype=)``."""
        size = ap.dtype.itemsize
        if any(st < 0 for _, st in ap.free):
            raise self.fail(f"operand {ap} has a negative free stride; NKI access patterns step forward")
        if ap.offset % size:
            raise self.fail(f"operand {ap} starts {ap.offset} bytes in, not a whole {ap.dtype} element")
        free = "".join(f", [{st}, {n}]" for n, st in ap.free)
        dt = _dtype(ap.dtype, self.where)
        if ap.space is Space.HBM:
            if ap.partition_stride < 0:
                raise self.fail(f"operand {ap} has a negative row stride; NKI access patterns step forward")
            base, row, first = self.names[ap.tensor], ap.partition_stride, ap.offset // size
        else:
            base = _SPACE_NAMES[ap.space]
            row = self.spaces[ap.space][1] // size  # elements of ap's dtype per partition of the allocation
            first = ap.start_partition * row + ap.offset // size
        return f"{base}.ap(pattern=[[{row}, {ap.partitions}]{free}], offset={first}, dtype={dt})"

    def operand(self, v) -> str:
        return self.ap(v) if isinstance(v, AP) else _number(v)

    def alu(self, op: Alu) -> str:
        name = ALU_NAMES[op]
        if name is None:
            raise self.fail(f"ALU op {op.name} cannot be lowered: {ALU_WHY[op]}")
        return f"nl.{name}"


def _number(v) -> str:
    v = float(v)
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


def _engine(e: Engine) -> str:
    return f"nisa.engine.{ENGINE_NAMES[e]}"


def _pattern(ctx: _Context, dst: AP, steps) -> str:
    if not dst.free or len(steps) != len(dst.free):
        raise ctx.fail(f"dst {dst} needs one free dim per step of {list(steps)} (NKI patterns are [step, num])")
    return "[" + ", ".join(f"[{s}, {n}]" for s, (n, _) in zip(steps, dst.free)) + "]"


# -- instructions ---------------------------------------------------------------------------------------------------
def _instruction(ctx: _Context, index: int, ins: isa.Instruction) -> str:
    ctx.where = f"program {ctx.program.name!r} instruction {index} ({ins.opcode}: {ins})"
    status, why = LOWERING[ins.opcode]
    if status is NOT_LOWERED:
        raise LoweringError(f"{ctx.where} cannot be lowered to NKI: {why}")
    args = _EMIT[ins.opcode](ctx, ins)
    return f"nisa.{args[0]}({', '.join(args[1:])})"


def _matmul(ctx, ins: isa.Matmul):
    return ("nc_matmul", f"dst={ctx.ap(ins.dst)}", f"stationary={ctx.ap(ins.stationary)}",
            f"moving={ctx.ap(ins.moving)}", f"accumulate={ins.accumulate}")


def _transpose(ctx, ins: isa.Transpose):
    return "nc_transpose", f"dst={ctx.ap(ins.dst)}", f"data={ctx.ap(ins.src)}", f"engine={_engine(ins.engine)}"


def _activation(ctx, ins: isa.Activation):
    args = ["activation", f"dst={ctx.ap(ins.dst)}", f"op=nl.{ACT_NAMES[ins.func]}", f"data={ctx.ap(ins.src)}",
            f"bias={ctx.ap(ins.bias) if ins.bias is not None else None}", f"scale={ctx.operand(ins.scale)}"]
    if ins.reduce_dst is not None:
        args += ["reduce_op=nl.add", f"reduce_res={ctx.ap(ins.reduce_dst)}",
                 "reduce_cmd=nisa.reduce_cmd.reset_reduce"]
    return tuple(args)


def _tensor_tensor(ctx, ins: isa.TensorTensor):
    return ("tensor_tensor", f"dst={ctx.ap(ins.dst)}", f"data1={ctx.ap(ins.a)}", f"data2={ctx.ap(ins.b)}",
            f"op={ctx.alu(ins.op)}", f"engine={_engine(ins.engine)}")


def _tensor_scalar(ctx, ins: isa.TensorScalar):
    op1 = ctx.alu(ins.op1) if ins.op1 is not None else None
    operand1 = ctx.operand(ins.operand1) if ins.operand1 is not None else None
    return ("tensor_scalar", f"dst={ctx.ap(ins.dst)}", f"data={ctx.ap(ins.src)}", f"op0={ctx.alu(ins.op0)}",
            f"operand0={ctx.operand(ins.operand0)}", f"reverse0={ins.reverse0}", f"op1={op1}",
            f"operand1={operand1}", f"reverse1={ins.reverse1}", f"engine={_engine(ins.engine)}")


def _scalar_tensor_tensor(ctx, ins: isa.ScalarTensorTensor):
    return ("scalar_tensor_tensor", f"dst={ctx.ap(ins.dst)}", f"data={ctx.ap(ins.src)}", f"op0={ctx.alu(ins.op0)}",
            f"operand0={ctx.operand(ins.operand0)}", f"op1={ctx.alu(ins.op1)}", f"operand1={ctx.ap(ins.operand1)}",
            f"reverse0={ins.reverse0}", f"reverse1={ins.reverse1}")


def _scan(ctx, ins: isa.TensorTensorScan):
    return ("tensor_tensor_scan", f"dst={ctx.ap(ins.dst)}", f"data0={ctx.ap(ins.data0)}",
            f"data1={ctx.ap(ins.data1)}", f"initial={ctx.operand(ins.initial)}", f"op0={ctx.alu(ins.op0)}",
            f"op1={ctx.alu(ins.op1)}", f"reverse0={ins.reverse0}", f"reverse1={ins.reverse1}")


def trailing_reduce(ins: isa.TensorReduce) -> isa.TensorReduce:
    """``ins`` with src's free dims reordered so the reduced ones come last (NKI's tensor_reduce reduces trailing
    dims): kept dims first in their order, then the reduced ones in theirs. dst's elements and the order in which
    each one's elements are combined are unchanged."""
    kept = [d for i, d in enumerate(ins.src.free) if i not in ins.axes]
    reduced = [d for i, d in enumerate(ins.src.free) if i in ins.axes]
    axes = tuple(range(len(kept), len(kept) + len(reduced)))
    if axes == tuple(sorted(ins.axes)):
        return ins
    return dataclasses.replace(ins, src=dataclasses.replace(ins.src, free=tuple(kept + reduced)), axes=axes)


def _tensor_reduce(ctx, ins: isa.TensorReduce):
    ins = trailing_reduce(ins)
    if not ins.axes:
        raise ctx.fail("a tensor_reduce over no axes (NKI's tensor_reduce needs at least one)")
    axes = tuple(a + 1 for a in ins.axes)  # NKI counts the partition dim
    axis = axes[0] if len(axes) == 1 else axes
    return ("tensor_reduce", f"dst={ctx.ap(ins.dst)}", f"op={ctx.alu(ins.op)}", f"data={ctx.ap(ins.src)}",
            f"axis={axis}", f"negate={ins.negate}")


def _unary(call: str, src_name: str = "data"):
    return lambda ctx, ins: (call, f"dst={ctx.ap(ins.dst)}", f"{src_name}={ctx.ap(ins.src)}")


def _tensor_copy(ctx, ins: isa.TensorCopy):
    return "tensor_copy", f"dst={ctx.ap(ins.dst)}", f"src={ctx.ap(ins.src)}", f"engine={_engine(ins.engine)}"


def _memset(ctx, ins: isa.Memset):
    return "memset", f"dst={ctx.ap(ins.dst)}", f"value={_number(ins.value)}", f"engine={_engine(ins.engine)}"


def _iota(ctx, ins: isa.Iota):
    return ("iota", f"dst={ctx.ap(ins.dst)}", f"pattern={_pattern(ctx, ins.dst, ins.steps)}",
            f"offset={ins.offset}", f"channel_multiplier={ins.channel_multiplier}")


def _affine_select(ctx, ins: isa.AffineSelect):
    if ins.src.free != ins.dst.free and ins.src.sizes != ins.dst.sizes:
        raise ctx.fail(f"on_true_tile {ins.src} and dst {ins.dst} have different free shapes (NKI reshapes the "
                       f"tile to the pattern's shape)")
    return ("affine_select", f"dst={ctx.ap(ins.dst)}", f"pattern={_pattern(ctx, ins.dst, ins.steps)}",
            f"offset={ins.offset}", f"channel_multiplier={ins.channel_multiplier}",
            f"on_true_tile={ctx.ap(ins.src)}", f"on_false_value={_number(ins.false_value)}",
            f"cmp_op={ctx.alu(ins.cmp)}")


def _partition_reduce(ctx, ins: isa.PartitionReduce):
    return "tensor_partition_reduce", f"dst={ctx.ap(ins.dst)}", f"op={ctx.alu(ins.op)}", f"data={ctx.ap(ins.src)}"


def _select(ctx, ins: isa.Select):
    on_false = ins.on_false
    if isinstance(on_false, AP):
        if any(st != 0 for n, st in on_false.free if n > 1):
            raise ctx.fail(f"on_false {on_false} is a tile of values; NKI's select_reduce takes a float or a [P, 1] "
                           f"column")
        on_false = dataclasses.replace(on_false, free=((1, 1),))  # the column the broadcast reads
    return ("select_reduce", f"dst={ctx.ap(ins.dst)}", f"predicate={ctx.ap(ins.predicate)}",
            f"on_true={ctx.ap(ins.on_true)}", f"on_false={ctx.operand(on_false)}")


def _indirect(ctx, table: AP, index: AP) -> str:
    """``table`` (an HBM AP whose rows the index picks) as NKI's vector-offset access pattern."""
    arg = ctx.program.args[table.tensor]
    size = table.dtype.itemsize
    total = math.prod(arg.shape) * arg.dtype.itemsize // size
    span = table.offset // size + table.free_extent()[1]
    rows = (total - span) // table.partition_stride + 1 if table.partition_stride > 0 else 0
    if table.partition_stride < 1 or rows != table.partitions:
        raise ctx.fail(f"the indexed table {table} holds {table.partitions} rows of stride "
                       f"{table.partition_stride}; NKI bounds an indirect access by its tensor ({rows} rows)")
    direct = ctx.ap(dataclasses.replace(table, partitions=index.partitions))
    return direct[:-1] + f", vector_offset={ctx.ap(index)}, indirect_dim=0)"


def _gather(ctx, ins: isa.DmaGather):
    return "dma_copy", f"dst={ctx.ap(ins.dst)}", f"src={_indirect(ctx, ins.src, ins.index)}"


def _scatter(ctx, ins: isa.DmaScatter):
    args = ["dma_copy", f"dst={_indirect(ctx, ins.dst, ins.index)}", f"src={ctx.ap(ins.src)}"]
    return (*args, "dst_rmw_op=nl.add") if ins.accumulate else tuple(args)


_EMIT = {
    "nc_matmul": _matmul, "nc_transpose": _transpose, "activation": _activation, "tensor_tensor": _tensor_tensor,
    "tensor_scalar": _tensor_scalar, "scalar_tensor_tensor": _scalar_tensor_tensor, "tensor_tensor_scan": _scan,
    "tensor_reduce": _tensor_reduce, "bn_stats": _unary("bn_stats"), "bn_aggr": _unary("bn_aggr"),
    "tensor_copy": _tensor_copy, "memset": _memset, "iota": _iota, "affine_select": _affine_select,
    "partition_reduce": _partition_reduce, "dma_copy": _unary("dma_copy", "src"),
    "dma_transpose": _unary("dma_transpose", "src"), "select": _select, "dma_gather": _gather,
    "dma_scatter": _scatter,
}
assert set(_EMIT) == {op for op, (s, _) in LOWERING.items() if s is LOWERED}


def markdown() -> str:
    """The lowering table as README.md shows it (a test keeps the two equal)."""
    rows = ["| instruction | status | NKI / why not |", "| --- | --- | --- |"]
    rows += [f"| `{op}` | {status} | {note} |" for op, (status, note) in LOWERING.items()]
    alu = ", ".join(f"`{op.name}` ({why})" for op, why in ALU_WHY.items())
    return "\n".join(rows) + f"\n\nALU ops without an NKI name of the same meaning (not lowered): {alu}.\n"
