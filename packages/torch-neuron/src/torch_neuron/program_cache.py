"""The program cache: every program a neuron kernel traces (eager ops and compiled graphs' fused regions)
kept on disk, content-addressed (``neuron_kernels.store``), shared by every process with the same code
and profile. A new process loads a program instead of tracing it again (a flash-attention program: 16 ms
instead of 116 ms), which is most of a warm ``torch.compile``.

The directory is ``$TORCH_NEURON_COMPILE_CACHE``, else ``~/.cache/torch-neuron/programs``; ``0`` or ``off``
keeps traces in the process. Hits, misses and writes are counted in ``torch.neuron.metrics()["compile"]``.
Compiled graphs are kept under its ``graphs`` directory (``compile.aot_cache``), so a warm process skips
AOTAutograd too; the driver keeps what it derives from a graph's merged program there (``neuron_hal.cache``: the
sim's instruction schedule and its timing, under ``schedules``, so a warm process does not even merge the graph).
"""

from __future__ import annotations

import os
import pathlib

from neuron_hal.cache import set_cache_dir as set_driver_cache_dir
from neuron_kernels.store import ProgramStore, default_store, set_default_store

from .metrics import record_compile

_OFF = ("0", "off", "false", "no")


def cache_dir() -> pathlib.Path | None:
    env = os.environ.get("TORCH_NEURON_COMPILE_CACHE")
    if env is not None and env.strip().lower() in _OFF:
        return None
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
    """Point every kernel, and the driver, at the cache directory the environment names now (done at import)."""
    root = cache_dir()
    set_driver_cache_dir(root)
    current = default_store()
    if root is None:
        set_default_store(None)
    elif current is None or current.root != root:
        set_default_store(CountedStore(root))
