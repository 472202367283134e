"""The kernel language: tracing, allocation, errors, and running kernels on numpy through the HAL."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels as nk
from neuron_hal import TRN2, Space, isa
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

SETTINGS = settings(max_examples=20, deadline=None)


@nk.kernel
def add_rows(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.hbm)
    p = nl.tile_size.pmax
    for i in nl.affine_range(nl.cdiv(a.shape[0], p)):
        rows = nl.ds(i * p, min(p, a.shape[0] - i * p))
        nl.store(out[rows, :], nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
    return out


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 700), st.sampled_from([np.float32, ml_dtypes.bfloat16]))
def test_elementwise_kernel_any_shape(rows, cols, dtype):
    rng = np.random.default_rng(rows * cols)
    a = rng.standard_normal((rows, cols)).astype(dtype)
    b = rng.standard_normal((rows, cols)).astype(dtype)
    out = add_rows(a, b)
    ref = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(out.astype(np.float32), ref.astype(np.float32))
    assert add_rows.last_report.device_ns > 0


@nk.kernel
def matmul_t(lhsT, rhs):
    k, m = lhsT.shape
    n = rhs.shape[1]
    out = nl.ndarray((m, n), nl.float32, buffer=nl.hbm)
    tk, tm, tn = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    for mi in nl.affine_range(nl.cdiv(m, tm)):
        ms = nl.ds(mi * tm, min(tm, m - mi * tm))
        for ni in nl.affine_range(nl.cdiv(n, tn)):
            ns = nl.ds(ni * tn, min(tn, n - ni * tn))
            acc = nl.ndarray((ms.size, ns.size), nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(nl.cdiv(k, tk)):
                ks = nl.ds(ki * tk, min(tk, k - ki * tk))
                nisa.nc_matmul(acc, nl.load(lhsT[ks, ms]), nl.load(rhs[ks, ns]))
            nl.store(out[ms, ns], nl.copy(acc))
    return out


@SETTINGS
@given(st.integers(1, 260), st.integers(1, 600), st.integers(1, 300))
def test_matmul_kernel_partial_tiles(m, n, k):
    rng = np.random.default_rng(m + n + k)
    lhsT = rng.standard_normal((k, m)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    out = matmul_t(lhsT, rhs)
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_first_matmul_overwrites_then_accumulates():
    prog = matmul_t.trace(TensorSpec((256, 128), nl.bfloat16), TensorSpec((256, 512), nl.bfloat16))
    flags = [i.accumulate for i in prog.instructions if isinstance(i, isa.Matmul)]
    assert flags == [False, True]


def test_trace_is_cached_per_signature():
    a = TensorSpec((128, 64), nl.float32)
    assert add_rows.trace(a, a) is add_rows.trace(a, a)
    b = TensorSpec((128, 65), nl.float32)
    assert add_rows.trace(a, a) is not add_rows.trace(b, b)
    assert add_rows.trace(a, a, profile="trn3") is not add_rows.trace(a, a)


def test_a_kernel_keeps_the_programs_of_its_most_recent_signatures():
    from neuron_kernels.jit import PROGRAMS_PER_KERNEL

    specs = [TensorSpec((128, 8 + i), nl.float32) for i in range(PROGRAMS_PER_KERNEL + 3)]
    first = add_rows.trace(specs[0], specs[0])
    for s in specs[1:]:
        add_rows.trace(s, s)
    assert len(add_rows._programs) == PROGRAMS_PER_KERNEL  # bounded, whatever the shapes seen
    assert add_rows.trace(specs[-1], specs[-1]) is add_rows.trace(specs[-1], specs[-1])
    again = add_rows.trace(specs[0], specs[0])  # evicted: traced again, the same program
    assert again is not first and again.digest == first.digest


def test_loop_tiles_rotate_through_free_space():
    prog = add_rows.trace(TensorSpec((1024, 512), nl.float32), TensorSpec((1024, 512), nl.float32))
    loads = [i.dst.offset for i in prog.instructions if isinstance(i, isa.DmaCopy) and i.dst.space is Space.SBUF]
    assert len(set(loads)) == len(loads)  # 16 loads of 2 KiB each: every one gets fresh space


@nk.kernel
def ring(a, bufs):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.hbm)
    for i in nl.affine_range(a.shape[0] // 128):
        t = nl.ndarray((128, a.shape[1]), a.dtype, bufs=bufs)
        nisa.dma_copy(t, a[i * 128:(i + 1) * 128])
        nl.store(out[i * 128:(i + 1) * 128], t)
    return out


def test_bufs_bounds_the_rotation():
    spec = TensorSpec((1024, 64), nl.float32)
    offsets = {i.dst.offset for i in ring.trace(spec, 2).instructions if i.dst.space is Space.SBUF}
    assert len(offsets) == 2
    x = np.arange(1024 * 64, dtype=np.float32).reshape(1024, 64)
    np.testing.assert_array_equal(ring(x, 2), x)


def test_partition_limit_error_names_kernel_line_tile_and_limit():
    @nk.kernel
    def too_tall(a):
        t = nl.ndarray((129, 4), nl.float32)  # the offending line
        nl.store(a[0:129], t)

    with pytest.raises(KernelError, match=r"kernel 'too_tall' at test_language.py:\d+: tile of shape \[129, 4\] "
                                          r"has 129 partitions; the partition limit is 128"):
        too_tall.trace(TensorSpec((129, 4), nl.float32))


def test_sbuf_overflow_is_a_trace_error():
    @nk.kernel
    def hog(a):
        tiles = [nl.load(a) for _ in range(8)]
        for t in tiles:
            nl.store(a, t)

    cols = TRN2.sbuf_partition_bytes // 4 // 6
    with pytest.raises(KernelError, match=r"kernel 'hog': SBUF overflow at test_language.py:\d+: tile t\d+ needs"):
        hog.trace(TensorSpec((128, cols), nl.float32))


def test_hardware_rule_errors_point_at_the_kernel_source():
    @nk.kernel
    def wide(a):
        acc = nl.ndarray((128, 1024), nl.float32, buffer=nl.psum)
        t = nl.load(a)
        nisa.nc_matmul(acc, t[:, 0:128], t)  # moving free size 1024 > 512
        return None

    with pytest.raises(KernelError, match=r"kernel 'wide' at test_language.py:\d+: \[moving free size\]"):
        wide.trace(TensorSpec((128, 1024), nl.bfloat16))


def test_inputs_written_by_the_kernel_are_inout():
    @nk.kernel
    def double(a):
        t = nl.load(a)
        nl.store(a, nl.multiply(t, 2.0))

    x = np.ones((128, 8), np.float32)
    double(x)
    np.testing.assert_array_equal(x, 2.0)
    assert double.trace(x).args[0].role == "inout"


def test_reduce_and_activation_conveniences():
    @nk.kernel
    def softmax_rows(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.hbm)
        t = nl.load(a)
        mx = nl.max(t, axis=1)
        shifted = nl.subtract(t, mx)
        e = nl.exp(shifted)
        s = nl.sum(e, axis=1)
        nl.store(out, nl.multiply(e, nl.reciprocal(s)))
        return out

    x = np.random.default_rng(0).standard_normal((100, 37)).astype(np.float32)
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(softmax_rows(x), ref, rtol=1e-6, atol=1e-7)


def test_language_calls_outside_a_trace():
    with pytest.raises(KernelError, match="only valid while a kernel is being traced"):
        nl.ndarray((128, 4), nl.float32)
