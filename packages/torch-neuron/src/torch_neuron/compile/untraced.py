"""The backend's own code is never traced by Dynamo.

Between the graphs of a model with graph breaks, Dynamo watches every Python frame the model's eager code
enters, and an aten op on a neuron tensor enters ours: the op's Python kernel (``torch_neuron.ops``), the kernel
library, the HAL and the simulator that runs the program. Dynamo would trace those as if they were the model's
code: a graph, and its graph breaks, per kernel launch (hundreds of compiles for one model), and the simulator's
tensors then run through AOTAutograd (where some of its ops have no functional form: ``index_put`` of uint32).
They are added to Dynamo's skip list instead, as torch does for numpy, tqdm and the like: they run as plain Python.
``torch_neuron.models`` stays traceable (the models are what one compiles).
"""

from __future__ import annotations

import pkgutil

import torch._dynamo.trace_rules as trace_rules

import torch_neuron

TRACEABLE = {"models"}  # torch_neuron's subpackages that hold model code
OTHER_PACKAGES = ("neuron_kernels", "neuron_hal", "neuron_sim", "numba")


def skipped_modules() -> list[str]:
    """The modules whose files Dynamo skips: torch_neuron's but the traceable ones, and the stack below it."""
    ours = [f"torch_neuron.{m.name}" for m in pkgutil.iter_modules(torch_neuron.__path__) if m.name not in TRACEABLE]
    return [*ours, *OTHER_PACKAGES]


def register() -> None:
    for name in skipped_modules():
        trace_rules.add(name)  # a module's file or a package's directory; nothing for a package not installed
