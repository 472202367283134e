"""Recording a kernel: the instructions it issues, the tiles it makes, where in its source each came from."""

from __future__ import annotations

import contextvars
import dataclasses
import math
import os
import sys

from neuron_hal import DType, Profile, Program, ProgramError, Space, TensorArg, isa, validate

from .alloc import allocate
from .errors import KernelError
from .tensors import Buffer, TensorHandle, Tile, View, hbm_tensor, tile_of

_LANGUAGE_DIR = os.path.dirname(__file__)
_LANGUAGE_FILES = {os.path.join(_LANGUAGE_DIR, f) for f in
                   ("tensors.py", "tracer.py", "language.py", "isa.py", "alloc.py", "jit.py", "errors.py")}
_current: contextvars.ContextVar[Builder | None] = contextvars.ContextVar("neuron_kernels_builder", default=None)


def source_line() -> str:
    """file:line of the innermost caller outside the kernel language itself."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _LANGUAGE_FILES:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def builder() -> Builder:
    b = _current.get()
    if b is None:
        raise KernelError("kernel language calls are only valid while a kernel is being traced")
    return b


@dataclasses.dataclass
class _Record:
    cls: type
    fields: dict
    where: str


class Builder:
    """The state of one trace: arguments, tiles, and recorded instructions."""

    def __init__(self, name: str, profile: Profile):
        self.name, self.profile = name, profile
        self.handles: list[TensorHandle] = []
        self.buffers: list[Buffer] = []
        self.records: list[_Record] = []
        self._names: dict[str, int] = {}
        self.psum_written: set[tuple[int, int]] = set()  # (buffer, offset) of PSUM tiles a matmul wrote
        self.next_queue = {"load": 0, "store": 0}

    def __enter__(self) -> Builder:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _current.reset(self._token)

    # -- tensors ------------------------------------------------------------------------------
    def tensor(self, name: str, shape, dtype, role: str) -> View:
        handle = TensorHandle(len(self.handles), name, tuple(int(s) for s in shape), DType.of(dtype), role)
        self.handles.append(handle)
        return hbm_tensor(handle)

    def tile(self, shape, dtype, space: Space, name: str | None, bufs: int | None) -> Tile:
        shape = tuple(int(s) for s in shape)
        dtype = DType.of(dtype)
        where = source_line()
        if not shape:
            raise KernelError(f"kernel {self.name!r} at {where}: a tile needs a partition dim")
        p = self.profile
        if not 1 <= shape[0] <= p.pmax:
            raise KernelError(f"kernel {self.name!r} at {where}: tile of shape {list(shape)} has {shape[0]} "
                              f"partitions; the partition limit is {p.pmax}")
        nbytes = math.prod(shape[1:]) * dtype.itemsize
        limit = p.sbuf_partition_bytes if space is Space.SBUF else p.psum_partition_bytes
        if nbytes > limit:
            raise KernelError(f"kernel {self.name!r} at {where}: tile of shape {list(shape)} {dtype} needs {nbytes} "
                              f"bytes per partition; {space.value.upper()} has {limit}")
        n = self._names[name or "t"] = self._names.get(name or "t", -1) + 1
        buf = Buffer(space, shape[0], nbytes, f"{name or 't'}{n}", where, (where, bufs) if bufs else None,
                     id=len(self.buffers))
        self.buffers.append(buf)
        return tile_of(buf, shape, dtype)

    # -- instructions -------------------------------------------------------------------------
    def emit(self, cls: type, **fields) -> None:
        dst = fields.get("dst")
        if isinstance(dst, View) and not dst.on_chip and dst.owner.role == "in":
            dst.owner.role = "inout"  # the kernel writes one of its inputs
        self.records.append(_Record(cls, fields, source_line()))

    def program(self) -> Program:
        """Place the tiles, resolve every operand and validate; errors point at the kernel source."""
        uses = [[v.owner.id for v in r.fields.values() if isinstance(v, View) and v.on_chip] for r in self.records]
        peak = allocate(self.name, self.buffers, uses, self.profile)
        instructions = [r.cls(**{k: _resolve(v) for k, v in r.fields.items()}) for r in self.records]
        args = [TensorArg(h.name, h.shape, h.dtype, h.role) for h in self.handles]
        meta = {"sbuf_bytes": peak["sbuf"], "psum_bytes": peak["psum"], "lines": [r.where for r in self.records]}
        program = Program(self.name, args, instructions, meta)
        try:
            validate(program, self.profile)
        except ProgramError as e:
            raise KernelError(f"kernel {self.name!r} at {self.records[e.index].where}: [{e.rule}] {e.detail}\n"
                              f"    {e.index}: {e.listing}") from None
        return program


def _resolve(v):
    if isinstance(v, View):
        ap = v.hal_ap()
        if v.on_chip:
            ap = dataclasses.replace(ap, offset=ap.offset + v.owner.base)
        return ap
    return v


__all__ = ["Builder", "builder", "source_line", "isa"]
