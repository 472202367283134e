"""Elementwise kernels on >= 16 MiB tensors: DMA-bound, so the roofline is HBM bytes read + written."""

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import random as rnd

from . import Case
from . import nbytes as _bytes
from . import spec as _spec

MiB = 1 << 20




def _binary(name, kernel, a, b, out_dtype, label):
    out = _spec(tuple(max(x, y) for x, y in zip(a.shape, b.shape)) if len(a.shape) == len(b.shape) else a.shape,
                out_dtype)
    return Case(f"elementwise.{name}", kernel, (a, b), label, str(out_dtype), "dma", _bytes(a, b, out))


def _unary(name, kernel, a, label, **kwargs):
    return Case(f"elementwise.{name}", kernel, (a,), label, str(a.dtype), "dma", _bytes(a, a), kwargs)


f32 = _spec((4096, 1024), "float32")  # 16 MiB
bf16 = _spec((4096, 2048), "bfloat16")  # 16 MiB
x_bf16 = _spec((8, 1024, 2048), "bfloat16")  # 32 MiB activations
bias_bf16 = _spec((2048,), "bfloat16")
x_f32 = _spec((4096, 4096), "float32")  # 64 MiB
col_f32 = _spec((4096, 1), "float32")

CASES = [
    _binary("add", ew.add, f32, f32, "float32", "4096x1024+4096x1024"),
    _binary("add", ew.add, bf16, bf16, "bfloat16", "4096x2048+4096x2048"),
    _unary("gelu", ew.gelu, bf16, "4096x2048"),
    _unary("gelu", ew.gelu, f32, "4096x1024"),
    Case("elementwise.add_bcast", ew.add, (x_bf16, bias_bf16), "8x1024x2048+2048", "bfloat16", "dma",
         _bytes(x_bf16, bias_bf16, x_bf16)),
    Case("elementwise.mul_bcast", ew.mul, (x_f32, col_f32), "4096x4096*4096x1", "float32", "dma",
         _bytes(x_f32, col_f32, x_f32)),
]

# dropout: the counter-based generator is engine bound (~17 instructions per element), reported for reference
_seed = _spec((2,), "int32")
CASES.append(Case("elementwise.dropout", rnd.dropout, (f32, 0.1, _seed), "4096x1024 p=0.1", "float32", "dma",
                  _bytes(f32, f32) + 4096 * 1024))
