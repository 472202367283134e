"""NKI kernels (tests/nki/nki_kernels.py, written from NKI's documentation) on the simulator, against numpy."""

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nki_kernels import attention, causal_iota, matmul, rmsnorm, softmax, tensor_add, transpose

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl

rng = np.random.default_rng(0)
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 700), dtype=st.sampled_from(DTYPES))
def test_tensor_add(rows, cols, dtype):
    a, b = (rng.standard_normal((rows, cols)).astype(dtype) for _ in range(2))
    out = tensor_add(a, b)
    assert out.dtype == np.dtype(dtype) and out.shape == (rows, cols)
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)  # fp32 math, one rounding to dtype
    np.testing.assert_array_equal(out, want)
    assert tensor_add.last_report.device_ns > 0


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_matmul_accumulates_in_psum(dtype):
    lhs_t = rng.standard_normal((384, 256)).astype(dtype)
    rhs = rng.standard_normal((384, 640)).astype(dtype)
    out = matmul(lhs_t, rhs)
    want = lhs_t.astype(np.float32).T @ rhs.astype(np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    assert matmul.last_report.utilization()["tensor"] > 0


@settings(max_examples=6, deadline=None)
@given(p=st.integers(1, 128), f=st.integers(1, 128), dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16]))
def test_transpose(p, f, dtype):
    x = rng.standard_normal((p, f)).astype(dtype)
    np.testing.assert_array_equal(transpose(x), x.T)


@pytest.mark.parametrize("rows,d", [(128, 256), (200, 96)])
def test_rmsnorm(rows, d):
    x = rng.standard_normal((rows, d)).astype(np.float32)
    gamma = rng.standard_normal((1, d)).astype(np.float32)
    out = rmsnorm(x, gamma, 1e-6)
    want = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows,d", [(128, 512), (130, 33)])
def test_softmax(rows, d):
    x = (rng.standard_normal((rows, d)) * 4).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_iota_and_affine_select():
    x = rng.standard_normal((64, 48)).astype(np.float32)
    out, index = causal_iota(x)
    p, f = np.indices(x.shape)
    np.testing.assert_array_equal(out, np.where(p >= f, x, -1.0).astype(np.float32))
    np.testing.assert_array_equal(index, 7 + p * 48 + f)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(130, 70, dtype=dtype), torch.randn(130, 70, dtype=dtype)
        out = tensor_add(a, b)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
        torch.testing.assert_close(out, (a.float() + b.float()).to(dtype), rtol=0, atol=0)


def test_simulate_benchmark_and_trace(tmp_path):
    x = rng.standard_normal((128, 256)).astype(np.float32)
    trace = tmp_path / "trace.json"
    sim = nki.simulate(tensor_add, trace_path=str(trace))
    np.testing.assert_array_equal(sim(x, x), x + x)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    bench = nki.benchmark(warmup=1, iters=3, save_trace_name=str(tmp_path / "bench.json"))(tensor_add)
    np.testing.assert_array_equal(bench(x, x), x + x)
    lat = bench.benchmark_result.nc_latency
    assert lat.get_latency_percentile(50) == pytest.approx(bench.kernel.last_report.device_ns / 1e3)
    assert lat.get_latency_percentile(0) <= lat.get_latency_percentile(99)
    assert (tmp_path / "bench.json").exists()


def test_unreturned_hbm_tensor_is_scratch_not_output():
    @nki.jit
    def via_scratch(a):
        tmp = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)  # hbm is private_hbm: not returned, so scratch
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tmp, src=a)
        nisa.dma_copy(dst=t, src=tmp)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(via_scratch(a), a)
    assert [arg.role for arg in via_scratch.program(a).args] == ["in", "scratch", "out"]


def test_partition_and_capacity_errors_name_the_tile_and_limit():
    @nki.jit
    def too_many_partitions(a):
        t = nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        return a

    with pytest.raises(KernelError, match=r"129 partitions; the partition limit is 128"):
        too_many_partitions(np.zeros((4, 4), np.float32))

    @nki.jit
    def too_big(a):
        t = nl.ndarray((128, 1 << 20), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        return a

    with pytest.raises(KernelError, match=r"\[128, 1048576\].*needs 4194304 bytes per partition; SBUF has"):
        too_big(np.zeros((4, 4), np.float32))


def test_tensor_views_ap_permute_broadcast_bitcast():
    @nki.jit
    def views(a, b):
        rows, cols = a.shape  # a [16, 32] fp32; b [1, 8] int32
        out = nl.ndarray((rows, cols // 2), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        half = nl.ndarray((rows, cols // 2), dtype=a.dtype, buffer=nl.sbuf)
        # the docs' example: the right half of every partition, by an access pattern
        nisa.tensor_copy(dst=half, src=t.ap(pattern=[[cols, rows], [1, cols // 2]], offset=cols // 2))
        nisa.dma_copy(dst=out, src=half)
        tr = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=tr.permute(1, 0), src=t)  # a strided HBM write: out[f, p] = t[p, f]
        bits = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        bt = nl.ndarray((4, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt.expand_dim(1), src=b.broadcast(0, 4).expand_dim(1))
        nisa.dma_copy(dst=bits, src=bt.view(nl.float32))
        return out, tr, bits

    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.integers(0, 1 << 30, (1, 8)).astype(np.int32)
    out, tr, bits = views(a, b)
    np.testing.assert_array_equal(out, a[:, 16:])
    np.testing.assert_array_equal(tr, a.T)
    np.testing.assert_array_equal(bits, np.repeat(b, 4, axis=0).view(np.float32))


def test_ap_rejects_strided_partitions_and_on_chip_views():
    @nki.jit
    def every_other_partition(a):
        t = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        t.ap(pattern=[[64, 8], [1, 32]], offset=0)
        return a

    with pytest.raises(KernelError, match="partition step 64 must be the partition size 32"):
        every_other_partition(np.zeros((2, 2), np.float32))

    @nki.jit
    def nested(a):
        t = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        t.ap(pattern=[[256, 128], [1, 256]]).ap(pattern=[[256, 64], [1, 64]])
        return a

    with pytest.raises(NotImplementedError, match=r"\.ap\(\) of a slice or view of an on-chip tile"):
        nested(np.zeros((2, 2), np.float32))


@settings(max_examples=8, deadline=None)
@given(p=st.integers(1, 128), shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       n_axes=st.integers(1, 3), op=st.sampled_from(["add", "maximum", "minimum"]), negate=st.booleans(),
       keepdims=st.booleans())
def test_tensor_reduce_last_axes(p, shape, n_axes, op, negate, keepdims):
    n_axes = min(n_axes, len(shape))
    full = (p, *shape)
    axes = tuple(range(len(full) - n_axes, len(full)))
    kept = full[:len(full) - n_axes]
    dst_shape = kept + (1,) * n_axes if keepdims else (kept if len(kept) > 1 else (p, 1))

    @nki.jit
    def reduce(x):
        out = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(full, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=getattr(nl, op), data=t, axis=axes if n_axes > 1 else axes[0], negate=negate,
                           keepdims=keepdims)
        nisa.dma_copy(dst=out, src=r)
        return out

    x = rng.standard_normal(full).astype(np.float32)
    want = {"add": np.sum, "maximum": np.max, "minimum": np.min}[op](x.astype(np.float64), axis=axes)
    want = (-want if negate else want).reshape(dst_shape)
    np.testing.assert_allclose(reduce(x), want, rtol=1e-5, atol=1e-5)


def test_tensor_reduce_rejects_leading_axes():
    @nki.jit
    def bad(x):
        t = nl.ndarray((4, 3, 5), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((4, 5), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=1)
        return x

    with pytest.raises(KernelError, match=r"axis 1 must be the last free dims"):
        bad(np.zeros((2, 2), np.float32))


@settings(max_examples=6, deadline=None)
@given(p=st.integers(1, 128), nums=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       steps=st.lists(st.integers(-5, 5), min_size=3, max_size=3), offset=st.integers(-50, 50),
       cm=st.integers(-3, 3))
def test_iota_multi_dim_pattern(p, nums, steps, offset, cm):
    pattern = [[s, n] for s, n in zip(steps, nums)]
    f = int(np.prod(nums))

    @nki.jit
    def gen(x):
        out = nl.ndarray((p, f), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((p, f), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=pattern, offset=offset, channel_multiplier=cm)
        nisa.dma_copy(dst=out, src=t)
        return out

    idx = np.indices((p, *nums))
    want = offset + cm * idx[0] + sum(s * i for s, i in zip(steps, idx[1:]))
    np.testing.assert_array_equal(gen(np.zeros((1, 1), np.float32)), want.reshape(p, f))


def test_partition_reduce_scan_stats_and_activation_scale_vector():
    @nki.jit
    def misc(x):
        p, f = x.shape
        t = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        col_sum = nl.ndarray((1, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=col_sum, op=nl.add, data=t)
        ones = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        scan = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)  # running sum along the free dim
        nisa.tensor_tensor_scan(dst=scan, data0=ones, data1=t, initial=0.0, op0=nl.multiply, op1=nl.add)
        stats = nl.ndarray((p, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=stats, data=t)
        mv = nl.ndarray((p, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        scaled = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)  # t * mean + 0.5, per partition scale
        nisa.activation(dst=scaled, op=nl.copy, data=t, scale=mv[:, 0:1], bias=0.5)
        outs = []
        for tile_, shape in ((col_sum, (1, f)), (scan, (p, f)), (mv, (p, 2)), (scaled, (p, f))):
            o = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=tile_)
            outs.append(o)
        return tuple(outs)

    x = rng.standard_normal((96, 40)).astype(np.float32)
    col_sum, scan, mv, scaled = misc(x)
    np.testing.assert_allclose(col_sum, x.sum(axis=0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scan, np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mv, np.stack([x.mean(1), x.var(1)], axis=1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(scaled, x * x.mean(1, keepdims=True) + 0.5, rtol=1e-5, atol=1e-6)


def test_language_tile_functions():
    @nki.jit
    def fused(a, b):
        p, f = a.shape
        out = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
        ta = nl.ndarray((p, f), dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((p, 1), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a)
        nisa.dma_copy(dst=tb, src=b)
        y = nl.multiply(nl.exp(ta), tb)                  # [P, F] * a [P, 1] column
        y = nl.maximum(nl.subtract(2.0, y), nl.full((p, f), 0.25, dtype=nl.float32))
        nisa.dma_copy(dst=out, src=nl.copy(y))
        return out

    a = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal((40, 1)).astype(np.float32)
    np.testing.assert_allclose(fused(a, b), np.maximum(2.0 - np.exp(a) * b, 0.25), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_attention(causal, dtype):
    q, k, v = (rng.standard_normal((128, 64)).astype(dtype) for _ in range(3))
    out = attention(q, k, v, causal)
    qf, kf, vf = (t.astype(np.float64) for t in (q, k, v))
    s = qf @ kf.T / 8.0
    if causal:
        s = np.where(np.tril(np.ones_like(s, bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = p / p.sum(axis=1, keepdims=True) @ vf
    tol = 1e-4 if dtype == np.float32 else 3e-2
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol)
    util = attention.last_report.utilization()
    assert all(util[e] > 0 for e in ("tensor", "vector", "scalar")) and (util["gpsimd"] > 0) == causal


def test_in_place_kernel_writes_back_to_torch_inputs():
    torch = pytest.importorskip("torch")

    @nki.jit
    def double_in_place(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=a, src=t)

    base = torch.randn(8, 12)
    for a in (base.clone(), base.t().contiguous().t(), base.to(torch.bfloat16)):  # a view, a strided copy, bf16
        want = (a.float() * 2).to(a.dtype)
        assert double_in_place(a) is None
        torch.testing.assert_close(a, want, rtol=0, atol=0)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    want = x * 2
    double_in_place(x)
    np.testing.assert_array_equal(x, want)


def test_tile_size_and_nc_version_outside_a_kernel():
    from neuron_hal import get_profile

    prof = get_profile()
    assert nl.tile_size.pmax == prof.pmax == 128
    assert nl.tile_size.total_available_sbuf_size == prof.sbuf_partition_bytes
    assert nisa.get_nc_version().value == prof.nc_version
    with pytest.raises(NotImplementedError, match="sbuf_min_align"):
        getattr(nl.tile_size, "sbuf_min_align")  # noqa: B009 (the attribute read is the test)


def test_float_bias_is_one_constant_column_per_value():
    @nki.jit
    def biased(a):
        p, f = a.shape
        out = nl.ndarray((p, f), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((p, f), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.activation(dst=t, op=nl.copy, data=t, bias=1.5)
        nisa.activation(dst=t[32:64, :], op=nl.copy, data=t[32:64, :], bias=1.5)  # partitions 32..63 again
        nisa.activation(dst=t, op=nl.relu, data=t, bias=0.0, scale=-1.0)  # a zero bias is no bias
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rng.standard_normal((64, 16)).astype(np.float32)
    want = a + 1.5
    want[32:64] += 1.5
    np.testing.assert_allclose(biased(a), np.maximum(-want, 0.0), rtol=1e-6, atol=1e-6)
    memsets = [i for i in biased.program(a).instructions if type(i).__name__ == "Memset"]
    assert len(memsets) == 1
