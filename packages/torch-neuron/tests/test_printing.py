"""Printing neuron tensors reads them back once and formats them as the CPU does (plus the device suffix),
without running device ops; ``Tensor.numpy()`` refuses device tensors with a message saying what to do."""

import pytest
import torch

SUFFIX = "device='neuron:0'"

CASES = {
    "float32": lambda: torch.randn(3, 4),
    "bfloat16": lambda: torch.randn(2, 5).to(torch.bfloat16),
    "float16": lambda: torch.randn(5).half(),
    "int64": lambda: torch.arange(-5, 7).reshape(3, 4),
    "bool": lambda: torch.arange(6) % 2 == 0,
    "0-d": lambda: torch.tensor(2.5),
    "empty": lambda: torch.empty(0, 3),
    "non-finite": lambda: torch.tensor([float("inf"), float("nan"), -1.0, 1e10]),
    "summarized": lambda: torch.arange(5000.0).reshape(50, 100),
    "transposed view": lambda: torch.arange(12.0).reshape(3, 4).t(),
}


def _squeeze(text: str) -> str:
    """Text without whitespace and without the device suffix (and the comma it brought)."""
    return "".join(text.split()).replace("," + SUFFIX, "")


@pytest.mark.parametrize("name", list(CASES))
def test_repr_matches_cpu(name):
    torch.manual_seed(0)
    host = CASES[name]()
    text = repr(host.to("neuron") if name != "transposed view" else host.t().contiguous().to("neuron").t())
    assert SUFFIX in text
    assert _squeeze(text) == _squeeze(repr(host))


def test_printing_runs_no_device_op():
    x = torch.randn(64, 64).to("neuron")
    before = torch.neuron.metrics()
    str(x), repr(x.to(torch.bfloat16))
    after = torch.neuron.metrics()
    assert after["fallback"] == before["fallback"]
    ran = {op: n - before["native"].get(op, 0) for op, n in after["native"].items()}
    assert set(op for op, n in ran.items() if n) <= {"_to_copy", "copy_"}  # the bf16 cast itself


def test_grad_fn_and_requires_grad_are_shown():
    x = torch.ones(2, device="neuron", requires_grad=True)
    assert "requires_grad=True" in repr(x)
    assert "grad_fn=<" in repr(x.view(2, 1))


def test_numpy_of_a_device_tensor_says_to_copy_first():
    x = torch.ones(3, device="neuron")
    with pytest.raises(TypeError, match=r"neuron:0.*Tensor\.cpu\(\)"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 1.0, 1.0]
    assert x.tolist() == [1.0, 1.0, 1.0]
