"""Views of HBM tensors and tiles index like numpy, and their access patterns address the same elements."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels as nk
from neuron_hal import DType
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import language as nl
from neuron_kernels.tensors import TensorHandle, hbm_tensor


def index_st(size):
    ints = st.integers(-size, size - 1)
    slices = st.builds(slice, st.one_of(st.none(), st.integers(-size - 2, size + 2)),
                       st.one_of(st.none(), st.integers(-size - 2, size + 2)),
                       st.one_of(st.none(), st.integers(1, 3)))
    return st.one_of(ints, slices)


def elements(view):
    """Flat element indices a view addresses, in row-major order of its shape."""
    idx = np.full(view.shape, view.offset, np.int64)
    for d, (size, stride) in enumerate(view.dims):
        shape = [1] * view.ndim
        shape[d] = size
        idx = idx + (np.arange(size) * stride).reshape(shape)
    return idx


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4).flatmap(
    lambda shape: st.tuples(st.just(shape), st.tuples(*[index_st(s) for s in shape]))))
def test_hbm_views_index_like_numpy(case):
    shape, key = case
    arr = np.arange(int(np.prod(shape))).reshape(shape)
    view = hbm_tensor(TensorHandle(0, "x", tuple(shape), DType.float32, "in"))[key]
    np.testing.assert_array_equal(elements(view), arr[key])


def test_ellipsis_and_reshape():
    v = hbm_tensor(TensorHandle(0, "x", (4, 6, 8), DType.float32, "in"))
    assert v[..., 2].shape == (4, 6) and v[1, ...].shape == (6, 8)
    r = v.reshape(24, 8)
    np.testing.assert_array_equal(elements(r), np.arange(192).reshape(24, 8))
    np.testing.assert_array_equal(elements(v[:, ::2].reshape(4, 3, 2, 4)), np.arange(192).reshape(4, 6, 8)[:, ::2]
                                  .reshape(4, 3, 2, 4))  # a split dim needs no copy
    with pytest.raises(KernelError, match=r"cannot reshape \[4, 3, 8\] .* without a copy"):
        v[:, ::2].reshape(-1)
    with pytest.raises(KernelError, match="out of range"):
        v[4]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_reshape_of_strided_views_is_numpys_view_reshape(shape, data):
    """A reshape works exactly where numpy can reshape the same view without a copy, addressing its elements."""
    arr = np.arange(int(np.prod([2 * s for s in shape]))).reshape([2 * s for s in shape])
    key = tuple(data.draw(st.sampled_from([slice(0, s), slice(0, 2 * s, 2), slice(s, 2 * s)])) for s in shape)
    perm = data.draw(st.permutations(range(len(shape))))
    want = arr[key].transpose(perm)
    view = hbm_tensor(TensorHandle(0, "x", arr.shape, DType.float32, "in"))[key]
    view = type(view)(view.owner, view.dtype, view.offset, tuple(view.dims[p] for p in perm))
    n = want.size
    a = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    new = (a, -1)
    try:
        expect = want.view()
        expect.shape = (a, n // a)  # numpy raises where only a copy could reshape
    except AttributeError:
        with pytest.raises(KernelError, match="without a copy"):
            view.reshape(*new)
        return
    np.testing.assert_array_equal(elements(view.reshape(*new)), expect)


def test_as_strided_views_the_storage_of_a_strided_tensor():
    flat = hbm_tensor(TensorHandle(0, "x", (60,), DType.float32, "in"))
    v = flat.as_strided((2, 3, 4), (30, 4, 1), offset=2)
    np.testing.assert_array_equal(elements(v), np.lib.stride_tricks.as_strided(np.arange(60)[2:], (2, 3, 4),
                                                                                (240, 32, 8)))
    with pytest.raises(KernelError, match="reach element 60 of 60"):
        flat.as_strided((2, 3, 4), (30, 4, 1), offset=19)
    with pytest.raises(KernelError, match="1-d HBM tensor"):
        flat.reshape(6, 10).as_strided((2,), (1,))


def test_tile_partition_slices_set_the_start_partition():
    @nk.kernel
    def halves(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.hbm)
        t = nl.load(a)
        nl.store(out[64:128], t[64:128])
        nl.store(out[0:64], t[0:64])
        return out

    prog = halves.trace(TensorSpec((128, 8), nl.float32))
    assert [i.src.start_partition for i in prog.instructions[1:]] == [64, 0]
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(halves(x), x)


def test_tiles_keep_their_partition_dim():
    @nk.kernel
    def bad(a):
        t = nl.load(a)
        return t[3]

    with pytest.raises(KernelError, match="keeps its partition dim"):
        bad.trace(TensorSpec((128, 8), nl.float32))


def test_strided_partitions_are_rejected():
    @nk.kernel
    def bad(a):
        t = nl.load(a)
        nl.store(a[0:64], t[::2])

    with pytest.raises(KernelError, match="partitions cannot be strided"):
        bad.trace(TensorSpec((128, 8), nl.float32))


def test_broadcast_to_follows_numpy():
    v = hbm_tensor(TensorHandle(0, "x", (1, 3), DType.float32, "in"))
    b = v.broadcast_to((2, 4, 3))
    np.testing.assert_array_equal(elements(b), np.broadcast_to(np.arange(3).reshape(1, 3), (2, 4, 3)))
    with pytest.raises(KernelError, match="cannot broadcast"):
        v.broadcast_to((2, 4))


def test_run_time_rule_errors_point_at_the_kernel_line():
    @nk.kernel
    def lookup(table, idx):
        out = nl.ndarray((4, 8), table.dtype, buffer=nl.hbm)
        t = nl.ndarray((4, 8), table.dtype)
        i = nl.load(idx)
        nk.isa.dma_gather(t, table, i)  # the gather with the bad index
        nl.store(out, t)
        return out

    table = np.zeros((16, 8), np.float32)
    with pytest.raises(KernelError, match=r"kernel 'lookup' at test_tensors.py:\d+: \[.*\].*99"):
        lookup(table, np.array([[0], [1], [99], [2]], np.int32))
