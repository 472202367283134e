"""``@kernel``: trace a Python tile function into an ISA Program per signature, and run it.

Array arguments become HBM input tensors (named after the parameters); other arguments are
compile-time constants and part of the cache key. Tensors the kernel creates with
``nl.ndarray(..., buffer=nl.hbm)`` and returns are its outputs.

``kernel(*numpy_arrays)`` runs on a device through neuron_hal (the selected driver, device 0) and
returns numpy outputs; ``kernel.last_report`` holds the execution report (device time,
utilization). ``kernel.trace(*specs)`` returns the Program without running it.

Tunables: ``@kernel(tunables={"tile_n": (512, 256, 128)}, version=1)`` declares keyword
parameters (with defaults in the signature) the autotuner may choose. When a call does not pass
them, the best configuration recorded by the autotuner for this kernel version, signature and
profile is used, else the defaults. Bump ``version`` when a change invalidates tuned choices.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import numpy as np

from neuron_hal import DType, ExecutionReport, Profile, Program, ProgramError, get_driver, get_profile
from neuron_hal.validate import passed

from .errors import KernelError
from .lru import LRU
from .store import default_store
from .tensors import View
from .tracer import Builder


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of an HBM argument, for tracing without data."""

    shape: tuple[int, ...]
    dtype: DType

    @classmethod
    def of(cls, x) -> TensorSpec:
        if isinstance(x, TensorSpec):
            return x
        return cls(tuple(int(s) for s in x.shape), DType.of(x.dtype))


def _is_tensor(x) -> bool:
    """Arrays, numpy scalars (0-d) and specs are tensors; dtypes and classes (np.int32) are constants."""
    if isinstance(x, TensorSpec | np.ndarray):
        return True
    if isinstance(x, type | np.dtype):
        return False
    return hasattr(x, "shape") and hasattr(x, "dtype")


PROGRAMS_PER_KERNEL = 16  # traced programs a kernel keeps: the most recently used signatures' (shapes that change
# every step would otherwise keep one per shape ever seen; torch-neuron keeps its launches' programs itself)


class Kernel:
    def __init__(self, fn, name: str | None = None, tunables: dict | None = None, version: int = 1):
        self.fn = fn
        self.name = name or fn.__name__
        self.signature = inspect.signature(fn)
        self.tunables = {k: tuple(v) for k, v in (tunables or {}).items()}
        self.version = version
        for k, choices in self.tunables.items():
            p = self.signature.parameters.get(k)
            if p is None or p.default is inspect.Parameter.empty:
                raise KernelError(f"kernel {self.name!r}: tunable {k!r} needs a keyword parameter with a default")
            if not choices:
                raise KernelError(f"kernel {self.name!r}: tunable {k!r} has no choices")
        self._programs = LRU(PROGRAMS_PER_KERNEL)  # traced programs by signature (see PROGRAMS_PER_KERNEL)
        self.store = None  # this kernel's ProgramStore, else store.default_store()
        self.last_report: ExecutionReport | None = None
        functools.update_wrapper(self, fn)

    def _bind(self, args, kwargs, profile: Profile) -> inspect.BoundArguments:
        bound = self.signature.bind(*args, **kwargs)
        missing = [k for k in self.tunables if k not in bound.arguments]
        if missing:
            from .autotune import best_config  # the tuner's on-disk choices

            chosen = best_config(self, self.tuning_key(args, kwargs, profile), profile) or {}
            for k in missing:
                if k in chosen:
                    bound.arguments[k] = chosen[k]
        bound.apply_defaults()
        return bound

    def tuning_key(self, args, kwargs, profile: Profile) -> tuple:
        """The tuning cache key of a call: defaults applied, so k(x) and k(x, dim=0) share a choice."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.signature_key(bound, profile)

    def signature_key(self, bound: inspect.BoundArguments, profile: Profile) -> tuple:
        """What a tuned choice is keyed by: kernel, version, profile, shapes/dtypes and constants, and the profile's
        figures (its fingerprint): a recalibrated profile is timed differently, so it retunes."""
        parts = []
        for name, v in bound.arguments.items():
            if name in self.tunables:
                continue
            parts.append((name, TensorSpec.of(v)) if _is_tensor(v) else (name, "const", _freeze(v)))
        return (self.name, self.version, profile.name, tuple(parts), profile.fingerprint)

    def _key(self, bound: inspect.BoundArguments, profile: Profile) -> tuple:
        parts = []
        for name, v in bound.arguments.items():
            # constants by repr: 2, 2.0 and True (and 0.0, -0.0) compare equal but trace different programs
            parts.append((name, TensorSpec.of(v)) if _is_tensor(v) else (name, "const", repr(_freeze(v))))
        return (profile.name, profile.fingerprint, tuple(parts))  # a replaced profile keeps its name, not its programs

    def trace(self, *args, profile: Profile | str | None = None, **kwargs) -> Program:
        """The Program for these argument shapes/dtypes (arrays or TensorSpecs) and constants; the programs of the
        ``PROGRAMS_PER_KERNEL`` most recently traced signatures are kept."""
        prof = profile if isinstance(profile, Profile) else get_profile(profile)
        bound = self._bind(args, kwargs, prof)
        key = self._key(bound, prof)
        program = self._programs.get(key)
        if program is None:
            store = self.store if self.store is not None else default_store()
            program = store.load(self, key) if store is not None else None
            if program is not None:
                passed(program, prof)  # validated when traced (the store's address covers neuron_hal and profile)
            else:
                program = self._trace(bound, prof)
                if store is not None:
                    store.save(self, key, program)
            self._programs[key] = program
        return program

    def _trace(self, bound: inspect.BoundArguments, profile: Profile) -> Program:
        with Builder(self.name, profile) as b:
            call = {}
            for name, v in bound.arguments.items():
                call[name] = b.tensor(name, *_spec(v), "in") if _is_tensor(v) else v
            result = self.fn(**call)
            outs = result if isinstance(result, tuple) else () if result is None else (result,)
            for o in outs:
                if not (isinstance(o, View) and not o.on_chip and o.owner.role in ("out", "inout")):
                    raise KernelError(f"kernel {self.name!r} must return HBM tensors made with "
                                      f"nl.ndarray(..., buffer=nl.hbm) or arguments it wrote, got {o!r}")
            program = b.program()
        program.meta["outputs"] = [o.owner.index for o in outs]
        program.meta["output_shapes"] = [o.shape if _reshaped(o) and o.shape != tuple(o.owner.shape) else None
                                         for o in outs]
        return program

    def __call__(self, *args, device: int = 0, driver=None, **kwargs):
        return self.run(args, kwargs, device, driver)

    def run(self, args, kwargs, device: int = 0, driver=None, trace: bool = False):
        """Run with these arguments; ``trace=True`` records a Perfetto trace into ``last_report.trace``."""
        drv = driver or get_driver()
        program = self.trace(*args, profile=drv.profile, **kwargs)
        arrays = {name: v for name, v in self._bind(args, kwargs, drv.profile).arguments.items() if _is_tensor(v)}
        addresses, results = [], {}
        try:
            for arg in program.args:
                if arg.role == "scratch":
                    continue
                addresses.append(drv.alloc(device, arg.nbytes))
                if arg.role in ("in", "inout"):
                    drv.write(device, addresses[-1], np.ascontiguousarray(arrays[arg.name], dtype=arg.dtype.numpy))
            try:
                self.last_report = drv.execute(device, drv.load(device, program), addresses, trace=trace)
            except ProgramError as e:  # a rule only knowable at run time: point at the kernel line
                where = program.meta["lines"][e.index]
                raise KernelError(f"kernel {self.name!r} at {where}: [{e.rule}] {e.detail}\n"
                                  f"    {e.index}: {e.listing}") from None
            given = [a for a in program.args if a.role != "scratch"]
            for arg, address in zip(given, addresses):
                if arg.role in ("out", "inout"):
                    results[arg.name] = out = np.empty(arg.shape, arg.dtype.numpy)
                    drv.read(device, address, out)
                    if arg.role == "inout":
                        np.copyto(arrays[arg.name], out, casting="unsafe")
        finally:
            for address in addresses:
                drv.free(device, address)
        shapes = program.meta.get("output_shapes") or [None] * len(program.meta["outputs"])
        outs = tuple(results[program.args[i].name] if shape is None else results[program.args[i].name].reshape(shape)
                     for i, shape in zip(program.meta["outputs"], shapes))
        return outs[0] if len(outs) == 1 else (outs or None)


def _reshaped(o: View) -> bool:
    """A returned view that is the whole output tensor, maybe in another shape (``out.reshape(...)``): returned in
    its own shape."""
    return o.offset == 0 and o.size == math.prod(o.owner.shape) and o._contiguous()


def _spec(v) -> tuple[tuple[int, ...], DType]:
    s = TensorSpec.of(v)
    return s.shape, s.dtype


def _freeze(v):
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def kernel(fn=None, *, name: str | None = None, tunables: dict | None = None, version: int = 1):
    """Decorator: ``@kernel`` or ``@kernel(name=..., tunables={...}, version=...)``."""
    if fn is None:
        return lambda f: Kernel(f, name, tunables, version)
    return Kernel(fn, name, tunables, version)


jit = kernel
