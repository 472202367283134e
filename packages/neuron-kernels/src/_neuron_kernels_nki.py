"""The ``nki`` import name for neuron-kernels' NKI front end, answered only when no other ``nki`` is importable.

Loaded at interpreter start by ``neuron_kernels_nki.pth`` (so a plain ``import nki`` works wherever neuron-kernels
is installed), and by ``import neuron_kernels``. It imports nothing heavy: the simulator loads on the first
``import nki``. Same approach as torch-neuron's ``torch_neuronx`` answer: the finder is appended at the END of
``sys.meta_path``, after the standard ``PathFinder`` and every finder installed at startup (editable installs
included), so Python asks it only after they all found nothing; AWS's ``nki`` package, when installed, always wins.
``NEURON_KERNELS_NKI=0`` turns the answer off. ``neuron_kernels.nki.install(override=True)`` is the explicit opt-in
that puts this implementation in place of an installed AWS ``nki`` (the way test harnesses swap ``sys.modules``).
"""

from __future__ import annotations

import os
import sys

# importlib.abc / importlib.machinery are imported where used: this module loads at every interpreter start

NAME = "nki"
IMPL = "neuron_kernels.nki"
ENV = "NEURON_KERNELS_NKI"
SUBMODULES = {"language": "language", "isa": "isa", "isa.constants": "isa_constants", "typing": "typing"}


class MissingNkiModule(ModuleNotFoundError, NotImplementedError):
    """A submodule of NKI (``nki.collectives``, ...) that neuron-kernels does not implement (yet)."""


def alias(override: bool = False):
    """Make ``nki`` and its submodules the very modules of ``neuron_kernels.nki`` in ``sys.modules``."""
    import importlib

    impl = importlib.import_module(IMPL)
    if not override and NAME in sys.modules and sys.modules[NAME] is not impl:
        return sys.modules[NAME]
    sys.modules[NAME] = impl
    for sub, module in SUBMODULES.items():
        sys.modules[f"{NAME}.{sub}"] = importlib.import_module(f"{IMPL}.{module}")
    return impl


def _ours() -> bool:
    return getattr(sys.modules.get(NAME), "__neuron_kernels_nki__", False)


class _Loader:  # the importlib Loader protocol
    def create_module(self, spec):
        module = alias(override=True)  # the implementation module itself, not a copy
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec  # already executed as neuron_kernels.nki; importlib set the alias's spec


class Finder:  # the importlib MetaPathFinder protocol
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(NAME + ".") and _ours():
            raise MissingNkiModule(f"{fullname} is not implemented by neuron-kernels' NKI front end "
                                   f"(see docs/nki.md for what is)", name=fullname)
        if fullname != NAME or os.environ.get(ENV, "1") == "0":
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(NAME, _Loader(), origin="neuron-kernels NKI front end", is_package=True)


def register() -> None:
    """Appends the finder (once): last, so that any other ``nki`` wins."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.append(Finder())
