"""Batch norm (``native_batch_norm`` and its backward, what ``F.batch_norm``/``BatchNorm*d``/``InstanceNorm*d``
reach), composed from the ``reduce`` and elementwise kernels on the ``[N, C, HxW]`` view.

Statistics are per channel over (N, HxW) in fp32 (16-bit inputs are widened first, so the mean used to
normalize is not the rounded one); training updates ``running_mean``/``running_var`` in place with the
unbiased variance, as torch does. The output is ``x * scale + shift`` with per-channel ``scale = w * invstd``
and ``shift = b - mean * scale``. The backward is ``dx = g * A + x * B + C`` with per-channel A, B, C
from the two column sums ``sum(g)`` and ``sum(g * x)`` (so only two passes over the data besides dx).
"""

from __future__ import annotations

import torch

from neuron_kernels.library import elementwise as el
from neuron_kernels.library import movement, reduce

from .common import contig
from .compose import ew, same_device, write_outs
from .launch import run
from .normalization import param_dtype
from .oncpu import on_cpu
from .registry import impl

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
        if running_mean is not None:
            _update(OP, running_mean, mean, momentum)
        if running_var is not None:
            _update(OP, running_var, ew(OP, el.mul, var, count / (count - 1)), momentum)
    else:
        mean, var = _f32(OP, running_mean), _f32(OP, running_var)
    invstd = ew(OP, el.rsqrt, ew(OP, el.add, var, float(eps)))
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


def register(lib) -> None:
    impl("_native_batch_norm_legit")(_legit)
    impl("_native_batch_norm_legit.no_stats")(_legit_no_stats)
    impl("_native_batch_norm_legit_no_training")(_legit_no_training)
    impl("native_batch_norm")(native_batch_norm)
    impl("native_batch_norm.out")(_triple_out)
    impl("native_batch_norm_backward")(native_batch_norm_backward)
