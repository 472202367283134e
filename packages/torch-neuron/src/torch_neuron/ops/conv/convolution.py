"""Convolution for the neuron device: ``convolution_overrideable`` and ``convolution_backward_overrideable``,
which is how aten's ``convolution`` reaches a PrivateUse1 backend (1-d convolutions arrive as 2-d with a
height of 1).

Everything is the conv2d kernel (an implicit-im2col GEMM on TensorE) plus data movement:

- forward: conv2d (stride, padding, dilation, groups as given);
- transposed forward and the input gradient: with the weights' in/out channels swapped per group and the
  taps flipped, stride 1 is a conv2d padded by ``dilation * (k - 1) - padding``; stride s is split into its
  s_h * s_w output phases (polyphase): the outputs ``r + s * q`` of one phase take only the taps whose offset
  ``r + padding - i * dilation`` is a multiple of s, which is a stride-1 conv2d of the input with those taps
  (dilation ``dilation / gcd(s, dilation)``); one permute interleaves the phases into the output. No product of a weight
  with an inserted zero is formed (a zero-spread input made inf/NaN weights poison every output, and did
  s_h * s_w times the multiplies). The conv2d kernel forms no product with these convolutions' padding either
  (``padding_products=False``), as the CPU's col2im forms none: an inf weight leaves the borders it does not
  reach finite (a forward conv's padded borders take the products, NaN on both). The transposed conv's input
  gradient is the plain conv2d of the output gradient;
- weight gradient: per tap (i, j), ``grad_out [O, N*OH*OW] @ x_shifted(i, j) [C, N*OH*OW]^T`` as one batched
  GEMM over the groups (contraction over every output pixel, FP32 in PSUM, one rounding), the shifted input
  being a strided copy of the padded input; the taps are assembled by one cat and one permute;
- bias gradient: a sum of the output gradient over (N, H, W).

float32 / bfloat16 / float16 2-d (and 1-d) convolutions run natively; 3-d convolutions, other dtypes and
configurations the kernel cannot hold in SBUF (a KernelError when it is traced) run on the CPU, loudly.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.errors import KernelError
from neuron_kernels.library import conv as kconv
from neuron_kernels.library import matmul, movement
from neuron_kernels.library import reduce as red

from ...fallback import on_fallback
from ..core.checks import same_device, zeros
from ..core.dtypes import FLOATS
from ..core.fallback import arguments
from ..core.launch import run
from ..core.variants import contig
from ..tensor.shape import copy_into

aten = torch.ops.aten
_untraceable: set[tuple] = set()  # conv2d signatures the kernel rejected (SBUF capacity): CPU from then on


class _Unsupported(Exception):
    pass


def _conv2d(op: str, x, w, bias, stride, padding, dilation, groups, padding_products=True) -> torch.Tensor:
    args = (contig(x), contig(w), None if bias is None else contig(bias))
    key = (tuple(x.shape), tuple(w.shape), x.dtype, bias is None, stride, padding, dilation, groups, padding_products)
    if key in _untraceable:
        raise _Unsupported
    try:
        return run(op, kconv.conv2d, *args, stride=stride, padding=padding, dilation=dilation, groups=groups,
                   padding_products=padding_products)[0]
    except KernelError:
        _untraceable.add(key)
        raise _Unsupported from None


def _swap_flip(w: torch.Tensor, groups: int) -> torch.Tensor:
    """[A, B/g, kh, kw] weights -> [B, A/g, kh, kw] with each group's channels swapped and the taps flipped."""
    a, bg, kh, kw = w.shape
    swapped = w.reshape(groups, a // groups, bg, kh, kw).transpose(1, 2).flip((3, 4))
    return swapped.reshape(groups * bg, a // groups, kh, kw)


def _transposed(op, x, w, bias, stride, padding, output_padding, dilation, groups) -> torch.Tensor:
    """conv_transpose2d(x, w [Cin, Cout/g, kh, kw]): stride 1 as one conv2d, else one per output phase."""
    k = w.shape[2:]
    wf = _swap_flip(w, groups)
    front = [dd * (kk - 1) - p for dd, kk, p in zip(dilation, k, padding)]
    if all(s == 1 for s in stride) and all(f >= 0 for f in front) and not any(output_padding):
        return _conv2d(op, x, wf, bias, (1, 1), tuple(front), dilation, groups, padding_products=False)
    size = [(n - 1) * s - 2 * p + d * (kk - 1) + op_ + 1
            for n, s, p, d, kk, op_ in zip(x.shape[2:], stride, padding, dilation, k, output_padding)]
    n, c = x.shape[0], wf.shape[0]
    most = [-(-L // s) for L, s in zip(size, stride)]  # outputs of phase 0, the longest
    # phase (ry, rx) goes to ph[ry, rx]; one permute interleaves them all (element-strided writes into the
    # output's phase views would move 4-byte runs: 10x the device time); slots past a shorter phase's end
    # land beyond the output and are cut
    ph = torch.empty((*stride, n, c, *most), dtype=x.dtype, device=x.device)
    for ry in range(min(stride[0], size[0])):
        for rx in range(min(stride[1], size[1])):
            phases = [_Phase(r, n_, L, s, p, d, kk) for r, n_, L, s, p, d, kk in
                      zip((ry, rx), x.shape[2:], size, stride, padding, dilation, k)]
            copy_into(op, ph[ry, rx, :, :, :phases[0].count, :phases[1].count],
                      _phase_conv(op, x, wf, bias, phases, groups, (n, c, phases[0].count, phases[1].count)))
    full = run(op, movement.permute, ph, (2, 3, 4, 0, 5, 1))[0].view(n, c, most[0] * stride[0], most[1] * stride[1])
    if list(full.shape[2:]) == size:
        return full
    out = torch.empty((n, c, *size), dtype=x.dtype, device=x.device)
    copy_into(op, out, full[:, :, :size[0], :size[1]])
    return out


class _Phase:
    """One axis of one output phase r of a transposed conv (input length n, output length L, stride s): the
    outputs r + s*q, q < count, take x[q + e_i] * wf[k-1-i] over the taps i whose e_i = (r + p - i*d) / s is an
    integer; in flipped-tap order those are wf[first::step], read at input offsets e0 + t * dil."""

    def __init__(self, r, n, L, s, p, d, k):
        g = math.gcd(s, d)
        self.count = -(-(L - r) // s)
        taps = [i for i in range(k) if (r + p - i * d) % s == 0]
        self.taps = len(taps)
        if taps:
            self.first, self.step, self.dil = k - 1 - taps[-1], s // g, d // g
            e0 = (r + p - taps[-1] * d) // s
            # a symmetric conv2d padding P puts x[q + e0] at output q + e0 + P; P covers the front (e0 < 0) and
            # enough outputs past the back
            self.pad = max(0, -e0, e0 + self.count + self.dil * (self.taps - 1) - n)
            self.start = e0 + self.pad


def _phase_conv(op, x, wf, bias, phases, groups, shape) -> torch.Tensor:
    """One output phase: a stride-1 conv2d of x with the phase's taps, cut to the phase's outputs; a phase no
    tap reaches is the bias alone."""
    ph, pw = phases
    if not ph.taps or not pw.taps:
        if bias is None:
            return zeros(op, shape, x.dtype, x.device)
        return bias.view(1, -1, 1, 1).expand(shape)
    sub = wf[:, :, ph.first::ph.step, pw.first::pw.step][:, :, :ph.taps, :pw.taps]
    y = _conv2d(op, x, sub, bias, (1, 1), (ph.pad, pw.pad), (ph.dil, pw.dil), groups, padding_products=False)
    return y[:, :, ph.start:ph.start + ph.count, pw.start:pw.start + pw.count]


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
    on_fallback(name, arguments(args, {}))
    device = args[0].device
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    result = op(*cpu)
    if isinstance(result, torch.Tensor):
        return result.to(device)
    return tuple(None if r is None else r.to(device) for r in result)


def _native(x, w, bias, transposed) -> bool:
    same_device(x, w, bias)
    return x.dim() == 4 and x.dtype in FLOATS and w.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)


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
