"""Batch norm (``native_batch_norm`` and its backward, what ``F.batch_norm``/``BatchNorm*d``/``InstanceNorm*d``
reach), composed from the ``reduce`` and elementwise kernels on the ``[N, C, HxW]`` view.

Statistics are per channel over (N, HxW) in fp32 (16-bit inputs are widened first). With 16-bit parameters,
torch's CPU kernel normalizes with the saved mean and invstd rounded to the parameter dtype (for bfloat16 it
also stores the sum of squared deviations and the variance in it, and updates the running statistics in
bfloat16 arithmetic); so does this: an output near zero is ``x - mean``, where the unrounded mean differs
by more than the bf16 tolerance allows. Training updates ``running_mean``/``running_var`` in place with
the unbiased variance, as torch does. The output is ``x * scale + shift`` with per-channel ``scale = w * invstd``
and ``shift = b - mean * scale``. The backward is ``dx = g * A + x * B + C`` with per-channel A, B, C
from the two column sums ``sum(g)`` and ``sum(g * x)`` (so only two passes over the data besides dx).
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise as el
from neuron_kernels.library import movement, reduce

from ..core.checks import same_device
from ..core.compose import ew, write_outs
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig
from .norms import param_dtype

aten = torch.ops.aten
OP, BWD = "native_batch_norm", "native_batch_norm_backward"
F32 = torch.float32


def _f32(op: str, t: torch.Tensor) -> torch.Tensor:
    t = contig(t)
    return t if t.dtype == F32 else run(op, movement.copy, t, F32)[0]


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[N, C, HxW] view of a contiguous copy."""
    return contig(x).view(x.shape[0], x.shape[1], -1)


def _native(x, *tensors) -> bool:
    return (param_dtype(x, *tensors) is not None and x.dim() >= 2 and x.numel() > 0
            and x.numel() // x.shape[1] > 1)


def _col(t: torch.Tensor) -> torch.Tensor:
    return t.view(1, -1, 1)


def _update(op: str, running: torch.Tensor, stat: torch.Tensor, momentum: float) -> None:
    new = ew(op, el.add, ew(op, el.mul, _f32(op, running), 1.0 - momentum), stat, alpha=momentum)
    running.copy_(new)


def _b(value: float, dtype) -> float:
    """A Python number rounded to ``dtype`` (torch's CPU kernel turns momentum and counts into it)."""
    return float(torch.tensor(value, dtype=dtype))


def _stats16(mean, var, count, dtype, running_mean, running_var, momentum):
    """fp32 mean and biased variance -> the (mean, variance) torch's CPU kernel normalizes with when the
    statistics are 16-bit (``dtype``), updating the running statistics with its rounding points: the
    mean and the sum of squared deviations are stored in ``dtype``, and every step of ``dtype``
    arithmetic (counts and momentum rounded to ``dtype`` too) rounds again."""
    mean16 = run(OP, movement.copy, mean, dtype)[0]
    var_sum16 = run(OP, movement.copy, ew(OP, el.mul, var, float(count)), dtype)[0]
    m, keep = _b(momentum, dtype), _b(1.0 - _b(momentum, dtype), dtype)
    if running_mean is not None:  # m * mean + (1 - m) * running, each product and the sum rounded
        old = ew(OP, el.mul, contig(running_mean), keep)
        running_mean.copy_(ew(OP, el.add, ew(OP, el.mul, mean16, m), old))
    if running_var is not None:  # m * fp32(unbiased) + (1 - m) * running: an fp32 sum, rounded once
        unbiased = _f32(OP, ew(OP, el.div, var_sum16, _b(count - 1, dtype)))
        old = _f32(OP, ew(OP, el.mul, contig(running_var), keep))
        running_var.copy_(ew(OP, el.add, ew(OP, el.mul, unbiased, m), old))
    return _f32(OP, mean16), _f32(OP, ew(OP, el.div, var_sum16, _b(count, dtype)))


def _rounded(t: torch.Tensor, dtype) -> torch.Tensor:
    """fp32 ``t`` rounded to ``dtype`` (and widened back)."""
    return run(OP, movement.copy, run(OP, movement.copy, t, dtype)[0], F32)[0]


def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    same_device(input, weight, bias, running_mean, running_var)
    if not _native(input, weight, bias, running_mean, running_var) or (not training and running_mean is None):
        return on_cpu(aten.native_batch_norm.default, input, weight, bias, running_mean, running_var, training,
                      momentum, eps)
    sdt = param_dtype(input, weight, bias, running_mean, running_var)
    x = _f32(OP, _rows(input))
    count = x.shape[0] * x.shape[2]
    if training:
        var = run(OP, reduce.var, x, (0, 2), 0.0, False)[0]
        mean = run(OP, reduce.mean, x, (0, 2), False)[0]
        if sdt == torch.bfloat16:
            mean, var = _stats16(mean, var, count, sdt, running_mean, running_var, momentum)
        else:  # fp32 statistics (float16 too: torch's CPU kernel keeps them in fp32 and rounds only the saved ones)
            if running_mean is not None:
                _update(OP, running_mean, mean, momentum)
            if running_var is not None:
                _update(OP, running_var, ew(OP, el.mul, var, count / (count - 1)), momentum)
    else:
        mean, var = _f32(OP, running_mean), _f32(OP, running_var)
    invstd = ew(OP, el.rsqrt, ew(OP, el.add, var, float(eps)))
    if training and sdt != F32:  # normalize with the saved (rounded) mean and invstd, as torch's CPU kernel
        mean, invstd = _rounded(mean, sdt), _rounded(invstd, sdt)
    scale = invstd if weight is None else ew(OP, el.mul, invstd, contig(weight))
    shift = ew(OP, el.mul, mean, scale)
    shift = ew(OP, el.neg, shift) if bias is None else ew(OP, el.sub, contig(bias), shift)
    out = ew(OP, el.add, ew(OP, el.mul, x, _col(scale)), _col(shift))
    out = (out if out.dtype == input.dtype else run(OP, movement.copy, out, input.dtype)[0]).view(input.shape)
    if not training:
        empty = torch.empty(0, dtype=sdt, device=input.device)
        return out, empty, empty.clone()
    return out, run(OP, movement.copy, mean, sdt)[0], run(OP, movement.copy, invstd, sdt)[0]


def _cast(t: torch.Tensor, dtype) -> torch.Tensor:
    return t if t.dtype == dtype else run(BWD, movement.copy, t, dtype)[0]


def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,  # noqa: A002
                               train, eps, output_mask):
    same_device(input, grad_out, weight, running_mean, running_var, save_mean, save_invstd)
    mask = [bool(output_mask[0]), bool(output_mask[1]) and weight is not None, bool(output_mask[2])]
    stats = (save_mean, save_invstd) if train else (running_mean, running_var)
    if (not _native(input, weight) or grad_out.shape != input.shape or grad_out.dtype != input.dtype
            or any(s is None or s.numel() != input.shape[1] for s in stats) or not any(mask)):
        return on_cpu(aten.native_batch_norm_backward.default, grad_out, input, weight, running_mean, running_var,
                      save_mean, save_invstd, train, eps, output_mask)
    x, g = _f32(BWD, _rows(input)), _f32(BWD, _rows(grad_out))
    count = x.shape[0] * x.shape[2]
    mean = _f32(BWD, stats[0])
    invstd = _f32(BWD, stats[1]) if train else ew(BWD, el.rsqrt, ew(BWD, el.add, _f32(BWD, stats[1]), float(eps)))
    sum_g = run(BWD, reduce.sum, g, (0, 2), False)[0]
    k = None
    if mask[1] or (mask[0] and train):  # k = sum(g * xhat) = invstd * (sum(g * x) - mean * sum(g))
        sum_gx = run(BWD, reduce.sum, ew(BWD, el.mul, g, x), (0, 2), False)[0]
        k = ew(BWD, el.mul, ew(BWD, el.sub, sum_gx, ew(BWD, el.mul, mean, sum_g)), invstd)
    pdt = weight.dtype if weight is not None else grad_out.dtype
    dx = _dx(g, x, weight, mean, invstd, sum_g, k, count, train, input) if mask[0] else None
    dw = _cast(k, pdt) if mask[1] else None
    db = _cast(sum_g, pdt) if mask[2] else None
    return dx, dw, db


def _dx(g, x, weight, mean, invstd, sum_g, k, count, train, input):  # noqa: A002
    """g * A + x * B + C with A = w * invstd, B = -A * invstd * k / M, C = -A * sum(g) / M - B * mean."""
    a = invstd if weight is None else ew(BWD, el.mul, invstd, contig(weight))
    dx = ew(BWD, el.mul, g, _col(a))
    if train:
        b = ew(BWD, el.mul, ew(BWD, el.mul, a, invstd), ew(BWD, el.mul, k, -1.0 / count))
        c = ew(BWD, el.sub, ew(BWD, el.mul, ew(BWD, el.mul, a, sum_g), -1.0 / count), ew(BWD, el.mul, b, mean))
        dx = ew(BWD, el.add, ew(BWD, el.add, dx, ew(BWD, el.mul, x, _col(b))), _col(c))
    return _cast(dx, input.dtype).view(input.shape)


def _triple_out(*args, out0, out1, out2):
    return write_outs((out0, out1, out2), native_batch_norm(*args))


def _legit(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _legit_no_stats(input, weight, bias, training, momentum, eps):  # noqa: A002
    return native_batch_norm(input, weight, bias, None, None, training, momentum, eps)


def _legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):  # noqa: A002
    return native_batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)


def _with_update(input, weight, bias, running_mean, running_var, momentum, eps):  # noqa: A002
    """What BatchNorm modules call in training: native_batch_norm plus an empty reserve (CPU's too)."""
    out = native_batch_norm(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return (*out, torch.empty(0, dtype=torch.uint8, device=input.device))


def _backward_with_reserve(grad_out, input, weight, running_mean, running_var, save_mean, save_var,  # noqa: A002
                           update, eps, output_mask, reserve):
    """_batch_norm_with_update's backward: the reserve is empty, the rest is native_batch_norm_backward."""
    return native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                                      update, eps, output_mask)
