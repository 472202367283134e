"""``nl``: tiles, loops, data movement and convenience math, in the style of NKI's ``nki.language``.

Loops are Python loops (traced by unrolling); ``affine_range`` states that iterations are independent,
which the simulator's dependency tracking then exploits. Convenience functions allocate their result
tile and issue one instruction; the ``nisa`` calls give full control.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_hal import Act, Alu, DType, Engine, Space

from . import isa as nisa
from .errors import KernelError
from .tensors import DynSlice, View
from .tracer import builder

# -- dtypes and buffers --------------------------------------------------------------------------
float32, bfloat16, float16 = DType.float32, DType.bfloat16, DType.float16
COMPUTE_FLOATS = (float32, bfloat16, float16)  # the float dtypes the engines compute in
float8_e4m3, float8_e4m3fn, float8_e5m2 = DType.float8_e4m3, DType.float8_e4m3fn, DType.float8_e5m2
int8, uint8, int16, uint16 = DType.int8, DType.uint8, DType.int16, DType.uint16
int32, uint32, int64, uint64 = DType.int32, DType.uint32, DType.int64, DType.uint64
bool_ = DType.bool_
sbuf, psum = Space.SBUF, Space.PSUM
hbm = shared_hbm = Space.HBM
private_hbm = "private_hbm"  # kernel-internal HBM scratch, allocated by the driver for each run


class _TileSize:
    """``nl.tile_size``: the profile's tile limits for the kernel being traced."""

    pmax = property(lambda self: builder().profile.pmax)
    gemm_stationary_fmax = property(lambda self: builder().profile.gemm_stationary_fmax)
    gemm_moving_fmax = property(lambda self: builder().profile.gemm_moving_fmax)
    psum_bank_fmax = property(lambda self: builder().profile.psum_bank_fmax)
    psum_fmax = psum_bank_fmax
    psum_num_banks = property(lambda self: builder().profile.psum_banks)
    bn_stats_fmax = property(lambda self: builder().profile.bn_stats_fmax)
    sbuf_size_bytes = property(lambda self: builder().profile.sbuf_partition_bytes)


tile_size = _TileSize()


def profile():
    """The device profile the kernel is being traced for."""
    return builder().profile


# -- loops ---------------------------------------------------------------------------------------
def affine_range(*args) -> range:
    """Independent iterations (unrolled; the simulator overlaps them where dependencies allow)."""
    return range(*args)


sequential_range = static_range = affine_range


def ds(start: int, size: int) -> DynSlice:
    return DynSlice(int(start), int(size))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- memory --------------------------------------------------------------------------------------
def ndarray(shape, dtype, buffer: Space = Space.SBUF, name: str | None = None, bufs: int | None = None) -> View:
    """A new tensor: an on-chip tile (sbuf/psum), a kernel output (hbm) or HBM scratch (private_hbm)."""
    b = builder()
    if buffer is Space.HBM:
        return b.tensor(name or f"out{len(b.handles)}", shape, dtype, "out")
    if buffer == private_hbm:
        return b.tensor(name or f"scratch{len(b.handles)}", shape, dtype, "scratch")
    return b.tile(shape, dtype, buffer, name, bufs)


def zeros(shape, dtype, buffer: Space = Space.SBUF, name: str | None = None) -> View:
    t = ndarray(shape, dtype, buffer, name)
    nisa.memset(t, 0.0, engine=Engine.VECTOR if buffer is Space.PSUM else Engine.GPSIMD)
    return t


def load(src: View, dtype=None, name: str | None = None) -> View:
    """Copy an HBM view into a new SBUF tile of the same shape (cast by the DMA when dtype differs)."""
    t = ndarray(src.shape, dtype or src.dtype, Space.SBUF, name)
    nisa.dma_copy(t, src)
    return t


def store(dst: View, value: View) -> None:
    nisa.dma_copy(dst, value)


def copy(x: View, dtype=None, engine: Engine = Engine.VECTOR) -> View:
    t = ndarray(x.shape, dtype or x.dtype)
    nisa.tensor_copy(t, x, engine=engine)
    return t


def matmul(stationary: View, moving: View) -> View:
    """stationary[K, M].T @ moving[K, N] into a new fp32 PSUM tile [M, N]."""
    out = ndarray((stationary.shape[-1], moving.shape[-1]), DType.float32, Space.PSUM)
    nisa.nc_matmul(out, stationary, moving, accumulate=False)
    return out


def transpose(x: View) -> View:
    """x[P, F] -> PSUM [F, P] on TensorE."""
    out = ndarray((x.shape[1], x.shape[0]), x.dtype if x.dtype.itemsize == 4 else DType.float32, Space.PSUM)
    nisa.nc_transpose(out, x)
    return out


# -- math ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Unary:
    act: Act

    def __call__(self, x: View, dtype=None, scale=1.0, bias: View | None = None) -> View:
        t = ndarray(x.shape, dtype or x.dtype)
        nisa.activation(t, self.act, x, bias=bias, scale=scale)
        return t


@dataclass(frozen=True)
class _Binary:
    alu: Alu

    def __call__(self, x, y, dtype=None) -> View:
        if not isinstance(x, View) and not isinstance(y, View):
            raise KernelError(f"nl.{self.alu.value} needs at least one tile operand")
        tile, other, reverse = (x, y, False) if isinstance(x, View) else (y, x, True)
        t = ndarray(tile.shape, dtype or tile.dtype)
        if isinstance(other, View) and other.shape == tile.shape:
            a, b = (other, tile) if reverse else (tile, other)
            nisa.tensor_tensor(t, a, b, self.alu)
        else:  # an immediate or a [P, 1] per-partition column
            nisa.tensor_scalar(t, tile, self.alu, other, reverse0=reverse)
        return t


exp, log, tanh, sigmoid, relu = (_Unary(a) for a in (Act.exp, Act.log, Act.tanh, Act.sigmoid, Act.relu))
gelu, gelu_tanh, silu, softplus = (_Unary(a) for a in (Act.gelu, Act.gelu_tanh, Act.silu, Act.softplus))
sqrt, rsqrt, reciprocal, square = (_Unary(a) for a in (Act.sqrt, Act.rsqrt, Act.reciprocal, Act.square))
abs, sign, sin, cos, erf = (_Unary(a) for a in (Act.abs, Act.sign, Act.sin, Act.cos, Act.erf))  # noqa: A001
identity = _Unary(Act.identity)

add, subtract, multiply, divide = (_Binary(a) for a in (Alu.add, Alu.subtract, Alu.multiply, Alu.divide))
maximum, minimum, power, mod = (_Binary(a) for a in (Alu.max, Alu.min, Alu.pow, Alu.mod))
equal, not_equal, greater, greater_equal, less, less_equal = (_Binary(a) for a in (
    Alu.equal, Alu.not_equal, Alu.greater, Alu.greater_equal, Alu.less, Alu.less_equal))
logical_and, logical_or, logical_xor = (_Binary(a) for a in (Alu.logical_and, Alu.logical_or, Alu.logical_xor))
bitwise_and, bitwise_or, bitwise_xor = (_Binary(a) for a in (Alu.bitwise_and, Alu.bitwise_or, Alu.bitwise_xor))
left_shift, right_shift = _Binary(Alu.left_shift), _Binary(Alu.right_shift)


def _reduce(op: Alu):
    def reduce(x: View, axis, dtype=None, negate: bool = False) -> View:
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        kept = [s for d, s in enumerate(x.shape) if d not in axes]
        t = ndarray(kept if len(kept) > 1 else (x.shape[0], 1), dtype or x.dtype)
        nisa.tensor_reduce(t, x, op, axes, negate=negate)
        return t

    return reduce


sum = _reduce(Alu.add)  # noqa: A001
max = _reduce(Alu.max)  # noqa: A001
min = _reduce(Alu.min)  # noqa: A001
prod = _reduce(Alu.multiply)
