"""``nll_loss_forward``/``_backward`` and their 2-d forms (what ``cross_entropy`` reaches after
``log_softmax``), composed from gather/scatter, elementwise and reduce kernels.

nll_loss on ``self`` [N, C, *] (or [C]) and int64 ``target`` [N, *]: the target is converted to int32
exactly (:func:`.compose.int32_or`; a value outside int32 becomes a sentinel that is neither
``ignore_index`` nor a class, so the device's bounds check rejects it as torch rejects it), ignored
entries are pointed at class 0 for the gather and masked out with ``where`` (so a NaN or inf in the
class-0 column of an ignored row cannot leak into the loss), then
``loss_i = -w[t_i] * self[i, t_i]``, ``total_weight = sum_i w[t_i]`` over kept entries, reduced as
torch does ("mean": sum / total_weight, nan when every entry is ignored). The backward scatters
``-w[t_i] * grad (/ total_weight)`` into zeros at the same places.
"""

from __future__ import annotations

import torch

from neuron_hal import ProgramError
from neuron_kernels.library import elementwise, movement, reduce

from .checks import zeros
from .common import contig, write_out
from .compose import FLOATS, INT32_MIN, const, ew, int32_or, same_device, write_outs
from .launch import run
from .oncpu import on_cpu
from .registry import impl

aten = torch.ops.aten
NONE, MEAN, SUM = 0, 1, 2


def _nll_native(self, target, weight, ignore_index) -> bool:
    return (self.dtype in FLOATS and target.dtype == torch.int64 and self.dim() >= 1
            and (weight is None or weight.dtype == self.dtype) and -(2**31) < ignore_index < 2**31
            and target.dim() == max(self.dim() - 1, 0))


def _targets(op: str, self, target, ignore_index):
    """(class index int32 shaped like self with dim 1 of size 1, keep mask bool shaped like target)."""
    bad = INT32_MIN if ignore_index != INT32_MIN else INT32_MIN + 1
    t32 = int32_or(target, bad, op)
    keep = ew(op, elementwise.ne, t32, int(ignore_index))
    safe = ew(op, elementwise.where, keep, t32, 0)
    return safe.unsqueeze(1 if self.dim() > 1 else 0), keep


def _gather(op: str, x, dim: int, index):
    try:
        return run(op, movement.gather, x, dim, index)[0]
    except ProgramError as e:
        if "bounds" not in str(e):
            raise
        raise IndexError(f"{op}: a target is out of bounds (valid: 0..{x.shape[dim] - 1} or ignore_index)") from e


def _class_weights(op: str, weight, safe, keep, dtype):
    """w[t_i] where kept, else 0, shaped like the target."""
    if weight is None:
        return run(op, movement.copy, keep, dtype)[0]
    flat = _gather(op, contig(weight), 0, safe.reshape(-1)).view(keep.shape)
    return ew(op, elementwise.where, keep, flat, 0.0)


def nll_loss_forward(self, target, weight, reduction, ignore_index):
    same_device(self, target, weight)
    op = "nll_loss_forward" if self.dim() <= 2 else "nll_loss2d_forward"
    if not _nll_native(self, target, weight, ignore_index) or reduction not in (NONE, MEAN, SUM):
        cpu = aten.nll_loss_forward.default if self.dim() <= 2 else aten.nll_loss2d_forward.default
        return on_cpu(cpu, self, target, weight, reduction, ignore_index)
    if target.numel() == 0:
        total = const((), 0, self.dtype, self.device)
        if reduction == NONE:
            return torch.empty(target.shape, dtype=self.dtype, device=self.device), total
        return const((), float("nan") if reduction == MEAN else 0.0, self.dtype, self.device), total
    safe, keep = _targets(op, self, target, ignore_index)
    picked = _gather(op, contig(self), 1 if self.dim() > 1 else 0, safe).view(target.shape)
    w = _class_weights(op, weight, safe, keep, self.dtype)
    loss = ew(op, elementwise.where, keep, ew(op, elementwise.mul, picked, w), 0.0)
    loss = ew(op, elementwise.neg, loss)
    if reduction == NONE:
        return loss, const((), 0, self.dtype, self.device)
    total = run(op, reduce.sum, w, (), False)[0]
    summed = run(op, reduce.sum, loss, (), False)[0]
    return (summed if reduction == SUM else ew(op, elementwise.div, summed, total)), total


def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    same_device(self, grad_output, target, weight, total_weight)
    op = "nll_loss_backward" if self.dim() <= 2 else "nll_loss2d_backward"
    if (not _nll_native(self, target, weight, ignore_index) or reduction not in (NONE, MEAN, SUM)
            or grad_output.dtype != self.dtype or total_weight.dtype != self.dtype):
        cpu = aten.nll_loss_backward.default if self.dim() <= 2 else aten.nll_loss2d_backward.default
        return on_cpu(cpu, grad_output, self, target, weight, reduction, ignore_index, total_weight)
    grad = zeros(op, self.shape, self.dtype, self.device)
    if target.numel() == 0:
        return grad
    safe, keep = _targets(op, self, target, ignore_index)
    w = _class_weights(op, weight, safe, keep, self.dtype)
    g = contig(grad_output)
    if reduction == MEAN:
        g = ew(op, elementwise.div, g, contig(total_weight))
    vals = ew(op, elementwise.neg, ew(op, elementwise.where, keep, ew(op, elementwise.mul, w, g), 0.0))
    dim = 1 if self.dim() > 1 else 0
    try:
        return run(op, movement.scatter, grad, dim, safe, vals.unsqueeze(dim))[0]
    except ProgramError as e:
        if "bounds" not in str(e):
            raise
        raise IndexError(f"{op}: a target is out of bounds") from e


def _nll_forward_out(self, target, weight, reduction, ignore_index, *, output, total_weight):
    return write_outs((output, total_weight), nll_loss_forward(self, target, weight, reduction, ignore_index))


def _nll_backward_out(*args, grad_input):
    return write_out(grad_input, nll_loss_backward(*args))


def register(lib) -> None:
    for name in ("nll_loss_forward", "nll_loss2d_forward"):
        impl(name)(nll_loss_forward)
        impl(f"{name}.output")(_nll_forward_out)
    for name in ("nll_loss_backward", "nll_loss2d_backward"):
        impl(name)(nll_loss_backward)
        impl(f"{name}.grad_input")(_nll_backward_out)
