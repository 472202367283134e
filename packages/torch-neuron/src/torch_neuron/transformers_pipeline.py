"""``transformers.pipeline(..., device=0)`` on neuron: the device index means ``neuron:0``, as it means ``cuda:0``.

Transformers maps an integer ``device`` through a fixed list of device types (cuda, npu, hpu, xpu, mps, ...) and
silently takes the CPU for any other, so with neuron the only accelerator a pipeline given ``device=0`` ran on the
CPU. Right after ``transformers.pipelines.base`` is imported, ``Pipeline.__init__`` gets the integer turned into
``torch.device("neuron", index)`` when neuron is torch's current accelerator (``torch.accelerator``), before
Transformers reads it; ``device=-1``, strings and ``torch.device`` values pass unchanged.
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch

_MODULE = "transformers.pipelines.base"
_DONE = "__torch_neuron_device_index__"


def _neuron_index(device):
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        return device
    accelerator = torch.accelerator.current_accelerator()
    return torch.device("neuron", device) if accelerator is not None and accelerator.type == "neuron" else device


def _patch() -> None:
    pipeline = sys.modules[_MODULE].Pipeline
    init = pipeline.__init__
    if getattr(init, _DONE, False):
        return
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind_partial(self, *args, **kwargs)
        if "device" in bound.arguments:
            bound.arguments["device"] = _neuron_index(bound.arguments["device"])
        return init(*bound.args, **bound.kwargs)

    setattr(__init__, _DONE, True)
    pipeline.__init__ = __init__


def register(after_import) -> None:
    after_import(_MODULE, _patch)
