"""A Program: instructions plus the HBM tensors they address. Plain data: JSON, hashable, printable."""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field, fields

from . import isa
from .dtypes import DType

ROLES = ("in", "out", "inout", "scratch")


@dataclass(frozen=True)
class TensorArg:
    """An HBM tensor a program addresses by index. ``scratch`` tensors are allocated by the driver."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: str = "in"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", DType.of(self.dtype))
        if self.role not in ROLES:
            raise ValueError(f"tensor {self.name!r}: role {self.role!r} is not one of {ROLES}")

    @functools.cached_property  # read on every execute (address checks): computed once
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True, eq=False)
class Program:
    name: str
    args: tuple[TensorArg, ...]
    instructions: tuple[isa.Instruction, ...]
    meta: dict = field(default_factory=dict)  # free-form, e.g. the kernel and its tunables; not hashed

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "instructions", tuple(self.instructions))

    def __len__(self) -> int:
        return len(self.instructions)

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the canonical JSON of name, args and instructions (``canonical``)."""
        return _sha256(self.to_json(with_meta=False))

    def canonical(self) -> str:
        """The canonical JSON of name, args and instructions: what ``digest`` hashes (and remembers now)."""
        text = self.to_json(with_meta=False)
        self.__dict__.setdefault("digest", _sha256(text))
        return text

    @classmethod
    def from_canonical(cls, text: str, meta: dict | None = None) -> Program:
        """The program whose ``canonical()`` is ``text``, with ``meta``. Its digest is the hash of ``text`` itself,
        the content read, rather than of the program encoded again."""
        program = cls.from_dict({**json.loads(text), "meta": meta or {}})
        program.__dict__["digest"] = _sha256(text)
        return program

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, Program) and self.digest == other.digest

    def arg_index(self, name: str) -> int:
        for i, a in enumerate(self.args):
            if a.name == name:
                return i
        raise KeyError(f"program {self.name!r} has no tensor {name!r}")

    # -- listing ------------------------------------------------------------------------------
    def __str__(self) -> str:
        head = [f"program {self.name} ({len(self.instructions)} instructions)"]
        head += [f"  %{i} {a.name}: {a.role} {a.dtype}{list(a.shape)}" for i, a in enumerate(self.args)]
        width = len(str(max(len(self.instructions) - 1, 0)))
        body = [f"  {i:>{width}}  {ins}" for i, ins in enumerate(self.instructions)]
        return "\n".join(head + body)

    def listing_line(self, index: int) -> str:
        return f"{index}: {self.instructions[index]}"

    # -- serialization ------------------------------------------------------------------------
    def to_dict(self, with_meta: bool = True) -> dict:
        memo: dict = {}  # programs reuse tiles and instructions: encode each distinct one once
        d = {
            "name": self.name,
            "args": [[a.name, list(a.shape), str(a.dtype), a.role] for a in self.args],
            "instructions": [_encode_instruction(i, memo) for i in self.instructions],
        }
        if with_meta:
            d["meta"] = self.meta
        return d

    def to_json(self, with_meta: bool = True) -> str:
        return json.dumps(self.to_dict(with_meta), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> Program:
        args = tuple(TensorArg(n, tuple(s), DType.of(t), r) for n, s, t, r in d["args"])
        memo: dict = {}  # equal access patterns decode to one object, as they were one when encoded
        return cls(d["name"], args, tuple(_decode_instruction(i, memo) for i in d["instructions"]),
                   d.get("meta", {}))

    @classmethod
    def from_json(cls, text: str) -> Program:
        return cls.from_dict(json.loads(text))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_ENUMS = {e.__name__: e for e in (isa.Space, isa.Engine, isa.Act, isa.Alu, DType)}


def _encode(v, memo: dict):
    if isinstance(v, isa.AP):
        if v not in memo:
            memo[v] = _encode_ap(v)
        return memo[v]
    if isinstance(v, enum.Enum):
        return {"e": type(v).__name__, "v": v.name}
    if isinstance(v, tuple):
        return {"t": [_encode(x, memo) for x in v]}
    return v


def _encode_ap(v: isa.AP) -> dict:
    return {
        "ap": [
            v.space.value,
            str(v.dtype),
            v.partitions,
            [list(f) for f in v.free],
            v.start_partition,
            v.offset,
            v.partition_stride,
            v.tensor,
        ]
    }


def _decode(v, memo: dict):
    if isinstance(v, dict):
        if "ap" in v:
            sp, dt, p, free, start, off, pstride, tensor = v["ap"]
            key = (sp, dt, p, tuple(tuple(f) for f in free), start, off, pstride, tensor)
            ap = memo.get(key)
            if ap is None:
                ap = memo[key] = isa.AP(isa.Space(sp), DType.of(dt), p, key[3], start, off, pstride, tensor)
            return ap
        if "e" in v:
            return _ENUMS[v["e"]][v["v"]]
        if "t" in v:
            return tuple(_decode(x, memo) for x in v["t"])
    return v


def _encode_instruction(ins: isa.Instruction, memo: dict) -> dict:
    key = ("ins", ins)
    if key not in memo:
        memo[key] = {"opcode": ins.opcode, **{f.name: _encode(getattr(ins, f.name), memo) for f in fields(ins)}}
    return memo[key]


def _decode_instruction(d: dict, memo: dict) -> isa.Instruction:
    cls = isa.OPCODES[d["opcode"]]
    return cls(**{k: _decode(v, memo) for k, v in d.items() if k != "opcode"})
