"""Quantized tensors on the neuron device: absent (no storage or kernels for torch's quantized dtypes), so every
way of making one raises an error that says so, before any CPU round trip, and the CPU's quantization still works."""

import warnings

import pytest
import torch

MESSAGE = "neuron has no quantized tensors"


def _quantize_on_device():
    return torch.quantize_per_tensor(torch.randn(3, 4, device="neuron"), 0.1, 10, torch.qint8)


def _per_channel_on_device():
    x = torch.randn(3, 2, device="neuron")
    return torch.quantize_per_channel(x, torch.ones(3), torch.zeros(3, dtype=torch.long), 0, torch.quint8)


def _move_quantized_over():
    return torch.quantize_per_tensor(torch.randn(3), 0.1, 10, torch.qint8).to("neuron")


def _empty_quantized():
    return torch.empty(3, dtype=torch.qint8, device="neuron")


@pytest.mark.parametrize("make", [_quantize_on_device, _per_channel_on_device, _move_quantized_over,
                                  _empty_quantized])
def test_quantize(make):
    before = dict(torch.neuron.metrics()["fallback"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's deprecation warning for quantized dtypes
        with pytest.raises(NotImplementedError, match=MESSAGE):
            make()
    assert dict(torch.neuron.metrics()["fallback"]) == before  # refused up front, not after a CPU run


def test_cpu_quantization_is_unaffected():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_tensor(torch.tensor([0.0, 0.5, 1.0]), 0.5, 0, torch.quint8)
    assert q.int_repr().tolist() == [0, 1, 2]
