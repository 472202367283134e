"""The functional half of the simulator: every instruction executed on the bytes of HBM, SBUF and PSUM.

Entry points
------------
- :class:`CoreMemory` -- one NeuronCore's SBUF and PSUM as ``uint8`` arrays, poisoned with ``0xFF``
  (NaN in every float dtype, -1 in signed ints) so reads of never-written memory show. Their rows
  are padded (one cache line) so that a walk down the partitions does not hit one cache set.
- :func:`run_values` -- execute a (validated) program in order.
- :func:`prepare_values` -> :class:`ValuesPlan` -- the reusable form: the plan turns each
  instruction into a step once; ``plan.run(hbm, addresses, core)`` runs them. On-chip views are
  bound once per :class:`CoreMemory` (cached in the plan); HBM views are built per run from the
  addresses (about 1 us each). :func:`run_values` keeps the plan on the program object.

Numerics (the ISA docstrings are normative; where they are silent, these are the choices)
------------------------------------------------------------------------------------------
- Vector/Scalar/GpSimd convert inputs to FP32, compute in FP32, and cast the result to the
  destination dtype. Float -> float casts round to nearest even (ml_dtypes/numpy; an FP8
  overflow follows ml_dtypes: inf for e5m2/e4m3, NaN for e4m3fn). Float -> int casts round half
  to even, saturate to the integer range, and send NaN to 0. Anything -> bool is ``!= 0``.
- GpSimd integer mode: when the engine is GpSimd and every tensor operand and the destination
  are integers, add/subtract/multiply/max/min/abs_max/mod, comparisons, logical ops, bypass,
  reductions, copies, iota, affine_select and partition ops compute exactly in int64, and the
  result *wraps* (two's complement) to the destination width, like C on the GpSimd cores and like
  torch integer arithmetic. Immediates take part exactly when integral and within the 32-bit
  range [-2**31, 2**32) (else that op computes in FP32).
  ``divide`` and ``pow`` always compute in FP32. Intermediates (op0 -> op1) stay int64.
- Bitwise ops (and shifts) act on integer bit patterns in a 32-bit domain: int32 when the
  first tensor operand is signed, uint32 otherwise (so ``right_shift`` is arithmetic for signed
  and logical for unsigned sources). Float intermediates feeding a bitwise op are cast to int32
  first. Shift counts are clamped to [0, 63]: counts >= 32 shift everything out. A bitwise op
  with an immediate that is not an integer in [-2**31, 2**32) raises ProgramError (rule
  "bitwise immediate").
- Comparisons and logical ops give 1/0 (NaN is "true" for logical ops, NaN compares unequal).
  ``max``/``min`` propagate NaN (IEEE maximum/minimum). ``divide`` by zero is IEEE FP32 (inf/NaN).
  ``mod`` is C ``fmod`` (result has the sign of the dividend; ``x mod 0`` is NaN in FP32, 0 in int
  mode). ``abs_max`` = max(|a|, |b|). ``bypass`` = first operand (after ``reverse``).
- Reductions (tensor_reduce, partition_reduce, activation's ``reduce_dst``) accumulate in FP32
  with numpy's pairwise order; empty reductions give the identity (0, 1, -inf, +inf, 0).
- Same-dtype data movement (dma_copy, dma_transpose, tensor_copy, transpose, partition_broadcast, gather,
  non-accumulating scatter, select when its data operands share the destination dtype) is bit
  exact, NaN payloads included.
- dma_copy between dtypes: int <-> int (any widths, bool as 0/1) casts directly (wraps);
  everything else goes through FP32.
- dma_scatter: duplicate indices without ``accumulate`` -> the highest partition wins. With
  ``accumulate``, all rows add in FP32 (int tables: exactly in int64, wrapping) and are rounded
  once into the table.
- nc_matmul: inputs widened to FP32, product by numpy FP32 matmul, added to (or stored into) the
  FP32 PSUM tile; a BF16 destination (trn3) accumulates in FP32 and rounds RNE once per matmul.
- scalar_tensor_tensor: ``op1(op0(src, operand0), operand1)`` in FP32 (VectorE), like tensor_scalar's
  two ops with a tensor second operand; the intermediate stays FP32 (not rounded to dst's dtype).
- tensor_tensor_scan: ``s = op1(op0(data0[i], s), data1[i])`` along the free dims flattened in row-major order,
  from ``s = initial`` (immediate rounded to FP32, or a [P, 1] column), every op rounded to FP32, the state kept
  in FP32 and each ``dst[i] = s`` rounded once to dst's dtype (a Numba loop, bit for bit the ALU ops above).
- bn_stats / bn_aggr: Welford's update (even and odd halves) and Chan's combination in FP32, in element / triple
  order, as the ISA docstrings state them; bn_aggr skips count-0 triples and gives NaN for a total count of 0.
- activation: ``f(src * scale + bias)`` with two FP32 roundings (multiply, then add);
  ``reduce_dst`` sums the FP32 results before their cast to ``dst``. gelu and erf are evaluated in
  float64 (piecewise Chebyshev interpolants of math.erf/math.erfc, relative error ~1e-13; gelu
  uses the erfc form so its negative tail stays accurate) and rounded to FP32 (Numba, module
  :mod:`neuron_sim.erf`); the others in FP32.
- NaN payloads: a NaN result is a NaN; which payload (and sign) it carries when two NaN operands
  meet is not specified (numpy's own loops pick differently by position and layout).
- iota/affine_select: the affine value ``offset + channel_multiplier * p + sum(steps[d] * i[d])``
  is exact in int64, with ``p`` the partition index *within the operand* (0..partitions-1).
- Every instruction computes its whole result before writing, so overlapping operands behave as
  a read-then-write.
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import weakref
from collections.abc import Callable

import numba
import numpy as np

from neuron_hal import isa
from neuron_hal.dtypes import DType
from neuron_hal.errors import ProgramError
from neuron_hal.isa import AP, Act, Alu, Engine, Space

from .erf import erf, erfc, gelu_erf_inplace
from .views import HbmView, onchip_view, raw_dtype

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
POISON = 0xFF

__all__ = ["CoreMemory", "ValuesPlan", "prepare_values", "run_values", "erf", "erfc", "cast_to", "dma_convert",
           "set_blas_threads_local"]


# ================================================================================================
# Core memory
# ================================================================================================
class CoreMemory:
    """One NeuronCore's on-chip state: ``sbuf`` uint8 [sbuf_partitions, sbuf_partition_bytes] and
    ``psum`` uint8 [sbuf_partitions, psum_partition_bytes], both poisoned (0xFF) when created. Both are views
    with padded rows (``strides[0]`` > the row's bytes; see :func:`_padded_rows`), not C-contiguous arrays.

    ``sbuf_hi`` / ``psum_hi`` are the highest byte offset (exclusive, per partition) written since
    the last :meth:`repoison`; runs raise them before executing.
    """

    def __init__(self, profile):
        self.profile = profile
        self.sbuf = _padded_rows(profile.sbuf_partitions, profile.sbuf_partition_bytes)
        self.psum = _padded_rows(profile.sbuf_partitions, profile.psum_partition_bytes)
        self.sbuf_hi = 0
        self.psum_hi = 0
        self.scratchpad = Scratchpad()

    def space(self, space: Space) -> np.ndarray:
        return self.sbuf if space is Space.SBUF else self.psum

    def note_written(self, sbuf_hi: int, psum_hi: int) -> None:
        if sbuf_hi > self.sbuf_hi:
            self.sbuf_hi = sbuf_hi
        if psum_hi > self.psum_hi:
            self.psum_hi = psum_hi

    def repoison(self) -> None:
        """Poison again the bytes written since the last repoison: ``[:, :hi]`` of each space."""
        if self.sbuf_hi:
            self.sbuf[:, :self.sbuf_hi] = POISON
            self.sbuf_hi = 0
        if self.psum_hi:
            self.psum[:, :self.psum_hi] = POISON
            self.psum_hi = 0


_ROW_PAD = 64  # bytes (one cache line) between the end of a partition's row and the start of the next


def _padded_rows(rows: int, row_bytes: int) -> np.ndarray:
    """A poisoned uint8 [rows, row_bytes] array whose rows are ``row_bytes + _ROW_PAD`` bytes apart. Partition
    sizes are multiples of 4 KiB: unpadded, the same column of every partition falls in the same cache set, and
    an access down the partitions (a [P, 1] operand, a transpose) misses on every row (6-9x slower)."""
    return np.full((rows, row_bytes + _ROW_PAD), POISON, np.uint8)[:, :row_bytes]


class Scratchpad:
    """Reusable work arrays of one core (one core runs one instruction at a time). Steps hold this,
    not the core, so a plan's per-core step cache (weak on the core) does not keep the core alive."""

    def __init__(self):
        self._arrays: dict = {}

    def get(self, key, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A work array (contents undefined): a view of the one buffer kept per (key, dtype), grown to the largest
        size asked for (a buffer per shape would grow with every new shape a job runs)."""
        n = math.prod(shape)
        k = (key, dtype)
        a = self._arrays.get(k)
        if a is None or a.size < n:
            a = self._arrays[k] = np.empty(n, dtype)
        return a[:n].reshape(shape)


# ================================================================================================
# Casts
# ================================================================================================
_INT_LIMITS = {}


def _limits(npdt: np.dtype) -> tuple[float, float]:
    lim = _INT_LIMITS.get(npdt)
    if lim is None:
        info = np.iinfo(npdt)
        lim = _INT_LIMITS[npdt] = (float(info.min), float(info.max))
    return lim


def _float_to_int(x: np.ndarray, npdt: np.dtype) -> np.ndarray:
    """Round half to even, saturate to npdt's range, NaN -> 0."""
    x = np.asarray(x)
    y = x.astype(F64) if (npdt.itemsize >= 4 or x.dtype != F32) else x.copy()
    np.rint(y, out=y)
    lo, hi = _limits(npdt)
    np.clip(y, lo, hi, out=y)
    np.nan_to_num(y, copy=False, nan=0.0)
    return y.astype(npdt)


def cast_to(x: np.ndarray, dt: DType) -> np.ndarray:
    """Cast a computed result (float32/float64 values, or exact int64/bool values) to ``dt``."""
    npdt = dt.numpy
    x = np.asarray(x)
    if x.dtype == npdt:
        return x
    kind = dt.kind
    if kind == "b":
        return x != 0
    if x.dtype.kind in "iub":  # exact integer values
        if kind in "iu":
            return x.astype(npdt)  # wraps
        if npdt == F32:
            return x.astype(F32)
        return x.astype(F64).astype(F32).astype(npdt)
    if kind in "iu":
        return _float_to_int(x, npdt)
    if x.dtype != F32 and npdt != F64:
        x = x.astype(F32)  # narrower floats round once from FP32, as the engines do
    if npdt == _BF16 and x.size >= _BF16_KERNEL_MIN_SIZE:
        x = np.ascontiguousarray(x)
        out = np.empty(x.shape, np.uint16)
        _f32_to_bf16_kernel(x.reshape(-1).view(np.uint32), out.reshape(-1))
        return out.view(_BF16)
    return x.astype(npdt)


_BF16 = DType.bfloat16.numpy
_BF16_KERNEL_MIN_SIZE = 256  # below this ml_dtypes' cast is as fast as the call into the kernel


@numba.njit(cache=True, nogil=True)
def _f32_to_bf16_kernel(src, dst):
    """FP32 bit patterns (uint32) -> BF16 bit patterns (uint16), rounding to nearest even; a NaN becomes the quiet
    NaN of its sign (0x7FC0 / 0xFFC0), as ml_dtypes does. numpy's cast through ml_dtypes is ~6x slower."""
    for i in range(src.size):
        b = src[i]
        if (b & 0x7FFFFFFF) > 0x7F800000:
            dst[i] = ((b >> 16) & 0x8000) | 0x7FC0
        else:
            dst[i] = (b + 0x7FFF + ((b >> 16) & 1)) >> 16


def dma_convert(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """DMA element conversion: int <-> int (bool as 0/1) directly, everything else through FP32."""
    if src is dst:
        return x
    if src.kind in "iub" and dst.kind in "iub":
        return x != 0 if dst.kind == "b" else x.astype(dst.numpy)
    return cast_to(_as_f32(x), dst)


def _to_f32(x):
    if isinstance(x, np.ndarray):
        return x if x.dtype == F32 else x.astype(F32)
    return np.float32(x)


def _to_int(x):
    """Values for a bitwise op: ints as they are, floats cast to int32 (RNE, saturating)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "iub":
            return x.astype(I64, copy=False)
        return _float_to_int(x, np.dtype(np.int32)).astype(I64)
    if isinstance(x, (int, np.integer)):
        return np.int64(x)
    return np.int64(_float_to_int(np.asarray(x, F64), np.dtype(np.int32)))


def _is_int(x) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "iub"
    return isinstance(x, (int, np.integer))


_WIDEN_LUTS: dict = {}
@numba.njit(cache=True, nogil=True)
def _lut_apply(lut, src, out):
    """out[i, j] = lut[src[i, j]] for 2-D uint8/uint16 src (any strides)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            out[i, j] = lut[src[i, j]]


def _widen_lut(dt: np.dtype) -> np.ndarray:
    lut = _WIDEN_LUTS.get(dt)
    if lut is None:
        lut = _WIDEN_LUTS[dt] = np.arange(1 << (8 * dt.itemsize), dtype=raw_dtype(dt)).view(dt).astype(F32)
    return lut


_LUT_WIDENED = frozenset(d.numpy for d in DType if d.is_float and d.itemsize <= 2 and d is not DType.bfloat16)
_LUT_MIN_SIZE = 2048  # below this numpy's cast is as fast as the call into the table kernel


def load_f32(v: np.ndarray) -> np.ndarray:
    """A new FP32 array of ``v``'s values (exact for every float dtype; ints round to nearest even)."""
    if v.dtype in _LUT_WIDENED and v.size >= _LUT_MIN_SIZE and v.ndim:
        src = v.view(raw_dtype(v.dtype)).reshape(v.shape[0], -1)
        out = np.empty(src.shape, F32)
        _lut_apply(_widen_lut(v.dtype), src, out)
        return out.reshape(v.shape)
    return v.astype(F32)


def _as_f32(v: np.ndarray) -> np.ndarray:
    """:func:`load_f32`, except that an FP32 view comes back as it is: for callers that only read it with
    operations whose results do not depend on the memory layout (casts, + - * /). Others (max/min's signed
    zeros, SIMD-or-not transcendental loops, reduction orders) keep :func:`load_f32`'s fresh array, so their
    numpy loops see the layout they always did."""
    return v if v.dtype == F32 else load_f32(v)


def widen_to_f32(v: np.ndarray, out: np.ndarray) -> None:
    """Exact upconversion of a 2-D float view to FP32 into ``out``: bf16 by numpy's (fast) cast, fp16
    and fp8 through a table of all their bit patterns (numpy's fp16 cast is ~6x slower)."""
    dt = v.dtype
    if dt.itemsize == 4 or dt == DType.bfloat16.numpy:
        np.copyto(out, v, casting="unsafe")
        return
    _lut_apply(_widen_lut(dt), v.view(raw_dtype(dt)), out)


# ================================================================================================
# ALU
# ================================================================================================
def _b2f(x):
    return x.astype(F32)


def _b2i(x):
    return x.astype(I64)


def _cmp_ops(conv):
    return {
        Alu.equal: lambda a, b: conv(np.equal(a, b)),
        Alu.not_equal: lambda a, b: conv(np.not_equal(a, b)),
        Alu.greater: lambda a, b: conv(np.greater(a, b)),
        Alu.greater_equal: lambda a, b: conv(np.greater_equal(a, b)),
        Alu.less: lambda a, b: conv(np.less(a, b)),
        Alu.less_equal: lambda a, b: conv(np.less_equal(a, b)),
        Alu.logical_and: lambda a, b: conv(np.logical_and(np.not_equal(a, 0), np.not_equal(b, 0))),
        Alu.logical_or: lambda a, b: conv(np.logical_or(np.not_equal(a, 0), np.not_equal(b, 0))),
        Alu.logical_xor: lambda a, b: conv(np.logical_xor(np.not_equal(a, 0), np.not_equal(b, 0))),
    }


_FLOAT_OPS: dict[Alu, Callable] = {
    Alu.add: np.add,
    Alu.subtract: np.subtract,
    Alu.multiply: np.multiply,
    Alu.divide: np.divide,
    Alu.max: np.maximum,
    Alu.min: np.minimum,
    Alu.pow: lambda a, b: np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype),  # see _alu32
    Alu.mod: np.fmod,
    Alu.abs_max: lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    Alu.bypass: lambda a, b: a,
    **_cmp_ops(_b2f),
}

_INT_OPS: dict[Alu, Callable] = {
    Alu.add: np.add,
    Alu.subtract: np.subtract,
    Alu.multiply: np.multiply,
    Alu.max: np.maximum,
    Alu.min: np.minimum,
    Alu.mod: np.fmod,  # int fmod by 0 gives 0 in numpy
    Alu.abs_max: lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    Alu.bypass: lambda a, b: a,
    **_cmp_ops(_b2i),
}

_BITWISE_OPS: dict[Alu, Callable] = {
    Alu.bitwise_and: np.bitwise_and,
    Alu.bitwise_or: np.bitwise_or,
    Alu.bitwise_xor: np.bitwise_xor,
    Alu.left_shift: lambda a, b: np.left_shift(a, np.clip(b, 0, 63)),
    Alu.right_shift: lambda a, b: np.right_shift(a, np.clip(b, 0, 63)),
}


_INT32 = np.dtype(np.int32)


def alu(op: Alu, a, b, int_mode: bool = False, wrap: np.dtype = _INT32):
    """One ALU op on computed values (arrays or scalars). Returns float32 or exact int64 values."""
    f = _BITWISE_OPS.get(op)
    if f is not None:
        return np.asarray(f(_to_int(a), _to_int(b))).astype(wrap).astype(I64)
    if int_mode and _is_int(a) and _is_int(b):
        f = _INT_OPS.get(op)
        if f is not None:
            return f(a, b)
    return _FLOAT_OPS[op](_to_f32(a), _to_f32(b))


def _reduce(op: Alu, x: np.ndarray, axis, keepdims: bool = False) -> np.ndarray:
    """Reduction over ``axis`` in FP32 (or exact int64 when x is int64)."""
    if x.dtype.kind in "iu":
        lo, hi = np.iinfo(I64).min, np.iinfo(I64).max
        if op is Alu.add:
            return np.add.reduce(x, axis=axis, keepdims=keepdims)
        if op is Alu.multiply:
            return np.multiply.reduce(x, axis=axis, keepdims=keepdims)
        if op is Alu.max:
            return np.maximum.reduce(x, axis=axis, keepdims=keepdims, initial=lo)
        if op is Alu.min:
            return np.minimum.reduce(x, axis=axis, keepdims=keepdims, initial=hi)
        return np.maximum.reduce(np.abs(x), axis=axis, keepdims=keepdims, initial=0)
    x = _to_f32(x)
    if op is Alu.add:
        return np.add.reduce(x, axis=axis, dtype=F32, keepdims=keepdims)
    if op is Alu.multiply:
        return np.multiply.reduce(x, axis=axis, dtype=F32, keepdims=keepdims)
    if op is Alu.max:
        return np.maximum.reduce(x, axis=axis, keepdims=keepdims, initial=-np.inf)
    if op is Alu.min:
        return np.minimum.reduce(x, axis=axis, keepdims=keepdims, initial=np.inf)
    if op is Alu.abs_max:
        return np.maximum.reduce(np.abs(x), axis=axis, keepdims=keepdims, initial=0.0)
    raise ValueError(f"{op.value} is not a reduction")


# ================================================================================================
# Activation functions (on a float32 array that may be modified in place)
# ================================================================================================
_SQRT_2_OVER_PI = np.float32(math.sqrt(2.0 / math.pi))


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(F32, copy=False)


def _erf_family(gelu: bool):
    """gelu = 0.5 x erfc(-x / sqrt 2) (the erfc form keeps the x << 0 tail accurate) or erf, in float64 (the
    activation step calls the kernel directly, on its FP32 copy of the argument)."""
    def f(x):
        return gelu_erf_inplace(np.array(x, F32, order="C"), gelu)
    return f


def _gelu_tanh(x):
    inner = _SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def _softplus(x):
    return np.maximum(x, np.float32(0)) + np.log1p(np.exp(-np.abs(x)))


ACTIVATIONS: dict[Act, Callable[[np.ndarray], np.ndarray]] = {
    Act.identity: lambda x: x,
    Act.exp: np.exp,
    Act.log: np.log,
    Act.tanh: np.tanh,
    Act.sigmoid: _sigmoid,
    Act.relu: lambda x: np.maximum(x, np.float32(0)),
    Act.gelu: _erf_family(True),
    Act.gelu_tanh: _gelu_tanh,
    Act.silu: lambda x: x * _sigmoid(x),
    Act.sqrt: np.sqrt,
    Act.rsqrt: lambda x: np.float32(1) / np.sqrt(x),
    Act.reciprocal: lambda x: np.float32(1) / x,
    Act.square: np.square,
    Act.abs: np.abs,
    Act.sign: np.sign,
    Act.sin: np.sin,
    Act.cos: np.cos,
    Act.softplus: _softplus,
    Act.erf: _erf_family(False),
}


# ================================================================================================
# BLAS threads
# ================================================================================================
def _find_blas_local_setter():
    """numpy's OpenBLAS ``openblas_set_num_threads_local`` (per calling thread), or None."""
    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libdir, "*openblas*.so*"))):
        try:
            fn = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        return fn
    return None


_BLAS_SET_LOCAL = _find_blas_local_setter()


def _blas_threads_wanted() -> int:
    try:
        return int(os.environ.get("NEURON_SIM_BLAS_THREADS", "1"))
    except ValueError:
        return 1


# OpenBLAS runs a GEMM of fewer multiply-adds than this on the calling thread whatever its thread count
# (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD = 65536 * 4): programs whose matmuls are
# all smaller skip setting and restoring the count (two library calls per run)
_BLAS_THREADED_MACS = 65536 * 4


def set_blas_threads_local(n: int) -> int | None:
    """Set the BLAS thread count of the calling thread only; return the previous count (None when
    numpy's OpenBLAS lacks the per-thread setter). Runs with matmuls use 1 (``NEURON_SIM_BLAS_THREADS``
    overrides, 0 leaves BLAS alone): a [128x128]x[128x512] product is too small to gain from
    threads, the spinning helper thread slows the conversions around it, and simulated cores run in
    parallel threads of their own."""
    if _BLAS_SET_LOCAL is None or n <= 0:
        return None
    return _BLAS_SET_LOCAL(n)


# ================================================================================================
# The plan
# ================================================================================================
class _Dynamic(Exception):
    """A rule broken at run time; turned into ProgramError with the instruction's index."""

    def __init__(self, rule: str, detail: str):
        self.rule, self.detail = rule, detail


Step = Callable[[np.ndarray, list], None]


class ValuesPlan:
    """A program turned into steps. Reusable across runs, HBM arrays, addresses and cores.

    - ``plan.run(hbm, addresses, core)``: execute; raises ProgramError for run-time rules.
    - ``plan.bind(core)``: the list of steps for ``core`` (cached per core); each step is a
      callable ``step(hbm, addresses)``. ``run`` uses it; exposed for drivers that interleave.
    - ``plan.sbuf_hi`` / ``plan.psum_hi``: highest on-chip byte offset any instruction writes.

    The plan keeps the program's name, tensor count and instructions, not the program object, so
    it can be cached weakly by program (or on it) without keeping it alive.
    """

    def __init__(self, program, profile=None):
        self.name = program.name
        self.instructions = program.instructions
        self.num_tensors = len(program.args)
        self.profile = profile
        self.sbuf_hi = 0
        self.psum_hi = 0
        for ins in set(program.instructions):  # programs repeat instructions: each distinct one once
            for ap in ins.writes():
                if ap.on_chip and ap.num_elements:
                    hi = ap.byte_range()[1]
                    if ap.space is Space.SBUF:
                        self.sbuf_hi = max(self.sbuf_hi, hi)
                    else:
                        self.psum_hi = max(self.psum_hi, hi)
        self.has_matmul = any(isinstance(ins, isa.Matmul) and ins.stationary.partitions * ins.stationary.free_size
                              * ins.moving.free_size >= _BLAS_THREADED_MACS for ins in program.instructions)
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def bind(self, core: CoreMemory) -> list[Step | None]:
        steps = self._bound.get(core)
        if steps is None:
            steps, made, binder = [], {}, _Binder(core)
            for index, ins in enumerate(self.instructions):
                step = made.get(ins, made)  # equal instructions share one (stateless) step
                if step is made:
                    if all(ap.num_elements == 0 for ap in ins.writes()):
                        step = None
                    else:
                        try:
                            with np.errstate(all="ignore"):
                                step = _BUILDERS[type(ins)](ins, binder)
                        except _Dynamic as d:
                            raise ProgramError(self.name, index, str(ins), d.rule, d.detail) from None
                    made[ins] = step
                steps.append(step)
            self._bound[core] = steps
        return steps

    def run(self, hbm: np.ndarray, addresses, core: CoreMemory) -> None:
        if len(addresses) != self.num_tensors:
            raise ValueError(f"program {self.name!r} has {self.num_tensors} tensors, got {len(addresses)} addresses")
        steps = self.bind(core)
        core.note_written(self.sbuf_hi, self.psum_hi)
        index = 0
        blas_prev = set_blas_threads_local(_blas_threads_wanted()) if self.has_matmul else None
        try:
            with np.errstate(all="ignore"):
                for index in range(len(steps)):
                    step = steps[index]
                    if step is not None:
                        step(hbm, addresses)
        except _Dynamic as d:
            raise ProgramError(self.name, index, str(self.instructions[index]), d.rule, d.detail) from None
        finally:
            if blas_prev is not None:
                set_blas_threads_local(blas_prev)


_PLAN_ATTR = "_neuron_sim_values_plan"


def prepare_values(program, profile=None) -> ValuesPlan:
    """Build the reusable plan of ``program`` (see :class:`ValuesPlan`)."""
    return ValuesPlan(program, profile)


def run_values(program, hbm: np.ndarray, addresses: list[int], core: CoreMemory, profile=None) -> None:
    """Execute every instruction of ``program`` in order on the bytes.

    ``hbm`` is the chip's HBM as a flat uint8 array and ``addresses[i]`` the byte address of
    ``program.args[i]`` in it. The program must have passed ``neuron_hal.validate``. The plan is
    kept on the program object (like its cached digest), so it lives and dies with the program
    and no digest is computed here.
    """
    attrs = getattr(program, "__dict__", None)
    plan = attrs.get(_PLAN_ATTR) if attrs is not None else None
    if plan is None:
        plan = ValuesPlan(program, profile)
        if attrs is not None:
            attrs[_PLAN_ATTR] = plan
    plan.run(hbm, addresses, core)


# ================================================================================================
# Step builders: each takes (instruction, binder) and returns step(hbm, addresses)
#
# Steps and operand getters take what they use as default arguments, not closure variables: a plan holds a
# step per distinct instruction, and each closure variable is a cell, one more object every full garbage
# collection walks (a compiled GPT step's plans: ~20k cells). Callers pass (hbm, addresses) and nothing more.
# ================================================================================================
class _Binder:
    """Makes operand getters ``g(hbm, addresses) -> view``: on-chip views are built now, HBM per call."""

    def __init__(self, core: CoreMemory):
        self.core = core
        self._views: dict = {}

    def get(self, ap: AP, dtype=None) -> Callable:
        if ap.space is Space.HBM:
            hv, t = HbmView(ap, dtype), ap.tensor

            def g(h, a, ap=ap, hv=hv, t=t):
                try:
                    return hv(h, a[t])
                except ValueError:
                    lo, hi = ap.byte_range()
                    raise _Dynamic("hbm bounds", f"{ap} at address {a[t]:#x} spans bytes "
                                                 f"[{a[t] + lo:#x}, {a[t] + hi:#x}) outside the "
                                                 f"{h.size}-byte HBM") from None
            return g
        key = (ap, dtype)
        g = self._views.get(key)
        if g is None:
            v = onchip_view(self.core.space(ap.space), ap, dtype)
            g = self._views[key] = lambda h, a, v=v: v
        return g

    def raw(self, ap: AP) -> Callable:
        return self.get(ap, raw_dtype(ap.dtype.numpy))


def _is_intlike(dt: DType) -> bool:
    return dt.kind in "iub"


def _int_mode(ins, *aps) -> bool:
    return ins.engine is Engine.GPSIMD and all(_is_intlike(ap.dtype) for ap in aps if isinstance(ap, AP))


def _loader(int_mode: bool):
    if int_mode:
        return lambda v: v.astype(I64)
    return load_f32


def _load_exact(v: np.ndarray) -> np.ndarray:
    """Integers as exact int64 (bitwise ops need the bit patterns; :func:`alu` converts them to FP32
    for arithmetic outside integer mode), floats as FP32."""
    return v.astype(I64) if v.dtype.kind in "iub" else load_f32(v)


def _wrap_dtype(ap: AP) -> np.dtype:
    return np.dtype(np.uint32) if ap.dtype.kind in "ub" else np.dtype(np.int32)


def _immediate(value, int_mode: bool, op: Alu | None):
    """An immediate as the ALU sees it: an exact integer for bitwise ops and in GpSimd integer mode
    when it is integral and fits a 32-bit register (int32 or uint32 range), else FP32."""
    v = float(value)
    exact = v.is_integer() and -(2 ** 31) <= v < 2 ** 32
    if op is not None and op.is_bitwise:
        if not exact:
            raise _Dynamic("bitwise immediate",
                           f"{op.value} needs an integral immediate in [-2**31, 2**32), got {value!r}")
        return np.int64(int(v))
    if int_mode and exact:
        return np.int64(int(v))
    return np.float32(v)


def _scalar_operand(B: _Binder, operand, src: AP, int_mode: bool, op: Alu):
    """Per-partition operand: an immediate, or a [P, 1] AP loaded to shape (P, 1, ..., 1)."""
    if not isinstance(operand, AP):
        imm = _immediate(operand, int_mode, op)
        return lambda h, a, imm=imm: imm
    g = B.get(operand)
    shape = (src.partitions,) + (1,) * len(src.free)
    return lambda h, a, g=g, shape=shape: _load_exact(g(h, a)).reshape(shape)


def _writer(B: _Binder, dst: AP):
    """write(h, a, values): cast computed values to dst's dtype and store them in dst's shape."""
    g, dt, shape, n = B.get(dst), dst.dtype, dst.shape, dst.num_elements

    def write(h, a, r, dt=dt, g=g, n=n, shape=shape):
        r = cast_to(r, dt)
        if r.shape != shape:
            r = r.reshape(shape) if r.size == n else np.broadcast_to(r, shape)
        g(h, a)[...] = r
    return write


def _matmul(ins: isa.Matmul, B: _Binder) -> Step:
    st, mv, dst = ins.stationary, ins.moving, ins.dst
    K, M, N = st.partitions, st.free_size, mv.free_size
    gs, gm, gd = B.get(st), B.get(mv), B.get(dst)
    pad = B.core.scratchpad
    acc, bf16_out = ins.accumulate, dst.dtype is not DType.float32
    dshape = dst.shape

    def widen(v, key, cols, K=K, pad=pad):
        if v.dtype == F32:
            return v.reshape(K, cols)
        buf = pad.get(key, (K, cols), F32)
        widen_to_f32(v.reshape(K, cols), buf)
        return buf

    def step(h, a, M=M, N=N, acc=acc, bf16_out=bf16_out, dshape=dshape, gd=gd, gm=gm, gs=gs, pad=pad, widen=widen):
        s = widen(gs(h, a), "mm_stationary", M)
        m = widen(gm(h, a), "mm_moving", N)
        res = pad.get("mm_result", (M, N), F32)
        np.matmul(s.T, m, out=res)
        d = gd(h, a)
        r = res if d.shape == (M, N) else res.reshape(dshape)
        if bf16_out:
            if acc:
                r = d.astype(F32) + r
            d[...] = r.astype(d.dtype)
        elif acc:
            d += r
        else:
            d[...] = r
    return step


def _transpose(ins: isa.Transpose, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    P, F = src.partitions, src.free_size
    dshape = dst.shape
    if src.dtype is dst.dtype:
        gs, gd = B.raw(src), B.raw(dst)

        def step(h, a, F=F, P=P, dshape=dshape, gd=gd, gs=gs):
            gd(h, a)[...] = gs(h, a).reshape(P, F).T.reshape(dshape)
        return step
    gs, write = B.get(src), _writer(B, dst)
    mode = _int_mode(ins, src, dst)
    load = _loader(mode)

    def step_cast(h, a, F=F, P=P, gs=gs, load=load, write=write):
        write(h, a, load(gs(h, a)).reshape(P, F).T)
    return step_cast


def _activation(ins: isa.Activation, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    gs, write = B.get(src), _writer(B, dst)
    func = ACTIVATIONS[ins.func]
    gscale = B.get(ins.scale) if isinstance(ins.scale, AP) else None
    imm = None if gscale is not None or float(ins.scale) == 1.0 else np.array([ins.scale], F32)
    gbias = B.get(ins.bias) if ins.bias is not None else None
    wred = _writer(B, ins.reduce_dst) if ins.reduce_dst is not None else None
    P, F = src.partitions, src.free_size
    prologue = gscale is not None or imm is not None or gbias is not None
    erf_family, gelu = ins.func in (Act.gelu, Act.erf), ins.func is Act.gelu
    bshape = (P,) + (1,) * len(src.free)

    def scale_bias(h, a, x, F=F, P=P, bshape=bshape, gbias=gbias, gscale=gscale, imm=imm):
        """x * scale + bias in place, each rounded to FP32."""
        s = gscale(h, a).astype(F32) if gscale is not None else imm
        b = gbias(h, a).astype(F32) if gbias is not None else None
        if x.flags.c_contiguous:  # one Numba pass instead of two or three numpy ones
            _scale_bias_kernel(x.reshape(P, F), _NO_OPERAND if s is None else s.reshape(-1),
                               _NO_OPERAND if b is None else b.reshape(-1))
            return
        if s is not None:
            x *= s.reshape(bshape) if s.size > 1 else s[0]
        if b is not None:
            x += b.reshape(bshape)

    def step(h, a, F=F, P=P, erf_family=erf_family, func=func, gelu=gelu, gs=gs, prologue=prologue,
             scale_bias=scale_bias, wred=wred, write=write):
        # a fresh FP32 array, laid out as ever: numpy's functions pick their loops (SIMD or not) from the layout
        x = load_f32(gs(h, a))
        if erf_family:  # the Numba kernel's results do not depend on the layout
            x = np.ascontiguousarray(x.reshape(P, F))
        if prologue:
            scale_bias(h, a, x)
        y = gelu_erf_inplace(x, gelu) if erf_family else func(x)
        if wred is not None:
            total = np.add.reduce(y.reshape(P, F), axis=1, dtype=F32)
            write(h, a, y)
            wred(h, a, total)
        else:
            write(h, a, y)
    return step


_NO_OPERAND = np.empty(0, F32)


@numba.njit(cache=True, nogil=True)
def _scale_bias_kernel(x, scale, bias):
    """Activation's argument in place on FP32 x [P, F]: x * scale, then + bias, each rounded to FP32. An operand
    of size 0 is absent, of size 1 an immediate, of size P one value per partition."""
    P, F = x.shape
    for q in range(P):
        s = scale[0] if scale.size == 1 else (scale[q] if scale.size > 1 else np.float32(1))
        b = bias[0] if bias.size == 1 else (bias[q] if bias.size > 1 else np.float32(0))
        if scale.size and bias.size:
            for j in range(F):
                x[q, j] = x[q, j] * s + b
        elif scale.size:
            for j in range(F):
                x[q, j] = x[q, j] * s
        else:
            for j in range(F):
                x[q, j] = x[q, j] + b


# IEEE operations: one correctly rounded result whichever numpy loop (SIMD or not, strided or not) computes it
_LAYOUT_FREE_OPS = frozenset({Alu.add, Alu.subtract, Alu.multiply, Alu.divide})
# comparisons as numpy ufuncs giving bool, which a numpy-native destination takes as the exact 0 / 1
_COMPARE_OUT = {Alu.equal: np.equal, Alu.not_equal: np.not_equal, Alu.greater: np.greater,
                Alu.greater_equal: np.greater_equal, Alu.less: np.less, Alu.less_equal: np.less_equal}
_NATIVE_01 = frozenset({DType.float32, DType.float16, DType.int32, DType.uint32, DType.int16, DType.uint16,
                        DType.int8, DType.uint8, DType.bool_})
_LOOP_01 = frozenset({DType.float32, DType.int32, DType.uint8})  # the compare loop's destinations (few compiles)


def _tensor_tensor(ins: isa.TensorTensor, B: _Binder) -> Step:
    ga, gb, write = B.get(ins.a), B.get(ins.b), _writer(B, ins.dst)
    mode = _int_mode(ins, ins.a, ins.b, ins.dst)
    load, op, wrap = _load_exact, ins.op, _wrap_dtype(ins.a)
    shape = ins.dst.shape
    fop = None if (mode or op.is_bitwise) else _FLOAT_OPS[op]
    if mode and op in _COMPARE_OUT and ins.dst.dtype in _LOOP_01:
        fast = _compare_loop(ins, B, fp32=False)  # integer mode: the integers compared exactly
        if fast is not None:
            return fast

    if fop is not None:  # the common FP32 case, without dispatch
        exact = op in _LAYOUT_FREE_OPS
        get = _as_f32 if exact or op in _COMPARE_OUT else load_f32
        # an FP32 destination takes the result directly (numpy buffers inputs that overlap the output); a
        # comparison's 0/1 goes straight into any numpy-native destination (the same values as through FP32)
        if op in _COMPARE_OUT and ins.dst.dtype in _NATIVE_01:
            fast = _compare_loop(ins, B, fp32=True) if ins.dst.dtype in _LOOP_01 else None
            if fast is not None:
                return fast
            fop, gd = _COMPARE_OUT[op], B.get(ins.dst)
        else:
            gd = B.get(ins.dst) if exact and ins.dst.dtype is DType.float32 else None

        def step_f(h, a, fop=fop, ga=ga, gb=gb, gd=gd, get=get, shape=shape, write=write):
            x = get(ga(h, a))
            y = get(gb(h, a))
            if x.shape != shape:
                x = x.reshape(shape)
            if y.shape != shape:
                y = y.reshape(shape)
            if gd is not None:
                fop(x, y, out=gd(h, a))
            else:
                write(h, a, fop(x, y))
        return step_f

    def step(h, a, ga=ga, gb=gb, load=load, mode=mode, op=op, shape=shape, wrap=wrap, write=write):
        x = load(ga(h, a)).reshape(shape)
        y = load(gb(h, a)).reshape(shape)
        write(h, a, alu(op, x, y, mode, wrap))
    return step


def _tensor_scalar(ins: isa.TensorScalar, B: _Binder) -> Step:
    src = ins.src
    mode = _int_mode(ins, src, ins.dst, ins.operand0, ins.operand1)
    layout_free = src.dtype.is_float and ins.op0 in _LAYOUT_FREE_OPS and ins.op1 in _LAYOUT_FREE_OPS | {None}
    gs, write, load = B.get(src), _writer(B, ins.dst), _as_f32 if layout_free else _load_exact
    wrap = _wrap_dtype(src)
    g0 = _scalar_operand(B, ins.operand0, src, mode, ins.op0)
    g1 = _scalar_operand(B, ins.operand1, src, mode, ins.op1) if ins.op1 is not None else None
    op0, op1, rev0, rev1 = ins.op0, ins.op1, ins.reverse0, ins.reverse1
    sshape = src.shape

    def step(h, a, g0=g0, g1=g1, gs=gs, load=load, mode=mode, op0=op0, op1=op1, rev0=rev0, rev1=rev1, sshape=sshape,
             wrap=wrap, write=write):
        x = load(gs(h, a))
        o = g0(h, a)
        r = alu(op0, o, x, mode, wrap) if rev0 else alu(op0, x, o, mode, wrap)
        if g1 is not None:
            o = g1(h, a)
            r = alu(op1, o, r, mode, wrap) if rev1 else alu(op1, r, o, mode, wrap)
        r = np.asarray(r)
        if r.shape != sshape:
            r = np.broadcast_to(r, sshape)
        write(h, a, r)
    return step


def _scalar_tensor_tensor(ins: isa.ScalarTensorTensor, B: _Binder) -> Step:
    src, dst, other = ins.src, ins.dst, ins.operand1
    mode = _int_mode(ins, src, dst, ins.operand0, other)  # VectorE: always FP32 (bitwise ops excepted)
    gs, go, write, load = B.get(src), B.get(other), _writer(B, dst), _load_exact
    wrap = _wrap_dtype(src)
    g0 = _scalar_operand(B, ins.operand0, src, mode, ins.op0)
    op0, op1, rev0, rev1 = ins.op0, ins.op1, ins.reverse0, ins.reverse1
    sshape = src.shape

    def step(h, a, g0=g0, go=go, gs=gs, load=load, mode=mode, op0=op0, op1=op1, rev0=rev0, rev1=rev1, sshape=sshape,
             wrap=wrap, write=write):
        x = load(gs(h, a))
        o = g0(h, a)
        r = alu(op0, o, x, mode, wrap) if rev0 else alu(op0, x, o, mode, wrap)
        r = np.broadcast_to(np.asarray(r), sshape)
        y = load(go(h, a)).reshape(sshape)
        write(h, a, alu(op1, y, r, mode, wrap) if rev1 else alu(op1, r, y, mode, wrap))
    return step


def _tensor_reduce(ins: isa.TensorReduce, B: _Binder) -> Step:
    src = ins.src
    mode = _int_mode(ins, src, ins.dst)
    gs, write, load = B.get(src), _writer(B, ins.dst), _loader(mode)
    axes = tuple(ax + 1 for ax in ins.axes)
    op, negate = ins.op, ins.negate

    def step(h, a, axes=axes, gs=gs, load=load, negate=negate, op=op, write=write):
        r = _reduce(op, load(gs(h, a)), axes)
        if negate:
            r = np.negative(r)
        write(h, a, r)
    return step


# FP32 ALU codes of the Numba kernels below (bitwise ops have none: the scan is arithmetic, validate enforces it)
_ALU32_CODES = {op: k for k, op in enumerate(
    (Alu.add, Alu.subtract, Alu.multiply, Alu.divide, Alu.max, Alu.min, Alu.pow, Alu.mod, Alu.abs_max, Alu.equal,
     Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal, Alu.logical_and, Alu.logical_or,
     Alu.logical_xor, Alu.bypass))}


@numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _alu32(op, a, b):
    """One ALU op on FP32 scalars with FP32 result, as :data:`_FLOAT_OPS` computes it on arrays (same IEEE
    operations, the same pow (below) and fmod; max/min propagate NaN like np.maximum/np.minimum's loops). Codes: the
    order of :data:`_ALU32_CODES`. Every branch returns float32, so the caller's state stays FP32. pow is the
    FP32 rounding of the float64 power in both paths: libm's and numpy's FP32 powers differ in the last bit
    (numpy's may be a SIMD approximation), and the hardware's rounding is not documented, so the simulator
    takes the most accurate answer wherever it computes one."""
    one, zero = np.float32(1.0), np.float32(0.0)
    if op == 0:
        return a + b
    if op == 1:
        return a - b
    if op == 2:
        return a * b
    if op == 3:
        return a / b
    if op == 4:
        return a if (a >= b or a != a) else b
    if op == 5:
        return a if (a <= b or a != a) else b
    if op == 6:
        return np.float32(np.float64(a) ** np.float64(b))
    if op == 7:
        return np.fmod(a, b)
    if op == 8:
        x, y = np.abs(a), np.abs(b)
        return x if (x >= y or x != x) else y
    if op == 9:
        return one if a == b else zero
    if op == 10:
        return one if a != b else zero
    if op == 11:
        return one if a > b else zero
    if op == 12:
        return one if a >= b else zero
    if op == 13:
        return one if a < b else zero
    if op == 14:
        return one if a <= b else zero
    if op == 15:
        return one if (a != zero and b != zero) else zero
    if op == 16:
        return one if (a != zero or b != zero) else zero
    if op == 17:
        return one if ((a != zero) != (b != zero)) else zero
    return a  # bypass


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_kernel(x0, x1, init, op0, op1, rev0, rev1, out):
    """tensor_tensor_scan on FP32 [P, N] rows: s = init[p]; s = op1(op0(x0, s), x1) element by element (reverse
    flags swap an op's operands); out[p, i] = s (FP32; the caller casts)."""
    P, N = x0.shape
    for p in range(P):
        s = init[p]
        for i in range(N):
            t = _alu32(op0, s, x0[p, i]) if rev0 else _alu32(op0, x0[p, i], s)
            s = _alu32(op1, x1[p, i], t) if rev1 else _alu32(op1, t, x1[p, i])
            out[p, i] = s


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _bn_stats_kernel(x, out):
    """bn_stats on FP32 [P, N] rows into out [P, 6]: Welford's update in FP32 over the even, then the odd
    elements: (count, mean, M2) each."""
    P, N = x.shape
    one = np.float32(1.0)
    for p in range(P):
        for h in range(2):
            n = mean = m2 = np.float32(0.0)
            for i in range(h, N, 2):
                v = x[p, i]
                n += one
                d = v - mean
                mean += d / n
                m2 += d * (v - mean)
            out[p, 3 * h] = n
            out[p, 3 * h + 1] = mean
            out[p, 3 * h + 2] = m2


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _bn_aggr_kernel(x, out):
    """bn_aggr on FP32 [P, 3k] (count, mean, M2) triples into out [P, 2] = (mean, M2 / count): Chan's combination
    in FP32, triple by triple; count-0 triples skipped; a total count of 0 gives NaN, NaN."""
    P, K = x.shape
    for p in range(P):
        n = mean = m2 = np.float32(0.0)
        for j in range(0, K - 2, 3):
            nb = x[p, j]
            if nb == 0:
                continue
            nab = n + nb
            w = nb / nab
            d = x[p, j + 1] - mean
            mean = mean + d * w
            m2 = (m2 + x[p, j + 2]) + (d * d) * (n * w)
            n = nab
        if n == 0:
            out[p, 0] = out[p, 1] = np.float32(np.nan)
        else:
            out[p, 0] = mean
            out[p, 1] = m2 / n


def _rows_f32(v: np.ndarray, P: int, N: int) -> np.ndarray:
    """An operand's values as a C-contiguous FP32 [P, N] array, the free dims flattened in row-major order."""
    return np.ascontiguousarray(_as_f32(v).reshape(P, N))


def _tensor_tensor_scan(ins: isa.TensorTensorScan, B: _Binder) -> Step:
    dst = ins.dst
    P, N = dst.partitions, dst.free_size
    g0, g1, write = B.get(ins.data0), B.get(ins.data1), _writer(B, dst)
    gi = B.get(ins.initial) if isinstance(ins.initial, AP) else None
    imm = np.full(P, np.float32(ins.initial), F32) if gi is None else None
    op0, op1 = _ALU32_CODES[ins.op0], _ALU32_CODES[ins.op1]
    rev0, rev1 = bool(ins.reverse0), bool(ins.reverse1)
    pad = B.core.scratchpad

    def step(h, a, N=N, P=P, g0=g0, g1=g1, gi=gi, imm=imm, op0=op0, op1=op1, pad=pad, rev0=rev0, rev1=rev1,
             write=write):
        x0, x1 = _rows_f32(g0(h, a), P, N), _rows_f32(g1(h, a), P, N)
        init = imm if gi is None else _rows_f32(gi(h, a), P, 1).reshape(P)
        out = pad.get("scan_out", (P, N), F32)
        _scan_kernel(x0, x1, init, op0, op1, rev0, rev1, out)
        write(h, a, out)
    return step


def _bn_stats(ins: isa.BnStats, B: _Binder) -> Step:
    src = ins.src
    P, N = src.partitions, src.free_size
    gs, write = B.get(src), _writer(B, ins.dst)

    def step(h, a, N=N, P=P, gs=gs, write=write):
        out = np.empty((P, 6), F32)
        _bn_stats_kernel(_rows_f32(gs(h, a), P, N), out)
        write(h, a, out)
    return step


def _bn_aggr(ins: isa.BnAggr, B: _Binder) -> Step:
    src = ins.src
    P, N = src.partitions, src.free_size
    gs, write = B.get(src), _writer(B, ins.dst)

    def step(h, a, N=N, P=P, gs=gs, write=write):
        out = np.empty((P, 2), F32)
        _bn_aggr_kernel(_rows_f32(gs(h, a), P, N), out)
        write(h, a, out)
    return step


def _tensor_copy(ins: isa.TensorCopy, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    dshape = dst.shape
    if src.dtype is dst.dtype:
        gs, gd = B.raw(src), B.raw(dst)
        same = src.shape == dshape

        def step(h, a, dshape=dshape, gd=gd, gs=gs, same=same):
            gd(h, a)[...] = gs(h, a) if same else gs(h, a).reshape(dshape)
        return step
    gs, write = B.get(src), _writer(B, dst)
    load = _loader(_int_mode(ins, src, dst))

    def step_cast(h, a, gs=gs, load=load, write=write):
        write(h, a, load(gs(h, a)))
    return step_cast


def _memset(ins: isa.Memset, B: _Binder) -> Step:
    dst = ins.dst
    gd = B.get(dst)
    v = float(ins.value)
    if dst.dtype.kind in "iu":
        value = _float_to_int(np.asarray(v, F64), dst.dtype.numpy)
    else:
        value = cast_to(np.asarray(v, F32), dst.dtype)

    def step(h, a, gd=gd, value=value):
        gd(h, a)[...] = value
    return step


def _affine(dst: AP, steps, offset: int, channel_multiplier: int) -> np.ndarray:
    """offset + channel_multiplier * p + sum(steps[d] * i[d]) over dst's shape, exact int64."""
    nd = 1 + len(dst.free)
    v = np.full(dst.shape, int(offset), I64)
    shape = [1] * nd
    shape[0] = dst.partitions
    v += np.arange(dst.partitions, dtype=I64).reshape(shape) * int(channel_multiplier)
    for d, (size, _) in enumerate(dst.free):
        shape = [1] * nd
        shape[d + 1] = size
        v += np.arange(size, dtype=I64).reshape(shape) * int(steps[d])
    return v


def _iota(ins: isa.Iota, B: _Binder) -> Step:
    values = cast_to(_affine(ins.dst, ins.steps, ins.offset, ins.channel_multiplier), ins.dst.dtype)
    gd = B.get(ins.dst)

    def step(h, a, gd=gd, values=values):
        gd(h, a)[...] = values
    return step


def _affine_select(ins: isa.AffineSelect, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    aff = _affine(dst, ins.steps, ins.offset, ins.channel_multiplier)
    mask = np.not_equal(alu(ins.cmp, aff, np.int64(0), True), 0)
    fv = _immediate(ins.false_value, _int_mode(ins, src, dst), None)
    mode = isinstance(fv, np.int64)  # exact only with an integral, 32-bit false_value
    gs, write, load = B.get(src), _writer(B, dst), _loader(mode)
    dshape = dst.shape

    def step(h, a, dshape=dshape, fv=fv, gs=gs, load=load, mask=mask, write=write):
        write(h, a, np.where(mask, load(gs(h, a)).reshape(dshape), fv))
    return step


def _select(ins: isa.Select, B: _Binder) -> Step:
    dst, on_false = ins.dst, ins.on_false
    dshape = dst.shape
    gp = B.get(ins.predicate)
    false_ap = isinstance(on_false, AP)
    native = ins.on_true.dtype is dst.dtype and (not false_ap or on_false.dtype is dst.dtype)
    if native:  # bit exact: select between raw patterns of the destination dtype
        gt, gd = B.raw(ins.on_true), B.raw(dst)
        if false_ap:
            gf = B.raw(on_false)
        else:
            fv = cast_to(np.asarray(float(on_false), F64), dst.dtype).view(raw_dtype(dst.dtype.numpy))

            def gf(h, a, fv=fv):
                return fv

        def step(h, a, dshape=dshape, false_ap=false_ap, gd=gd, gf=gf, gp=gp, gt=gt):
            pred = gp(h, a).astype(F32).reshape(dshape) != 0
            f = gf(h, a)
            f = f.reshape(dshape) if false_ap else f
            gd(h, a)[...] = np.where(pred, gt(h, a).reshape(dshape), f)
        fast = _select_in_place(ins, B, dshape, gd, gt, gf, false_ap)
        return fast or step
    gt, write = B.get(ins.on_true), _writer(B, dst)
    gf = B.get(on_false) if false_ap else None
    fimm = None if false_ap else np.float32(on_false)

    def step_cast(h, a, dshape=dshape, fimm=fimm, gf=gf, gp=gp, gt=gt, write=write):
        pred = gp(h, a).astype(F32).reshape(dshape) != 0
        f = gf(h, a).astype(F32).reshape(dshape) if gf is not None else fimm
        write(h, a, np.where(pred, gt(h, a).astype(F32).reshape(dshape), f))
    return step_cast


_LOOP_RANK = 5  # partition + 4 free dims: the element loops below view every operand as 5-d


_LOOP_NEAR_BYTES = 64  # output strides up to a cache line count as near for the choice of the inner loop


def _loop_views(shape, *views):
    """``views`` (each with ``shape``'s elements; the last is the output) as 5-d views of one shape in the loop
    order of the element kernels: the output's dims by decreasing stride, except that the innermost is its
    longest dim among those of near stride (any order gives the same elementwise result; long inner loops over
    near elements are the fast ones)."""
    shape5 = (1,) * (_LOOP_RANK - len(shape)) + tuple(shape)
    views = [v.reshape(shape5) for v in views]
    strides = [abs(st) for st in views[-1].strides]
    steps = [k for k in range(_LOOP_RANK) if shape5[k] > 1] or [_LOOP_RANK - 1]
    near = [k for k in steps if strides[k] <= _LOOP_NEAR_BYTES]
    inner = max(near, key=lambda k: shape5[k]) if near else min(steps, key=lambda k: strides[k])
    order = sorted((k for k in range(_LOOP_RANK) if k != inner), key=lambda k: (shape5[k] > 1, -strides[k]))
    return [v.transpose(order + [inner]) for v in views]


def _loopable(dst: AP, *srcs: AP) -> bool:
    """Whether an element loop computes an instruction as it is defined (whole result before writing): every
    on-chip source is the destination itself or apart from it, and the pattern has at most 5 dims."""
    return (dst.on_chip and len(dst.free) < _LOOP_RANK
            and all(ap.on_chip and (ap == dst or not _overlaps(ap, dst)) for ap in srcs))


# a comparison as (kind, swap the operands): kind 0 a > b, 1 a >= b, 2 a == b, 3 a != b
_COMPARE_FORMS = {Alu.greater: (0, False), Alu.less: (0, True), Alu.greater_equal: (1, False),
                  Alu.less_equal: (1, True), Alu.equal: (2, False), Alu.not_equal: (3, False)}


@numba.njit(cache=True, nogil=True, inline="always")
def _compare(kind, x, y):
    if kind == 0:
        return x > y
    if kind == 1:
        return x >= y
    if kind == 2:
        return x == y
    return x != y


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _compare_kernel(kind, fp32, a, b, out):
    """out = 1 / 0 by comparison ``kind`` of :data:`_COMPARE_FORMS` on 5-d views of any strides, the operands as
    FP32 values (``fp32``: ints rounded as the engines' FP32 conversion does) or as exact integers (integer
    mode); IEEE: NaN is unequal to everything. Branches stay outside the inner loop, which then vectorizes."""
    A, B, C, D, E = out.shape
    for i in range(A):
        for j in range(B):
            for k in range(C):
                for m in range(D):
                    x, y, o = a[i, j, k, m], b[i, j, k, m], out[i, j, k, m]
                    if fp32:
                        for q in range(E):
                            o[q] = _compare(kind, np.float32(x[q]), np.float32(y[q]))
                    else:
                        for q in range(E):
                            o[q] = _compare(kind, x[q], y[q])


_LOOP_INPUTS = frozenset({DType.float32, DType.int32, DType.uint32, DType.int16, DType.uint16, DType.int8,
                          DType.uint8})  # read by the compare loop as they are (others are widened first)


def _loop_input(B: _Binder, ap: AP, widen) -> Callable:
    """The getter of a compare loop operand: the view itself, or widened by ``widen`` where Numba has no type."""
    g = B.get(ap)
    if ap.dtype in _LOOP_INPUTS:
        return g
    return lambda h, a, g=g, widen=widen: widen(g(h, a))


def _compare_loop(ins: isa.TensorTensor, B: _Binder, fp32: bool) -> Step | None:
    """A Numba step for a comparison into a numpy-native destination (see :func:`_loopable`), else None."""
    if not _loopable(ins.dst, ins.a, ins.b):
        return None
    kind, swap = _COMPARE_FORMS[ins.op]
    a, b = (ins.b, ins.a) if swap else (ins.a, ins.b)
    ga, gb = (_loop_input(B, x, load_f32 if fp32 else _load_exact) for x in (a, b))
    gd, shape = B.get(ins.dst), ins.dst.shape

    def step(h, ad, ga=ga, gb=gb, gd=gd, fp32=fp32, kind=kind, shape=shape):
        x, y, out = _loop_views(shape, ga(h, ad), gb(h, ad), gd(h, ad))
        _compare_kernel(kind, fp32, x, y, out)
    return step


@numba.njit(cache=True, nogil=True)
def _select_kernel(pred, mask, on_true, on_false, out):
    """out = on_true where (pred's bits & mask) != 0 else on_false, on 5-d raw views of any strides (``mask``
    clears a float predicate's sign bit: -0.0 selects on_false, NaN on_true, as ``pred != 0``)."""
    A, B, C, D, E = out.shape
    for i in range(A):
        for j in range(B):
            for k in range(C):
                for m in range(D):
                    p, t, f, o = pred[i, j, k, m], on_true[i, j, k, m], on_false[i, j, k, m], out[i, j, k, m]
                    for q in range(E):
                        o[q] = t[q] if p[q] & mask else f[q]


def _overlaps(x: AP, y: AP) -> bool:
    """Whether two on-chip operands may touch a common byte (same space, partitions and byte ranges meet)."""
    if x.space is not y.space or x.end_partition <= y.start_partition or y.end_partition <= x.start_partition:
        return False
    (xl, xh), (yl, yh) = x.byte_range(), y.byte_range()
    return xl < yh and yl < xh


def _select_in_place(ins: isa.Select, B: _Binder, dshape, gd, gt, gf, false_ap) -> Step | None:
    """A Numba step for a bit-exact select whose destination is each data operand itself or apart from it (an
    element loop then reads before it writes, as the instruction does); None where numpy's whole-array form
    is needed (partly overlapping operands, shapes that do not view as 5-d)."""
    pred = ins.predicate
    if not _loopable(ins.dst, pred, ins.on_true, *([ins.on_false] if false_ap else [])):
        return None
    pdt = pred.dtype
    gp = B.raw(pred)
    bits = 8 * pdt.itemsize
    mask = (1 << (bits - 1)) - 1 if pdt.is_float else (1 << bits) - 1
    mask = np.array(mask, raw_dtype(pdt.numpy))[()]

    def step(h, a, dshape=dshape, gd=gd, gf=gf, gp=gp, gt=gt, mask=mask, false_ap=false_ap):
        f = gf(h, a)
        f = f if false_ap else np.broadcast_to(f, dshape)
        p, t, f, out = _loop_views(dshape, gp(h, a), gt(h, a), f, gd(h, a))
        _select_kernel(p, mask, t, f, out)
    return step


def _partition_reduce(ins: isa.PartitionReduce, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    mode = _int_mode(ins, src, dst)
    gs, write, load = B.get(src), _writer(B, dst), _loader(mode)
    op = ins.op

    def step(h, a, gs=gs, load=load, op=op, write=write):
        write(h, a, _reduce(op, load(gs(h, a)), 0, keepdims=True))
    return step


def _partition_broadcast(ins: isa.PartitionBroadcast, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    row = (1, *dst.sizes)
    if src.dtype is dst.dtype:
        gs, gd = B.raw(src), B.raw(dst)

        def step(h, a, gd=gd, gs=gs, row=row):
            gd(h, a)[...] = gs(h, a).reshape(row)
        return step
    gs, gd = B.get(src), B.get(dst)
    load = _loader(_int_mode(ins, src, dst))
    dt = dst.dtype

    def step_cast(h, a, dt=dt, gd=gd, gs=gs, load=load, row=row):
        gd(h, a)[...] = cast_to(load(gs(h, a)), dt).reshape(row)
    return step_cast


def _dma_copy(ins: isa.DmaCopy, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    dshape = dst.shape
    same_shape = src.shape == dshape
    if src.dtype is dst.dtype:
        gs, gd = B.raw(src), B.raw(dst)
        if same_shape:
            def step_same(h, a, gd=gd, gs=gs):
                gd(h, a)[...] = gs(h, a)
            return step_same

        def step(h, a, dshape=dshape, gd=gd, gs=gs):
            gd(h, a)[...] = gs(h, a).reshape(dshape)
        return step
    gs, gd = B.get(src), B.get(dst)
    sdt, ddt = src.dtype, dst.dtype

    def step_cast(h, a, ddt=ddt, dshape=dshape, gd=gd, gs=gs, sdt=sdt):
        gd(h, a)[...] = dma_convert(gs(h, a), sdt, ddt).reshape(dshape)
    return step_cast


def _dma_transpose(ins: isa.DmaTranspose, B: _Binder) -> Step:
    src, dst = ins.src, ins.dst
    P, F = src.partitions, src.free_size
    dshape = dst.shape
    gs, gd = B.raw(src), B.raw(dst)  # same dtype (validated): bit exact

    def step(h, a, F=F, P=P, dshape=dshape, gd=gd, gs=gs):
        gd(h, a)[...] = gs(h, a).reshape(P, F).T.reshape(dshape)
    return step


def _indices(gi, h, a, rows: int, P: int, start: int, what: str) -> np.ndarray:
    idx = gi(h, a).reshape(P).astype(I64)
    bad = (idx < 0) | (idx >= rows)
    if bad.any():
        p = int(np.argmax(bad))
        raise _Dynamic("indirect dma bounds",
                       f"index value {int(idx[p])} at partition {p} (on-chip partition {start + p}) is outside "
                       f"the {what} table's {rows} rows (valid 0..{rows - 1})")
    return idx


def _dma_gather(ins: isa.DmaGather, B: _Binder) -> Step:
    table, dst, index = ins.src, ins.dst, ins.index
    rows, P = table.partitions, dst.partitions
    gi = B.get(index)
    dshape = dst.shape
    if table.dtype is dst.dtype:
        gt, gd = B.raw(table), B.raw(dst)
        conv = None
    else:
        gt, gd = B.get(table), B.get(dst)
        conv = (table.dtype, dst.dtype)

    def step(h, a, P=P, conv=conv, dshape=dshape, gd=gd, gi=gi, gt=gt, index=index, rows=rows):
        idx = _indices(gi, h, a, rows, P, index.start_partition, "gather")
        vals = gt(h, a)[idx]
        if conv is not None:
            vals = dma_convert(vals, *conv)
        gd(h, a)[...] = vals.reshape(dshape)
    return step


def _dma_scatter(ins: isa.DmaScatter, B: _Binder) -> Step:
    table, src, index = ins.dst, ins.src, ins.index
    rows, P = table.partitions, src.partitions
    gi = B.get(index)
    tshape = (P, *table.sizes)
    tdt, sdt = table.dtype, src.dtype
    if not ins.accumulate:
        if tdt is sdt:
            gt, gs = B.raw(table), B.raw(src)
            conv = None
        else:
            gt, gs = B.get(table), B.get(src)
            conv = (sdt, tdt)

        def step(h, a, P=P, conv=conv, gi=gi, gs=gs, gt=gt, index=index, rows=rows, tshape=tshape):
            idx = _indices(gi, h, a, rows, P, index.start_partition, "scatter")
            vals = gs(h, a).reshape(tshape)
            if conv is not None:
                vals = dma_convert(vals, *conv)
            u, first_rev = np.unique(idx[::-1], return_index=True)
            if len(u) < P:  # duplicates: the highest partition wins
                last = P - 1 - first_rev
                gt(h, a)[u] = vals[last]
            else:
                gt(h, a)[idx] = vals
        return step
    gt, gs = B.get(table), B.get(src)
    exact = _is_intlike(tdt)
    load = _loader(exact)

    def step_acc(h, a, P=P, gi=gi, gs=gs, gt=gt, index=index, load=load, rows=rows, tdt=tdt, tshape=tshape):
        idx = _indices(gi, h, a, rows, P, index.start_partition, "scatter")
        vals = load(gs(h, a)).reshape(tshape)
        t = gt(h, a)
        u, inv = np.unique(idx, return_inverse=True)
        acc = load(t[u])
        np.add.at(acc, inv, vals)
        t[u] = cast_to(acc, tdt)
    return step_acc


_BUILDERS: dict[type, Callable[[isa.Instruction, _Binder], Step]] = {
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
    isa.Memset: _memset,
    isa.Iota: _iota,
    isa.AffineSelect: _affine_select,
    isa.Select: _select,
    isa.PartitionReduce: _partition_reduce,
    isa.PartitionBroadcast: _partition_broadcast,
    isa.DmaCopy: _dma_copy,
    isa.DmaTranspose: _dma_transpose,
    isa.DmaGather: _dma_gather,
    isa.DmaScatter: _dma_scatter,
}
