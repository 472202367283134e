"""Convolutions on the neuron device against PyTorch CPU, forward and backward: conv1d / conv2d with stride,
padding, dilation and groups, transposed convolutions with output_padding, nn.Conv2d, bf16, and the loud
CPU path for what the kernels do not take (3-d convolutions, float64)."""

import contextlib
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torch_neuron.fallback import NeuronFallbackWarning

DEV = "neuron"
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


@contextlib.contextmanager
def no_fallback_of(*ops):
    """None of ``ops`` took the CPU path, and each ran natively (other ops, e.g. the autograd engine's
    ones_like for the output gradient, belong to other modules and are not checked here)."""
    metrics = torch.neuron.metrics
    fb, nat = dict(metrics()["fallback"]), dict(metrics()["native"])
    yield
    for op in ops:
        assert metrics()["fallback"].get(op, 0) == fb.get(op, 0), f"{op} fell back to the CPU"
        assert metrics()["native"].get(op, 0) > nat.get(op, 0), f"{op} did not run natively"


def check(fn, shapes, dtype=torch.float32, bias=True):
    """fn(x, w, b) and the gradients of x, w, b on the device against the CPU (computed in float32)."""
    torch.manual_seed(0)
    x, w = torch.randn(shapes[0]), torch.randn(shapes[1])
    b = torch.randn(shapes[2]) if bias else None
    cpu = [t.to(dtype).float().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    want = fn(*cpu)
    grad = torch.randn_like(want)
    want.backward(grad)
    dev = [t.to(dtype).to(DEV).requires_grad_() if t is not None else None for t in (x, w, b)]
    with no_fallback_of("convolution", "convolution_backward"):
        got = fn(*dev)
        got.backward(grad.to(dtype).to(DEV))
    tol = TOL[dtype]
    torch.testing.assert_close(got.cpu().float(), want.detach(), **tol)
    for d, c in zip(dev, cpu):
        if d is not None:
            scale = max(1.0, float(c.grad.abs().max()))  # bf16 gradients sum many rounded products
            torch.testing.assert_close(d.grad.cpu().float() / scale, c.grad / scale, **tol)


CONV2D = [  # (x, w, stride, padding, dilation, groups)
    ((2, 3, 9, 8), (5, 3, 3, 3), 1, 0, 1, 1),
    ((2, 4, 9, 8), (6, 2, 3, 3), 2, 1, 2, 2),
    ((1, 4, 10, 7), (4, 1, 3, 2), (2, 1), (0, 2), 1, 4),  # depthwise, rectangular kernel
    ((2, 3, 6, 6), (4, 3, 1, 1), 1, 0, 1, 1),  # pointwise
    ((1, 2, 7, 9), (3, 2, 5, 5), 3, 2, (1, 2), 1),
    ((3, 130, 5, 5), (129, 130, 3, 3), 1, 1, 1, 1),  # channels beyond one partition tile
]


@pytest.mark.parametrize("case", CONV2D)
def test_conv2d_matches_cpu(case):
    xs, ws, stride, padding, dilation, groups = case
    check(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups), (xs, ws, (ws[0],)))


def test_conv2d_same_padding_and_no_bias():
    check(lambda x, w, b: F.conv2d(x, w, padding="same", dilation=2), ((2, 3, 8, 8), (4, 3, 3, 3), None), bias=False)


@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, 1, 1), (3, 2, 2)])
def test_conv1d_matches_cpu(stride, padding, dilation):
    check(lambda x, w, b: F.conv1d(x, w, b, stride, padding, dilation), ((2, 3, 17), (4, 3, 3), (4,)))


CONV_T = [  # (x, w, stride, padding, output_padding, dilation, groups)
    ((2, 4, 5, 6), (4, 3, 3, 3), 1, 0, 0, 1, 1),
    ((2, 4, 5, 6), (4, 3, 3, 2), 2, 1, 1, 1, 1),
    ((1, 4, 4, 5), (4, 2, 3, 3), (1, 2), (2, 0), (0, 1), 2, 2),
    ((1, 2, 3, 3), (2, 3, 4, 4), 3, 4, 2, 1, 1),  # padding beyond the kernel reach: the spread input is cropped
]


@pytest.mark.parametrize("case", CONV_T)
def test_conv_transpose2d_matches_cpu(case):
    xs, ws, stride, padding, output_padding, dilation, groups = case
    bias = (ws[1] * groups,)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation),
          (xs, ws, bias))


@st.composite
def transposed_cases(draw):
    """conv_transpose2d configurations torch accepts: strides up to 3 (several phases, phases no tap
    reaches when the stride exceeds the kernel's reach), dilation sharing a factor with the stride, padding up
    to the kernel's reach, output_padding below max(stride, dilation)."""
    s, d = (draw(st.integers(1, 3)), draw(st.integers(1, 3))), (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    p = tuple(draw(st.integers(0, dd * (kk - 1))) for dd, kk in zip(d, k))
    op = tuple(draw(st.integers(0, max(ss, dd) - 1)) for ss, dd in zip(s, d))
    g = draw(st.integers(1, 2))
    hw = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    out = [(n - 1) * ss - 2 * pp + dd * (kk - 1) + o + 1 for n, ss, pp, dd, kk, o in zip(hw, s, p, d, k, op)]
    assume(min(out) > 0)
    return (2, 2 * g, *hw), (2 * g, draw(st.integers(1, 2)), *k), s, p, op, d, g


@settings(max_examples=20, deadline=None)
@given(transposed_cases())
def test_conv_transpose2d_phases_match_cpu(case):
    xs, ws, stride, padding, output_padding, dilation, groups = case
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation),
          (xs, ws, (ws[1] * groups,)))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_weight_reaches_only_the_outputs_it_multiplies(bad):
    """A strided transposed conv (and a strided conv's input gradient) multiplies each weight tap only with
    the inputs of its phase: an inf or NaN tap makes non-finite exactly the outputs it reaches, as on the CPU
    (inserted zeros times inf made every output NaN). The taps here never meet the phases' zero padding (which
    the CPU's col2im does not form; see ops/conv.py)."""
    torch.manual_seed(0)
    x, w = torch.randn(1, 2, 4, 5), torch.randn(2, 3, 2, 3)
    w[1, 0, 0, 1] = bad
    want = F.conv_transpose2d(x, w, stride=2)
    got = F.conv_transpose2d(x.to(DEV), w.to(DEV), stride=2).cpu()
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-4)
    assert not want.isfinite().all() and want.isfinite().any()
    xc = torch.randn(1, 3, 8, 11, requires_grad=True)  # every input row and column reaches an output
    wc = w.clone().requires_grad_()  # as a conv2d weight: [O=2, C=3, 2, 3]
    F.conv2d(xc, wc, stride=2).sum().backward()
    xd = xc.detach().to(DEV).requires_grad_()
    F.conv2d(xd, wc.detach().to(DEV), stride=2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, equal_nan=True, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (1, 1, 2), (2, 0, 1), (3, 1, 2)])
def test_an_infinite_weight_meets_no_padding_in_a_transposed_conv(dtype, stride, padding, dilation):
    """A transposed conv is a conv2d over a padded input (per output phase when strided); the CPU's col2im forms
    no product with that padding, so an inf weight tap makes non-finite only the outputs it reaches: the padding's
    zeros times inf made the borders NaN. The reference is float64: the CPU's float32 and bfloat16 (oneDNN) kernels
    give NaN at outputs the inf tap does not reach, where float64 and their own non-oneDNN path are finite."""
    torch.manual_seed(1)
    x, w = torch.randn(2, 2, 3, 4).to(dtype), torch.randn(2, 3, 2, 3).to(dtype)
    w[0, 1, 1, 2] = math.inf
    want = F.conv_transpose2d(x.double(), w.double(), stride=stride, padding=padding, dilation=dilation)
    got = F.conv_transpose2d(x.to(DEV), w.to(DEV), stride=stride, padding=padding, dilation=dilation).cpu()
    torch.testing.assert_close(got.double(), want, equal_nan=True, **TOL.get(dtype, TOL[torch.bfloat16]))
    assert want.isfinite().any()
    w1 = torch.tensor([[[math.inf, -0.45]]], dtype=dtype)
    got = F.conv_transpose1d(torch.tensor([[[0.7]]], dtype=dtype).to(DEV), w1.to(DEV)).cpu()
    assert got[0, 0, 0] == math.inf and got[0, 0, 1].isfinite()


def test_bfloat16_convolutions_match_cpu():
    check(lambda x, w, b: F.conv2d(x, w, b, 2, 1), ((2, 4, 8, 8), (6, 4, 3, 3), (6,)), torch.bfloat16)


def test_conv2d_module_trains_like_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3, stride=2))
    dev = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3, stride=2)).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 3, 10, 10)
    with no_fallback_of("convolution", "convolution_backward"):
        out = dev(x.to(DEV))
        out.backward(torch.ones_like(out))
    want = cpu(x)
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(out.cpu(), want.detach(), rtol=1e-4, atol=1e-4)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["conv3d", "float64"])
def test_unsupported_convolutions_run_on_the_cpu_loudly(kind):
    if kind == "conv3d":
        x, w = torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2)
        fn = F.conv3d
    else:
        x, w = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.randn(3, 2, 3, 3, dtype=torch.float64)
        fn = F.conv2d
    before = torch.neuron.metrics()["fallback"].get("convolution_overrideable", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronFallbackWarning)  # warned once per op per process
        got = fn(x.to(DEV), w.to(DEV))
    assert torch.neuron.metrics()["fallback"]["convolution_overrideable"] == before + 1
    torch.testing.assert_close(got.cpu(), fn(x, w))
