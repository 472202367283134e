"""aten ops on the neuron device, each as neuron-kernels programs through the HAL.

Every module of this package registers its ops when imported (``@registry.impl`` decorators, or a
``register(lib)`` function); then ops without a kernel that PyTorch can decompose run the decomposition
on the device (``decomp``); the rest take the loud CPU fallback.
"""

from __future__ import annotations

import importlib
import pkgutil

from . import decomp, registry

_INFRA = {"registry", "launch", "common", "decomp"}


def register() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _INFRA:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(registry.LIB)
    # last: PyTorch's decompositions for the ops that are still without a kernel
    decomp.DECOMPOSED[:] = decomp.register()
