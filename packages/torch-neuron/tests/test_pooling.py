"""avg_pool2d on the device (torch_neuron.ops.pooling) against the CPU: padding, strides, ceil_mode,
count_include_pad, divisor_override, 3-d and 4-d inputs, bf16, out=, autograd."""

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

CASES = [((7, 9), 2, None, 0), ((7, 9), 3, 2, 1), ((8, 8), (3, 2), (1, 2), 1), ((5, 6), 3, 1, 0), ((4, 4), 4, None, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_avg_pool2d_matches_cpu(case, dtype):
    (h, w), k, s, p = case
    torch.manual_seed(h * w)
    x = torch.randn(2, 3, h, w).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    for ceil_mode, count_include_pad, divisor in itertools.product([False, True], [True, False], [None, 3]):
        want = F.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor)
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch.neuron.NeuronFallbackWarning)
            got = F.avg_pool2d(x.to("neuron"), k, s, p, ceil_mode, count_include_pad, divisor)
        torch.testing.assert_close(got.cpu(), want, **tol)


def test_unbatched_out_and_errors():
    x = torch.randn(3, 7, 7)
    out = torch.empty(0, device="neuron")
    assert F.avg_pool2d(x.to("neuron"), 3, out=None).shape == (3, 2, 2)
    r = torch.ops.aten.avg_pool2d.out(x.to("neuron"), [3, 3], out=out)
    assert r is out
    torch.testing.assert_close(out.cpu(), F.avg_pool2d(x, 3))
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.avg_pool2d(x.to("neuron"), 2, padding=2)


def test_gradients_match_cpu():
    x = torch.randn(2, 2, 6, 6, requires_grad=True)
    xd = x.detach().to("neuron").requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.avg_pool2d(xd, 3, 2, 1, count_include_pad=False).sum().backward()
    F.avg_pool2d(x, 3, 2, 1, count_include_pad=False).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
