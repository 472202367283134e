"""Streams and events. A stream is a HAL queue of its device; events record device time, so
``Event.elapsed_time`` is *device* milliseconds (simulated on the sim driver). Both are torch's
generic ``torch.Stream`` / ``torch.Event`` on the neuron device, served by the C++ device guard."""

from __future__ import annotations

import torch

from .device import _index


def _neuron(device) -> torch.device:
    return torch.device("neuron", _index(device))


class Stream:
    """``torch.neuron.Stream(device=None, priority=0)``: a new ``torch.Stream`` on a neuron device."""

    def __new__(cls, device=None, priority: int = 0) -> torch.Stream:
        return torch.Stream(device=_neuron(device), priority=priority)


class Event:
    """``torch.neuron.Event(enable_timing=False)``: a ``torch.Event`` on the neuron device."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        return torch.Event(device=_neuron(None), enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_neuron(device))


def default_stream(device=None) -> torch.Stream:
    d = _neuron(device)
    return torch.Stream(stream_id=0, device_index=d.index, device_type=current_stream(d).device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


def stream(s: torch.Stream) -> torch.Stream:
    """``with torch.neuron.stream(s):`` makes ``s`` current (a torch.Stream is its own context manager)."""
    return s
