"""RNG state of the neuron devices: one counter-based generator (seed, offset) per device."""

from __future__ import annotations

import torch

from .device import _index, device_count


def default_generator(device=None) -> torch.Generator:
    from . import _C

    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        default_generator(i).manual_seed(int(seed))


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        default_generator(i).seed()


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    return default_generator(device).get_state()


def set_rng_state(state: torch.Tensor, device="neuron") -> None:
    default_generator(device).set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


def reserve(generator: torch.Generator | None, count: int, device: int) -> tuple[int, int]:
    """(seed, offset) for ``count`` fresh random values; advances the generator."""
    from . import _C

    return _C._rng_reserve(generator if generator is not None else default_generator(device), int(count))
