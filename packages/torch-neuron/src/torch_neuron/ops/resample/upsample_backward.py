"""The backward of ``interpolate`` (aten's ``upsample_*_backward``: nearest, nearest-exact, linear, bilinear,
trilinear, bicubic) on the device. The forwards decompose into gathers that run natively; their backwards have
no decomposition in torch and would take the CPU path in every UNet/VAE/FPN training step.

Every one of these interpolations is separable: along each spatial dim each output index reads 1 (nearest), 2
(linear) or 4 (cubic) taps of the input, (source index, weight) pairs from aten's own formulas (UpSample.h: the
float32 scale, nearest's floor, linear's clamped lambdas, bicubic's A = -0.75 convolution with indices clamped at
the borders, so border taps add up as aten's bounded increments do). The gradient is the adjoint applied dim by
dim: each input index sums w * grad_out over exactly the (output, tap) pairs that read it, as aten's backward
adds them, by gathering the outputs (index_select), weighing them, selecting the valid ones and summing. Not a
matmul by the dense (out_size x in_size) map: that adds 0 * grad_out of every unrelated output, so one inf
gradient would make NaN of its whole line. A nearest map that repeats each input k times (the usual
``scale_factor=2``) is a block sum. Reduced-precision gradients are accumulated in float32 and rounded once,
as aten does.
"""

from __future__ import annotations

import functools
import math

import torch

from neuron_hal import DType
from neuron_kernels.library import movement, reduce
from neuron_kernels.library.formula import formula, inputs, where

from ..core.checks import constant
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.registry import note_native
from ..core.variants import contig, write_out

aten = torch.ops.aten
CUBIC_A = -0.75
F32 = DType.float32
_X, _VALID, _W = inputs(3)


def _scale(in_size: int, out_size: int, scale: float | None) -> float:
    """aten's compute_scales_value, as a float32: 1 / scale when given (> 0), else in / out."""
    value = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    return float(torch.tensor(value, dtype=torch.float32))


def _area_scale(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> float:
    if align_corners:
        return float(torch.tensor((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0, dtype=torch.float32))
    return _scale(in_size, out_size, scale)


def _nearest_index(in_size: int, out_size: int, scale: float | None, exact: bool) -> torch.Tensor:
    dst = torch.arange(out_size, dtype=torch.float64)
    if not exact and out_size == in_size:
        return dst.long()
    if not exact and out_size == 2 * in_size:
        return dst.long() // 2
    s = _scale(in_size, out_size, scale)
    if exact:  # (dst + 0.5) * scale in double, then floorf of its float rounding
        src = ((dst + 0.5) * s).to(torch.float32).floor()
    else:  # dst * scale in float32
        src = (dst.to(torch.float32) * torch.tensor(s, dtype=torch.float32)).floor()
    return src.long().clamp(max=in_size - 1)


def _source_index(in_size, out_size, align_corners, scale, cubic) -> torch.Tensor:
    """aten's area_pixel_compute_source_index for every output index, in float32."""
    s = torch.tensor(_area_scale(in_size, out_size, align_corners, scale), dtype=torch.float32)
    dst = torch.arange(out_size, dtype=torch.float32)
    if align_corners:
        return s * dst
    src = s * (dst + 0.5) - 0.5
    return src if cubic else src.clamp(min=0)


def _guard(src: torch.Tensor, in_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """aten's guard_index_and_lambda: the floor index (at most in_size - 1) and the fraction in [0, 1]."""
    index = src.floor().long().clamp(max=in_size - 1)
    return index, (src - index).clamp(0, 1)


def _linear_taps(in_size, out_size, align_corners, scale) -> list:
    """aten's two (source index, weight) taps of each output index: (i0, 1 - l1), (i1, l1); a same-size map is
    aten's copy case, (o, 1) and (o, 0), whose zero-weight tap aten still multiplies (0 * inf = NaN as aten)."""
    rows = torch.arange(out_size)
    if out_size == in_size:
        return [(rows, torch.ones(out_size)), (rows, torch.zeros(out_size))]
    i0, lam1 = _guard(_source_index(in_size, out_size, align_corners, scale, cubic=False), in_size)
    i1 = torch.where(i0 < in_size - 1, i0 + 1, i0)
    return [(i0, 1 - lam1), (i1, lam1)]


def _cubic_weights(t: torch.Tensor) -> list[torch.Tensor]:
    def near(x):  # |x| <= 1
        return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A

    return [far(t + 1), near(t), near(1 - t), far((1 - t) + 1)]  # aten's x2 + 1.0, x2 = 1 - t


def _cubic_taps(in_size, out_size, align_corners, scale) -> list:
    """The four taps i0 - 1 .. i0 + 2 of each output index, clamped into the input (border taps add up as aten's
    bounded increments do)."""
    i0, t = _guard(_source_index(in_size, out_size, align_corners, scale, cubic=True), in_size)
    return [((i0 - 1 + k).clamp(0, in_size - 1), w) for k, w in enumerate(_cubic_weights(t))]


def _taps(mode: str, in_size: int, out_size: int, align_corners: bool, scale: float | None) -> list:
    """(source index [out], weight [out] or None) per tap of one spatial dim: out[o] = sum_k w_k[o] * in[idx_k[o]]."""
    if mode in ("nearest", "nearest-exact"):
        return [(_nearest_index(in_size, out_size, scale, mode == "nearest-exact"), None)]
    return (_cubic_taps if mode == "cubic" else _linear_taps)(in_size, out_size, align_corners, scale)


@functools.lru_cache(maxsize=256)
def _slots(mode: str, in_size: int, out_size: int, align_corners: bool, scale: float | None):
    """The adjoint of one spatial dim as gathers, on the host (cached: a model repeats its shapes).

    Every tap's index is non-decreasing in o, so the outputs a tap sends to input i are a run lo_k(i) ..
    lo_k(i) + n_k(i) - 1. Slot r of tap k reads output lo_k(i) + r for every i: (source [S * in] int32,
    weight [S * in] float32 or None, valid [S * in] bool) over the S slots of all taps. grad_in[i] is the sum
    over slots of the valid w * grad_out: each input meets only the outputs that read it (a matmul by the
    dense map would add 0 * grad_out of all the others, and 0 * inf = NaN)."""
    src, wts, valid = [], [], []
    for idx, w in _taps(mode, in_size, out_size, align_corners, scale):
        count = torch.bincount(idx, minlength=in_size)
        lo = torch.cumsum(count, 0) - count
        for r in range(int(count.max())):
            at = (lo + r).clamp(max=out_size - 1)
            src.append(at.to(torch.int32))
            valid.append(r < count)
            wts.append(None if w is None else w.to(torch.float32)[at])
    weight = None if wts[0] is None else torch.cat(wts)
    return torch.cat(src), weight, torch.cat(valid)


_WEIGHED = where(_VALID, _X * _W, 0.0).node  # select, not a product: an unused slot may read an inf
_SELECTED = where(_VALID, _X, 0.0).node


def _adjoint_dim(op: str, x: torch.Tensor, dim: int, key: tuple) -> torch.Tensor:
    """grad_in along ``dim`` of float32 x from the gathers of ``_slots(*key)``: gather, weigh and select (one
    program), sum the slots."""
    dev = x.device
    src, weight, valid = (None if t is None else constant(("upsample_slots", i, key), dev, lambda t=t: t)
                          for i, t in enumerate(_slots(*key)))
    bcast = [1] * x.dim()
    bcast[dim] = -1
    part = run(op, movement.index_select, contig(x), dim, src)[0]
    if weight is None:
        part = run(op, formula, part, valid.view(bcast), expr=_SELECTED, out_dtype=F32)[0]
    else:
        part = run(op, formula, part, valid.view(bcast), weight.view(bcast), expr=_WEIGHED, out_dtype=F32)[0]
    shape = list(part.shape)
    shape[dim:dim + 1] = [-1, key[1]]
    return run(op, reduce.sum, part.view(shape), (dim,), False)[0]


def _repeats(mode: str, in_size: int, out_size: int, scale: float | None) -> int | None:
    """k when the nearest map sends output index o to input o // k (each input repeated k times), else None."""
    if mode not in ("nearest", "nearest-exact") or out_size % in_size:
        return None
    k = out_size // in_size
    index = _nearest_index(in_size, out_size, scale, mode == "nearest-exact")
    return k if torch.equal(index, torch.arange(out_size) // k) else None


def _adjoint(op: str, grad: torch.Tensor, mode: str, in_sizes, align_corners: bool, scales) -> torch.Tensor:
    out_sizes = grad.shape[2:]
    repeats = [_repeats(mode, i, o, s) for i, o, s in zip(in_sizes, out_sizes, scales)]
    if all(k is not None for k in repeats):  # block sums over each input's k1 x k2 x .. copies
        split = [d for i, k in zip(in_sizes, repeats) for d in (i, k)]
        return grad.reshape(*grad.shape[:2], *split).sum(tuple(range(3, 2 + len(split), 2)))
    if mode == "cubic" and list(out_sizes) == list(in_sizes):  # aten's bicubic copies a same-size grid
        return grad.clone()
    x = grad
    for d, (i, o, s) in enumerate(zip(in_sizes, out_sizes, scales)):
        x = _adjoint_dim(op, x, 2 + d, (mode, i, o, align_corners, s))
    return x


def _check_sizes(grad: torch.Tensor, output_size, input_size, spatial: int) -> None:
    if len(output_size) != spatial or len(input_size) != spatial + 2:
        raise RuntimeError(f"It is expected output_size has {spatial} elements and input_size {spatial + 2}, but "
                           f"got {len(output_size)} and {len(input_size)}")
    expected = [input_size[0], input_size[1], *output_size]
    if grad.dim() != spatial + 2 or list(grad.shape) != expected:
        raise RuntimeError(f"Expected grad_output to have the shape of the output {expected}, but got "
                           f"{list(grad.shape)}")


def _backward(op, name: str, mode: str, spatial: int, align: bool):
    """The neuron kernel of one ``upsample_*_backward`` op (``align``: its schema has align_corners)."""

    def kernel(grad_output, output_size, input_size, *rest):
        align_corners = bool(rest[0]) if align else False
        scales = list(rest[1:] if align else rest) + [None] * spatial
        _check_sizes(grad_output, output_size, input_size, spatial)
        if grad_output.dtype == torch.float64 or math.prod(input_size) == 0 or grad_output.numel() == 0:
            return on_cpu(op, grad_output, output_size, input_size, *rest)
        grad = grad_output.float() if grad_output.dtype != torch.float32 else grad_output
        result = _adjoint(name, grad, mode, list(input_size[2:]), align_corners, scales[:spatial])
        note_native(name)  # its parts ran (and were counted) on the device
        return result.to(grad_output.dtype).contiguous()

    return kernel


def _grad_input_variant(kernel):
    def run_out(*args, grad_input):
        return write_out(grad_input, kernel(*args))

    return run_out


OPS = {  # aten op: (mode, spatial dims, has align_corners)
    "upsample_nearest1d_backward": ("nearest", 1, False),
    "upsample_nearest2d_backward": ("nearest", 2, False),
    "upsample_nearest3d_backward": ("nearest", 3, False),
    "_upsample_nearest_exact1d_backward": ("nearest-exact", 1, False),
    "_upsample_nearest_exact2d_backward": ("nearest-exact", 2, False),
    "_upsample_nearest_exact3d_backward": ("nearest-exact", 3, False),
    "upsample_linear1d_backward": ("linear", 1, True),
    "upsample_bilinear2d_backward": ("linear", 2, True),
    "upsample_trilinear3d_backward": ("linear", 3, True),
    "upsample_bicubic2d_backward": ("cubic", 2, True),
}
