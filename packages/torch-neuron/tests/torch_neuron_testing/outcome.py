"""What a database test found, shared by the op_db, module_db and optim_db runners."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

SEED = 0
RANDOM = "outputs are random (the CPU gives other values under another seed): values not compared"


@dataclass
class Outcome:
    key: str
    status: str  # "pass", "fail" or "skip" (values not comparable; metadata was checked)
    reason: str = ""
    sample: int | None = None  # the failing sample's index
    samples: int = 0  # samples run
    fallbacks: set[str] = field(default_factory=set)
    seconds: float = 0.0

    @property
    def native(self) -> bool:
        return not self.fallbacks


def seed(value: int = SEED) -> None:
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value)


def pick(count: int, first: int | None, extra=()) -> list[int]:
    """Indices to run out of ``count``: the first ``first`` (all if None) and those in ``extra``."""
    return [i for i in range(count) if first is None or i < first or i in set(extra)]


def last_needed(first: int | None, extra=()) -> int | None:
    """The highest index :func:`pick` can want (None: all)."""
    return None if first is None else max(set(extra) | {first - 1})


def describe(e: BaseException, limit: int = 300) -> str:
    """One line naming the error: type and the informative lines of its message."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("The failure occurred", "Expected", "Actual"))][:4]
    text = f"{type(e).__name__}: {'; '.join(keep)}" if keep else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
