"""Reductions family on >= 16 MiB tensors (DMA-bound: the roofline is the HBM bytes read + written)."""

from neuron_kernels.library import loss, reduce, softmax

from . import Case
from . import nbytes as _nbytes
from . import spec as _spec

bf16_rows = _spec((2048, 4096), "bfloat16")  # 16 MiB, rows of 4096
f32_rows = _spec((1024, 4096), "float32")  # 16 MiB, rows of 4096
logits = _spec((4096, 32000), "bfloat16")  # 250 MiB
target = _spec((4096,), "int32")

CASES = [
    Case("reduce.softmax", softmax.softmax, (bf16_rows, -1), "2048x4096 dim=-1", "bfloat16", "dma",
         2 * _nbytes(bf16_rows)),
    Case("reduce.softmax", softmax.softmax, (f32_rows, -1), "1024x4096 dim=-1", "float32", "dma",
         2 * _nbytes(f32_rows)),
    Case("reduce.log_softmax", softmax.log_softmax, (bf16_rows, -1), "2048x4096 dim=-1", "bfloat16", "dma",
         2 * _nbytes(bf16_rows)),
    Case("reduce.sum", reduce.sum, (bf16_rows, -1), "2048x4096 dim=-1", "bfloat16", "dma",
         _nbytes(bf16_rows, _spec((2048,), "bfloat16"))),
    Case("reduce.sum", reduce.sum, (f32_rows, -1), "1024x4096 dim=-1", "float32", "dma",
         _nbytes(f32_rows, _spec((1024,), "float32"))),
    Case("reduce.sum", reduce.sum, (bf16_rows, 0), "2048x4096 dim=0", "bfloat16", "dma",
         _nbytes(bf16_rows, _spec((4096,), "bfloat16"))),
    Case("reduce.cross_entropy", loss.cross_entropy, (logits, target), "4096x32000 mean", "bfloat16", "dma",
         _nbytes(logits, target)),
]
