"""AccelOpt's NKIBench: fp32 NKI kernels from LLM workloads, timed on one trn1 NeuronCore, and the two optimized
kernels AccelOpt published the source of (RoPE, Mamba).

Source: AccelOpt (arXiv 2511.15915, MLSys 2026), repository zhang677/AccelOpt. Baseline latencies are in
``experiments/full_complete_local/profile_results.csv`` and the best kernels found in run 11-11-09-04 in
``experiments/full_complete_local/results/11110904_best_plan_id.csv`` (both added in commit 2dbeab4, 10 Dec
2025). Method (``accelopt/kernel_wrapper.py``): ``nki.baremetal`` with ``--disable-dge --logical-nc-config=1``,
auto-cast off, one core of a trn1.32xlarge; latency = the mean of 10 ``neuron-profile`` ``total_time`` values (2
warm-up runs first). Every input is fp32. Kernel sources: ``NKIBench/kernels/*.py`` (legacy ``neuronxcc.nki``,
most of them dumps of the compiler's own tiling with ``v1, v2, ...`` names; compiled by the late-2025 toolchain,
so loads and stores go through ``CURRENT``); the optimized RoPE and Mamba kernels are ``samples/nki/
rope_optimized.py`` and ``mamba_optimized.py`` (added in 8b58afd, Jan 2026; their README calls them the best
kernels AccelOpt found, and their HBM bytes match the CSV rows).

The CSV also records the profiler's HBM bytes, spill bytes, FLOP counts and engine active fractions. They show
where the compiler did not run the source as written, and the kernels follow the profile there (each case's
``differs`` says where): loads hoisted out of loops or merged (HBM read bytes equal to one read of the tensor),
a load re-issued per use instead of kept (matmul: 17.6x the rhs bytes), a partition broadcast done on TensorE by
a ones-matmul (the FLOP counts). Engines the source leaves to the compiler follow the active fractions:
``tensor_scalar`` (engine unknown), ``nl.square`` / ``nl.rsqrt`` and PSUM evacuations (``nl.copy``) on ScalarE,
``tensor_tensor``, ``reciprocal``, reductions and RoPE's SBUF copy on VectorE. Tasks whose profiles show compiler
spills are listed as not expressible (bmm's spill is 4 % of its DMA bytes and is ignored).

On trn1 ScalarE has no ``tensor_scalar``: a multiply by an immediate or a [P, 1] column is ``activation(identity,
scale=...)``, an add of an immediate is ``activation(identity, bias=column)`` with the constant memset into a
column once. VectorE ``reciprocal`` is ``tensor_scalar(1.0 / x)`` (same engine, same elements). PE transposes are
what the sources issue: ``nc_matmul`` with the data as stationary and a 128x128 identity (an HBM constant in the
source, an extra input here) as moving.
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import CURRENT, spec

TOOLCHAIN = CURRENT  # neuronxcc of late 2025
F32 = nl.float32
FAMILY = "accelopt-nkibench"
REPO = "zhang677/AccelOpt @2dbeab4"
CSV = f"{REPO}, experiments/full_complete_local/profile_results.csv"
BEST = f"{REPO}, experiments/full_complete_local/results/11110904_best_plan_id.csv"
_ACT, _DVE, _POOL = nisa.scalar_engine, nisa.vector_engine, nisa.gpsimd_engine


# ---- shared pieces -----------------------------------------------------------------------------------------
def _column(value, parts=128):
    """A [P, 1] constant column, memset once (the sources' zero-bias ``memset`` tiles; ScalarE's add operand)."""
    t = nl.ndarray((parts, 1), F32)
    nisa.memset(t, value, engine=_POOL)
    return t


def _act(op, src, **kw):
    """ScalarE ``activation`` into a new SBUF tile."""
    t = nl.ndarray(src.shape, F32)
    nisa.activation(t, op, src, **kw)
    return t


def _evacuate(dst, psum):
    """``nl.copy`` of PSUM into SBUF: on ScalarE (activation identity; trn1 has no ScalarE tensor_copy)."""
    nisa.activation(dst, nl.identity, psum)


def _tt(a, b, op):
    """VectorE ``tensor_tensor`` into a new SBUF tile."""
    t = nl.ndarray(a.shape, F32)
    nisa.tensor_tensor(t, a, b, op)
    return t


def _reciprocal(src):
    """``nisa.reciprocal`` (VectorE): 1.0 / x as a VectorE tensor_scalar over the same elements."""
    t = nl.ndarray(src.shape, F32)
    nisa.tensor_scalar(t, src, nl.divide, 1.0, reverse0=True)
    return t


def _pe_transpose(src, ident):
    """``nc_matmul(src, identity, is_transpose=True)``: src [P, F] (stationary) against the identity -> PSUM [F, P]."""
    p, f = src.shape
    t = nl.ndarray((f, p), F32, buffer=nl.psum)
    nisa.nc_matmul(t, src, ident[:p, :p], accumulate=False)
    return t


def _transposed(src, ident):
    """A PE transpose and its ScalarE copy into SBUF."""
    ps = _pe_transpose(src, ident)
    t = nl.ndarray(ps.shape, F32)
    _evacuate(t, ps)
    return t


def _broadcast_row(dst, row, ones):
    """``row.broadcast_to((128, F))`` of a one-partition SBUF row: a ones-matmul on TensorE ([1, 128] x [1, F]
    per 512 columns, K = 1) and ScalarE copies into ``dst`` (the profiles count these FLOPs)."""
    for j in range(0, row.shape[1], 512):
        w = min(512, row.shape[1] - j)
        ps = nl.ndarray((128, w), F32, buffer=nl.psum)
        nisa.nc_matmul(ps, ones, row[:, j:j + w], accumulate=False)
        _evacuate(dst[:, j:j + w], ps)


def _ones_row():
    t = nl.ndarray((1, 128), F32)
    nisa.memset(t, 1.0, engine=_POOL)
    return t


# ---- matmul M4096 N12288 K5120 -----------------------------------------------------------------------------
@nk.kernel
def matmul(lhs, rhs, ident):
    """lhs [32, 128, 40, 128] (M tiles, rows, K tiles, K), rhs [40, 128, 12288] -> [32, 128, 12288].

    Per 1024-column block i0 and M tile i3: 5 loads of 8 lhs K tiles, each tile PE-transposed and copied to SBUF;
    then 2 halves of 512 columns, 40 K tiles each, accumulated in one PSUM bank; one [128, 1024] store. The
    source loads the block's 40 rhs K tiles [128, 1024] once per i0 (160 KiB per partition, more than fits beside
    the rest); the profile's HBM reads (9,059,762,176 B = 384 x 40 x 512 KiB + lhs + identity) show the compiler
    re-loading them for every M tile instead: here the same loads are issued per (i0, i3)."""
    MT, P, KT, TK = lhs.shape
    N = rhs.shape[2]
    out = nl.ndarray((MT, P, N), F32, buffer=nl.hbm)
    ident_t = TOOLCHAIN.load(ident)
    for i0 in nl.affine_range(N // 1024):
        for i3 in nl.affine_range(MT):
            lhsT = []
            for i4 in nl.affine_range(KT // 8):
                raw = TOOLCHAIN.load(lhs[i3, :, nl.ds(8 * i4, 8), :])  # [128, 8, 128]: 4 KiB per partition
                block = nl.ndarray((P, 8, TK), F32)
                for i5 in nl.affine_range(8):
                    _evacuate(block[:, i5, :], _pe_transpose(raw[:, i5, :], ident_t))
                lhsT.append(block)
            rt = [TOOLCHAIN.load(rhs[k, :, nl.ds(1024 * i0, 1024)]) for k in range(KT)]  # re-loaded per M tile
            res = nl.ndarray((P, 1024), F32)
            for i6 in nl.affine_range(2):
                acc = nl.ndarray((P, 512), F32, buffer=nl.psum)
                for k in nl.affine_range(KT):
                    nisa.nc_matmul(acc, lhsT[k // 8][:, k % 8, :], rt[k][:, nl.ds(512 * i6, 512)], accumulate=k > 0)
                _evacuate(res[:, nl.ds(512 * i6, 512)], acc)
            TOOLCHAIN.store(out[i3, :, nl.ds(1024 * i0, 1024)], res)
    return out


# ---- transpose_matmul M4096 K2048 N10944 -------------------------------------------------------------------
@nk.kernel
def transpose_matmul(lhs, rhs):
    """lhs [128, 16, 4096], rhs [128, 16, 10944] (K = 2048 split as partition x 16) -> [32, 128, 10944].

    Per 1024-row M block i0: its 16 lhs K tiles [128, 1024]; per 1024-column N block i2 (the last 704 wide): 16 rhs
    K tiles; then per M tile i4 and 512-column half i5, 16 matmuls into PSUM, ScalarE copy, one store per
    (i4, i2). The lhs is already K-major, so there are no transposes."""
    P, KT, M = lhs.shape
    N = rhs.shape[2]
    out = nl.ndarray((M // P, P, N), F32, buffer=nl.hbm)
    for i0 in nl.affine_range(M // 1024):
        lt = [TOOLCHAIN.load(lhs[:, i1, nl.ds(1024 * i0, 1024)]) for i1 in range(KT)]
        for i2 in nl.affine_range(nl.cdiv(N, 1024)):
            width = min(1024, N - 1024 * i2)
            rt = [TOOLCHAIN.load(rhs[:, i3, nl.ds(1024 * i2, width)]) for i3 in range(KT)]
            for i4 in nl.affine_range(8):
                res = nl.ndarray((P, width), F32)
                for i5 in nl.affine_range(nl.cdiv(width, 512)):
                    w = min(512, width - 512 * i5)
                    acc = nl.ndarray((P, w), F32, buffer=nl.psum)
                    for i6 in nl.affine_range(KT):
                        nisa.nc_matmul(acc, lt[i6][:, nl.ds(128 * i4, 128)], rt[i6][:, nl.ds(512 * i5, w)],
                                       accumulate=i6 > 0)
                    _evacuate(res[:, nl.ds(512 * i5, w)], acc)
                TOOLCHAIN.store(out[8 * i0 + i4, :, nl.ds(1024 * i2, width)], res)
    return out


# ---- rmsnorm_matmul M4096 N2048 K1024 ----------------------------------------------------------------------
@nk.kernel
def rmsnorm_matmul(x, w, ident):
    """x [32, 128, 1024] (row tiles), w [8, 128, 2048] (K tiles) -> [32, 128, 2048]; x / sqrt(mean(x^2)) @ w.

    Per block of 8 row tiles (i0): each tile's sum of squares (ScalarE square and 1/K scale, VectorE reduce per
    512 half, VectorE add of the halves), ScalarE rsqrt, the row scale on ScalarE per half, and 8 PE transposes
    of the scaled tile into K-major [128, 128] tiles kept for the block; then per 1024-column half i5 and row tile
    i8, 2 x 8 accumulating matmuls, copies and one [128, 1024] store. The source loads x twice per tile and w per
    (i0, i5); the HBM reads (39,387,136 B, under x twice + w once) show the second x load merged and w loaded once
    (it does not depend on i0): both are done so here."""
    MT, P, K = x.shape
    N = w.shape[2]
    KT = w.shape[0]
    out = nl.ndarray((MT, P, N), F32, buffer=nl.hbm)
    zero = _column(0.0)
    ident_t = TOOLCHAIN.load(ident)
    wt = [[TOOLCHAIN.load(w[k, :, nl.ds(1024 * i5, 1024)]) for k in range(KT)] for i5 in range(N // 1024)]
    for i0 in nl.affine_range(MT // 8):
        xT = {}
        for i1 in nl.affine_range(8):
            xt = TOOLCHAIN.load(x[8 * i0 + i1])
            halves = nl.ndarray((P, 2), F32)
            for i2 in nl.affine_range(2):
                sq = _act(nl.square, xt[:, nl.ds(512 * i2, 512)], bias=zero)
                scaled = _act(nl.identity, sq, scale=1.0 / K)
                nisa.tensor_reduce(halves[:, i2:i2 + 1], scaled, nl.add, axis=1)
            ms = nl.ndarray((P, 1), F32)
            nisa.tensor_tensor(ms, halves[:, 0:1], halves[:, 1:2], nl.add)  # nl.loop_reduce over the halves
            inv = _act(nl.rsqrt, ms, bias=zero)
            for i3 in nl.affine_range(2):
                xn = _act(nl.identity, xt[:, nl.ds(512 * i3, 512)], scale=inv)
                for i4 in nl.affine_range(4):
                    xT[4 * i3 + i4, i1] = _transposed(xn[:, nl.ds(128 * i4, 128)], ident_t)
        for i5 in nl.affine_range(N // 1024):
            for i8 in nl.affine_range(8):
                res = nl.ndarray((P, 1024), F32)
                for i9 in nl.affine_range(2):
                    acc = nl.ndarray((P, 512), F32, buffer=nl.psum)
                    for k in nl.affine_range(KT):
                        nisa.nc_matmul(acc, xT[k, i8], wt[i5][k][:, nl.ds(512 * i9, 512)], accumulate=k > 0)
                    _evacuate(res[:, nl.ds(512 * i9, 512)], acc)
                TOOLCHAIN.store(out[8 * i0 + i8, :, nl.ds(1024 * i5, 1024)], res)
    return out


# ---- add_rmsnorm_matmul M4096 N2048 K1024 ------------------------------------------------------------------
def _rms_scale(a, n, eps, zero):
    """``nl.square``, ``nl.sum``, ``/ n``, ``+ eps``, ``nl.rsqrt``, ``nl.multiply(a, column)`` of one row tile."""
    p = a.shape[0]
    sq = _act(nl.square, a, bias=zero)
    ss = nl.ndarray((p, 1), F32)
    nisa.tensor_reduce(ss, sq, nl.add, axis=1)
    mean = nl.ndarray((p, 1), F32)
    nisa.tensor_scalar(mean, ss, nl.divide, float(n))
    nisa.tensor_scalar(mean, mean, nl.add, float(eps))
    inv = _act(nl.rsqrt, mean, bias=zero)
    return _act(nl.identity, a, scale=inv)


@nk.kernel
def add_rmsnorm_matmul(x, w, z, g, ident, eps=1e-5):
    """rmsnorm(x + z) * g @ w: x, z [4096, 1024], w [1024, 2048], g [1024] -> [4096, 2048].

    Per 128-row tile: loads of x and z, VectorE add, the RMS scale, VectorE multiply by g broadcast; then per
    512-column block n, 8 K steps of (PE transpose of the normalized tile's K slice, ScalarE copy, accumulating
    matmul) and a ScalarE copy and store. The source loads every w tile per row tile; the HBM reads (42,012,672 B
    = x + z + w + g + identity) show them loaded once, as here. ``g.broadcast_to`` is one ones-matmul broadcast
    before the loop (the FLOP count's 262,144 extra FLOPs); transposes stay per (row tile, n, k) (the transpose
    FLOPs count 1,024 of them)."""
    M, K = x.shape
    N = w.shape[1]
    out = nl.ndarray((M, N), F32, buffer=nl.hbm)
    zero = _column(0.0)
    ident_t = TOOLCHAIN.load(ident)
    g_row = TOOLCHAIN.load(g.reshape(1, K))
    g_b = nl.ndarray((128, K), F32)
    _broadcast_row(g_b, g_row, _ones_row())
    wt = [[TOOLCHAIN.load(w[nl.ds(128 * k, 128), nl.ds(512 * n, 512)]) for k in range(K // 128)]
          for n in range(N // 512)]
    for i in nl.affine_range(M // 128):
        rows = nl.ds(128 * i, 128)
        xt = TOOLCHAIN.load(x[rows, :])
        zt = TOOLCHAIN.load(z[rows, :])
        a = _tt(xt, zt, nl.add)
        normed = _rms_scale(a, K, eps, zero)
        nisa.tensor_tensor(normed, normed, g_b, nl.multiply)
        for n in nl.affine_range(N // 512):
            acc = nl.ndarray((128, 512), F32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                lhsT = _transposed(normed[:, nl.ds(128 * k, 128)], ident_t)
                nisa.nc_matmul(acc, lhsT, wt[n][k], accumulate=k > 0)
            res = nl.ndarray((128, 512), F32)
            _evacuate(res, acc)
            TOOLCHAIN.store(out[rows, nl.ds(512 * n, 512)], res)
    return out


# ---- matmul_add_rmsnorm M4096 N2048 K2048 ------------------------------------------------------------------
@nk.kernel
def matmul_add_rmsnorm(x, w, z, g, ident, eps=1e-5):
    """rmsnorm(x @ w + z) * g: x [4096, 2048], w [2048, 2048], z [4096, 2048], g [2048] -> [4096, 2048].

    Per 128-row tile: load x's row tile [128, 2048]; per 512-column block n, 16 K steps of (PE transpose of the x
    slice, ScalarE copy, accumulating matmul), ScalarE copy into the row's [128, 2048] result; load z, VectorE
    add, the RMS scale, VectorE multiply by g broadcast in place, store. The source loads every w tile per row
    tile; the HBM reads (98,115,584 B) show w loaded about 1.84 times: loaded once here (all of w is 128 KiB per
    partition), the compiler's extra 13.5 MiB of re-loads left out. g's broadcast is one ones-matmul broadcast
    before the loop (524,288 extra FLOPs); transposes stay per (row tile, n, k) (2,048 by the transpose FLOPs)."""
    M, K = x.shape
    N = w.shape[1]
    out = nl.ndarray((M, N), F32, buffer=nl.hbm)
    zero = _column(0.0)
    ident_t = TOOLCHAIN.load(ident)
    g_row = TOOLCHAIN.load(g.reshape(1, N))
    g_b = nl.ndarray((128, N), F32)
    _broadcast_row(g_b, g_row, _ones_row())
    wt = [[TOOLCHAIN.load(w[nl.ds(128 * k, 128), nl.ds(512 * n, 512)]) for n in range(N // 512)]
          for k in range(K // 128)]
    for i in nl.affine_range(M // 128):
        rows = nl.ds(128 * i, 128)
        xt = TOOLCHAIN.load(x[rows, :])
        y = nl.ndarray((128, N), F32)
        for n in nl.affine_range(N // 512):
            acc = nl.ndarray((128, 512), F32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                lhsT = _transposed(xt[:, nl.ds(128 * k, 128)], ident_t)
                nisa.nc_matmul(acc, lhsT, wt[k][n], accumulate=k > 0)
            _evacuate(y[:, nl.ds(512 * n, 512)], acc)
        zt = TOOLCHAIN.load(z[rows, :])
        a = _tt(y, zt, nl.add)
        normed = _rms_scale(a, N, eps, zero)
        nisa.tensor_tensor(normed, normed, g_b, nl.multiply)
        TOOLCHAIN.store(out[rows, :], normed)
    return out


# ---- bmm B16 M4096 K64 N4096 -------------------------------------------------------------------------------
@nk.kernel
def bmm(lhs, rhs, ident):
    """lhs [16, 4096, 64], rhs [16, 64, 4096] -> [16, 32, 128, 4096].

    Per batch i0 and 1024-column block i1: load rhs [64, 1024]; per 1024-row block i2, its 8 lhs tiles [128, 64]
    PE-transposed to [64, 128] and copied into one [64, 1024] tile; per row tile i4 and half i5 one K = 64 matmul,
    a ScalarE copy, and a [128, 1024] store per (i4, i1). The source re-loads and re-transposes lhs for every i1;
    the profile reads lhs once (67,436,544 B = lhs + rhs + identity + 33.8 MB of spill reloads) and counts 512
    transposes (2,147,483,648 transpose FLOPs), so here they are done once per (i0, i2), at i1 = 0."""
    B, M, K = lhs.shape
    N = rhs.shape[2]
    out = nl.ndarray((B, M // 128, 128, N), F32, buffer=nl.hbm)
    ident_t = TOOLCHAIN.load(ident)
    for i0 in nl.affine_range(B):
        lhsT = {}
        for i1 in nl.affine_range(N // 1024):
            rt = TOOLCHAIN.load(rhs[i0, :, nl.ds(1024 * i1, 1024)])
            for i2 in nl.affine_range(M // 1024):
                if i1 == 0:
                    lhsT[i2] = nl.ndarray((K, 1024), F32)
                    for i3 in nl.affine_range(8):
                        lt = TOOLCHAIN.load(lhs[i0, nl.ds(1024 * i2 + 128 * i3, 128), :])
                        _evacuate(lhsT[i2][:, nl.ds(128 * i3, 128)], _pe_transpose(lt, ident_t))
                for i4 in nl.affine_range(8):
                    res = nl.ndarray((128, 1024), F32)
                    for i5 in nl.affine_range(2):
                        acc = nl.ndarray((128, 512), F32, buffer=nl.psum)
                        nisa.nc_matmul(acc, lhsT[i2][:, nl.ds(128 * i4, 128)], rt[:, nl.ds(512 * i5, 512)],
                                       accumulate=False)
                        _evacuate(res[:, nl.ds(512 * i5, 512)], acc)
                    TOOLCHAIN.store(out[i0, 8 * i2 + i4, :, nl.ds(1024 * i1, 1024)], res)
    return out


# ---- rope_single_freq_apply B1 H64 N4096 D128 --------------------------------------------------------------
@nk.kernel
def rope(x_in, cos, sin, tile_s=512):
    """nki-samples' rotary kernel: x [128, S], cos / sin [64, S], S = 64 x 4096; per 512-column tile: load x,
    cos, sin (the source's packing of cos and sin into one tile is undone by rebinding the names: two tiles);
    copy the lower half of x to partition 0, four VectorE multiplies and a subtract and an add into the two
    halves of the output tile, one store. The copy (``nl.copy``, engine left to the compiler) is on VectorE: the
    profile's VectorE active time (3.10 ms) is the six tensor_tensor plus one copy per tile at the model's costs,
    and ScalarE is as active (0.61 ms) in the optimized kernel, which has no ScalarE instruction."""
    D, S = x_in.shape
    h = D // 2
    out = nl.ndarray((D, S), F32, buffer=nl.hbm)
    for s in range(0, S, tile_s):
        cols = nl.ds(s, tile_s)
        xt = TOOLCHAIN.load(x_in[:, cols])
        c = TOOLCHAIN.load(cos[:, cols])
        sn = TOOLCHAIN.load(sin[:, cols])
        e = xt[0:h]
        o = nl.ndarray((h, tile_s), F32)
        nisa.tensor_copy(o, xt[h:D], engine=_DVE)
        e_cos, o_cos = _tt(e, c, nl.multiply), _tt(o, c, nl.multiply)
        e_sin, o_sin = _tt(e, sn, nl.multiply), _tt(o, sn, nl.multiply)
        res = nl.ndarray((D, tile_s), F32)
        nisa.tensor_tensor(res[0:h], e_cos, o_sin, nl.subtract)
        nisa.tensor_tensor(res[h:D], o_cos, e_sin, nl.add)
        TOOLCHAIN.store(out[:, cols], res)
    return out


@nk.kernel
def rope_optimized(x_in, cos, sin, tile_s=2048):
    """AccelOpt's best RoPE: 2048-column tiles; the two halves of x, cos and sin loaded into their own [64, 2048]
    tiles (the source loads each twice; the compiler merged them: the HBM reads equal one read of each), the same
    six VectorE ops, and each half of the result stored from its own tile."""
    D, S = x_in.shape
    h = D // 2
    out = nl.ndarray((D, S), F32, buffer=nl.hbm)
    for s in range(0, S, tile_s):
        cols = nl.ds(s, tile_s)
        xu = TOOLCHAIN.load(x_in[0:h, cols])
        c = TOOLCHAIN.load(cos[:, cols])
        xl = TOOLCHAIN.load(x_in[h:D, cols])
        sn = TOOLCHAIN.load(sin[:, cols])
        e_cos, o_sin = _tt(xu, c, nl.multiply), _tt(xl, sn, nl.multiply)
        e_sin, o_cos = _tt(xu, sn, nl.multiply), _tt(xl, c, nl.multiply)
        TOOLCHAIN.store(out[0:h, cols], _tt(e_cos, o_sin, nl.subtract))
        TOOLCHAIN.store(out[h:D, cols], _tt(o_cos, e_sin, nl.add))
    return out


# ---- adamw M10944 N2048 ------------------------------------------------------------------------------------
@nk.kernel
def adamw(theta, g, m, v):
    """One AdamW step on [10944, 2048]: per 128-row tile (the last 64 rows) and 1024-column block, four loads,
    then per 512 half seven ``tensor_scalar`` (ScalarE), six ``tensor_tensor`` and the reciprocal (VectorE) and a
    square root (ScalarE), one store. The ScalarE placement of the tensor_scalars follows the profile (ScalarE
    61.6 % active, VectorE 90.0 %: the VectorE ops alone fill the VectorE time)."""
    M, N = theta.shape
    out = nl.ndarray((M, N), F32, buffer=nl.hbm)
    zero = _column(0.0)
    eps = _column(1e-8)
    for i0 in nl.affine_range(nl.cdiv(M, 128)):
        rows = nl.ds(128 * i0, min(128, M - 128 * i0))
        for i1 in nl.affine_range(N // 1024):
            cols = nl.ds(1024 * i1, 1024)
            th, mt = TOOLCHAIN.load(theta[rows, cols]), TOOLCHAIN.load(m[rows, cols])
            vt, gt = TOOLCHAIN.load(v[rows, cols]), TOOLCHAIN.load(g[rows, cols])
            p = th.shape[0]
            res = nl.ndarray((p, 1024), F32)
            for i2 in nl.affine_range(2):
                s = nl.ds(512 * i2, 512)
                decayed = _tt(th[:, s], _act(nl.identity, th[:, s], scale=1e-5), nl.subtract)
                m_t = _tt(_act(nl.identity, mt[:, s], scale=0.9), _act(nl.identity, gt[:, s], scale=0.1), nl.add)
                step = _act(nl.identity, m_t, scale=0.01)
                v_old = _act(nl.identity, vt[:, s], scale=0.999)
                g2 = _tt(_act(nl.identity, gt[:, s], scale=0.001), gt[:, s], nl.multiply)
                v_t = _tt(v_old, g2, nl.add)
                root = _act(nl.sqrt, v_t, scale=1000.0, bias=zero[:p])
                denom = _act(nl.identity, root, bias=eps[:p])
                upd = _tt(step, _reciprocal(denom), nl.multiply)
                nisa.tensor_tensor(res[:, s], decayed, upd, nl.subtract)
            TOOLCHAIN.store(out[rows, cols], res)
    return out


# ---- silu M4096 N7168 --------------------------------------------------------------------------------------
@nk.kernel
def silu(x):
    """x / (1 + exp(-x)) on x viewed as [128, 32, 7168]: per [128, 1024] block one load; per 512 half exp(-x)
    (ScalarE), + 1 (ScalarE, as the tensor_scalars of adamw), reciprocal (VectorE), multiply (VectorE); one
    store."""
    P, R, N = x.shape
    out = nl.ndarray(x.shape, F32, buffer=nl.hbm)
    zero = _column(0.0)
    one = _column(1.0)
    for i0 in nl.affine_range(R):
        for i1 in nl.affine_range(N // 1024):
            cols = nl.ds(1024 * i1, 1024)
            xt = TOOLCHAIN.load(x[:, i0, cols])
            res = nl.ndarray((P, 1024), F32)
            for i2 in nl.affine_range(2):
                s = nl.ds(512 * i2, 512)
                e = _act(nl.exp, xt[:, s], bias=zero, scale=-1.0)
                d = _act(nl.identity, e, bias=one)
                nisa.tensor_tensor(res[:, s], xt[:, s], _reciprocal(d), nl.multiply)
            TOOLCHAIN.store(out[:, i0, cols], res)
    return out


# ---- mamba (AccelOpt's optimized kernel) -------------------------------------------------------------------
def _scan(dst, data0, data1, initial):
    """``tensor_tensor_scan(data0, data1, initial, multiply, add)`` on VectorE. Where the ISA lacks the instruction
    (it is being added), a VectorE ``scalar_tensor_tensor`` (data0 * initial + data1 elementwise: the scan's first
    step applied to every element) stands in: same engine, operands and sizes, the same 2N cycles in the model."""
    if hasattr(nisa, "tensor_tensor_scan"):
        nisa.tensor_tensor_scan(dst, data0, data1, initial, nl.multiply, nl.add)
    else:
        nisa.scalar_tensor_tensor(dst, data0, nl.multiply, initial, nl.add, data1)


@nk.kernel
def mamba_optimized(delta, u, a, b, c, seq_tile=512):
    """AccelOpt's best Mamba selective scan: delta, u [256, 7168], a [256, 16], b, c [16, 7168] -> [256, 7168].

    Per 512-column sequence tile (sequential: the scan state carries over), per 128-channel tile: load delta and
    u; per state: load A's column, exp(delta * A) (ScalarE), delta * u and * B (VectorE; B broadcast to 128
    partitions by a ones-matmul into PSUM, as the profile's FLOPs count), the scan (VectorE), the last column
    kept as the next tile's initial state, * C (broadcast likewise) and the accumulation (VectorE); one store per
    channel tile."""
    C, L = delta.shape
    S = a.shape[1]
    out = nl.ndarray((C, L), F32, buffer=nl.hbm)
    ones = _ones_row()
    state = []
    for _ in range(C // 128):
        t = nl.ndarray((128, S), F32)
        nisa.memset(t, 0.0, engine=_DVE)
        state.append(t)
    nt = L // seq_tile
    for it in nl.sequential_range(nt):
        cols = nl.ds(it * seq_tile, seq_tile)
        accs = []
        for _ in range(C // 128):
            t = nl.ndarray((128, seq_tile), F32)
            nisa.memset(t, 0.0, engine=_DVE)
            accs.append(t)
        for ct in nl.affine_range(C // 128):
            ch = nl.ds(128 * ct, 128)
            d = TOOLCHAIN.load(delta[ch, cols])
            uu = TOOLCHAIN.load(u[ch, cols])
            for s in nl.affine_range(S):
                a_col = TOOLCHAIN.load(a[ch, s:s + 1])
                dA = _act(nl.exp, d, scale=a_col)
                b_row = TOOLCHAIN.load(b[s:s + 1, cols])
                dU = _tt(d, uu, nl.multiply)
                b_b = nl.ndarray((128, seq_tile), F32, buffer=nl.psum)
                nisa.nc_matmul(b_b, ones, b_row, accumulate=False)
                dBu = _tt(dU, b_b, nl.multiply)
                scan = nl.ndarray((128, seq_tile), F32)
                init = state[ct][:, s:s + 1] if it > 0 else 0.0
                _scan(scan, dA, dBu, init)
                if it < nt - 1:
                    nisa.tensor_copy(state[ct][:, s:s + 1], scan[:, seq_tile - 1:seq_tile])
                c_row = TOOLCHAIN.load(c[s:s + 1, cols])
                c_b = nl.ndarray((128, seq_tile), F32, buffer=nl.psum)
                nisa.nc_matmul(c_b, ones, c_row, accumulate=False)
                sc = _tt(scan, c_b, nl.multiply)
                nisa.tensor_tensor(accs[ct], accs[ct], sc, nl.add)
        for ct in nl.affine_range(C // 128):
            TOOLCHAIN.store(out[nl.ds(128 * ct, 128), cols], accs[ct])
    return out


# ---- cases -------------------------------------------------------------------------------------------------
# Profile fields per task (CSV line): HBM read / write bytes, spill save / reload bytes, ScalarE / VectorE /
# GpSimd active fractions.
PROFILE = {
    "swiglu": (2, 141623296, 83886080, 67108864, 83886080, 0.0933, 0.1347, 0.0007),
    "matmul_add_rmsnorm": (3, 98115584, 33554432, 0, 0, 0.1679, 0.1242, 0.0011),
    "add_rmsnorm_matmul": (4, 42012672, 33554432, 0, 0, 0.2254, 0.1484, 0.0043),
    "matmul": (5, 9059762176, 201326592, 0, 0, 0.0680, 0.0000, 0.0007),
    "gqa_full": (6, 1194393600, 1132986368, 1099431936, 1127219200, 0.3860, 0.3139, 0.0017),
    "rmsnorm_matmul": (7, 39387136, 33554432, 0, 0, 0.1775, 0.0388, 0.0051),
    "rope_single_freq_apply": (8, 268435456, 134217728, 0, 0, 0.1411, 0.7164, 0.0074),
    "bmm": (9, 67436544, 1086324736, 12582912, 33816576, 0.3726, 0.0000, 0.0261),
    "bmm_softmax": (10, 794361856, 1827405824, 753664000, 756547584, 0.4340, 0.4639, 0.0103),
    "transpose_matmul": (11, 392167424, 179306496, 0, 0, 0.0379, 0.0000, 0.0023),
    "lora": (12, 2341797888, 1269563392, 1068236800, 1907097600, 0.0344, 0.0981, 0.0018),
    "adamw": (13, 358612992, 89653248, 0, 0, 0.6162, 0.9002, 0.0059),
    "silu": (14, 117440512, 117440512, 0, 0, 0.3148, 0.7388, 0.0118),
    "mamba": (15, 181682176, 62390272, 55050240, 55050240, 0.1862, 0.6132, 0.0004),
}
# The same fields of the best kernels (best-plan CSV line).
BEST_PROFILE = {
    "mamba": (8, 126631936, 7340032, 0, 0, 0.2382, 0.7836, 0.0005),
    "rope_single_freq_apply": (12, 268435456, 134217728, 0, 0, 0.1836, 0.8389, 0.0190),
}
_PROFILE_NOTE = ("mean of 10 neuron-profile total_time runs (min {lo} / max {hi} ms); profile: HBM read {r:,} B, "
                 "write {w:,} B, spill save {ss:,} B / reload {sr:,} B; active ScalarE {act:.3f}, VectorE {dve:.3f}, "
                 "GpSimd {pool:.3f} of the total time")


def _measurement(value_ms, source, fields, lo, hi, extra=""):
    line, r, w, ss, sr, act, dve, pool = fields
    note = _PROFILE_NOTE.format(lo=lo, hi=hi, r=r, w=w, ss=ss, sr=sr, act=act, dve=dve, pool=pool)
    return Measurement(value_ms * 1e3, "mean", "trn1", f"{source} line {line}", "2025-12", note=note + extra)


def _spec(*shape):
    return spec(shape, "float32")


IDENT = _spec(128, 128)
_PE = ("PE transposes are nc_matmul against the identity, passed as an input (the source's nl.shared_constant); "
       "is_moving_onezero and the lazily zeroed PSUM tiles are left to the first matmul of each accumulation "
       "(no memset); ")


def _baseline(task, kernel, args, value_ms, lo, hi, differs, kwargs=None, family=FAMILY, name=None):
    return Case(family=family, name=name or task, kernel=kernel, args=args, kwargs=kwargs or {},
                measurement=_measurement(value_ms, CSV, PROFILE[task], lo, hi), differs=differs)


def _spilled(task, value_ms, lo, hi, what, family=FAMILY, name=None):
    line, r, w, ss, sr, *_ = PROFILE[task]
    share = (ss + sr) / (r + w)
    return Case(family=family, name=name or task, kernel=None, args=(),
                measurement=_measurement(value_ms, CSV, PROFILE[task], lo, hi),
                differs=(f"compiler spills: {ss:,} B saved and {sr:,} B reloaded through HBM ({100 * share:.0f}% of "
                         f"the profile's {r + w:,} HBM bytes); {what}"),
                expressible=False)


_ROPE_ARGS = (_spec(128, 64 * 4096), _spec(64, 64 * 4096), _spec(64, 64 * 4096))
_ROPE_DIFFERS = ("the copy of x's lower half to partition 0 (nl.copy) is placed on VectorE, from the profile; the "
                 "source's unused packing tiles are not allocated")
_MAMBA_ARGS = (_spec(256, 7168), _spec(256, 7168), _spec(256, 16), _spec(16, 7168), _spec(16, 7168))
_MAMBA_SPILL = ("the baseline (= samples/nki/mamba_v1.py, the NKI tutorial's v1) makes seven [128, 7168] fp32 tiles "
                "(28 KiB per partition each) per (state, channel tile) beside the 56 KiB accumulator, against 192 KiB "
                "of SBUF")

CASES = [
    _baseline("matmul", matmul, (_spec(32, 128, 40, 128), _spec(40, 128, 12288), IDENT), 35.199742, 35.165401,
              35.248906,
              _PE + "the 40 rhs K tiles of a column block are loaded for every M tile, where the source loads them "
              "once per column block (the profile's HBM reads; they do not fit in SBUF beside the rest)"),
    _baseline("transpose_matmul", transpose_matmul, (_spec(128, 16, 4096), _spec(128, 16, 10944)), 9.610311,
              9.606482, 9.61347, "the lazily zeroed PSUM tiles are left to the first matmul (no memset)"),
    _baseline("rmsnorm_matmul", rmsnorm_matmul, (_spec(32, 128, 1024), _spec(8, 128, 2048), IDENT), 1.05576,
              1.049849, 1.060082,
              _PE + "the second load of x is merged into the first and w is loaded once before the loop (the "
              "profile's HBM reads; they exceed that by 13.5 MiB of re-loads the compiler added somewhere, left "
              "out); nl.loop_reduce over the two halves is one VectorE add"),
    _baseline("add_rmsnorm_matmul", add_rmsnorm_matmul,
              (_spec(4096, 1024), _spec(1024, 2048), _spec(4096, 1024), _spec(1024), IDENT), 1.221911, 1.219585,
              1.223863,
              _PE + "w loaded once before the row loop (profile HBM reads); g broadcast by a ones-matmul and "
              "ScalarE copies; engines of the nl.* ops chosen from the profile (square, rsqrt, row scale and PSUM "
              "copies on ScalarE; add, sum, multiply by g on VectorE; the [128, 1] mean and eps steps on VectorE)"),
    _baseline("matmul_add_rmsnorm", matmul_add_rmsnorm,
              (_spec(4096, 2048), _spec(2048, 2048), _spec(4096, 2048), _spec(2048), IDENT), 2.66658, 2.664495,
              2.668886,
              _PE + "w loaded once before the row loop, the compiler's 13.5 MiB of w re-loads (HBM reads 98.1 MB "
              "vs 84.0 MB here) left out; g broadcast by a ones-matmul; engines as add_rmsnorm_matmul"),
    _baseline("bmm", bmm, (_spec(16, 4096, 64), _spec(16, 64, 4096), IDENT), 4.610889, 4.605054, 4.619498,
              _PE + "lhs loaded and transposed once per (batch, 1024-row block), not per 1024-column block as "
              "written (profile HBM reads and transpose FLOPs); the compiler's spill (12.6 MB saved, 33.8 MB "
              "reloaded, 4% of the 1.15 GB of HBM traffic) is left out as small"),
    _baseline("rope_single_freq_apply", rope, _ROPE_ARGS, 4.33301, 4.331857, 4.33399, _ROPE_DIFFERS),
    _baseline("adamw", adamw, (_spec(10944, 2048),) * 4, 1.999829, 1.994566, 2.005252,
              "tensor_scalar by an immediate runs as ScalarE activation(identity, scale) and + 1e-8 as "
              "activation(identity, bias=column of 1e-8) (trn1 ScalarE has no tensor_scalar; the profile puts "
              "them on ScalarE); reciprocal is a VectorE tensor_scalar 1.0 / x"),
    _baseline("silu", silu, (_spec(128, 32, 7168),), 1.333232, 1.332204, 1.33405,
              "+ 1 runs as ScalarE activation(identity, bias=column of 1.0); reciprocal is a VectorE "
              "tensor_scalar 1.0 / x"),
    _spilled("swiglu", 4.221777, 4.218224, 4.225924,
             "the source already routes the [3, 8, 8, 128, 512] gated product through an HBM buffer (_spill_163, "
             "50.3 MB each way); if the profiler counts it as spill, the compiler saves 16.8 MB and reloads 33.6 MB "
             "more on top, which the source does not show"),
    _spilled("gqa_full", 19.110503, 19.105258, 19.114796,
             "the scores of every head ([32, 2, 4, 2, 2, 4][128, 512] fp32: 1 GiB, 8 MiB per partition) are kept "
             "from the QK matmuls to the softmax, far beyond SBUF"),
    _spilled("bmm_softmax", 11.999614, 11.995044, 12.003772,
             "the fp32 scores of a batch ([4, 8, 4, 2][128, 512]: 64 MiB, 512 KiB per partition) and their exps are "
             "kept from the matmuls to the normalization, beyond SBUF"),
    _spilled("lora", 30.16637, 30.161014, 30.171963,
             "the whole low-rank term (x @ a) @ b ([4096, 12288] fp32, 1.5 MiB per partition) is computed before "
             "the main product and kept until it is added, beyond SBUF"),
    _spilled("mamba", 2.888663, 2.88259, 2.896355, _MAMBA_SPILL),
]

# The two optimized kernels whose sources AccelOpt published, each with its task's baseline: one family per task.
_MAMBA_OPT_DIFFERS = ("where the ISA has no tensor_tensor_scan, a VectorE scalar_tensor_tensor stands in (same "
                      "operands, sizes and modelled cost; values differ after the first element); B and C are "
                      "broadcast by ones-matmuls read from PSUM by VectorE (the FLOP count, 896 K = 1 matmuls); "
                      "nl.zeros and the state update run on VectorE; the profile's HBM reads (126,631,936 B, exactly "
                      "the baseline's non-spill reads) are 110 MB above the source's loads (16.7 MB here), traffic "
                      "the source does not explain and the kernel leaves out")
CASES += [
    _baseline("rope_single_freq_apply", rope, _ROPE_ARGS, 4.33301, 4.331857, 4.33399, _ROPE_DIFFERS,
              family="accelopt-optimized-rope", name="baseline"),
    Case(family="accelopt-optimized-rope", name="optimized", kernel=rope_optimized, args=_ROPE_ARGS,
         measurement=_measurement(3.332587, BEST, BEST_PROFILE["rope_single_freq_apply"], 3.326186, 3.341939,
                                  "; kernel samples/nki/rope_optimized.py (8b58afd)"),
         differs="each repeated nl.load is issued once (the compiler's merge; the profile's HBM reads)"),
    _spilled("mamba", 2.888663, 2.88259, 2.896355, _MAMBA_SPILL, family="accelopt-optimized-mamba", name="baseline"),
    Case(family="accelopt-optimized-mamba", name="optimized", kernel=mamba_optimized, args=_MAMBA_ARGS,
         measurement=_measurement(2.277542, BEST, BEST_PROFILE["mamba"], 2.272988, 2.282393,
                                  "; kernel samples/nki/mamba_optimized.py (8b58afd)"),
         differs=_MAMBA_OPT_DIFFERS),
]
