"""Ops without a neuron kernel run on the CPU loudly: a warning once per op, a counter, strict mode."""

import pytest
import torch

from torch_neuron import fallback
from torch_neuron.fallback import NeuronFallbackWarning
from torch_neuron.ops.core.fallback import on_cpu

# an op with no neuron kernel (the FFTs, complex results, take the CPU path by policy)
OP, CALL = "_fft_r2c", torch.fft.rfft


def unique_op_input():
    return torch.tensor([2.0, 1.0, 1.0, 3.0]).to("neuron")


def test_fallback_is_correct_counted_and_warns_once():
    x = unique_op_input()
    fallback._warned.discard((OP, None))  # another test in this process may have run the op already
    before = torch.neuron.metrics()["fallback"].get(OP, 0)
    with pytest.warns(NeuronFallbackWarning, match=f"aten::{OP} has no neuron kernel"):
        got = CALL(x)
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), CALL(x.cpu()))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronFallbackWarning)
        CALL(x)  # the second call does not warn again
    assert torch.neuron.metrics()["fallback"][OP] == before + 2


def test_strict_mode_makes_a_fallback_an_error_naming_the_op():
    x = unique_op_input()
    torch.neuron.set_strict(True)
    try:
        with pytest.raises(NotImplementedError, match=f"aten::{OP} has no neuron kernel.*strict"):
            CALL(x)
    finally:
        torch.neuron.set_strict(False)


def test_strict_mode_from_the_environment():
    import os
    import subprocess
    import sys

    code = "import torch; torch.fft.rfft(torch.ones(4).to('neuron'))"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TORCH_NEURON_STRICT="1"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "strict" in out.stderr


def test_float64_lives_on_the_device_and_computes_on_the_cpu_loudly():
    x = torch.arange(5, dtype=torch.float64)
    y = x.to("neuron")
    assert y.dtype == torch.float64
    torch.testing.assert_close(y.cpu(), x, rtol=0, atol=0)  # storage is exact
    with pytest.warns(NeuronFallbackWarning):
        z = (y * 1e-300) * 1e300  # float32 would flush to 0
    torch.testing.assert_close(z.cpu(), (x * 1e-300) * 1e300)


def test_run_on_cpu_updates_in_place_and_out_arguments():
    a = torch.arange(4.0, dtype=torch.float64).to("neuron")
    with pytest.warns(NeuronFallbackWarning):
        b = a.clone()
        assert on_cpu(torch.ops.aten.add_.Tensor, b, a) is b
        out = torch.empty(0, dtype=torch.float64, device="neuron")
        assert on_cpu(torch.ops.aten.add.out, a, a, alpha=3, out=out) is out
        values, indices = on_cpu(torch.ops.aten.max.dim, a, 0)
    torch.testing.assert_close(b.cpu(), 2 * torch.arange(4.0, dtype=torch.float64))
    torch.testing.assert_close(out.cpu(), 4 * torch.arange(4.0, dtype=torch.float64))
    assert values.device.type == "neuron" and indices.item() == 3


def test_a_kernel_handing_over_its_arguments_says_why():
    """An op whose neuron kernel cannot take these arguments (float64: no engine computes it) says so, naming the
    dtypes, instead of claiming the op has no kernel."""
    x = torch.eye(3, dtype=torch.float64).to("neuron")
    fallback._warned.discard(("mm", "these arguments (float64 tensors)"))
    with pytest.warns(NeuronFallbackWarning, match=r"aten::mm has a neuron kernel, but not for these arguments "
                                                   r"\(float64 tensors\): running it on the CPU"):
        got = x @ x
    torch.testing.assert_close(got.cpu(), torch.eye(3, dtype=torch.float64))
