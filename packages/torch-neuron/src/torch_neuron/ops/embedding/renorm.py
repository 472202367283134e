"""``embedding_renorm_`` (``embedding(max_norm=...)``): every table row an index names is scaled in place to
norm at most ``max_norm``, as the CPU kernel does (``row *= max_norm / (norm + 1e-7)`` where
``norm > max_norm``).

Composed of device ops: the named rows are gathered (index_select, which bounds-checks like torch), their
``norm_type`` norms taken in the table's dtype (linalg_vector_norm, as the CPU's ``row.norm``), one formula
scales them (the scale rounded to the table dtype, as the CPU's ``row *= scale`` does; the product
in FP32, rounded once) and index_copy_ writes them back. A row named twice is gathered twice and
gets the same new value both times, so repeated indices are harmless.
"""

from __future__ import annotations

import torch

from neuron_kernels.library.formula import formula, inputs, where

from ..core.checks import same_device
from ..core.dtypes import FLOATS, TORCH_TO_DTYPE
from ..core.fallback import on_cpu
from ..core.launch import run
from ..pointwise.expr import rounded

aten = torch.ops.aten


def _scaled(rows: torch.Tensor, norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    r, n = inputs(2)
    scale = rounded(max_norm / (n + 1e-7), rows.dtype)  # the CPU's in-place mul takes the scale in the row dtype
    expr = r * where(n.gt(max_norm), scale, 1.0)
    return run("embedding_renorm_", formula, rows, norms, expr=expr.node, out_dtype=TORCH_TO_DTYPE[rows.dtype])[0]


def embedding_renorm_(weight, indices, max_norm, norm_type):
    same_device(weight, indices)
    if weight.dim() != 2 or weight.dtype not in FLOATS or indices.dtype not in (torch.int32, torch.int64):
        return on_cpu(aten.embedding_renorm_.default, weight, indices, max_norm, norm_type)
    if indices.numel() == 0 or weight.shape[1] == 0:
        return weight
    idx = indices.reshape(-1)
    rows = weight.index_select(0, idx)
    norms = torch.linalg.vector_norm(rows, float(norm_type), dim=1, keepdim=True)
    weight.index_copy_(0, idx, _scaled(rows, norms, float(max_norm)))
    return weight
