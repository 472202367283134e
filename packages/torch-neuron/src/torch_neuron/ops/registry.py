"""The aten library handle the op modules register into, and small registration helpers."""

from __future__ import annotations

import torch

from ..metrics import record_native

LIB = torch.library.Library("aten", "IMPL")


def impl(*names: str):
    """Decorator: register the function as the PrivateUse1 (neuron) kernel of aten ops ``names``."""

    def register(fn):
        for name in names:
            LIB.impl(name, fn, "PrivateUse1")
        return fn

    return register


def note_native(op: str, ns: float = 0.0) -> None:
    record_native(op, ns, programs=0)
