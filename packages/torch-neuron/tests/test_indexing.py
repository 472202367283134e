"""Indexing on the neuron device against PyTorch CPU: index_select, gather, scatter (src / value),
scatter_add, advanced indexing (index.Tensor) and index_put_ (masks, several index tensors, negatives,
broadcasting, accumulate), nonzero, masked_select, exact int64 -> int32 index conversion with torch's
out-of-range errors, and gradients through indexing."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
SETTINGS = settings(max_examples=15, deadline=None)
MOVED = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int8, torch.uint8,
         torch.bool, torch.float64]


def sample(shape, dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, dtype=dtype)


def same(got, want):
    assert got.device.type == DEV and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


SHAPES = st.lists(st.integers(1, 5), min_size=1, max_size=3)


# -- index_select / gather / scatter -----------------------------------------------------------------
@SETTINGS
@given(SHAPES, st.data(), st.sampled_from(MOVED), st.sampled_from([torch.int64, torch.int32]))
def test_index_select_matches_cpu(shape, data, dtype, index_dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    index = torch.tensor(data.draw(st.lists(st.integers(0, shape[dim] - 1), max_size=7)), dtype=index_dtype)
    x = sample(shape, dtype)
    want = torch.index_select(x, dim, index)
    with native("index_select" if want.numel() else None):
        got = torch.index_select(x.to(DEV), dim, index.to(DEV))
    same(got, want)


def _index_like(shape, dim, data, size):
    """A gather/scatter index: each dim at most x's (any size along ``dim``), values in [0, size)."""
    ishape = [data.draw(st.integers(0 if k != dim else 1, n)) for k, n in enumerate(shape)]
    return torch.randint(0, size, ishape)


@SETTINGS
@given(SHAPES, st.data(), st.sampled_from(MOVED))
def test_gather_and_scatter_match_cpu(shape, data, dtype):
    dim = data.draw(st.integers(0, len(shape) - 1))
    x = sample(shape, dtype)
    index = _index_like(shape, dim, data, shape[dim])
    want_g = torch.gather(x, dim, index)
    with native("gather" if want_g.numel() else None):
        got_g = torch.gather(x.to(DEV), dim, index.to(DEV))
    same(got_g, want_g)
    # torch leaves the winner of repeated scatter targets unspecified: scatter tensors through indices
    # distinct along dim (a prefix of a random permutation), a constant through any index
    unique = torch.rand(*index.shape[:dim], shape[dim], *index.shape[dim + 1:]).argsort(dim)
    unique = unique.narrow(dim, 0, index.shape[dim])
    src = sample(unique.shape, dtype)
    value = True if dtype == torch.bool else (2.5 if dtype.is_floating_point else 3)
    with native("scatter" if x.numel() else None):
        got_v = x.to(DEV).scatter(dim, index.to(DEV), value)
        got_s = x.to(DEV).scatter(dim, unique.to(DEV), src.to(DEV))
    same(got_v, x.scatter(dim, index, value))
    same(got_s, x.scatter(dim, unique, src))


@SETTINGS
@given(SHAPES, st.data(), st.sampled_from([torch.float32, torch.int32, torch.int64, torch.int16]))
def test_scatter_add_matches_cpu(shape, data, dtype):
    dim = data.draw(st.integers(0, len(shape) - 1))
    x = sample(shape, dtype) if dtype != torch.float32 else torch.randn(shape)
    index = _index_like(shape, dim, data, shape[dim])
    src = sample(index.shape, dtype) if dtype != torch.float32 else torch.randn(index.shape)
    with native("scatter_add" if x.numel() else None):
        got = torch.scatter_add(x.to(DEV), dim, index.to(DEV), src.to(DEV))
    want = torch.scatter_add(x, dim, index, src)  # integers wrap exactly; floats may differ in summation order
    if dtype.is_floating_point:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    else:
        same(got, want)


def test_scatter_reductions_that_add_are_native_and_others_run_on_the_cpu():
    x = torch.randn(4, 5)
    index = torch.tensor([[0, 1, 0, 3, 3], [2, 2, 2, 0, 1]])
    src = torch.randn(2, 5)
    with native("scatter", "scatter_reduce"):
        got_add = x.to(DEV).scatter(0, index.to(DEV), src.to(DEV), reduce="add")
        got_value = x.to(DEV).scatter(0, index.to(DEV), 1.5, reduce="add")
        got_sum = x.to(DEV).scatter_reduce(0, index.to(DEV), src.to(DEV), "sum")
        got_excl = x.to(DEV).scatter_reduce(0, index.to(DEV), src.to(DEV), "sum", include_self=False)
    close = lambda g, w: torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)
    close(got_add, x.scatter(0, index, src, reduce="add"))
    close(got_value, x.scatter(0, index, 1.5, reduce="add"))
    close(got_sum, x.scatter_reduce(0, index, src, "sum"))
    close(got_excl, x.scatter_reduce(0, index, src, "sum", include_self=False))
    before = torch.neuron.metrics()["fallback"].get("scatter_reduce.two", 0)
    xi, srci = x.to(torch.int32), src.to(torch.int32)  # integer amax: no exact FP32 path (float: test_scatter_gather)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got_max = xi.to(DEV).scatter_reduce(0, index.to(DEV), srci.to(DEV), "amax")
    assert torch.neuron.metrics()["fallback"]["scatter_reduce.two"] == before + 1
    close(got_max, xi.scatter_reduce(0, index, srci, "amax"))


def test_in_place_and_out_variants_write_through_views():
    x = torch.randn(4, 6)
    base = x.to(DEV)
    index = torch.tensor([[0, 2], [1, 1]])
    out = torch.empty(0, device=DEV)
    with native("scatter", "scatter_add", "index_select", "gather"):
        base[1:3].scatter_(1, index.to(DEV), -1.0)
        base[:, 4:].scatter_add_(0, index.to(DEV), torch.ones(2, 2).to(DEV))
        torch.index_select(base, 1, torch.tensor([5, 0]).to(DEV), out=out)
        gathered = torch.gather(base, 1, torch.tensor([[5], [4], [3], [2]]).to(DEV))
    x[1:3].scatter_(1, index, -1.0)
    x[:, 4:].scatter_add_(0, index, torch.ones(2, 2))
    same(base, x)
    same(out, torch.index_select(x, 1, torch.tensor([5, 0])))
    same(gathered, torch.gather(x, 1, torch.tensor([[5], [4], [3], [2]])))


# -- index_add / index_copy / index_fill / take / repeat_interleave -----------------------------------
@SETTINGS
@given(SHAPES, st.data(), st.sampled_from([torch.float32, torch.int64, torch.int32, torch.bfloat16]))
def test_index_add_copy_fill_match_cpu(shape, data, dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[dim]
    x = sample(shape, dtype) if not dtype.is_floating_point else torch.randn(shape).to(dtype)
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    index = torch.tensor(picks)
    src_shape = list(shape)
    src_shape[dim] = len(picks)
    src = sample(src_shape, dtype) if not dtype.is_floating_point else torch.randn(src_shape).to(dtype)
    repeated = torch.tensor(picks + picks[:1])  # index_add adds every repeat
    add_src = torch.cat([src, src.narrow(dim, 0, 1)], dim)
    value = 7 if not dtype.is_floating_point else -0.5
    with native("index_add", "index_copy", "index_fill"):
        got_add = x.to(DEV).index_add(dim, repeated.to(DEV), add_src.to(DEV))
        got_copy = x.to(DEV).index_copy(dim, index.to(DEV), src.to(DEV))
        got_fill = x.to(DEV).index_fill(dim, (index - n).to(DEV), value)  # negative indices wrap here
    want_add = x.index_add(dim, repeated, add_src)
    if dtype.is_floating_point:
        torch.testing.assert_close(got_add.cpu(), want_add)
    else:
        same(got_add, want_add)
    same(got_copy, x.index_copy(dim, index, src))
    same(got_fill, x.index_fill(dim, index - n, value))


def test_take_and_repeat_interleave_match_cpu():
    x = sample((3, 4, 5), torch.int64)
    index = torch.tensor([[0, -1], [59, 7]])
    repeats = torch.tensor([2, 0, 3, 0, 1, 0])
    with native("take", "repeat_interleave"):
        got_take = torch.take(x.to(DEV), index.to(DEV))
        got_rep = torch.repeat_interleave(repeats.to(DEV))
        got_rep32 = torch.repeat_interleave(repeats.int().to(DEV))
        rows = x.to(DEV).repeat_interleave(repeats[:3].to(DEV), dim=0)
    same(got_take, torch.take(x, index))
    same(got_rep, torch.repeat_interleave(repeats))
    same(got_rep32, torch.repeat_interleave(repeats.int()))
    same(rows, x.repeat_interleave(repeats[:3], dim=0))
    with pytest.raises(IndexError, match="tried to access index 60 on a tensor of 60 elements"):
        torch.take(x.to(DEV), torch.tensor([60]).to(DEV))
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(torch.tensor([1, -2]).to(DEV))


# -- exact index conversion and errors -----------------------------------------------------------------
BAD = [5, -1, 2**31, 2**32 + 1, -(2**31) - 1, 2**62]


@pytest.mark.parametrize("bad", BAD)
def test_out_of_range_indices_raise_torchs_errors_with_value_and_limit(bad):
    x = torch.randn(5, 3).to(DEV)
    index = torch.tensor([0, bad, 1])
    with pytest.raises(IndexError, match=f"index out of range in self.*{bad}.*size 5"):
        torch.index_select(x, 0, index.to(DEV))
    with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds for dimension 0 with size 5"):
        torch.gather(x, 0, index.view(3, 1).to(DEV))
    with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds for dimension 0 with size 5"):
        x.scatter(0, index.view(3, 1).to(DEV), 1.0)
    with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds for dimension 0 with size 5"):
        x.index_add(0, index.to(DEV), torch.ones(3, 3).to(DEV))
    if bad != -1:  # advanced indexing and index_fill wrap negative indices
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 0 with size 5"):
            x[index.to(DEV)]
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 0 with size 5"):
            x.index_fill(0, index.to(DEV), 1.0)


def test_indices_near_the_int32_limits_convert_exactly():
    n = 3
    x = torch.arange(n * 2.0).view(n, 2)
    index = torch.tensor([2, -3, -1, 0])  # negatives wrap in advanced indexing only
    with native("index"):
        got = x.to(DEV)[index.to(DEV)]
    same(got, x[index])


# -- advanced indexing -----------------------------------------------------------------------------------
def _cases(x):
    i = torch.tensor([2, 0, 2])
    m = x[0, :, 0] > 0
    return {
        "one": (i,),
        "negative": (i - 3,),
        "slice_then": (slice(None), torch.tensor([[3, 0], [1, -1]])),
        "adjacent": (slice(None), torch.tensor([1, 3]), torch.tensor([0, 4])),
        "separated": (torch.tensor([0, 2]), slice(None), torch.tensor([4, 1])),
        "broadcast": (i[:, None], torch.tensor([0, 1, 3])[None, :]),
        "mask_all": (x > 0,),
        "mask_dims": (slice(None), x[0] > 0),
        "int_and_mask": (torch.tensor([0, 2, 1, 1])[: int(m.sum())], m) if int(m.sum()) else (i,),
        "uint8_mask": (torch.tensor([1, 0, 2], dtype=torch.uint8),),
        "empty": (torch.tensor([], dtype=torch.int64),),
    }


@pytest.mark.parametrize("case", list(_cases(torch.randn(3, 4, 5))))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_advanced_indexing_matches_cpu(case, dtype):
    torch.manual_seed(1)
    x = sample((3, 4, 5), dtype)
    key = _cases(torch.randn(3, 4, 5))[case]
    if case == "uint8_mask":
        with pytest.warns(UserWarning, match="uint8"):
            want = x[key]
    else:
        want = x[key]
    dkey = tuple(k.to(DEV) if isinstance(k, torch.Tensor) else k for k in key)
    with native("index" if want.numel() else None):
        got = x.to(DEV)[dkey] if case != "uint8_mask" else _quiet(lambda: x.to(DEV)[dkey])
    same(got, want)


def _quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def test_index_tensors_may_live_on_the_cpu():
    x = torch.randn(4, 3)
    with native("index"):
        got = x.to(DEV)[torch.tensor([3, 1])]
    same(got, x[torch.tensor([3, 1])])


def test_a_single_index_with_a_stride_other_than_one():
    """torch.where(mask) of a one-element mask gives columns of its [1, 2] nonzero: shape [1], stride 2, which
    counts as contiguous (an MoE picking the tokens of an expert during generate() does this)."""
    x = torch.randn(5, 3)
    pairs = torch.tensor([[0, 4], [2, 1]])
    idx = pairs[0:1, 1]
    assert idx.shape == (1,) and idx.stride() == (2,) and idx.is_contiguous()
    with native("index"):
        got = x.to(DEV)[pairs.to(DEV)[0:1, 1]]
    same(got, x[idx])


@pytest.mark.parametrize("case", ["one", "negative", "adjacent", "separated", "broadcast", "mask_all", "mask_dims"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_matches_cpu(case, accumulate):
    torch.manual_seed(2)
    x = torch.randn(3, 4, 5)
    key = _cases(x)[case]
    shape = x[key].shape
    # values broadcast along the index dims, so repeated targets (index 2 twice) receive the same values
    values = torch.randn(shape[-1:]) if case != "mask_all" else torch.randn(())
    want = _put(x.clone(), key, values, accumulate)
    got = x.to(DEV)
    with native("index_put_"):
        _put(got, key, values.to(DEV), accumulate)
    if accumulate:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    else:
        same(got, want)


def _put(x, key, values, accumulate):
    """aten index_put_ with full slices as None (the form advanced-indexing assignment reaches)."""
    indices = [None if isinstance(k, slice) else k.to(x.device) for k in key]
    return torch.ops.aten.index_put_(x, indices, values, accumulate)


def test_setitem_with_masks_and_integer_values_is_exact():
    x = torch.randint(-2**40, 2**40, (4, 6))
    mask = x > 0
    got = x.to(DEV)
    with native("index_put_"):
        got[mask.to(DEV)] = torch.tensor(2**35 + 3)
        got[torch.tensor([0, -1]).to(DEV), 2:4] = torch.tensor([[7, 8]]).to(DEV)
    x[mask] = 2**35 + 3
    x[torch.tensor([0, -1]), 2:4] = torch.tensor([[7, 8]])
    same(got, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32])
def test_updates_with_no_indices_leave_the_tensor_unchanged(dtype):
    """index_put_(accumulate=True) with an empty index and index_add with alpha != 1 and an empty source (an
    MoE expert that receives no tokens) change nothing, in every dtype."""
    base = sample((5, 4), dtype)
    none = torch.zeros(0, dtype=torch.long)
    for accumulate in (True, False):
        same(base.to(DEV).index_put_((none.to(DEV),), sample((0, 4), dtype).to(DEV), accumulate=accumulate),
             base.clone().index_put_((none,), sample((0, 4), dtype), accumulate=accumulate))
    src = sample((0, 4), dtype)
    same(base.to(DEV).index_add(0, none.to(DEV), src.to(DEV), alpha=2), base.index_add(0, none, src, alpha=2))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16])
def test_index_add_with_alpha_matches_cpu_in_every_dtype(dtype):
    """source * alpha is the device's own multiply: exact for int64 values beyond 32 bits (wrapping as torch)."""
    x, src = sample((6, 3), dtype), sample((4, 3), dtype)
    idx = torch.tensor([0, 5, 0, 2])
    for alpha in (2, -3):
        got, want = x.to(DEV).index_add(0, idx.to(DEV), src.to(DEV), alpha=alpha), x.index_add(0, idx, src, alpha=alpha)
        if dtype.is_floating_point:  # the CPU fuses x + alpha * src; as test_index_add_copy_fill_match_cpu
            torch.testing.assert_close(got.cpu(), want)
        else:
            same(got, want)


@pytest.mark.parametrize("call", [
    lambda x, i, s: x.scatter(0, i, s), lambda x, i, s: x.scatter_add(0, i, s),
    lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False), lambda x, i, s: x.index_add(0, i, s),
    lambda x, i, s: x.index_reduce(0, i, s, "prod")])
def test_an_empty_target_still_rejects_every_index(call):
    """Nothing is written into an empty tensor, yet an index into it is out of range: the op's out-of-range error
    (as for a non-empty one), as the CPU raises one (the empty shortcut used to skip the check)."""
    x, i, s = torch.zeros(0), torch.tensor([0]), torch.ones(1)
    with pytest.raises((RuntimeError, IndexError)):
        call(x, i, s)
    each_ops_message = "index 0 is out of bounds for dimension 0 with size 0|index out of range in self"
    with pytest.raises((RuntimeError, IndexError), match=each_ops_message):
        call(x.to(DEV), i.to(DEV), s.to(DEV))


def test_index_copy_into_an_empty_target_names_the_index():
    """The CPU fails here inside its storage code ("setStorage: ... out of bounds for storage of size 0"); the
    device gives index_copy_'s own out-of-bounds error."""
    with pytest.raises(IndexError, match=r"index_copy_\(\): index 0 is out of bounds for dimension 0 with size 0"):
        torch.zeros(0, device=DEV).index_copy(0, torch.tensor([0], device=DEV), torch.ones(1, device=DEV))


def test_index_put_errors_are_torchs():
    x = torch.randn(3, 4).to(DEV)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x.index_put_((torch.tensor([0, 1]).to(DEV),), torch.randn(3).to(DEV))
    with pytest.raises(RuntimeError, match="dtypes match"):
        x.index_put_((torch.tensor([0]).to(DEV),), torch.randn(4, dtype=torch.float64).to(DEV))
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x.index_put_((torch.tensor([3]).to(DEV),), torch.randn(4).to(DEV))
    with pytest.raises(IndexError, match="The shape of the mask"):
        x[torch.ones(4, dtype=torch.bool).to(DEV)]


# -- nonzero / masked_select -------------------------------------------------------------------------------
@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=0, max_size=3),
       st.sampled_from([torch.bool, torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.uint8]))
def test_nonzero_matches_cpu(shape, dtype):
    x = sample(shape, dtype)
    if dtype != torch.bool:
        x = torch.where(torch.rand(shape) > 0.5, x, torch.zeros((), dtype=dtype))
    want = torch.nonzero(x)
    with native("nonzero" if x.numel() else None):
        got = torch.nonzero(x.to(DEV))
    same(got, want)


def test_nonzero_compares_values():
    x = torch.tensor([0.0, -0.0, float("nan"), 1e-30, float("-inf")])
    wide = torch.tensor([0, 2**32, -(2**32), 1, 0])  # nonzero only in the high word
    with native("nonzero"):
        got, got_wide = torch.nonzero(x.to(DEV)), torch.nonzero(wide.to(DEV))
    same(got, torch.nonzero(x))
    same(got_wide, torch.nonzero(wide))


@SETTINGS
@given(SHAPES, st.sampled_from(MOVED), st.booleans())
def test_masked_select_matches_cpu(shape, dtype, broadcast_mask):
    x = sample(shape, dtype)
    mask = torch.rand(shape[-1:] if broadcast_mask else shape) > 0.4
    want = torch.masked_select(x, mask)
    with native("masked_select"):
        got = torch.masked_select(x.to(DEV), mask.to(DEV))
    same(got, want)


# -- gradients ------------------------------------------------------------------------------------------
def test_gradients_through_indexing_match_cpu():
    x = torch.randn(5, 4, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    idx = torch.tensor([4, 0, 4, 2])
    g1, g2, g3 = torch.randn(4, 4), torch.randn(5, 2), torch.randn(3, 4)
    for t, dev in ((x, lambda v: v), (xd, lambda v: v.to(DEV))):
        (t[dev(idx)] * dev(g1)).sum().backward()
        (torch.gather(t, 1, dev(torch.tensor([[1, 3]] * 5))) * dev(g2)).sum().backward()
        (torch.index_select(t, 0, dev(idx[:3])) * dev(g3)).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_accumulation_over_many_duplicates_rounds_once(dtype):
    # the DMA scatter rounded into the 16-bit table once per 128 values (0.25 off with ~8 adds per slot);
    # index_put_(accumulate) and index_add now sum in fp32 and round once
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(5, 5, 5, generator=g) * 5).to(dtype)
    i = [torch.randint(0, 5, (10, 1, 1), generator=g), torch.randint(0, 5, (1, 9, 1), generator=g),
         torch.randint(0, 5, (1, 1, 11), generator=g)]
    v = (torch.randn(10, 9, 11, generator=g) * 5).to(dtype)
    with native("index_put_"):
        got = x.to(DEV).index_put_([t.to(DEV) for t in i], v.to(DEV), accumulate=True)
    want = x.float().index_put_(i, v.float(), accumulate=True).to(dtype)
    assert torch.equal(got.cpu(), want)
    idx = torch.randint(0, 5, (300,), generator=g)
    src = (torch.randn(5, 300, 5, generator=g) * 5).to(dtype)
    with native("index_add"):
        got = torch.index_add(x.to(DEV), 1, idx.to(DEV), src.to(DEV))
    assert torch.equal(got.cpu(), torch.index_add(x.float(), 1, idx, src.float()).to(dtype))
