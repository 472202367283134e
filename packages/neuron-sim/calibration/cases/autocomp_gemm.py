"""Autocomp's GEMM optimization trace on trn1: bf16 lhsT [8192, 4096] @ rhs [8192, 8192] on one NeuronCore, six
kernels of one chain of LLM-proposed rewrites (grouping N tiles, then M tiles, then fusing loads).

Published by UC Berkeley's Autocomp (ucb-bar/autocomp, commit 18068cf, Nov 2025; unchanged at HEAD dd26a56):
``examples/trn-tutorial/2_gemm_trace.py`` is the chain of ``CodeCandidate`` objects, each with its kernel source
and its ``score``. ``1_gemm_trace.py`` (added later, 88b65cd) holds the same chain with text corrupted in
places; ``2_gemm_trace.py`` is the clean copy. The harness ``harnesses/trn-tutorial-nki1/2_gemm_test.py`` times
each candidate with ``nki.benchmark(warmup=2, iters=10)`` and reports the p99 of ``nc_latency`` in ms; the blog
(charleshong3.github.io/blog/autocomp_trainium.html, Nov 2025) names a trn1.2xlarge.

The kernels are legacy NKI (``neuronxcc.nki``) compiled by the late-2025 toolchain, so loads and stores go
through ``CURRENT``. step0 is the NKI tutorial's tiled kernel (NKI_EXAMPLE_18, the same code as
``nki_matmul_tutorial.tiled``); the SDK docs measured it at 51.80 ms with the 2024 toolchain (warmup 5), Autocomp
at 20.99 ms with this one: the toolchain, not the kernel, moved by 2.5x. Tiles are 128 (K, partitions) x 128
(M, stationary) x 512 (N, moving); no tail code runs at this shape (32 M tiles, 16 N tiles), so it is left out.
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import CURRENT, spec

TOOLCHAIN = CURRENT  # neuronxcc of Nov 2025
TM, TK, TN = 128, 128, 512
SOURCE = "ucb-bar/autocomp 18068cf, examples/trn-tutorial/2_gemm_trace.py"


def _acc():
    """``nl.zeros((128, 512), float32, buffer=psum)`` before ``+=`` matmuls: an accumulation group whose first
    matmul overwrites the bank (how the compiler lowers it; no memset, as in the matmul tutorial's cases)."""
    return nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)


def _out(result, acc, m0, n0):
    """``tensor_copy`` / ``nl.copy`` of the accumulator to bf16 in SBUF, then ``nl.store``. The source leaves the
    engine to the compiler until step5 names VectorE; VectorE throughout."""
    sb = nl.ndarray((TM, TN), result.dtype)
    nisa.tensor_copy(sb, acc, engine=nisa.vector_engine)
    TOOLCHAIN.store(result[m0:m0 + TM, n0:n0 + TN], sb)


def _lhs(lhsT, k, m0, width=TM):
    return TOOLCHAIN.load(lhsT[k * TK:(k + 1) * TK, m0:m0 + width])


def _rhs(rhs, k, n0, width=TN):
    return TOOLCHAIN.load(rhs[k * TK:(k + 1) * TK, n0:n0 + width])


def _mm(acc, lhs_tile, rhs_tile):
    nisa.nc_matmul(acc, lhs_tile, rhs_tile)


def _shapes(lhsT, rhs):
    K, M = lhsT.shape
    N = rhs.shape[1]
    return K, M, N, nl.ndarray((M, N), lhsT.dtype, buffer=nl.hbm)


@nk.kernel
def step0_tiled(lhsT, rhs):
    """score 20.99: every (m, n, k) loads its lhsT [128, 128] and rhs [128, 512] tiles."""
    K, M, N, result = _shapes(lhsT, rhs)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = _acc()
            for k in nl.affine_range(K // TK):
                lhs_t = _lhs(lhsT, k, m * TM)
                rhs_t = _rhs(rhs, k, n * TN)
                _mm(acc, lhs_t, rhs_t)
            _out(result, acc, m * TM, n * TN)
    return result


@nk.kernel
def step1_group_n2(lhsT, rhs):
    """score 28.68: pairs of N tiles share each lhsT tile: per k one lhsT load, then rhs0 load + matmul, rhs1
    load + matmul, into two PSUM accumulators."""
    K, M, N, result = _shapes(lhsT, rhs)
    for m in nl.affine_range(M // TM):
        for bn in nl.affine_range(N // TN // 2):
            n0, n1 = (2 * bn) * TN, (2 * bn + 1) * TN
            acc0, acc1 = _acc(), _acc()
            for k in nl.affine_range(K // TK):
                lhs_t = _lhs(lhsT, k, m * TM)
                r0 = _rhs(rhs, k, n0)
                _mm(acc0, lhs_t, r0)
                r1 = _rhs(rhs, k, n1)
                _mm(acc1, lhs_t, r1)
            _out(result, acc0, m * TM, n0)
            _out(result, acc1, m * TM, n1)
    return result


def _grouped(lhsT, rhs, group_m, lhs_fuse, rhs_fuse, result):
    """Blocks of ``group_m`` M tiles x 2 N tiles, one PSUM accumulator per (M tile, N tile), k innermost. Per k:
    the rhs tiles (two loads, or one [128, 1024] load when ``rhs_fuse``), then the lhsT tiles in loads of
    ``lhs_fuse`` adjacent M tiles, each load followed by its matmuls against both rhs tiles."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    for mg in nl.affine_range(M // TM // group_m):
        ms = [(mg * group_m + i) * TM for i in range(group_m)]
        for bn in nl.affine_range(N // TN // 2):
            n0, n1 = (2 * bn) * TN, (2 * bn + 1) * TN
            accs = [[_acc() for _ in range(2)] for _ in range(group_m)]
            for k in nl.affine_range(K // TK):
                if rhs_fuse:
                    r01 = _rhs(rhs, k, n0, 2 * TN)
                    rs = [r01[:, 0:TN], r01[:, TN:2 * TN]]
                else:
                    rs = [_rhs(rhs, k, n0), _rhs(rhs, k, n1)]
                for g in range(0, group_m, lhs_fuse):
                    blk = _lhs(lhsT, k, ms[g], lhs_fuse * TM)
                    for i in range(lhs_fuse):
                        for j in range(2):
                            _mm(accs[g + i][j], blk[:, i * TM:(i + 1) * TM], rs[j])
            for i in range(group_m):
                for j, n_ in enumerate((n0, n1)):
                    _out(result, accs[i][j], ms[i], n_)
    return result


@nk.kernel
def step2_group_m2(lhsT, rhs):
    """score 11.8: blocks of 2 M x 2 N tiles, four accumulators; per k rhs0, rhs1, then lhs0 and lhs1 loads."""
    *_, result = _shapes(lhsT, rhs)
    return _grouped(lhsT, rhs, 2, 1, False, result)


@nk.kernel
def step3_group_m4(lhsT, rhs):
    """score 8.07: blocks of 4 M x 2 N tiles, eight accumulators (all PSUM banks); four lhsT loads per k."""
    *_, result = _shapes(lhsT, rhs)
    return _grouped(lhsT, rhs, 4, 1, False, result)


@nk.kernel
def step4_fuse_lhs_pairs(lhsT, rhs):
    """score 7.62: step3 with the lhsT tiles loaded in pairs ([128, 256], sliced in SBUF)."""
    *_, result = _shapes(lhsT, rhs)
    return _grouped(lhsT, rhs, 4, 2, False, result)


@nk.kernel
def step5_fuse_supertiles(lhsT, rhs):
    """score 6.96: one rhs [128, 1024] and one lhsT [128, 512] load per k, PSUM copies named on VectorE."""
    *_, result = _shapes(lhsT, rhs)
    return _grouped(lhsT, rhs, 4, 4, True, result)


_DIFFERS = ("PSUM-to-SBUF copies on VectorE where the source leaves the engine to the compiler; queues "
            "are the project's default assignment (no published profile shows them); tiles are placed by the "
            "project's allocator, not neuronxcc's")

_NOTES = {
    "step0_tiled": "same kernel as nki-matmul-tutorial/tiled (51.80 ms with the 2024 toolchain, warmup 5)",
    "step1_group_n2": "slower than step0 on hardware although it issues 25% fewer loads; the trace gives no "
                      "profile to say why",
}


def _case(name, kernel, score_ms, line):
    return Case(
        family="autocomp-gemm",
        name=name,
        kernel=kernel,
        args=(spec((8192, 4096), "bfloat16"), spec((8192, 8192), "bfloat16")),
        measurement=Measurement(
            score_ms * 1e3, "p99", "trn1", f"{SOURCE}, score= at line {line}", "2025-11",
            note="CodeCandidate score = nki.benchmark(warmup=2, iters=10) nc_latency p99 (harness "
                 "harnesses/trn-tutorial-nki1/2_gemm_test.py); trn1.2xlarge per the Autocomp blog. "
                 + _NOTES.get(name, "")),
        differs=_DIFFERS,
    )


CASES = [
    _case("step0_tiled", step0_tiled, 20.99, 54),
    _case("step1_group_n2", step1_group_n2, 28.68, 231),
    _case("step2_group_m2", step2_group_m2, 11.8, 488),
    _case("step3_group_m4", step3_group_m4, 8.07, 761),
    _case("step4_fuse_lhs_pairs", step4_fuse_lhs_pairs, 7.62, 1008),
    _case("step5_fuse_supertiles", step5_fuse_supertiles, 6.96, 1251),
]
