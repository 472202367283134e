"""Data movement kernels on >= 16 MiB tensors: the roofline is the DMA time of the bytes read + written.

Moves that are a single HBM-to-HBM DMA (cat, permutes keeping long runs) move each byte once through a
DMA engine, and the simulator charges that once against the core's HBM share, so they can show more
than 100% of this (read + write) roofline.
"""

from neuron_kernels import TensorSpec
from neuron_kernels.library import movement as mv

from . import Case
from . import nbytes as _bytes
from . import spec as _spec


def _case(name, kernel, args, label, out, read=None, **kwargs):
    """``read``: the input bytes that must move (default: every input)."""
    ins = [a for a in args if isinstance(a, TensorSpec)]
    work = (_bytes(*ins) if read is None else read) + _bytes(out)
    return Case(f"movement.{name}", kernel, tuple(args), label, str(ins[0].dtype), "dma", work, kwargs)


t_bf16 = _spec((4096, 4096), "bfloat16")  # 32 MiB
t_f32 = _spec((4096, 2048), "float32")  # 32 MiB
small = _spec((4096, 64, 64), "bfloat16")  # 32 MiB of 64 x 64 matrices
heads = _spec((4, 2048, 32, 64), "bfloat16")  # 32 MiB: [B, S, H, D] -> [B, H, S, D]
nchw = _spec((16, 64, 128, 128), "bfloat16")  # 32 MiB: NCHW -> NHWC
piece = _spec((4096, 1024), "bfloat16")  # 8 MiB each, 32 MiB out
table = _spec((32768, 4096), "bfloat16")  # 256 MiB embedding table, 32 MiB gathered
index = _spec((4096,), "int32")

CASES = [
    _case("transpose", mv.transpose, (t_bf16,), "4096x4096", t_bf16),
    _case("transpose", mv.transpose, (t_f32,), "4096x2048", t_f32),
    _case("transpose", mv.transpose, (small,), "4096x64x64", small),
    _case("permute", mv.permute, (heads, (0, 2, 1, 3)), "4x2048x32x64->0,2,1,3", heads),
    _case("permute", mv.permute, (nchw, (0, 2, 3, 1)), "16x64x128x128->0,2,3,1", nchw),
    _case("cat", mv.cat.kernel(4), (piece,) * 4, "4x(4096x1024),dim=1", _spec((4096, 4096), "bfloat16"), dim=1),
    _case("index_select", mv.index_select, (table, 0, index), "32768x4096[4096]", _spec((4096, 4096), "bfloat16"),
          read=_bytes(index, _spec((4096, 4096), "bfloat16"))),  # the selected rows, not the whole table
]
