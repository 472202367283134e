"""Places where torch treats its built-in devices specially, and how neuron gets the same behaviour.

- ``nn.Module.to("neuron")`` keeps each Parameter object (so tied weights stay tied and optimizers
  built earlier keep their references) only when ``_has_compatible_shallow_copy_type`` says a CPU
  and a neuron tensor may share a TensorImpl. torch hard-codes that for CPU/CUDA/XPU/...; a
  PrivateUse1 backend registers the op itself (torch's TensorImpl.h says so).
- Printing a tensor runs a dozen small ops on it (masked_select, abs, min/max, ceil, ...). On the
  device each is a traced program, and masked_select has a data-dependent shape; like torch does for
  xla/lazy/mtia, the contents are formatted from one host copy instead (the ``device='neuron:0'``
  suffix is computed before and stays).
- torch 2.13 stashes a Python object in the thread-local state of every backward; the autograd
  worker thread of a device drops its last graph task after the caller resumed, and needs the GIL
  for it. If the interpreter is already finalizing then, the thread is killed inside a C++
  destructor and the process aborts ("terminate called without an active exception"). An exit
  hook gives the worker threads the GIL once before finalization starts.
- Dynamo's ``device_interface`` registers its built-in devices in ``init_device_reg`` and has no entry for a
  PrivateUse1 one, so device-generic compile code failed with "No interface for device neuron". Importing
  Dynamo when torch loads this backend would cost every ``import torch`` about a second: neuron's interface
  (``device_interface.py``) is registered when ``torch._dynamo.device_interface`` is first imported.
- Transformers and Accelerate detect a neuron device by the import name ``torch_neuronx`` (AWS's package) and then
  use only ``torch.neuron``: ``torch_neuronx_compat.py`` answers that name when, and only when, nothing else does.
- ``torch.compile``'s default backend is Inductor, which cannot compile neuron tensors: ``inductor_route.py`` sends
  graphs on neuron to the neuron backend.
- Quantized dtypes (qint8, quint8, qint32, ...; deprecated by PyTorch) have no neuron storage or kernels: making
  a quantized neuron tensor (quantizing one, moving one over, an empty one) raises an error saying so instead of
  aten's "Could not run ... 'Quantizedneuron' backend" after a CPU round trip.
- ``transformers.pipeline(device=0)`` maps the index through a fixed list of device types without neuron and
  silently ran on the CPU: ``transformers_pipeline.py`` makes the index mean ``neuron:<index>``.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import sys
import time

import torch
import torch._tensor_str as tensor_str

from . import inductor_route, torch_neuronx_compat, transformers_pipeline

_SHARE_IMPL = ("cpu", "neuron")


def _has_compatible_shallow_copy_type(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Dense strided CPU and neuron tensors can take each other's metadata (``param.data = t``)."""
    return (self.layout == torch.strided and other.layout == torch.strided
            and self.device.type in _SHARE_IMPL and other.device.type in _SHARE_IMPL)


def _format_on_host(original):
    def format_tensor(self, indent):
        if self.device.type == "neuron":
            self = self.cpu()
        return original(self, indent)

    format_tensor.__wrapped__ = original
    return format_tensor


def _let_autograd_threads_finish() -> None:
    time.sleep(0.02)  # releases the GIL; a worker waiting for it to free a graph task gets it now


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` right after module ``name`` is first imported (its loader's exec_module, wrapped)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module, run=run):
                run(module)
                self.then()

            spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, then) -> None:
    """``then()`` once module ``name`` is imported: now if it is, else right after its first import."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _register_dynamo_interface() -> None:
    from . import device_interface  # not under compile/: that package imports the backend, Inductor included

    device_interface.register()


_QUANTIZED_MAKERS = {  # dispatch key -> the ops that make a quantized neuron tensor there
    "PrivateUse1": ("quantize_per_tensor", "quantize_per_tensor.tensor_qparams", "quantize_per_tensor.tensors",
                    "quantize_per_channel", "quantize_per_tensor_dynamic"),
    "QuantizedPrivateUse1": ("empty_quantized", "_empty_affine_quantized", "_empty_per_channel_affine_quantized",
                             "empty.memory_format"),
}


def _no_quantized(*args, **kwargs):
    raise NotImplementedError("neuron has no quantized tensors: torch's quantized dtypes (qint8, quint8, qint32, "
                              "quint4x2, quint2x4; deprecated by PyTorch) are not supported on the device. Quantize "
                              "on the CPU, or keep int8/float8 values with explicit scales on the device")


def register(lib) -> None:
    lib.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
    for key, ops in _QUANTIZED_MAKERS.items():
        for op in ops:
            lib.impl(op, _no_quantized, key)
    after_import("torch._dynamo.device_interface", _register_dynamo_interface)
    if not hasattr(tensor_str._tensor_str, "__wrapped__"):
        tensor_str._tensor_str = _format_on_host(tensor_str._tensor_str)
    atexit.register(_let_autograd_threads_finish)
    torch_neuronx_compat.register()
    inductor_route.register()
    transformers_pipeline.register(after_import)
