"""The NKI matrix-multiplication tutorial's four kernels: bf16 [4096, 8192] @ [8192, 8192] on one trn1
NeuronCore, each a step of the same optimization (tiling, hoisted loads, blocked free dimensions, blocking
all three dimensions).

Published in the Neuron SDK docs 2.20-2.26, ``general/nki/tutorials/matrix_multiplication.rst`` (the latency
table, lines 338-348 at release 2.26, commit 0521004c; removed in the 2.27 rewrite): p99 of ``nki.benchmark``
(warmup 5, iters 10) on a Trn1.32xlarge. Kernel sources: ``general/nki/examples/matrix_multiplication/
matrix_multiplication_nki_kernels.py`` (NKI_EXAMPLE_18-21). The inputs arrive transposed: lhsT [K, M], rhs
[K, N]; tiles are 128 (K, partitions) x 128 (M, stationary) x 512 (N, moving).
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import LEGACY_2024, spec

TOOLCHAIN = LEGACY_2024  # published Sep 2024 (Neuron 2.20)
TM, TK, TN = 128, 128, 512
SOURCE = ("Neuron SDK 2.26 docs (aws-neuron-sdk 0521004c), general/nki/tutorials/matrix_multiplication.rst, "
          "latency table lines 338-348")


def _psum_tile():
    """``nl.zeros((128, 512), float32, buffer=psum)`` then ``+=`` matmuls: the first matmul into the tile
    overwrites it, the rest accumulate (how the compiler lowers a zeroed PSUM accumulator; no memset)."""
    return nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)


def _evacuate(result, res_psum, rows, cols):
    res_sb = nl.copy(res_psum, dtype=result.dtype)
    TOOLCHAIN.store(result[rows, cols], res_sb)


@nk.kernel
def tiled(lhsT, rhs):
    """NKI_EXAMPLE_18: every (m, n, k) step loads its lhsT [128, 128] and rhs [128, 512] tiles."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    result = nl.ndarray((M, N), lhsT.dtype, buffer=nl.hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            res_psum = _psum_tile()
            for k in nl.affine_range(K // TK):
                lhsT_tile = TOOLCHAIN.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                rhs_tile = TOOLCHAIN.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(res_psum, lhsT_tile, rhs_tile)
            _evacuate(result, res_psum, nl.ds(m * TM, TM), nl.ds(n * TN, TN))
    return result


@nk.kernel
def hoist_load(lhsT, rhs):
    """NKI_EXAMPLE_19: an m-row of lhsT tiles loaded once per m; the rhs column of tiles once per (m, n)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    result = nl.ndarray((M, N), lhsT.dtype, buffer=nl.hbm)
    for m in nl.affine_range(M // TM):
        lhsT_tiles = [TOOLCHAIN.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM]) for k in range(K // TK)]
        for n in nl.affine_range(N // TN):
            rhs_tiles = [TOOLCHAIN.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN]) for k in range(K // TK)]
            res_psum = _psum_tile()
            for k in nl.affine_range(K // TK):
                nisa.nc_matmul(res_psum, lhsT_tiles[k], rhs_tiles[k])
            _evacuate(result, res_psum, nl.ds(m * TM, TM), nl.ds(n * TN, TN))
    return result


@nk.kernel
def block_free_dimension(lhsT, rhs, tiles_m=2, tiles_n=2):
    """NKI_EXAMPLE_20: blocks of 2 M-tiles x 2 N-tiles share their loads."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    result = nl.ndarray((M, N), lhsT.dtype, buffer=nl.hbm)
    for m in nl.affine_range(M // (TM * tiles_m)):
        lhsT_tiles = [[TOOLCHAIN.load(lhsT[k * TK:(k + 1) * TK, nl.ds((m * tiles_m + bm) * TM, TM)])
                       for k in range(K // TK)] for bm in range(tiles_m)]
        for n in nl.affine_range(N // (TN * tiles_n)):
            rhs_tiles = [[TOOLCHAIN.load(rhs[k * TK:(k + 1) * TK, nl.ds((n * tiles_n + bn) * TN, TN)])
                          for k in range(K // TK)] for bn in range(tiles_n)]
            for bm in nl.affine_range(tiles_m):
                for bn in nl.affine_range(tiles_n):
                    res_psum = _psum_tile()
                    for k in nl.affine_range(K // TK):
                        nisa.nc_matmul(res_psum, lhsT_tiles[bm][k], rhs_tiles[bn][k])
                    _evacuate(result, res_psum, nl.ds((m * tiles_m + bm) * TM, TM), nl.ds((n * tiles_n + bn) * TN, TN))
    return result


@nk.kernel
def fully_optimized(lhsT, rhs, tiles_m=16, tiles_n=2, tiles_k=8):
    """NKI_EXAMPLE_21: blocks of 16 x 2 x 8 tiles; per N-block a bf16 SBUF result accumulates every K-block's
    PSUM tiles (VectorE adds), then packs pairs of tiles into [128, 1024] rows for the store."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    bm_, bn_, bk_ = TM * tiles_m, TN * tiles_n, TK * tiles_k
    result = nl.ndarray((M, N), lhsT.dtype, buffer=nl.hbm)
    for n in nl.affine_range(N // bn_):
        result_tiles = {}
        for m in range(M // bm_):
            for bm in range(tiles_m):
                for bn in range(tiles_n):
                    result_tiles[m, bm, bn] = nl.zeros((TM, TN), lhsT.dtype)
        for k in nl.sequential_range(K // bk_):
            rhs_tiles = [TOOLCHAIN.load(rhs[nl.ds((tiles_k * k + bk) * TK, TK), nl.ds(bn_ * n, bn_)])
                         for bk in range(tiles_k)]
            for m in nl.affine_range(M // bm_):
                lhsT_tiles = [TOOLCHAIN.load(lhsT[nl.ds((tiles_k * k + bk) * TK, TK), nl.ds(bm_ * m, bm_)])
                              for bk in range(tiles_k)]
                for bn in nl.affine_range(tiles_n):
                    for bm in nl.affine_range(tiles_m):
                        res_tile = _psum_tile()
                        for bk in nl.affine_range(tiles_k):
                            nisa.nc_matmul(res_tile, lhsT_tiles[bk][:, nl.ds(bm * TM, TM)],
                                           rhs_tiles[bk][:, nl.ds(bn * TN, TN)])
                        acc = result_tiles[m, bm, bn]
                        nisa.tensor_tensor(acc, acc, res_tile, nl.add)
        for m in nl.affine_range(M // bm_):
            for bm in nl.affine_range(tiles_m):
                packed = nl.ndarray((TM, bn_), lhsT.dtype)
                for bn in nl.affine_range(tiles_n):
                    nisa.tensor_copy(packed[:, nl.ds(bn * TN, TN)], result_tiles[m, bm, bn])
                TOOLCHAIN.store(result[nl.ds((tiles_m * m + bm) * TM, TM), nl.ds(bn_ * n, bn_)], packed)
    return result


def _case(name, kernel, value_ms):
    return Case(
        family="nki-matmul-tutorial",
        name=name,
        kernel=kernel,
        args=(spec((8192, 4096), "bfloat16"), spec((8192, 8192), "bfloat16")),
        measurement=Measurement(value_ms * 1e3, "p99", "trn1", SOURCE, "2024-09"),
        differs="tiles are placed by the project's allocator, not neuronxcc's",
    )


CASES = [
    _case("tiled", tiled, 51.80),
    _case("hoist_load", hoist_load, 42.96),
    _case("block_free_dimension", block_free_dimension, 22.07),
    _case("fully_optimized", fully_optimized, 6.97),
]
