"""Running neuron-kernels programs on neuron tensors.

A tensor's data pointer is its HAL device address, so kernels run on tensors in place. A launch
traces the kernel once per (kernel, argument shapes/dtypes, constants, profile) and afterwards only
binds addresses and executes; the device time is charged to the calling op in the metrics.

Prepared launches are kept in an LRU cache of ``$TORCH_NEURON_LAUNCH_CACHE_ENTRIES`` entries (default
``CACHE_ENTRIES``): a program holds host memory (its instructions and the simulator's plans, ~2-5 KiB per
instruction), so a job whose shapes change every step keeps the most recent launches instead of one per shape it
ever saw. The cache owns its launches: callers that remember one hold a weak reference (``remembered``), and a
launch let go of unloads its program from the driver. Entries, hits, misses and evictions are in
``torch.neuron.metrics()["caches"]["launch"]``; evictions in a fixed-shape loop mean the cache is smaller than
one step's launches (raise the variable).
"""

from __future__ import annotations

import math
import os
import weakref

import torch

from neuron_hal import ProgramError
from neuron_kernels import TensorSpec
from neuron_kernels.lru import LRU

from ...metrics import record_native, register_cache
from ...runtime import runtime
from .dtypes import DTYPE_TO_TORCH, TORCH_TO_DTYPE


class _Launch:
    """A loaded program and how to bind a call's tensors to its arguments, fixed per signature.

    ``inputs``: (slot, where) for every argument the caller provides: ``where`` is the position of the
    kernel parameter in ``args`` or its keyword name. ``outputs``: (slot, shape, dtype) of the tensors
    the launch allocates. ``returns``: indices into the outputs in the kernel's return order."""

    __slots__ = ("loaded", "inputs", "outputs", "returns", "name", "device", "nslots", "driver", "key", "__weakref__")

    def __init__(self, loaded, inputs, outputs, returns, name, device, nslots, driver):
        self.loaded, self.inputs, self.outputs, self.returns, self.name = loaded, inputs, outputs, returns, name
        self.device, self.nslots, self.driver = device, nslots, driver
        self.key = None  # its key in the launch cache
        # the program stays loaded while the launch lives (in the cache, or running); not at interpreter exit
        weakref.finalize(self, driver.unload, device.index, loaded).atexit = False


CACHE_ENTRIES = 1024  # a training step of a small GPT prepares ~75 launches; one per new shape of each op after


def cache_entries() -> int:
    """The launch cache's capacity: ``$TORCH_NEURON_LAUNCH_CACHE_ENTRIES``, else ``CACHE_ENTRIES``."""
    env = os.environ.get("TORCH_NEURON_LAUNCH_CACHE_ENTRIES", "").strip()
    if not env:
        return CACHE_ENTRIES
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"TORCH_NEURON_LAUNCH_CACHE_ENTRIES={env!r} must be a positive number of launches")
    return int(env)


_cache = LRU(cache_entries())
register_cache("launch", _cache)


def _key_part(v):
    if isinstance(v, torch.Tensor):
        return (v.shape, v.dtype)  # torch.Size hashes as a tuple
    if isinstance(v, list | tuple):
        return tuple(_key_part(x) for x in v)
    if isinstance(v, torch.dtype):
        return ("dtype", v)
    if isinstance(v, float):
        return (float, v.hex())  # 1 and 1.0, 0.0 and -0.0 are equal keys but different constants; nan == nan
    if isinstance(v, bool):
        return (bool, v)
    return v


def _spec(v):
    if isinstance(v, torch.Tensor):
        dt = TORCH_TO_DTYPE.get(v.dtype)
        if dt is None:
            raise TypeError(f"neuron kernels do not compute on {v.dtype}")
        return TensorSpec(tuple(v.shape), dt)
    if isinstance(v, torch.dtype):
        return TORCH_TO_DTYPE[v]
    if isinstance(v, list | tuple):
        return type(v)(_spec(x) for x in v)
    return v


def _prepare(kernel, args, kwargs, device: int) -> _Launch:
    rt = runtime()
    specs, kspecs = [_spec(a) for a in args], {k: _spec(v) for k, v in kwargs.items()}
    program = kernel.trace(*specs, profile=rt.profile, **kspecs)
    params = list(kernel.signature.parameters.values())
    positional = {p.name: i for i, p in enumerate(params[:len(args)])
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
    inputs, outputs, slot = [], [], 0
    for arg in program.args:
        if arg.role == "scratch":
            continue
        if arg.role == "out":
            outputs.append((slot, tuple(arg.shape), DTYPE_TO_TORCH[arg.dtype]))
        elif arg.name in positional:
            inputs.append((slot, positional[arg.name]))
        elif arg.name in kwargs:
            inputs.append((slot, arg.name))
        else:
            raise KeyError(f"program argument {arg.name!r} matches no kernel parameter")
        slot += 1
    returns = [sum(1 for a in program.args[:i] if a.role == "out") for i in program.meta["outputs"]]
    return _Launch(rt.driver.load(device, program), inputs, outputs, returns, kernel.name,
                   torch.device("neuron", device), slot, rt.driver)


def prepared(kernel, args, kwargs) -> _Launch:
    """The cached launch of ``kernel`` for these arguments' shapes, dtypes, constants and device (traced and
    loaded on first use). Callers that cache it themselves skip this lookup; see ``execute``."""
    device = _device_index(args, kwargs)
    key = (kernel, device, *map(_key_part, args), *[(k, _key_part(v)) for k, v in kwargs.items()])
    launch = _cache.get(key)
    if launch is None:
        launch = _cache[key] = _prepare(kernel, args, kwargs, device)
        launch.key = key
    return launch


def remembered(cache, key, kernel, args, kwargs) -> _Launch:
    """``prepared``, for callers that remember launches in their own ``cache`` (a dict or an LRU) by their own
    ``key`` (cheaper to make than the launch cache's): held weakly, so the launch cache's bound holds for them
    too, and each use counts as a use in the launch cache (a launch in use is not the one evicted)."""
    launch = recall(cache.get(key))
    if launch is None:
        launch = prepared(kernel, args, kwargs)
        cache[key] = weakref.ref(launch)
    return launch


def recall(ref) -> _Launch | None:
    """The launch a weak reference (from ``remembered``) names, marked used in the launch cache; None once it
    was evicted."""
    launch = ref() if ref is not None else None
    if launch is not None:
        _cache.touch(launch.key)
    return launch


def execute(op: str, launch: _Launch, args, kwargs, outs=None) -> list[torch.Tensor]:
    """Run a prepared launch on arguments of the signature it was prepared for: new outputs, or ``outs``
    (contiguous tensors of the outputs' shapes and dtypes, in the kernel's return order)."""
    if outs is None:
        dev = launch.device
        made = [torch.empty(shape, dtype=dtype, device=dev) for _, shape, dtype in launch.outputs]
    else:
        made = [None] * len(launch.outputs)
        for t, i in zip(outs, launch.returns):
            _, shape, dtype = launch.outputs[i]
            if t.shape != shape or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"{op}: output {i} must be a contiguous {dtype} tensor of shape {list(shape)}, "
                                 f"got {t.dtype} {list(t.shape)} with strides {t.stride()}")
            made[i] = t
    addresses = [0] * launch.nslots
    for slot, where in launch.inputs:
        addresses[slot] = (args[where] if where.__class__ is int else kwargs[where]).data_ptr()
    for (slot, _, _), t in zip(launch.outputs, made):
        addresses[slot] = t.data_ptr()
    device = launch.device.index
    stream = torch._C._accelerator_getStream(device).stream_id
    report = launch.driver.execute(device, launch.loaded, addresses, queue=stream)
    record_native(op, report.device_ns, 0 if report.in_graph else 1, report)  # in a graph: the graph is the program
    return [made[i] for i in launch.returns] if outs is None else list(outs)


def run(op: str, kernel, *args, **kwargs) -> list[torch.Tensor]:
    """Run ``kernel`` on neuron tensors (and constants) for aten op ``op``; returns its outputs.

    Tensor arguments must be contiguous neuron tensors; outputs are new contiguous tensors on the
    same device. Inputs the kernel writes (``inout``) are updated in place.
    """
    return execute(op, prepared(kernel, args, kwargs), args, kwargs)


def run_indexed(op: str, kernel, *args, message: str, **kwargs) -> list[torch.Tensor]:
    """``run`` for a kernel indexing by tensor values (indirect DMA): the device's bounds check failing is the
    IndexError torch raises (``message``), not the program's error."""
    try:
        return run(op, kernel, *args, **kwargs)
    except ProgramError as e:
        if "bounds" not in str(e):
            raise
        raise IndexError(message) from e


def run_into(outs: list[torch.Tensor], op: str, kernel, *args, **kwargs) -> list[torch.Tensor]:
    """``run`` writing the kernel's outputs (in its return order) into the given contiguous neuron tensors
    of the outputs' shapes and dtypes (in-place and ``out=`` ops). An output may be one of the inputs
    only where the kernel reads each element before writing it (elementwise kernels on identical
    views)."""
    return execute(op, prepared(kernel, args, kwargs), args, kwargs, outs)


def _device_index(args, kwargs) -> int:
    for v in args:
        if isinstance(v, torch.Tensor):
            return v.device.index
    for v in _tensors(args, kwargs):
        return v.device.index
    raise ValueError("a kernel launch needs at least one tensor argument")


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, list | tuple):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def numel(shape) -> int:
    return math.prod(shape)
