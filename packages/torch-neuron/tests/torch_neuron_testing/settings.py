"""How much of each database a run covers.

``TORCH_NEURON_OPINFO_SAMPLES``: samples per op_db entry and module inputs per module_db entry, and
(times :data:`CONFIG_FACTOR`) configurations per optim_db entry — an integer N (the first N of each entry,
stable because generation is seeded) or ``all``, the default: ``nox -s test`` runs every sample of every
entry (about 5 minutes of its run on 2 cores); a smaller N is for quick local runs.
"""

from __future__ import annotations

import os

DEFAULT_SAMPLES = "all"
CONFIG_FACTOR = 4  # optimizer configurations are cheap (a few small tensors, three steps)


def samples_per_op() -> int | None:
    value = os.environ.get("TORCH_NEURON_OPINFO_SAMPLES", str(DEFAULT_SAMPLES)).strip().lower()
    if value == "all":
        return None
    n = int(value)
    if n < 1:
        raise ValueError(f"TORCH_NEURON_OPINFO_SAMPLES={value}: use a positive integer or 'all'")
    return n


def configs_per_optimizer() -> int | None:
    n = samples_per_op()
    return None if n is None else n * CONFIG_FACTOR
