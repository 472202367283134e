"""Running neuron-kernels programs on neuron tensors.

A tensor's data pointer is its HAL device address, so kernels run on tensors in place. A launch
traces the kernel once per (kernel, argument shapes/dtypes, constants, profile) and afterwards only
binds addresses and executes; the device time is charged to the calling op in the metrics.
"""

from __future__ import annotations

import math

import torch
from neuron_hal import DType
from neuron_kernels import TensorSpec

from ..metrics import record_native
from ..runtime import runtime

TORCH_TO_DTYPE = {
    torch.float32: DType.float32, torch.bfloat16: DType.bfloat16, torch.float16: DType.float16,
    torch.float8_e4m3fn: DType.float8_e4m3fn, torch.float8_e5m2: DType.float8_e5m2,
    torch.int8: DType.int8, torch.uint8: DType.uint8, torch.int16: DType.int16, torch.uint16: DType.uint16,
    torch.int32: DType.int32, torch.uint32: DType.uint32, torch.int64: DType.int64, torch.uint64: DType.uint64,
    torch.bool: DType.bool_,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_TO_DTYPE.items()}


def device_dtype(dtype: torch.dtype) -> DType | None:
    """The device dtype of a torch dtype; None where the engines cannot compute (float64, complex)."""
    return TORCH_TO_DTYPE.get(dtype)


class _Launch:
    __slots__ = ("loaded", "inputs", "outputs", "returns", "name")

    def __init__(self, loaded, inputs, outputs, returns, name):
        self.loaded, self.inputs, self.outputs, self.returns, self.name = loaded, inputs, outputs, returns, name


_cache: dict[tuple, _Launch] = {}


def _key_part(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype)
    if isinstance(v, list | tuple):
        return tuple(_key_part(x) for x in v)
    if isinstance(v, torch.dtype):
        return ("dtype", v)
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
    bound = kernel.signature.bind(*args, **kwargs).arguments
    inputs, outputs = [], []
    for arg in program.args:
        if arg.role == "scratch":
            continue
        if arg.role == "out":
            inputs.append(None)
            outputs.append((len(inputs) - 1, tuple(arg.shape), DTYPE_TO_TORCH[arg.dtype]))
        else:
            inputs.append(_locate(bound, arg.name))
    returns = [sum(1 for a in program.args[:i] if a.role == "out") for i in program.meta["outputs"]]
    return _Launch(rt.driver.load(device, program), inputs, outputs, returns, kernel.name)


def _locate(bound: dict, name: str):
    """The kernel parameter a program argument comes from."""
    if name in bound:
        return (name, None)
    raise KeyError(f"program argument {name!r} matches no kernel parameter")


def run(op: str, kernel, *args, **kwargs) -> list[torch.Tensor]:
    """Run ``kernel`` on neuron tensors (and constants) for aten op ``op``; returns its outputs.

    Tensor arguments must be contiguous neuron tensors; outputs are new contiguous tensors on the
    same device. Inputs the kernel writes (``inout``) are updated in place.
    """
    device = next(a.device.index for a in _tensors(args, kwargs))
    key = (kernel, device, tuple(_key_part(a) for a in args), tuple((k, _key_part(v)) for k, v in kwargs.items()))
    launch = _cache.get(key)
    if launch is None:
        launch = _cache[key] = _prepare(kernel, args, kwargs, device)
    bound = None
    outs = [torch.empty(shape, dtype=dtype, device=torch.device("neuron", device)) for _, shape, dtype in launch.outputs]
    addresses = [0] * len(launch.inputs)
    for (slot, _, _), t in zip(launch.outputs, outs):
        addresses[slot] = t.data_ptr() if t.numel() else 0
    for slot, where in enumerate(launch.inputs):
        if where is None:
            continue
        if bound is None:
            bound = kernel.signature.bind(*args, **kwargs).arguments
        addresses[slot] = bound[where[0]].data_ptr()
    rt = runtime()
    stream = torch.accelerator.current_stream(torch.device("neuron", device)).stream_id
    report = rt.driver.execute(device, launch.loaded, addresses, queue=stream)
    record_native(op, report.device_ns)
    return [outs[i] for i in launch.returns]


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, list | tuple):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def numel(shape) -> int:
    return math.prod(shape)
