"""max_pool2d/3d_with_indices (and max_pool1d through them) on the device, and max_pool2d's backward.

Without a kernel of ours PyTorch's decomposition ran: index arithmetic (floor_divide, remainder, mul, add
over the whole unfolded input), ~90% of a small CNN's device time, charged to those pieces. Here every
output's taps come from one gather table (``pool.windows.MaxWindows``: kernel_size, stride, padding,
dilation, ceil_mode) and ``pooling.window_max`` pools them: aten's int64 flat indices into each input
plane, the first maximum on ties, NaN winning (a later NaN replacing an earlier one) as the CPU's loops.
The backward adds each output gradient at its index (``pooling.max_backward``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neuron_kernels.library import elementwise, movement, reduce

from ..core.checks import constant, in_layout, meta_result, same_device
from ..core.compose import ew, write_outs
from ..core.copy import to_host
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import write_out
from .avg import max_backward, ntuple, rows, window_max
from .windows import TABLE_LIMIT, max_windows

aten = torch.ops.aten
_MAX = {2: (aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default),
        3: (aten.max_pool3d_with_indices.default, aten.max_pool3d_with_indices_backward.default)}


def max_pool(nd: int, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    op = _MAX[nd][0]
    args = (x, kernel_size, stride, padding, dilation, ceil_mode)
    values, indices = meta_result(op, *args)  # torch's errors for bad sizes and parameters
    if x.dtype not in FLOATS:
        return on_cpu(op, *args)
    if values.numel() == 0:
        return (torch.empty(values.shape, dtype=x.dtype, device=x.device),
                torch.empty(values.shape, dtype=torch.int64, device=x.device))
    k = ntuple(kernel_size, nd)
    win = max_windows(tuple(x.shape[-nd:]), tuple(values.shape[-nd:]), k, ntuple(stride, nd, k),
                      ntuple(padding, nd), ntuple(dilation, nd))
    if not win.fits:
        return on_cpu(op, *args)
    v, i = window_max(f"max_pool{nd}d_with_indices", rows(x, nd), win)
    indices = in_layout(i.view(values.shape), indices)
    indices._neuron_max_windows = (win.key, indices._version)  # in-window by construction: see _in_window
    return in_layout(v.view(values.shape), values), indices


def _in_window(indices, win) -> bool:
    """Whether ``indices`` are this forward's own for these windows and unchanged since (its version): then
    every index is inside its window and the backward needs no check (a device-to-host read per call)."""
    return getattr(indices, "_neuron_max_windows", None) == (win.key, indices._version)


def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool(2, x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool(3, x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d_with_indices_out(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, out,
                                indices):
    same_device(x, out, indices)
    return write_outs((out, indices), max_pool(2, x, kernel_size, stride, padding, dilation, ceil_mode))


def max_pool3d_with_indices_out(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, out,
                                indices):
    same_device(x, out, indices)
    return write_outs((out, indices), max_pool(3, x, kernel_size, stride, padding, dilation, ceil_mode))


def _gathered_backward(op: str, grad, x, win, indices) -> torch.Tensor | None:
    """float32 [L, S] input gradients: each input position sums the gradients of the outputs whose taps hold it
    and whose index is it (gathers and a compare, no scatter), in ascending output order as aten adds them.
    None when some index is outside its window (indices not from this forward, counted on the host): the
    scatter backward then."""
    table, c = win.readers(x.device)
    g, idx = rows(grad, 2).float(), rows(indices, 2).float()  # indices < S < 2**24: exact
    gg = run(op, movement.index_select, F.pad(g, (0, 1)), 1, table)[0].view(g.shape[0], win.S, c)
    ig = run(op, movement.index_select, F.pad(idx, (0, 1), value=-1.0), 1, table)[0].view(gg.shape)
    # [S, C], not [S, 1]: the compare against a broadcast [S, 1] operand is slower (simulated)
    here = constant(("pool_positions", win.S, c), x.device,
                    lambda: torch.arange(win.S, dtype=torch.float32)[:, None].expand(win.S, c).contiguous())
    hit = ew(op, elementwise.eq, ig, here)
    if not _in_window(indices, win) and \
            to_host(run(op, reduce.sum, hit.reshape(-1).to(torch.int32), ())[0]).item() != g.numel():
        return None
    return run(op, reduce.sum, ew(op, elementwise.where, hit, gg, 0.0), 2)[0]


def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    args = (grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices)
    op = _MAX[2][1]
    result = meta_result(op, *args)
    same_device(grad, x, indices)
    if x.dtype in FLOATS and grad.dtype == x.dtype and x.numel() and grad.numel() and indices.shape == grad.shape:
        k = ntuple(kernel_size, 2)
        win = max_windows(tuple(x.shape[-2:]), tuple(grad.shape[-2:]), k, ntuple(stride, 2, k),
                          ntuple(padding, 2), ntuple(dilation, 2))
        if win.fits and win.S * win.readers(x.device)[1] < TABLE_LIMIT:
            gi = _gathered_backward("max_pool2d_with_indices_backward", grad, x, win, indices)
            if gi is not None:
                return in_layout(gi.to(x.dtype).view(result.shape), result)
    return max_backward(op, "max_pool2d_with_indices_backward", 2, args)


def max_pool2d_with_indices_backward_out(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, *,
                                         grad_input):
    same_device(x, grad_input)
    return write_out(grad_input, max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                                                  ceil_mode, indices))
