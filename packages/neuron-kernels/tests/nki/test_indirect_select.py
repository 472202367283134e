"""The NKI forms the lowering (neuron_nrt.lower) emits, written as NKI documents them, against numpy: indirect DMA
gathers/scatters through .ap(vector_offset=, indirect_dim=0), nisa.select_reduce, and the fmod/bypass operators."""

import numpy as np
import pytest

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl

rng = np.random.default_rng(0)


@nki.jit
def gather_rows(data, indices):
    P, F = indices.shape[0], data.shape[1]
    output = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    dst = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=dst, src=data.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0))
    nisa.dma_copy(dst=output, src=dst)
    return output


@nki.jit
def scatter_add_rows(src_data, indices, output):
    P, F = src_data.shape
    src = nl.ndarray((P, F), dtype=src_data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=src_data)
    idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    nisa.dma_copy(dst=output.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0), src=src,
                  dst_rmw_op=nl.add)


def test_gather_rows_is_numpy_take():
    data = rng.standard_normal((50, 24)).astype(np.float32)
    indices = rng.integers(0, 50, (96, 1)).astype(np.int32)
    np.testing.assert_array_equal(gather_rows(data, indices), data[indices[:, 0]])


def test_accumulating_scatter_is_numpy_add_at():
    src = rng.integers(-8, 8, (64, 16)).astype(np.float32)  # small integers: every sum order is exact
    indices = rng.integers(0, 10, (64, 1)).astype(np.int32)  # duplicates add
    out = rng.integers(-8, 8, (10, 16)).astype(np.float32)
    want = out.copy()
    np.add.at(want, indices[:, 0], src)
    scatter_add_rows(src, indices, out)  # numpy arguments are written in place (an inout tensor)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("parts, row", [(95, 24), (96, 51 * 24)])
def test_indirect_pattern_needs_one_row_per_index_inside_the_tensor(parts, row):
    @nki.jit
    def bad(data, indices):
        idx = nl.ndarray((96, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        dst = nl.ndarray((96, 24), dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=dst, src=data.ap(pattern=[[24, parts], [1, row]], vector_offset=idx, indirect_dim=0))

    with pytest.raises(KernelError, match="one row"):
        bad.program(np.zeros((50, 24), np.float32), np.zeros((96, 1), np.int32))


@nki.jit
def select_with(pred_src, on_true, on_false_col):
    P, F = on_true.shape
    out = nl.ndarray((P, F), dtype=on_true.dtype, buffer=nl.shared_hbm)
    x, t, col = (nl.ndarray(shape, nl.float32, buffer=nl.sbuf) for shape in ((P, F), (P, F), (P, 1)))
    nisa.dma_copy(dst=x, src=pred_src)
    nisa.dma_copy(dst=t, src=on_true)
    nisa.dma_copy(dst=col, src=on_false_col)
    pred = nl.ndarray((P, F), nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pred, data=x, op0=nl.greater, operand0=0.0)
    half = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=half, predicate=pred, on_true=t, on_false=-2.5)
    nisa.select_reduce(dst=t, predicate=pred, on_true=half, on_false=col)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_select_reduce_is_numpy_where():
    x, t = (rng.standard_normal((64, 40)).astype(np.float32) for _ in range(2))
    col = rng.standard_normal((64, 1)).astype(np.float32)
    np.testing.assert_array_equal(select_with(x, t, col), np.where(x > 0, t, col))
    with pytest.raises(NotImplementedError, match="reduce_res"):
        @nki.jit
        def fused(a):
            t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            r = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            nisa.select_reduce(dst=t, predicate=t, on_true=t, on_false=0.0, reduce_res=r)

        fused.program(x)


@nki.jit
def fmod_and_running_sum(a, b):
    P, F = a.shape
    outs = tuple(nl.ndarray((P, F), nl.float32, buffer=nl.shared_hbm) for _ in range(2))
    x, y, r = (nl.ndarray((P, F), nl.float32, buffer=nl.sbuf) for _ in range(3))
    nisa.dma_copy(dst=x, src=a)
    nisa.dma_copy(dst=y, src=b)
    nisa.tensor_tensor(dst=r, data1=x, data2=y, op=nl.fmod)
    nisa.dma_copy(dst=outs[0], src=r)
    nisa.tensor_tensor_scan(dst=r, data0=x, data1=y, initial=0.0, op0=nl.add, op1=nl.bypass)  # y unused: bypass
    nisa.dma_copy(dst=outs[1], src=r)
    return outs


def test_fmod_is_c_fmod_and_bypass_keeps_the_first_operand():
    a = rng.integers(-20, 20, (32, 48)).astype(np.float32)  # integers: the running sum is exact
    b = rng.integers(1, 7, (32, 48)).astype(np.float32) * np.where(rng.random((32, 48)) < 0.5, -1, 1)
    rem, running = fmod_and_running_sum(a, b.astype(np.float32))
    np.testing.assert_array_equal(rem, np.fmod(a, b).astype(np.float32))
    np.testing.assert_array_equal(running, np.cumsum(a, axis=1))
