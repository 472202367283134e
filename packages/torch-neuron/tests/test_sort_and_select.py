"""Sorting, selection and scans on neuron against PyTorch CPU: sort/argsort/msort (stable, descending, any dim),
topk, kthvalue, median/nanmedian, mode, searchsorted/bucketize, isin, cummax/cummin, logcumsumexp, cumprod,
unique/unique_consecutive — shapes, dims, duplicates, NaN/inf, non-contiguous inputs, out=, and which calls
run natively (no CPU fallback) or take the counted CPU path."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

DEV = "neuron"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
NAN, INF = float("nan"), float("inf")
SPECIAL = (NAN, INF, -INF, 0.0, -0.0, 1.0, 1.0, 2.0)  # duplicates on purpose


def same(dev, ref):
    """Exactly equal: dtype, shape, values, NaN positions."""
    if isinstance(ref, tuple):
        assert len(dev) == len(ref)
        for a, b in zip(dev, ref):
            same(a, b)
        return
    assert dev.device.type == DEV
    assert dev.dtype == ref.dtype and dev.shape == ref.shape, (dev.dtype, dev.shape, ref.dtype, ref.shape)
    torch.testing.assert_close(dev.cpu(), ref, rtol=0, atol=0, equal_nan=True)


def tensors(dtype, shape, seed, special=True):
    """Random values with duplicates, and (floats) NaN/inf/signed zeros sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randint(-4, 5, shape, generator=g).float() * 0.5
        if special and x.numel():
            pick = torch.randint(0, len(SPECIAL), shape, generator=g)
            mask = torch.rand(shape, generator=g) < 0.25
            x = torch.where(mask, torch.tensor(SPECIAL)[pick], x)
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.int64:  # every 64-bit value: words that tie high and differ low, and duplicates
        hi = torch.randint(-3, 3, shape, generator=g) << 32
        lo = torch.randint(0, 2**32, shape, generator=g) if torch.rand((), generator=g) < 0.5 else \
            torch.randint(0, 3, shape, generator=g)
        edges = torch.tensor([torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max, -1, 0])
        pick = torch.rand(shape, generator=g) < 0.1
        return torch.where(pick, edges[torch.randint(0, 4, shape, generator=g)], hi + lo)
    lo, hi = {torch.int32: (-(2**31), 2**31 - 1), torch.uint8: (0, 256)}.get(dtype, (-100, 100))
    if dtype == torch.int32 and torch.rand((), generator=g) < 0.5:
        lo, hi = -5, 5  # duplicates
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


shapes = st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple)
dtypes = st.sampled_from((*FLOATS, torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool))


# -- sort ----------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(shape=shapes, dtype=dtypes, data=st.data(), seed=st.integers(0, 2**16))
def test_sort_stable(shape, dtype, data, seed):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    desc = data.draw(st.booleans())
    x = tensors(dtype, shape, seed)
    with native():
        got = torch.sort(x.to(DEV), dim=dim, descending=desc, stable=True)
    same(got, torch.sort(x, dim=dim, descending=desc, stable=True))


def test_sort_default_argsort_msort_noncontiguous():
    x = tensors(torch.float32, (6, 9), 1)
    d = x.to(DEV).t()
    with native():
        v, i = torch.sort(d, 1)
        a = torch.argsort(d, dim=0, descending=True, stable=True)
        m = torch.msort(d)
    ref_v, _ = torch.sort(x.t(), 1)
    same(v, ref_v)
    # an unstable sort's tie order is unspecified: the indices must point at the sorted values
    torch.testing.assert_close(torch.gather(x.t(), 1, i.cpu()), ref_v, rtol=0, atol=0, equal_nan=True)
    same(a, torch.argsort(x.t(), dim=0, descending=True, stable=True))
    same(m, torch.msort(x.t()))


def test_sort_out_and_trivial():
    x = tensors(torch.float32, (3, 5), 2)
    v, i = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    with native():
        torch.sort(x.to(DEV), dim=0, stable=True, out=(v, i))
        zero_d = torch.sort(torch.tensor(2.0, device=DEV))
        empty = torch.sort(torch.empty(0, 3, device=DEV), dim=0)
    same((v, i), torch.sort(x, dim=0, stable=True))
    same(zero_d, torch.sort(torch.tensor(2.0)))
    same(empty, torch.sort(torch.empty(0, 3), dim=0))


def test_sort_long_row():
    x = torch.randint(-50, 50, (5000,)).float()  # rows longer than one comparison block: slices of i
    with native():
        got = torch.sort(x.to(DEV), stable=True, descending=True)
    same(got, torch.sort(x, stable=True, descending=True))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.int32, torch.int64))
def test_sort_of_long_rows_is_native_and_matches_cpu(dtype):
    """Rows of thousands of elements (few rows: spread across partitions; many: one per partition) and rows beyond
    the old 16384 limit sort on the device by the network, stable, NaN largest, in both directions."""
    for shape in ((3, 5000), (130, 300), (1, 20000)):
        x = tensors(dtype, shape, sum(shape))
        for desc in (False, True):
            with native("sort"):
                got = torch.sort(x.to(DEV), descending=desc, stable=True)
            same(got, torch.sort(x, descending=desc, stable=True))


def test_sort_is_one_launch_with_int64_indices():
    x = torch.randn(200, 1000)
    d = x.to(DEV)
    torch.neuron.reset_metrics()
    with native("sort"):
        got = torch.sort(d, stable=True)
    assert torch.neuron.metrics()["programs"] == {"sort": 1}
    same(got, torch.sort(x, stable=True))


def test_selection_of_long_rows_is_native():
    """topk with a large k, kthvalue and median of rows longer than the old rank sort's limit, and a stable argsort
    of int64 expert ids (MoE routing's token order), all by the network."""
    x = torch.randperm(40000).float().view(2, 20000) * 0.25  # distinct: torch's order of topk ties is libstdc++'s
    x[0, 7] = NAN
    d = x.to(DEV)
    with native("topk", "kthvalue", "median"):
        got = [torch.topk(d, 3000, largest=False), torch.kthvalue(d, 12345), torch.median(d, 1),
               torch.median(d[1])]
    same(got[0], torch.topk(x, 3000, largest=False))
    same(got[1], torch.kthvalue(x, 12345))
    same(got[2].values, torch.median(x, 1).values)
    same(got[3], torch.median(x[1]))
    experts = torch.randint(0, 8, (4096,))
    with native("sort"):
        same(torch.argsort(experts.to(DEV), stable=True), torch.argsort(experts, stable=True))


def test_unstable_int64_sorts_of_long_rows_and_topk_half_take_cpu_path():
    """int64 keys tie often (token and expert ids): where torch's order of ties is libstdc++'s (stable=False
    beyond 16 elements, topk of 16-bit floats) the CPU gives it; stable int64 sorts run on the device."""
    torch.neuron.reset_metrics()
    x = torch.randint(0, 4, (40,))  # transformers' MoE routing: torch.sort(expert_ids)
    v, i = torch.sort(x.to(DEV))
    same(v, torch.sort(x)[0])
    assert torch.neuron.metrics()["fallback"]
    with native("sort"):
        same(torch.sort(x.to(DEV), stable=True), torch.sort(x, stable=True))
        same(torch.argsort(x.to(DEV), stable=True, descending=True), torch.argsort(x, stable=True, descending=True))
    torch.neuron.reset_metrics()
    h = torch.randn(9).bfloat16()  # torch's order of tied values is libstdc++'s: the CPU gives it
    same(torch.topk(h.to(DEV), 3), torch.topk(h, 3))
    assert torch.neuron.metrics()["fallback"]


# -- selection -----------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16), dtype=st.sampled_from((*FLOATS, torch.int64)))
def test_kthvalue_median_nanmedian(shape, data, seed, dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdim = data.draw(st.booleans())
    x = tensors(dtype, shape, seed)
    d = x.to(DEV)
    k = data.draw(st.integers(1, shape[dim]))
    with native():
        got = [torch.median(d, dim, keepdim), torch.nanmedian(d, dim, keepdim), torch.median(d),
               torch.nanmedian(d), torch.kthvalue(d, k, dim, keepdim)]
    ref = [torch.median(x, dim, keepdim), torch.nanmedian(x, dim, keepdim), torch.median(x), torch.nanmedian(x)]
    for g, r in zip(got[:2], ref[:2]):
        same(g.values, r.values)
        # torch picks any index holding the median among equal values: check it holds the value
        idx = (g.indices if keepdim else g.indices.unsqueeze(dim)).cpu()
        torch.testing.assert_close(torch.gather(x, dim, idx), r.values if keepdim else r.values.unsqueeze(dim),
                                   rtol=0, atol=0, equal_nan=True)
    same(got[2], ref[2])
    same(got[3], ref[3])
    kv = torch.kthvalue(x, k, dim, keepdim)
    same(got[4].values, kv.values)


def test_selection_of_empty_rows():
    x = torch.empty(0, 3)
    with native():
        got = [torch.kthvalue(x.to(DEV), 1, 1), torch.median(x.to(DEV), 1), torch.nanmedian(x.to(DEV), 1, True),
               torch.cummax(x.to(DEV), 1), torch.logcumsumexp(x.to(DEV), 1)]
    ref = [torch.kthvalue(x, 1, 1), torch.median(x, 1), torch.nanmedian(x, 1, True), torch.cummax(x, 1),
           torch.logcumsumexp(x, 1)]
    for g, r in zip(got, ref):
        same(tuple(g) if isinstance(r, tuple) else g, tuple(r) if isinstance(r, tuple) else r)


def test_median_nan_index_is_first_nan():
    x = torch.tensor([[3.0, NAN, 1.0, NAN], [1.0, 2.0, 3.0, 4.0]])
    with native():
        got = torch.median(x.to(DEV), 1)
    same(got, torch.median(x, 1))


def test_topk():
    x = torch.randn(4, 33)  # distinct values: torch's order of ties is unspecified
    x[0, 3] = NAN
    for largest in (True, False):
        for dim, k in ((1, 5), (0, 2), (1, 0)):
            with native():
                got = torch.topk(x.to(DEV), k, dim, largest)
            same(got, torch.topk(x, k, dim, largest))
    v, i = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    torch.topk(x.to(DEV), 3, out=(v, i))
    same((v, i), torch.topk(x, 3))


def test_topk_with_ties_gives_torchs_indices():
    """float32 rows do tie in models (a zero router, ReLU'd indexer scores, -inf masked keys): the selection and
    order of tied indices are libstdc++'s on the CPU, so such calls take the CPU's answer; no tie stays native."""
    ninf = float("-inf")
    rows = [torch.full((3, 4), 0.5), torch.tensor([[0.1, 0.5, 0.3, 0.5, 0.5]]),
            torch.tensor([[0.0, 0.0, 1.0, 0.0, ninf, ninf], [2.0, ninf, ninf, ninf, ninf, ninf]])]
    for x in rows:
        for k in (1, 2, 3):
            same(torch.topk(x.to(DEV), k), torch.topk(x, k))
    torch.neuron.reset_metrics()
    same(torch.topk(rows[0].to(DEV), 2), torch.topk(rows[0], 2))
    assert torch.neuron.metrics()["fallback"].get("topk")
    torch.neuron.reset_metrics()
    x = torch.tensor([[0.5, 0.5, 0.1, 0.9]])  # the tie is below the selected head: native
    same(torch.topk(x.to(DEV), 1), torch.topk(x, 1))
    assert not torch.neuron.metrics()["fallback"]


def test_mode():
    x = torch.tensor([[3.0, 1, 1, 3, 2, 2, 5], [1, 2, 3, 4, 5, 6, 7], [7, 7, 7, 1, 1, 1, 0]])
    for t in (x, x.bfloat16(), x.to(torch.int16)):
        with native():
            got = torch.mode(t.to(DEV), 1)
        same(got, torch.mode(t, 1))
    y = torch.randn(3, 40)  # distinct: the smallest value is the mode
    with native():
        same(torch.mode(y.to(DEV), 1, keepdim=True), torch.mode(y, 1, keepdim=True))


# -- searching -----------------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 20), k=st.integers(1, 9), seed=st.integers(0, 2**16), right=st.booleans(),
       dtype=st.sampled_from((*FLOATS, torch.int16)), batched=st.booleans())
def test_searchsorted_bucketize(m, k, seed, right, dtype, batched):
    seq = torch.sort(tensors(dtype, (3, m) if batched else (m,), seed), -1)[0]  # NaN last, as sorted
    vals = tensors(dtype, (3, k), seed + 1)
    with native():
        got = torch.searchsorted(seq.to(DEV), vals.to(DEV), right=right)
        got32 = torch.searchsorted(seq.to(DEV), vals.to(DEV), side="right" if right else "left", out_int32=True)
    same(got, torch.searchsorted(seq, vals, right=right))
    same(got32, torch.searchsorted(seq, vals, right=right, out_int32=True))
    if not batched:
        with native():
            b = torch.bucketize(vals.to(DEV), seq.to(DEV), right=right)
        same(b, torch.bucketize(vals, seq, right=right))


def test_searchsorted_sorter_scalar_out():
    seq = torch.tensor([5.0, -1, 2, NAN, 2, 0, INF])
    sorter = torch.argsort(seq, stable=True)
    vals = torch.tensor([NAN, -INF, 2.0, 3.0, 9.0])
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    with native():
        got = torch.searchsorted(seq.to(DEV), vals.to(DEV), sorter=sorter.to(DEV))
        scalar = torch.searchsorted(torch.sort(seq)[0].to(DEV), 2.0, right=True)
        torch.searchsorted(seq.to(DEV), vals.to(DEV), sorter=sorter.to(DEV), out=out)
    same(got, torch.searchsorted(seq, vals, sorter=sorter))
    same(scalar, torch.searchsorted(torch.sort(seq)[0], 2.0, right=True))
    same(out, torch.searchsorted(seq, vals, sorter=sorter))


def test_searchsorted_empty():
    with native():
        got = [torch.searchsorted(torch.empty(0, 0, device=DEV), torch.empty(0, 0, device=DEV)),
               torch.searchsorted(torch.empty(0, device=DEV), torch.ones(3, device=DEV))]
    same(got[0], torch.searchsorted(torch.empty(0, 0), torch.empty(0, 0)))
    same(got[1], torch.searchsorted(torch.empty(0), torch.ones(3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_isin(dtype):
    a, b = tensors(dtype, (4, 5), 3), tensors(dtype, (7,), 4)
    with native():
        got = [torch.isin(a.to(DEV), b.to(DEV)), torch.isin(a.to(DEV), b.to(DEV), invert=True),
               torch.isin(a.to(DEV), 1), torch.isin(1, b.to(DEV))]
    for g, r in zip(got, [torch.isin(a, b), torch.isin(a, b, invert=True), torch.isin(a, 1), torch.isin(1, b)]):
        same(g, r)


def test_isin_of_int64_is_exact_and_native():
    """generate() checks each new token against the eos ids: int64 against int64, words compared exactly."""
    top, bottom = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min
    a = torch.tensor([[1, 2**40, -5, top], [bottom, 7, 2**40 + 1, 0]])
    b = torch.tensor([2**40, bottom, 0, 99])
    with native():
        got = [torch.isin(a.to(DEV), b.to(DEV)), torch.isin(a.to(DEV), b.to(torch.int32).to(DEV), invert=True),
               torch.isin(a.to(DEV), 2**40), torch.isin(2**40 + 1, b.to(DEV))]
    for g, r in zip(got, [torch.isin(a, b), torch.isin(a, b.to(torch.int32), invert=True), torch.isin(a, 2**40),
                          torch.isin(2**40 + 1, b)]):
        same(g, r)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bins,lo,hi", [(100, 0, 0), (7, 0, 3), (13, 0.1, 2.9), (1000, -50, 50.5)])
def test_histc(dtype, bins, lo, hi):
    x = torch.cat((torch.randn(150) * 3, torch.tensor([0.0, 3, 2.9, 0.1, NAN, -50, 50.5]))).to(dtype)
    if lo == hi:
        x = x.nan_to_num()  # torch refuses a NaN range
    with native():
        got = torch.histc(x.to(DEV), bins, lo, hi)
    same(got, torch.histc(x, bins, lo, hi))
    out = torch.empty(0, dtype=dtype, device=DEV)
    torch.histc(x.to(DEV), bins, lo, hi, out=out)
    same(out, torch.histc(x, bins, lo, hi))


def _integer_histc(x: torch.Tensor, bins: int, lo: int, hi: int) -> torch.Tensor:
    """CUDA's integer histc (the CPU refuses integers): (x - lo) * bins // (hi - lo), right edge in the last bin."""
    if lo == hi:
        lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    inside = x[(x >= lo) & (x <= hi)].long()
    b = ((inside - lo) * bins // (hi - lo)).clamp(max=bins - 1)
    return torch.bincount(b, minlength=bins).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
@pytest.mark.parametrize("bins,lo,hi", [(8, 0, 7), (3, 0, 7), (5, 2, 2), (16, 0, 0), (4, 10, 200)])
def test_histc_of_integers_as_cuda_computes_it(dtype, bins, lo, hi):
    g = torch.Generator().manual_seed(bins + hi)
    x = torch.randint(0, 220, (300,), generator=g).to(dtype)
    if hi <= 7:
        x = x % 9  # a Mixture-of-Experts router's expert ids: mostly inside, a few outside
    with native():
        got = torch.histc(x.to(DEV), bins, lo, hi)
    same(got, _integer_histc(x, bins, lo, hi))


def test_histc_errors_and_big_half_take_cpu_path():
    x = torch.tensor([1.0, NAN])
    with pytest.raises(RuntimeError):
        torch.histc(x.to(DEV))
    torch.neuron.reset_metrics()
    big = torch.randn(1000).bfloat16()  # bfloat16 counts above 256 depend on torch's threads
    same(torch.histc(big.to(DEV), 10, -3, 3), torch.histc(big, 10, -3, 3))
    assert torch.neuron.metrics()["fallback"]


# -- scans ---------------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16),
       dtype=st.sampled_from((*FLOATS, torch.int16, torch.uint8)))
def test_cummax_cummin(shape, data, seed, dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = tensors(dtype, shape, seed)
    with native():
        got = torch.cummax(x.to(DEV), dim), torch.cummin(x.to(DEV), dim)
    same(got, (torch.cummax(x, dim), torch.cummin(x, dim)))
    if dtype.is_floating_point:  # the values are torch's elements, down to the sign of zero
        assert torch.equal(got[0].values.cpu().signbit(), torch.cummax(x, dim).values.signbit())


@settings(max_examples=15, deadline=None)
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16), dtype=st.sampled_from(FLOATS))
def test_logcumsumexp_cumprod(shape, data, seed, dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = tensors(dtype, shape, seed)
    tol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (2e-3, 1e-3)}[dtype]
    with native():
        lcse, cp = torch.logcumsumexp(x.to(DEV), dim), torch.cumprod(x.to(DEV), dim)
    torch.testing.assert_close(lcse.cpu(), torch.logcumsumexp(x, dim), rtol=tol[0], atol=tol[1], equal_nan=True)
    torch.testing.assert_close(cp.cpu(), torch.cumprod(x, dim), rtol=tol[0], atol=tol[1], equal_nan=True)


def test_cumprod_out_inplace_dtype():
    x = torch.rand(3, 6) + 0.5
    out = torch.empty(0, device=DEV)
    with native():
        torch.cumprod(x.to(DEV), 1, out=out)
        y = x.to(DEV)
        y.cumprod_(0)
        half = torch.cumprod(x.to(DEV), 1, dtype=torch.bfloat16)
    torch.testing.assert_close(out.cpu(), torch.cumprod(x, 1))
    torch.testing.assert_close(y.cpu(), torch.cumprod(x, 0))
    torch.testing.assert_close(half.cpu(), torch.cumprod(x, 1, dtype=torch.bfloat16))


# -- unique --------------------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple), seed=st.integers(0, 2**16),
       dtype=st.sampled_from((*FLOATS, torch.int64, torch.int32, torch.bool)), inverse=st.booleans(),
       counts=st.booleans())
def test_unique(shape, seed, dtype, inverse, counts):
    x = tensors(dtype, shape, seed)
    with native():
        got = torch.unique(x.to(DEV), return_inverse=True, return_counts=counts)
        cons = torch.unique_consecutive(x.to(DEV), return_inverse=inverse, return_counts=counts)
    ref = torch.unique(x, return_inverse=True, return_counts=counts)
    same(got[0], ref[0])
    if counts:
        same(got[2], ref[2])
    # torch's unique sorts unstably: which NaN becomes which of the NaN groups is unspecified, so the
    # inverse is checked by what it means (each element's group holds its value)
    torch.testing.assert_close(got[0].cpu()[got[1].cpu()], x, rtol=0, atol=0, equal_nan=True)
    if not (x.is_floating_point() and x.isnan().any()):
        same(got[1], ref[1])
    same(cons, torch.unique_consecutive(x, return_inverse=inverse, return_counts=counts))


@pytest.mark.parametrize("shape,dim", [((4, 2), 0), ((5, 3, 4), 1), ((5, 3, 4), -1), ((6,), 0), ((5, 0, 5), 1)])
def test_unique_consecutive_dim(shape, dim):
    x = torch.randint(0, 2, shape).float()
    if x.numel():
        x[1] = x[0]  # a repeated slice
        x.view(-1)[-1] = NAN  # NaN differs from everything
    for inverse, counts in ((False, False), (True, True)):
        with native():
            got = torch.unique_consecutive(x.to(DEV), return_inverse=inverse, return_counts=counts, dim=dim)
        same(got, torch.unique_consecutive(x, return_inverse=inverse, return_counts=counts, dim=dim))


@pytest.mark.parametrize("shape,dim", [((5, 2), 0), ((4, 3, 5), 1), ((4, 3, 5), 2), ((6,), 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.bool])
def test_unique_dim(shape, dim, dtype):
    x = torch.randint(0, 2, shape).to(dtype)
    if x.dim() > 1:
        x.select(dim, 1).copy_(x.select(dim, 0))  # a repeated slice
    with native():
        got = torch.unique(x.to(DEV), dim=dim, return_inverse=True, return_counts=True)
        plain = torch.unique(x.to(DEV), dim=dim)
    same(got, torch.unique(x, dim=dim, return_inverse=True, return_counts=True))
    same(plain, torch.unique(x, dim=dim))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_unique_dim_wide_integers_match_cpu(dtype):
    """Slices that differ only beyond FP32's 24 bits (int32) or beyond 32 bits (int64) stay apart and order
    exactly, with dim and without, consecutive or sorted."""
    wide = 2 ** 40 if dtype == torch.int64 else 2 ** 30
    x = torch.tensor([[3, wide], [2, 3], [3, wide], [3, wide + 1], [3, 1], [3, -wide]], dtype=dtype)
    with native():
        for dim in (0, 1, None):
            kw = {"return_inverse": True, "return_counts": True, "dim": dim}
            same(torch.unique(x.to(DEV), **kw), torch.unique(x, **kw))
            same(torch.unique_consecutive(x.to(DEV), **kw), torch.unique_consecutive(x, **kw))


def test_unique_counts_int64_matches_cpu():
    x = torch.tensor([3, 1, 2, 3, 1, 5, 2 ** 40 + 1, 1 - 2 ** 40, 2 ** 40 + 1, 2 ** 63 - 1, -(2 ** 63), 2 ** 32 + 1])
    with native():
        got = torch.unique(x.to(DEV), return_inverse=True, return_counts=True)
        cons = torch.unique_consecutive(x.to(DEV), return_inverse=True, return_counts=True)
    same(got, torch.unique(x, return_inverse=True, return_counts=True))
    same(cons, torch.unique_consecutive(x, return_inverse=True, return_counts=True))


def test_unique_dim_nan_slices_stay_apart():
    x = torch.tensor([[1.0, NAN], [1.0, NAN], [1.0, 0.0], [-1.0, 5.0]])
    with native():
        got = torch.unique(x.to(DEV), dim=0, return_inverse=True, return_counts=True)
    same(got, torch.unique(x, dim=0, return_inverse=True, return_counts=True))
