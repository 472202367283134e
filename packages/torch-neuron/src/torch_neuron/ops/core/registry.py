"""The aten library handle the op modules register into, and small registration helpers."""

from __future__ import annotations

import functools

import torch

from ...metrics import attributed, record_native

LIB = torch.library.Library("aten", "IMPL")


def impl(*names: str):
    """Decorator: register the function as the PrivateUse1 (neuron) kernel of aten ops ``names``."""

    def register(fn):
        for name in names:
            LIB.impl(name, scoped(name.split(".")[0], fn), "PrivateUse1")
        return fn

    return register


def scoped(op: str, fn):
    """``fn`` as op ``op``'s kernel: the device time of what it dispatches is charged to ``op`` (``attributed``)."""

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        with attributed(op):
            return fn(*args, **kwargs)

    return kernel


def note_native(op: str, ns: float = 0.0) -> None:
    record_native(op, ns, programs=0)
