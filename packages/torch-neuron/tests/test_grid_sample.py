"""grid_sample of 5-d inputs (aten grid_sampler_3d, torch_neuron.ops.grid_sample) against the CPU: trilinear
and nearest, every padding mode, align_corners, coordinates far outside, half-way points, NaN/inf; and 4-d
bilinear/nearest/bicubic (grid_sampler_2d) with non-finite pixels."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

MODES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True]))


@settings(max_examples=15, deadline=None)
@given(case=st.sampled_from(MODES), size=st.lists(st.integers(1, 5), min_size=3, max_size=3),
       out=st.lists(st.integers(1, 4), min_size=3, max_size=3), n=st.integers(1, 2), c=st.integers(1, 3))
def test_grid_sample_3d_matches_cpu(case, size, out, n, c):
    mode, padding, align = case
    torch.manual_seed(sum(size) * 13 + sum(out))
    x = torch.randn(n, c, *size)
    grid = torch.rand(n, *out, 3) * 8 - 4  # in and far outside [-1, 1]
    want = F.grid_sample(x, grid, mode, padding, align)
    with native("grid_sampler_3d"):
        got = F.grid_sample(x.to("neuron"), grid.to("neuron"), mode, padding, align)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", MODES, ids=str)
def test_grid_sample_3d_special_values(case):
    mode, padding, align = case
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 3)
    x[0, 0, 1, 1, 1] = float("inf")  # an inf read with weight 0 is NaN, as on the CPU; unread it is not
    grid = torch.rand(2, 3, 2, 2, 3) * 4 - 2
    grid[0, 0, 0, 0, 0], grid[1, 0, 0, 0, 1], grid[1, 1, 0, 0, 2] = float("nan"), float("inf"), -float("inf")
    grid[0, 1, 0, 0] = torch.tensor([-0.5, 0.0, 0.5])  # half-way points: nearest rounds half to even
    want = F.grid_sample(x, grid, mode, padding, align)
    with native("grid_sampler_3d"):
        got = F.grid_sample(x.to("neuron"), grid.to("neuron"), mode, padding, align)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


MODES_2D = MODES + list(itertools.product(["bicubic"], ["zeros", "border", "reflection"], [False, True]))


@pytest.mark.parametrize("case", MODES_2D, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan"), 1e20])
def test_grid_sample_2d_inf_stays_in_its_corners(case, dtype, bad):
    """4-d grid_sample reads a non-finite (or huge) pixel only into the samples whose corners hold it, as the CPU:
    torch's decomposition, which ran here before, multiplied outside corners' clamped reads by a zero weight
    (0 * inf = NaN of every sample near the border)."""
    mode, padding, align = case
    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 6).to(dtype)
    x[0, 0, 0, 0], x[1, 2, 4, 5] = bad, bad  # corners: the element outside reads are clamped to, and its opposite
    grid = (torch.rand(2, 4, 5, 2) * 3 - 1.5).to(dtype)  # in and outside [-1, 1]
    want = F.grid_sample(x.float(), grid.float(), mode, padding, align).to(dtype)
    with native("grid_sampler_2d"):
        got = F.grid_sample(x.to("neuron"), grid.to("neuron"), mode, padding, align)
    tol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps  # 16 bits: one rounding of the fp32 sum
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol, equal_nan=True)


def test_errors_and_empty():
    x = torch.randn(1, 2, 3, 3, 3).to("neuron")
    with pytest.raises(RuntimeError, match="bicubic"):
        F.grid_sample(x, torch.zeros(1, 2, 2, 2, 3).to("neuron"), "bicubic", align_corners=False)
    with native():
        assert F.grid_sample(x, torch.zeros(1, 0, 2, 2, 3).to("neuron"), align_corners=False).shape == (1, 2, 0, 2, 2)


def test_many_points():
    """8 corners x 140000 points: offsets over several tiles (float -> int32 exactly, no cast kernel)."""
    torch.manual_seed(5)
    x, grid = torch.randn(1, 2, 6, 7, 8), torch.rand(1, 50, 50, 56, 3) * 2.2 - 1.1
    want = F.grid_sample(x, grid, "bilinear", "zeros", False)
    with native("grid_sampler_3d"):
        got = F.grid_sample(x.to("neuron"), grid.to("neuron"), "bilinear", "zeros", False)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
