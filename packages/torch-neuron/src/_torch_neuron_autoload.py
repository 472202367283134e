"""What ``import torch`` runs for torch-neuron (entry point group ``torch.backends``): it imports ``torch_neuron``
and, when that fails (no C++ compiler for the first build, a bad environment variable), warns and leaves torch
usable without the ``neuron`` device, instead of failing ``import torch`` for every program on the machine.

A top-level module, not part of ``torch_neuron``: importing any module of that package runs the package's
``__init__``, which is the import that may fail. ``import torch_neuron`` itself still raises the error.
"""

from __future__ import annotations

import warnings


def load() -> None:
    try:
        import torch_neuron  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure of the backend must leave torch importable
        detail = "\n".join(str(e).strip().splitlines()[:6]) or type(e).__name__
        warnings.warn(
            f"torch-neuron: the neuron device is unavailable, loading it failed with {type(e).__name__}: {detail}\n"
            "torch works without it. Fix the cause above (`python -c 'import torch_neuron'` shows the whole "
            "error), or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop torch from loading the backend.",
            RuntimeWarning, stacklevel=2)
