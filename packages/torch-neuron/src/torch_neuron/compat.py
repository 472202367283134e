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
"""

from __future__ import annotations

import atexit
import time

import torch
import torch._tensor_str as tensor_str

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


def register(lib) -> None:
    lib.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
    if not hasattr(tensor_str._tensor_str, "__wrapped__"):
        tensor_str._tensor_str = _format_on_host(tensor_str._tensor_str)
    atexit.register(_let_autograd_threads_finish)
