"""nki.language's tile-level functions (load/store, reductions, broadcast_to, transpose, matmul, where, ...) and the
NKI-facing details public kernels rely on (a reshaped output, .ap() of an HBM view, names of missing dtypes and
operators that exist until used), against numpy."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl

rng = np.random.default_rng(5)


@nki.jit
def reduce_kernel(x, op, axis, keepdims):
    r = getattr(nl, op)(nl.load(x), axis=axis, keepdims=keepdims)
    out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


@settings(max_examples=8, deadline=None)
@given(p=st.integers(1, 128), free=st.lists(st.integers(1, 7), min_size=1, max_size=3), n_axes=st.integers(1, 3),
       op=st.sampled_from(["sum", "max", "min", "mean"]), keepdims=st.booleans())
def test_reductions_over_last_free_dims(p, free, n_axes, op, keepdims):
    x = rng.standard_normal((p, *free)).astype(np.float32)
    axes = tuple(range(1 + len(free) - min(n_axes, len(free)), 1 + len(free)))
    out = reduce_kernel(x, op, axes, keepdims)
    want = getattr(np, {"sum": "sum", "max": "max", "min": "min", "mean": "mean"}[op])(x, axis=axes,
                                                                                      keepdims=keepdims)
    want = want.reshape(p, 1) if want.ndim == 1 else want  # a tile keeps a free dim
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_reduction_axis_must_be_trailing_free_dims():
    with pytest.raises(KernelError, match=r"nl.sum: axis \[1\] must be the last contiguous free dims"):
        reduce_kernel(np.zeros((4, 3, 2), np.float32), "sum", [1], False)


@nki.jit
def broadcast_kernel(x, shape):
    t = nl.broadcast_to(nl.load(x), shape)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@settings(max_examples=8, deadline=None)
@given(p=st.integers(1, 128), f=st.integers(1, 300), from_row=st.booleans(), from_col=st.booleans(),
       dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16]))
def test_broadcast_to_from_one_partition_and_one_column(p, f, from_row, from_col, dtype):
    x = rng.standard_normal((1 if from_row else p, 1 if from_col else f)).astype(dtype)
    np.testing.assert_array_equal(broadcast_kernel(x, (p, f)), np.broadcast_to(x, (p, f)))


def test_broadcast_to_rejects_non_numpy_shapes():
    with pytest.raises(KernelError, match=r"cannot broadcast \[4, 3\] to \[4, 6\]"):
        broadcast_kernel(np.zeros((4, 3), np.float32), (4, 6))


@nki.jit
def tile_functions(a, b, cond):
    """Each tile function once: outputs in a tuple."""
    ta, tb, tc = nl.load(a), nl.load(b), nl.load(cond)
    outs = []
    for t in (nl.transpose(ta), nl.matmul(ta, tb, transpose_x=True), nl.matmul(ta, tb), nl.where(tc, ta, tb),
              nl.where(tc, ta, -2.0), nl.negative(ta), nl.ones(ta.shape, nl.float32),
              nl.shared_identity_matrix(a.shape[0], dtype=nl.bfloat16), nl.expand_dims(ta, 1)):
        res = nl.empty_like(t, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=t)
        out = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        outs.append(out)
    return tuple(outs)


def test_tile_functions_against_numpy():
    n = 64
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    cond = (rng.random((n, n)) < 0.5).astype(np.float32)
    tr, mm_t, mm, where, where_scalar, neg, ones, eye, expanded = tile_functions(a, b, cond)
    np.testing.assert_array_equal(tr, a.T)
    np.testing.assert_allclose(mm_t, a.T @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mm, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(where, np.where(cond != 0, a, b))
    np.testing.assert_array_equal(where_scalar, np.where(cond != 0, a, -2.0))
    np.testing.assert_array_equal(neg, -a)
    np.testing.assert_array_equal(ones, np.ones((n, n)))
    np.testing.assert_array_equal(eye, np.eye(n))
    np.testing.assert_array_equal(expanded, a[:, None, :])


def test_identity_matrix_is_made_once_per_size_and_dtype():
    @nki.jit
    def two_identities(a):
        i1 = nl.shared_identity_matrix(32, dtype=nl.float32)
        i2 = nl.shared_identity_matrix(32, dtype=nl.float32)
        assert i1 is i2
        out = nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, i2)
        return out

    np.testing.assert_array_equal(two_identities(np.zeros((1, 1), np.float32)), np.eye(32))
    assert sum(1 for i in two_identities.program(np.zeros((1, 1), np.float32)).instructions
               if type(i).__name__ == "Iota") == 1


def test_matmul_is_transpose_is_a_bit_exact_transpose():
    @nki.jit
    def tp(x):
        t = nl.load(x)
        eye = nl.shared_identity_matrix(x.shape[0], dtype=x.dtype)
        ps = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t, moving=eye, is_transpose=True)
        res = nl.ndarray(ps.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        out = nl.ndarray(ps.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    x = rng.standard_normal((48, 80)).astype(np.float32)
    x[0, 0], x[1, 2] = np.inf, np.nan
    np.testing.assert_array_equal(tp(x), x.T)


def test_reshaped_output_is_returned_in_its_shape_and_slices_raise():
    @nki.jit
    def flat(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out.reshape((x.shape[0] * x.shape[1], 1))

    x = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(flat(x), x.reshape(24, 1))

    @nki.jit
    def half(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out[:, 0:3]

    with pytest.raises(NotImplementedError, match=r"a slice or permuted view of an output tensor"):
        half(x)


def test_ap_of_an_hbm_view_starts_at_the_view():
    @nki.jit
    def every_other_column_of_row_block(x):
        view = x[2:6, :]  # starts at element 2 * F of x's storage
        f = x.shape[1]
        t = nl.ndarray((4, f // 2), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=view.ap([[f, 4], [2, f // 2]], offset=1))
        out = nl.ndarray(t.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    x = rng.standard_normal((8, 10)).astype(np.float32)
    np.testing.assert_array_equal(every_other_column_of_row_block(x), x[2:6, 1::2])


def test_missing_dtypes_and_operators_can_be_named_but_not_used():
    supported = {nl.float32, nl.float8_e4m3fn_x4, nl.gelu_apprx_sigmoid}  # as kernels' dtype / op tables do
    assert len(supported) == 3

    @nki.jit
    def mx(a):
        nl.ndarray((4, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        return a

    with pytest.raises(NotImplementedError, match=r"nki.language.float8_e4m3fn_x4 is not implemented"):
        mx(np.zeros((2, 2), np.float32))

    @nki.jit
    def act(a):
        t = nl.load(a)
        nisa.activation(dst=t, op=nl.gelu_apprx_sigmoid, data=t)
        return a

    with pytest.raises(NotImplementedError, match=r"nki.language.gelu_apprx_sigmoid is not implemented"):
        act(np.zeros((2, 2), np.float32))


def test_submodules_and_aliases_public_kernels_import():
    from neuron_kernels.nki import isa_constants, typing

    assert nki.isa.constants is isa_constants and isa_constants.oob_mode is nisa.oob_mode
    assert typing.tensor[(4, 4), nl.float32] is nl.NkiTensor and nki.dtype is type(nl.float32)
    assert nisa.tensor_engine is nisa.engine.tensor and nisa.NkiValidationError is KernelError
    assert nl.is_hbm(nl.shared_hbm) and nl.is_sbuf(nl.sbuf) and nl.is_on_chip(nl.psum) and not nl.is_psum(nl.sbuf)
