"""SPMD launches, ``kernel[grid](...)`` (NKI's ``kernel[lnc]`` and launch grids): one program per grid index,
traced one after another into one program that runs on one NeuronCore. ``nl.program_id`` / ``nl.num_programs`` /
``nl.program_ndim`` answer for the instance being traced; ``nl.shared_hbm`` tensors are shared by the instances (the
k-th one an instance makes is the k-th the first instance made), private HBM and on-chip tensors are each instance's
own. Values are those of the SPMD run; device time is that of the instances sharing one core (a two-core LNC=2
launch on hardware would overlap them). Cross-instance synchronisation (``nisa.core_barrier``, ``nisa.sendrecv``) is
not implemented.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import math
from dataclasses import dataclass, field

from ..errors import KernelError
from ..tensors import View


@dataclass
class Instance:
    grid: tuple[int, ...]
    index: tuple[int, ...]
    first: bool
    shared: list = field(default_factory=list)  # the first instance's shared_hbm tensors, in creation order
    next_shared: int = 0


current: contextvars.ContextVar[Instance | None] = contextvars.ContextVar("nki_spmd_instance", default=None)


def normalize(grid) -> tuple[int, ...]:
    grid = grid if isinstance(grid, tuple) else tuple(grid) if isinstance(grid, list) else (grid,)
    try:
        dims = tuple(int(g) for g in grid)
    except (TypeError, ValueError):
        raise KernelError(f"kernel[{grid!r}]: a launch grid is ints (or a tuple of ints)") from None
    if not dims or any(g < 1 for g in dims):
        raise KernelError(f"kernel[{', '.join(map(str, dims))}]: every grid dim must be >= 1")
    return dims


def launch(fn, grid: tuple[int, ...]):
    """The kernel function run once per grid index (row-major), returning the first instance's result."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        shared: list = []
        result = None
        for n, index in enumerate(itertools.product(*(range(g) for g in grid))):
            token = current.set(Instance(grid, index, n == 0, shared))
            try:
                got = fn(*args, **kwargs)
            finally:
                current.reset(token)
            if n == 0:
                result = got
            elif not _same(got, result):
                raise KernelError(f"kernel[{', '.join(map(str, grid))}]: instance {index} returned {got!r}, instance "
                                  f"0 {result!r}; SPMD instances return the same shared_hbm tensors")
        return result

    return traced


def _same(a, b) -> bool:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return len(a) == len(b) and all(x is y or (isinstance(x, View) and isinstance(y, View) and x.owner is y.owner
                                               and x.shape == y.shape and x.offset == y.offset) for x, y in zip(a, b))


def shared_tensor(make, shape, dtype) -> View:
    """A shared_hbm tensor: made by the first instance, the same tensor for the others."""
    inst = current.get()
    if inst is None:
        return make()
    if inst.first:
        t = make()
        inst.shared.append(t)
        return t
    if inst.next_shared >= len(inst.shared):
        raise KernelError(f"SPMD instance {inst.index} makes more nl.shared_hbm tensors than instance 0")
    t = inst.shared[inst.next_shared]
    inst.next_shared += 1
    if t.shape != tuple(int(s) for s in shape) or t.dtype != dtype:
        raise KernelError(f"SPMD instance {inst.index}: shared_hbm tensor {inst.next_shared - 1} is "
                          f"{list(shape)} {dtype} here but {list(t.shape)} {t.dtype} in instance 0")
    return t


def program_id(axis: int = 0) -> int:
    inst = current.get()
    if inst is None:
        return 0
    return inst.index[_axis(inst, axis)]


def num_programs(axes=None) -> int:
    inst = current.get()
    if inst is None:
        return 1
    if axes is None:
        return math.prod(inst.grid)
    if isinstance(axes, int):
        return inst.grid[_axis(inst, axes)]
    return math.prod(inst.grid[_axis(inst, a)] for a in axes)


def program_ndim() -> int:
    inst = current.get()
    return 0 if inst is None else len(inst.grid)


def _axis(inst: Instance, axis: int) -> int:
    if not -len(inst.grid) <= int(axis) < len(inst.grid):
        raise KernelError(f"axis {axis} is not an axis of the launch grid {list(inst.grid)}")
    return int(axis) % len(inst.grid)
