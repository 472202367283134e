"""Convolution for the neuron device: ``convolution_overrideable`` and ``convolution_backward_overrideable``,
which is how aten's ``convolution`` reaches a PrivateUse1 backend (1-d convolutions arrive as 2-d with a
height of 1).

Everything is the conv2d kernel (an implicit-im2col GEMM on TensorE) plus data movement:

- forward: conv2d (stride, padding, dilation, groups as given);
- transposed forward and the input gradient: conv2d over the input spread out by the stride (zeros between
  rows/columns, a strided copy into a zero-filled buffer) and padded by ``dilation * (k - 1) - padding``
  (plus ``output_padding`` at the end), with the weights' in/out channels swapped per group and the taps
  flipped; the transposed conv's input gradient is the plain conv2d of the output gradient;
- weight gradient: per tap (i, j), ``grad_out [O, N*OH*OW] @ x_shifted(i, j) [C, N*OH*OW]^T`` as one batched
  GEMM over the groups (contraction over every output pixel, FP32 in PSUM, one rounding), the shifted input
  being a strided copy of the padded input; the taps are assembled by one cat and one permute;
- bias gradient: a sum of the output gradient over (N, H, W).

float32 / bfloat16 / float16 2-d (and 1-d) convolutions run natively; 3-d convolutions, other dtypes and
configurations the kernel cannot hold in SBUF (a KernelError when it is traced) run on the CPU, loudly.
"""

from __future__ import annotations

import torch

from neuron_kernels.errors import KernelError
from neuron_kernels.library import conv as kconv
from neuron_kernels.library import matmul, movement
from neuron_kernels.library import reduce as red

from ..fallback import on_fallback
from .checks import same_device, zeros
from .common import contig
from .launch import run
from .linalg import FLOATS
from .registry import impl
from .shape import copy_into

aten = torch.ops.aten
_untraceable: set[tuple] = set()  # conv2d signatures the kernel rejected (SBUF capacity): CPU from then on


class _Unsupported(Exception):
    pass


def _conv2d(op: str, x, w, bias, stride, padding, dilation, groups) -> torch.Tensor:
    args = (contig(x), contig(w), None if bias is None else contig(bias))
    key = (tuple(x.shape), tuple(w.shape), x.dtype, bias is None, stride, padding, dilation, groups)
    if key in _untraceable:
        raise _Unsupported
    try:
        return run(op, kconv.conv2d, *args, stride=stride, padding=padding, dilation=dilation, groups=groups)[0]
    except KernelError:
        _untraceable.add(key)
        raise _Unsupported from None


def _spread(op: str, x, stride, front, total) -> torch.Tensor:
    """[N, C, total[0], total[1]] zeros with x[.., i, j] at (front + i * stride) (positions outside dropped)."""
    buf = zeros(op, (*x.shape[:2], *total), x.dtype, x.device)
    src, dst = x, buf
    for d, (s, f, t) in enumerate(zip(stride, front, total)):
        n = x.shape[2 + d]
        first = 0 if f >= 0 else (-f + s - 1) // s  # first i with f + i*s >= 0
        last = min(n, (t - 1 - f) // s + 1) if t - 1 - f >= 0 else 0  # one past the last i with f + i*s < t
        if last <= first:
            return buf
        src = src.narrow(2 + d, first, last - first)
        dst = dst.narrow(2 + d, f + first * s, (last - first - 1) * s + 1)
    idx = (slice(None), slice(None), slice(None, None, stride[0]), slice(None, None, stride[1]))
    copy_into(op, dst[idx], src)
    return buf


def _swap_flip(w: torch.Tensor, groups: int) -> torch.Tensor:
    """[A, B/g, kh, kw] weights -> [B, A/g, kh, kw] with each group's channels swapped and the taps flipped."""
    a, bg, kh, kw = w.shape
    swapped = w.reshape(groups, a // groups, bg, kh, kw).transpose(1, 2).flip((3, 4))
    return swapped.reshape(groups * bg, a // groups, kh, kw)


def _transposed(op, x, w, bias, stride, padding, output_padding, dilation, groups) -> torch.Tensor:
    """conv_transpose2d(x, w [Cin, Cout/g, kh, kw]) as conv2d over x spread by the stride."""
    k = w.shape[2:]
    front = [dd * (kk - 1) - p for dd, kk, p in zip(dilation, k, padding)]
    if all(s == 1 for s in stride) and all(f >= 0 for f in front) and not any(output_padding):
        return _conv2d(op, x, _swap_flip(w, groups), bias, (1, 1), tuple(front), dilation, groups)
    total = [(n - 1) * s + 1 + 2 * f + op_ for n, s, f, op_ in zip(x.shape[2:], stride, front, output_padding)]
    buf = _spread(op, x, stride, front, total)
    return _conv2d(op, buf, _swap_flip(w, groups), bias, (1, 1), (0, 0), dilation, groups)


def _weight_grad(op, inp, gout, stride, padding, dilation, groups, k) -> torch.Tensor:
    """grad[o, c, i, j] = sum_{n,y,x} gout[n, o, y, x] * inp_padded[n, g(o)*Cg + c, y*s + i*d, x*s + j*d]."""
    n, c, h, w = inp.shape
    o, oh, ow = gout.shape[1:]
    cg, og = c // groups, o // groups
    gmat = run(op, movement.permute, contig(gout), (1, 0, 2, 3))[0].view(groups, og, n * oh * ow)
    if any(padding):
        padded = zeros(op, (n, c, h + 2 * padding[0], w + 2 * padding[1]), inp.dtype, inp.device)
        copy_into(op, padded[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w], inp)
    else:
        padded = inp
    taps = []
    for i in range(k[0]):
        for j in range(k[1]):
            y0, x0 = i * dilation[0], j * dilation[1]
            view = padded[:, :, y0:y0 + (oh - 1) * stride[0] + 1:stride[0], x0:x0 + (ow - 1) * stride[1] + 1:stride[1]]
            shifted = torch.empty((c, n, oh, ow), dtype=inp.dtype, device=inp.device)
            copy_into(op, shifted, view.transpose(0, 1))
            prod = run(op, matmul.bmm, gmat, shifted.view(groups, cg, n * oh * ow), transpose_b=True)[0]
            taps.append(prod.view(1, o, cg))
    stacked = taps[0] if len(taps) == 1 else run(op, movement.cat.kernel(len(taps)), *taps, dim=0)[0]
    return run(op, movement.permute, stacked, (1, 2, 0))[0].view(o, cg, *k)


def _on_cpu(name: str, op, *args):
    """The loud CPU path (counted as ``name``): the overrideable ops have no CPU kernel, so aten's generic
    convolution / convolution_backward run on CPU copies and the results come back."""
    on_fallback(name)
    device = args[0].device
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    result = op(*cpu)
    if isinstance(result, torch.Tensor):
        return result.to(device)
    return tuple(None if r is None else r.to(device) for r in result)


def _native(x, w, bias, transposed) -> bool:
    same_device(x, w, bias)
    return x.dim() == 4 and x.dtype in FLOATS and w.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)


@impl("convolution_overrideable")
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    args = (x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    if not _native(x, w, bias, transposed) or x.numel() == 0 or w.numel() == 0:
        return _on_cpu("convolution_overrideable", aten.convolution.default, *args)
    stride, padding, dilation, output_padding = (tuple(int(v) for v in p) for p in
                                                 (stride, padding, dilation, output_padding))
    try:
        if transposed:
            return _transposed("convolution", x, w, bias, stride, padding, output_padding, dilation, groups)
        return _conv2d("convolution", x, w, bias, stride, padding, dilation, groups)
    except _Unsupported:
        return _on_cpu("convolution_overrideable", aten.convolution.default, *args)


def _backward(go, x, w, stride, padding, dilation, transposed, output_padding, groups, mask):
    op = "convolution_backward"
    k = tuple(w.shape[2:])
    gi = gw = gb = None
    if transposed:
        if mask[0]:
            gi = _conv2d(op, go, w, None, stride, padding, dilation, groups)[:, :, :x.shape[2], :x.shape[3]]
            gi = contig(gi)
        if mask[1]:
            gw = _weight_grad(op, go, x, stride, padding, dilation, groups, k)
    else:
        if mask[0]:
            full_out = [(n - 1) * s - 2 * p + d * (kk - 1) + 1
                        for n, s, p, d, kk in zip(go.shape[2:], stride, padding, dilation, k)]
            extra = tuple(h - f for h, f in zip(x.shape[2:], full_out))
            gi = _transposed(op, go, w, None, stride, padding, extra, dilation, groups)
        if mask[1]:
            gw = _weight_grad(op, x, go, stride, padding, dilation, groups, k)
    if mask[2]:
        gb = run(op, red.sum, contig(go), dim=(0, 2, 3))[0]
    return gi, gw, gb


@impl("convolution_backward_overrideable")
def convolution_backward(go, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask):
    bias_sizes = [w.shape[1] * groups if transposed else w.shape[0]]
    args = (go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)
    if not _native(x, w, None, transposed) or go.dtype != x.dtype or min(go.numel(), x.numel(), w.numel()) == 0:
        return _on_cpu("convolution_backward_overrideable", aten.convolution_backward.default, *args)
    same_device(go, x)
    stride, padding, dilation, output_padding = (tuple(int(v) for v in p) for p in
                                                 (stride, padding, dilation, output_padding))
    try:
        return _backward(go, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask)
    except _Unsupported:
        return _on_cpu("convolution_backward_overrideable", aten.convolution_backward.default, *args)
