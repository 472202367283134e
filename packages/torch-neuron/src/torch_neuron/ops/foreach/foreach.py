"""``_foreach_*`` ops (the multi-tensor ops of torch.optim's ``foreach=True`` paths and of AMP) on neuron.

A call's expression becomes one formula evaluated over every tensor of the list in one program per dtype
(``pointwise.expr.foreach_formula``), in float32 like torch's opmath, rounded once to each tensor's dtype;
a list that program cannot take (non-contiguous tensors, a refused trace) runs the expression per tensor with
the elementwise kernels. The scalars of a call (``lr``, bias corrections, ``1 - beta``, ...) are put in
one float32 device tensor (one small host write per call) and enter the kernels as broadcast operands,
never as compile-time constants: an optimizer's per-step scalars then never retrace a kernel.

Calls the engines cannot do exactly (integer or float64 tensors, mixed dtypes or shapes within a pair,
complex scalars) run per tensor through the regular aten ops, as torch's own slow foreach path does (those
ops then run natively or take the loud CPU fallback).
"""

from __future__ import annotations

import numpy as np
import torch

from neuron_kernels.errors import KernelError
from neuron_kernels.library import elementwise as ew
from neuron_kernels.library.formula import act, foreach_formula, inputs

from ..core.dtypes import FLOATS
from ..core.launch import execute, prepared, run
from ..core.registry import impl
from ..pointwise.base import scalar_to


# -- checks torch makes, and whether the kernels take the call -----------------------------------------
def _check(self, *lists, scalars=None) -> None:
    if len(self) == 0:
        raise RuntimeError("Tensor list must have at least one tensor.")
    for other in lists:
        if len(other) != len(self):
            raise RuntimeError(f"Tensor lists must have the same number of tensors, got {len(self)} and {len(other)}")
    if scalars is not None and len(scalars) != len(self):
        raise RuntimeError(f"Tensor list must have same number of elements as scalar list, got {len(self)} and "
                           f"{len(scalars)}")


def _native(lists, scalars=()) -> bool:
    first = lists[0]
    device = first[0].device
    if device.type != "neuron" or not all(isinstance(s, bool | int | float) for s in scalars):
        return False
    for ts in lists:
        for t, t0 in zip(ts, first):
            if t.device != device or t.dtype not in FLOATS or t.dtype != t0.dtype or t.shape != t0.shape:
                return False
    return True


# -- running one expression per tensor ----------------------------------------------------------------
class _Kernels:
    """Calls elementwise kernels for one foreach op (device time charged to it in the metrics)."""

    __slots__ = ("op",)

    def __init__(self, op: str):
        self.op = op

    def __call__(self, kernel, *args) -> torch.Tensor:
        return run(self.op, kernel, *args)[0]


# the library kernels the expressions use, as formula nodes (one program for the whole list)
_FORMULAS = {ew.add: lambda a, b: a + b, ew.sub: lambda a, b: a - b, ew.mul: lambda a, b: a * b,
             ew.div: lambda a, b: a / b, ew.sqrt: lambda a: act("sqrt", a), ew.neg: lambda a: -a}


def _symbolic(kernel, *args):
    return _FORMULAS[kernel](*args)


def _apply_fused(op: str, lists, values, expr, inplace: bool):
    """The whole call as one program per dtype (``foreach_formula``): the results (functional), True (in
    place), or None when it cannot be: an expression with a kernel that has no formula, a non-contiguous
    tensor, or a trace the kernel refuses (every group is traced before any runs, so nothing is half done)."""
    arity = len(lists)
    xs = inputs(arity + 1)
    try:
        node = expr(_symbolic, *xs[:arity], xs[arity] if values is not None else None).node
    except KeyError:
        return None
    first = lists[0]
    keep = [i for i, t in enumerate(first) if t.numel()]
    if not all(ts[i].is_contiguous() for ts in lists for i in keep):
        return None
    groups: dict = {}
    for i in keep:
        groups.setdefault(first[i].dtype, []).append(i)
    device, launches = first[0].device, []
    for dtype, idx in groups.items():
        args = [ts[i] for ts in lists for i in idx]
        if values is not None:
            args.append(torch.tensor([values[i] for i in idx], dtype=torch.float32).to(device))
        kwargs = {"expr": node, "out_dtype": dtype, "inplace": inplace}
        try:
            launches.append((idx, prepared(foreach_formula(len(idx), arity, values is not None), args, kwargs),
                             args, kwargs))
        except KernelError:
            return None
    results = None if inplace else [torch.empty_like(t) for t in first]
    for idx, launch, args, kwargs in launches:
        outs = execute(op, launch, args, kwargs)
        if not inplace:
            for i, o in zip(idx, outs):
                results[i] = o
    return True if inplace else results


def _apply(op: str, lists, values, expr, inplace: bool):
    """``expr(k, *tensors_i, s_i)`` for every index i; ``values`` (floats, one per tensor, or None) become
    ``s_i``, a float32 device scalar shaped to broadcast. In place: the result is stored into ``lists[0]``."""
    fused = _apply_fused(op, lists, values, expr, inplace)
    if fused is not None:
        return None if inplace else fused
    # per tensor (a list the one-program path does not take)
    first = lists[0]
    vec = torch.tensor(values, dtype=torch.float32).to(first[0].device) if values is not None else None
    k, results = _Kernels(op), []
    for i, t in enumerate(first):
        if t.numel() == 0:
            results.append(torch.empty_like(t))
            continue
        s = vec[i].reshape((1,) * t.dim()) if vec is not None else None
        r = expr(k, *[ts[i] if ts[i].is_contiguous() else ts[i].contiguous() for ts in lists], s)
        if inplace:
            t.copy_(r)
        else:
            results.append(r if r.dtype == t.dtype else r.to(t.dtype))
    return None if inplace else results


def _family(base: str, variants: dict, eager):
    """Register ``_foreach_<base>_.<variant>`` and ``_foreach_<base>.<variant>`` for each variant.

    ``variants[v] = parse(self, *args) -> (other lists, values, expr) or None`` (None: not for the
    kernels); ``eager(t, *args_i)`` is the per-tensor torch call used otherwise (``.Tensor`` variants of
    addcmul/addcdiv index their 1-d scalars tensor per tensor).
    """
    for variant, parse in variants.items():
        per_tensor = variant == "Tensor" and base in ("addcmul", "addcdiv")
        for inplace in (True, False):
            name = f"_foreach_{base}{'_' if inplace else ''}" + (f".{variant}" if variant else "")
            impl(name)(_make(name, parse, eager, inplace, per_tensor))


def _make(name, parse, eager, inplace, per_tensor):
    def op(self, *args, **kwargs):
        plan = parse(self, *args, **kwargs)
        if plan is None:
            return _eager(self, args, kwargs, eager, inplace, per_tensor)
        lists, values, expr = plan
        return _apply(name, [self, *lists], values, expr, inplace)

    op.__name__ = name.replace(".", "_")
    return op


def _eager(self, args, kwargs, eager, inplace, per_tensor=False):
    """torch's slow foreach path: the per-tensor aten op (list arguments indexed per tensor)."""
    results = []
    for i, t in enumerate(self):
        per = [a[i] if isinstance(a, list | tuple) or (per_tensor and isinstance(a, torch.Tensor)) else a
               for a in args]
        r = eager(t, *per, inplace=inplace, **kwargs)
        results.append(r)
    return None if inplace else results


# -- the ops -------------------------------------------------------------------------------------------
def _scalars_of(t: torch.Tensor):
    """A 1-d tensor of scalars (addcmul/addcdiv .Tensor) as Python numbers, or None when complex."""
    return None if t.is_complex() else t.detach().cpu().tolist()


def _binary(kernel, alpha_kernel=None, rounds=False):
    """Parsers for add/sub/mul/div: ``.Scalar``, ``.ScalarList``, ``.List`` (with alpha), ``.Tensor``.
    ``rounds``: torch's add/sub convert a float scalar operand to a bfloat16/float16 tensor's dtype first;
    mul/div use it at full precision (opmath)."""

    def per_tensor(self, values):
        return [scalar_to(v, t.dtype) for v, t in zip(values, self)] if rounds else list(values)

    def with_scalar(self, scalar):
        _check(self)
        if not _native([self], [scalar]):
            return None
        return [], per_tensor(self, [scalar] * len(self)), lambda k, t, s: k(kernel, t, s)

    def with_scalars(self, scalars):
        _check(self, scalars=scalars)
        return ([], per_tensor(self, scalars), lambda k, t, s: k(kernel, t, s)) if _native([self], scalars) else None

    def with_list(self, other, alpha=1):
        _check(self, other)
        if not _native([self, other], [alpha]):
            return None
        if alpha == 1 or alpha_kernel is None:
            return [other], None, lambda k, t, o, s: k(kernel, t, o)
        # alpha at full precision: CPU's per-element loop does so (its vector loop rounds it to the dtype first)
        return [other], [alpha] * len(self), lambda k, t, o, s: k(kernel, t, k(ew.mul, o, s))

    def with_tensor(self, other, alpha=1):
        _check(self)
        if other.dim() != 0 or other.dtype not in (*FLOATS, torch.float64) or alpha != 1:
            return None
        if other.dtype != self[0].dtype and any(t.dim() == 0 for t in self):
            return None  # a 0-d tensor promotes with the 0-d operand (per-tensor op gives that dtype)
        value = other.item()
        return ([], [value] * len(self), lambda k, t, s: k(kernel, t, s)) if _native([self], [value]) else None

    return {"Scalar": with_scalar, "ScalarList": with_scalars, "List": with_list, "Tensor": with_tensor}


def _eager_binary(method):
    def eager(t, other, inplace, **kwargs):
        if inplace and method in ("maximum", "minimum"):  # no Tensor.maximum_; torch's slow path writes out=
            return getattr(torch, method)(t, other, out=t)
        return getattr(t, method + ("_" if inplace else ""))(other, **kwargs)

    return eager


_family("add", _binary(ew.add, alpha_kernel=ew.mul, rounds=True), _eager_binary("add"))
_family("sub", {k: v for k, v in _binary(ew.sub, alpha_kernel=ew.mul, rounds=True).items() if k != "Tensor"},
        _eager_binary("sub"))
_family("mul", _binary(ew.mul), _eager_binary("mul"))
_family("div", _binary(ew.div), _eager_binary("div"))
_family("maximum", {"List": _binary(ew.maximum)["List"]}, _eager_binary("maximum"))
_family("minimum", {"List": _binary(ew.minimum)["List"]}, _eager_binary("minimum"))


def _unary(kernel):
    def parse(self):
        _check(self)
        return ([], None, lambda k, t, s: k(kernel, t)) if _native([self]) else None

    return {"": parse}


def _eager_unary(method):
    def eager(t, inplace):
        return getattr(t, method + ("_" if inplace else ""))()

    return eager


_family("sqrt", _unary(ew.sqrt), _eager_unary("sqrt"))
_family("neg", _unary(ew.neg), _eager_unary("neg"))


def _lerp_scalar(self, end, weight):
    """torch's lerp: ``self + w * (end - self)`` for w < 0.5, else ``end - (end - self) * (1 - w)``, with w
    and ``1 - w`` in float32 (opmath)."""
    _check(self, end)
    if not _native([self, end], [weight]):
        return None
    w = np.float32(weight)
    if w < 0.5:
        return [end], [float(w)] * len(self), lambda k, t, e, s: k(ew.add, t, k(ew.mul, k(ew.sub, e, t), s))
    one_minus = float(np.float32(1.0) - w)
    return [end], [one_minus] * len(self), lambda k, t, e, s: k(ew.sub, e, k(ew.mul, k(ew.sub, e, t), s))


def _eager_lerp(t, end, weight, inplace):
    return t.lerp_(end, weight) if inplace else torch.lerp(t, end, weight)


_family("lerp", {"Scalar": _lerp_scalar}, _eager_lerp)


def _pointwise(kernel):
    """addcmul / addcdiv: ``self + value * (t1 <op> t2)``, evaluated as ``self + (value * t1) <op> t2``
    like torch's CPU kernels; a value of 1 skips the multiply (exact)."""

    def plan(self, t1, t2, values):
        _check(self, t1, t2, scalars=values)
        if values is None or not _native([self, t1, t2], values):
            return None
        if all(v == 1 for v in values):
            return [t1, t2], None, lambda k, t, a, b, s: k(ew.add, t, k(kernel, a, b))
        return [t1, t2], list(values), lambda k, t, a, b, s: k(ew.add, t, k(kernel, k(ew.mul, a, s), b))

    def with_scalar(self, t1, t2, value=1):
        return plan(self, t1, t2, [value] * len(self))

    def with_scalars(self, t1, t2, scalars):
        return plan(self, t1, t2, list(scalars))

    def with_tensor(self, t1, t2, scalars):
        return plan(self, t1, t2, _scalars_of(scalars))

    return {"Scalar": with_scalar, "ScalarList": with_scalars, "Tensor": with_tensor}


def _eager_pointwise(method):
    def eager(t, t1, t2, value=1, inplace=False, scalars=None):
        value = scalars if scalars is not None else value
        value = value.item() if isinstance(value, torch.Tensor) else value
        return getattr(t, method + ("_" if inplace else ""))(t1, t2, value=value)

    return eager


_family("addcmul", _pointwise(ew.mul), _eager_pointwise("addcmul"))
_family("addcdiv", _pointwise(ew.div), _eager_pointwise("addcdiv"))
