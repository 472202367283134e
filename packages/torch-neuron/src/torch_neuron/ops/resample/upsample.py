"""The forwards of ``interpolate``'s linear, bilinear, trilinear and bicubic modes (aten's ``upsample_*``) on the
device, as aten's CPU kernel computes them: along each spatial dim (the last first) every output is
``w_0 * in[i_0] + w_1 * in[i_1] (+ ..)`` over aten's taps (:func:`.upsample_backward._taps`), in float32 and in
aten's order, rounded once: per dim a gather per tap and one program per pair of taps (two for bicubic).

torch's decomposition, which ran here before, takes the same-size map as i and i + 1 with weights 1 and 0 (aten
copies: i and i) and interpolates as ``a + (b - a) * w``: an inf or NaN input then made NaN of its neighbours'
outputs (0 * inf) and of its own where aten gives inf (inf - inf). Nearest modes are gathers without weights and
keep their decomposition.
"""

from __future__ import annotations

import functools

import torch

from neuron_hal import DType
from neuron_kernels.library import movement
from neuron_kernels.library.formula import formula, inputs

from ..core.checks import constant, meta_result, same_device
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.registry import note_native
from ..core.variants import contig
from .upsample_backward import _taps

aten = torch.ops.aten
F32 = DType.float32


@functools.lru_cache(maxsize=256)
def _gathers(mode: str, in_size: int, out_size: int, align_corners: bool, scale: float | None):
    """(source [out] int32, weight [out] float32) of each tap of one spatial dim."""
    return [(i.to(torch.int32), w.to(torch.float32)) for i, w in _taps(mode, in_size, out_size, align_corners, scale)]


_A, _WA, _B, _WB = inputs(4)
_FIRST = (_A * _WA + _B * _WB).node  # w0 * a + w1 * b, aten's order
_NEXT = (_A + _WA * _B).node  # then t += x_k * w_k (inputs t, x_k, w_k)


def _interpolate_dim(op: str, x: torch.Tensor, dim: int, key: tuple) -> torch.Tensor:
    """float32 x interpolated along ``dim``: each tap's sources gathered, then summed in aten's order."""
    bcast = [1] * x.dim()
    bcast[dim] = -1
    x = contig(x)
    parts = []
    for k, (src, weight) in enumerate(_gathers(*key)):
        src, weight = (constant(("upsample_tap", k, i, key), x.device, lambda t=t: t)
                       for i, t in enumerate((src, weight)))
        parts.append((run(op, movement.index_select, x, dim, src)[0], weight.view(bcast)))
    (a, wa), (b, wb) = parts[:2]
    out = run(op, formula, a, wa, b, wb, expr=_FIRST, out_dtype=F32)[0]
    for b, wb in parts[2:]:
        out = run(op, formula, out, b, wb, expr=_NEXT, out_dtype=F32)[0]
    return out


def _forward(op, name: str, mode: str, spatial: int):
    """The neuron kernel of one ``upsample_*`` op (``mode``: linear or cubic)."""

    def kernel(x, output_size, align_corners, *scales):
        args = (x, output_size, align_corners, *scales)
        meta = meta_result(op, *args)
        same_device(x)
        if x.dtype not in FLOATS:
            return on_cpu(op, *args)
        if meta.numel() == 0:
            return torch.empty(meta.shape, dtype=x.dtype, device=x.device)
        scales = list(scales) + [None] * spatial
        ins, outs = list(x.shape[2:]), list(output_size)
        y = x.float()  # (aten's bicubic forward has no same-size copy: its zero-weight taps are multiplied)
        for d in reversed(range(spatial)):  # the last dim first, as aten's separable loops
            y = _interpolate_dim(name, y, 2 + d, (mode, ins[d], outs[d], bool(align_corners), scales[d]))
        note_native(name)
        return y.to(x.dtype).contiguous()

    return kernel


OPS = {"upsample_linear1d": ("linear", 1), "upsample_bilinear2d": ("linear", 2),
       "upsample_trilinear3d": ("linear", 3), "upsample_bicubic2d": ("cubic", 2)}
