"""``nisa.max8``, ``nisa.nc_find_index8`` and ``nisa.nc_match_replace8``: VectorE's top-8 family, with NKI's
documented semantics (fp32 compare, first occurrences, the duplicate pairing of each), composed from the simulator's
VectorE instructions: one round per value of reduce / compare / select over the partition's elements. Values are
exact; device time is that of the composed instructions (about 6 passes over the data per value, more than the
hardware's single pass: an upper bound).
"""

from __future__ import annotations

import math

from neuron_hal import Alu, DType, Space

from .. import isa as _isa
from .. import language as _lib
from ..errors import KernelError
from ..tensors import View

_FAR = float(1 << 24)  # beyond every position (<= 16384), exact in fp32


def _flat(x: View, what: str, name: str) -> View:
    if not isinstance(x, View) or not x.on_chip:
        raise KernelError(f"{what}: {name} must be an SBUF/PSUM tile, got {x!r}")
    if not 2 <= x.ndim <= 4:
        raise KernelError(f"{what}: {name} {x!r} must have 1 to 3 free dims")
    return x


def _work(data: View, what: str) -> tuple[View, View, int]:
    """An fp32 contiguous copy of data as [P, N] and an fp32 [P, N] tile of positions 0..N-1."""
    data = _flat(data, what, "data")
    n = math.prod(data.shape[1:])
    if not 8 <= n <= 16384:
        raise KernelError(f"{what}: data {data!r} has {n} elements per partition (8 to 16384)")
    work = _lib.ndarray(data.shape, DType.float32, Space.SBUF)
    _isa.tensor_copy(work, data)
    work = work.reshape((data.shape[0], n))
    pos = _lib.ndarray((data.shape[0], n), DType.float32, Space.SBUF)
    _isa.iota(pos, (1,), offset=0, channel_multiplier=0)
    return work, pos, n


def _eight(t: View, what: str, name: str, parts: int) -> View:
    t = _flat(t, what, name)
    if t.shape[0] != parts or math.prod(t.shape[1:]) != 8:
        raise KernelError(f"{what}: {name} {t!r} must be [{parts}, 8]")
    return t if t.shape[1:] == (8,) else t.reshape((parts, 8))


def _first(work: View, pos: View, value: View) -> View:
    """[P, 1] fp32: the first position where work == value ([P, 1]), or _FAR."""
    p, n = work.shape
    hit = _lib.ndarray((p, n), DType.float32, Space.SBUF)
    _isa.tensor_scalar(hit, work, Alu.equal, value)
    where = _lib.ndarray((p, n), DType.float32, Space.SBUF)
    _isa.select(where, hit, pos, _FAR)
    first = _lib.ndarray((p, 1), DType.float32, Space.SBUF)
    _isa.tensor_reduce(first, where, Alu.min, (1,))
    return first


def _fill_where(work: View, at: View, fill: float) -> None:
    """work = fill where at != 0: select keeps work where the inverse predicate holds, else the immediate."""
    keep = _lib.ndarray(at.shape, DType.float32, Space.SBUF)
    _isa.tensor_scalar(keep, at, Alu.equal, 0.0)
    _isa.select(work, keep, work, fill)


def _index_out(dst: View, first: View, k: int) -> None:
    """dst[:, k] = first, or all ones (the documented not-found sentinel) where first is _FAR."""
    signed = {DType.uint32: DType.int32, DType.uint16: DType.int16}.get(dst.dtype)
    if signed is None:
        raise KernelError(f"index dst {dst!r} must be uint16 or uint32")
    found = _lib.ndarray(first.shape, DType.float32, Space.SBUF)
    _isa.tensor_scalar(found, first, Alu.less, _FAR)
    _isa.select(dst[:, k:k + 1].with_dtype(signed), found, first, -1.0)  # -1 == 0xFF..FF bit for bit


def max8(dst: View, src: View, name: str | None = None) -> None:
    """dst [P, 8] = the 8 largest values of each partition of src (fp32 compare), descending; a value present
    several times appears as often."""
    what = "nisa.max8"
    work, pos, _ = _work(src, what)
    dst = _eight(dst, what, "dst", src.shape[0])
    for k in range(8):
        top = _lib.ndarray((src.shape[0], 1), DType.float32, Space.SBUF)
        _isa.tensor_reduce(top, work, Alu.max, (1,))
        _isa.tensor_copy(dst[:, k:k + 1], top)
        if k < 7:
            _fill_where(work, _at(pos, _first(work, pos, top)), -math.inf)


def _at(pos: View, first: View) -> View:
    at = _lib.ndarray(pos.shape, DType.float32, Space.SBUF)
    _isa.tensor_scalar(at, pos, Alu.equal, first)
    return at


def nc_find_index8(dst: View, data: View, vals: View, name: str | None = None) -> None:
    """dst [P, 8] (uint32 or uint16) = the position of the first occurrence of each of vals' 8 values in data (free
    dims flattened); a value given k times gets its first k positions, in ascending order; absent: all ones."""
    what = "nisa.nc_find_index8"
    work, pos, _ = _work(data, what)
    parts = data.shape[0]
    vals, dst = _eight(vals, what, "vals", parts), _eight(dst, what, "dst", parts)
    v32 = _lib.ndarray((parts, 8), DType.float32, Space.SBUF)
    _isa.tensor_copy(v32, vals)
    for k in range(8):
        first = _first(work, pos, v32[:, k:k + 1])
        _index_out(dst, first, k)
        if k < 7:
            _fill_where(work, _at(pos, first), math.nan)  # found: taken (NaN equals nothing)


def nc_match_replace8(dst: View, data: View, vals: View, imm: float, dst_idx: View | None = None,
                      name: str | None = None) -> None:
    """dst = data with the first occurrence of each of vals' 8 values replaced by ``imm``; vals are taken in reverse
    order (7 down to 0), so duplicate vals pair with ascending positions from the highest slot down. ``dst_idx``
    [P, 8] (uint32 or uint16) receives the positions (all ones for a value not found)."""
    what = "nisa.nc_match_replace8"
    work, pos, n = _work(data, what)
    parts = data.shape[0]
    vals = _eight(vals, what, "vals", parts)
    dst = _flat(dst, what, "dst")
    if dst.shape[0] != parts or math.prod(dst.shape[1:]) != n:
        raise KernelError(f"{what}: dst {dst!r} must have data's shape {list(data.shape)}")
    if dst_idx is not None:
        dst_idx = _eight(dst_idx, what, "dst_idx", parts)
    v32 = _lib.ndarray((parts, 8), DType.float32, Space.SBUF)
    _isa.tensor_copy(v32, vals)
    hit = _lib.ndarray((parts, n), DType.float32, Space.SBUF)
    _isa.memset(hit, 0.0)
    for k in reversed(range(8)):
        first = _first(work, pos, v32[:, k:k + 1])
        if dst_idx is not None:
            _index_out(dst_idx, first, k)
        at = _at(pos, first)
        _isa.tensor_tensor(hit, hit, at, Alu.max)
        _fill_where(work, at, math.nan)
    keep = _lib.ndarray((parts, n), DType.float32, Space.SBUF)
    _isa.tensor_scalar(keep, hit, Alu.equal, 0.0)
    flat_data = data if data.shape[1:] == (n,) else _contiguous(data, n)
    out = dst if dst.shape[1:] == (n,) else dst.reshape((parts, n))
    _isa.select(out, keep, flat_data, float(imm))


def _contiguous(data: View, n: int) -> View:
    t = _lib.ndarray(data.shape, data.dtype, Space.SBUF)
    _isa.tensor_copy(t, data)
    return t.reshape((data.shape[0], n))
