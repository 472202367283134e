"""NKI kernels (``neuron_kernels.nki``, the ``nki`` front end) called with ``neuron`` tensors return ``neuron``
tensors: the arguments go through the host (``.cpu()``), the kernel runs on the simulator, results come back."""

import torch

import neuron_kernels.nki as nki
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl


@nki.jit
def scaled_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    nisa.scalar_tensor_tensor(dst=ta, data=ta, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=tb)
    nisa.dma_copy(dst=out, src=ta)
    return out


def test_nki_kernel_on_neuron_tensors():
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(100, 48, dtype=dtype), torch.randn(100, 48, dtype=dtype)
        out = scaled_add(a.to("neuron"), b.to("neuron"))
        assert out.device.type == "neuron" and out.dtype == dtype
        torch.testing.assert_close(out.cpu(), (a.float() * 3 + b.float()).to(dtype), rtol=0, atol=0)
