"""``with native(*ops):`` — the block runs with no CPU fallback (strict mode: one raises at once, naming the
op) and each of ``ops`` was recorded as run natively."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def native(*ops):
    before = dict(torch.neuron.metrics()["native"])
    torch.neuron.set_strict(True)
    try:
        yield
    finally:
        torch.neuron.set_strict(False)
    after = torch.neuron.metrics()["native"]
    for op in filter(None, ops):  # None: nothing to launch (empty results return without a kernel)
        assert after.get(op, 0) > before.get(op, 0), f"{op} did not run natively"
