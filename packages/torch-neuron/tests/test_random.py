"""Random ops on neuron: uniform_/normal_/bernoulli/random_/native_dropout run natively on the counter-based
generator. A device stream is not CPU's, so the tests check statistics (with bounds far outside sampling
noise), exact properties (ranges, dtypes, the dropout mask/scale relation), reproducibility under
``torch.neuron.manual_seed`` and RNG state, and that the ``generator`` argument is the stream used."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch_neuron_testing.native import native

DEV = "neuron"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
N = 1 << 16


def chi_square_uniform(u: torch.Tensor, bins: int = 256) -> float:
    counts = torch.histc(u.float(), bins, 0, 1)
    expected = u.numel() / bins
    return float(((counts - expected) ** 2 / expected).sum())


# 256 bins: 255 degrees of freedom, mean 255, sd ~22.6; 400 is ~6.4 sd out
CHI2_MAX = 400


# -- uniform -----------------------------------------------------------------------------------------
def test_rand_is_uniform_in_unit_interval():
    torch.neuron.manual_seed(1)
    with native("uniform_"):
        u = torch.rand(N, device=DEV).cpu()
    assert u.dtype == torch.float32 and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / N)
    assert abs(u.var() - 1 / 12) < 0.004
    assert chi_square_uniform(u) < CHI2_MAX
    assert abs(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]) < 6 / math.sqrt(N)  # lag-1 correlation


@pytest.mark.parametrize("dtype", FLOATS)
def test_rand_dtypes_never_reach_one(dtype):
    u = torch.rand(N, device=DEV, dtype=dtype).cpu()
    assert u.dtype == dtype and u.min() >= 0 and u.max() < 1
    assert chi_square_uniform(u, 64) < 150  # 63 dof: mean 63, sd ~11


def test_uniform_range_and_non_contiguous_target():
    t = torch.zeros(300, 400, device=DEV)
    view = t[:, ::2]  # in-place on a strided view touches only its elements
    view.uniform_(-3, 5)
    host = t.cpu()
    assert (host[:, 1::2] == 0).all()
    v = host[:, ::2]
    assert v.min() >= -3 and v.max() < 5 and abs(v.mean() - 1) < 0.1


def test_uniform_float64_runs_on_the_cpu_reproducibly():
    torch.neuron.manual_seed(3)
    torch.neuron.reset_metrics()
    a = torch.empty(100, dtype=torch.float64, device=DEV).uniform_()
    assert torch.neuron.metrics()["fallback"] == {"uniform_": 1}
    torch.neuron.manual_seed(3)
    b = torch.empty(100, dtype=torch.float64, device=DEV).uniform_()
    assert torch.equal(a.cpu(), b.cpu()) and a.dtype == torch.float64


# -- normal ---------------------------------------------------------------------------------------------
def test_randn_moments_and_tails():
    torch.neuron.manual_seed(2)
    with native("normal_"):
        z = torch.randn(4 * N, device=DEV).cpu()
    n = z.numel()
    assert abs(z.mean()) < 6 / math.sqrt(n)
    assert abs(z.std() - 1) < 6 * math.sqrt(0.5 / n)
    within = (z.abs() < 1).float().mean()
    assert abs(within - 0.682689) < 6 * math.sqrt(0.682689 * 0.317311 / n)
    beyond = (z.abs() > 3).float().mean()
    assert abs(beyond - 0.0026998) < 6 * math.sqrt(0.0027 / n)
    assert abs((z ** 3).mean()) < 0.05 and abs((z ** 4).mean() - 3) < 0.15  # symmetric, normal kurtosis


@pytest.mark.parametrize("dtype", FLOATS)
def test_normal_mean_std_and_dtypes(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).normal_(2.0, 0.5).cpu().float()
    assert abs(x.mean() - 2) < 0.02 and abs(x.std() - 0.5) < 0.02
    assert torch.randn(3, 4, device=DEV, dtype=dtype).dtype == dtype


def test_normal_with_tensor_mean_and_std():
    mean = torch.linspace(-5, 5, 11).repeat(4096, 1)
    args = (mean.to(DEV), torch.full((N,), 2.0, dtype=torch.bfloat16).to(DEV), torch.zeros(3, 1).to(DEV),
            torch.ones(5).to(DEV))
    with native("normal"):
        x = torch.normal(args[0], 0.5).cpu()
        y = torch.normal(1.0, args[1]).cpu()
        z = torch.normal(args[2], args[3])
    torch.testing.assert_close(x.mean(0), mean[0], atol=0.05, rtol=0)
    torch.testing.assert_close(x.std(0), torch.full((11,), 0.5), atol=0.03, rtol=0)
    assert y.dtype == torch.bfloat16 and abs(y.float().mean() - 1) < 0.05 and abs(y.float().std() - 2) < 0.05
    assert z.shape == (3, 5)
    with pytest.raises(RuntimeError, match="std >= 0"):
        torch.normal(torch.zeros(2, device=DEV), torch.tensor([1.0, -1.0], device=DEV))


# -- bernoulli --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.93, 1.0])
def test_bernoulli_float_p(p):
    with native("bernoulli_"):
        b = torch.empty(N, device=DEV).bernoulli_(p).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean() - p) <= 6 * math.sqrt(p * (1 - p) / N)


def test_bernoulli_tensor_probabilities():
    p = torch.linspace(0, 1, 8).repeat(4096, 1)
    with native("bernoulli"):
        b = torch.bernoulli(p.to(DEV)).cpu()
    assert b.dtype == torch.float32
    assert (b[:, 0] == 0).all() and (b[:, -1] == 1).all()
    torch.testing.assert_close(b.mean(0), p[0], atol=0.03, rtol=0)
    target = torch.empty(4096, 8, dtype=torch.int64, device=DEV)
    target.bernoulli_(p[:1].to(DEV))  # broadcast p, integer target
    assert set(target.cpu().unique().tolist()) <= {0, 1}


P_OUT_OF_RANGE = {
    "above 1": lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d)),
    "below 0": lambda d: torch.zeros(3, device=d).bernoulli_(torch.tensor([0.1, -0.5, 0.2], device=d)),
    "nan": lambda d: torch.bernoulli(torch.tensor([[0.5], [math.nan]], device=d)),
    "tiny negative, bfloat16": lambda d: torch.bernoulli(torch.tensor([0.5, -1e-30], dtype=torch.bfloat16, device=d)),
    "out=": lambda d: torch.bernoulli(torch.tensor([2.0], device=d), out=torch.empty(1, device=d)),
    "broadcast p": lambda d: torch.zeros(2, 3, device=d).bernoulli_(torch.tensor([1.0, 1.01, 0.0], device=d)),
}


@pytest.mark.parametrize("case", list(P_OUT_OF_RANGE))
def test_bernoulli_probabilities_outside_0_1_raise_like_the_cpu(case):
    """The CPU refuses them (RuntimeError); the device drew from them (p >= 1 always 1)."""
    with pytest.raises(RuntimeError):
        P_OUT_OF_RANGE[case]("cpu")
    with pytest.raises(RuntimeError, match=r"expects all elements of p to be in \[0, 1\], but found p="):
        P_OUT_OF_RANGE[case](DEV)


def test_bernoulli_edges_0_and_1_and_empty_draws_are_fine():
    b = torch.bernoulli(torch.tensor([0.0, -0.0, 1.0], device=DEV)).cpu()
    assert b.tolist() == [0.0, 0.0, 1.0]
    assert torch.empty(0, device=DEV).bernoulli_(torch.tensor([1.5], device=DEV)).numel() == 0  # as on the CPU


# -- random_ / randint -------------------------------------------------------------------------------------
@pytest.mark.parametrize("low, high, dtype", [(0, 10, torch.int64), (-5, 3, torch.int32), (0, 256, torch.uint8),
                                              (-128, 128, torch.int8), (0, 1000, torch.float32),
                                              (-(2**31), 2**31, torch.int64), (0, 2, torch.bool)])
def test_randint_ranges_are_covered_evenly(low, high, dtype):
    with native("random_"):
        r = torch.randint(low, high, (N,), device=DEV, dtype=dtype).cpu()
    assert r.dtype == dtype
    r = r.to(torch.int64)
    assert low <= r.min() and r.max() < high
    span = high - low
    if span <= 1000:
        counts = torch.bincount(r - low, minlength=span).float()
        assert counts.min() > 0
        chi2 = float(((counts - N / span) ** 2 / (N / span)).sum())
        assert chi2 < span + 8 * math.sqrt(2 * span)
    else:
        assert abs(r.double().mean() - (low + high - 1) / 2) < 6 * span / math.sqrt(12 * N)


def test_random_without_bounds_follows_torch_ranges():
    f = torch.empty(N, device=DEV).random_().cpu()
    assert f.min() >= 0 and f.max() <= 2**24 and (f == f.round()).all()
    i = torch.empty(N, dtype=torch.int32, device=DEV).random_().cpu()
    assert i.min() >= 0
    torch.neuron.reset_metrics()
    big = torch.empty(1000, dtype=torch.int64, device=DEV).random_()  # [0, 2**63): 64-bit draws, on the CPU
    assert "random_.from" in torch.neuron.metrics()["fallback"] and big.cpu().max() > 2**40


def test_random_bad_bounds_raise_like_torch():
    with pytest.raises(RuntimeError):
        torch.empty(3, dtype=torch.uint8, device=DEV).random_(0, 300)
    with pytest.raises(RuntimeError):
        torch.empty(3, device=DEV).uniform_(1, 0)


# -- reproducibility and generators ------------------------------------------------------------------------
def draws():
    return (torch.rand(5, device=DEV).cpu(), torch.randn(7, device=DEV).cpu(),
            torch.randint(0, 9, (6,), device=DEV).cpu(), F.dropout(torch.ones(9, device=DEV), 0.5).cpu())


def test_manual_seed_reproduces_every_op():
    torch.neuron.manual_seed(1234)
    a = draws()
    torch.neuron.manual_seed(1234)
    b = draws()
    torch.neuron.manual_seed(1235)
    c = draws()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])
    assert not torch.equal(a[0], draws()[0])  # the stream moves on


def test_rng_state_round_trip():
    torch.neuron.manual_seed(9)
    torch.rand(3, device=DEV)
    state = torch.neuron.get_rng_state()
    a = draws()
    torch.neuron.set_rng_state(state)
    b = draws()
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_generator_argument_is_the_stream_used():
    g = torch.Generator(device=DEV).manual_seed(77)
    torch.neuron.manual_seed(77)
    before = torch.neuron.get_rng_state()
    a = torch.rand(10, device=DEV, generator=g).cpu()
    assert torch.equal(torch.neuron.get_rng_state(), before)  # the default generator did not move
    b = torch.rand(10, device=DEV).cpu()  # same seed, same offset: same values
    assert torch.equal(a, b)
    g.manual_seed(77)
    assert torch.equal(torch.empty(10, device=DEV).uniform_(generator=g).cpu(), a)
    n1 = torch.randn(5, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1)).cpu()
    n2 = torch.randn(5, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1)).cpu()
    assert torch.equal(n1, n2)


def test_cpu_generator_is_refused():
    with pytest.raises(RuntimeError, match="neuron"):
        torch.rand(3, device=DEV, generator=torch.Generator())


def test_counter_never_wraps_inside_a_call():
    """A draw that would cross a 2**32 counter boundary starts at the next block instead of reusing the
    counters at the start of the current block."""
    def at(offset, n=20):
        torch.neuron.set_rng_state(torch.tensor([5, offset], dtype=torch.int64).view(torch.uint8))
        return torch.rand(n, device=DEV).cpu()

    crossing, next_block, block_start = at(2**32 - 10), at(2**32), at(0)
    assert torch.equal(crossing, next_block)
    assert not torch.equal(crossing, block_start)
    assert not torch.equal(at(2**32 - 30)[:10], block_start[:10])


# -- the stream against its host reference, and generation in pieces --------------------------------------
SEED, OFFSET = 0x123456789ABC, 3 * 2**32 + 1000  # an offset in the generator's fourth 2**32 block


def _at_state():
    torch.neuron.set_rng_state(torch.tensor([SEED, OFFSET], dtype=torch.int64).view(torch.uint8))
    key = (SEED ^ (SEED >> 32) ^ ((OFFSET >> 32) * 0x9E3779B9)) % 2**32  # ops/random.py: key and counter
    return key, OFFSET % 2**32


def test_rand_is_the_generators_stream_bit_for_bit():
    from neuron_kernels.library.random import rand_reference

    key, counter = _at_state()
    got = torch.rand(300, 7, device=DEV).cpu().numpy()
    assert (got == rand_reference((300, 7), key, counter)).all()


def test_randn_is_box_muller_of_the_generators_stream():
    """normal_ documents z = sqrt(-2 log(1 - u1)) * cos(2 pi u2 - pi), u1 the call's first n values, u2 the next n."""
    import numpy as np

    from neuron_kernels.library.random import rand_reference

    key, counter = _at_state()
    n = 5000
    got = torch.randn(n, device=DEV).cpu().numpy().astype(np.float64)
    u = rand_reference((2, n), key, counter).astype(np.float64)
    want = np.sqrt(-2 * np.log(1 - u[0])) * np.cos(2 * np.pi * u[1] - np.pi)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _random_calls():
    p = torch.rand(40, 30, device=DEV)
    return [lambda: torch.randn(3000, 7, device=DEV), lambda: torch.randn(999, device=DEV, dtype=torch.bfloat16),
            lambda: torch.rand(20001, device=DEV), lambda: torch.empty(20001, device=DEV).uniform_(-2, 5),
            lambda: torch.empty(5000, device=DEV, dtype=torch.float16).normal_(3, 0.25),
            lambda: torch.empty(40, 30, device=DEV).bernoulli_(0.3), lambda: torch.bernoulli(p),
            lambda: torch.empty(40, 30, device=DEV).bernoulli_(p[0]),
            lambda: torch.randint(-7, 300, (30000,), device=DEV, dtype=torch.int16),
            lambda: torch.zeros(60, 50, device=DEV).t().normal_()]  # non-contiguous


def test_values_do_not_depend_on_the_piece_size(monkeypatch):
    from torch_neuron.ops.random import distributions as ops_random

    calls = _random_calls()
    torch.neuron.manual_seed(5)
    whole = [f().cpu() for f in calls]
    monkeypatch.setattr(ops_random, "TILE", 1000)  # every call in several pieces, the last one partial
    torch.neuron.manual_seed(5)
    pieces = [f().cpu() for f in calls]
    for a, b in zip(whole, pieces):
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("make", [
    lambda n: torch.randn(n, device=DEV), lambda n: torch.randn(n, device=DEV, dtype=torch.bfloat16),
    lambda n: torch.rand(n, device=DEV), lambda n: torch.empty(n, device=DEV).uniform_(-1, 1),
    lambda n: torch.empty(n, device=DEV).normal_(2, 3), lambda n: torch.empty(n, device=DEV).bernoulli_(0.5),
    lambda n: torch.randint(0, 10, (n,), device=DEV, dtype=torch.int8),
    lambda n: torch.randint(0, 10, (n,), device=DEV)], ids=[
    "randn", "randn-bf16", "rand", "uniform", "normal", "bernoulli", "randint-int8", "randint-int64"])
def test_random_ops_need_the_output_plus_a_few_pieces_of_device_memory(monkeypatch, make):
    from torch_neuron.ops.random import distributions as ops_random

    monkeypatch.setattr(ops_random, "TILE", 1 << 14)
    n = 1 << 18  # 16 pieces
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    out = make(n)
    extra = torch.neuron.max_memory_allocated() - base - out.numel() * out.element_size()
    assert extra <= 8 * ops_random.TILE * 4, extra  # at most eight float32 pieces, whatever the output's size


# -- dropout -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_native_dropout_mask_and_scale(dtype, p):
    x = torch.randn(256, 256).to(dtype)
    with native("native_dropout"):
        out, mask = torch.native_dropout(x.to(DEV), p, True)
    out, mask = out.cpu(), mask.cpu()
    assert mask.dtype == torch.bool and out.dtype == dtype
    keep = mask.float().mean()
    assert abs(keep - (1 - p)) < 6 * math.sqrt(p * (1 - p) / x.numel())
    scale = torch.tensor(1 / (1 - p), dtype=torch.float32)  # torch's mul_(scale): a float32 multiplier
    torch.testing.assert_close(out, (x.float() * mask * scale).to(dtype), rtol=0, atol=0)


def test_dropout_edge_probabilities_and_eval():
    x = torch.randn(100, 10)
    out, mask = torch.native_dropout(x.to(DEV), 0.0, True)
    assert mask.cpu().all() and torch.equal(out.cpu(), x)
    out, mask = torch.native_dropout(x.to(DEV), 1.0, True)
    assert not mask.cpu().any() and (out.cpu() == 0).all()
    out, mask = torch.native_dropout(x.to(DEV), 0.5, False)
    assert mask.cpu().all() and torch.equal(out.cpu(), x)
    assert torch.equal(F.dropout(x.to(DEV), 0.5, training=False).cpu(), x)
    e, m = torch.native_dropout(torch.empty(0, 3, device=DEV), 0.5, True)
    assert e.shape == m.shape == (0, 3)


def test_dropout_backward_uses_the_mask():
    x = torch.randn(64, 33, device=DEV, requires_grad=True)
    with native("native_dropout", "native_dropout_backward"):
        y = F.dropout(x, 0.3)
        g = torch.randn(64, 33, device=DEV)
        y.backward(g)
    mask = (y.detach().cpu() != 0) | (x.detach().cpu() == 0)
    torch.testing.assert_close(x.grad.cpu(), g.cpu() * mask / 0.7, rtol=1e-6, atol=1e-6)
    grad = torch.ops.aten.native_dropout_backward(g, mask.to(DEV), 2.0)
    torch.testing.assert_close(grad.cpu(), g.cpu() * mask * 2.0)
