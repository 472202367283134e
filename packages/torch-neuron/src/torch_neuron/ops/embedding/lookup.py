"""``embedding`` and ``embedding_dense_backward`` on the ``embedding`` kernels (DMA row gather, and the
scatter-add of gradient rows into a zeroed fp32 table).

The DMA indexes with 32-bit words, so int64 indices are converted on the device first, exactly
(:func:`.compose.index32`: a value outside [0, 2**31) becomes -1, never a wrapped valid row), and the
device's bounds check turns any out-of-range index into torch's ``IndexError``.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import embedding as emb

from ..core.checks import same_device
from ..core.compose import index32
from ..core.dtypes import FLOATS, device_dtype
from ..core.fallback import on_cpu
from ..core.launch import run_indexed
from ..core.variants import contig

aten = torch.ops.aten
INDEX_DTYPES = (torch.int32, torch.int64)


def _checked(op: str, kernel, *args):
    return run_indexed(op, kernel, *args, message="index out of range in self")[0]


def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    same_device(weight, indices)
    if weight.dim() != 2 or indices.dtype not in INDEX_DTYPES or device_dtype(weight.dtype) is None:
        return on_cpu(aten.embedding.default, weight, indices, padding_idx, scale_grad_by_freq, sparse)
    if indices.numel() == 0 or weight.shape[1] == 0:
        return torch.empty((*indices.shape, weight.shape[1]), dtype=weight.dtype, device=weight.device)
    return _checked("embedding", emb.embedding, contig(weight), index32(indices, "embedding"))


def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    same_device(grad_output, indices)
    d = grad_output.shape[-1] if grad_output.dim() else 0
    if (grad_output.dtype not in FLOATS or indices.dtype not in INDEX_DTYPES
            or tuple(grad_output.shape) != (*indices.shape, d)):
        return on_cpu(aten.embedding_dense_backward.default, grad_output, indices, num_weights, padding_idx,
                      scale_grad_by_freq)
    if num_weights == 0 or d == 0:
        return torch.empty((num_weights, d), dtype=grad_output.dtype, device=grad_output.device)
    pad = None if padding_idx < 0 else int(padding_idx)
    return _checked("embedding_dense_backward", emb.embedding_backward, contig(grad_output),
                    index32(indices, "embedding_dense_backward"), int(num_weights), pad, bool(scale_grad_by_freq))
