"""Known, reported device defects the fast profile (tests/test_fuzz.py) does not run, so that
``nox -s test`` stays green until they are fixed: each entry names the defect and says which cases are
its instances. Delete an entry when its fix lands (the fast profile then runs those cases again). The long
profile (``nox -s fuzz``) runs every case and labels failures matching an entry as known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .spec import Case, T


@dataclass(frozen=True)
class Known:
    defect: str
    ops: tuple[str, ...]
    when: Callable[[Case], bool]


def _tensors(case: Case) -> list[T]:
    return [t for t in case.tensors if isinstance(t, T)]


def _any_dtype(*dtypes):
    return lambda case: any(t.dtype in dtypes for t in _tensors(case))


def _first_dtype(*dtypes):
    return lambda case: bool(_tensors(case)) and _tensors(case)[0].dtype in dtypes


def _cpu_scalar_tensor(case: Case) -> bool:
    return any(t.cpu and t.shape == () for t in _tensors(case))


KNOWN: list[Known] = [
    # unique / unique_consecutive of int64 values give wrong values or counts (reported; owned by the int64 work)
    Known("int64 unique/unique_consecutive", ("unique", "unique_consecutive"), _first_dtype(torch.int64)),
    # copysign with a CPU 0-d tensor as the sign operand (reported)
    Known("copysign with a CPU 0-d tensor", ("copysign",), _cpu_scalar_tensor),
]


def known_defect(op: str, case: Case) -> str | None:
    """The defect ``case`` of ``op`` is a known instance of, if any."""
    for k in KNOWN:
        if op in k.ops and k.when(case):
            return k.defect
    return None
