"""Pooling on the device (torch_neuron.ops.pooling, pooling_adaptive) against the CPU: avg_pool1d/2d/3d
(padding, strides, ceil_mode, count_include_pad, divisor_override), adaptive avg/max pooling in 1-3 dims
(values and int64 indices exactly as the CPU's, ties and NaN included), interpolate(mode="area"), bf16,
out=, errors, and the gradients of all of them."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
ADAPTIVE_AVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
ADAPTIVE_MAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
NAN = float("nan")


def _aten_nd(nd: int) -> int:
    return 2 if nd == 1 else nd  # the 1-d ops are aten compositions of the 2-d ones


def _first(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def compare(fn, x, names, grad=True, tol=1e-5):
    """fn on the CPU and on the device, where nothing may fall back and each of ``names`` runs natively:
    equal outputs (int64 indices exactly), then equal input gradients for one random output gradient."""
    xc = x.clone().requires_grad_(grad)
    xd = x.to("neuron").requires_grad_(grad)
    want = fn(xc)
    gout = torch.randn(_first(want).shape, dtype=x.dtype)
    with native(*names):
        got = fn(xd)
        if grad:
            _first(got).backward(gout.to("neuron"))
    pairs = [(got, want)] if isinstance(want, torch.Tensor) else list(zip(got, want))
    for g, w in pairs:
        torch.testing.assert_close(g.detach().cpu(), w.detach(), equal_nan=True, rtol=tol, atol=tol)
    if grad:
        _first(want).backward(gout)
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=tol, atol=tol)


@settings(max_examples=20, deadline=None)
@given(nd=st.sampled_from([1, 2, 3]), data=st.data())
def test_avg_pool_matches_cpu(nd, data):
    k = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd), label="kernel")
    s = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd), label="stride")
    p = [data.draw(st.integers(0, ki // 2), label="pad") for ki in k]
    sizes = [data.draw(st.integers(ki, ki + 5), label="size") for ki in k]
    lead = data.draw(st.sampled_from([(2, 3), (3,), (1, 2)]), label="lead")
    ceil_mode, count_include_pad = data.draw(st.booleans()), data.draw(st.booleans())
    divisor = data.draw(st.sampled_from([None, 2])) if nd > 1 else None
    torch.manual_seed(math.prod(sizes))
    x = torch.randn(*lead, *sizes)
    extra = {"divisor_override": divisor} if nd > 1 else {}
    n = _aten_nd(nd)
    compare(lambda t: AVG[nd](t, k, s, p, ceil_mode, count_include_pad, **extra), x,
            [f"avg_pool{n}d", f"avg_pool{n}d_backward"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_avg_pool2d_parameters(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 9).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    for (k, s, p), ceil, cip, div in itertools.product([(3, 2, 1), ((3, 2), (1, 2), 1), (4, None, 2)],
                                                     [False, True], [True, False], [None, 3]):
        want = F.avg_pool2d(x, k, s, p, ceil, cip, div)
        with native("avg_pool2d"):
            got = F.avg_pool2d(x.to("neuron"), k, s, p, ceil, cip, div)
        torch.testing.assert_close(got.cpu(), want, **tol)


def _adaptive_input(lead, sizes, kind: str) -> torch.Tensor:
    x = torch.randn(*lead, *sizes)
    if kind == "ties":
        return x.round()  # many equal values: the first in the window wins
    if kind == "nan":  # NaN wins; a later NaN of the same window replaces an earlier one
        flat = x.view(-1)
        flat[torch.randperm(flat.numel())[: max(1, flat.numel() // 6)]] = NAN
        flat[torch.randperm(flat.numel())[:2]] = float("inf")
    return x


@settings(max_examples=25, deadline=None)
@given(nd=st.sampled_from([1, 2, 3]), kind=st.sampled_from(["random", "ties", "nan"]), data=st.data())
def test_adaptive_pool_matches_cpu(nd, kind, data):
    sizes = data.draw(st.lists(st.integers(1, 7), min_size=nd, max_size=nd), label="sizes")
    outs = [data.draw(st.integers(1, n + 2), label="out") for n in sizes]  # larger outputs repeat inputs
    lead = data.draw(st.sampled_from([(2, 3), (3,)]), label="lead")
    torch.manual_seed(math.prod(sizes) * 7 + math.prod(outs))
    x = _adaptive_input(lead, sizes, kind)
    n = _aten_nd(nd)
    grad = kind != "nan"  # NaN gradients compare too, but the CPU's own order of adding them is arbitrary
    back = [f"adaptive_max_pool{n}d_backward"] if grad else []
    compare(lambda t: ADAPTIVE_MAX[nd](t, outs, return_indices=True), x, [f"adaptive_max_pool{n}d", *back], grad)
    if math.prod(outs) > 1:  # a 1x1 output is a mean (aten's composition), not this op
        back = [f"_adaptive_avg_pool{n}d_backward"] if grad else []
        compare(lambda t: ADAPTIVE_AVG[nd](t, outs), x, [f"_adaptive_avg_pool{n}d", *back], grad)


def test_nan_picks_as_cpu():
    """aten's loops keep the first maximum but let every NaN replace the current pick: the last NaN."""
    inf = float("inf")
    x = torch.tensor([[[[NAN, 1.0, NAN, 3.0], [inf, NAN, 1.0, NAN], [2.0, 2.0, -inf, inf], [-inf] * 4]]])
    for out in [(1, 1), (1, 2), (2, 3), (2, 1), (4, 2), (3, 4)]:
        compare(lambda t, out=out: F.adaptive_max_pool2d(t, out, return_indices=True), x, ["adaptive_max_pool2d"],
                grad=False)


@pytest.mark.parametrize("nd", [2, 3])
def test_bfloat16_rounded_once(nd):
    torch.manual_seed(nd)
    x = torch.randn(2, 3, *[5, 6, 7][:nd]).bfloat16()
    out = [3, 4, 2][:nd]
    for fn in (ADAPTIVE_AVG[nd], lambda t: ADAPTIVE_MAX[nd](t, out, return_indices=True)):
        want = fn(x.float(), out).bfloat16() if fn is ADAPTIVE_AVG[nd] else fn(x)
        with native():
            got = fn(x.to("neuron"), out) if fn is ADAPTIVE_AVG[nd] else fn(x.to("neuron"))
        for g, w in zip(*[(o,) if isinstance(o, torch.Tensor) else o for o in (got, want)]):
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    want = AVG[nd](x.float(), 3, 2, 1, True, False).bfloat16()
    with native(f"avg_pool{nd}d"):
        torch.testing.assert_close(AVG[nd](x.to("neuron"), 3, 2, 1, True, False).cpu(), want, rtol=0, atol=0)


def test_interpolate_area():
    torch.manual_seed(3)
    for size in [(3, 2, 4), (7, 5, 9)]:
        compare(lambda t, size=size: F.interpolate(t, size=size, mode="area"), torch.randn(1, 2, 5, 4, 7),
                ["_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward"])
    compare(lambda t: F.interpolate(t, scale_factor=0.5, mode="area"), torch.randn(2, 3, 8, 6),
            ["_adaptive_avg_pool2d"])


def test_out_variants():
    x = torch.randn(2, 3, 4, 5, 6)
    xd = x.to("neuron")
    aten = torch.ops.aten
    with native("avg_pool3d", "_adaptive_avg_pool3d", "adaptive_max_pool3d"):
        out = torch.empty(0, device="neuron")
        assert aten.avg_pool3d.out(xd, [2, 2, 2], out=out) is out
        torch.testing.assert_close(out.cpu(), F.avg_pool3d(x, 2))
        out = torch.empty(0, device="neuron")
        assert aten._adaptive_avg_pool3d.out(xd, [2, 3, 4], out=out) is out
        torch.testing.assert_close(out.cpu(), F.adaptive_avg_pool3d(x, (2, 3, 4)))
        out, idx = torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.int64, device="neuron")
        aten.adaptive_max_pool3d.out(xd, [3, 2, 4], out=out, indices=idx)
        want = F.adaptive_max_pool3d(x, (3, 2, 4), return_indices=True)
        torch.testing.assert_close((out.cpu(), idx.cpu()), want)


def test_empty_and_errors():
    x = torch.randn(0, 3, 4, 4).to("neuron")
    with native():
        assert F.avg_pool2d(x, 2).shape == (0, 3, 2, 2)
        assert F.adaptive_max_pool2d(x, 3, return_indices=True)[1].shape == (0, 3, 3, 3)
        assert F.adaptive_avg_pool3d(torch.randn(2, 3, 4, 5).to("neuron"), (0, 2, 2)).shape == (2, 0, 2, 2)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.avg_pool3d(torch.randn(3, 7, 7, 7).to("neuron"), 2, padding=2)
    with pytest.raises(RuntimeError, match="non-zero size"):
        F.adaptive_max_pool2d(torch.randn(3, 0, 4).to("neuron"), 2)


@pytest.mark.parametrize("nd", [2, 3])
def test_expanded_output_gradient(nd):
    """``out.sum().backward()`` hands the backward an expanded (stride-0) gradient."""
    x = torch.randn(2, 3, *[6, 5, 4][:nd])
    fns = [lambda t: AVG[nd](t, 2, 1, 1, True, False), lambda t: ADAPTIVE_AVG[nd](t, [3, 2, 3][:nd]),
           lambda t: ADAPTIVE_MAX[nd](t, [4, 3, 2][:nd])]
    for fn in fns:
        xc, xd = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
        fn(xc).sum().backward()
        with native():
            fn(xd).sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xc.grad)


@pytest.mark.parametrize("args", [(2,), (3, 2, 1), ((2, 3, 2), 1, 0, 2, True)], ids=str)
def test_max_pool3d_backward(args):
    """max_pool3d's backward adds each output gradient at its saved index (overlapping windows add up)."""
    torch.manual_seed(len(args))
    x = torch.randn(2, 3, 5, 6, 7).round()  # ties: the forward's first index gets the gradient
    compare(lambda t: F.max_pool3d(t, *args, return_indices=True), x, ["max_pool3d_with_indices_backward"])


@settings(max_examples=25, deadline=None)
@given(nd=st.sampled_from([1, 2, 3]), data=st.data())
def test_MaxPool_matches_cpu(nd, data):
    """max_pool1d/2d/3d with indices (kernel, stride, padding, dilation, ceil_mode) and the 2-d backward:
    values and int64 indices exactly as the CPU's, ties (rounded inputs) and NaN/-inf included."""
    k = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd), label="kernel")
    s = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd), label="stride")
    p = [data.draw(st.integers(0, ki // 2), label="pad") for ki in k]
    d = data.draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd), label="dilation")
    sizes = [data.draw(st.integers(d_ * (ki - 1) + 1, d_ * (ki - 1) + 6), label="size") for ki, d_ in zip(k, d)]
    lead = data.draw(st.sampled_from([(2, 3), (3,)]), label="lead")
    ceil_mode = data.draw(st.booleans(), label="ceil_mode")
    special = data.draw(st.sampled_from(["none", "ties", "nan", "-inf"]), label="special")
    torch.manual_seed(math.prod(sizes))
    x = torch.randn(*lead, *sizes)
    if special == "ties":
        x = x.round()
    elif special != "none":
        x.view(-1)[torch.randperm(x.numel())[: max(1, x.numel() // 5)]] = float(special)
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
    aten_nd = _aten_nd(nd)
    grad = aten_nd == 2 and special in ("none", "ties")  # a NaN's gradient compares NaN to NaN: values only
    back = [f"max_pool{aten_nd}d_with_indices_backward"] if grad else []
    compare(lambda t: fn(t, k, s, p, d, ceil_mode, return_indices=True), x, [f"max_pool{aten_nd}d_with_indices", *back],
            grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_MaxPool2d_reduced_precision(dtype):
    x = torch.randn(2, 3, 9, 8).to(dtype)
    compare(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), x,
            ["max_pool2d_with_indices", "max_pool2d_with_indices_backward"], tol=1e-2)


def test_MaxPool2d_channels_last():
    """A channels_last input gives channels_last values and indices, as on the CPU."""
    x = torch.randn(2, 5, 8, 7).contiguous(memory_format=torch.channels_last)
    want = F.max_pool2d(x, 2, return_indices=True)
    with native("max_pool2d_with_indices"):
        got = F.max_pool2d(x.to("neuron"), 2, return_indices=True)
    for g, w in zip(got, want):
        assert g.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(g.cpu(), w)
    compare(lambda t: F.max_pool2d(t, 3, 1, 1), x, ["max_pool2d_with_indices", "max_pool2d_with_indices_backward"])


def test_MaxPool2d_module_and_errors():
    m = torch.nn.MaxPool2d(3, stride=2, padding=1)
    x = torch.randn(3, 10, 10)  # unbatched
    compare(m, x, ["max_pool2d_with_indices", "max_pool2d_with_indices_backward"])
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.max_pool2d(torch.randn(1, 1, 4, 4).to("neuron"), 2, 2, 2)


def test_MaxPool2d_backward_indices_not_from_the_forward():
    """The backward adds each gradient at its index even when the index lies outside the output's window
    (aten does): the gathered backward sees a miss and takes the scatter."""
    x, grad = torch.randn(2, 3, 6, 6), torch.randn(2, 3, 3, 3)
    idx = torch.randint(0, 36, (2, 3, 3, 3))
    want = torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)
    with native("max_pool2d_with_indices_backward"):
        got = torch.ops.aten.max_pool2d_with_indices_backward(grad.to("neuron"), x.to("neuron"), [2, 2], [2, 2],
                                                              [0, 0], [1, 1], False, idx.to("neuron"))
    torch.testing.assert_close(got.cpu(), want)


def test_MaxPool2d_backward_trusts_only_its_own_unchanged_indices(monkeypatch):
    """The forward's own indices are inside their windows by construction: autograd's backward reads nothing back
    to the host. Indices changed in place since (a new version) or made elsewhere are counted on the host, and an
    out-of-window one written into the forward's own tensor still reaches its input position."""
    from torch_neuron.ops.pool import max as pooling_max

    reads = []
    monkeypatch.setattr(pooling_max, "to_host", lambda t: reads.append(t) or t.cpu())
    x = torch.randn(2, 3, 9, 9)
    xd = x.to("neuron").requires_grad_()
    with native("max_pool2d_with_indices", "max_pool2d_with_indices_backward"):
        F.max_pool2d(xd, 3, 2, 1).sum().backward()
    ref = x.clone().requires_grad_()
    F.max_pool2d(ref, 3, 2, 1).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), ref.grad, rtol=0, atol=0)
    assert reads == []
    v, idx = F.max_pool2d(xd.detach(), 3, 2, 1, return_indices=True)
    args = ([3, 3], [2, 2], [1, 1], [1, 1], False)
    idx[0, 0, 0, 0] = 80  # the last input position: outside output (0, 0)'s window
    want = torch.ops.aten.max_pool2d_with_indices_backward(torch.ones(v.shape), x, *args, idx.cpu())
    got = torch.ops.aten.max_pool2d_with_indices_backward(torch.ones_like(v), xd.detach(), *args, idx)
    torch.testing.assert_close(got.cpu(), want)
    assert len(reads) == 1
