"""awslabs/nki-autotune's matmul kernel library on trn2: 2048^3 bf16 matmuls in four operand layouts (lhsT @ rhs,
lhs @ rhs, lhsT @ rhsT, lhs @ rhsT), autotuner-generated and hand-written, each published with its MFU.

Source: the repository's ``kernel_library/`` (README table and one ``<name>_<mfu>.py`` per kernel), in the
commits of 23-25 Apr 2026: 1d9c2b9 (the autotuned ``kernel_31_58.60mfu``, ``kernel_30_60.21mfu``,
``kernel_53_60.57mfu``, ``kernel_83_61.73mfu``), b672385 (``kernel_manual_79.05mfu``, a port of the NKI
tutorial's fully optimized matmul at 4/1/8 blocks), 160f940 (``kernel_from_manual_ir_80.45mfu``), dcc23bb
(``kernel_hand_90.92mfu``) and 0b6f309 (``kernel_handtuned_89.26mfu``; this commit trimmed the library to the two
best kernels, the others are read at the commits that added them). Kernels are NKI 0.3 with explicit
``nisa.dma_copy`` / ``nisa.dma_transpose`` (default queues), compiled by neuronx-cc of Apr 2026 (the hand
kernels with ``enable-linear-scan-allocation=false``, ``enable-instruction-scheduling=false``), run on a trn2 box
and profiled by neuron-profile (``mfu_estimated_percent``, ``total_time``).

Only one absolute time is published: 0.2442 ms for the lhs @ rhs hand-tuned kernel at 89.47% MFU (its best of
10 runs). 2 * 2048^3 = 17.18e9 FLOP / 0.2442 ms / 0.8947 = 78.6e12 FLOP/s: one NC-v3's bf16 peak (~79 TFLOPS),
so the runs used one physical core (lnc=1). Every other figure is derived the same way: time = 17.18e9 FLOP /
(MFU * 78.6e12 FLOP/s), statistic "profile". The double_matmul kernel of 1d9c2b9 (Q @ K.T @ V, 54.73% MFU) is
another operation and is not part of this family.
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import spec

S = 2048
FLOP = 2 * S ** 3  # 17.18e9
PEAK = 78.6e12  # FLOP/s implied by the one published time (see the module docstring)
REPO = "awslabs/nki-autotune"
BF16 = nl.bfloat16


def _tiles(rows, cols, *shape):
    """A nested list (``rows`` x ``cols``, or ``rows`` when cols is None) of SBUF bf16 tiles, like the library's
    per-leaf ``nl.ndarray`` lists."""
    if cols is None:
        return [nl.ndarray(shape, BF16) for _ in range(rows)]
    return [[nl.ndarray(shape, BF16) for _ in range(cols)] for _ in range(rows)]


def _psum():
    return nl.ndarray((128, 512), nl.float32, buffer=nl.psum)


# -- the autotuner's four-group kernels: load everything, then one PSUM tile per output tile in turn, then store
def _load_grid(sbuf, src, tp, tf):
    """``dma_copy`` of every [tp, tf] tile of ``src`` into ``sbuf[pi][fi]``."""
    for pi, row in enumerate(sbuf):
        for fi, t in enumerate(row):
            nisa.dma_copy(t, src[pi * tp:(pi + 1) * tp, fi * tf:(fi + 1) * tf])


def _transpose_grid(sbuf, src, tp, tf):
    """``dma_transpose`` into ``sbuf[pi][fi]`` ([tp, tf]) of the [tf, tp] block of ``src`` at rows fi*tf,
    columns pi*tp: the destination's partitions come from the source's columns."""
    for pi, row in enumerate(sbuf):
        for fi, t in enumerate(row):
            nisa.dma_transpose(t, src[fi * tf:(fi + 1) * tf, pi * tp:(pi + 1) * tp])


def _store_grid(dst, sbuf, tp, tf):
    for pi, row in enumerate(sbuf):
        for fi, t in enumerate(row):
            nisa.dma_copy(dst[pi * tp:(pi + 1) * tp, fi * tf:(fi + 1) * tf], t)


def _one_psum_matmuls(out, lhsT_tiles, rhs_tiles, m_tiles, n_tiles, k_tiles, acc):
    """Output tiles in (m, n) order, all through the one PSUM tile ``acc``: memset (VectorE), ``k_tiles``
    matmuls, ``tensor_copy`` to the SBUF output tile (VectorE; the engine is left to the compiler)."""
    for m in range(m_tiles):
        for n in range(n_tiles):
            nisa.memset(acc, 0.0)
            for k in range(k_tiles):
                nisa.nc_matmul(acc, lhsT_tiles[k][m], rhs_tiles[k][n])
            nisa.tensor_copy(out[m][n], acc)


@nk.kernel
def lhsT_rhs_auto_58(lhs_T, rhs):
    """kernel_31_58.60mfu: all of lhs_T as 16 x 16 [128, 128] copies, all of rhs as 16 x 4 [128, 512] copies, then
    per output tile (M outer, N, K innermost) 16 matmuls into the single PSUM tile, then 64 stores."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    lt = _tiles(16, 16, 128, 128)
    _load_grid(lt, lhs_T, 128, 128)
    rt = _tiles(16, 4, 128, 512)
    _load_grid(rt, rhs, 128, 512)
    ot = _tiles(16, 4, 128, 512)
    _one_psum_matmuls(ot, lt, rt, 16, 4, 16, _psum())
    _store_grid(out, ot, 128, 512)
    return out


@nk.kernel
def lhs_rhs_auto_60(lhs, rhs):
    """kernel_30_60.21mfu: all of rhs copied first; then per block of 256 lhs rows, 32 DMA transposes of
    [128, 128] into one lhsT tile set reused by every block, and the block's 2 x 4 output tiles through the
    single PSUM tile (16 matmuls each); 64 stores at the end."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    rt = _tiles(16, 4, 128, 512)
    _load_grid(rt, rhs, 128, 512)
    ot = _tiles(16, 4, 128, 512)
    lt = _tiles(16, 2, 128, 128)  # one set for all eight row blocks: each block's transposes wait for the last
    acc = _psum()
    for b in range(8):
        _transpose_grid(lt, lhs[b * 256:(b + 1) * 256, :], 128, 128)
        _one_psum_matmuls(ot[2 * b:2 * b + 2], lt, rt, 2, 4, 16, acc)
    _store_grid(out, ot, 128, 512)
    return out


@nk.kernel
def lhsT_rhsT_auto_61(lhs_T, rhs_T):
    """kernel_53_60.57mfu: rhs brought in by 16 x 4 DMA transposes ([512, 128] -> [128, 512]), lhs_T by 256
    [128, 128] copies, then the 16 x 4 output tiles through the single PSUM tile; 64 stores."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    rt = _tiles(16, 4, 128, 512)
    _transpose_grid(rt, rhs_T, 128, 512)
    lt = _tiles(16, 16, 128, 128)
    _load_grid(lt, lhs_T, 128, 128)
    ot = _tiles(16, 4, 128, 512)
    _one_psum_matmuls(ot, lt, rt, 16, 4, 16, _psum())
    _store_grid(out, ot, 128, 512)
    return out


@nk.kernel
def lhs_rhsT_auto_62(lhs, rhs_T):
    """kernel_83_61.73mfu: both operands by DMA transposes (lhs as 256 [128, 128] blocks, rhs_T as 64
    [512, 128] blocks), then the 16 x 4 output tiles through the single PSUM tile; 64 stores."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    lt = _tiles(16, 16, 128, 128)
    _transpose_grid(lt, lhs, 128, 128)
    rt = _tiles(16, 4, 128, 512)
    _transpose_grid(rt, rhs_T, 128, 512)
    ot = _tiles(16, 4, 128, 512)
    _one_psum_matmuls(ot, lt, rt, 16, 4, 16, _psum())
    _store_grid(out, ot, 128, 512)
    return out


# -- the blocked kernels: SBUF accumulators, per K block a PSUM pass per output tile added into them -----------
def _block_pass(out_tiles, lhsT_tiles, rhs_tiles, psum=None, acc=None):
    """For each M tile m (128 columns of the stationary tiles) against the [128, 512] rhs tiles: memset a PSUM
    tile, one matmul per K tile, ``tensor_copy`` to a bf16 SBUF tile, ``tensor_tensor`` add into
    ``out_tiles[m]``. ``psum``/``acc`` given: one pair shared by the block's M tiles; None: a fresh pair per M
    tile (the 90.92% kernel's change)."""
    for m, dst in enumerate(out_tiles):
        p = psum if psum is not None else _psum()
        a = acc if acc is not None else nl.ndarray((128, 512), BF16)
        nisa.memset(p, 0.0)
        for lt, rt in zip(lhsT_tiles, rhs_tiles):
            nisa.nc_matmul(p, lt[:, m * 128:(m + 1) * 128], rt)
        nisa.tensor_copy(a, p)
        nisa.tensor_tensor(dst, dst, a, nl.add)


def _load_rows(tiles, src, r0, cols):
    """One ``dma_copy`` per tile: rows r0 + 128 i of ``src``, columns ``cols``."""
    for i, t in enumerate(tiles):
        nisa.dma_copy(t, src[r0 + i * 128:r0 + (i + 1) * 128, cols])


def _store_rows(dst, tiles, cols):
    for i, t in enumerate(tiles):
        nisa.dma_copy(dst[i * 128:(i + 1) * 128, cols], t)


@nk.kernel
def lhsT_rhs_manual_79(lhsT, rhs):
    """kernel_manual_79.05mfu (the NKI tutorial's fully optimized kernel at 4/1/8 blocks): per N block of 512,
    16 bf16 SBUF result tiles zeroed; per K block of 1024, 8 rhs [128, 512] copies, then per M block of 512,
    8 lhsT [128, 512] copies and one PSUM tile + one bf16 SBUF tile shared by the block's 4 output tiles;
    at the end each result tile is copied to a staging tile and stored."""
    result = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    for n in range(4):
        cols = nl.ds(512 * n, 512)
        res = [[nl.ndarray((128, 512), BF16) for _ in range(4)] for _ in range(4)]
        for row in res:
            for t in row:
                nisa.memset(t, 0.0)
        for k in range(2):
            rt = _tiles(8, None, 128, 512)
            _load_rows(rt, rhs, 1024 * k, cols)
            for m in range(4):
                lt = _tiles(8, None, 128, 512)
                _load_rows(lt, lhsT, 1024 * k, nl.ds(512 * m, 512))
                _block_pass(res[m], lt, rt, psum=_psum(), acc=nl.ndarray((128, 512), BF16))
        for m in range(4):
            for bm in range(4):
                packed = nl.ndarray((128, 512), BF16)
                nisa.tensor_copy(packed, res[m][bm])
                nisa.dma_copy(result[nl.ds((4 * m + bm) * 128, 128), cols], packed)
    return result


@nk.kernel
def lhsT_rhs_ir_80(lhs_T, rhs):
    """kernel_from_manual_ir_80.45mfu: N blocks of 512 outermost with 16 bf16 accumulators each (fresh per
    block, zeroed); per K block of 1024, 8 rhs [128, 512] copies; per M block of 512, 8 lhs_T [128, 512] copies
    and a pass over its 4 M tiles sharing one PSUM + SBUF pair; the 16 accumulators stored per N block."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    for d2 in range(4):
        cols = nl.ds(512 * d2, 512)
        ot = _tiles(16, None, 128, 512)
        for t in ot:
            nisa.memset(t, 0.0)
        for d0 in range(2):
            rt = _tiles(8, None, 128, 512)
            _load_rows(rt, rhs, 1024 * d0, cols)
            for d1 in range(4):
                lt = _tiles(8, None, 128, 512)
                _load_rows(lt, lhs_T, 1024 * d0, nl.ds(512 * d1, 512))
                _block_pass(ot[4 * d1:4 * d1 + 4], lt, rt, psum=_psum(), acc=nl.ndarray((128, 512), BF16))
        _store_rows(out, ot, cols)
    return out


@nk.kernel
def lhsT_rhs_hand_91(lhs_T, rhs):
    """kernel_hand_90.92mfu: the 80.45% kernel with explicit buffer sets (16 accumulators x 4 N blocks; per N
    block 2 x 4 lhs_T sets and 2 rhs sets of 8 [128, 512] tiles, indexed by block) and a fresh PSUM + SBUF
    pair per output tile."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    acc_sets = [_tiles(16, None, 128, 512) for _ in range(4)]
    for d2 in range(4):
        cols = nl.ds(512 * d2, 512)
        lhs_sets = [[_tiles(8, None, 128, 512) for _ in range(4)] for _ in range(2)]
        rhs_sets = [_tiles(8, None, 128, 512) for _ in range(2)]
        ot = acc_sets[d2 % 4]
        for t in ot:
            nisa.memset(t, 0.0)
        for d0 in range(2):
            rt = rhs_sets[d0 % 2]
            _load_rows(rt, rhs, 1024 * d0, cols)
            for d1 in range(4):
                lt = lhs_sets[d0 % 2][d1 % 4]
                _load_rows(lt, lhs_T, 1024 * d0, nl.ds(512 * d1, 512))
                _block_pass(ot[4 * d1:4 * d1 + 4], lt, rt)
        _store_rows(out, ot, cols)
    return out


@nk.kernel
def lhs_rhs_hand_89(lhs, rhs):
    """kernel_handtuned_89.26mfu: M blocks of 1024 outermost with 8 bf16 accumulators [128, 2048] (fresh per
    block, zeroed); per N block of 512 and K block of 1024: 8 DMA transposes of lhs [1024, 128] -> [128, 1024]
    into one of four lhsT sets fixed for the kernel (so reloaded for every N block), 8 rhs [128, 512] copies,
    and a pass over the 8 M tiles with a fresh PSUM + SBUF pair each; the block's 8 output slices stored per N
    block."""
    out = nl.ndarray((S, S), BF16, buffer=nl.hbm)
    lhs_sets = {}  # the library allocates 4 x 4 sets up front and uses [d1 % 4][d0 % 4]: four of them
    for d0 in range(2):
        for d1 in range(2):
            lhs_sets[d1, d0] = _tiles(8, None, 128, 1024)
    for d0 in range(2):
        ot = _tiles(8, None, 128, 2048)
        for t in ot:
            nisa.memset(t, 0.0)
        for d2 in range(4):
            cols = nl.ds(512 * d2, 512)
            rhs_sets = [_tiles(8, None, 128, 512) for _ in range(2)]  # of the library's 8, [d1 % 8] uses two
            for d1 in range(2):
                lt = lhs_sets[d1, d0]
                blk = lhs[1024 * d0:1024 * (d0 + 1), 1024 * d1:1024 * (d1 + 1)]
                for ki, t in enumerate(lt):
                    nisa.dma_transpose(t, blk[:, ki * 128:(ki + 1) * 128])
                rt = rhs_sets[d1]
                _load_rows(rt, rhs, 1024 * d1, cols)
                _block_pass([t[:, 512 * d2:512 * (d2 + 1)] for t in ot], lt, rt)
            for i, t in enumerate(ot):
                nisa.dma_copy(out[1024 * d0 + i * 128:1024 * d0 + (i + 1) * 128, cols], t[:, 512 * d2:512 * (d2 + 1)])
    return out


_DIFFERS = ("memset and PSUM-to-SBUF tensor_copy on VectorE, in source order, where the source leaves the engine "
            "to the compiler (GpSimd cannot reach PSUM); "
            "DMA queues are the project's default assignment; tiles are placed by the project's allocator (by "
            "liveness), not by neuronx-cc's, whose allocation and scheduling the hand kernels switch off")


def _mfu_case(name, kernel, mfu_pct, commit, path, layout, note="", mfu_from="MFU in kernel_library/README.md",
              scheduled=True):
    t_us = FLOP / (mfu_pct / 100 * PEAK) * 1e6
    return Case(
        family="nki-autotune-matmul",
        name=name,
        kernel=kernel,
        args=(spec((S, S), "bfloat16"), spec((S, S), "bfloat16")),
        measurement=Measurement(
            round(t_us, 2), "profile", "trn2", f"{REPO} {commit}, {path}; {mfu_from}",
            "2026-04",
            note=f"{layout}; derived: 17.18e9 FLOP / ({mfu_pct}% x 78.6e12 FLOP/s) = {t_us:.1f} us, the peak implied "
                 "by the one published time (0.2442 ms at 89.47%); neuron-profile MFU of the kernel's run. " + note),
        differs=_DIFFERS,
        scheduled=scheduled,
    )


CASES = [
    _mfu_case("lhsT_rhs_auto_58", lhsT_rhs_auto_58, 58.60, "1d9c2b9",
              "kernel_library/matmul/lhsT_rhs/kernel_31_58.60mfu.py", "lhs_T.T @ rhs"),
    _mfu_case("lhs_rhs_auto_60", lhs_rhs_auto_60, 60.21, "1d9c2b9",
              "kernel_library/matmul/lhs_rhs/kernel_30_60.21mfu.py", "lhs @ rhs"),
    _mfu_case("lhsT_rhsT_auto_61", lhsT_rhsT_auto_61, 60.57, "1d9c2b9",
              "kernel_library/matmul/lhsT_rhsT/kernel_53_60.57mfu.py", "lhs_T.T @ rhs_T.T"),
    _mfu_case("lhs_rhsT_auto_62", lhs_rhsT_auto_62, 61.73, "1d9c2b9",
              "kernel_library/matmul/lhs_rhsT/kernel_83_61.73mfu.py", "lhs @ rhs_T.T"),
    _mfu_case("lhsT_rhs_manual_79", lhsT_rhs_manual_79, 79.05, "b672385",
              "kernel_library/matmul/lhsT_rhs/kernel_manual_79.05mfu.py", "lhsT.T @ rhs",
              "README: MBU 16.80%; the upstream 16/2/8 blocking gives 60.56% at this shape (no source kept)."),
    _mfu_case("lhsT_rhs_ir_80", lhsT_rhs_ir_80, 80.45, "160f940",
              "kernel_library/matmul/lhsT_rhs/kernel_from_manual_ir_80.45mfu.py", "lhs_T.T @ rhs",
              "Not in the README table (commit title: 'matmul_block gadget reaching 80% MFU').",
              mfu_from="MFU from the file name"),
    _mfu_case("lhsT_rhs_hand_91", lhsT_rhs_hand_91, 90.92, "dcc23bb (unchanged at 0b6f309)",
              "kernel_library/matmul/lhsT_rhs/kernel_hand_90.92mfu.py", "lhs_T.T @ rhs",
              "Compiler baseline (nkipy -> neuronx-cc -O2) 86.65%.",
              scheduled=False),  # compiled with instruction scheduling off: program order
    Case(
        family="nki-autotune-matmul",
        name="lhs_rhs_hand_89",
        kernel=lhs_rhs_hand_89,
        args=(spec((S, S), "bfloat16"), spec((S, S), "bfloat16")),
        measurement=Measurement(
            244.2, "profile", "trn2",
            f"{REPO} 0b6f309, kernel_library/matmul/lhs_rhs/kernel_handtuned_89.26mfu.py; README.md table row "
            "matmul/lhs_rhs", "2026-04",
            note="lhs @ rhs; README: 'best single 89.47% (0.2442 ms)', 10-rep mean 89.26% MFU (sd 0.05 pp; "
                 "0.2442 x 89.47/89.26 = 0.2448 ms); compiler baseline 83.84%, which transposes on TensorE "
                 "instead of by DMA."),
        differs=_DIFFERS,
        scheduled=False,  # compiled with enable-instruction-scheduling=false: it ran in program order
    ),
]
