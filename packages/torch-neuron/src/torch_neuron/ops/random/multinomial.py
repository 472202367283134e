"""``aten::multinomial`` on the device, composed of device ops (sampling in ``generate(do_sample=True)``, TRL's
GRPO, diffusers' ancestral steps would otherwise copy every distribution to the host).

Each draw is an exponential race: every category i starts a clock E_i ~ Exp(1) scaled by its weight, the key is
p_i / E_i, and the largest key wins with probability p_i / sum(p) (exactly; no normalisation or cumulative sum,
so zero-weight categories, whose key is -1, can never win and rounding cannot bias the draw). Without
replacement the first k finishers (topk of the keys) are the k draws in order, which is sequential sampling
without replacement; with replacement every draw runs its own race. Uniforms come from the neuron generator
(reproducible for a seed; a different stream from the CPU's, as CUDA's is).

aten's input checks need one look at the values (finite, non-negative, a positive sum per row): one small
device-to-host read, as the CPU kernel reads them too. float64 and empty inputs take the CPU path with a CPU
generator seeded from the neuron generator's reservation (reproducible too).
"""

from __future__ import annotations

import torch

from ..core.fallback import on_cpu
from ..core.registry import note_native
from .distributions import host_generator

aten = torch.ops.aten
MAX_CATEGORIES = 1 << 24  # aten's limit: category indices must be exact in float32
RACE_ELEMENTS = 1 << 22  # keys of one batch of with-replacement draws (16 MiB of float32)


def _check_arguments(probs: torch.Tensor, num_samples: int, replacement: bool) -> None:
    if not probs.is_floating_point():
        name = torch.empty(0, dtype=probs.dtype).type().removeprefix("torch.").removesuffix("Tensor")
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {name}")
    if probs.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > probs.size(-1):
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if probs.size(-1) > MAX_CATEGORIES:
        raise RuntimeError("number of categories cannot exceed 2^24")


def _check_values(rows: torch.Tensor) -> None:
    """aten's distribution checks, from one read of two flags."""
    invalid = (~torch.isfinite(rows) | (rows < 0)).any()
    no_mass = (rows.sum(-1) <= 0).any()
    invalid, no_mass = torch.stack([invalid, no_mass]).cpu().tolist()
    if invalid:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if no_mass:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _keys(rows: torch.Tensor, shape: tuple[int, ...], generator) -> torch.Tensor:
    """Race keys of ``shape`` (..., categories): p / E with E = -log(1 - u) ~ Exp(1); -1 for weight 0. E is 0
    only for u = 0 (then p / 0 = inf: an instant finish wins, as the limit says)."""
    u = torch.rand(shape, device=rows.device, generator=generator)
    clocks = -torch.log1p(-u)
    return torch.where(rows > 0, rows / clocks, -1.0)


def _with_replacement(rows: torch.Tensor, num_samples: int, generator) -> torch.Tensor:
    n, categories = rows.shape
    per_batch = max(1, RACE_ELEMENTS // max(1, n * categories))
    draws = []
    for start in range(0, num_samples, per_batch):
        count = min(per_batch, num_samples - start)
        draws.append(_keys(rows.unsqueeze(1), (n, count, categories), generator).argmax(-1))
    return torch.cat(draws, 1) if len(draws) > 1 else draws[0]


def multinomial(self: torch.Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> torch.Tensor:
    _check_arguments(self, num_samples, replacement)
    if self.dtype == torch.float64 or self.numel() == 0:
        return on_cpu(aten.multinomial.default, self, num_samples, replacement,
                      generator=host_generator(generator, self.numel() * num_samples, self.device))
    rows = self.reshape(-1, self.size(-1)).float()
    _check_values(rows)
    if replacement and num_samples > 1:
        picks = _with_replacement(rows, num_samples, generator)
    elif num_samples == 1:
        picks = _keys(rows, rows.shape, generator).argmax(-1, keepdim=True)
    else:
        picks = _keys(rows, rows.shape, generator).topk(num_samples, -1).indices
    note_native("multinomial")  # its parts ran (and were counted) on the device
    return picks.reshape(*self.shape[:-1], num_samples)
