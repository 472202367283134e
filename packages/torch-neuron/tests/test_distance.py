"""cdist and pdist on the device (torch_neuron.ops.distance) against the CPU: every p (0, fractional, 1, 2,
inf), the matrix-product and the direct form of p = 2 (compute_mode), broadcast batches, empty inputs."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

PS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf]
MODES = ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"]


@settings(max_examples=20, deadline=None)
@given(p=st.sampled_from(PS), mode=st.sampled_from(MODES), rows=st.tuples(st.integers(1, 30), st.integers(1, 6)),
       m=st.integers(1, 5), batch=st.sampled_from([(), (2,), (2, 1)]))
def test_cdist_matches_cpu(p, mode, rows, m, batch):
    torch.manual_seed(rows[0] * 31 + m)
    a, b = torch.randn(*batch, rows[0], m), torch.randn(*batch[-1:], rows[1], m)
    if p == 0:
        a[..., 0] = b[..., :1, 0].mean()  # equal coordinates: p = 0 counts the others
    want = torch.cdist(a, b, p, mode)
    with native():  # no fallback (the matmul form for p = 2 and many rows runs no subtraction)
        got = torch.cdist(a.to("neuron"), b.to("neuron"), p, mode)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", PS + [10.0])
def test_pdist_matches_cpu(p):
    torch.manual_seed(0)
    for shape in [(1, 1), (5, 1), (1, 5), (6, 4)]:
        x = torch.randn(shape)
        with native():
            got = F.pdist(x.to("neuron"), p)
        torch.testing.assert_close(got.cpu(), F.pdist(x, p), rtol=1e-5, atol=1e-5)


def test_empty_inputs():
    with native():
        assert torch.cdist(torch.randn(0, 4, 5).to("neuron"), torch.randn(1, 3, 5).to("neuron")).shape == (0, 4, 3)
        got = torch.cdist(torch.randn(4, 0).to("neuron"), torch.randn(3, 0).to("neuron"), 1.0)
    torch.testing.assert_close(got.cpu(), torch.zeros(4, 3))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.cdist(torch.randn(2, 3).to("neuron"), torch.randn(2, 3).to("neuron"), -1.0)
