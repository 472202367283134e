"""Dynamo's device interface for neuron (torch._dynamo.device_interface), as device-generic compile code uses it."""

import subprocess
import sys

import torch
from torch._dynamo.device_interface import get_interface_for_device, get_registered_device_interfaces


def test_neuron_has_a_dynamo_device_interface():
    iface = get_interface_for_device("neuron")
    assert get_interface_for_device(torch.device("neuron", 1)) is iface
    assert ("neuron", iface) in list(get_registered_device_interfaces())
    assert iface.is_available() and iface.device_count() == torch.neuron.device_count()
    assert iface.get_compute_capability() == 10 * torch.neuron.get_device_capability()[0]
    assert iface.is_dtype_supported(torch.bfloat16) and not iface.is_dtype_supported(torch.float64)
    assert not iface.is_triton_capable()
    with iface.device(1):
        assert iface.current_device() == 1
    assert iface.current_device() == 0
    assert iface.exchange_device(2) == 0 and iface.current_device() == 2
    iface.set_device(0)
    s = iface.Stream()
    assert s.device == torch.device("neuron", 0)
    start, end = iface.Event(enable_timing=True), iface.Event(enable_timing=True)
    with iface.stream(s):
        start.record()
        y = torch.ones(4, device="neuron") * 3
        end.record()
    iface.synchronize()
    assert y.cpu().tolist() == [3.0] * 4 and start.elapsed_time(end) > 0
    assert iface.get_device_properties().name == torch.neuron.get_device_name()
    assert iface.memory_allocated() == torch.neuron.memory_allocated()


def test_import_torch_does_not_import_dynamo():
    """The interface is registered when Dynamo's module is first imported, not by loading the backend."""
    code = "import sys, torch; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"
