"""nisa.tensor_scalar_reduce and nisa.dma_transpose's 3-/4-D permutations against numpy (from NKI's docs)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl

REDUCE = {"add": np.sum, "multiply": np.prod, "maximum": np.max, "minimum": np.min}
OPS = {"add": np.add, "multiply": np.multiply, "subtract": np.subtract, "maximum": np.maximum}


@nki.jit
def scalar_reduce(x, op0, operand0, reduce_op, negate, out_dtype):
    t = nl.load(x)
    d = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=d, data=t, op0=getattr(nl, op0), operand0=operand0,
                              reduce_op=getattr(nl, reduce_op), reduce_res=r, reduce_res_negate=negate)
    out = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, d)
    nl.store(red, r)
    return out, red


@settings(max_examples=8, deadline=None)
@given(p=st.integers(1, 128), free=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       op0=st.sampled_from(sorted(OPS)), operand0=st.sampled_from([0.5, -1.25, 2.0]),
       reduce_op=st.sampled_from(sorted(REDUCE)), negate=st.booleans(),
       out_dtype=st.sampled_from(["float32", "bfloat16"]))
def test_tensor_scalar_reduce_reduces_the_fp32_results(p, free, op0, operand0, reduce_op, negate, out_dtype):
    x = np.random.default_rng(p).uniform(0.5, 1.5, (p, *free)).astype(np.float32)
    out, red = scalar_reduce(x, op0, operand0, reduce_op, negate, out_dtype)
    res = OPS[op0](x, np.float32(operand0)).astype(np.float32)
    np.testing.assert_array_equal(out, res.astype(ml_dtypes.bfloat16 if out_dtype == "bfloat16" else np.float32))
    want = REDUCE[reduce_op](res.reshape(p, -1), axis=1, keepdims=True) * (-1 if negate else 1)
    np.testing.assert_allclose(red, want, rtol=1e-5)


def test_tensor_scalar_reduce_register_accumulation_is_not_implemented():
    @nki.jit
    def accumulate(x):
        t = nl.load(x)
        r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add, reduce_res=r,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        return x

    with pytest.raises(NotImplementedError, match=r"tensor_scalar_reduce\(reduce_cmd=reduce_cmd.reduce\)"):
        accumulate(np.zeros((2, 8), np.float32))


@nki.jit
def dma_tp(x):
    perm = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[len(x.shape)]
    t = nl.load(x)
    d = nl.ndarray(tuple(x.shape[a] for a in perm), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=d, src=t)
    out = nl.ndarray(d.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, d)
    return out


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([(16, 32), (8, 3, 16), (4, 2, 3, 32), (16, 1, 1, 128)]))
def test_dma_transpose_follows_nkis_permutation_per_rank(shape):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(ml_dtypes.bfloat16)
    perm = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[len(shape)]
    np.testing.assert_array_equal(dma_tp(x), np.transpose(x, perm))


def test_nc_matmul_row_column_tiling_gives_the_products_and_validates_tiles():
    @nki.jit
    def quadrants(a, b):
        ta, tb = nl.load(a), nl.load(b)
        ps = nl.ndarray((64, b.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, ta, tb, tile_position=(64, 64), tile_size=(64, 64))
        res = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        out = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    g = np.random.default_rng(3)
    a, b = g.standard_normal((64, 64)).astype(np.float32), g.standard_normal((64, 96)).astype(np.float32)
    np.testing.assert_allclose(quadrants(a, b), a.T @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(KernelError, match=r"stationary .* exceeds the \[64, 64\] tile"):
        quadrants(np.zeros((128, 64), np.float32), np.zeros((128, 8), np.float32))


def test_activation_into_a_stride_zero_destination_keeps_the_last_write_and_the_reduction():
    @nki.jit
    def square_sums(x):
        t = nl.load(x)
        junk = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=junk.ap(pattern=[[1, x.shape[0]], [0, x.shape[1]]]), op=nl.square, data=t,
                               reduce_op=nl.add, reduce_res=s)
        out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1], s)
        nl.store(out[:, 1:2], junk)
        return out

    x = np.random.default_rng(4).standard_normal((32, 40)).astype(np.float32)
    out = square_sums(x)
    np.testing.assert_allclose(out[:, 0], (x * x).sum(1), rtol=1e-5)
    np.testing.assert_array_equal(out[:, 1], x[:, -1] * x[:, -1])  # the last element written


def test_jit_accepts_compiler_diagnostics_options_only():
    @nki.jit(mode="auto", debug_kernel=True, show_compiler_tb=True, experimental_flags="skip-a-check")
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out

    np.testing.assert_array_equal(copy(np.ones((2, 3), np.float32)), np.ones((2, 3)))
    with pytest.raises(NotImplementedError, match=r"nki.jit options \['additional_compile_opt'\]"):
        nki.jit(additional_compile_opt="-O3")
    assert nisa.get_nc_version() >= nisa.nc_version.gen2 and nisa.nc_version.gen4 > nisa.nc_version.gen3


def test_abs_is_a_unary_alu_operator_with_operand_zero():
    @nki.jit
    def abs_then_max(x):
        t = nl.load(x)
        a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=a, data=t, op0=nl.abs, operand0=0.0, reduce_op=nl.maximum, reduce_res=m)
        b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=b, data=t, op0=nl.abs, operand0=None, op1=nl.multiply, operand1=2.0)
        out = nl.ndarray((x.shape[0], 2 * x.shape[1] + 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:x.shape[1]], a)
        nl.store(out[:, x.shape[1]:2 * x.shape[1]], b)
        nl.store(out[:, 2 * x.shape[1]:], m)
        return out

    x = np.random.default_rng(6).standard_normal((16, 10)).astype(np.float32)
    out = abs_then_max(x)
    np.testing.assert_array_equal(out[:, :10], np.abs(x))
    np.testing.assert_array_equal(out[:, 10:20], 2 * np.abs(x))
    np.testing.assert_array_equal(out[:, 20], np.abs(x).max(1))

    @nki.jit
    def abs_with_operand(x):
        t = nl.load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.abs, operand0=3.0)
        return x

    with pytest.raises(KernelError, match=r"nl.abs is unary; its operand must be 0 or None, got 3.0"):
        abs_with_operand(np.zeros((2, 2), np.float32))

    @nki.jit
    def abs_of_two(x):
        t = nl.load(x)
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.abs)
        return x

    with pytest.raises(KernelError, match=r"nl.abs is a unary ALU operator"):
        abs_of_two(np.zeros((2, 2), np.float32))
