"""``nll_loss_forward``/``_backward`` and their 2-d forms (what ``cross_entropy`` reaches after
``log_softmax``): one device program each (:mod:`neuron_kernels.library.nll`).

``self`` [N, C, *] (or [C]) and int64 ``target`` [N, *] go to the kernels as [N, C, D] / [N, D] views
(D = 1 for the plain [N, C] case; a [C] input is one row, where torch's "none" behaves as "sum"). The
kernels read the int64 target as int32 word pairs; a target that is out of range, negative or does not fit
int32 (and is not ``ignore_index``) makes the program fail its indirect-DMA bounds check, raised here as the
IndexError torch raises. What the kernels cannot take (other dtypes, uint8 targets, mismatched shapes, which
torch rejects with its own errors) runs on the CPU.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import nll

from ..core.checks import same_device
from ..core.compose import write_outs
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run_indexed
from ..core.variants import contig, write_out

aten = torch.ops.aten
NONE, MEAN, SUM = 0, 1, 2
NAMES = ("none", "mean", "sum")


def _native(self, target, weight, reduction, ignore_index) -> bool:
    if not (self.dtype in FLOATS and target.dtype == torch.int64 and self.dim() >= 1
            and reduction in (NONE, MEAN, SUM) and -(2**31) <= ignore_index < 2**31):
        return False
    C = self.shape[1] if self.dim() > 1 else self.shape[0]
    want = (self.shape[:1] + self.shape[2:]) if self.dim() > 1 else ()
    return (target.shape == want and C >= 1 and self.numel() < 2**30
            and (weight is None or (weight.dtype == self.dtype and weight.shape == (C,))))


def _flat(self, target):
    """(logp [N, C] or [N, C, D], target [N] or [N, D]) as the kernels take them."""
    if self.dim() == 1:
        return contig(self).view(1, -1), contig(target).view(1)
    if self.dim() == 2:
        return contig(self), contig(target)
    N, C, D = self.shape[0], self.shape[1], math.prod(self.shape[2:])
    return contig(self).view(N, C, D), contig(target).view(N, D)


def _reduction(self, reduction: int) -> str:
    return "sum" if self.dim() == 1 and reduction == NONE else NAMES[reduction]


def _launch(op: str, kernel, *args, **kwargs) -> list[torch.Tensor]:
    return run_indexed(op, kernel, *args, message=f"{op}: a target is out of bounds (valid: 0..C-1 or ignore_index)",
                       **kwargs)


def nll_loss_forward(self, target, weight, reduction, ignore_index):
    same_device(self, target, weight)
    op = "nll_loss_forward" if self.dim() <= 2 else "nll_loss2d_forward"
    if not _native(self, target, weight, reduction, ignore_index):
        cpu = aten.nll_loss_forward.default if self.dim() <= 2 else aten.nll_loss2d_forward.default
        return on_cpu(cpu, self, target, weight, reduction, ignore_index)
    lp, t = _flat(self, target)
    w = None if weight is None else contig(weight)
    loss, total = _launch(op, nll.nll_loss, lp, t, w, ignore_index=int(ignore_index),
                          reduction=_reduction(self, reduction))
    return (loss.view(target.shape) if loss.dim() else loss), total


def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    same_device(self, grad_output, target, weight, total_weight)
    op = "nll_loss_backward" if self.dim() <= 2 else "nll_loss2d_backward"
    red = _reduction(self, reduction) if reduction in (NONE, MEAN, SUM) else None
    if (not _native(self, target, weight, reduction, ignore_index) or grad_output.dtype != self.dtype
            or total_weight.dtype != self.dtype or total_weight.numel() != 1
            or (grad_output.shape != target.shape if red == "none" else grad_output.numel() != 1)):
        cpu = aten.nll_loss_backward.default if self.dim() <= 2 else aten.nll_loss2d_backward.default
        return on_cpu(cpu, grad_output, self, target, weight, reduction, ignore_index, total_weight)
    lp, t = _flat(self, target)
    g = contig(grad_output).view(t.shape if red == "none" else ())
    w = None if weight is None else contig(weight)
    grad = _launch(op, nll.nll_loss_backward, g, lp, t, w, contig(total_weight).view(()),
                   ignore_index=int(ignore_index), reduction=red)[0]
    return grad.view(self.shape)


def _nll_forward_out(self, target, weight, reduction, ignore_index, *, output, total_weight):
    return write_outs((output, total_weight), nll_loss_forward(self, target, weight, reduction, ignore_index))


def _nll_backward_out(*args, grad_input):
    return write_out(grad_input, nll_loss_backward(*args))
