"""Autocast support: the cast policy is registered in C++ (csrc/Autocast.cpp); these are the
questions torch.autocast asks the device module."""

from __future__ import annotations

import torch


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("neuron")


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("neuron")
