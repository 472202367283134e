"""Elementwise kernels with PyTorch semantics: unary math, binary ops with full broadcasting, where, clamp.

Every public kernel takes HBM tensors (any shape, contiguous row-major, including size-1 dims, zero-dim
tensors and empty tensors) and Python scalars (compile-time constants: immediates of the instructions),
and returns a new HBM tensor whose dtype follows torch's type promotion (:mod:`.promote`).

How a kernel is laid out (:class:`Tiler`)
-----------------------------------------
1. The output shape is the broadcast of the operand shapes. Each tensor operand gets strides in output
   coordinates, 0 along the dims it broadcasts; output dims of size 1 are dropped and neighbouring dims
   that every operand walks contiguously are merged (a same-shape op becomes one flat dim).
2. A tile is ``[partitions, g, inner...]``: the partition dim splits one output dim ``pd`` so that each
   partition holds ``g`` consecutive indices of it, and the free dims are ``g`` plus every dim after
   ``pd`` (at most 4 free dims). ``pd`` is the outermost dim whose inner block fits the per-partition
   tile budget (``tile_bytes``, a tunable), so each partition's DMA is one long contiguous run. The dims
   before ``pd`` and the chunks of ``pd`` are loops.
3. Broadcasting is done with access patterns, never by materializing in HBM: an operand's tile holds
   only its distinct elements (DMA of the dims where it has a stride; ``partition_stride`` 0 replicates
   a row across partitions), and the compute instruction reads it through a view with stride 0 along
   the broadcast free dims. An operand constant along all free dims is a ``[P, 1]`` per-partition
   scalar operand (``tensor_scalar``, cheaper than ``tensor_tensor``), a Python scalar an immediate.
4. The loop order is chosen to minimize the bytes loaded: an operand that does not depend on the inner
   loops is loaded once and reused (e.g. a bias row is loaded once for the whole kernel).

Engines and numerics
--------------------
Float math runs on VectorE (binary ops) and ScalarE (activation functions), computing in FP32 and
rounding once to the result dtype. Integer and bool results compute on GpSimd, whose integer mode is
exact and wraps to the result width like torch (comparisons of int32 values are exact too). Python
float scalars are FP32 immediates (as torch's ``opmath``). Ops made of several instructions spread them
over ScalarE, GpSimd and VectorE so that each tile's work flows one way through the engines and
consecutive tiles pipeline. Not supported: int64/uint64 tensors (engines compute on <= 32-bit values;
see :mod:`.promote`), complex numbers.

Speed (trn2 cost model, 16 MiB operands): single-instruction ops (add/sub/mul/div/max/min, comparisons,
where, clamp, every activation, neg/abs/sign, exp2/log2) run at 86-98% of the DMA roofline. Ops of
several instructions are engine bound (FP32 figures; 16-bit inputs halve the bytes, not the work): round
~83%, trunc ~80%, floor/ceil/expm1 ~74%, float remainder ~88%, log1p ~51%, integer remainder ~44%,
floor/trunc division ~21% (about 12 instructions per element, only worth it where torch semantics need
them).

Known differences from torch, all documented per kernel: ``sign(nan)`` is NaN (ScalarE sign), integer
division/remainder by zero gives an unspecified value instead of raising, ``round``/``floor``/``trunc``
may return +0.0 for -0.0 results, shift counts outside [0, 31] are clamped to [0, 63].
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from neuron_hal import Act, Alu, DType, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View
from . import promote

__all__ = [
    "Operand", "Loaded", "TileCtx", "Tiler", "run_elementwise", "broadcast_shapes",
    # unary
    "exp", "log", "tanh", "sigmoid", "relu", "gelu", "silu", "sqrt", "rsqrt", "reciprocal", "square", "abs", "sin",
    "cos", "softplus", "erf", "sign", "neg", "floor", "ceil", "round", "trunc", "clamp", "logical_not",
    "bitwise_not", "expm1", "log1p", "exp2", "log2",
    # binary
    "add", "sub", "mul", "div", "maximum", "minimum", "pow", "remainder", "fmod", "floor_divide", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "where",
]

F32, I32, U8, BOOL = DType.float32, DType.int32, DType.uint8, DType.bool_
VECTOR, SCALAR, GPSIMD = Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD
_WIDE = (DType.int64, DType.uint64)
TILE_BYTES = (32768, 16384, 65536)  # tunable: bytes per partition of the widest tile
# Tiling choices: the number of tiles wanted for load/compute/store overlap, and the number of rotating
# buffers each tile's bytes are budgeted for in SBUF.
PIPELINE_TILES = 4
SBUF_BUFFERS = 3


def min_run_bytes(profile) -> int:
    """Bytes per partition below which a tile is not split further: 2 KiB, the DMA guidance's "near peak"
    per partition [DMA-BW], and at least the run that moves at the engine's bandwidth (not its per-run floor)."""
    return max(2048, int(profile.dma_run_min_ns * profile.dma_engine_hbm_bytes_per_ns))
# FP32 integers: every float of magnitude >= 2**23 is an integer (the int32 round trip is exact below).
_F32_INTEGRAL = float(2 ** 23)


# ================================================================================================
# Operands
# ================================================================================================
@dataclass
class Operand:
    """One input of an elementwise op: an HBM tensor (``view``) or a Python scalar (``value``)."""

    view: View | None
    value: object
    dtype: DType
    load_dtype: DType | None = None  # dtype of the on-chip tile (the DMA casts when it differs)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape if self.view is not None else ()

    @property
    def is_scalar(self) -> bool:
        return self.view is None


def operand(x, op: str, name: str) -> Operand:
    if isinstance(x, View):
        if x.on_chip:
            raise KernelError(f"{op}: {name} must be an HBM tensor, got the tile {x!r}")
        if x.dtype in _WIDE:
            raise KernelError(f"{op}: {name} is {x.dtype}; the engines compute on values of at most 32 bits, so "
                              f"64-bit integer tensors must be converted to int32 by the caller")
        return Operand(x, None, x.dtype, x.dtype)
    if promote.is_scalar(x):
        return Operand(None, x, promote.scalar_dtype(x))
    raise KernelError(f"{op}: {name} must be a tensor or a Python scalar, got {x!r}")


def broadcast_shapes(*shapes, op: str = "broadcast") -> tuple[int, ...]:
    """numpy/torch broadcasting of shapes (right-aligned; size-1 dims stretch)."""
    k = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(k):
        sizes = {s[len(s) - k + i] for s in shapes if len(s) - k + i >= 0}
        big = sizes - {1}
        if len(big) > 1:
            raise KernelError(f"{op}: shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast")
        out.append(big.pop() if big else min(sizes))
    return tuple(out)


def _check_result(op: str, dtype: DType) -> None:
    if dtype in _WIDE:
        raise KernelError(f"{op}: the result dtype is {dtype} (torch's promotion), but the engines compute on values "
                          f"of at most 32 bits; convert to int32 first (e.g. pass an int32 tensor or an "
                          f"int32-range scalar with an int32 tensor)")


@dataclass
class Loaded:
    """An operand as one tile's compute instructions see it.

    ``imm``: a Python scalar. ``full``: an on-chip view of the tile's shape (stride 0 along broadcast
    dims). ``col``: a ``[P, 1]`` view when the operand is constant along the free dims. ``fresh``: the
    dense tile loaded for this tile alone, which the op may overwrite with its result.
    """

    dtype: DType
    imm: object = None
    full: View | None = None
    col: View | None = None
    fresh: View | None = None

    @property
    def scalar(self):
        """The tensor_scalar operand form (an immediate or a [P, 1] view), or None."""
        return self.imm if self.imm is not None else self.col

    @property
    def is_int(self) -> bool:
        return promote.category(self.dtype) < 2


def val(x) -> Loaded:
    """Wrap a tile view or a Python scalar as a :class:`Loaded`."""
    if isinstance(x, Loaded):
        return x
    if isinstance(x, View):
        return Loaded(x.dtype, full=x)
    return Loaded(promote.scalar_dtype(x), imm=x)


# ================================================================================================
# Tiling
# ================================================================================================
class TileCtx:
    """What an op's body sees for one tile: its shape ``[P, g, inner...]``, where it sits in the output
    (element ``[p, j...]`` of the tile is output flat index ``out_offset + p * pstride + j``, j the
    row-major index within the partition), and tile helpers."""

    def __init__(self, tiler: Tiler, shape: tuple[int, ...], out_offset: int, pstride: int):
        self.tiler, self.shape, self.out_offset, self.pstride = tiler, shape, out_offset, pstride

    @property
    def partitions(self) -> int:
        return self.shape[0]

    @property
    def free_size(self) -> int:
        return math.prod(self.shape[1:])

    def tile(self, dtype) -> View:
        return nl.ndarray(self.shape, dtype)

    def result(self, dtype, *candidates: Loaded) -> View:
        """A tile for the op's final result: a fresh input tile of that dtype when there is one (in place)."""
        dtype = DType.of(dtype)
        for c in candidates:
            if c.fresh is not None and c.fresh.dtype is dtype:
                return c.fresh
        return self.tile(dtype)


Body = Callable[[TileCtx, list[Loaded]], list[View]]


class Tiler:
    """Lays an elementwise op over tiles (see the module docstring) and emits its loads and stores."""

    def __init__(self, op: str, out_shape, inputs: list[Operand], out_dtypes, tile_bytes: int = TILE_BYTES[0],
                 temps: int = 0):
        self.op = op
        self.out_shape = tuple(int(s) for s in out_shape)
        self.inputs = inputs
        self.out_dtypes = [DType.of(d) for d in out_dtypes]
        self.tile_bytes, self.temps = tile_bytes, temps
        self._cache: dict = {}

    # -- the plan ------------------------------------------------------------------------------
    def _strides(self, x: Operand) -> tuple[int, list[int]]:
        """Base offset and strides of an operand in output coordinates (0 where it broadcasts)."""
        k = len(self.out_shape)
        dims = x.view.dims
        if len(dims) > k:
            raise KernelError(f"{self.op}: operand of shape {list(x.shape)} has more dims than the output")
        strides = [0] * k
        for i, (size, stride) in enumerate(dims):
            j = k - len(dims) + i
            if size != 1:
                strides[j] = stride
        return x.view.offset, strides

    def _collapse(self, strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
        keep = [i for i, s in enumerate(self.out_shape) if s != 1]
        dims = [self.out_shape[i] for i in keep]
        st = [[s[i] for i in keep] for s in strides]
        if not dims:
            return [1], [[0] for _ in strides]
        d, merged = [dims[0]], [[s[0]] for s in st]
        for i in range(1, len(dims)):
            if all(m[-1] == s[i] * dims[i] for m, s in zip(merged, st)):
                d[-1] *= dims[i]
                for m, s in zip(merged, st):
                    m[-1] = s[i]
            else:
                d.append(dims[i])
                for m, s in zip(merged, st):
                    m.append(s[i])
        return d, merged

    def _plan(self) -> None:
        tensors = [x for x in self.inputs if not x.is_scalar]
        bases, strides = [], []
        for x in tensors:
            b, s = self._strides(x)
            bases.append(b)
            strides.append(s)
        out_strides = []
        acc = 1
        for s in reversed(self.out_shape):
            out_strides.append(acc)
            acc *= s
        out_strides.reverse()
        D, S = self._collapse(strides + [out_strides])
        self.D, self.S, self.O, self.bases = D, S[:-1], S[-1], bases
        k = len(D)
        inner = [math.prod(D[i + 1:]) for i in range(k)]

        width = max([d.itemsize for d in self.out_dtypes] + [x.load_dtype.itemsize for x in tensors]
                    + ([4] if self.temps else []))
        per_elem = (sum(x.load_dtype.itemsize for x in tensors) + 4 * self.temps
                    + sum(d.itemsize for d in self.out_dtypes if d not in {x.load_dtype for x in tensors}))
        sbuf = nl.tile_size.sbuf_size_bytes
        F = max(1, min(self.tile_bytes // width, sbuf // (SBUF_BUFFERS * max(per_elem, 1)),
                       nl.profile().free_size_max))
        pd = next(i for i in range(k) if inner[i] <= F)
        pd = max(pd, k - (nl.profile().free_dims_max))
        P = nl.tile_size.pmax
        g = max(1, min(F // inner[pd], nl.cdiv(D[pd], P)))
        outer = math.prod(D[:pd])
        # few tiles: split further so loads, the compute stages and stores of consecutive tiles overlap (ops
        # with several compute stages across engines need more tiles in flight to fill their pipeline)
        tiles = PIPELINE_TILES * (4 if self.temps else 1)
        if outer * nl.cdiv(D[pd], P * g) < tiles:
            want = nl.cdiv(D[pd], P * nl.cdiv(tiles, outer))
            g = max(1, min(g, max(want, nl.cdiv(min_run_bytes(nl.profile()) // width, inner[pd]))))
        self.pd, self.g, self.P, self.inner = pd, g, P, inner[pd]

        chunks, full = [], D[pd] // (P * g)
        for c in range(full):
            chunks.append((c * P * g, P, g))
        rem, start = D[pd] - full * P * g, full * P * g
        if rem:
            gt = nl.cdiv(rem, P)
            pt = rem // gt
            chunks.append((start, pt, gt))
            if rem - pt * gt:
                chunks.append((start + pt * gt, 1, rem - pt * gt))
        self.chunks = chunks

        # loops: the dims before pd, then the chunks of pd ("c"); order them to load the fewest bytes
        loops = list(range(pd)) + ["c"]
        trips = {i: D[i] for i in range(pd)} | {"c": len(chunks)}
        self.order = loops
        if len(loops) <= 6:
            best = None
            for perm in itertools.permutations(loops):
                cost = sum(self._loads(j, perm, trips) * self._tile_bytes(j) for j in range(len(tensors)))
                if best is None or cost < best:
                    best, self.order = cost, list(perm)
        # operands whose tile never repeats may be overwritten in place
        self.unique = [all(self._depends(j, loop) for loop in loops if trips[loop] > 1) for j in range(len(tensors))]

    def _depends(self, j: int, loop) -> bool:
        s = self.S[j][self.pd] if loop == "c" else self.S[j][loop]
        return s != 0

    def _loads(self, j: int, order, trips) -> int:
        n, last = 1, 1
        for loop in order:
            n *= trips[loop]
            if self._depends(j, loop):
                last = n
        return last

    def _tile_bytes(self, j: int) -> int:
        s = self.S[j]
        free = [(self.g, s[self.pd])] + [(self.D[i], s[i]) for i in range(self.pd + 1, len(self.D))]
        x = [x for x in self.inputs if not x.is_scalar][j]
        return self.P * math.prod(n for n, st in free if st != 0) * x.load_dtype.itemsize

    # -- emission ------------------------------------------------------------------------------
    def _load(self, j: int, x: Operand, idx: dict, start: int, pt: int, gt: int) -> Loaded:
        s, D, pd = self.S[j], self.D, self.pd
        off = self.bases[j] + sum(idx[i] * s[i] for i in range(pd)) + start * s[pd]
        free = [(gt, s[pd])] + [(D[i], s[i]) for i in range(pd + 1, len(D))]
        kept = [(n, st) for n, st in free if st != 0 and n > 1]
        pstride = gt * s[pd]
        # the same elements for another tile (an operand that does not depend on the inner loops): reuse
        key = (x.view.owner.index, x.load_dtype, off, pstride if pt > 1 else 0, tuple(kept), pt)
        tile = self._cache.get(key)
        reused = tile is not None
        if not reused:
            shape = (pt, *[n for n, _ in kept]) if kept else (pt, 1)
            tile = self._cache[key] = nl.ndarray(shape, x.load_dtype, name="in")
            src = type(x.view)(x.view.owner, x.view.dtype, off, ((pt, pstride),) + (tuple(kept) or ((1, 1),)))
            nisa.dma_copy(tile, src)
        it = iter(tile.dims[1:])
        fdims = [next(it) if (st != 0 and n > 1) else (n, 0) for n, st in free]
        full = View(tile.owner, tile.dtype, tile.offset, (tile.dims[0], *fdims))
        dense = all(st != 0 for n, st in free if n > 1)
        return Loaded(x.load_dtype, full=full, col=None if kept else tile,
                      fresh=full if dense and self.unique[j] and not reused else None)

    def run(self, body: Body, outs: list[View]) -> None:
        if math.prod(self.out_shape) == 0:
            return
        self._plan()
        D, pd = self.D, self.pd
        trips = {i: range(D[i]) for i in range(pd)} | {"c": range(len(self.chunks))}
        for combo in itertools.product(*(trips[loop] for loop in self.order)):
            idx = dict(zip(self.order, combo))
            start, pt, gt = self.chunks[idx["c"]]
            shape = (pt, gt, *D[pd + 1:])
            out_off = sum(idx[i] * self.O[i] for i in range(pd)) + start * self.O[pd]
            row = gt * self.inner
            ctx = TileCtx(self, shape, out_off, row)
            loaded, t = [], 0
            for x in self.inputs:
                if x.is_scalar:
                    loaded.append(Loaded(x.dtype, imm=x.value))
                else:
                    loaded.append(self._load(t, x, idx, start, pt, gt))
                    t += 1
            results = body(ctx, loaded)
            for out, res in zip(outs, results):
                dst = type(out)(out.owner, out.dtype, out_off, ((pt, row), (row, 1)))
                nisa.dma_copy(dst, res.reshape(pt, row) if res.ndim != 2 or res.shape[1] != row else res)


def run_elementwise(op: str, out_shape, inputs: list[Operand], out_dtypes, body: Body, tile_bytes: int,
                    temps: int = 0) -> tuple[View, ...]:
    """Make the HBM outputs and lay ``body`` over their tiles."""
    out_dtypes = [DType.of(d) for d in out_dtypes]
    for d in out_dtypes:
        _check_result(op, d)
    outs = [nl.ndarray(out_shape, d, buffer=nl.hbm, name=f"out{i}" if len(out_dtypes) > 1 else "out")
            for i, d in enumerate(out_dtypes)]
    Tiler(op, out_shape, inputs, out_dtypes, tile_bytes, temps).run(body, outs)
    return tuple(outs)


# ================================================================================================
# Instruction helpers on Loaded values
# ================================================================================================
def emit(dst: View, x, y, alu: Alu, engine: Engine = VECTOR) -> View:
    """dst = x (alu) y, picking tensor_scalar when either side is an immediate or a [P, 1] column."""
    x, y = val(x), val(y)
    if y.scalar is not None and x.full is not None:
        nisa.tensor_scalar(dst, x.full, alu, y.scalar, engine=engine)
    elif x.scalar is not None and y.full is not None:
        nisa.tensor_scalar(dst, y.full, alu, x.scalar, reverse0=True, engine=engine)
    elif x.full is not None and y.full is not None:
        nisa.tensor_tensor(dst, x.full, y.full, alu, engine=engine)
    else:
        raise KernelError(f"{alu.value}: needs at least one tensor operand")
    return dst


def op2(ctx: TileCtx, dtype, x, y, alu: Alu, engine: Engine = VECTOR) -> View:
    return emit(ctx.tile(dtype), x, y, alu, engine)


def op_ts(ctx: TileCtx, dtype, x, alu0: Alu, s0, alu1: Alu | None = None, s1=None, engine: Engine = VECTOR,
          reverse0: bool = False) -> View:
    """A new tile = (x alu0 s0) alu1 s1 with scalar operands."""
    t = ctx.tile(dtype)
    nisa.tensor_scalar(t, val(x).full, alu0, s0, reverse0=reverse0, op1=alu1, operand1=s1, engine=engine)
    return t


def _engine_for(dtype: DType) -> Engine:
    """Integer/bool math runs exactly on GpSimd; float math on VectorE."""
    return GPSIMD if promote.category(dtype) < 2 else VECTOR


def _floor_like(ctx: TileCtx, x, mode: str, out: View | None = None) -> View:
    """floor / ceil / round / trunc of a float value into ``out`` (default: a new FP32 tile).

    The int32 cast rounds half to even (``round``); floor/ceil correct it by one where it rounded past x;
    trunc is x - fmod(x, 1) (exact). Where |x| >= 2**23 (every such float is an integer), inf or NaN, the
    result is x. The work flows one way through the engines (cast on ScalarE, integer fix-ups and fmod on
    GpSimd, range test and the final select on VectorE) so consecutive tiles pipeline.
    """
    x = val(x)
    if mode == "trunc":
        f = op_ts(ctx, F32, x, Alu.mod, 1.0, engine=GPSIMD)
        r = op2(ctx, F32, x, f, Alu.subtract, GPSIMD)
    else:
        r = ctx.tile(I32)
        nisa.activation(r, Act.identity, x.full)  # the cast to int32 rounds half to even
        if mode != "round":  # floor: one less where the cast rounded up past x; ceil: one more where below
            past = op2(ctx, U8, r, x, Alu.greater if mode == "floor" else Alu.less, GPSIMD)
            r = op2(ctx, I32, r, past, Alu.subtract if mode == "floor" else Alu.add, GPSIMD)
    small = op_ts(ctx, U8, x, Alu.abs_max, 0.0, Alu.less, _F32_INTEGRAL, engine=VECTOR)
    out = ctx.tile(F32) if out is None else out
    nisa.select(out, small, r, x.full)
    return out


def _round_half_even(ctx: TileCtx, x) -> View:
    return _floor_like(ctx, x, "round")


def _sign_int(ctx: TileCtx, x, dtype=I32) -> View:
    """-1/0/1 of an integer value, exactly (GpSimd)."""
    return op_ts(ctx, dtype, x, Alu.max, -1, Alu.min, 1, engine=GPSIMD)


# ================================================================================================
# Unary kernels
# ================================================================================================
def _unary(op: str, x, body, out_dtype, tile_bytes: int, temps: int = 0) -> View:
    a = operand(x, op, "input")
    if a.is_scalar:
        raise KernelError(f"{op}: input must be a tensor")
    return run_elementwise(op, a.shape, [a], [out_dtype], body, tile_bytes, temps)[0]


def _activation_kernel(name: str, act: Act, doc: str, int_same: Callable | None = None):
    """A unary float function on ScalarE. Integer/bool inputs give float32 unless ``int_same`` (an
    exact GpSimd implementation keeping the integer dtype, as torch does for abs/relu/sign/square)."""

    def fn(input, tile_bytes=TILE_BYTES[0]):
        dt = input.dtype
        if int_same is not None and promote.category(dt) < 2:
            if dt is BOOL:
                raise KernelError(f"{name}: not defined for bool tensors (as in torch)")
            return _unary(name, input, lambda ctx, ins: [int_same(ctx, ins[0])], dt, tile_bytes)
        out_dt = promote.float_result(dt)

        def body(ctx, ins):
            t = ctx.result(out_dt, ins[0])
            nisa.activation(t, act, ins[0].full)
            return [t]

        return _unary(name, input, body, out_dt, tile_bytes)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return kernel(fn, name=name, tunables={"tile_bytes": TILE_BYTES})


def _int_abs(ctx, x):
    return emit(ctx.result(x.dtype, x), x, 0, Alu.abs_max, GPSIMD)


def _int_relu(ctx, x):
    return emit(ctx.result(x.dtype, x), x, 0, Alu.max, GPSIMD)


def _int_sign(ctx, x):
    t = ctx.result(x.dtype, x)
    nisa.tensor_scalar(t, x.full, Alu.max, -1, op1=Alu.min, operand1=1, engine=GPSIMD)
    return t


def _int_square(ctx, x):
    return emit(ctx.result(x.dtype, x), x, x, Alu.multiply, GPSIMD)


exp = _activation_kernel("exp", Act.exp, "exp(input); integer/bool input gives float32.")
log = _activation_kernel("log", Act.log, "Natural log; log(0) = -inf, log(<0) = nan.")
tanh = _activation_kernel("tanh", Act.tanh, "tanh(input).")
sigmoid = _activation_kernel("sigmoid", Act.sigmoid, "1 / (1 + exp(-input)).")
silu = _activation_kernel("silu", Act.silu, "input * sigmoid(input).")
sqrt = _activation_kernel("sqrt", Act.sqrt, "Square root; nan below 0.")
rsqrt = _activation_kernel("rsqrt", Act.rsqrt, "1 / sqrt(input).")
reciprocal = _activation_kernel("reciprocal", Act.reciprocal, "1 / input.")
sin = _activation_kernel("sin", Act.sin, "sin(input).")
cos = _activation_kernel("cos", Act.cos, "cos(input).")
erf = _activation_kernel("erf", Act.erf, "The error function.")
relu = _activation_kernel("relu", Act.relu, "max(input, 0); integer input stays integer (exact).", _int_relu)
abs = _activation_kernel("abs", Act.abs, "|input|; integer input stays integer (abs(INT_MIN) wraps, as torch).",  # noqa: A001
                         _int_abs)
square = _activation_kernel("square", Act.square, "input * input; integer input stays integer (wraps).",
                            _int_square)
sign = _activation_kernel("sign", Act.sign, "-1, 0 or 1 in the input dtype (sign(nan) = nan, torch gives 0).",
                          _int_sign)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def gelu(input, approximate="none", tile_bytes=TILE_BYTES[0]):
    """GELU: ``approximate='none'`` is x * Phi(x) (erf form), ``'tanh'`` the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise KernelError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    act = Act.gelu if approximate == "none" else Act.gelu_tanh
    out_dt = promote.float_result(input.dtype)

    def body(ctx, ins):
        t = ctx.result(out_dt, ins[0])
        nisa.activation(t, act, ins[0].full)
        return [t]

    return _unary("gelu", input, body, out_dt, tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def softplus(input, beta=1.0, threshold=20.0, tile_bytes=TILE_BYTES[0]):
    """log(1 + exp(beta * x)) / beta, and x where beta * x > threshold (torch.nn.functional.softplus)."""
    out_dt = promote.float_result(input.dtype)
    beta, threshold = float(beta), float(threshold)

    def body(ctx, ins):
        x = ins[0]
        plain = beta == 1.0 and threshold >= 20.0  # above 20, softplus(x) rounds to x in fp32 anyway
        t = ctx.result(out_dt, x) if plain else ctx.tile(F32)
        nisa.activation(t, Act.softplus, x.full, scale=beta)
        if plain:
            return [t]
        if beta != 1.0:
            t = op_ts(ctx, F32, t, Alu.multiply, 1.0 / beta)
        over = op_ts(ctx, U8, x, Alu.multiply, beta, Alu.greater, threshold)
        out = ctx.result(out_dt, x)
        nisa.select(out, over, x.full, t)
        return [out]

    return _unary("softplus", input, body, out_dt, tile_bytes, temps=2)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def neg(input, tile_bytes=TILE_BYTES[0]):
    """-input (integers wrap, as torch; bool is an error, as torch)."""
    dt = input.dtype
    if dt is BOOL:
        raise KernelError("neg: negation of a bool tensor is not supported (as in torch); use logical_not")

    def body(ctx, ins):
        t = ctx.result(dt, ins[0])
        if promote.category(dt) < 2:
            nisa.tensor_scalar(t, ins[0].full, Alu.multiply, -1, engine=GPSIMD)
        else:
            nisa.activation(t, Act.identity, ins[0].full, scale=-1.0)
        return [t]

    return _unary("neg", input, body, dt, tile_bytes)


def _rounding_kernel(mode: str):
    def fn(input, tile_bytes=TILE_BYTES[0]):
        dt = input.dtype

        def body(ctx, ins):
            if promote.category(dt) < 2:  # integers are already integral
                t = ctx.tile(dt)
                nisa.tensor_copy(t, ins[0].full, engine=GPSIMD)
                return [t]
            return [_floor_like(ctx, ins[0], mode, ctx.result(dt, ins[0]))]

        return _unary(mode, input, body, dt, tile_bytes, temps=3)

    fn.__name__ = fn.__qualname__ = mode
    fn.__doc__ = {
        "floor": "Largest integer <= input, in the input dtype (integers unchanged).",
        "ceil": "Smallest integer >= input, in the input dtype (integers unchanged).",
        "round": "Round half to even (torch.round with decimals=0), in the input dtype.",
        "trunc": "Round toward zero, in the input dtype (integers unchanged).",
    }[mode]
    return kernel(fn, name=mode, tunables={"tile_bytes": TILE_BYTES})


floor, ceil, round, trunc = (_rounding_kernel(m) for m in ("floor", "ceil", "round", "trunc"))  # noqa: A001


@kernel(tunables={"tile_bytes": TILE_BYTES})
def logical_not(input, tile_bytes=TILE_BYTES[0]):
    """input == 0, as bool (nan is true, so logical_not(nan) is False)."""
    eng = _engine_for(input.dtype)
    return _unary("logical_not", input, lambda ctx, ins: [op_ts(ctx, BOOL, ins[0], Alu.equal, 0, engine=eng)],
                  BOOL, tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def bitwise_not(input, tile_bytes=TILE_BYTES[0]):
    """~input for integer tensors; logical not for bool."""
    dt = input.dtype
    if promote.category(dt) == 2:
        raise KernelError(f"bitwise_not: needs an integer or bool tensor, got {dt}")

    def body(ctx, ins):
        t = ctx.result(dt, ins[0])
        if dt is BOOL:
            nisa.tensor_scalar(t, ins[0].full, Alu.equal, 0, engine=GPSIMD)
        else:
            nisa.tensor_scalar(t, ins[0].full, Alu.bitwise_xor, -1, engine=GPSIMD)
        return [t]

    return _unary("bitwise_not", input, body, dt, tile_bytes)


_LN2 = math.log(2.0)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def exp2(input, tile_bytes=TILE_BYTES[0]):
    """2 ** input = exp(input * ln 2) (one ScalarE instruction; relative error grows as |input| * 2**-24)."""
    out_dt = promote.float_result(input.dtype)

    def body(ctx, ins):
        t = ctx.result(out_dt, ins[0])
        nisa.activation(t, Act.exp, ins[0].full, scale=_LN2)
        return [t]

    return _unary("exp2", input, body, out_dt, tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def log2(input, tile_bytes=TILE_BYTES[0]):
    """log(input) / ln 2."""
    out_dt = promote.float_result(input.dtype)

    def body(ctx, ins):
        t = ctx.tile(F32)
        nisa.activation(t, Act.log, ins[0].full)
        return [emit(ctx.result(out_dt, ins[0]), t, 1.0 / _LN2, Alu.multiply)]

    return _unary("log2", input, body, out_dt, tile_bytes, temps=1)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def expm1(input, tile_bytes=TILE_BYTES[0]):
    """exp(x) - 1, accurate near 0: 2t / (1 - t) with t = tanh(x / 2) for |x| < 0.5, exp(x) - 1 elsewhere."""
    out_dt = promote.float_result(input.dtype)

    def body(ctx, ins):
        x = ins[0]
        t = ctx.tile(F32)  # ScalarE -> GpSimd -> VectorE, so consecutive tiles pipeline
        nisa.activation(t, Act.tanh, x.full, scale=0.5)
        e = ctx.tile(F32)
        nisa.activation(e, Act.exp, x.full)
        den = op_ts(ctx, F32, t, Alu.multiply, -0.5, Alu.add, 0.5, engine=GPSIMD)  # (1 - t) / 2
        small = op2(ctx, F32, t, den, Alu.divide, GPSIMD)
        big = op_ts(ctx, F32, e, Alu.subtract, 1.0, engine=GPSIMD)
        near = op_ts(ctx, U8, x, Alu.abs_max, 0.0, Alu.less, 0.5)
        out = ctx.result(out_dt, x)
        nisa.select(out, near, small, big)
        return [out]

    return _unary("expm1", input, body, out_dt, tile_bytes, temps=5)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def log1p(input, tile_bytes=TILE_BYTES[0]):
    """log(1 + x), accurate near 0: log(u) * x / (u - 1) with u = 1 + x rounded (x itself when u == 1)."""
    out_dt = promote.float_result(input.dtype)

    def body(ctx, ins):
        x = ins[0]
        u = op_ts(ctx, F32, x, Alu.add, 1.0, engine=GPSIMD)
        d = op_ts(ctx, F32, u, Alu.subtract, 1.0, engine=GPSIMD)
        lu = ctx.tile(F32)
        nisa.activation(lu, Act.log, u)
        rd = ctx.tile(F32)
        nisa.activation(rd, Act.reciprocal, d)
        ratio = op2(ctx, F32, x, rd, Alu.multiply, GPSIMD)
        tiny = op_ts(ctx, U8, d, Alu.equal, 0.0, engine=GPSIMD)  # u == 1: log1p(x) = x to working precision
        prod = op2(ctx, F32, lu, ratio, Alu.multiply)
        out = ctx.result(out_dt, x)
        nisa.select(out, tiny, x.full, prod)
        return [out]

    return _unary("log1p", input, body, out_dt, tile_bytes, temps=5)


# ================================================================================================
# Binary kernels
# ================================================================================================
def _binary(op: str, a, b, out_dtype: Callable[[DType], DType], body: Callable, tile_bytes: int,
            compute: DType | None = None, temps: int = 0, load_as_compute: bool = False) -> View:
    """Broadcast a and b, find torch's compute dtype R (unless given) and the result dtype out_dtype(R)."""
    x, y = operand(a, op, "input"), operand(b, op, "other")
    if x.is_scalar and y.is_scalar:
        raise KernelError(f"{op}: at least one operand must be a tensor")
    R = compute or promote.result_type(*[o.view if o.view is not None else o.value for o in (x, y)])
    _check_result(op, R)
    for o in (x, y):
        if o.is_scalar:
            promote.check_scalar_fits(o.value, R)
        elif load_as_compute:
            o.load_dtype = R
    shape = broadcast_shapes(x.shape, y.shape, op=op)
    return run_elementwise(op, shape, [x, y], [out_dtype(R)], lambda ctx, ins: [body(ctx, R, *ins)], tile_bytes,
                           temps)[0]


def _same(r):
    return r


def _arith(ctx, R, x, y, alu):
    """One ALU op in R: exact integer arithmetic on GpSimd, FP32 on VectorE; result in place when possible."""
    return emit(ctx.result(R, x, y), x, y, alu, _engine_for(R))


def _scaled(ctx, R, y: Loaded, alpha) -> Loaded:
    if alpha == 1:
        return y
    if y.imm is not None:
        return Loaded(y.dtype, imm=y.imm * alpha)
    eng = _engine_for(R)
    return val(op_ts(ctx, R if eng is GPSIMD else F32, y, Alu.multiply, alpha, engine=eng))


def _check_alpha(op: str, a, b, alpha) -> None:
    kinds = [promote.category(o.dtype) for o in (a, b) if isinstance(o, View)]
    kinds += [promote.category(promote.scalar_dtype(o)) for o in (a, b) if not isinstance(o, View)]
    if max(kinds) < 2 and not float(alpha).is_integer():
        raise KernelError(f"{op}: for integral inputs, alpha must not be a floating point number (got {alpha})")


@kernel(tunables={"tile_bytes": TILE_BYTES})
def add(input, other, alpha=1, tile_bytes=TILE_BYTES[0]):
    """input + alpha * other, broadcasting; dtype by torch promotion (bool + bool = logical or)."""
    _check_alpha("add", input, other, alpha)
    return _binary("add", input, other, _same,
                   lambda ctx, R, x, y: _arith(ctx, R, x, _scaled(ctx, R, y, alpha), Alu.add), tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def sub(input, other, alpha=1, tile_bytes=TILE_BYTES[0]):
    """input - alpha * other, broadcasting (bool operands are an error, as in torch)."""
    for o in (input, other):
        if (o.dtype if isinstance(o, View) else promote.scalar_dtype(o)) is BOOL:
            raise KernelError("sub: subtraction with a bool operand is not supported (as in torch); use logical_xor")
    _check_alpha("sub", input, other, alpha)
    return _binary("sub", input, other, _same,
                   lambda ctx, R, x, y: _arith(ctx, R, x, _scaled(ctx, R, y, alpha), Alu.subtract), tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def mul(input, other, tile_bytes=TILE_BYTES[0]):
    """input * other, broadcasting (integers wrap)."""
    return _binary("mul", input, other, _same, lambda ctx, R, x, y: _arith(ctx, R, x, y, Alu.multiply), tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def maximum(input, other, tile_bytes=TILE_BYTES[0]):
    """Elementwise max, nan-propagating."""
    return _binary("maximum", input, other, _same, lambda ctx, R, x, y: _arith(ctx, R, x, y, Alu.max), tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def minimum(input, other, tile_bytes=TILE_BYTES[0]):
    """Elementwise min, nan-propagating."""
    return _binary("minimum", input, other, _same, lambda ctx, R, x, y: _arith(ctx, R, x, y, Alu.min), tile_bytes)


def _int_floor_div(ctx, x: Loaded, y: Loaded, trunc: bool) -> View:
    """Exact floor (or trunc) division of 32-bit integers on GpSimd: an FP32 quotient refined once with
    exact integer remainders (the FP32 guess is off by at most a few hundred; the second FP32 step on
    the small remainder is off by at most one, which the sign test fixes)."""
    def guess(num):
        q = op2(ctx, F32, num, y, Alu.divide, GPSIMD)
        qi = ctx.tile(I32)
        nisa.tensor_copy(qi, q, engine=GPSIMD)  # round to nearest even
        return qi

    def remainder(q):
        return op2(ctx, I32, x, op2(ctx, I32, q, y, Alu.multiply, GPSIMD), Alu.subtract, GPSIMD)

    q0 = guess(x)
    q1 = op2(ctx, I32, q0, guess(remainder(q0)), Alu.add, GPSIMD)
    r1 = remainder(q1)
    sy = (1 if y.imm > 0 else -1) if y.imm is not None else _sign_int(ctx, y)
    below = op_ts(ctx, I32, op2(ctx, I32, _sign_int(ctx, r1), sy, Alu.multiply, GPSIMD), Alu.less, 0,
                  engine=GPSIMD)  # a/b < q1: floor is one less
    q = op2(ctx, I32, q1, below, Alu.subtract, GPSIMD)
    if not trunc:
        return q
    frac = op_ts(ctx, I32, r1, Alu.not_equal, 0, engine=GPSIMD)
    neg_q = op_ts(ctx, I32, op2(ctx, I32, _sign_int(ctx, x), sy, Alu.multiply, GPSIMD), Alu.less, 0, engine=GPSIMD)
    return op2(ctx, I32, q, op2(ctx, I32, frac, neg_q, Alu.multiply, GPSIMD), Alu.add, GPSIMD)


def _float_floor_div(ctx, x: Loaded, y: Loaded) -> View:
    """torch's div_floor_floating: (a - fmod(a, b)) / b, one less when the remainder's sign differs from b's,
    rounded to the nearest integer; a / b where b == 0."""
    m = op2(ctx, F32, x, y, Alu.mod)
    q = op2(ctx, F32, op2(ctx, F32, x, m, Alu.subtract), y, Alu.divide)
    wrong = op_ts(ctx, F32, op2(ctx, F32, m, y, Alu.multiply), Alu.less, 0.0)
    r = _round_half_even(ctx, op2(ctx, F32, q, wrong, Alu.subtract))
    if y.imm is not None:
        return r if y.imm != 0 else op2(ctx, F32, x, y, Alu.divide)
    nonzero = op_ts(ctx, U8, y, Alu.not_equal, 0.0)
    out = ctx.tile(F32)
    nisa.select(out, nonzero, r, op2(ctx, F32, x, y, Alu.divide))
    return out


def _div_body(rounding_mode):
    def body(ctx, R, x, y):
        if rounding_mode is None:
            return emit(ctx.result(promote.float_result(R), x, y), x, y, Alu.divide, VECTOR)
        if promote.category(R) < 2:
            q = _int_floor_div(ctx, x, y, trunc=rounding_mode == "trunc")
            if R is I32:
                return q
            t = ctx.tile(R)
            nisa.tensor_copy(t, q, engine=GPSIMD)
            return t
        if rounding_mode == "trunc":
            q = _floor_like(ctx, op2(ctx, F32, x, y, Alu.divide), "trunc")
        else:
            q = _float_floor_div(ctx, x, y)
        if R is F32:
            return q
        t = ctx.result(R, x, y)
        nisa.tensor_copy(t, q)
        return t
    return body


@kernel(tunables={"tile_bytes": TILE_BYTES})
def div(input, other, rounding_mode=None, tile_bytes=TILE_BYTES[0]):
    """input / other. ``rounding_mode=None``: true division (integers give float32); ``'trunc'`` and
    ``'floor'`` keep torch's promoted dtype (integer division is exact; by zero it is unspecified)."""
    if rounding_mode not in (None, "trunc", "floor"):
        raise KernelError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    out = promote.float_result if rounding_mode is None else _same
    return _binary("div", input, other, out, _div_body(rounding_mode), tile_bytes,
                   temps=0 if rounding_mode is None else 8)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def floor_divide(input, other, tile_bytes=TILE_BYTES[0]):
    """torch.floor_divide: div(input, other, rounding_mode='floor')."""
    return _binary("floor_divide", input, other, _same, _div_body("floor"), tile_bytes, temps=8)


def _fmod_body(ctx, R, x, y):
    return emit(ctx.result(R, x, y), x, y, Alu.mod, _engine_for(R))


def _remainder_body(ctx, R, x, y):
    """Python-style modulo (sign of the divisor): fmod, plus the divisor where the signs differ (torch's
    formula)."""
    eng = _engine_for(R)
    if eng is GPSIMD:
        m = op2(ctx, R, x, y, Alu.mod, GPSIMD)
        sy = (1 if y.imm > 0 else -1) if y.imm is not None else _sign_int(ctx, y)
        fix = op_ts(ctx, I32, op2(ctx, I32, _sign_int(ctx, m), sy, Alu.multiply, GPSIMD), Alu.less, 0,
                    engine=GPSIMD)
        return op2(ctx, R, m, op2(ctx, R, fix, y, Alu.multiply, GPSIMD), Alu.add, GPSIMD)
    m = op2(ctx, F32, x, y, Alu.mod, GPSIMD)
    if y.imm is not None:
        b = float(y.imm)
        fix = op_ts(ctx, F32, m, Alu.less if b > 0 else Alu.greater, 0.0, Alu.multiply, b, engine=GPSIMD)
    else:
        wrong = op_ts(ctx, F32, op2(ctx, F32, m, y, Alu.multiply, GPSIMD), Alu.less, 0.0, engine=GPSIMD)
        fix = op2(ctx, F32, wrong, y, Alu.multiply)
    return emit(ctx.result(R, x, y), m, fix, Alu.add)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def fmod(input, other, tile_bytes=TILE_BYTES[0]):
    """C fmod: the remainder has the sign of input (integer fmod by zero is 0; torch raises)."""
    return _binary("fmod", input, other, _same, _fmod_body, tile_bytes)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def remainder(input, other, tile_bytes=TILE_BYTES[0]):
    """Python modulo: the remainder has the sign of other (torch.remainder)."""
    return _binary("remainder", input, other, _same, _remainder_body, tile_bytes, temps=4)


def _int_pow_scalar(ctx, R, x: Loaded, e: int) -> View:
    """x ** e for a non-negative integer e by repeated squaring, exact with wrapping (GpSimd)."""
    if e == 0:
        t = ctx.tile(R)
        nisa.memset(t, 1, engine=GPSIMD)
        return t
    result, base = None, x
    while e:
        if e & 1:
            result = base if result is None else val(op2(ctx, R, result, base, Alu.multiply, GPSIMD))
        e >>= 1
        if e:
            base = val(op2(ctx, R, base, base, Alu.multiply, GPSIMD))
    if result is x:
        t = ctx.tile(R)
        nisa.tensor_copy(t, x.full, engine=GPSIMD)
        return t
    return result.full


def _pow_body(ctx, R, x, y):
    if promote.category(R) < 2:
        if y.imm is not None:
            e = int(y.imm)
            if e < 0:
                raise KernelError("pow: integers to negative integer powers are not allowed (as in torch)")
            return _int_pow_scalar(ctx, R, x, e)
        # tensor exponents (or a scalar base) on integers: FP32 power, exact while |result| < 2**24
        return emit(ctx.tile(R), x, y, Alu.pow, VECTOR)
    if y.imm is not None:
        e = float(y.imm)
        t = ctx.result(R, x)
        if e == 2.0:
            nisa.activation(t, Act.square, x.full)
        elif e == 0.5:
            nisa.activation(t, Act.sqrt, x.full)
        elif e == 1.0:
            nisa.tensor_copy(t, x.full)
        elif e == 0.0:
            nisa.memset(t, 1.0)
        else:
            nisa.tensor_scalar(t, x.full, Alu.pow, e)
        return t
    return emit(ctx.result(R, x, y), x, y, Alu.pow, VECTOR)


@kernel(tunables={"tile_bytes": TILE_BYTES})
def pow(input, exponent, tile_bytes=TILE_BYTES[0]):  # noqa: A001
    """input ** exponent, broadcasting; either may be a Python scalar. An integer tensor to a non-negative
    integer scalar power is exact (wrapping); integer tensor exponents go through FP32 (exact while the
    result stays below 2**24)."""
    return _binary("pow", input, exponent, _same, _pow_body, tile_bytes, temps=2)


def _compare_kernel(name: str, alu: Alu, doc: str):
    def fn(input, other, tile_bytes=TILE_BYTES[0]):
        return _binary(name, input, other, lambda r: BOOL,
                       lambda ctx, R, x, y: emit(ctx.tile(BOOL), x, y, alu, _engine_for(R)), tile_bytes)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return kernel(fn, name=name, tunables={"tile_bytes": TILE_BYTES})


eq = _compare_kernel("eq", Alu.equal, "input == other as bool (integers compared exactly).")
ne = _compare_kernel("ne", Alu.not_equal, "input != other as bool.")
lt = _compare_kernel("lt", Alu.less, "input < other as bool.")
le = _compare_kernel("le", Alu.less_equal, "input <= other as bool.")
gt = _compare_kernel("gt", Alu.greater, "input > other as bool.")
ge = _compare_kernel("ge", Alu.greater_equal, "input >= other as bool.")


def _logical_kernel(name: str, alu: Alu):
    def fn(input, other, tile_bytes=TILE_BYTES[0]):
        return _binary(name, input, other, lambda r: BOOL,
                       lambda ctx, R, x, y: emit(ctx.tile(BOOL), x, y, alu, _engine_for(R)), tile_bytes)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{name.split('_')[1]} of the truth values (nonzero, nan included, is true), as bool."
    return kernel(fn, name=name, tunables={"tile_bytes": TILE_BYTES})


logical_and = _logical_kernel("logical_and", Alu.logical_and)
logical_or = _logical_kernel("logical_or", Alu.logical_or)
logical_xor = _logical_kernel("logical_xor", Alu.logical_xor)


def _bitwise_kernel(name: str, alu: Alu, doc: str):
    def fn(input, other, tile_bytes=TILE_BYTES[0]):
        def body(ctx, R, x, y):
            if promote.category(R) == 2:
                raise KernelError(f"{name}: needs integer or bool operands, the promoted dtype is {R}")
            if x.full is None:  # the bit pattern's signedness comes from the first tensor operand: keep x first
                t = ctx.tile(R)
                nisa.memset(t, x.imm, engine=GPSIMD)
                x = val(t)
            return emit(ctx.result(R, x, y), x, y, alu, GPSIMD)

        return _binary(name, input, other, _same, body, tile_bytes, load_as_compute=True)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return kernel(fn, name=name, tunables={"tile_bytes": TILE_BYTES})


bitwise_and = _bitwise_kernel("bitwise_and", Alu.bitwise_and, "input & other (integers and bool).")
bitwise_or = _bitwise_kernel("bitwise_or", Alu.bitwise_or, "input | other (integers and bool).")
bitwise_xor = _bitwise_kernel("bitwise_xor", Alu.bitwise_xor, "input ^ other (integers and bool).")
bitwise_left_shift = _bitwise_kernel(
    "bitwise_left_shift", Alu.left_shift, "input << other, truncated to the dtype (counts clamped to [0, 63]).")
bitwise_right_shift = _bitwise_kernel(
    "bitwise_right_shift", Alu.right_shift, "input >> other: arithmetic for signed, logical for unsigned dtypes.")


# ================================================================================================
# where, clamp
# ================================================================================================
@kernel(tunables={"tile_bytes": TILE_BYTES})
def where(condition, input, other, tile_bytes=TILE_BYTES[0]):
    """input where condition is nonzero else other, broadcasting all three; dtype by torch promotion of
    input and other (bit exact: no arithmetic)."""
    c = operand(condition, "where", "condition")
    x, y = operand(input, "where", "input"), operand(other, "where", "other")
    if c.is_scalar:
        raise KernelError("where: condition must be a tensor")
    R = promote.result_type(*[o.view if o.view is not None else o.value for o in (x, y)])
    _check_result("where", R)
    for o in (x, y):
        if o.is_scalar:
            promote.check_scalar_fits(o.value, R)
        else:
            o.load_dtype = R
    shape = broadcast_shapes(c.shape, x.shape, y.shape, op="where")

    def body(ctx, ins):
        cond, a, b = ins
        pred = cond.full
        if a.full is None:  # select needs a tensor for the true side: swap sides, invert the predicate
            if b.full is None:
                t = ctx.tile(R)
                nisa.memset(t, a.imm, engine=_engine_for(R))
                a = val(t)
            else:
                pred = op_ts(ctx, U8, cond, Alu.equal, 0, engine=_engine_for(cond.dtype))
                a, b = b, a
        out = ctx.result(R, a, b)
        nisa.select(out, pred, a.full, b.full if b.full is not None else b.imm)
        return [out]

    return run_elementwise("where", shape, [c, x, y], [R], body, tile_bytes)[0]


@kernel(tunables={"tile_bytes": TILE_BYTES})
def clamp(input, min=None, max=None, tile_bytes=TILE_BYTES[0]):  # noqa: A002
    """min(max(input, min), max) with either bound optional, a scalar or a broadcasting tensor; the dtype
    is torch's promotion of all three (nan in input propagates; min > max gives max)."""
    if min is None and max is None:
        raise KernelError("clamp: at least one of min and max must not be None")
    ops = [operand(input, "clamp", "input")] + [operand(v, "clamp", n) for n, v in (("min", min), ("max", max))
                                               if v is not None]
    if ops[0].is_scalar:
        raise KernelError("clamp: input must be a tensor")
    R = promote.result_type(*[o.view if o.view is not None else o.value for o in ops])
    _check_result("clamp", R)
    for o in ops[1:]:
        if o.is_scalar:
            promote.check_scalar_fits(o.value, R)
    shape = broadcast_shapes(*[o.shape for o in ops], op="clamp")
    alus = [a for a, v in ((Alu.max, min), (Alu.min, max)) if v is not None]
    eng = _engine_for(R)

    def body(ctx, ins):
        x, bounds = ins[0], ins[1:]
        out = ctx.result(R, *ins)
        if len(bounds) == 2 and bounds[0].scalar is not None and bounds[1].scalar is not None:
            nisa.tensor_scalar(out, x.full, alus[0], bounds[0].scalar, op1=alus[1], operand1=bounds[1].scalar,
                               engine=eng)
            return [out]
        cur = x
        for i, (alu, bnd) in enumerate(zip(alus, bounds)):
            dst = out if i == len(bounds) - 1 else ctx.tile(R if eng is GPSIMD else F32)
            cur = val(emit(dst, cur, bnd, alu, eng))
        return [out]

    return run_elementwise("clamp", shape, ops, [R], body, tile_bytes, temps=1)[0]
