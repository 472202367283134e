"""torch.multinomial on the neuron device (ops/multinomial.py): the streams differ from the CPU's, so the draws
are checked against the distributions they must follow (frequencies within 5 standard errors over 20000 draws),
zero-weight categories never drawn while weight remains, and aten's argument and value checks give the CPU's
errors."""

import pytest
import torch
from torch_neuron_testing.native import native

DEV = "neuron"
DRAWS = 20000
P = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])


def frequencies(samples: torch.Tensor, categories: int) -> torch.Tensor:
    return torch.bincount(samples.cpu().flatten(), minlength=categories).double() / samples.numel()


def assert_follows(freq: torch.Tensor, want: torch.Tensor, draws: int) -> None:
    err = (want * (1 - want) / draws).sqrt()
    assert ((freq - want).abs() <= 5 * err + 1e-12).all(), (freq, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multinomial_with_replacement_follows_the_weights(dtype):
    torch.neuron.manual_seed(0)
    with native("multinomial", "argmax"):
        samples = torch.multinomial(P.to(DEV, dtype), DRAWS, replacement=True)
    assert samples.device.type == DEV and samples.dtype == torch.int64 and samples.shape == (2, DRAWS)
    for row in range(2):
        assert_follows(frequencies(samples[row], 4), P[row].double() / P[row].sum(), DRAWS)


def test_multinomial_without_replacement_draws_in_sequence():
    """One draw of 2 per row of 20000 identical rows: the first is distributed as p, the second as
    sum_i p_i p_j / (1 - p_i) (drawn from what remains), the two differ and weight 0 is never taken."""
    p = torch.tensor([0.5, 0.3, 0.0, 0.2])
    torch.neuron.manual_seed(1)
    with native("multinomial", "topk"):
        samples = torch.multinomial(p.to(DEV).expand(DRAWS, 4), 2).cpu()
    assert (samples[:, 0] != samples[:, 1]).all() and (samples != 2).all()
    second = (p[:, None] * p[None, :] / (1 - p[:, None])).fill_diagonal_(0).sum(0)
    assert_follows(frequencies(samples[:, 0], 4), p.double(), DRAWS)
    assert_follows(frequencies(samples[:, 1], 4), second.double(), DRAWS)


def test_multinomial_takes_zero_weights_only_when_nothing_else_remains():
    torch.neuron.manual_seed(2)
    samples = torch.multinomial(torch.tensor([0.0, 3.0, 0.0, 1.0], device=DEV), 4).cpu()
    assert sorted(samples[:2].tolist()) == [1, 3] and sorted(samples[2:].tolist()) == [0, 2]


def test_multinomial_shapes_out_generator_and_reproducibility():
    p = P.to(DEV)
    assert torch.multinomial(p[0], 3, True).shape == (3,)
    assert torch.multinomial(p, 1).shape == (2, 1)
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    assert torch.multinomial(p, 2, out=out) is out and out.shape == (2, 2)
    runs = [torch.multinomial(p, 50, True, generator=torch.Generator(DEV).manual_seed(7)).cpu() for _ in range(2)]
    assert torch.equal(*runs)
    torch.neuron.manual_seed(3)
    a = torch.multinomial(p, 50, True).cpu()
    torch.neuron.manual_seed(3)
    assert torch.equal(a, torch.multinomial(p, 50, True).cpu())


BAD = {  # name: (probabilities, num_samples, replacement)
    "nan": ([1.0, float("nan")], 1, False),
    "negative": ([1.0, -1.0], 1, True),
    "inf": ([1.0, float("inf")], 1, True),
    "zero_sum": ([[1.0, 0.0], [0.0, 0.0]], 1, True),
    "too_many": ([1.0, 1.0, 1.0], 4, False),
    "no_samples": ([1.0, 1.0], 0, True),
    "three_dims": ([[[1.0, 1.0]]], 1, True),
    "integers": ([1, 2], 1, True),
}


@pytest.mark.parametrize("case", list(BAD))
def test_multinomial_rejects_what_cpu_rejects(case):
    values, n, replacement = BAD[case]
    probs = torch.tensor(values)
    with pytest.raises(RuntimeError) as want:
        torch.multinomial(probs, n, replacement)
    with pytest.raises(RuntimeError, match=None) as got:
        torch.multinomial(probs.to(DEV), n, replacement)
    assert str(got.value) == str(want.value)
