"""Known, reported device defects the fast profile (tests/test_fuzz.py) does not run, so that
``nox -s test`` stays green until they are fixed: each entry names the defect and says which cases are
its instances. Delete an entry when its fix lands (the fast profile then runs those cases again). The long
profile (``nox -s fuzz``) runs every case and labels failures matching an entry as known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .spec import Case


@dataclass(frozen=True)
class Known:
    defect: str
    ops: tuple[str, ...]
    when: Callable[[Case], bool]


def _unscaled_overflow(case: Case) -> bool:
    """q.k overflows in float32 before the scale is applied, while aten's math path, which scales q and k by
    sqrt(scale) each first, stays finite."""
    if case.tensors[0].dtype == torch.float64:
        return False
    q, k = (t.build().float() for t in case.tensors[:2])
    if not (q.isfinite().all() and k.isfinite().all()):
        return False
    k = k.repeat_interleave(max(q.shape[1] // max(k.shape[1], 1), 1), 1)
    return q.numel() > 0 and k.numel() > 0 and bool((~(q @ k.transpose(-2, -1)).isfinite()).any())


def _values_near_the_dtype_max(case: Case) -> bool:
    """Some |v| exceeds the float32 maximum over the number of keys: the flash kernels accumulate the unnormalized
    sum_j p_j v_j (p_max = 1, sum_j p_j = l up to the number of keys) in float32 and divide by l at the end, so it
    overflows where the math path's normalized weights keep sum_j p_j v_j <= max |v|."""
    v = case.tensors[2].build()
    return v.dtype in (torch.float32, torch.bfloat16) and v.numel() > 0 and \
        bool((v.float().abs() > torch.finfo(torch.float32).max / max(v.shape[-2], 1)).any())


KNOWN: list[Known] = [
    # found by this fuzzer (issue 18), reported:
    # q.k is formed before the scale: it overflows to inf (NaN weights) for large q, k where aten's
    # sqrt(scale) * q . sqrt(scale) * k stays finite
    Known("sdpa: scores overflow float32 before scaling", ("scaled_dot_product_attention",), _unscaled_overflow),
    # the output's unnormalized accumulator overflows for |v| within a factor of the key count of FLT_MAX
    Known("sdpa: values near the float32 maximum overflow the unnormalized P V accumulation",
          ("scaled_dot_product_attention",), _values_near_the_dtype_max),
]


def known_defect(op: str, case: Case) -> str | None:
    """The defect ``case`` of ``op`` is a known instance of, if any."""
    for k in KNOWN:
        if op in k.ops and k.when(case):
            return k.defect
    return None
