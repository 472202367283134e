"""A fuzz case as data: each tensor is a :class:`T` (shape, dtype, layout, fill, seed, edge values) that builds
the same CPU tensor every time, so a case prints as a short reproducer and replays exactly.

Layouts are the views an op must handle: dense, transposed, strided slices with a storage offset, expanded
(stride 0) and overlapping (rows sharing storage), and channels-last for 4-D.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .values import fill

LAYOUTS = ("contiguous", "transposed", "sliced", "expanded", "overlapping", "channels_last")


def _overlap_strides(shape) -> tuple[int, ...]:
    """Row-major strides where each row starts halfway into the previous one (rows share storage)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step = max(1, step * size // 2)
    return tuple(reversed(strides))


def _storage_size(shape, strides) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


@dataclass(frozen=True)
class T:
    """A CPU tensor to build. ``edges`` are (storage position, value) pairs written after the fill
    (positions wrap around the storage); ``bounds`` makes integers in [lo, hi) (indices, targets);
    ``cpu`` keeps the tensor on the CPU in the device run (a CPU scalar tensor next to neuron tensors)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"
    fill: str = "normal"
    seed: int = 0
    edges: tuple[tuple[int, object], ...] = ()
    bounds: tuple[int, int] | None = None
    cpu: bool = False
    requires_grad: bool = field(default=False, compare=False)

    def build(self) -> torch.Tensor:
        shape, layout = tuple(self.shape), self.layout
        if math.prod(shape) == 0 or layout == "contiguous" or len(shape) == 0:
            return self._dense(shape)
        if layout == "transposed":  # a dense tensor of the reversed shape, viewed back
            return self._dense(shape[::-1]).permute(*reversed(range(len(shape))))
        if layout == "sliced":  # every other element of each dim, starting one element in
            base = self._dense(tuple(2 * s + 1 for s in shape))
            return base[tuple(slice(1, None, 2) for _ in shape)]
        if layout == "expanded":  # the even dims broadcast from size 1 (stride 0)
            small = tuple(1 if i % 2 == 0 else s for i, s in enumerate(shape))
            return self._dense(small).expand(shape)
        if layout == "overlapping":
            strides = _overlap_strides(shape)
            return self._dense((_storage_size(shape, strides),)).as_strided(shape, strides)
        if layout == "channels_last" and len(shape) == 4:
            n, c, h, w = shape
            return self._dense((n, h, w, c)).permute(0, 3, 1, 2)
        return self._dense(shape)

    def _dense(self, shape) -> torch.Tensor:
        n = math.prod(shape)
        if self.fill == "perm":
            return self._distinct(shape)
        flat = fill(self.fill, n, self.dtype, self.seed, self.bounds)
        for pos, value in self.edges if n else ():
            flat[pos % n] = value
        return flat.reshape(shape)

    def _distinct(self, shape) -> torch.Tensor:
        """Integers in [0, hi) that are distinct along the last dim (indices of a write that must not repeat)."""
        g = torch.Generator().manual_seed(self.seed)
        rows, width, hi = math.prod(shape[:-1]), shape[-1] if shape else 1, self.bounds[1]
        out = [torch.randperm(hi, generator=g)[:width] for _ in range(rows)]
        return (torch.stack(out) if out else torch.empty(0, width, dtype=torch.int64)).reshape(shape).to(self.dtype)

    def __repr__(self) -> str:
        parts = [repr(tuple(self.shape)), str(self.dtype)]
        for name, default in (("layout", "contiguous"), ("fill", "normal"), ("seed", 0), ("edges", ()),
                              ("bounds", None), ("cpu", False)):
            value = getattr(self, name)
            if value != default:
                parts.append(f"{name}={literal(value)}")
        return f"T({', '.join(parts)})"


def literal(v) -> str:
    """Python source for a value (inf and NaN as math.inf / math.nan, so a reproducer evaluates)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "math.nan" if math.isnan(v) else ("math.inf" if v > 0 else "-math.inf")
    if isinstance(v, tuple):
        inner = ", ".join(literal(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(literal(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {literal(x)}" for k, x in v.items()) + "}"
    if isinstance(v, torch.dtype):
        return str(v)
    return repr(v)


@dataclass(frozen=True)
class Case:
    """An op's inputs: tensors (:class:`T`) and other arguments, passed as ``fn(*tensors, **params)``."""

    tensors: tuple
    params: dict = field(default_factory=dict)

    def build(self) -> tuple[list, dict]:
        return [t.build() if hasattr(t, "build") else t for t in self.tensors], dict(self.params)

    def __repr__(self) -> str:
        tensors = "[" + ", ".join(repr(t) if hasattr(t, "build") else literal(t) for t in self.tensors) + "]"
        return f"Case({tensors}, {literal(self.params)})" if self.params else f"Case({tensors})"

    def __hash__(self):
        return hash(repr(self))


def numel(case: Case) -> int:
    return sum(math.prod(t.shape) for t in case.tensors if isinstance(t, T))
