"""Adaptive pooling on the device: _adaptive_avg_pool2d/3d, adaptive_max_pool2d/3d and their backward
(the 1-d ops are aten compositions of the 2-d ones; ``interpolate(mode="area")`` is adaptive_avg_pool).

Output o of a dim of n inputs pools [floor(o * n / m), ceil((o + 1) * n / m)) (``pool.windows``).
Averages divide each window's sum by its size (aten divides by each dim's length in turn: rounding
differences only). Maxima return aten's int64 flat indices into each input plane, picked as its CPU
loops pick them (first maximum; NaN wins, a later NaN replacing an earlier one); the max backward is
``pooling.max_backward``.
"""

from __future__ import annotations

import torch

from ..core.checks import meta_result, same_device
from ..core.compose import write_outs
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.variants import write_out
from .avg import max_backward, rows, spread_back, window_max, window_means
from .windows import adaptive_windows

aten = torch.ops.aten
_AVG = {2: (aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default),
        3: (aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d_backward.default)}
_MAX = {2: (aten.adaptive_max_pool2d.default, aten.adaptive_max_pool2d_backward.default),
        3: (aten.adaptive_max_pool3d.default, aten.adaptive_max_pool3d_backward.default)}


def adaptive_avg(nd: int, x, output_size):
    op = _AVG[nd][0]
    result = meta_result(op, x, output_size)  # torch's errors for bad sizes
    if x.dtype not in FLOATS:
        return on_cpu(op, x, output_size)
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x.dtype, device=x.device)
    win = adaptive_windows(tuple(x.shape[-nd:]), tuple(result.shape[-nd:]))
    if not win.fits:
        return on_cpu(op, x, output_size)
    y = window_means(f"_adaptive_avg_pool{nd}d", rows(x, nd), win, win.divisors(x.device))
    return y.to(x.dtype).view(result.shape)


def adaptive_avg_backward(nd: int, grad, x):
    op = _AVG[nd][1]
    result = meta_result(op, grad, x)
    same_device(grad, x)
    if x.dtype not in FLOATS or grad.dtype != x.dtype:
        return on_cpu(op, grad, x)
    if x.numel() == 0 or grad.numel() == 0:
        return torch.zeros(result.shape, dtype=x.dtype, device=x.device)
    win = adaptive_windows(tuple(x.shape[-nd:]), tuple(grad.shape[-nd:]))
    if not win.fits:
        return on_cpu(op, grad, x)
    gi = spread_back(f"_adaptive_avg_pool{nd}d_backward", rows(grad, nd), win, win.divisors(x.device))
    return gi.to(x.dtype).view(result.shape)


def adaptive_max(nd: int, x, output_size):
    op = _MAX[nd][0]
    values, indices = meta_result(op, x, output_size)
    if x.dtype not in FLOATS:
        return on_cpu(op, x, output_size)
    if values.numel() == 0:
        return (torch.empty(values.shape, dtype=x.dtype, device=x.device),
                torch.empty(values.shape, dtype=torch.int64, device=x.device))
    win = adaptive_windows(tuple(x.shape[-nd:]), tuple(values.shape[-nd:]))
    if not win.fits:
        return on_cpu(op, x, output_size)
    v, i = window_max(f"adaptive_max_pool{nd}d", rows(x, nd), win)
    return v.view(values.shape), i.view(values.shape)


def adaptive_max_backward(nd: int, grad, x, indices):
    return max_backward(_MAX[nd][1], f"adaptive_max_pool{nd}d_backward", nd, (grad, x, indices))


def adaptive_avg_pool2d(x, output_size):
    return adaptive_avg(2, x, output_size)


def adaptive_avg_pool3d(x, output_size):
    return adaptive_avg(3, x, output_size)


def adaptive_avg_pool2d_out(x, output_size, *, out):
    same_device(x, out)
    return write_out(out, adaptive_avg(2, x, output_size))


def adaptive_avg_pool3d_out(x, output_size, *, out):
    same_device(x, out)
    return write_out(out, adaptive_avg(3, x, output_size))


def adaptive_avg_pool2d_backward(grad, x):
    return adaptive_avg_backward(2, grad, x)


def adaptive_avg_pool3d_backward(grad, x):
    return adaptive_avg_backward(3, grad, x)


def adaptive_avg_pool2d_backward_out(grad, x, *, out):
    same_device(x, out)
    return write_out(out, adaptive_avg_backward(2, grad, x))


def adaptive_avg_pool3d_backward_out(grad, x, *, out):
    same_device(x, out)
    return write_out(out, adaptive_avg_backward(3, grad, x))


def adaptive_max_pool2d(x, output_size):
    return adaptive_max(2, x, output_size)


def adaptive_max_pool3d(x, output_size):
    return adaptive_max(3, x, output_size)


def adaptive_max_pool2d_out(x, output_size, *, out, indices):
    same_device(x, out)
    same_device(x, indices)
    return write_outs((out, indices), adaptive_max(2, x, output_size))


def adaptive_max_pool3d_out(x, output_size, *, out, indices):
    same_device(x, out)
    same_device(x, indices)
    return write_outs((out, indices), adaptive_max(3, x, output_size))


def adaptive_max_pool2d_backward(grad, x, indices):
    return adaptive_max_backward(2, grad, x, indices)


def adaptive_max_pool3d_backward(grad, x, indices):
    return adaptive_max_backward(3, grad, x, indices)


def adaptive_max_pool2d_backward_out(grad, x, indices, *, grad_input):
    same_device(x, grad_input)
    return write_out(grad_input, adaptive_max_backward(2, grad, x, indices))


def adaptive_max_pool3d_backward_out(grad, x, indices, *, grad_input):
    same_device(x, grad_input)
    return write_out(grad_input, adaptive_max_backward(3, grad, x, indices))
