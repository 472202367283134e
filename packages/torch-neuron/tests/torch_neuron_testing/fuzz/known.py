"""Known, reported device defects the fast profile (tests/test_fuzz.py) does not run, so that
``nox -s test`` stays green until they are fixed: each entry names the defect and says which cases are
its instances. Delete an entry when its fix lands (the fast profile then runs those cases again). The long
profile (``nox -s fuzz``) runs every case and labels failures matching an entry as known."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .casts import CASTS
from .pointwise import BINARY, TERNARY, UNARY
from .spec import Case, T

# the ops that convert their int64 data operands to another dtype (casts, type promotion, cat)
PROMOTING = tuple(op.name for op in BINARY + TERNARY + CASTS) + ("cat_stack",)


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


def _int64_strided_cast(case: Case) -> bool:
    """An int64 tensor takes part in a cast (another dtype in the case: a tensor, a Python float, dtype=)
    and some tensor of the case is not dense."""
    ts = [t for t in _tensors(case) if 0 not in t.shape]
    if not any(t.dtype == torch.int64 for t in ts) or all(t.layout == "contiguous" for t in ts):
        return False
    others = {t.dtype for t in ts} - {torch.int64}
    floats = [v for v in list(case.tensors) + list(case.params.values()) if isinstance(v, float | torch.dtype)]
    return bool(others or floats)


def _out_shape_differs(case: Case) -> bool:
    """``op(a, b, out=a)`` where a is not the broadcast shape of a and b (aten raises; the device writes)."""
    a, b = case.tensors[:2]
    other = b.shape if isinstance(b, T) else ()
    return tuple(torch.broadcast_shapes(a.shape, other)) != tuple(a.shape)


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


def _empty_batch_with_spatial_dims(case: Case) -> bool:
    x = case.tensors[0]
    return x.shape[0] == 0 and len(x.shape) > 2


def _writes_overlapping_self(case: Case) -> bool:
    """An in-place op whose written tensor has internal overlap (aten raises its internal-overlap error)."""
    x = case.tensors[0]
    return x.layout in ("overlapping", "expanded") and math.prod(x.shape) > 1


KNOWN: list[Known] = [
    # int64 <-> other dtypes through a strided copy (a non-dense source or destination of >= ~64 rows) fail with
    # "vector engine does not compute on int64" (reported; owned by the int64 work): casts, and the promotions
    # of binary ops and cat that cast an int64 operand
    Known("non-contiguous int64 casts", PROMOTING, _int64_strided_cast),
    # unique / unique_consecutive of int64 values give wrong values or counts (reported; owned by the int64 work)
    Known("int64 unique/unique_consecutive", ("unique", "unique_consecutive"), _first_dtype(torch.int64)),
    # copysign with a CPU 0-d tensor as the sign operand (reported)
    Known("copysign with a CPU 0-d tensor", ("copysign",), _cpu_scalar_tensor),
    # found by this fuzzer (issue 18), reported:
    # an in-place op on a tensor with internal overlap fails in the strided copy with a KernelError
    # ("destination writes some element twice") instead of torch's RuntimeError
    Known("in-place ops on internally overlapping tensors: KernelError, not torch's error",
          tuple(op.name for op in UNARY + BINARY if op.inplace), _writes_overlapping_self),
    # out= whose shape is not the broadcast shape (a 0-d out, an empty result) is written instead of raising
    Known("out= shape not checked against the broadcast shape", ("maximum_",), _out_shape_differs),
    # a query whose scores are all -inf (fully masked, or -inf keys) gives NaN; aten's math path gives 0
    Known("sdpa: fully masked query rows give NaN, not 0", ("scaled_dot_product_attention",), _masked_out_row),
    # a masked-out key with an infinite score is dropped by the device; aten adds the mask to the score
    # (inf + -inf = NaN), as the documented reference implementation does
    Known("sdpa: masked-out keys with infinite scores are ignored (aten: NaN)", ("scaled_dot_product_attention",),
          _non_finite_masked_score),
    # q.k is formed before the scale: it overflows to inf (NaN weights) for large q, k where aten's
    # sqrt(scale) * q . sqrt(scale) * k stays finite
    Known("sdpa: scores overflow float32 before scaling", ("scaled_dot_product_attention",), _unscaled_overflow),
    # an empty batch with spatial dims, (0, C, d), divides by zero in the nll kernel's blocking
    Known("nll_loss / cross_entropy of an empty (0, C, d) batch: ZeroDivisionError in nll.py blocks",
          ("cross_entropy", "nll_loss"), _empty_batch_with_spatial_dims),
]


def known_defect(op: str, case: Case) -> str | None:
    """The defect ``case`` of ``op`` is a known instance of, if any."""
    for k in KNOWN:
        if op in k.ops and k.when(case):
            return k.defect
    return None
