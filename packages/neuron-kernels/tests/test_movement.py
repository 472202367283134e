"""Data movement kernels against numpy references: copies and casts, transposes, permutes, strided views,
cat, index_select, gather, scatter, scatter_add; which strategy moves the data; rooflines of large moves."""

import collections

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import DType, Space, get_driver, get_profile, isa
from neuron_kernels import KernelError, TensorSpec, roofline
from neuron_kernels.library import movement as mv

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
ALL = FLOATS + [np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64, np.bool_)]


def kind(dtype) -> str:
    """f, i, u or b (ml_dtypes' bfloat16 has numpy kind V)."""
    return DType.of(np.dtype(dtype)).kind


def data(rng, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if kind(dtype) in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -(2**40)), min(info.max, 2**40), shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def assert_bits(got: np.ndarray, ref: np.ndarray) -> None:
    """Data movement is bit exact: same shape, dtype and bytes."""
    ref = np.array(ref, order="C")
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, got.dtype, ref.shape, ref.dtype)
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), ref.reshape(-1).view(np.uint8))


def opcodes(program) -> collections.Counter:
    return collections.Counter(i.opcode for i in program.instructions)


shapes = st.lists(st.sampled_from([1, 2, 3, 5, 17, 64, 129, 200]), min_size=1, max_size=4).filter(
    lambda s: np.prod(s) <= 200_000)


# -- copy ------------------------------------------------------------------------------------------
@SETTINGS
@given(shapes, st.sampled_from(ALL), st.sampled_from(ALL))
def test_copy_casts_like_torch(shape, src, dst):
    rng = np.random.default_rng(len(shape))
    x = data(rng, shape, src)
    if kind(src) == "f" and kind(dst) in "iu":  # keep float -> int in range (torch leaves the rest undefined)
        info = np.iinfo(dst)
        x = np.clip(x.astype(np.float32), info.min, min(info.max, 2**24) / 2).astype(src)
    got = mv.copy(x, DType.of(dst).value[0])
    if dst == np.bool_:
        ref = x != 0
    elif kind(src) == "f" and kind(dst) in "iu":
        ref = np.trunc(x.astype(np.float64)).astype(dst)  # toward zero, as torch
    elif kind(src) in "iub" and kind(dst) in "iu":
        ref = x.astype(np.int64).astype(dst)  # wraps
    else:
        ref = x.astype(np.float32).astype(dst) if src != dst else x  # through FP32, round to nearest even
    assert_bits(got, ref)


def x86_int_cast(x: np.ndarray, dst) -> np.ndarray:
    """torch's CPU float -> int cast (x86 cvtt*): toward zero; NaN, +-inf and values outside int32's range
    (int64's for int64) give that range's minimum, of which the narrower types keep the low bits."""
    wide = np.dtype(np.int64) if np.dtype(dst) == np.int64 else np.dtype(np.int32)
    t = np.trunc(x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        ok = np.abs(t) < 2.0 ** (8 * wide.itemsize - 1)
    return np.where(ok, t, np.iinfo(wide).min).astype(wide).astype(dst)  # int -> int wraps


EDGES = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 127.9, 128.0, -129.0, 255.9, 256.0,
         -1.0, 32767.5, 32768.0, -32769.0, 65535.0, 65536.0, 40000.0, -40000.0, 70000.0, 2.0 ** 31, -2.0 ** 31,
         2147483520.0, -2147483904.0, 3e9, -3e9, 1e19, 9.2e18, -9.3e18, 2.0 ** 63, -2.0 ** 63, 1e30, -1e30, 3.4e38]
INT_DSTS = [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64)]


@SETTINGS
@given(st.sampled_from(FLOATS), st.sampled_from(INT_DSTS), st.lists(st.floats(width=32), min_size=1, max_size=300))
def test_float_to_int_casts_give_x86s_integer_indefinite(src, dst, values):
    """Out of range, NaN and inf: torch's CPU values (x86), not the engines' saturating cast with NaN -> 0."""
    with np.errstate(over="ignore"):
        x = np.array(EDGES + values, np.float32).astype(src)
    assert_bits(mv.copy(x, dst.name), x86_int_cast(x, dst))
    out = np.zeros(2 * x.size, dst)  # the strided copy_ path
    mv.strided_copy_(out, x, (x.size,), (2,), (1,))
    assert_bits(np.ascontiguousarray(out[::2]), x86_int_cast(x, dst))
    assert not out[1::2].any()


@pytest.mark.parametrize("src", FLOATS + [np.dtype(ml_dtypes.float8_e5m2)] + [np.dtype(t) for t in (
    np.int16, np.int32, np.int64, np.uint8)])
def test_float8_e4m3fn_casts_saturate_at_448(src):
    """torch saturates float8_e4m3fn at +-448 (inf too, NaN stays NaN); a DMA's cast (ml_dtypes) gives NaN from 464."""
    big = [440.0, 448.0, 449.0, 463.9, 464.0, 464.1, 470.0, 479.9, 480.0, 500.0, 1e4, 57344.0, 3e38, np.inf, np.nan]
    vals = np.array(big + [-v for v in big] + [0.0, 1.0, 3.3, -0.01, 2.0 ** -9, 2.0 ** -10], np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # the float16 / e5m2 casts of the largest values
        x = np.clip(vals, -2e4, 2e4).astype(src) if kind(src) in "iu" else vals.astype(src)
    e4 = np.dtype(ml_dtypes.float8_e4m3fn)
    ref = np.clip(x.astype(np.float32), -448, 448).astype(e4)  # numpy's clip keeps NaN
    got = mv.copy(x, "float8_e4m3fn")
    assert got.dtype == e4
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))  # NaN == NaN here


def test_copy_of_empty_and_0d():
    assert_bits(mv.copy(np.zeros((0, 5), np.float32)), np.zeros((0, 5), np.float32))
    assert_bits(mv.copy(np.array(3.5, np.float32), "int32"), np.array(3, np.int32))


@pytest.mark.parametrize("profile", ["trn2", "trn3"])
def test_float_to_int_casts_of_many_tiles_use_engines_that_run_fmod(profile):
    """Tiles take turns on the engines; on NC-v3 ScalarE copies but has no native tensor_scalar (the fmod)."""
    program = mv.copy.trace(TensorSpec((850080,), DType.float32), "int32", profile=profile)
    scalar_fmods = [i for i in program.instructions if isinstance(i, isa.TensorScalar) and i.engine.value == "scalar"]
    assert not scalar_fmods or get_profile(profile).scalar_tensor_scalar
    x = np.floor(np.random.default_rng(0).random(850080, dtype=np.float32) * 100)
    assert_bits(mv.copy(x, "int32"), x.astype(np.int32))


# -- transpose / permute ---------------------------------------------------------------------------
@SETTINGS
@given(st.integers(1, 300), st.integers(1, 300), st.sampled_from(ALL))
def test_transpose_2d(m, n, dtype):
    x = data(np.random.default_rng(m * n), (m, n), dtype)
    assert_bits(mv.transpose(x), x.T)


@SETTINGS
@given(st.integers(1, 40), st.integers(1, 140), st.integers(1, 140), st.sampled_from(FLOATS + [np.dtype(np.int8)]))
def test_transpose_batched_last_two_dims(b, m, n, dtype):
    x = data(np.random.default_rng(b + m + n), (b, m, n), dtype)
    assert_bits(mv.transpose(x), np.swapaxes(x, -1, -2))


def test_transpose_any_two_dims_and_small_ranks():
    x = data(np.random.default_rng(0), (3, 4, 5, 6), np.float32)
    assert_bits(mv.transpose(x, 0, 2), np.swapaxes(x, 0, 2))
    assert_bits(mv.transpose(x, -1, 1), np.swapaxes(x, -1, 1))
    v = np.arange(7, dtype=np.float32)
    assert_bits(mv.transpose(v), v)  # like x.t() of a vector


@SETTINGS
@given(st.lists(st.sampled_from([1, 2, 3, 7, 16, 33, 64]), min_size=1, max_size=5), st.sampled_from(ALL),
       st.randoms(use_true_random=False))
def test_permute_any_rank(shape, dtype, rnd):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    x = data(np.random.default_rng(sum(shape)), shape, dtype)
    assert_bits(mv.permute(x, tuple(perm)), np.transpose(x, perm))


@pytest.mark.parametrize(("shape", "perm"), [
    ((4, 512, 16, 8), (0, 2, 1, 3)),    # head split: short runs, reordered in SBUF
    ((2, 24, 40, 40), (0, 2, 3, 1)),    # NCHW -> NHWC
    ((2, 40, 40, 24), (0, 3, 1, 2)),    # NHWC -> NCHW
    ((3, 5, 300, 2), (0, 2, 1, 3)),     # a pair of elements carried as components
    ((40000, 3), (1, 0)),               # narrow transposes
    ((3, 40000), (1, 0)),
    ((300, 4, 50), (2, 1, 0)),
    ((1000, 64), (1, 0)),               # short source rows: several rows per partition
    ((64, 1000), (1, 0)),               # short destination rows: several rows per output partition
    ((5, 40, 3000), (0, 2, 1)),
    ((3, 40, 40, 48), (0, 3, 1, 2)),
])
def test_permute_layouts(shape, perm):
    x = data(np.random.default_rng(1), shape, BF16)
    assert_bits(mv.permute(x, perm), np.transpose(x, perm))


def test_permute_rejects_a_non_permutation():
    with pytest.raises(KernelError, match="not a permutation"):
        mv.permute.trace(TensorSpec((2, 3), DType.float32), (0, 0))


# -- as_strided / contiguous -----------------------------------------------------------------------
@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 30), st.sampled_from([0, 1, 2, 3, 31, 64, 200])), min_size=1, max_size=3),
       st.integers(0, 9), st.sampled_from([np.dtype(np.float32), BF16, np.dtype(np.int64)]))
def test_as_strided_copy(dims, offset, dtype):
    size, stride = tuple(d[0] for d in dims), tuple(d[1] for d in dims)
    need = offset + sum((n - 1) * s for n, s in dims) + 1
    x = data(np.random.default_rng(need), (need + 3,), dtype)
    ref = np.lib.stride_tricks.as_strided(x[offset:], size, tuple(s * x.itemsize for s in stride))
    assert_bits(mv.as_strided_copy(x, size, stride, offset), ref)
    assert_bits(mv.contiguous(x.reshape(1, -1), size, stride, offset), ref)  # any storage shape


def test_as_strided_bounds():
    with pytest.raises(KernelError, match="reaches element 10 of a storage of 10"):
        mv.as_strided_copy.trace(TensorSpec((10,), DType.float32), (2, 2), (5, 5), 0)
    assert mv.as_strided_copy(np.zeros(4, np.float32), (0, 3), (1, 1)).shape == (0, 3)


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 20), st.sampled_from([1, 2, 3, 25, 130]), st.sampled_from([1, 2, 7, 64])),
                min_size=1, max_size=3), st.sampled_from(ALL), st.sampled_from(ALL))
def test_strided_copy_into_a_strided_view(dims, src_dtype, dst_dtype):
    size = tuple(d[0] for d in dims)
    # destination strides: row-major over a padded shape, dims laid out in natural or reversed order
    padded = [n + p % 3 for (n, _, p) in dims]
    order = list(range(len(dims)))[:: -1 if dims[0][1] % 2 else 1]
    dstride, acc = [0] * len(dims), 1
    for i in reversed(order):
        dstride[i], acc = acc, acc * padded[i]
    dstride = tuple(dstride)
    sstride = tuple(d[1] for d in dims)
    rng = np.random.default_rng(sum(size))
    dn = 1 + sum((n - 1) * s for n, s in zip(size, dstride))
    sn = 1 + sum((n - 1) * s for n, s in zip(size, sstride))
    dst, src = data(rng, (dn,), dst_dtype), data(rng, (sn,), src_dtype)
    dview = np.lib.stride_tricks.as_strided(dst, size, tuple(s * dst.itemsize for s in dstride))
    sview = np.lib.stride_tricks.as_strided(src, size, tuple(s * src.itemsize for s in sstride))
    expect_view = mv.copy(np.ascontiguousarray(sview), dst_dtype)  # the cast rules of copy
    expect = dst.copy()
    np.lib.stride_tricks.as_strided(expect, size, tuple(s * dst.itemsize for s in dstride))[...] = expect_view
    mv.strided_copy_(dst, src, size, dstride, sstride)
    assert_bits(dst, expect)
    assert dview.shape == size


def _short_run_share(prog, least: int) -> float:
    """The share of the HBM elements ``prog``'s DMAs move in runs shorter than ``least`` elements."""
    short = total = 0
    for ins in prog.instructions:
        if isinstance(ins, isa.DmaCopy):
            hbm = ins.dst if ins.dst.space is Space.HBM else ins.src
            n, stride = hbm.free[-1] if hbm.free else (hbm.partitions, hbm.partition_stride)
            total += hbm.num_elements
            short += hbm.num_elements if stride != 1 or n < least else 0
    return short / total


@pytest.mark.parametrize(("src", "dst"), [(np.int64, np.float32), (np.int64, BF16), (np.int64, np.bool_),
                                          (np.int64, np.int32), (np.int64, np.float16), (np.int32, np.int64),
                                          (np.bool_, np.int64), (np.uint8, np.int64)])
def test_int64_casts_of_transposed_views_match_numpy_with_long_runs(src, dst):
    """The engines cannot copy 8-byte values while casting, so an int64 cast that changes the layout casts
    with DMAs in one layout and reorders the narrower values on chip, in long runs either way; a view cast
    into the same layout (torch keeps a transposed input's strides) is one run."""
    rng = np.random.default_rng(0)
    x = data(rng, (513 * 16,), src)
    if np.dtype(src) == np.int64:  # values beyond 2**24 and 2**32 round to nearest; the extremes (float16: inf)
        x[:4] = [2 ** 24 + 1, 2 ** 30 + 2 ** 22 + 1, -(2 ** 63), 2 ** 63 - 1]
    sview = x.reshape(513, 16).T
    with np.errstate(over="ignore"):
        ref = sview.astype(np.float32).astype(dst) if kind(dst) == "f" else sview.astype(dst)
    size = (16, 513)
    for dstride in ((513, 1), (1, 16)):  # contiguous result, result in the source's layout
        out = np.zeros(16 * 513, np.dtype(dst))
        mv.strided_copy_(out, x, size, dstride, (1, 16))
        assert_bits(np.lib.stride_tricks.as_strided(out, size, tuple(s * out.itemsize for s in dstride)), ref)
        assert _short_run_share(mv.strided_copy_.trace(out, x, size, dstride, (1, 16)), 16) < 0.01


def test_strided_copy_bounds():
    with pytest.raises(KernelError, match="dst view .* reaches element 10 of a storage of 10"):
        mv.strided_copy_.trace(TensorSpec((10,), DType.float32), TensorSpec((20,), DType.float32), (2, 2), (5, 5),
                               (1, 2))
    program = mv.strided_copy_.trace(TensorSpec((10,), DType.float32), TensorSpec((4,), DType.float32), (2, 2),
                                     (5, 1), (2, 1))
    assert [a.role for a in program.args if a.role != "scratch"] == ["inout", "in"]


# -- cat -------------------------------------------------------------------------------------------
@SETTINGS
@given(st.lists(st.sampled_from([1, 3, 5, 64, 130]), min_size=1, max_size=3), st.data(),
       st.sampled_from(ALL))
def test_cat(shape, draw, dtype):
    dim = draw.draw(st.integers(-len(shape), len(shape) - 1))
    widths = draw.draw(st.lists(st.sampled_from([0, 1, 2, 7, 100]), min_size=1, max_size=4))
    rng = np.random.default_rng(len(widths))
    parts = []
    for w in widths:
        s = list(shape)
        s[dim] = w
        parts.append(data(rng, tuple(s), dtype))
    assert_bits(mv.cat(parts, dim=dim), np.concatenate(parts, axis=dim))


def test_cat_promotes_and_skips_1d_empties():
    a = np.ones((3, 2), BF16)
    b = np.full((3, 5), 2.5, np.float32)
    got = mv.cat([a, np.zeros((0,), np.int8), b], dim=1)
    assert_bits(got, np.concatenate([a.astype(np.float32), b], 1))
    i8, u8 = np.array([[-1]], np.int8), np.array([[255]], np.uint8)
    assert_bits(mv.cat([i8, u8], dim=0), np.array([[-1], [255]], np.int16))  # torch: int8 + uint8 -> int16
    assert_bits(mv.cat([np.ones((2, 2), BF16), np.ones((2, 2), np.float16)]), np.ones((4, 2), np.float32))


def test_cat_of_narrow_rows_assembles_in_sbuf():
    parts = [np.arange(3000 * w, dtype=np.float32).reshape(3000, w) for w in (3, 5, 1)]
    prog = mv.cat.trace(parts, dim=1)
    stores = [i for i in prog.instructions if isinstance(i, isa.DmaCopy) and i.dst.space is Space.HBM]
    assert all(i.dst.free[-1] == (9, 1) for i in stores)  # whole output rows, never 3-element runs
    assert_bits(mv.cat(parts, dim=1), np.concatenate(parts, 1))


def test_cat_errors():
    with pytest.raises(KernelError, match="sizes must match except in dim 0"):
        mv.cat.trace([TensorSpec((2, 3), DType.float32), TensorSpec((2, 4), DType.float32)], dim=0)
    with pytest.raises(KernelError, match="non-empty"):
        mv.cat([])


# -- index_select ----------------------------------------------------------------------------------
@SETTINGS
@given(shapes, st.data(), st.sampled_from([np.dtype(np.float32), BF16, np.dtype(np.int32), np.dtype(np.int64)]))
def test_index_select(shape, draw, dtype):
    dim = draw.draw(st.integers(0, len(shape) - 1))
    n = draw.draw(st.integers(0, 300))
    rng = np.random.default_rng(n)
    x = data(rng, shape, dtype)
    index = rng.integers(0, shape[dim], n).astype(np.int32)
    assert_bits(mv.index_select(x, dim, index), np.take(x, index, axis=dim))


def test_index_select_rows_are_single_indirect_dmas():
    prog = mv.index_select.trace(TensorSpec((5000, 256), DType.bfloat16), 0, TensorSpec((1000,), DType.int32))
    gathers = [i for i in prog.instructions if isinstance(i, isa.DmaGather)]
    assert len(gathers) == 8 and all(g.dst.free_size == 256 for g in gathers)


def test_index_out_of_range_fails_at_run_time():
    with pytest.raises(Exception, match="index value 7"):
        mv.index_select(np.zeros((7, 4), np.float32), 0, np.array([1, 7], np.int32))
    with pytest.raises(Exception, match="index value -1"):
        mv.gather(np.zeros((3, 4), np.float32), 1, np.array([[0, 4]], np.int32))
    with pytest.raises(KernelError, match="int32"):
        mv.index_select.trace(TensorSpec((7, 4), DType.float32), 0, TensorSpec((2,), DType.int64))


# -- gather / scatter ------------------------------------------------------------------------------
def _gather_case(draw, max_extra=3):
    nd = draw.draw(st.integers(1, 3))
    xs = tuple(draw.draw(st.sampled_from([1, 2, 5, 33, 130])) for _ in range(nd))
    dim = draw.draw(st.integers(0, nd - 1))
    ish = tuple(draw.draw(st.integers(1, xs[k] + max_extra)) if k == dim else draw.draw(st.integers(1, xs[k]))
                for k in range(nd))
    return xs, dim, ish


@SETTINGS
@given(st.data(), st.sampled_from([np.dtype(np.float32), BF16, np.dtype(np.int32), np.dtype(np.uint8)]))
def test_gather(draw, dtype):
    xs, dim, ish = _gather_case(draw)
    rng = np.random.default_rng(sum(xs) + sum(ish))
    x = data(rng, xs, dtype)
    index = rng.integers(0, xs[dim], ish).astype(np.int32)
    assert_bits(mv.gather(x, dim, index), np.take_along_axis(x[tuple(slice(0, n) if k != dim else slice(None)
                                                                     for k, n in enumerate(ish))], index, dim))


@pytest.mark.parametrize("n", [17023, 128 * 140 - 3])
def test_gather_tail_tiles_stay_within_the_partitions(n):
    """A long dim tiled as 127 partitions of ceil(n / 128) elements leaves a tail of more than 128 elements
    (n = 17023: 127 x 133 and 132 left), which goes one element per partition in tiles of at most 128 (it was
    one tile of 132 partitions: a KernelError for kthvalue / searchsorted / take_along_dim on such sizes)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    index = rng.integers(0, n, n).astype(np.int32)
    assert_bits(mv.gather(x, 0, index), x[index])


def _unique_index(rng, xs, ish, dim):
    """Indices without repeats along dim (scatter's winner among repeats is unspecified, as in torch)."""
    keys = rng.random((*ish[:dim], xs[dim], *ish[dim + 1:]))
    return np.argsort(keys, axis=dim).take(range(ish[dim]), axis=dim).astype(np.int32)


@SETTINGS
@given(st.data(), st.sampled_from([np.dtype(np.float32), BF16, np.dtype(np.int32)]))
def test_scatter(draw, dtype):
    xs, dim, ish = _gather_case(draw, max_extra=0)
    rng = np.random.default_rng(sum(xs) * 7 + sum(ish))
    x = data(rng, xs, dtype)
    src = data(rng, tuple(n + 1 for n in ish), dtype)  # src may be larger than index
    index = _unique_index(rng, xs, ish, dim)
    ref = x.copy()
    for pos in np.ndindex(*ish):
        tgt = list(pos)
        tgt[dim] = index[pos]
        ref[tuple(tgt)] = src[pos]
    assert_bits(mv.scatter(x, dim, index, src), ref)
    ref_value = x.copy()
    for pos in np.ndindex(*ish):
        tgt = list(pos)
        tgt[dim] = index[pos]
        ref_value[tuple(tgt)] = 3
    assert_bits(mv.scatter(x, dim, index, 3.0), ref_value)


@SETTINGS
@given(st.data(), st.sampled_from([np.dtype(np.float32), BF16, np.dtype(np.int32)]))
def test_scatter_add_with_repeats(draw, dtype):
    xs, dim, ish = _gather_case(draw, max_extra=4)  # index may be longer than x along dim: repeats
    rng = np.random.default_rng(sum(xs) * 3 + sum(ish))
    x = data(rng, xs, dtype) if kind(dtype) == "f" else rng.integers(-1000, 1000, xs).astype(dtype)
    src = data(rng, ish, dtype) if kind(dtype) == "f" else rng.integers(-1000, 1000, ish).astype(dtype)
    index = rng.integers(0, xs[dim], ish).astype(np.int32)
    acc = x.astype(np.float64)
    grid = list(np.indices(ish))
    grid[dim] = index
    np.add.at(acc, tuple(grid), src.astype(np.float64))
    got = mv.scatter_add(x, dim, index, src)
    assert got.dtype == dtype
    if kind(dtype) == "i":
        np.testing.assert_array_equal(got, acc.astype(dtype))
    else:
        rtol = 1e-5 if dtype == np.float32 else 2e-2
        # each 128-element scatter rounds once into the table: error grows with repeats of one target
        scale = np.abs(x.astype(np.float64)).max(initial=1) + np.abs(src.astype(np.float64)).sum()
        np.testing.assert_allclose(got.astype(np.float64), acc, rtol=rtol, atol=rtol * scale / 10)


def test_gather_scatter_shape_rules():
    f32 = DType.float32
    with pytest.raises(KernelError, match="index size 5 > x size 4 in dim 1"):
        mv.gather.trace(TensorSpec((3, 4), f32), 0, TensorSpec((2, 5), DType.int32))
    with pytest.raises(KernelError, match="src is bfloat16 but x is float32"):
        mv.scatter.trace(TensorSpec((3, 4), f32), 0, TensorSpec((2, 4), DType.int32),
                         TensorSpec((2, 4), DType.bfloat16))


# -- strategies and rooflines ----------------------------------------------------------------------
def test_large_transposes_use_tensor_engine_and_long_runs():
    prog = mv.transpose.trace(TensorSpec((4096, 2048), DType.bfloat16), tile_bytes=16384)
    ops = opcodes(prog)
    assert ops["nc_transpose"] == 512 and ops["dma_copy"] < 100
    for ins in prog.instructions:
        if isinstance(ins, isa.DmaCopy):
            hbm = ins.dst if ins.dst.space is Space.HBM else ins.src
            assert hbm.free[-1][1] == 1 and hbm.free[-1][0] * 2 >= 1024  # runs of >= 1 KiB on the HBM side


def test_small_matrices_reorder_in_sbuf_and_cat_is_direct():
    prog = mv.transpose.trace(TensorSpec((2048, 64, 64), DType.bfloat16))
    assert opcodes(prog).keys() == {"dma_copy", "tensor_copy"}
    prog = mv.cat.trace([TensorSpec((4096, 512), DType.bfloat16)] * 4, dim=1)
    assert opcodes(prog) == {"dma_copy": 4}


@pytest.mark.parametrize(("shape", "dtype", "least"), [((4096, 2048), DType.bfloat16, 0.8),
                                                       ((2048, 2048), DType.float32, 0.8),
                                                       ((2048, 64, 64), DType.bfloat16, 0.8),
                                                       ((1 << 20, 4), DType.bfloat16, 0.75)])
def test_transpose_reaches_the_dma_roofline(shape, dtype, least):
    profile = get_profile("trn2")
    driver = get_driver("sim", profile)
    prog = mv.transpose.trace(TensorSpec(shape, dtype), profile=profile, tile_bytes=16384)
    ns = driver.estimate(0, driver.load(0, prog)).device_ns
    nbytes = 2 * np.prod(shape) * dtype.itemsize  # read + written
    assert roofline.fraction(profile, roofline.dma_ns(profile, nbytes), ns) >= least


def test_strided_views_load_long_runs():
    """x[:, ::2] (no unit stride) loads whole spans and skips on chip; a broadcast is loaded once."""
    x = data(np.random.default_rng(3), (4096 * 128,), BF16)
    for size, stride, offset in (((4096, 64), (128, 2), 0), ((4096, 64), (128, 2), 1), ((512, 256), (1, 0), 0)):
        prog = mv.as_strided_copy.trace(x, size, stride, offset)
        for ins in prog.instructions:
            if isinstance(ins, isa.DmaCopy):
                hbm = ins.dst if ins.dst.space is Space.HBM else ins.src
                if hbm.num_elements > 1:  # x[:, 1::2] ends at the storage's end: its last element goes alone
                    assert hbm.free and hbm.free[-1][1] == 1 and hbm.free[-1][0] >= 64, str(ins)
        ref = np.lib.stride_tricks.as_strided(x[offset:], size, tuple(s * x.itemsize for s in stride))
        assert_bits(mv.as_strided_copy(x, size, stride, offset), ref)
