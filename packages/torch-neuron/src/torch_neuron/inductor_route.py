"""Plain ``torch.compile(model)`` on a neuron model: the graph goes to the neuron backend instead of Inductor.

Inductor has no neuron code generation; it used to fail deep in a lowering (``LoweringException: ...
aten.var_mean.correction``). Inductor's per-device hook (``register_backend_for_device``) plugs in a kernel code
generator for Inductor's own loop-level IR, which is not what neuron's compiler is (it compiles the aten graph
into fused device programs), so it is not the route: instead the callable ``torch.compile`` builds for its default
backend (``torch._TorchCompileInductorWrapper``) hands a graph whose inputs or weights are neuron tensors to
``torch.compile(backend="neuron")``'s backend. Every other graph (CPU, CUDA, ...) is Inductor's as before.
Inductor's ``mode``/``options`` have no neuron meaning and are ignored for such graphs (logged once).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("torch_neuron.compile")
_ROUTED = "__torch_neuron_routed__"


def _on_neuron(gm, inputs) -> bool:
    tensors = [*inputs, *getattr(gm, "parameters", lambda: ())(), *getattr(gm, "buffers", lambda: ())()]
    return any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in tensors)


def _route(call):
    def __call__(self, model_, inputs_, *, config_patches=None):
        if not _on_neuron(model_, inputs_):
            return call(self, model_, inputs_, config_patches=config_patches)
        from .compile import backend  # the neuron backend (imports Dynamo and AOTAutograd: only now)

        if self.config and not getattr(self, "_neuron_logged", False):
            self._neuron_logged = True
            log.info("neuron: torch.compile's Inductor options %s do not apply to neuron graphs; compiling "
                     "with backend='neuron'", sorted(self.config))
        return backend(model_, inputs_)

    setattr(__call__, _ROUTED, True)
    __call__.__wrapped__ = call
    return __call__


def register() -> None:
    wrapper = torch._TorchCompileInductorWrapper
    if not getattr(wrapper.__call__, _ROUTED, False):
        wrapper.__call__ = _route(wrapper.__call__)
