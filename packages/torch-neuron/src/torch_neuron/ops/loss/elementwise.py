"""Elementwise losses, then reduced: ``mse_loss``, ``smooth_l1_loss``, ``huber_loss`` and
``binary_cross_entropy``, with their backwards, composed from elementwise and reduce kernels.

Each step rounds to the input dtype as torch's CPU kernels do (they compute per element in the
tensor's scalar type); "mean"/"sum" reduce in fp32 and round once. binary_cross_entropy checks that
input and target lie in [0, 1] as torch does (an ``aminmax`` and a read of two numbers per tensor), and
clamps the logs at -100 like torch.
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise as el
from neuron_kernels.library import reduce

from ..core.checks import same_device
from ..core.compose import ew
from ..core.copy import to_host
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out

aten = torch.ops.aten
NONE, MEAN, SUM = 0, 1, 2
EPSILON = 1e-12  # torch's floor of (1 - x) * x in the binary_cross_entropy backward


def _native(reduction, *tensors) -> bool:
    same_device(*tensors)
    first = tensors[0]
    return (first.dtype in FLOATS and all(t.dtype == first.dtype for t in tensors)
            and reduction in (NONE, MEAN, SUM) and first.numel() > 0)


def _reduce(op: str, loss: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == NONE:
        return loss
    return run(op, reduce.mean if reduction == MEAN else reduce.sum, loss, (), False)[0]


# -- mse --------------------------------------------------------------------------------------------
def mse_loss(self, target, reduction=MEAN):
    """(self - target)**2, then mean/sum: each step rounds in the input dtype as torch's CPU kernel does."""
    if not _native(reduction, self, target) or target.numel() == 0:
        return on_cpu(aten.mse_loss.default, self, target, reduction)
    sq = ew("mse_loss", el.square, ew("mse_loss", el.sub, contig(self), contig(target)))
    return _reduce("mse_loss", sq, reduction)


def mse_loss_backward(grad_output, self, target, reduction):
    """2 * (self - target) (/ numel for "mean") * grad_output, in torch's order of roundings."""
    op = "mse_loss_backward"
    if not _native(reduction, self, target, grad_output):
        return on_cpu(aten.mse_loss_backward.default, grad_output, self, target, reduction)
    scale = 2.0 / self.numel() if reduction == MEAN else 2.0
    diff = ew(op, el.mul, ew(op, el.sub, contig(self), contig(target)), scale)
    return ew(op, el.mul, diff, contig(grad_output))


# -- smooth l1 / huber ------------------------------------------------------------------------------
def _smooth(op: str, self, target, reduction, beta: float, huber: bool):
    """|d| < beta: 0.5 d^2 / beta (huber: 0.5 d^2); else |d| - 0.5 beta (huber: beta (|d| - 0.5 beta))."""
    z = ew(op, el.abs, ew(op, el.sub, contig(self), contig(target)))
    if beta == 0:
        return _reduce(op, z, reduction)
    quad = ew(op, el.mul, ew(op, el.mul, z, 0.5), z)
    quad = quad if huber else ew(op, el.div, quad, beta)
    lin = ew(op, el.sub, z, 0.5 * beta)
    lin = ew(op, el.mul, lin, beta) if huber else lin
    return _reduce(op, ew(op, el.where, ew(op, el.lt, z, beta), quad, lin), reduction)


def _smooth_backward(op: str, grad_output, self, target, reduction, beta: float, huber: bool):
    """torch's branches: d <= -beta: -s; d >= beta: s; else d / beta (huber: d), s = 1 (huber: beta), times
    grad (/ numel for "mean"). beta = 0 takes the division too, so a NaN d stays NaN as in torch."""
    d = ew(op, el.sub, contig(self), contig(target))
    g = contig(grad_output)
    if reduction == MEAN:
        g = ew(op, el.div, g, float(self.numel()))
    s = beta if huber else 1.0
    inner = d if huber else ew(op, el.div, d, beta)
    slope = ew(op, el.where, ew(op, el.ge, d, beta), s, inner)
    slope = ew(op, el.where, ew(op, el.le, d, -beta), -s, slope)
    return ew(op, el.mul, slope, g)


def smooth_l1_loss(self, target, reduction=MEAN, beta=1.0):
    if not _native(reduction, self, target) or beta < 0:
        return on_cpu(aten.smooth_l1_loss.default, self, target, reduction, beta)
    return _smooth("smooth_l1_loss", self, target, reduction, float(beta), False)


def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    if not _native(reduction, self, target, grad_output) or beta < 0:
        return on_cpu(aten.smooth_l1_loss_backward.default, grad_output, self, target, reduction, beta)
    return _smooth_backward("smooth_l1_loss_backward", grad_output, self, target, reduction, float(beta), False)


def huber_loss(self, target, reduction=MEAN, delta=1.0):
    if not _native(reduction, self, target) or delta <= 0:
        return on_cpu(aten.huber_loss.default, self, target, reduction, delta)
    return _smooth("huber_loss", self, target, reduction, float(delta), True)


def huber_loss_backward(grad_output, self, target, reduction, delta):
    if not _native(reduction, self, target, grad_output) or delta <= 0:
        return on_cpu(aten.huber_loss_backward.default, grad_output, self, target, reduction, delta)
    return _smooth_backward("huber_loss_backward", grad_output, self, target, reduction, float(delta), True)


# -- binary cross entropy -------------------------------------------------------------------------------
def _check_unit(op: str, t: torch.Tensor, what: str) -> None:
    low = to_host(run(op, reduce.amin, t, (), False)[0]).item()
    high = to_host(run(op, reduce.amax, t, (), False)[0]).item()
    if not (low >= 0 and high <= 1):  # NaN fails too, as in torch
        raise RuntimeError(f"all elements of {what} should be between 0 and 1")


def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    op = "binary_cross_entropy"
    if not _native(reduction, self, target) or self.shape != target.shape or (
            weight is not None and (weight.dtype != self.dtype or weight.device != self.device)):
        return on_cpu(aten.binary_cross_entropy.default, self, target, weight, reduction)
    x, t = contig(self), contig(target)
    _check_unit(op, x, "input")
    _check_unit(op, t, "target")
    log_x = ew(op, el.clamp, ew(op, el.log, x), -100.0)
    log_1mx = ew(op, el.clamp, ew(op, el.log1p, ew(op, el.neg, x)), -100.0)
    loss = ew(op, el.sub, ew(op, el.mul, ew(op, el.sub, t, 1.0), log_1mx), ew(op, el.mul, t, log_x))
    if weight is not None:
        loss = ew(op, el.mul, loss, contig(weight))
    return _reduce(op, loss, reduction)


def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    op = "binary_cross_entropy_backward"
    if not _native(reduction, self, target, grad_output) or self.shape != target.shape or (
            weight is not None and (weight.dtype != self.dtype or weight.device != self.device)):
        return on_cpu(aten.binary_cross_entropy_backward.default, grad_output, self, target, weight, reduction)
    x = contig(self)
    floor = ew(op, el.maximum, ew(op, el.mul, ew(op, el.sub, 1.0, x), x), EPSILON)
    grad = ew(op, el.div, ew(op, el.mul, contig(grad_output), ew(op, el.sub, x, contig(target))), floor)
    if weight is not None:
        grad = ew(op, el.mul, grad, contig(weight))
    return ew(op, el.div, grad, float(self.numel())) if reduction == MEAN else grad


def _grad_input_out(fn):
    def run_out(*args, grad_input):
        return write_out(grad_input, fn(*args))
    return run_out
