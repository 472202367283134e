"""Reducing scatters on the neuron device against PyTorch CPU: scatter_reduce (sum, prod, mean, amax, amin,
with and without self), index_reduce, scatter(reduce="add" / "multiply"): repeated targets, NaN, bfloat16
(computed in float32, rounded once), in-place / out= / views, 0-d and empty indices, chunked and CPU paths."""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

from torch_neuron.ops.indexing import scatter_reduce as sr

DEV = "neuron"
REDUCES = ["sum", "prod", "mean", "amax", "amin"]
SETTINGS = settings(max_examples=20, deadline=None)


def expected(fn, dtype, *args):
    """The CPU result; bfloat16 as the float32 computation rounded once (the device's rule)."""
    if dtype == torch.bfloat16:
        args = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        return fn(*args).to(dtype)
    return fn(*args)


def close(got, want, reduce):
    assert got.device.type == DEV
    if reduce in ("amax", "amin"):  # selections: bit-exact
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)


def values(shape, seed, nan: bool):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(shape, generator=g) + 0.5
    if nan and v.numel() > 2:
        v.view(-1)[seed % v.numel()] = math.nan
    return v


@st.composite
def scatter_case(draw):
    nd = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    dim = draw(st.integers(-nd, nd - 1))
    # the index may be shorter than x in every dim but dim, and longer along dim (repeated targets)
    ishape = [draw(st.integers(1, 6)) if k == dim % nd else draw(st.integers(1, s)) for k, s in enumerate(shape)]
    sshape = [s + draw(st.integers(0, 1)) for s in ishape]
    seed = draw(st.integers(0, 2**16))
    index = torch.randint(0, shape[dim], ishape, generator=torch.Generator().manual_seed(seed))
    return shape, dim, index, sshape, seed


@SETTINGS
@given(case=scatter_case(), reduce=st.sampled_from(REDUCES), include_self=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), nan=st.booleans())
def test_scatter_reduce_matches_cpu(case, reduce, include_self, dtype, nan):
    shape, dim, index, sshape, seed = case
    x, src = values(shape, seed, nan).to(dtype), values(sshape, seed + 1, nan).to(dtype)
    with native("scatter_reduce"):
        got = x.to(DEV).scatter_reduce(dim, index.to(DEV), src.to(DEV), reduce, include_self=include_self)
    fn = lambda a, b: a.scatter_reduce(dim, index, b, reduce, include_self=include_self)  # noqa: E731
    close(got, expected(fn, dtype, x, src), reduce)


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(),
       reduce=st.sampled_from(["prod", "mean", "amax", "amin"]), include_self=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), nan=st.booleans())
def test_index_reduce_matches_cpu(shape, data, reduce, include_self, dtype, nan):
    dim = data.draw(st.integers(0, len(shape) - 1))
    m = data.draw(st.integers(1, 7))
    seed = data.draw(st.integers(0, 2**16))
    index = torch.randint(0, shape[dim], (m,), generator=torch.Generator().manual_seed(seed))
    sshape = shape[:dim] + [m] + shape[dim + 1:]
    x, src = values(shape, seed, nan).to(dtype), values(sshape, seed + 1, nan).to(dtype)
    with native("index_reduce"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # index_reduce is beta
        got = x.to(DEV).index_reduce(dim, index.to(DEV), src.to(DEV), reduce, include_self=include_self)
        want = expected(lambda a, b: a.index_reduce(dim, index, b, reduce, include_self=include_self), dtype, x, src)
    close(got, want, reduce)


def test_repeated_targets_and_nan_reduce_like_the_cpu():
    x = torch.tensor([1.0, math.nan, 3.0, -4.0, 5.0])
    index = torch.tensor([0, 0, 1, 3, 3, 3])
    src = torch.tensor([2.0, math.nan, 7.0, -1.0, -2.0, 0.5])
    for reduce in REDUCES:
        for include_self in (True, False):
            with native("scatter_reduce"):
                got = x.to(DEV).scatter_reduce(0, index.to(DEV), src.to(DEV), reduce, include_self=include_self)
            close(got, x.scatter_reduce(0, index, src, reduce, include_self=include_self), reduce)


def test_scatter_add_and_multiply_are_native():
    x = torch.randn(4, 5)
    index = torch.tensor([[0, 1, 0, 3, 3], [2, 2, 2, 0, 1], [0, 0, 0, 0, 0]])
    src = torch.randn(3, 5) + 1
    with native("scatter"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scatter(reduce=) is deprecated
        got = {(r, kind): x.to(DEV).scatter(0, index.to(DEV), src.to(DEV) if kind == "src" else 1.5, reduce=r)
               for r in ("add", "multiply") for kind in ("src", "value")}
        for (r, kind), g in got.items():
            torch.testing.assert_close(g.cpu(), x.scatter(0, index, src if kind == "src" else 1.5, reduce=r))


def test_in_place_out_and_views():
    x = torch.randn(5, 8)
    index = torch.tensor([[0, 2, 2], [1, 1, 0]])
    src = torch.randn(2, 3)
    base = x.to(DEV)
    out = torch.empty(0, device=DEV)
    with native("scatter_reduce", "index_reduce"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base[1:4, ::2].scatter_reduce_(1, index.to(DEV), src.to(DEV), "amax", include_self=False)
        torch.scatter_reduce(x.to(DEV).t(), 0, index.t().to(DEV), src.t().to(DEV), "prod", out=out)
        y = x.to(DEV).t()
        y.index_reduce_(1, torch.tensor([4, 0, 4]).to(DEV), torch.ones(8, 3).to(DEV) * 2, "mean")
        out2 = torch.empty(5, 8, device=DEV)
        torch.index_reduce(x.to(DEV), 0, torch.tensor([1, 1]).to(DEV), src[:, :1].expand(2, 8).to(DEV), "amin",
                           out=out2)
    want = x.clone()
    want[1:4, ::2].scatter_reduce_(1, index, src, "amax", include_self=False)
    torch.testing.assert_close(base.cpu(), want)
    torch.testing.assert_close(out.cpu(), x.t().scatter_reduce(0, index.t(), src.t(), "prod"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want_y = x.t().index_reduce(1, torch.tensor([4, 0, 4]), torch.ones(8, 3) * 2, "mean")
        torch.testing.assert_close(y.cpu(), want_y)
        torch.testing.assert_close(out2.cpu(), x.index_reduce(0, torch.tensor([1, 1]), src[:, :1].expand(2, 8), "amin"))


def test_zero_dim_and_empty_index():
    x, src = torch.tensor(3.0), torch.tensor(-2.0)
    with native("scatter_reduce"):
        got = x.to(DEV).scatter_reduce(0, torch.tensor(0).to(DEV), src.to(DEV), "amin", include_self=False)
    assert got.shape == () and got.item() == -2.0
    y = torch.randn(3, 4)
    empty = torch.empty(0, 4, dtype=torch.int64)
    got = y.to(DEV).scatter_reduce(0, empty.to(DEV), torch.empty(0, 4).to(DEV), "prod")
    torch.testing.assert_close(got.cpu(), y)


def test_many_targets_run_in_blocks(monkeypatch):
    monkeypatch.setattr(sr, "CHUNK", 64)  # several blocks of targets and one cat
    x = torch.randn(3, 50)
    index = torch.randint(0, 50, (3, 40))
    src = torch.randn(3, 40)
    with native("scatter_reduce"):
        got = x.to(DEV).scatter_reduce(1, index.to(DEV), src.to(DEV), "amax", include_self=False)
    close(got, x.scatter_reduce(1, index, src, "amax", include_self=False), "amax")


def _fallbacks(name):
    return torch.neuron.metrics()["fallback"].get(name, 0)


def test_integers_and_oversized_products_take_the_cpu(monkeypatch):
    xi = torch.randint(-5, 5, (4, 5), dtype=torch.int32)
    index = torch.tensor([[0, 1, 0, 3, 3]])
    before = _fallbacks("scatter_reduce.two")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = xi.to(DEV).scatter_reduce(0, index.to(DEV), xi[:1].to(DEV), "amax")
        monkeypatch.setattr(sr, "DENSE_MAX", 4)
        x = torch.randn(4, 5)
        got_f = x.to(DEV).scatter_reduce(0, index.to(DEV), x[:1].to(DEV), "prod")
    assert _fallbacks("scatter_reduce.two") == before + 2
    torch.testing.assert_close(got.cpu(), xi.scatter_reduce(0, index, xi[:1], "amax"))
    torch.testing.assert_close(got_f.cpu(), x.scatter_reduce(0, index, x[:1], "prod"))


def test_out_of_range_indices_raise_like_the_cpu():
    x = torch.zeros(3, 4, device=DEV)
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0 with size 3"):
        x.scatter_reduce(0, torch.tensor([[5]], device=DEV), torch.ones(1, 4, device=DEV), "amax")
    with pytest.raises(IndexError, match="index out of range in self"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x.index_reduce(0, torch.tensor([-1], device=DEV), torch.ones(1, 4, device=DEV), "amax")


# -- segment_reduce ----------------------------------------------------------------------------------------
def _lengths(draw, rows: int, d: int, s: int, exact: bool):
    """[rows, s] non-negative lengths, each row summing to d (or at most d when not ``exact``)."""
    out = []
    for _ in range(rows):
        cuts = sorted(draw(st.lists(st.integers(0, d), min_size=s - 1, max_size=s - 1)))
        end = d if exact else draw(st.integers(cuts[-1] if cuts else 0, d))
        edges = [0, *cuts, end]
        out.append([b - a for a, b in zip(edges, edges[1:])])
    return torch.tensor(out, dtype=torch.int64)


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(),
       reduce=st.sampled_from(["max", "min", "sum", "prod", "mean"]), initial=st.sampled_from([None, 2.0, -1.5]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), nan=st.booleans(), unsafe=st.booleans(),
       kind=st.sampled_from(["lengths", "offsets"]))
def test_segment_reduce_matches_cpu(shape, data, reduce, initial, dtype, nan, unsafe, kind):
    axis = data.draw(st.integers(0, len(shape) - 1))
    rows = math.prod(shape[:axis])
    s = data.draw(st.integers(1, 4))
    lengths = _lengths(data.draw, rows, shape[axis], s, exact=not unsafe).view(*shape[:axis], s)
    seg = {"lengths": lengths}
    if kind == "offsets":
        seg = {"offsets": torch.cat([torch.zeros_like(lengths[..., :1]), lengths.cumsum(-1)], -1)}
    x = values(shape, data.draw(st.integers(0, 2**16)), nan).to(dtype)
    with native("segment_reduce"):
        got = torch._segment_reduce(x.to(DEV), reduce, **{k: v.to(DEV) for k, v in seg.items()}, axis=axis,
                                    unsafe=unsafe, initial=initial)
    fn = lambda a: torch._segment_reduce(a, reduce, **seg, axis=axis, unsafe=unsafe, initial=initial)  # noqa: E731
    close(got, expected(fn, dtype, x), "amax" if reduce in ("max", "min") else reduce)


def test_segment_reduce_checks_like_the_cpu():
    x = torch.ones(2, 5, device=DEV)
    with pytest.raises(RuntimeError, match="lengths contains negative value"):
        torch._segment_reduce(x, "sum", lengths=torch.tensor([[2, -1, 4], [1, 4, 0]], device=DEV), axis=1)
    with pytest.raises(RuntimeError, match="sum to data.size"):
        torch._segment_reduce(x, "sum", lengths=torch.tensor([[2, 1, 1], [1, 4, 0]], device=DEV), axis=1)
    with pytest.raises(RuntimeError, match="segment_length >= 0"):
        torch._segment_reduce(x, "sum", offsets=torch.tensor([[0, 3, 2, 5], [0, 1, 5, 5]], device=DEV), axis=1)
    with pytest.raises(RuntimeError, match="last dimension of lengths"):
        torch._segment_reduce(x, "sum", lengths=torch.tensor([[2, 3], [1, 4]], device=DEV), axis=0)
    # offsets starting past 0 skip the leading elements
    offsets = torch.tensor([[1, 3, 3, 4], [0, 1, 5, 5]])
    y = torch.randn(2, 5)
    with native("segment_reduce"):
        got = torch._segment_reduce(y.to(DEV), "max", offsets=offsets.to(DEV), axis=1, unsafe=True)
    close(got, torch._segment_reduce(y, "max", offsets=offsets, axis=1, unsafe=True), "amax")


# -- embedding_renorm_ -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf])
def test_embedding_renorm_matches_cpu(dtype, norm_type):
    weight = (torch.randn(10, 4, generator=torch.Generator().manual_seed(3)) * 2).to(dtype)
    indices = torch.tensor([[1, 2, 9], [1, 7, 2]])  # repeated rows are renormed once
    want = weight.clone()
    torch.embedding_renorm_(want, indices, 1.5, norm_type)
    got = weight.to(DEV)
    with native("embedding_renorm_"):
        torch.embedding_renorm_(got, indices.to(DEV), 1.5, norm_type)
        out = torch.nn.functional.embedding(indices.to(DEV), weight.to(DEV), max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(out.cpu(), torch.nn.functional.embedding(indices, weight.clone(), max_norm=1.5,
                                                                        norm_type=norm_type))


# -- _embedding_bag_forward_only ---------------------------------------------------------------------------
@SETTINGS
@given(data=st.data(), mode=st.sampled_from([0, 1, 2]), pad=st.sampled_from([-1, 0, 3]), last=st.booleans(),
       weighted=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]), nan=st.booleans(),
       itypes=st.sampled_from([(torch.int64, torch.int64), (torch.int32, torch.int32), (torch.int32, torch.int64)]))
def test_embedding_bag_forward_only_matches_cpu(data, mode, pad, last, weighted, dtype, nan, itypes):
    num, dim = data.draw(st.integers(4, 7)), data.draw(st.integers(1, 5))
    n = data.draw(st.integers(1, 9))
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, num, (n,), generator=g).to(itypes[0])
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=0, max_size=4)))
    offsets = torch.tensor([0, *cuts, *([n] if last else [])]).to(itypes[1])
    weight = values((num, dim), seed, nan).to(dtype)
    psw = values((n,), seed + 1, False).to(dtype) if weighted and mode == 0 else None
    args = (weight, indices, offsets, False, mode, False, psw, last, pad)
    with native("embedding_bag"):
        got = torch.ops.aten._embedding_bag_forward_only(*[a.to(DEV) if isinstance(a, torch.Tensor) else a
                                                          for a in args])
    fn = lambda w, p: torch.ops.aten._embedding_bag_forward_only(w, *args[1:6], p, *args[7:])  # noqa: E731
    want = torch.ops.aten._embedding_bag_forward_only(*args)
    close(got[0], expected(lambda w, p: fn(w, p)[0], dtype, weight, psw), "amax" if mode == 2 else "sum")
    for g_aux, w_aux in zip(got[1:], want[1:]):
        assert g_aux.dtype == w_aux.dtype
        torch.testing.assert_close(g_aux.cpu(), w_aux, rtol=0, atol=0)


def test_embedding_bag_module_paths_and_errors():
    weight = torch.randn(6, 3)
    x = torch.tensor([[1, 2, 2], [5, 0, 1]])
    with native("embedding_bag", "embedding_renorm_"):
        got = torch.nn.functional.embedding_bag(x.to(DEV), weight.to(DEV), mode="max", max_norm=1.0)
    torch.testing.assert_close(got.cpu(), torch.nn.functional.embedding_bag(x, weight.clone(), mode="max",
                                                                             max_norm=1.0))
    fwd = torch.ops.aten._embedding_bag_forward_only
    idx, w = torch.tensor([1, 2, 9], device=DEV), weight.to(DEV)
    with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0"):
        fwd(w, torch.tensor([1, 2], device=DEV), torch.tensor([1], device=DEV), False, 0, False, None, False, -1)
    with pytest.raises(RuntimeError, match="found idx to be 9"):
        fwd(w, idx, torch.tensor([0, 1], device=DEV), False, 1, False, None, False, -1)


@pytest.mark.parametrize("pad", [-1, 2])
def test_embedding_bag_max_follows_the_cpu_loop(pad):
    # a NaN counts only as its bag's first element; max_indices name the first maximum; empty bags are 0
    weight = torch.tensor([[1.0, 5.0], [math.nan, 2.0], [3.0, math.nan], [0.0, 0.0], [3.0, 7.0]])
    indices, offsets = torch.tensor([0, 1, 2, 4, 1, 3, 2, 1, 0]), torch.tensor([0, 3, 3, 5, 7])
    args = (weight, indices, offsets, False, 2, False, None, False, pad)
    with native("embedding_bag"):
        got = torch.ops.aten._embedding_bag_forward_only(*[a.to(DEV) if isinstance(a, torch.Tensor) else a
                                                          for a in args])
    for g, w in zip(got, torch.ops.aten._embedding_bag_forward_only(*args)):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_with_grad_runs_the_forward_natively(mode):
    weight = torch.randn(6, 3)
    x, offsets = torch.tensor([1, 2, 2, 5, 0, 1]), torch.tensor([0, 2, 6])
    w_dev, code = weight.to(DEV).requires_grad_(), ["sum", "mean", "max"].index(mode)
    with native("embedding_bag"):
        got = torch.ops.aten._embedding_bag(w_dev, x.to(DEV), offsets.to(DEV), False, code, False, None, True, -1)
    want = torch.ops.aten._embedding_bag(weight.requires_grad_(), x, offsets, False, code, False, None, True, -1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.detach().cpu(), w.detach(), rtol=0, atol=1e-6)
