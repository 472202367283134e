"""avg_pool2d on the device: the zero-padded input's windows as a strided view, one sum over each window,
one division by the window's divisor.

aten's CPU kernel adds each window in float (bfloat16/float16 inputs widened) and divides once, rounding
to the input dtype at the end; here the window sums run on the device's reduction in float32 (another
summation order: float32-rounding differences only) and the divisors, which depend only on shapes and
the pooling parameters (padding, ``ceil_mode``, ``count_include_pad``, ``divisor_override``), are built
on the host once and uploaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import constant, meta_result, same_device
from .common import run_on_cpu, write_out
from .registry import impl

aten = torch.ops.aten
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _pair(v, default=None):
    if v is None or (isinstance(v, list | tuple) and len(v) == 0):
        v = default
    v = list(v) if isinstance(v, list | tuple) else [v]
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _divisors(size, out, k, s, p, count_include_pad, divisor_override) -> torch.Tensor:
    """[OH, OW] float32: what each output position's window sum is divided by, as aten computes it."""
    def bounds(o, n, k, s, p):
        start = o * s - p
        end = min(start + k, n + p)
        return start, end, end - start, max(start, 0), min(end, n)

    rows = [bounds(o, size[0], k[0], s[0], p[0]) for o in range(out[0])]
    cols = [bounds(o, size[1], k[1], s[1], p[1]) for o in range(out[1])]
    table = torch.empty(out, dtype=torch.float32)
    for i, (_, _, hpool, h0, h1) in enumerate(rows):
        for j, (_, _, wpool, w0, w1) in enumerate(cols):
            if divisor_override:
                table[i, j] = divisor_override
            elif count_include_pad:
                table[i, j] = hpool * wpool
            else:
                table[i, j] = (h1 - h0) * (w1 - w0)
    return table


@impl("avg_pool2d")
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    args = (x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    result = meta_result(aten.avg_pool2d.default, *args)  # torch's errors for bad sizes and parameters
    if x.dtype not in FLOATS:
        return run_on_cpu(aten.avg_pool2d.default, *args)
    k, s, p = _pair(kernel_size), _pair(stride, kernel_size), _pair(padding)
    out = tuple(result.shape[-2:])
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x.dtype, device=x.device)
    h, w = x.shape[-2:]
    need = ((out[0] - 1) * s[0] + k[0], (out[1] - 1) * s[1] + k[1])  # padded extent the windows read
    right = (max(need[1] - w - p[1], 0), max(need[0] - h - p[0], 0))
    wide = x.float() if x.dtype != torch.float32 else x
    padded = F.pad(wide, (p[1], right[0], p[0], right[1]))
    windows = padded.unfold(-2, k[0], s[0]).unfold(-2, k[1], s[1])[..., : out[0], : out[1], :, :]
    sums = windows.sum(dim=(-2, -1))
    key = ("avg_pool2d", (h, w), out, k, s, p, bool(count_include_pad), divisor_override)
    div = constant(key, x.device, lambda: _divisors((h, w), out, k, s, p, count_include_pad, divisor_override))
    return (sums / div).to(x.dtype)


@impl("avg_pool2d.out")
def avg_pool2d_out(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                   divisor_override=None, *, out):
    same_device(x, out)
    return write_out(out, avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                     divisor_override))
