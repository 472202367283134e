"""An entry of the fuzz table: the op as a function of a case's tensors and parameters, the strategy that
draws its cases, and how its results are judged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
