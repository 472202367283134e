"""The CPU path of an op whose neuron kernel is registered but cannot take these arguments.

A registered kernel replaces the C++ boxed fallback for its op, so when a call brings what the engines
cannot compute exactly (float64, 64-bit integer sums, ...) the kernel hands it here: the same loud path
(warning once per op, ``metrics()['fallback']``, an error in strict mode), the op run by PyTorch on
CPU copies, results moved back and mutated arguments written back.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from ...fallback import on_fallback


def op_name(op: torch._ops.OpOverload) -> str:
    schema = op._schema
    name = schema.name.split("::", 1)[1]
    return f"{name}.{schema.overload_name}" if schema.overload_name else name


def _device(args, kwargs) -> torch.device:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.device.type == "neuron":
            return v.device
        if isinstance(v, list | tuple):
            for t in v:
                if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                    return t.device
    raise ValueError("no neuron tensor among the arguments")


def _hosts():
    """A host copy per neuron tensor, one copy for a tensor passed twice (``maximum(a, b, out=a)``), so the CPU op
    sees the aliasing the call has: torch's own checks of it (an out= that is an operand is not resized) hold."""
    seen = {}

    def host(v):
        if not (isinstance(v, torch.Tensor) and v.device.type == "neuron"):
            return v
        if id(v) not in seen:
            seen[id(v)] = (v, v.cpu())  # the tensor is kept so that its id stays its own
        return seen[id(v)][1]

    return host


def arguments(args, kwargs) -> str:
    """What a kernel could not take, as the warning names it: the dtypes of the tensor arguments."""
    dtypes = set()
    tree_map(lambda v: dtypes.add(str(v.dtype).removeprefix("torch.")) if isinstance(v, torch.Tensor) else v,
             (args, kwargs))
    return f"these arguments ({', '.join(sorted(dtypes))} tensors)" if dtypes else "these arguments"


def on_cpu(op: torch._ops.OpOverload, *args, **kwargs):
    """``op(*args, **kwargs)`` computed on the CPU for neuron tensors, counted as a fallback."""
    on_fallback(op_name(op), arguments(args, kwargs))
    device = _device(args, kwargs)
    host = _hosts()
    hargs, hkwargs = tree_map(host, args), tree_map(host, kwargs)
    result = op(*hargs, **hkwargs)
    written = {}
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        dev, host = (args[i], hargs[i]) if i < len(args) else (kwargs.get(arg.name), hkwargs.get(arg.name))
        if isinstance(dev, torch.Tensor):
            if dev.shape != host.shape:
                dev.resize_(host.shape)
            dev.copy_(host)
            written[id(host)] = dev

    def back(v):
        if not isinstance(v, torch.Tensor):
            return v
        return written.get(id(v)) if id(v) in written else v.to(device)

    return tree_map(back, result)
