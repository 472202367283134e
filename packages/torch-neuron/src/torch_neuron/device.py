"""Devices: the NeuronCores of the profile's chip (simulated unless a hardware driver is chosen)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from neuron_hal.errors import InvalidDeviceError

from .runtime import runtime


def _C():
    from . import _C

    return _C


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    try:
        return runtime().device_count()
    except Exception:  # no driver finds devices: the backend reports none rather than failing import
        return 0


def current_device() -> int:
    return _C()._current_device()


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        d = torch.device(device)
        if d.type != "neuron":
            raise ValueError(f"expected a neuron device, got {d}")
        index = current_device() if d.index is None else d.index
    if not 0 <= index < device_count():
        # a RuntimeError as CUDA's "invalid device ordinal" (and an IndexError, as the HAL's InvalidDeviceError)
        raise InvalidDeviceError(f"The device index is out of range: neuron:{index} does not exist, this machine "
                                 f"has {device_count()} neuron devices (valid indices 0..{device_count() - 1})")
    return index


def set_device(device) -> None:
    _C()._set_device(_index(device))


class device(contextlib.ContextDecorator):
    """Context manager that makes ``device`` current, as torch.cuda.device."""

    def __init__(self, device):
        self.index = _index(device) if device is not None and device != -1 else -1
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        if self.index >= 0:
            set_device(self.index)
        return self

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


@dataclass(frozen=True)
class NeuronDeviceProperties:
    name: str
    profile: str
    driver: str
    total_memory: int  # HBM of the chip, shared by its cores
    cores_per_chip: int
    sbuf_bytes: int
    psum_bytes: int
    partitions: int
    tensor_tflops_bf16: float  # one core's PE array peak
    hbm_bandwidth_gbps: float  # the chip's; shared by its cores
    neuron_core_version: int


def get_device_properties(device=None) -> NeuronDeviceProperties:
    rt = runtime()
    info = rt.infos[_index(device)]
    p = info.profile
    return NeuronDeviceProperties(
        name=info.name, profile=p.name, driver=info.driver, total_memory=info.hbm_bytes,
        cores_per_chip=p.cores_per_chip, sbuf_bytes=p.sbuf_bytes, psum_bytes=p.psum_partition_bytes * p.sbuf_partitions,
        partitions=p.sbuf_partitions, tensor_tflops_bf16=p.tensor_peak_flops / 1e12, hbm_bandwidth_gbps=p.hbm_gbps,
        neuron_core_version=p.nc_version)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple[int, int]:
    """NeuronCore version as (major, 0): 2 for Trainium1, 3 for Trainium2, 4 for Trainium3."""
    return (runtime().profile.nc_version, 0)


def synchronize(device=None) -> None:
    runtime().driver.synchronize(_index(device))
