"""Ops with no neuron kernel run on the CPU, loudly: a warning once per op, a counter in
``torch.neuron.metrics()``, and an error instead when strict (``TORCH_NEURON_STRICT=1`` or
``torch.neuron.set_strict(True)``). float64 has no Trainium engine support: float64 tensors may
live on the device (DMA moves any bytes) but every op on them takes this path.
"""

from __future__ import annotations

import os
import warnings

from .metrics import fallback_calls

_strict = os.environ.get("TORCH_NEURON_STRICT", "0") not in ("", "0", "false", "False")
_warned: set[tuple[str, str | None]] = set()  # (op, reason) pairs already warned of
observers: list = []  # callables (op) told of every fallback, e.g. an active profiler


class NeuronFallbackWarning(UserWarning):
    pass


def set_strict(flag: bool) -> None:
    global _strict
    _strict = bool(flag)


def is_strict() -> bool:
    return _strict


def on_fallback(op: str, reason: str | None = None) -> None:
    """Called before an op runs on the CPU: by the C++ boxed fallback (no neuron kernel at all), or with
    ``reason`` by a neuron kernel handing over arguments it cannot compute (e.g. "float64 tensors")."""
    what = (f"aten::{op} has no neuron kernel" if reason is None
            else f"aten::{op} has a neuron kernel, but not for {reason}")
    if _strict:
        raise NotImplementedError(
            f"{what} and strict mode forbids the CPU fallback "
            f"(unset TORCH_NEURON_STRICT or call torch.neuron.set_strict(False) to allow it)")
    fallback_calls[op] += 1
    for observe in observers:
        observe(op)
    if (op, reason) not in _warned:
        _warned.add((op, reason))
        warnings.warn(f"{what}: running it on the CPU (copies in and out); see torch.neuron.metrics()['fallback']",
                      NeuronFallbackWarning, stacklevel=2)
