"""What a database entry's own decorators say about one of PyTorch's device tests, applied as the
device-type machinery would for the ``neuron`` device: skips (random or uninitialized outputs, CUDA-only
entries), and tolerance / precision overrides, which only ever raise the base tolerances."""

from __future__ import annotations

import unittest
from dataclasses import dataclass

import torch
from torch.testing._internal import common_device_type as cdt
from torch.testing._internal.opinfo.core import DecorateInfo

# Device restrictions that are a test-suite policy, not an entry's capability: aminmax and roll are marked
# "native device types only" for every test, yet their CPU comparison is meaningful on any device.
_IGNORED = (cdt.onlyNativeDeviceTypes,)


@dataclass
class Policy:
    skip: str | None  # why values are not compared
    rtol: float
    atol: float


class _Probe:
    """Stands in for the test instance decorators expect (they read or set these attributes)."""

    device_type = "neuron"
    precision = 0.0
    rel_tol = 0.0


def _active(decorators, cls_name: str, test_name: str, dtype):
    for d in decorators or ():
        if isinstance(d, DecorateInfo):
            if d.is_active(cls_name, test_name, "neuron", dtype, {}):
                yield from d.decorators
        else:  # bare decorators apply to every test of the entry
            yield d


def policy(decorators, cls_name: str, test_name: str, dtype: torch.dtype, rtol: float, atol: float) -> Policy:
    """The skip and tolerances for PyTorch test ``cls_name.test_name`` from an entry's ``decorators``."""
    for dec in _active(decorators, cls_name, test_name, dtype):
        if dec in _IGNORED:
            continue
        if isinstance(dec, cdt.toleranceOverride):
            t = dec.d.get(dtype)
            rtol, atol = (max(rtol, t.rtol), max(atol, t.atol)) if t else (rtol, atol)
            continue
        if isinstance(dec, cdt.precisionOverride):
            atol = max(atol, dec.d.get(dtype, 0.0))
            continue
        reason = _skip_reason(dec, test_name, dtype)
        if reason:
            return Policy(reason, rtol, atol)
    return Policy(None, rtol, atol)


def _skip_reason(dec, test_name: str, dtype) -> str | None:
    def test(self, *args, **kwargs):
        return None

    try:
        fn = dec(test)
    except Exception:  # a decorator for some other kind of test
        return None
    if getattr(fn, "__unittest_skip__", False):
        return f"PyTorch skips {test_name}: {fn.__unittest_skip_why__}"
    try:
        fn(_Probe(), "neuron", dtype=dtype)
    except unittest.SkipTest as e:
        return f"PyTorch skips {test_name} on this device: {e}"
    except Exception:
        return None
    return None
