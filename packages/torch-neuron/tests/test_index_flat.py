"""put_ and masked_scatter_ on the device (torch_neuron.ops.index_flat) against the CPU."""

import pytest
import torch
from torch_neuron_testing.native import native

DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.bool]


def _values(shape, dtype):
    x = torch.randn(shape) * 10
    return x > 0 if dtype == torch.bool else x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_put_matches_cpu(dtype, accumulate, strided):
    if accumulate and dtype == torch.bool:
        pytest.skip("torch has no accumulating put_ for bool")
    torch.manual_seed(3)
    x = _values((4, 5), dtype)
    index = torch.tensor([0, -1, 7, 13, -20])  # negatives wrap; distinct positions
    source = _values((5,), dtype)
    want = (x.t() if strided else x).clone().put_(index, source, accumulate)
    d = x.to("neuron")
    d = d.t() if strided else d
    with native("put_"):
        d.put_(index.to("neuron"), source.to("neuron"), accumulate)
    torch.testing.assert_close(d.cpu(), want)


def test_put_errors_like_torch():
    x = torch.zeros(2, 3, device="neuron")
    with pytest.raises(IndexError, match="out of range: tried to access index 6 on a tensor of 6 elements"):
        x.put_(torch.tensor([6], device="neuron"), torch.ones(1, device="neuron"))
    with pytest.raises(RuntimeError, match="same number of elements"):
        x.put_(torch.tensor([1, 2], device="neuron"), torch.ones(1, device="neuron"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_shape", [(3, 4), (4,), (3, 1)], ids=str)
def test_masked_scatter_matches_cpu(dtype, mask_shape):
    torch.manual_seed(5)
    x, source = _values((3, 4), dtype), _values((15,), dtype)
    for mask in (torch.rand(mask_shape) > 0.5, torch.zeros(mask_shape, dtype=torch.bool),
                 torch.ones(mask_shape, dtype=torch.bool)):
        with native():
            got = x.to("neuron").masked_scatter(mask.to("neuron"), source.to("neuron"))
        torch.testing.assert_close(got.cpu(), x.masked_scatter(mask, source))


def test_masked_scatter_needs_enough_source_elements():
    x = torch.zeros(3, 4, device="neuron")
    with pytest.raises(RuntimeError, match="at least as many elements"):
        x.masked_scatter_(torch.ones(3, 4, dtype=torch.bool, device="neuron"), torch.ones(3, device="neuron"))
