"""Pooling windows as gather tables, the machinery of the avg/adaptive pooling ops (1-3 spatial dims).

Every pooling op here reads, for each output position, a box of input positions: one interval per
spatial dim ([lo, hi), already clipped to the input). The box's flat input offsets (row-major, so the
first offset in the box is the first element aten's loops visit) form one row of a table [O, K], K the
product of each dim's longest interval; rows of shorter boxes are filled with S (the flat size), which
points at one element appended to every input row: 0 for sums, -inf for maxima. One ``index_select``
of the padded [L, S + 1] input with that table gives every window at once, [L, O, K], and one reduction
over K pools them. Backward passes use the transposed boxes: input position i is read by the outputs
whose intervals contain i, again one interval per dim (the intervals' ends never decrease).

Tables depend only on shapes and pooling parameters: built on the host (vectorized) and cached on the
device as constants.
"""

from __future__ import annotations

import math

import torch

from ..core.checks import constant

# K and O*K stay below 2**24 (the reductions' fp32 index arithmetic) and offsets below 2**31 (int32 DMA)
TABLE_LIMIT = 1 << 24


def avg_bounds(n: int, m: int, k: int, s: int, p: int):
    """aten's avg_pool windows along one dim: clipped [lo, hi) and the divisor factor with padding."""
    start = torch.arange(m, dtype=torch.int64) * s - p
    end = torch.clamp(start + k, max=n + p)
    return start.clamp(min=0), end.clamp(max=n), end - start


def adaptive_bounds(n: int, m: int):
    """aten's adaptive windows: [floor(o * n / m), ceil((o + 1) * n / m))."""
    o = torch.arange(m, dtype=torch.int64)
    return (o * n) // m, ((o + 1) * n + m - 1) // m


def transposed(lo: torch.Tensor, hi: torch.Tensor, n: int):
    """For each input position i in [0, n): the interval of outputs whose window holds i."""
    i = torch.arange(n, dtype=torch.int64)[:, None]
    cover = (lo[None, :] <= i) & (i < hi[None, :])  # [n, m]
    count = cover.sum(1)
    first = torch.where(count > 0, cover.int().argmax(1), 0)
    return first, first + count


def _reach(bounds) -> list[int]:
    return [max(1, int((hi - lo).max())) if lo.numel() else 1 for lo, hi in bounds]


def table(bounds, sizes) -> torch.Tensor:
    """int64 [O, K]: each output's box of flat offsets into the [..., sizes] input (see the module
    docstring); ``bounds`` holds one (lo, hi) pair of [m_d] tensors per dim."""
    nd = len(sizes)
    strides = [math.prod(sizes[d + 1:]) for d in range(nd)]
    reach = _reach(bounds)
    flat = torch.zeros((), dtype=torch.int64)
    valid = torch.ones((), dtype=torch.bool)
    for d, (lo, hi) in enumerate(bounds):
        r = torch.arange(reach[d], dtype=torch.int64)
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = lo.numel(), reach[d]
        flat = flat + ((lo[:, None] + r) * strides[d]).reshape(shape)
        valid = valid & (r[None, :] < (hi - lo)[:, None]).reshape(shape)
    flat = torch.where(valid, flat, math.prod(sizes))
    return flat.reshape(math.prod(lo.numel() for lo, _ in bounds), math.prod(reach))


class Windows:
    """The boxes of one pooling signature: ``sizes`` (input spatial sizes) -> ``outs``, with per-dim
    bounds and divisor factors; device tables are made on first use and cached as constants."""

    def __init__(self, key: tuple, sizes, outs, bounds, factors):
        self.key, self.sizes, self.outs, self.bounds, self.factors = key, tuple(sizes), tuple(outs), bounds, factors
        self.S, self.O = math.prod(sizes), math.prod(outs)
        self.K = math.prod(_reach(bounds))
        self.back = [transposed(lo, hi, n) for (lo, hi), n in zip(bounds, sizes)]
        self.KT = math.prod(_reach(self.back))
        # the kernels' exact index arithmetic: fp32 below 2**24, int32 offsets
        self.fits = max(self.O * self.K, self.S * self.KT, self.S + 1) < TABLE_LIMIT

    def gather(self, device) -> torch.Tensor:
        """int32 [O * K]: the forward table."""
        return constant(("pool_fwd", self.key), device,
                        lambda: table(self.bounds, self.sizes).reshape(-1).to(torch.int32))

    def float_offsets(self, device) -> torch.Tensor:
        """float32 [O, K]: the forward table's flat input indices (exact: below TABLE_LIMIT)."""
        return constant(("pool_off", self.key), device, lambda: table(self.bounds, self.sizes).float())

    def scatter(self, device) -> torch.Tensor:
        """int32 [S * KT]: for each input position, the outputs that read it (padded with O)."""
        return constant(("pool_bwd", self.key), device,
                        lambda: table(self.back, self.outs).reshape(-1).to(torch.int32))

    def divisors(self, device, override=None) -> torch.Tensor:
        """float32 [O]: the product of the per-dim factors (or aten's divisor_override)."""
        def build():
            if override:
                return torch.full((self.O,), float(override))
            out = torch.ones((), dtype=torch.int64)
            for f in self.factors:
                out = (out[..., None] * f).reshape(*out.shape, f.numel())
            return out.reshape(self.O).float()
        return constant(("pool_div", self.key, override), device, build)


_windows: dict = {}


def _cached(key, build) -> Windows:
    hit = _windows.get(key)
    if hit is None:
        if len(_windows) > 512:
            _windows.clear()
        hit = _windows[key] = build()
    return hit


def avg_windows(sizes, outs, k, s, p, count_include_pad: bool) -> Windows:
    key = ("avg", tuple(sizes), tuple(outs), tuple(k), tuple(s), tuple(p), bool(count_include_pad))

    def build():
        dims = [avg_bounds(*a) for a in zip(sizes, outs, k, s, p)]
        factors = [pool if count_include_pad else hi - lo for lo, hi, pool in dims]
        return Windows(key, sizes, outs, [(lo, hi) for lo, hi, _ in dims], factors)
    return _cached(key, build)


def adaptive_windows(sizes, outs) -> Windows:
    key = ("adaptive", tuple(sizes), tuple(outs))

    def build():
        bounds = [adaptive_bounds(n, m) for n, m in zip(sizes, outs)]
        return Windows(key, sizes, outs, bounds, [hi - lo for lo, hi in bounds])
    return _cached(key, build)


def max_taps(n: int, m: int, k: int, s: int, p: int, d: int):
    """max_pool's taps along one dim: int64 [m, k] input positions o * s - p + j * d, and which are inside."""
    taps = (torch.arange(m, dtype=torch.int64) * s - p)[:, None] + torch.arange(k, dtype=torch.int64) * d
    return taps, (taps >= 0) & (taps < n)


class MaxWindows:
    """The taps of one max_pool signature as ``window_max`` reads them: a [O, K] table of flat offsets in
    aten's visiting order (row-major over the kernel), then the taps in the padding, pointing at the
    appended -inf element S. Dilated windows are not boxes, so this is not a ``Windows``."""

    def __init__(self, key: tuple, sizes, outs, k, s, p, d):
        self.key, self.sizes, self.outs = key, tuple(sizes), tuple(outs)
        self.S, self.O, self.K = math.prod(sizes), math.prod(outs), math.prod(k)
        self.dims = [max_taps(*a) for a in zip(sizes, outs, k, s, p, d)]
        self.fits = max(self.O * self.K, self.S + 1) < TABLE_LIMIT

    def _table(self) -> torch.Tensor:
        nd = len(self.sizes)
        strides = [math.prod(self.sizes[i + 1:]) for i in range(nd)]
        flat = torch.zeros((), dtype=torch.int64)
        valid = torch.ones((), dtype=torch.bool)
        for i, (taps, inside) in enumerate(self.dims):
            shape = [1] * (2 * nd)
            shape[i], shape[nd + i] = taps.shape
            flat = flat + (taps * strides[i]).reshape(shape)
            valid = valid & inside.reshape(shape)
        valid = valid.expand(flat.shape).reshape(self.O, self.K)
        flat = torch.where(valid, flat.reshape(self.O, self.K), self.S)
        # padding taps last, the others in order: a window of -inf only picks its first real tap, as aten
        order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices
        return flat.gather(1, order).reshape(self.O * self.K)

    def gather(self, device) -> torch.Tensor:
        return constant(("maxpool_fwd", self.key), device, lambda: self._table().to(torch.int32))

    def float_offsets(self, device) -> torch.Tensor:
        return constant(("maxpool_off", self.key), device, lambda: self._table().view(self.O, self.K).float())

    def readers(self, device) -> tuple[torch.Tensor, int]:
        """(int32 [S * C], C): for each input position, the flat outputs whose taps hold it, ascending, padded
        with O (a backward's gather table), and C, the most any position has."""
        def build():
            per_dim = []
            for (taps, inside), m in zip(self.dims, self.outs):
                n = self.sizes[len(per_dim)]
                hit = (taps[None, :, :] == torch.arange(n)[:, None, None]) & inside[None]  # [n, m, k]
                holds = hit.any(2)  # [n, m]
                c = max(1, int(holds.sum(1).max()))
                o = torch.where(holds, torch.arange(m), m).sort(1).values[:, :c]
                per_dim.append((o, o < m))
            nd, strides = len(self.outs), [math.prod(self.outs[i + 1:]) for i in range(len(self.outs))]
            flat, valid = torch.zeros((), dtype=torch.int64), torch.ones((), dtype=torch.bool)
            for i, (o, ok) in enumerate(per_dim):
                shape = [1] * (2 * nd)
                shape[i], shape[nd + i] = o.shape
                flat, valid = flat + (o * strides[i]).reshape(shape), valid & ok.reshape(shape)
            return torch.where(valid, flat, self.O).reshape(self.S, -1)
        t = constant(("maxpool_bwd", self.key), device, lambda: build().reshape(-1).to(torch.int32))
        return t, t.numel() // self.S


def max_windows(sizes, outs, k, s, p, d) -> MaxWindows:
    key = ("max", tuple(sizes), tuple(outs), tuple(k), tuple(s), tuple(p), tuple(d))
    return _cached(key, lambda: MaxWindows(key, sizes, outs, k, s, p, d))
