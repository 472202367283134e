"""grid_sampler_3d (``grid_sample`` of 5-d inputs, trilinear and nearest) on the device, composed of neuron ops, and
grid_sampler_2d: bilinear and nearest as the same sampler on a volume of depth 1, bicubic by its 4 x 4 taps.

As aten's CPU kernel: each grid coordinate is unnormalized (``align_corners``), then clipped (border) or
reflected and clipped (reflection); trilinear reads the 8 corners around it, each weighted by the product
of its x, y and z distances, and adds those inside the volume (outside: zeros); nearest reads the corner
at the coordinates rounded half to even, zero outside. Coordinates and weights are computed in float32;
the corners are read with one ``index_select`` of the channels-last input ([N * D * H * W, C] rows) for
all corners at once: row offsets are computed in float32 (exact integers below 2**23) and made int32
exactly by their bits (``_int32``).
"""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table

from neuron_kernels.library import movement

from ..core import decomp
from ..core.checks import meta_result, same_device
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig

aten = torch.ops.aten
_EXACT = 1 << 23  # row offsets (N * D * H * W) below this are exact float32 integers for ``_int32``
_TWO23 = float(1 << 23)
_TWO23_BITS = 0x4B000000  # the float32 bits of 2**23
# trilinear corners in aten's order (tnw, tne, tsw, tse, bnw, bne, bsw, bse) as (dz, dy, dx)
_CORNERS = [(z, y, x) for z in (0, 1) for y in (0, 1) for x in (0, 1)]


def _reflect(c: torch.Tensor, twice_low: int, twice_high: int) -> torch.Tensor:
    if twice_low == twice_high:
        return torch.zeros_like(c)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = (c - low).abs()
    extra = torch.fmod(c, span)
    odd = torch.remainder(torch.floor(c / span), 2) == 1
    return torch.where(odd, span - extra + low, extra + low)


def _source(coord: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """aten's grid_sampler_compute_source_index: the grid coordinate in input pixels."""
    c = (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2
    return _padded(c, size, padding_mode, align_corners)


def _padded(c: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """aten's compute_coordinates: a pixel coordinate reflected and/or clipped by the padding mode."""
    if padding_mode == 2:  # reflection, then clipped as border
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
    if padding_mode in (1, 2):  # aten's clip is min(size - 1, max(c, 0)), which takes NaN to size - 1
        c = torch.where(c != c, size - 1, c.clamp(0, size - 1))
    return c


def _int32(f: torch.Tensor) -> torch.Tensor:
    """int32 of a float32 tensor of integers in [0, 2**23): f + 2**23 is exact and holds f in its low
    mantissa bits. (A plain float -> int cast of more than two tiles fails on trn2 today: movement's
    ``_trunc_to_int`` puts a ``mod`` on ScalarE, which only NC-v4 runs.)"""
    return (f + _TWO23).view(torch.int32) - _TWO23_BITS


def _inside(i: torch.Tensor, size: int) -> torch.Tensor:
    return (i >= 0) & (i <= size - 1)


def _read(op: str, x_rows: torch.Tensor, corners, sizes, n: int, p: int):
    """Each corner's [N, P, C] values and [N, P, 1] inside-the-volume mask; ``corners``: (z, y, x) float
    [N, P] each. Outside corners read element 0 (their value is masked out by the caller)."""
    d, h, w = sizes
    base = (torch.arange(n, device=x_rows.device, dtype=torch.float32) * (d * h * w)).view(n, 1)
    offsets, masks = [], []
    for z, y, x in corners:
        ok = _inside(z, d) & _inside(y, h) & _inside(x, w)
        flat = torch.where(ok, (z * h + y) * w + x, 0.0) + base
        offsets.append(flat.reshape(-1))
        masks.append(ok[..., None])
    idx = _int32(torch.cat(offsets))
    vals = run(op, movement.index_select, x_rows, 0, idx)[0].view(len(corners), n, p, -1)
    return list(zip(vals.unbind(0), masks))


def _sample(op: str, x: torch.Tensor, grid: torch.Tensor, mode: int, padding_mode: int, align_corners: bool):
    n, c, d, h, w = x.shape
    p = grid.shape[1] * grid.shape[2] * grid.shape[3]
    g = contig(grid).float().view(n, p, 3)
    ix = _source(g[..., 0], w, padding_mode, align_corners)
    iy = _source(g[..., 1], h, padding_mode, align_corners)
    iz = _source(g[..., 2], d, padding_mode, align_corners)
    x_rows = contig(x.float().permute(0, 2, 3, 4, 1)).reshape(n * d * h * w, c)
    if mode == 1:  # nearest: round half to even, as nearbyint
        ((val, ok),) = _read(op, x_rows, [(iz.round(), iy.round(), ix.round())], (d, h, w), n, p)
        return torch.where(ok, val, 0.0)
    x0, y0, z0 = ix.floor(), iy.floor(), iz.floor()
    wx, wy, wz = (x0 + 1 - ix, ix - x0), (y0 + 1 - iy, iy - y0), (z0 + 1 - iz, iz - z0)
    corners = [(z0 + dz, y0 + dy, x0 + dx) for dz, dy, dx in _CORNERS]
    out = None
    for (dz, dy, dx), (val, ok) in zip(_CORNERS, _read(op, x_rows, corners, (d, h, w), n, p)):
        # only corners inside add (aten skips the others: their weights may be NaN, their reads inf)
        term = torch.where(ok, val * (wx[dx] * wy[dy] * wz[dz])[..., None], 0.0)
        out = term if out is None else out + term
    return out


def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    args = (x, grid, interpolation_mode, padding_mode, align_corners)
    result = meta_result(aten.grid_sampler_3d.default, *args)  # torch's checks (shapes, bicubic in 3-d)
    same_device(x, grid)
    if x.dtype not in FLOATS or grid.dtype != x.dtype or interpolation_mode not in (0, 1) or \
            x.numel() // max(1, x.shape[1]) >= _EXACT:
        return on_cpu(aten.grid_sampler_3d.default, *args)
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x.dtype, device=x.device)
    out = _sample("grid_sampler_3d", x, grid, interpolation_mode, padding_mode, align_corners)  # [N, P, C]
    return out.permute(0, 2, 1).to(x.dtype).reshape(result.shape)


def _cubic(t: torch.Tensor) -> list[torch.Tensor]:
    """aten's get_cubic_upsample_coefficients (A = -0.75) of the fractions t."""
    a = -0.75

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far((1 - t) + 1)]  # aten's x2 + 1.0, x2 = 1 - t


def _bicubic(x: torch.Tensor, grid: torch.Tensor, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """[N, P, C] bicubic samples of x [N, C, H, W] as aten's CPU kernel: 4 x 4 taps around the unnormalized point,
    each tap's coordinates padded on their own; a tap outside the image adds nothing (selected, not weighted
    by 0: it reads a clamped pixel)."""
    n, c, h, w = x.shape
    p = grid.shape[1] * grid.shape[2]
    g = contig(grid).float().view(n, p, 2)
    ix = (g[..., 0] + 1) / 2 * (w - 1) if align_corners else ((g[..., 0] + 1) * w - 1) / 2
    iy = (g[..., 1] + 1) / 2 * (h - 1) if align_corners else ((g[..., 1] + 1) * h - 1) / 2
    x0, y0 = ix.floor(), iy.floor()
    cx, cy = _cubic(ix - x0), _cubic(iy - y0)
    taps = [(torch.zeros_like(x0), _padded(y0 + i - 1, h, padding_mode, align_corners),
             _padded(x0 + j - 1, w, padding_mode, align_corners)) for i in range(4) for j in range(4)]
    x_rows = contig(x.float().permute(0, 2, 3, 1)).reshape(n * h * w, c)
    vals = [torch.where(ok, val, 0.0) for val, ok in _read("grid_sampler_2d", x_rows, taps, (1, h, w), n, p)]
    return _interp1d([_interp1d(vals[4 * i:4 * i + 4], cx) for i in range(4)], cy)


def _interp1d(vals, coeffs) -> torch.Tensor:
    """aten's cubic_interp1d: v0 * c0 + v1 * c1 + v2 * c2 + v3 * c3, in that order."""
    out = vals[0] * coeffs[0][..., None]
    for v, cf in zip(vals[1:], coeffs[1:]):
        out = out + v * cf[..., None]
    return out


_DECOMPOSED_2D = decomp._kernel(aten.grid_sampler_2d.default, decomposition_table[aten.grid_sampler_2d.default])


def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    """Bilinear and nearest as grid_sampler_3d on a volume of depth 1 (z = 0 reads its one plane with weight 1;
    the corner past it is outside, skipped), bicubic by its 16 taps (``_bicubic``): corners and taps outside the
    image are skipped as aten does. torch's decomposition (which ran here before) reads a clamped element for
    them and multiplies it by a zero weight: an inf or NaN there made 0 * inf = NaN of every sample near the
    border. Other dtypes keep the decomposition."""
    args = (x, grid, interpolation_mode, padding_mode, align_corners)
    result = meta_result(aten.grid_sampler_2d.default, *args)
    same_device(x, grid)
    if x.dtype not in FLOATS or grid.dtype != x.dtype or x.numel() // max(1, x.shape[1]) >= _EXACT:
        return _DECOMPOSED_2D(*args)
    if result.numel() == 0:
        return torch.empty(result.shape, dtype=x.dtype, device=x.device)
    if interpolation_mode == 2:
        out = _bicubic(x, grid, padding_mode, align_corners)
    else:
        plane = torch.cat([grid, torch.zeros_like(grid[..., :1])], -1).unsqueeze(1)  # z = 0: the only plane
        out = _sample("grid_sampler_2d", x.unsqueeze(2), plane, interpolation_mode, padding_mode, align_corners)
    return out.permute(0, 2, 1).to(x.dtype).reshape(result.shape)
