"""avg_pool2d/3d and their backward on the device, and the window kernels the adaptive pools share.

Windows come from gather tables (``pool.windows``): one ``index_select`` of the input (one element
appended per row: 0, or -inf for maxima) gives every output's window, one reduction pools them.

Numerics: aten's CPU kernels add each window in float (bfloat16/float16 inputs widened) and divide once,
rounding to the input dtype at the end; here the sums run on the device's reduction in float32 (another
summation order: float32-rounding differences only) and the divisors, which depend only on shapes and
the pooling parameters (padding, ``ceil_mode``, ``count_include_pad``, ``divisor_override``), are built
on the host once and uploaded. Backward: each input position adds grad / divisor of the outputs whose
window holds it (a gather of the transposed windows and a sum), as aten's loops add them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from neuron_kernels.library import elementwise, movement, reduce

from ..core.checks import constant, meta_result, same_device
from ..core.compose import ew, index32
from ..core.copy import to_host
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out
from .windows import Windows, avg_windows

aten = torch.ops.aten


def ntuple(v, nd: int, default=None) -> tuple:
    """aten's int[nd] argument: one value for every dim, or nd values; empty: ``default``."""
    if v is None or (isinstance(v, list | tuple) and len(v) == 0):
        v = default
    v = list(v) if isinstance(v, list | tuple) else [v]
    return tuple(v * nd if len(v) == 1 else v)


def rows(x: torch.Tensor, nd: int) -> torch.Tensor:
    """[L, S]: the leading dims as rows, the nd spatial dims flattened (contiguous)."""
    return contig(x).reshape(-1, math.prod(x.shape[-nd:]))


def _windows(op: str, x2: torch.Tensor, table: torch.Tensor, k: int, pad: float) -> torch.Tensor:
    """[L, O, K]: the windows of the rows ``x2`` [L, S] gathered by a flattened [O * K] table."""
    ext = F.pad(x2, (0, 1), value=pad)  # element S of every row: what short windows are padded with
    return run(op, movement.index_select, ext, 1, table)[0].view(x2.shape[0], -1, k)


def window_means(op: str, x2: torch.Tensor, win: Windows, divisor: torch.Tensor) -> torch.Tensor:
    """float32 [L, O]: each window's sum over its divisor."""
    w = _windows(op, x2.float(), win.gather(x2.device), win.K, 0.0)
    return ew(op, elementwise.div, run(op, reduce.sum, w, 2)[0], divisor)


def spread_back(op: str, g2: torch.Tensor, win: Windows, divisor: torch.Tensor) -> torch.Tensor:
    """float32 [L, S]: the backward of ``window_means`` for output gradients g2 [L, O]."""
    g = ew(op, elementwise.div, g2.float(), divisor)
    w = _windows(op, g, win.scatter(g2.device), win.KT, 0.0)
    return run(op, reduce.sum, w, 2)[0]


def _low_words(t: torch.Tensor) -> torch.Tensor:
    """int32 values of an int64 tensor known to hold small non-negative values (its low words)."""
    return contig(t.view(torch.int32).view(*t.shape, 2)[..., 0])


def window_max(op: str, x2: torch.Tensor, win: Windows) -> tuple[torch.Tensor, torch.Tensor]:
    """([L, O] maxima in x2's dtype, int64 [L, O] flat input indices) as aten's CPU loops pick them: the
    first maximum in the window, except that NaN wins and a later NaN replaces an earlier one."""
    dev = x2.device
    w = _windows(op, x2, win.gather(dev), win.K, float("-inf"))
    values, local = run(op, reduce.max, w, 2)
    local = _low_words(local)
    nan = ew(op, elementwise.ne, values, values)
    if to_host(run(op, reduce.amax, nan.reshape(-1), ())[0]).item():  # only calls that meet a NaN pay
        where = constant(("pool_pos", win.K), dev, lambda: torch.arange(win.K, dtype=torch.float32))
        score = ew(op, elementwise.where, ew(op, elementwise.ne, w, w), where, -1.0)
        last = _low_words(run(op, reduce.argmax, score, 2)[0])  # positions are distinct: the last NaN
        local = ew(op, elementwise.where, nan, last, local)
    # the winning tap's flat input index: a one-hot pick from the [O, K] table (exact in float32, see
    # TABLE_LIMIT), far cheaper than gathering one table element per output
    taps = constant(("pool_taps", win.K), dev, lambda: torch.arange(win.K, dtype=torch.int32))
    hit = ew(op, elementwise.eq, local.view(*values.shape, 1), taps)
    flat = run(op, reduce.sum, ew(op, elementwise.where, hit, win.float_offsets(dev), 0.0), 2)[0]
    return values, flat.to(torch.int64)


def max_backward(op, name: str, nd: int, args: tuple):
    """The backward of a max pooling given its int64 flat indices into each input plane: every output
    gradient added at its index (``scatter_add``, float32, rounded once), as aten's loops add them.
    ``args``: (grad, x, ..., indices) in the op's order (for the meta check and the CPU path)."""
    grad, x, indices = args[0], args[1], args[-1]
    result = meta_result(op, *args)
    same_device(grad, x)
    same_device(indices, x)
    plane = math.prod(x.shape[-nd:])
    if x.dtype not in FLOATS or grad.dtype != x.dtype or plane >= 1 << 31:  # int32 offsets for the scatter
        return on_cpu(op, *args)
    if x.numel() == 0 or grad.numel() == 0:
        return torch.zeros(result.shape, dtype=x.dtype, device=x.device)
    g = rows(grad, nd).float()
    idx = index32(rows(indices, nd), name)  # an index outside [0, 2**31) becomes -1: the kernel rejects it
    zeros = torch.zeros((g.shape[0], plane), dtype=torch.float32, device=x.device)
    gi = run(name, movement.scatter_add, zeros, 1, idx, g)[0]
    return gi.to(x.dtype).view(result.shape)


def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    args = (grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices)
    return max_backward(aten.max_pool3d_with_indices_backward.default, "max_pool3d_with_indices_backward", 3, args)


def max_pool3d_with_indices_backward_out(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, *,
                                         grad_input):
    same_device(x, grad_input)
    return write_out(grad_input, max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                                                  ceil_mode, indices))


# -- avg_pool2d / avg_pool3d -------------------------------------------------------------------------
_AVG = {2: (aten.avg_pool2d.default, aten.avg_pool2d_backward.default),
        3: (aten.avg_pool3d.default, aten.avg_pool3d_backward.default)}


def _avg_windows(nd, x, outs, kernel_size, stride, padding, count_include_pad) -> Windows:
    k = ntuple(kernel_size, nd)
    return avg_windows(tuple(x.shape[-nd:]), tuple(outs), k, ntuple(stride, nd, k), ntuple(padding, nd),
                       count_include_pad)


def avg_pool(nd: int, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    op = _AVG[nd][0]
    args = (x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    result = meta_result(op, *args)  # torch's errors for bad sizes and parameters
    if x.dtype not in FLOATS:
        return on_cpu(op, *args)
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x.dtype, device=x.device)
    win = _avg_windows(nd, x, result.shape[-nd:], kernel_size, stride, padding, count_include_pad)
    if not win.fits:
        return on_cpu(op, *args)
    name = f"avg_pool{nd}d"
    y = window_means(name, rows(x, nd), win, win.divisors(x.device, divisor_override))
    return y.to(x.dtype).view(result.shape)


def avg_pool_backward(nd: int, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override):
    op = _AVG[nd][1]
    args = (grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    result = meta_result(op, *args)
    same_device(grad, x)
    if x.dtype not in FLOATS or grad.dtype != x.dtype:
        return on_cpu(op, *args)
    if x.numel() == 0 or grad.numel() == 0:
        return torch.zeros(result.shape, dtype=x.dtype, device=x.device)
    win = _avg_windows(nd, x, grad.shape[-nd:], kernel_size, stride, padding, count_include_pad)
    if not win.fits:
        return on_cpu(op, *args)
    name = f"avg_pool{nd}d_backward"
    gi = spread_back(name, rows(grad, nd), win, win.divisors(x.device, divisor_override))
    return gi.to(x.dtype).view(result.shape)


def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return avg_pool(2, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return avg_pool(3, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool2d_out(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                   divisor_override=None, *, out):
    same_device(x, out)
    return write_out(out, avg_pool(2, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                   divisor_override))


def avg_pool3d_out(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                   divisor_override=None, *, out):
    same_device(x, out)
    return write_out(out, avg_pool(3, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                   divisor_override))


def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return avg_pool_backward(2, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                             divisor_override)


def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return avg_pool_backward(3, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                             divisor_override)


def avg_pool2d_backward_out(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override, *, grad_input):
    same_device(x, grad_input)
    return write_out(grad_input, avg_pool_backward(2, grad, x, kernel_size, stride, padding, ceil_mode,
                                                   count_include_pad, divisor_override))


def avg_pool3d_backward_out(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override, *, grad_input):
    same_device(x, grad_input)
    return write_out(grad_input, avg_pool_backward(3, grad, x, kernel_size, stride, padding, ceil_mode,
                                                   count_include_pad, divisor_override))
