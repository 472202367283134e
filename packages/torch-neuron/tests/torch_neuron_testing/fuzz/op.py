"""An entry of the fuzz table: the op as a function of a case's tensors and parameters, the strategy that
draws its cases, and how its results are judged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class Op:
    """``fn(*tensors, **params)`` runs the op (on whichever device its tensors are); ``case(cap)`` draws
    cases of at most ``cap`` elements per tensor.

    ``tol`` multiplies the dtype tolerance (an op whose result is a long chain of roundings);
    ``scale(*inputs64, **params)`` gives, per output element, the magnitude its rounding errors are relative
    to (sum of |terms| for sums and matmuls, where any order of addition is right); ``post(out, inputs,
    params)`` maps results to what is compared (sort indices to the values they pick: ties make indices
    ambiguous); ``inplace`` also compares the inputs after the call; ``arbiter`` False for ops whose float64
    run means something else (casts to a named dtype); ``random``: a disagreement is first checked for
    the CPU's own results depending on the seed (then the values are not comparable); ``reference``: the
    float64 arbiter when the op's own float64 CPU path is not a faithful one (another formula for the same
    values, e.g. var_mean's mean as torch.mean: the CPU's Welford update makes the mean of [inf, 1] NaN)."""

    name: str
    fn: Callable
    case: Callable[[int], st.SearchStrategy]
    tol: float = 1.0
    scale: Callable | None = None
    post: Callable | None = None
    inplace: bool = False
    arbiter: bool = True
    random: bool = False
    reference: Callable | None = None
    reseed: Callable | None = None  # a context to run the op under another seed (default: manual_seed)

    def strategy(self, cap: int) -> st.SearchStrategy:
        return self.case(cap)


def magnitude(fn: Callable, scalars: tuple[str, ...] = ("alpha", "beta", "value")) -> Callable:
    """A ``scale`` for ops that add up terms: ``fn`` of the absolute values of the floating inputs and the
    named scalar parameters, so a result that cancels is judged relative to the terms it summed (integer
    results are exact: integer inputs, indices among them, stay as they are)."""
    def scale(*inputs, **params):
        ins = [t.abs() if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) else t
               for t in inputs]
        return fn(*ins, **{k: abs(v) if k in scalars and v is not None else v for k, v in params.items()})
    return scale
