"""What a kernel holds while it is traced: HBM tensors, on-chip tiles, and views of both.

A view knows its element offset and its (size, stride) dims. Its ``ap()`` is the access pattern an
instruction uses: the first dim is the partition dim (rows for HBM), the rest the free pattern.
On-chip tiles are placed in SBUF/PSUM after tracing (see :mod:`.alloc`), so their views carry the
buffer and an offset relative to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from neuron_hal import AP, DType, Space

from .errors import KernelError


@dataclass(eq=False)
class Buffer:
    """One on-chip allocation: ``partitions`` x ``nbytes`` per partition in ``space``."""

    space: Space
    partitions: int
    nbytes: int
    name: str
    where: str  # source line that created it
    pool: tuple | None = None  # (call site, bufs) for tiles that rotate through a fixed ring
    base: int | None = None  # byte offset in each partition, set by the allocator
    id: int = field(default=-1)
    pinned: bool = False  # placed by the kernel at ``base`` (nl.ndarray(address=)) for the whole kernel


class View:
    """A strided window onto an HBM tensor or an on-chip buffer."""

    def __init__(self, owner, dtype: DType, offset: int, dims: tuple[tuple[int, int], ...], whole: bool = False):
        self.owner, self.dtype, self.offset, self.dims = owner, dtype, offset, tuple(dims)
        self.whole = whole  # the tensor as made (an argument, nl.ndarray), not a view of it: .ap() applies

    # -- shape ----------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.dims)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def on_chip(self) -> bool:
        return isinstance(self.owner, Buffer)

    @property
    def space(self) -> Space:
        return self.owner.space if self.on_chip else Space.HBM

    def __len__(self) -> int:
        return self.dims[0][0]

    def __repr__(self) -> str:
        where = self.owner.name
        return f"{type(self).__name__}({where}, shape={list(self.shape)}, {self.dtype})"

    # -- NKI's NkiTensor attributes and views ---------------------------------------------------------
    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides of the free dims; a tile's partition dim counts as its per-partition size."""
        row = self.owner.nbytes // self.dtype.itemsize if self.on_chip else None
        return tuple(row if st == _FAR else st for _, st in self.dims)

    @property
    def buffer(self):
        return self.space

    @property
    def name(self) -> str:
        return self.owner.name

    def is_contiguous(self) -> bool:
        return self._contiguous()

    def get_pattern(self) -> list[list[int]]:
        """The view's access pattern as [[stride, count], ...] (partition dim first)."""
        return [[int(st), int(n)] for n, st in zip(self.shape, self.strides)]

    def view(self, dtype) -> View:
        """The same elements reinterpreted as another dtype of the same size (a bitcast)."""
        dt = DType.of(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise NotImplementedError(f"{self!r}.view({dt}): a bitcast that changes the element size is not "
                                      f"implemented (.ap(..., dtype=) on the whole tensor does it)")
        return self.with_dtype(dt)

    def permute(self, *dims) -> View:
        """Reorder dims (a tile's partition dim stays first)."""
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], tuple | list) else tuple(dims)
        if sorted(dims) != list(range(self.ndim)):
            raise KernelError(f"{self!r}: permute{dims} is not a permutation of {self.ndim} dims")
        if self.on_chip and dims[0] != 0:
            raise KernelError(f"{self!r}: permute{dims} moves a tile's partition dim")
        return type(self)(self.owner, self.dtype, self.offset, tuple(self.dims[d] for d in dims))

    def broadcast(self, dim: int, size: int) -> View:
        """The size-1 dim ``dim`` repeated ``size`` times (stride 0; not a tile's partition dim)."""
        if self.shape[dim] != 1 or (self.on_chip and dim == 0):
            raise KernelError(f"{self!r}: broadcast({dim}, {size}) needs a size-1 free dim")
        dims = list(self.dims)
        dims[dim] = (int(size), 0)
        return type(self)(self.owner, self.dtype, self.offset, tuple(dims))

    def expand_dim(self, dim: int) -> View:
        """A new size-1 dim at ``dim``."""
        if not (1 if self.on_chip else 0) <= dim <= self.ndim:
            raise KernelError(f"{self!r}: expand_dim({dim}) out of range")
        return type(self)(self.owner, self.dtype, self.offset, self.dims[:dim] + ((1, 1),) + self.dims[dim:])

    def squeeze_dim(self, dim: int) -> View:
        """Drop the size-1 dim ``dim``."""
        if self.shape[dim] != 1 or (self.on_chip and dim == 0):
            raise KernelError(f"{self!r}: squeeze_dim({dim}) needs a size-1 free dim")
        return type(self)(self.owner, self.dtype, self.offset, self.dims[:dim] + self.dims[dim + 1:])

    # -- indexing -------------------------------------------------------------------------------
    def __getitem__(self, key) -> View:
        if not isinstance(key, tuple):
            key = (key,)
        if key.count(Ellipsis) > 1:
            raise KernelError(f"{self!r}: only one ... allowed in an index")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1 :]
        if len(key) > self.ndim:
            raise KernelError(f"{self!r}: {len(key)} indices for {self.ndim} dims")
        offset, dims = self.offset, []
        for d, (size, stride) in enumerate(self.dims):
            k = key[d] if d < len(key) else slice(None)
            if isinstance(k, DynSlice):
                k = slice(k.start, k.start + k.size)
            if isinstance(k, slice):
                start, stop, step = k.indices(size)
                if step <= 0:
                    raise KernelError(f"{self!r}: slice step must be positive, got {step}")
                n = max(0, -(-(stop - start) // step))
                offset += start * stride
                dims.append((n, stride * step))
            else:
                i = int(k)
                i = i + size if i < 0 else i
                if not 0 <= i < size:
                    raise KernelError(f"{self!r}: index {k} out of range for dim {d} of size {size}")
                if d == 0 and self.on_chip:
                    raise KernelError(f"{self!r}: an on-chip tile keeps its partition dim; slice it (p:p+1)")
                offset += i * stride
        return type(self)(self.owner, self.dtype, offset, tuple(dims))

    def reshape(self, *shape) -> View:
        """Reshape a contiguous view (row-major), like numpy's reshape without copies."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(math.prod(self.shape) // known if s == -1 else s for s in shape)
        if math.prod(shape) != math.prod(self.shape):
            raise KernelError(f"{self!r}: cannot reshape {list(self.shape)} to {list(shape)}")
        if self.on_chip and shape[0] != self.shape[0]:
            raise KernelError(f"{self!r}: reshaping a tile keeps its partition dim ({self.shape[0]})")
        lead, old, new = (self.dims[:1], self.dims[1:], shape[1:]) if self.on_chip else ((), self.dims, shape)
        dims = _row_major(new) if self._contiguous() else _restride(old, new)
        if dims is None:
            raise KernelError(f"{self!r}: cannot reshape {list(self.shape)} (strides {[st for _, st in self.dims]}) "
                              f"to {list(shape)} without a copy")
        return type(self)(self.owner, self.dtype, self.offset, lead + dims)

    def as_strided(self, shape, strides, offset: int = 0) -> View:
        """The elements ``offset + sum(i_k * strides[k])`` of a 1-d HBM tensor (an argument holding the storage
        a strided tensor spans) as a view of ``shape``."""
        if self.on_chip or self.ndim != 1 or self.dims[0][1] != 1:
            raise KernelError(f"{self!r}: as_strided takes a 1-d HBM tensor")
        shape, strides = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
        if len(shape) != len(strides) or min(strides, default=0) < 0 or (math.prod(shape) and last >= len(self)):
            raise KernelError(f"{self!r}: shape {list(shape)}, strides {list(strides)} at offset {offset} reach "
                              f"element {last} of {len(self)}")
        return type(self)(self.owner, self.dtype, self.offset + int(offset), tuple(zip(shape, strides)))

    def _contiguous(self) -> bool:
        dims = self.dims[1:] if self.on_chip else self.dims
        expect = 1
        for size, stride in reversed(dims):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True

    def broadcast_to(self, shape) -> View:
        """A view of ``shape`` reading this one with numpy broadcasting (stride 0 on new or size-1 dims).
        A tile's partition dim cannot broadcast: partitions are physical lanes."""
        shape = tuple(int(s) for s in shape)
        if len(shape) < self.ndim:
            raise KernelError(f"{self!r}: cannot broadcast {list(self.shape)} to fewer dims {list(shape)}")
        lead = len(shape) - self.ndim
        dims = [(s, 0) for s in shape[:lead]]
        for (size, stride), want in zip(self.dims, shape[lead:]):
            if size == want:
                dims.append((size, stride))
            elif size == 1:
                dims.append((want, 0))
            else:
                raise KernelError(f"{self!r}: cannot broadcast {list(self.shape)} to {list(shape)}")
        if self.on_chip and (lead or dims[0][1] == 0) and dims[0][0] > 1:
            raise KernelError(f"{self!r}: a tile's partition dim cannot broadcast (to {shape[0]})")
        return type(self)(self.owner, self.dtype, self.offset, tuple(dims))

    def with_dtype(self, dtype) -> View:
        """Reinterpret with another dtype of the same size (a bitcast)."""
        dt = DType.of(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise KernelError(f"{self!r}: bitcast to {dt} changes the element size")
        return type(self)(self.owner, dt, self.offset, self.dims)

    def ap(self, pattern, *more, offset: int | None = None, scalar_offset=None, vector_offset=None,
           indirect_dim: int = 0, dtype=None) -> View:
        """NKI's access pattern view: ``pattern`` [[step, num], ...] (first pair the partition dim) over this tensor's
        elements taken row-major (a tile's partition p starts at element p * its per-partition size), from element
        ``offset`` (on a view of an HBM tensor: elements of the tensor's storage from the view's start);
        ``dtype`` reinterprets the storage (steps and offset then count elements of that dtype).
        On-chip, the partition step must be the per-partition size (partitions are consecutive lanes)."""
        if scalar_offset is not None:
            raise NotImplementedError(f"{self!r}: .ap(scalar_offset=) (a runtime offset) is not implemented")
        if pattern and isinstance(pattern[0], int):  # ap([step, num], [step, num], ...)
            pattern = [pattern, *more]
        elif more:
            offset = more[0]
        if vector_offset is not None:
            return self._indirect(pattern, 0 if offset is None else int(offset), vector_offset, indirect_dim, dtype)
        pairs = [(int(step), int(num)) for step, num in pattern]
        if not pairs or any(num < 1 for _, num in pairs) or any(step < 0 for step, _ in pairs[1:]):
            raise KernelError(f"{self!r}: access pattern {pattern} needs [step, num] pairs with num >= 1")
        dt = self.dtype if dtype is None else DType.of(dtype)
        offset = 0 if offset is None else int(offset)
        if not self.whole:
            if self.on_chip:
                raise NotImplementedError(f"{self!r}: .ap() of a slice or view of an on-chip tile is not "
                                          f"implemented (apply it to the tile as made)")
            # an HBM view: the pattern addresses the tensor's storage, from the view's own start (NKI)
            base_bytes, total_bytes = self.offset * self.dtype.itemsize, \
                math.prod(self.owner.shape) * self.owner.dtype.itemsize
            if base_bytes % dt.itemsize or total_bytes % dt.itemsize:
                raise KernelError(f"{self!r}: cannot reinterpret its storage as {dt}")
            return HBMTensor(self.owner, dt, 0, ((total_bytes // dt.itemsize, 1),), whole=True).ap(
                pairs, offset=base_bytes // dt.itemsize + offset)
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        if row_bytes % dt.itemsize:
            raise KernelError(f"{self!r}: cannot reinterpret {row_bytes} bytes per row as {dt}")
        row = row_bytes // dt.itemsize if self.on_chip else 1
        total = (self.shape[0] if self.shape else 1) * row_bytes // dt.itemsize  # a 0-d tensor: one element
        last = offset + sum(step * (num - 1) for step, num in pairs)
        if offset < 0 or last >= total or pairs[0][0] < 0:
            raise KernelError(f"{self!r}: access pattern {pattern} at offset {offset} reaches element {last} of "
                              f"{total}")
        (pstep, parts), free = pairs[0], tuple((num, step) for step, num in pairs[1:])
        if not self.on_chip:
            return type(self)(self.owner, dt, self.offset + int(offset), ((parts, pstep),) + free)
        if parts > 1 and pstep != row:
            raise KernelError(f"{self!r}: access pattern partition step {pstep} must be the partition size {row}")
        p0, e0 = divmod(int(offset), row)
        if e0 + sum(step * (num - 1) for num, step in free) >= row:
            raise KernelError(f"{self!r}: access pattern {pattern} at offset {offset} crosses a partition boundary")
        return type(self)(self.owner, dt, self.offset + p0 * _FAR + e0, ((parts, _FAR),) + free)  # + a placed start

    vector_index: View | None = None  # the index tile of an indirect (vector_offset) access pattern

    def _indirect(self, pattern, offset: int, index: View, indirect_dim: int, dtype) -> View:
        """NKI's vector-offset access pattern on an HBM tensor: partition p starts ``index[p] * step`` elements past
        ``offset`` (``step`` the first pair's). The view spans every row an index may name inside the tensor (the
        bounds of the gather or scatter ``nisa.dma_copy`` makes of it); ``vector_index`` is the index tile."""
        if self.on_chip or not self.whole or indirect_dim != 0:
            raise NotImplementedError(f"{self!r}: .ap(vector_offset=) is implemented on a whole HBM tensor with "
                                      f"indirect_dim=0")
        if not isinstance(index, View) or not index.on_chip or math.prod(index.shape[1:]) != 1:
            raise KernelError(f"{self!r}: vector_offset {index!r} must be an on-chip [P, 1] tile of row indices")
        (step, parts), *rest = [(int(st), int(n)) for st, n in pattern]
        dt = self.dtype if dtype is None else DType.of(dtype)
        total = math.prod(self.shape) * self.dtype.itemsize // dt.itemsize
        span = offset + sum(st * (n - 1) for st, n in rest) + 1  # elements one row reaches
        if parts != index.shape[0] or step < 1 or any(st < 0 or n < 1 for st, n in rest) or span > total:
            raise KernelError(f"{self!r}: indirect access pattern {pattern} at offset {offset} must give one row "
                              f"of at most {total} elements per index partition ({index.shape[0]})")
        view = type(self)(self.owner, dt, int(offset), ((((total - span) // step) + 1, step),) +
                          tuple((n, st) for st, n in rest))
        view.vector_index = index
        return view

    # -- access pattern -------------------------------------------------------------------------
    def hal_ap(self) -> AP:
        if not self.dims:
            raise KernelError(f"{self!r}: a 0-d view has no partition dim; index with a slice")
        (parts, pstride), free = self.dims[0], self.dims[1:]
        if len(free) > 4:
            raise KernelError(f"{self!r}: {len(free)} free dims, the hardware has 4")
        if self.on_chip:
            if parts > 1 and pstride != _FAR:
                raise KernelError(f"{self!r}: partitions cannot be strided; an instruction spans consecutive ones")
            return AP(self.owner.space, self.dtype, parts, free, start_partition=self.offset // _FAR,
                      offset=(self.offset % _FAR) * self.dtype.itemsize)
        return AP(Space.HBM, self.dtype, parts, free, offset=self.offset * self.dtype.itemsize,
                  partition_stride=pstride, tensor=self.owner.index)


def _restride(dims, shape) -> tuple[tuple[int, int], ...] | None:
    """``dims`` (size, stride) reshaped to ``shape`` without moving elements, as numpy does: each group of old
    dims that becomes a group of new dims must be contiguous among itself. None where that is impossible."""
    old = [(n, st) for n, st in dims if n != 1]
    if math.prod(shape) == 0 or not old:
        return _row_major(shape)
    new, i, j = [], 0, 0
    while j < len(shape):
        if shape[j] == 1 or i == len(old):
            new.append((shape[j], 1))
            j += 1
            continue
        want, have, jj, ii = shape[j], old[i][0], j + 1, i + 1
        while want != have:
            if want < have:
                want, jj = want * shape[jj], jj + 1
            else:
                have, ii = have * old[ii][0], ii + 1
        if any(old[m][1] != old[m + 1][1] * old[m + 1][0] for m in range(i, ii - 1)):
            return None
        stride, group = old[ii - 1][1], []
        for m in range(jj - 1, j - 1, -1):
            group.append((shape[m], stride))
            stride *= shape[m]
        new.extend(reversed(group))
        i, j = ii, jj
    return tuple(new)


# On-chip views encode the start partition in the offset: partition p, element e -> p * _FAR + e.
_FAR = 1 << 40


def _row_major(shape, inner_stride: int = 1) -> tuple[tuple[int, int], ...]:
    dims, acc = [], inner_stride
    for s in reversed(shape):
        dims.append((s, acc))
        acc *= s
    return tuple(reversed(dims))


class HBMTensor(View):
    """A kernel argument or output in HBM."""


class Tile(View):
    """An on-chip tile: partition dim first (<= 128), free dims after."""


@dataclass(eq=False)
class TensorHandle:
    """The HBM tensor a view belongs to: a program argument."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: str


def hbm_tensor(handle: TensorHandle) -> HBMTensor:
    return HBMTensor(handle, handle.dtype, 0, _row_major(handle.shape), whole=True)


def tile_of(buffer: Buffer, shape, dtype: DType) -> Tile:
    free = _row_major(shape[1:])
    return Tile(buffer, dtype, 0, ((shape[0], _FAR),) + free, whole=True)


@dataclass(frozen=True)
class DynSlice:
    """``nl.ds(start, size)``: a slice by start and size."""

    start: int
    size: int


def _nki_missing(name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"nki.language.NkiTensor.{name} is not implemented by neuron-kernels' NKI front end "
                                  f"(docs/nki.md)")

    method.__name__ = name
    method.__nki_missing__ = True
    return method


# NKI's NkiTensor methods this tensor type lacks: NotImplementedError naming them (nki/api.py lists their status)
NKI_MISSING_METHODS = ("flatten_dims", "reshape_dim", "slice", "select", "rearrange", "indirect",
                       "is_indirect", "vector_select", "reinterpret_cast")
for _name in NKI_MISSING_METHODS:
    setattr(View, _name, _nki_missing(_name))
