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




def _scores(case: Case):
    """(scores, the positions the masks keep) of an attention case, as aten's math path computes them: in
    float32 for 16-bit and float32 inputs (where a large q.k overflows to inf)."""
    wide = torch.float64 if case.tensors[0].dtype == torch.float64 else torch.float32
    q, k = (t.build().to(wide) for t in case.tensors[:2])
    k = k.repeat_interleave(max(q.shape[1] // max(k.shape[1], 1), 1), 1)
    scale = case.params.get("scale") or 1 / q.shape[-1] ** 0.5
    s = q @ k.transpose(-2, -1) * scale
    keep = torch.ones(s.shape, dtype=torch.bool)
    bias = torch.zeros(s.shape, dtype=wide)
    if len(case.tensors) > 3:
        m = case.tensors[3].build()
        keep = keep & m if m.dtype == torch.bool else keep
        bias = bias + (m.to(wide) if m.dtype != torch.bool else 0)
    if case.params.get("is_causal"):
        keep = keep & torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return s + bias, keep


def _unscaled_overflow(case: Case) -> bool:
    """q.k overflows in float32 before the scale is applied, while aten's math path, which scales q and k by
    sqrt(scale) each first, stays finite."""
    if case.tensors[0].dtype == torch.float64:
        return False
    q, k = (t.build().float() for t in case.tensors[:2])
    k = k.repeat_interleave(max(q.shape[1] // max(k.shape[1], 1), 1), 1)
    return q.numel() > 0 and k.numel() > 0 and bool((~(q @ k.transpose(-2, -1)).isfinite()).any())


def _masked_out_row(case: Case) -> bool:
    """Some query keeps no key with a score above -inf (aten's math attention returns 0 there)."""
    s, keep = _scores(case)
    return s.numel() > 0 and bool(((s == -torch.inf) | ~keep).all(-1).any())


def _non_finite_masked_score(case: Case) -> bool:
    """A key the mask removes has a non-finite score (aten adds -inf to it: inf - inf = NaN for the row)."""
    s, keep = _scores(case)
    return s.numel() > 0 and bool((~s.isfinite() & ~keep).any())






KNOWN: list[Known] = [
    # found by this fuzzer (issue 18), reported:
    # a query whose scores are all -inf (fully masked, or -inf keys) gives NaN; aten's math path gives 0
    Known("sdpa: fully masked query rows give NaN, not 0", ("scaled_dot_product_attention",), _masked_out_row),
    # a masked-out key with an infinite score is dropped by the device; aten adds the mask to the score
    # (inf + -inf = NaN), as the documented reference implementation does
    Known("sdpa: masked-out keys with infinite scores are ignored (aten: NaN)", ("scaled_dot_product_attention",),
          _non_finite_masked_score),
    # q.k is formed before the scale: it overflows to inf (NaN weights) for large q, k where aten's
    # sqrt(scale) * q . sqrt(scale) * k stays finite
    Known("sdpa: scores overflow float32 before scaling", ("scaled_dot_product_attention",), _unscaled_overflow),
]


def known_defect(op: str, case: Case) -> str | None:
    """The defect ``case`` of ``op`` is a known instance of, if any."""
    for k in KNOWN:
        if op in k.ops and k.when(case):
            return k.defect
    return None
