"""The compile cache: fused-region programs on disk, content-addressed (neuron_kernels.store), shared by
every process that compiles the same graphs for the same profile with the same code.

The directory is ``$TORCH_NEURON_COMPILE_CACHE``, else ``~/.cache/torch-neuron/programs``; its hits,
misses and writes are counted in ``torch.neuron.metrics()["compile"]``.
"""

from __future__ import annotations

import os
import pathlib

from neuron_kernels.store import ProgramStore

from ..metrics import record_compile
from ..ops.pointwise_expr import graph_formula


def cache_dir() -> pathlib.Path:
    env = os.environ.get("TORCH_NEURON_COMPILE_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "torch-neuron" / "programs"


class CountedStore(ProgramStore):
    def load(self, kernel, key):
        program = super().load(kernel, key)
        record_compile("cache_hits" if program is not None else "cache_misses")
        return program

    def save(self, kernel, key, program):
        writes = self.writes
        super().save(kernel, key, program)
        if self.writes > writes:
            record_compile("cache_writes")


def enable() -> None:
    """Fused regions read and write the cache (called when the backend is first used)."""
    if graph_formula.store is None or graph_formula.store.root != cache_dir():
        graph_formula.store = CountedStore(cache_dir())
