"""The NKI LayerNorm tutorial's two kernels on one trn1 NeuronCore, fp32: v1 written with ``nki.language`` ops
(mean, mean of squares, shift and scale as separate passes), v2 with ``nki.isa`` (bn_stats / bn_aggr for mean and
variance, one two-op tensor_scalar for the shift and scale). Both then multiply by gamma and add beta, broadcast
once from [1, N] rows to 128 partitions.

Published in the Neuron SDK docs 2.20-2.26, ``general/nki/tutorials/layernorm.rst`` lines 111-137 (identical
from ce3668bf / v2.20, Sep 2024, to release 2.26, commit 0521004c): neuron-bench ``NCLatency`` percentiles of
``nki.benchmark`` (defaults: warmup 10, iters 100), v1 p50 2311 us, v2 p50 1969 us. Kernels:
``general/nki/examples/layernorm/layernorm_nki_kernel.py`` at 0521004c (``nki_layernorm_kernel_v1``
NKI_EXAMPLE_45 lines 18-68, ``nki_layernorm_kernel_v2`` NKI_EXAMPLE_46 lines 71-140). Inputs fp32 (the script's
``np.random.rand(...).astype(np.float32)``), epsilon 1e-5.

The shape: line 111 says "an input tensor of (300, 1000)", but the script's perf mode runs its defaults
``--nrows 4096 --ncols 8192`` (lines 147-154; the usage example, rst lines 192-193, repeats them), and only that
shape fits the numbers: (300, 1000) is 3 tiles of 1000 columns, tens of microseconds, while 4096 x 8192 moves 256
MiB through HBM and makes 32 VectorE passes of [128, 8192]. The cases use 4096 x 8192.

What the source leaves to the compiler, chosen as the tutorial's cost discussion (lines 100-109) counts it:
``nl.mean`` is a VectorE free-axis sum (N cycles) and a [128, 1] multiply by 1/N; ``nl.square`` runs on ScalarE
(N ScalarE cycles); ``nl.rsqrt`` is a ScalarE activation on [128, 1]; ``x - mean`` and ``* rsqrt`` are two VectorE
tensor_scalar passes (N each), the [128, 1] arithmetic (mean*mean, the subtraction, + epsilon) VectorE ops. The
gamma / beta partition broadcasts are TensorE ones-matmuls, the way the same compiler ran the fused-Mamba
tutorial's broadcasts (see ``fused_mamba_tutorial``: per 512 columns a ones-matmul into PSUM and a ScalarE copy
into an SBUF [128, N] tile), done once before the row loop as the source hoists them. Loads and stores go
through ``LEGACY_2024``.
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import LEGACY_2024, spec
from .fused_mamba_tutorial import broadcast_row, ones_row

TOOLCHAIN = LEGACY_2024  # published Sep 2024 (Neuron 2.20)
F32 = nl.float32
P = 128
EPS = 1e-5
SOURCE = ("Neuron SDK 2.26 docs (aws-neuron-sdk 0521004c, = v2.26.0; unchanged since ce3668bf / v2.20), "
          "general/nki/tutorials/layernorm.rst lines 111-137")


def _params(gamma, beta):
    """gamma and beta loaded as [1, N] rows and broadcast to [128, N] once (reused by every row tile)."""
    n = gamma.shape[0]
    ones = ones_row()
    g_row = TOOLCHAIN.load(gamma.reshape(1, n))
    b_row = TOOLCHAIN.load(beta.reshape(1, n))
    return broadcast_row(ones, g_row), broadcast_row(ones, b_row)


def _col(shape=(P, 1)):
    return nl.ndarray(shape, F32)


def _affine(shifted, gamma_b, beta_b):
    """``shift_scale * gamma + beta``: two VectorE tensor_tensor passes over [128, N]."""
    scaled = nl.ndarray(shifted.shape, F32, name="scaled")
    nisa.tensor_tensor(scaled, shifted, gamma_b, nl.multiply)
    out = nl.ndarray(shifted.shape, F32, name="out_sb")
    nisa.tensor_tensor(out, scaled, beta_b, nl.add)
    return out


def _rstd(var):
    """``nl.rsqrt(var + epsilon)``: a [128, 1] VectorE add, then ScalarE rsqrt."""
    v = _col()
    nisa.tensor_scalar(v, var, nl.add, EPS)
    r = _col()
    nisa.activation(r, nl.rsqrt, v)
    return r


def _mean(x):
    """``nl.mean(x, axis=1)``: VectorE sum over the free axis, then * 1/N on the [128, 1] result."""
    s = _col()
    nisa.tensor_reduce(s, x, nl.add, axis=1)
    m = _col()
    nisa.tensor_scalar(m, s, nl.multiply, 1.0 / x.shape[1])
    return m


@nk.kernel
def layernorm_v1(x, gamma, beta):
    """NKI_EXAMPLE_45: per 128-row tile, mean, mean of squares minus mean squared, (x - mean) * rsqrt(var + eps),
    then * gamma + beta and the store."""
    rows, n = x.shape
    out = nl.ndarray((rows, n), x.dtype, buffer=nl.hbm)
    gamma_b, beta_b = _params(gamma, beta)
    for i in nl.affine_range(nl.cdiv(rows, P)):  # 4096 rows: every tile is full, the source's masks are no-ops
        r = nl.ds(i * P, P)
        x_sb = TOOLCHAIN.load(x[r, :], name="x_sb")
        mean = _mean(x_sb)
        sq = nl.ndarray((P, n), F32, name="square")
        nisa.activation(sq, nl.square, x_sb)
        mean_sq = _mean(sq)
        mean2 = _col()
        nisa.tensor_tensor(mean2, mean, mean, nl.multiply)
        var = _col()
        nisa.tensor_tensor(var, mean_sq, mean2, nl.subtract)
        rstd = _rstd(var)
        centered = nl.ndarray((P, n), F32, name="centered")
        nisa.tensor_scalar(centered, x_sb, nl.subtract, mean)
        shifted = nl.ndarray((P, n), F32, name="shift_scale")
        nisa.tensor_scalar(shifted, centered, nl.multiply, rstd)
        TOOLCHAIN.store(out[r, :], _affine(shifted, gamma_b, beta_b))
    return out


@nk.kernel
def layernorm_v2(x, gamma, beta):
    """NKI_EXAMPLE_46: per 128-row tile, bn_stats over each 512-column chunk into one [128, 6 * chunks] record,
    bn_aggr to mean and variance, rsqrt(var + eps), one tensor_scalar (x - mean) * rstd, then * gamma + beta."""
    rows, n = x.shape
    out = nl.ndarray((rows, n), x.dtype, buffer=nl.hbm)
    gamma_b, beta_b = _params(gamma, beta)
    fmax = nl.tile_size.bn_stats_fmax
    chunks = nl.cdiv(n, fmax)
    for i in nl.affine_range(nl.cdiv(rows, P)):
        r = nl.ds(i * P, P)
        x_sb = TOOLCHAIN.load(x[r, :], name="x_sb")
        stats = nl.ndarray((P, 6 * chunks), F32, name="stats")
        for j in nl.affine_range(chunks):
            w = min(fmax, n - j * fmax)
            nisa.bn_stats(stats[:, 6 * j:6 * j + 6], x_sb[:, j * fmax:j * fmax + w])
        mean_var = _col((P, 2))
        nisa.bn_aggr(mean_var, stats)
        rstd = _rstd(mean_var[:, 1:2])
        shifted = nl.ndarray((P, n), F32, name="shift_scale")
        nisa.tensor_scalar(shifted, x_sb, nl.subtract, mean_var[:, 0:1], op1=nl.multiply, operand1=rstd)
        TOOLCHAIN.store(out[r, :], _affine(shifted, gamma_b, beta_b))
    return out


ROWS, COLS = 4096, 8192
ARGS = (spec((ROWS, COLS), "float32"), spec((COLS,), "float32"), spec((COLS,), "float32"))
NOTE = ("p50 of neuron-bench NCLatency (nki.benchmark defaults: warmup 10, iters 100; p0-p100 {pct}). The text "
        "says the input is (300, 1000); the numbers fit only the script's default 4096 x 8192 (see the module "
        "docstring), used here. Its '14.9 % improvement' is 1 - 1963/2306 (p0); p50 gives 14.8 %")
DIFFERS = ("gamma/beta broadcasts as TensorE ones-matmuls + ScalarE copies (no profile of this tutorial shows how "
           "neuronxcc did them; the fused-Mamba tutorial's profiles of the same toolchain do), with a [1, 128] ones "
           "stationary memset once; tiles placed by the project's allocator, not neuronxcc's")
V1_DIFFERS = (DIFFERS + "; nl.mean's divide by N is a separate [128, 1] multiply. The tutorial counts v1's variance "
              "as N ScalarE + 2N VectorE cycles; the source's ops give N ScalarE (square) + N VectorE (the mean of "
              "squares) + [128, 1] ops, and no instruction in it accounts for the second N")


def _case(name, kernel, p50, pct, differs):
    return Case(
        family="layernorm-tutorial", name=name, kernel=kernel, args=ARGS,
        measurement=Measurement(float(p50), "p50", "trn1", SOURCE, "2024-09", includes_launch=True,
                                note=NOTE.format(pct=pct)),
        differs=differs,
    )


CASES = [
    _case("v1_language", layernorm_v1, 2311, "2306/2306/2308/2309/2311/2313/2314/2314 us", V1_DIFFERS),
    _case("v2_isa", layernorm_v2, 1969, "1963/1963/1965/1966/1969/1972/1974/1975 us", DIFFERS),
]
