"""conv2d as an implicit im2col GEMM on TensorE (torch.nn.functional.conv2d semantics).

    out[n, o, y, x] = bias[o] + sum_{c, i, j} w[o, c, i, j] * xpad[n, g*Cg + c, y*sh + i*dh, x*sw + j*dw]

For each group, each of the kh*kw taps is one GEMM over the group's input channels: the
contraction (channels, up to 128 per K tile) sits on the partitions, the stationary is that tap's
weights [C, O] and the moving operand is the input band itself read through a strided access
pattern (rows ``sh * width`` apart, columns ``sw`` apart, shifted by the tap): nothing is copied or
expanded, the "im2col" matrix only exists as access patterns. All taps and channel tiles of one
output tile accumulate in one PSUM bank [O tile, rows x cols <= 512].

Layouts: x [N, C, H, W] puts a channel's image in consecutive memory, so a band of input rows is
loaded channel-per-partition with runs of whole rows (zero padding: the band tile is cleared once
and only the in-image part is loaded). The weights [O, C/groups, kh, kw] are loaded O-per-partition
(runs of C*kh*kw elements) and made [C, tap, O] by TensorE transposes, once per group. Bias is
applied per output channel (a per-partition ScalarE bias) while PSUM is copied out.
"""

from __future__ import annotations

from neuron_hal import Act, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View

P = 128


def _pair(v, name: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(int(a) for a in v)
    if len(t) != 2:
        raise KernelError(f"conv2d: {name} must be an int or a pair, got {v!r}")
    return t


def _view(v: View, offset: int, dims) -> View:
    return type(v)(v.owner, v.dtype, offset, tuple(dims))


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@kernel(tunables={"pixels": (512, 256)}, version=2)
def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, pixels=512, padding_products=True):
    """torch.nn.functional.conv2d(x, w, bias, stride, padding, dilation, groups) for x [N, C, H, W].

    ``padding_products=False``: the padding is absent rather than zeros, so no weight meets it (each tap's matmul
    covers only the outputs whose input is in the image). A transposed convolution written as a padded conv2d
    needs this: the CPU's col2im forms no product with the padding, and an inf weight times a padding zero made
    its borders NaN. A forward convolution keeps the products (the CPU's im2col forms them: NaN there too)."""
    if x.ndim != 4 or w.ndim != 4:
        raise KernelError(f"conv2d: x must be [N, C, H, W] and w [O, C/groups, kh, kw], got {list(x.shape)} "
                          f"and {list(w.shape)}")
    if x.dtype != w.dtype:
        raise KernelError(f"conv2d: x is {x.dtype} and w is {w.dtype}; they must match")
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    sh, sw = _pair(stride, "stride")
    dh, dw = _pair(dilation, "dilation")
    if padding == "valid":
        padding = 0
    if padding == "same":
        if (sh, sw) != (1, 1):
            raise KernelError("conv2d: padding='same' needs stride 1 (as in torch)")
        padding = ((dh * (kh - 1)) // 2, (dw * (kw - 1)) // 2)
        if dh * (kh - 1) % 2 or dw * (kw - 1) % 2:
            raise KernelError("conv2d: padding='same' with an even total padding is asymmetric; pad explicitly")
    ph, pw = _pair(padding, "padding")
    g_ = int(groups)
    if g_ < 1 or c_ % g_ or o_ % g_ or cg != c_ // g_:
        raise KernelError(f"conv2d: groups={g_} must divide C={c_} and O={o_}, and w must have "
                          f"C/groups={c_ // max(g_, 1)} input channels, got {cg}")
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise KernelError(f"conv2d: stride {stride}, dilation {dilation} must be >= 1 and padding {padding} >= 0")
    oh, ow = out_size(h_, kh, sh, ph, dh), out_size(w_, kw, sw, pw, dw)
    if oh < 1 or ow < 1:
        raise KernelError(f"conv2d: output would be {oh}x{ow}: the kernel {kh}x{kw} (dilation {dh},{dw}) does not fit "
                          f"the padded input {h_ + 2 * ph}x{w_ + 2 * pw}")
    if bias is not None and tuple(bias.shape) != (o_,):
        raise KernelError(f"conv2d: bias must be [{o_}], got {list(bias.shape)}")
    dt = x.dtype
    og = o_ // g_
    out = nl.ndarray((n_, o_, oh, ow), dt, buffer=nl.hbm, name="out")
    taps = kh * kw
    ctiles = [(c, min(P, cg - c)) for c in range(0, cg, P)]
    otiles = [(o, min(P, og - o)) for o in range(0, og, P)]
    pixels = min(int(pixels), nl.tile_size.gemm_moving_fmax)
    wc = min(ow, pixels)  # output columns per tile
    rr = max(1, pixels // wc)  # output rows per tile
    cap = nl.profile().psum_bank_bytes // (P * dt.itemsize)  # transposed blocks per PSUM bank
    queue = [0]

    def load(dst, src):
        nisa.dma_copy(dst, src, queue=queue[0] % 8)
        queue[0] += 1

    for g in range(g_):
        # weights of this group: [O tile rows, Cg * taps] as stored, transposed per (channel tile, tap)
        wts = {}
        for o0, op in otiles:
            raw = nl.ndarray((op, cg, taps), dt, name="wraw")
            load(raw, _view(w, (g * og + o0) * cg * taps, ((op, cg * taps), (cg, taps), (taps, 1))))
            for c0, cp in ctiles:
                wt = nl.ndarray((cp, taps, op), dt, name="wT")
                for t0 in range(0, taps, cap):
                    nt = min(cap, taps - t0)
                    ps = nl.ndarray((cp, nt * P), dt, buffer=nl.psum, name="wtp", bufs=2)
                    for t in range(nt):
                        nisa.nc_transpose(ps[:, t * P:t * P + op], raw[:, c0:c0 + cp, t0 + t])
                    nisa.tensor_copy(wt[:, t0:t0 + nt, :], ps.reshape(cp, nt, P)[:, :, 0:op])
                wts[(o0, c0)] = wt
            bcol = None
            if bias is not None:
                row = nl.ndarray((1, op), bias.dtype, name="brow")
                load(row, _view(bias, g * og + o0, ((1, 0), (op, 1))))
                ps = nl.ndarray((op, 1), bias.dtype, buffer=nl.psum, name="btp", bufs=1)
                nisa.nc_transpose(ps, row)
                bcol = nl.ndarray((op, 1), nl.float32, name="bcol")
                nisa.tensor_copy(bcol, ps)
            wts[(o0, "bias")] = bcol
        for n in range(n_):
            for y0 in range(0, oh, rr):
                r = min(rr, oh - y0)
                for x0 in range(0, ow, wc):
                    q = min(wc, ow - x0)
                    # the input band these outputs read, in padded coordinates
                    rows_in, cols_in = (r - 1) * sh + (kh - 1) * dh + 1, (q - 1) * sw + (kw - 1) * dw + 1
                    ry0, cx0 = y0 * sh - ph, x0 * sw - pw  # first input row / column (may be negative)
                    iy0, iy1 = max(0, ry0), min(h_, ry0 + rows_in)
                    ix0, ix1 = max(0, cx0), min(w_, cx0 + cols_in)
                    bands = {}
                    for c0, cp in ctiles:
                        band = nl.ndarray((cp, rows_in, cols_in), dt, name="band")
                        if padding_products and (iy0 > ry0 or ix0 > cx0 or iy1 < ry0 + rows_in or
                                                 ix1 < cx0 + cols_in):
                            nisa.memset(band, 0.0, engine=Engine.GPSIMD)  # zero padding
                        if iy1 > iy0 and ix1 > ix0:
                            ch = g * cg + c0
                            src = _view(x, ((n * c_ + ch) * h_ + iy0) * w_ + ix0,
                                        ((cp, h_ * w_), (iy1 - iy0, w_), (ix1 - ix0, 1)))
                            load(band[:, iy0 - ry0:iy1 - ry0, ix0 - cx0:ix1 - cx0], src)
                        bands[c0] = band
                    taps_in = [(i, j, *_in_image(y0, r, i * dh, sh, ph, h_, padding_products),
                                *_in_image(x0, q, j * dw, sw, pw, w_, padding_products))
                               for i in range(kh) for j in range(kw)]
                    taps_in = sorted((t for t in taps_in if t[2] < t[3] and t[4] < t[5]),
                                     key=lambda t: (t[3] - t[2]) * (t[5] - t[4]) < r * q)  # a whole tile first
                    for o0, op in otiles:
                        acc = nl.ndarray((op, r * q), nl.float32, buffer=nl.psum, name="acc", bufs=4)
                        steps = [(c0, cp, *t) for c0, cp in ctiles for t in taps_in]
                        if not steps or (steps[0][5] - steps[0][4]) * (steps[0][7] - steps[0][6]) < r * q:
                            nisa.memset(acc, 0.0)  # outputs that no tap reaches (only without padding products)
                        for s, (c0, cp, i, j, ra, rb, qa, qb) in enumerate(steps):
                            band = bands[c0]
                            base = band.offset + (ra * sh + i * dh) * cols_in + qa * sw + j * dw
                            mv = _view(band, base, ((cp, band.dims[0][1]), (rb - ra, sh * cols_in), (qb - qa, sw)))
                            dst = acc if (rb - ra) * (qb - qa) == r * q else \
                                _view(acc, acc.offset + ra * q + qa, ((op, acc.dims[0][1]), (rb - ra, q), (qb - qa, 1)))
                            nisa.nc_matmul(dst, wts[(o0, c0)][:, i * kw + j, :], mv,
                                           accumulate=s > 0 or dst is not acc)
                        stage = nl.ndarray((op, r, q), dt, name="stage")
                        bcol = wts[(o0, "bias")]
                        if bcol is not None:
                            nisa.activation(stage, Act.identity, acc, bias=bcol)
                        elif (y0 // rr + x0 // wc) % 2:
                            nisa.activation(stage, Act.identity, acc)
                        else:
                            nisa.tensor_copy(stage, acc)
                        oc = g * og + o0
                        dst = _view(out, ((n * o_ + oc) * oh + y0) * ow + x0, ((op, oh * ow), (r, ow), (q, 1)))
                        nisa.dma_copy(dst, stage, queue=8 + queue[0] % 8)
                        queue[0] += 1
    return out


def _in_image(o0: int, n: int, tap: int, s: int, p: int, size: int, all_: bool) -> tuple[int, int]:
    """The outputs [a, b) of a tile's n (from output o0) whose input o * s + tap - p lies in the image (all n with
    padding products)."""
    if all_:
        return 0, n
    a = max(0, -(-(p - tap) // s) - o0)
    b = min(n, -(-(p + size - tap) // s) - o0)
    return a, max(a, b)


def reference(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """numpy reference in float64 (cast to the input dtype), tap by tap."""
    import numpy as np

    dt = x.dtype
    xs, ws = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n_, c_, h_, w_ = xs.shape
    o_, cg, kh, kw = ws.shape
    sh, sw = _pair(stride, "stride")
    dh, dw = _pair(dilation, "dilation")
    ph, pw = _pair(padding, "padding")
    oh, ow = out_size(h_, kh, sh, ph, dh), out_size(w_, kw, sw, pw, dw)
    xp = np.pad(xs, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    og = o_ // groups
    out = np.zeros((n_, o_, oh, ow))
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        wg = ws[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if bias is not None:
        out += np.asarray(bias, np.float64)[None, :, None, None]
    return out.astype(np.float32).astype(dt)

