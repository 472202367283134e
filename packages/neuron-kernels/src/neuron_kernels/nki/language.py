"""``nki.language`` (``nl``) on neuron-kernels' tracer: tensors, buffers, loops, dtypes and the operator names that
``nki.isa`` instructions take as ``op=``. Where NKI and the library language agree, these are the library's very
objects (``ds``, the ranges, the dtypes); where they differ, NKI's definition is here (``hbm`` is ``private_hbm``;
``tile_size.total_available_sbuf_size``). Names of NKI's API this front end lacks raise NotImplementedError
(see :mod:`.api`).
"""

from __future__ import annotations

import enum
import math

from neuron_hal import Act, Alu, DType, Space, get_profile

from .. import language as _lib
from ..errors import KernelError
from ..tensors import _FAR, View
from ..tracer import _current
from . import spmd
from .api import _OPERATOR_NAMES, API, NkiNotImplemented, missing

_MODULE = "nki.language"

# -- dtypes (the library's: DType members; NKI names them by strings, which DType.of also accepts) -----------------
bool_, int8, int16, int32 = DType.bool_, DType.int8, DType.int16, DType.int32
uint8, uint16, uint32 = DType.uint8, DType.uint16, DType.uint32
float16, float32, bfloat16 = DType.float16, DType.float32, DType.bfloat16
float8_e4m3, float8_e5m2, float8_e4m3fn = DType.float8_e4m3, DType.float8_e5m2, DType.float8_e4m3fn


class _MissingDType:
    """An NKI dtype the simulator lacks: kernels may name it (in tables of supported dtypes); making a tensor of it,
    or calling it, raises NotImplementedError naming it."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def error(self) -> NkiNotImplemented:
        return NkiNotImplemented(f"{_MODULE}.{self.name} is not implemented by neuron-kernels' NKI front end: "
                                 f"{API[_MODULE][self.name][1]}")

    def __call__(self, *args, **kwargs):
        raise self.error()


def _dtype(dtype):
    if isinstance(dtype, _MissingDType):
        raise dtype.error()
    return dtype


for _name in ("tfloat32", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4", "float8_e8m0fnu"):
    globals()[_name] = _MissingDType(_name)


# -- buffers -----------------------------------------------------------------------------------------------------
class _HBM:
    """An HBM buffer kind: a kernel output when the kernel returns the tensor, else scratch for the run."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf, psum = Space.SBUF, Space.PSUM
shared_hbm, private_hbm = _HBM("shared_hbm"), _HBM("private_hbm")
hbm = private_hbm  # NKI: "HBM - Alias of private_hbm"


def ndarray(shape, dtype, buffer=sbuf, name: str = "", address=None) -> View:
    """A new tensor: an SBUF/PSUM tile (partition dim first) or an HBM tensor (returned: an output)."""
    dtype = _dtype(dtype)
    if buffer is Ellipsis or buffer is None:
        buffer = sbuf
    if address is not None:
        return _placed(shape, dtype, buffer, name, address)
    if buffer is shared_hbm or buffer is Space.HBM:  # shared by SPMD instances
        return spmd.shared_tensor(lambda: _lib.ndarray(shape, dtype, Space.HBM, name or None), shape, DType.of(dtype))
    if isinstance(buffer, _HBM):
        return _lib.ndarray(shape, dtype, Space.HBM, name or None)
    if buffer not in (sbuf, psum):
        raise KernelError(f"nl.ndarray: buffer {buffer!r} is not nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or "
                          f"nl.shared_hbm")
    return _lib.ndarray(shape, dtype, buffer, name or None)


def _placed(shape, dtype, buffer, name: str, address) -> View:
    """An on-chip tile at ``address`` = (start partition, byte offset in each partition), for the whole kernel."""
    if buffer not in (sbuf, psum):
        raise NkiNotImplemented(f"nl.ndarray(address={address!r}) in {buffer!r}: explicit placement is implemented "
                                f"for nl.sbuf and nl.psum tiles only")
    try:
        start, offset = (int(a) for a in address)
    except (TypeError, ValueError):
        raise KernelError(f"nl.ndarray: address {address!r} must be (start_partition, byte_offset)") from None
    shape = tuple(int(s) for s in shape)
    p = _profile()
    limit = p.sbuf_partition_bytes if buffer is sbuf else p.psum_partition_bytes
    nbytes = math.prod(shape[1:]) * DType.of(dtype).itemsize
    if start < 0 or offset < 0 or start + shape[0] > p.pmax or offset + nbytes > limit:
        raise KernelError(f"nl.ndarray: a {list(shape)} {DType.of(dtype)} tile at address {address!r} does not fit "
                          f"{buffer.value.upper()} ({p.pmax} partitions of {limit} bytes)")
    tile = _lib.ndarray(shape, dtype, buffer, name or None)
    tile.owner.base, tile.owner.pinned = offset, True
    tile.offset += start * _FAR  # the view's partition offset (tensors.View.hal_ap)
    return tile


def zeros(shape, dtype, buffer=sbuf, name: str = "") -> View:
    if isinstance(buffer, _HBM) or buffer is Space.HBM:
        raise NkiNotImplemented("nl.zeros in HBM is not implemented by neuron-kernels' NKI front end (memset an "
                                "SBUF tile and dma_copy it)")
    t = ndarray(shape, dtype, buffer, name)
    from . import isa as nisa

    nisa.memset(t, 0.0)
    return t


def full(shape, fill_value, dtype, buffer=sbuf, name: str = "") -> View:
    """A new on-chip tensor filled with ``fill_value`` (one memset)."""
    if isinstance(buffer, _HBM) or buffer is Space.HBM:
        raise NkiNotImplemented("nl.full in HBM is not implemented by neuron-kernels' NKI front end")
    t = ndarray(shape, dtype, buffer, name)
    from . import isa as nisa

    nisa.memset(t, fill_value)
    return t


def zeros_like(x: View, dtype=None, buffer=None, name: str = "") -> View:
    return zeros(x.shape, dtype or x.dtype, sbuf if buffer is None else buffer, name)


NkiTensor = View  # the tracer's one tensor type: HBM tensors, tiles and their views
ds = _lib.ds
affine_range, sequential_range, static_range = _lib.affine_range, _lib.sequential_range, _lib.static_range


# -- the launch grid: one program per launch (kernel[n] grids raise in nki.jit) ------------------------------------
program_id, num_programs, program_ndim = spmd.program_id, spmd.num_programs, spmd.program_ndim


# -- tile_size ---------------------------------------------------------------------------------------------------
def _profile():
    b = _current.get()  # the traced kernel's profile; outside a trace, the selected one (NKI: constants)
    return b.profile if b is not None else get_profile()


class _TileSize:
    """``nl.tile_size``: hardware tile limits of the profile being traced for."""

    pmax = property(lambda self: _profile().pmax)
    psum_fmax = property(lambda self: _profile().psum_bank_fmax)
    gemm_stationary_fmax = property(lambda self: _profile().gemm_stationary_fmax)
    gemm_moving_fmax = property(lambda self: _profile().gemm_moving_fmax)
    bn_stats_fmax = property(lambda self: _profile().bn_stats_fmax)
    total_available_sbuf_size = property(lambda self: _profile().sbuf_partition_bytes)  # per partition, as NKI's

    def __getattr__(self, name):
        if name in ("psum_min_align", "sbuf_min_align"):
            raise NkiNotImplemented(f"nl.tile_size.{name} is not implemented by neuron-kernels' NKI front end")
        raise AttributeError(name)


tile_size = _TileSize()


# -- operators: the op= of nki.isa instructions --------------------------------------------------------------------
class Operator:
    """An NKI operator name (``nl.add``, ``nl.exp``, ...): an ALU op, an activation function, or both."""

    def __init__(self, name: str, alu: Alu | None = None, act: Act | None = None):
        self.name, self._alu, self._act = name, alu, act

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    @property
    def alu(self):
        self._check_implemented()
        if self.name in UNARY_ALU:
            raise KernelError(f"nl.{self.name} is a unary ALU operator: it applies as op0 of nisa.tensor_scalar / "
                              f"tensor_scalar_reduce with operand0 0 (or None)")
        return self._alu if self._alu is not None else self  # not an ALU op: the instruction says so

    @property
    def act(self):
        self._check_implemented()
        return self._act if self._act is not None else self

    def _check_implemented(self) -> None:
        """An operator NKI has and the simulator lacks exists (kernels name it in tables) and raises when used."""
        entry = API[_MODULE].get(self.name)
        if self._alu is None and self._act is None and entry is not None and entry[0] == "missing":
            # not NkiNotImplemented: an AttributeError here would be swallowed by getattr(op, "alu", op)
            raise NotImplementedError(f"{_MODULE}.{self.name} is not implemented by neuron-kernels' NKI front end: "
                                    f"{entry[1]}")

    def __call__(self, *args, dtype=None, **kwargs):
        """NKI's (experimental) tile function form: a new SBUF tile holding ``op(x)`` or ``op(x, y)``, one
        instruction (ScalarE activation for unary functions, VectorE for arithmetic)."""
        self._check_implemented()
        if not args:
            raise TypeError(f"nl.{self.name}() needs a tile argument")
        x, rest = args[0], args[1:]
        if kwargs or len(rest) > 1 or self.name not in _FUNCTIONS[len(rest)]:
            raise NkiNotImplemented(f"nl.{self.name}(...) as a tile function (with these arguments) is not "
                                    f"implemented by neuron-kernels' NKI front end; pass it as the op of a nki.isa "
                                    f"instruction (op=nl.{self.name})")
        if not rest:
            if not isinstance(x, View):
                raise KernelError(f"nl.{self.name}: x must be a tile, got {x!r}")
            return _lib.copy(x, dtype) if self.name == "copy" else _lib._Unary(self._act)(x, dtype)
        y = rest[0]
        tiles = [v for v in (x, y) if isinstance(v, View)]
        if not tiles:
            raise KernelError(f"nl.{self.name} needs at least one tile operand")
        if dtype is None and (len({t.dtype for t in tiles}) > 1 or not all(
                isinstance(v, View) or (isinstance(v, int | float) and (tiles[0].dtype.is_float or
                                                                        isinstance(v, int))) for v in (x, y))):
            raise NkiNotImplemented(f"nl.{self.name}({x!r}, {y!r}): NKI's type promotion between these operands is "
                                    f"not implemented; pass dtype=")
        if len(tiles) == 2 and x.shape != y.shape and tiles[1].shape != (tiles[0].shape[0], 1) and \
                tiles[0].shape != (tiles[1].shape[0], 1):
            raise NkiNotImplemented(f"nl.{self.name}: broadcasting {list(x.shape)} with {list(y.shape)} is not "
                                    f"implemented (same shapes, a [P, 1] column or a scalar)")
        return _lib._Binary(self._alu)(x, y, dtype)


_ALU = {"add": Alu.add, "subtract": Alu.subtract, "multiply": Alu.multiply, "divide": Alu.divide,
        "maximum": Alu.max, "minimum": Alu.min, "power": Alu.pow, "equal": Alu.equal, "not_equal": Alu.not_equal,
        "greater": Alu.greater, "greater_equal": Alu.greater_equal, "less": Alu.less, "less_equal": Alu.less_equal,
        "logical_and": Alu.logical_and, "logical_or": Alu.logical_or, "logical_xor": Alu.logical_xor,
        "bitwise_and": Alu.bitwise_and, "bitwise_or": Alu.bitwise_or, "bitwise_xor": Alu.bitwise_xor,
        "left_shift": Alu.left_shift, "right_shift": Alu.right_shift,
        "fmod": Alu.mod, "bypass": Alu.bypass}  # fmod: C fmod, as the ALU's mod; bypass: the first operand
_ACT = {"copy": Act.identity, "square": Act.square, "sigmoid": Act.sigmoid, "relu": Act.relu, "gelu": Act.gelu,
        "gelu_apprx_tanh": Act.gelu_tanh, "silu": Act.silu, "tanh": Act.tanh, "softplus": Act.softplus,
        "erf": Act.erf, "exp": Act.exp, "log": Act.log, "sin": Act.sin, "cos": Act.cos, "sqrt": Act.sqrt,
        "rsqrt": Act.rsqrt, "reciprocal": Act.reciprocal, "sign": Act.sign, "abs": Act.abs}
# unary ALU operators (NKI: operand None or 0), as the simulator's ALU op computing them with operand 0
UNARY_ALU = {"abs": Alu.abs_max}  # max(|x|, |0|) == |x|
# names with a tile-function form here: unary activation functions and binary arithmetic
_FUNCTIONS = {0: {*_ACT}, 1: {"add", "subtract", "multiply", "divide", "maximum", "minimum", "power"}}
# operators NKI documents that the simulator's ALU/activation tables lack: named freely, NotImplementedError when used
_MISSING_OPERATORS = {n for n, (st, _) in API[_MODULE].items() if st == "missing" and n in _OPERATOR_NAMES}
for _name in {*_ALU, *_ACT, *_MISSING_OPERATORS}:
    globals()[_name] = Operator(_name, _ALU.get(_name), _ACT.get(_name))

# -- tile-level functions (NKI's numpy-like API) -------------------------------------------------------------------
from .tiles import (  # noqa: E402, F401 (nki.language names)
    broadcast_to,
    empty_like,
    expand_dims,
    is_hbm,
    is_on_chip,
    is_psum,
    is_sbuf,
    load,
    matmul,
    max,
    mean,
    min,
    negative,
    ones,
    shared_identity_matrix,
    store,
    sum,
    transpose,
    where,
)


class NKIObject:
    """NKI's base class of kernel dataclasses and configuration objects (kernels are traced in Python, so any object
    can be an argument). A subclass without annotations or an ``__init__`` of its own (``@dataclass`` over plain
    class attributes) is built from keyword arguments naming those attributes, as NKI's are."""

    def __init__(self, **kwargs) -> None:
        for k, v in kwargs.items():
            if not hasattr(type(self), k):
                raise TypeError(f"{type(self).__name__} has no attribute {k!r} to set")
            setattr(self, k, v)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__ and not cls.__dict__.get("__annotations__"):
            cls.__init__ = NKIObject.__init__  # before @dataclass, which then keeps it


class MemoryRegion(enum.Enum):
    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


# -- the rest of NKI's names: NotImplementedError -------------------------------------------------------------------
_MISSING_FUNCTIONS = {"dynamic_range", "fori_loop", "while_loop", "device_print"}
for _name in _MISSING_FUNCTIONS:
    globals()[_name] = missing(f"{_MODULE}.{_name}", API[_MODULE][_name][1])


def __getattr__(name: str):
    entry = API[_MODULE].get(name)
    if entry is not None and entry[0] == "missing":
        raise NkiNotImplemented(f"{_MODULE}.{name} is not implemented by neuron-kernels' NKI front end: {entry[1]}")
    raise AttributeError(f"module {_MODULE!r} has no attribute {name!r}")
