"""The round trip: a HAL Program -> NKI source (neuron_nrt.to_nki) -> traced again by neuron-kernels' NKI front end
-> both programs run on the simulator with the same inputs."""

from __future__ import annotations

import builtins
import dataclasses

import numpy as np
from neuron_nrt import to_nki
from neuron_nrt.lower import trailing_reduce

from neuron_hal import AP, Program, get_driver, isa
from neuron_kernels import nki as front_end
from neuron_kernels.jit import TensorSpec


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` for the lowered source: ``nki`` (and ``nki.isa``, ``nki.language``) is the project's NKI front
    end, whatever ``nki`` sys.path would find (a test run puts neuron-kernels' tests/nki directory on it)."""
    if level == 0 and (name == "nki" or name.startswith("nki.")):
        return front_end
    return builtins.__import__(name, globals, locals, fromlist, level)


def lowered_kernel(source: str):
    """The ``@nki.jit`` kernel ``source`` defines, with ``import nki`` answered by the project's NKI front end."""
    namespace: dict = {"__builtins__": {**vars(builtins), "__import__": _import}}
    exec(compile(source, "<lowered NKI kernel>", "exec"), namespace)
    kernels = [v for v in namespace.values() if isinstance(v, front_end.NkiKernel)]
    assert len(kernels) == 1, f"the lowered source defines {len(kernels)} nki.jit kernels"
    return kernels[0]


def retrace(program: Program, profile) -> tuple[str, Program]:
    """The lowered source of ``program`` and the program the NKI front end traces from it."""
    source = to_nki(program, profile)
    specs = [TensorSpec(a.shape, a.dtype) for a in program.args if a.role in ("in", "inout")]
    return source, lowered_kernel(source).program(*specs)


def inputs_for(program: Program, seed: int = 0, given: dict | None = None) -> dict[str, np.ndarray]:
    """Random values for every in/inout tensor (normal floats, small integers, 0/1 bools); integer tensors in
    ``given`` (indices, seeds: values a kernel requires in range) keep those values."""
    rng = np.random.default_rng(seed)
    out = {}
    for a in program.args:
        if a.role not in ("in", "inout"):
            continue
        if not a.dtype.is_float and given is not None and a.name in given:
            out[a.name] = np.asarray(given[a.name], a.dtype.numpy)
            continue
        if a.dtype.is_float:
            out[a.name] = (rng.standard_normal(a.shape) * 2).astype(a.dtype.numpy)
        elif a.dtype.kind == "b":
            out[a.name] = rng.integers(0, 2, a.shape).astype(a.dtype.numpy)
        else:
            lo = 0 if a.dtype.kind == "u" else -50
            out[a.name] = rng.integers(lo, 50, a.shape).astype(a.dtype.numpy)
    return out


def execute(program: Program, inputs: dict[str, np.ndarray], driver=None, device: int = 0) -> dict[str, np.ndarray]:
    """Run ``program`` on the driver (the simulator by default); the values of its out and inout tensors."""
    drv = driver or get_driver("sim")
    given = [a for a in program.args if a.role != "scratch"]
    addresses, results = [], {}
    try:
        for a in given:
            addresses.append(drv.alloc(device, a.nbytes))
            data = inputs[a.name] if a.role in ("in", "inout") else np.zeros(a.shape, a.dtype.numpy)
            drv.write(device, addresses[-1], np.ascontiguousarray(data, dtype=a.dtype.numpy))
        drv.execute(device, drv.load(device, program), addresses)
        for a, address in zip(given, addresses):
            if a.role in ("out", "inout"):
                results[a.name] = np.empty(a.shape, a.dtype.numpy)
                drv.read(device, address, results[a.name])
    finally:
        for address in addresses:
            drv.free(device, address)
    return results


def normalized(program: Program, like: Program) -> list[isa.Instruction]:
    """``program``'s instructions with tensor indices mapped to ``like``'s (by name) and what NKI leaves to its
    compiler set aside: DMA queue numbers, and the engine of tensor_reduce (NKI's names none); a tensor_reduce in
    the trailing-axes form the lowering gives it."""
    index = {i: like.arg_index(a.name) for i, a in enumerate(program.args)}

    def remap(v):
        return dataclasses.replace(v, tensor=index[v.tensor]) if isinstance(v, AP) and v.tensor >= 0 else v

    out = []
    for ins in program.instructions:
        ins = trailing_reduce(ins) if ins.opcode == "tensor_reduce" else ins
        changes = {f.name: remap(getattr(ins, f.name)) for f in dataclasses.fields(ins)}
        if ins.opcode in isa.DMA_OPCODES:
            changes["queue"] = 0
        if ins.opcode == "tensor_reduce":
            changes["engine"] = isa.Engine.VECTOR
        out.append(dataclasses.replace(ins, **changes))
    return out
