"""GradScaler's two ops on the device: ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``.

Unscaling multiplies every gradient by ``inv_scale`` in place (one ``_foreach_mul_`` program per dtype) and sets
``found_inf`` to 1 when any gradient holds an inf or NaN (checked on the values before the multiply, as CUDA's
kernel does: a finite value times a finite ``inv_scale`` stays finite). The scale update is CUDA's: a step with
``found_inf`` backs the scale off and resets the growth tracker, otherwise the tracker counts up and every
``growth_interval`` successful steps the scale grows. Its three scalars are read on the host (a few bytes) and
written back with fills.
"""

from __future__ import annotations

import torch

from ..core.checks import same_device


def _non_finite(grads) -> bool:
    flags = [torch.logical_not(torch.isfinite(g)).any() for g in grads if g.numel()]
    return bool(torch.stack(flags).any().item()) if flags else False


def non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    same_device(found_inf, inv_scale, *grads)
    if found_inf.numel() != 1 or inv_scale.numel() != 1:
        raise RuntimeError("found_inf and inv_scale must be 1-element tensors")
    if _non_finite(grads):
        found_inf.fill_(1.0)
    by_dtype: dict = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    scale = inv_scale.item()
    for group in by_dtype.values():
        torch._foreach_mul_(group, scale)


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    same_device(scale, growth_tracker, found_inf)
    if found_inf.item():
        scale.fill_(scale.item() * backoff_factor)
        growth_tracker.fill_(0)
        return scale
    successful = growth_tracker.item() + 1
    if successful == growth_interval:
        grown = torch.tensor(scale.item() * growth_factor, dtype=scale.dtype)
        if torch.isfinite(grown):  # CUDA keeps the scale when growing it would overflow
            scale.fill_(grown.item())
        successful = 0
    growth_tracker.fill_(successful)
    return scale
