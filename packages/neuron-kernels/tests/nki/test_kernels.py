"""NKI kernels (tests/nki/nki_kernels.py, written from NKI's documentation) on the simulator, against numpy."""

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nki_kernels import causal_iota, matmul, rmsnorm, softmax, tensor_add, transpose

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


def test_grids_raise_not_implemented():
    with pytest.raises(NotImplementedError, match=r"kernel\[2\]"):
        tensor_add[2]
    assert tensor_add[1] is tensor_add
