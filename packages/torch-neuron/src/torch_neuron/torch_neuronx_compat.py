"""The ``torch_neuronx`` import name, answered for the Hugging Face libraries only when AWS's package is absent.

Transformers (``is_torch_neuron_available``) and Accelerate (``is_neuron_available``) decide that a ``neuron``
device exists by ``importlib.util.find_spec("torch_neuronx")`` and then use nothing of that package: everything
after the check goes through ``torch.neuron`` (``is_available``, ``device_count``, ``set_device``,
``is_bf16_supported``, the RNG state), which this backend provides. Without an answer to the check users must set
``ACCELERATE_TORCH_DEVICE=neuron`` and ``Trainer(bf16=True)`` is refused.

How it never shadows AWS's package: the finder is appended at the END of ``sys.meta_path``, after the standard
``PathFinder`` and every finder installed at startup (editable installs included). Python asks it only after they
all found nothing, i.e. only when no ``torch_neuronx`` is importable from ``sys.path``. The module it answers with
is empty: any attribute (``trace``, ``xla_impl``, ...) or submodule raises an error saying it is torch-neuron's
compatibility module, so nothing can mistake it for AWS's API. ``TORCH_NEURON_TORCH_NEURONX=0`` turns it off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

NAME = "torch_neuronx"
ENV = "TORCH_NEURON_TORCH_NEURONX"
_WHAT = (f"this '{NAME}' is torch-neuron's compatibility module: it exists only so that libraries which detect the "
         f"neuron device by the import name {NAME!r} (Transformers, Accelerate) find torch-neuron's device, and it "
         f"provides none of AWS's torch-neuronx API")


class NotAWSTorchNeuronx(AttributeError):
    """What every attribute of the compatibility module raises (an AttributeError, so that ``hasattr`` probes stay
    False; ``from torch_neuronx import x`` then tries the submodule, which the finder refuses with the same words)."""


def _getattr(name: str):
    raise NotAWSTorchNeuronx(f"{NAME}.{name}: {_WHAT}. Install AWS's torch-neuronx for its API (it takes precedence "
                             f"over this module), or use torch-neuron's own `torch.neuron` / `torch.compile(..., "
                             f"backend='neuron')`.")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = f"torch-neuron's compatibility module ({_WHAT})."
        module.__torch_neuron_compat__ = True  # how a program tells it from AWS's package
        module.__path__ = []  # a package, so that a submodule import reaches the finder and gets the clear error
        module.__getattr__ = _getattr


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(NAME + ".") and getattr(sys.modules.get(NAME), "__torch_neuron_compat__", False):
            raise ModuleNotFoundError(f"No module named {fullname!r}: {_WHAT}.", name=fullname)
        if fullname != NAME or os.environ.get(ENV, "1") == "0":
            return None
        return importlib.machinery.ModuleSpec(NAME, _Loader(), origin="torch-neuron compatibility module",
                                              is_package=True)


def register() -> None:
    """Appends the finder (once): last, so that any other ``torch_neuronx`` wins."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.append(Finder())
