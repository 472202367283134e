"""``torch._dynamo.device_interface`` for ``neuron``: what device-generic compile code (Dynamo's stream and event
handling, Inductor's device checks, compile caches keyed by device properties) asks of a device, answered from
``torch.neuron`` as ``CudaInterface`` answers from ``torch.cuda``. No Triton: the neuron backend compiles graphs."""

from __future__ import annotations

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device


class NeuronInterface(DeviceInterface):
    class device:  # noqa: N801 - DeviceInterface's name
        def __new__(cls, device):
            return torch.neuron.device(device)

    class Event:
        def __new__(cls, *args, **kwargs):
            return torch.neuron.Event(*args, **kwargs)

    class Stream:
        def __new__(cls, *args, **kwargs):
            return torch.neuron.Stream(*args, **kwargs)

    class Worker:  # what a compile worker process may ask without initializing the device there
        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return torch.neuron.get_device_properties(device)

    @staticmethod
    def current_device() -> int:
        return torch.neuron.current_device()

    @staticmethod
    def set_device(device) -> None:
        torch.neuron.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return NeuronInterface.exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.neuron.current_device()
        if device >= 0 and device != previous:
            torch.neuron.set_device(device)
        return previous

    @staticmethod
    def device_count() -> int:
        return torch.neuron.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.neuron.is_available()

    @staticmethod
    def stream(stream: torch.Stream):
        return torch.neuron.stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return torch.neuron.current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        torch.neuron.set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.neuron.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch.neuron.current_stream(device_idx).stream_id

    @staticmethod
    def synchronize(device=None) -> None:
        torch.neuron.synchronize(device)

    @classmethod
    def get_device_properties(cls, device=None):
        return torch.neuron.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device=None):
        major, minor = torch.neuron.get_device_capability(device)
        return major * 10 + minor  # an int, as CUDA's (NeuronCore v3 -> 30)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.neuron.is_bf16_supported()

    @classmethod
    def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return dtype not in (torch.float64, torch.complex128)  # no engine computes them (the CPU path does)

    @staticmethod
    def memory_allocated(device=None) -> int:
        return torch.neuron.memory_allocated(device)


def register() -> None:
    register_interface_for_device("neuron", NeuronInterface)
    for i in range(torch.neuron.device_count()):
        register_interface_for_device(f"neuron:{i}", NeuronInterface)
