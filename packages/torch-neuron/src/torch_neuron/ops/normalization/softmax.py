"""softmax and log_softmax forward and backward (``_softmax``, ``_log_softmax``, ``_softmax_backward_data``,
``_log_softmax_backward_data``): the ``softmax`` kernels, fp32 inside, one rounding.

``half_to_float`` (CUDA's fused 16-bit input -> fp32 output) widens the input first; the backward's
``input_dtype`` narrower than the gradient (that case's backward) rounds the fp32 result once.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import movement
from neuron_kernels.library import softmax as sm

from ..core.checks import same_device
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, out_variant
from ..reduction.sums import plan

aten = torch.ops.aten


def _dim(x: torch.Tensor, dim: int) -> int:
    dims = plan(x, (dim,), False)[0]
    return dims[0] if dims else 0  # 0-d: dim 0 or -1


def _forward(name: str, kernel, cpu_op, self, dim, half_to_float):
    if self.dtype not in FLOATS:
        return on_cpu(cpu_op, self, dim, half_to_float)
    d = _dim(self, dim)
    x = contig(self)
    if half_to_float and x.dtype != torch.float32:
        x = run(name, movement.copy, x, torch.float32)[0]
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return run(name, kernel, x, d)[0]


def softmax(self, dim, half_to_float=False):
    return _forward("_softmax", sm.softmax, aten._softmax.default, self, dim, half_to_float)


def log_softmax(self, dim, half_to_float=False):
    return _forward("_log_softmax", sm.log_softmax, aten._log_softmax.default, self, dim, half_to_float)


def _backward(name: str, kernel, cpu_op, grad_output, output, dim, input_dtype):
    same_device(grad_output, output)
    if grad_output.dtype not in FLOATS or output.dtype != grad_output.dtype or input_dtype not in FLOATS:
        return on_cpu(cpu_op, grad_output, output, dim, input_dtype)
    d = _dim(output, dim)
    if grad_output.numel() == 0:
        return torch.empty(output.shape, dtype=input_dtype, device=output.device)
    g = run(name, kernel, contig(grad_output), contig(output), d)[0]
    return g if g.dtype == input_dtype else run(name, movement.copy, g, input_dtype)[0]


def softmax_backward(grad_output, output, dim, input_dtype):
    return _backward("_softmax_backward_data", sm.softmax_backward, aten._softmax_backward_data.default,
                     grad_output, output, dim, input_dtype)


def log_softmax_backward(grad_output, output, dim, input_dtype):
    return _backward("_log_softmax_backward_data", sm.log_softmax_backward,
                     aten._log_softmax_backward_data.default, grad_output, output, dim, input_dtype)


def _grad_input_out(fn):
    def run_out(grad_output, output, dim, input_dtype, *, grad_input):
        return out_variant(fn)(grad_output, output, dim, input_dtype, out=grad_input)
    return run_out
