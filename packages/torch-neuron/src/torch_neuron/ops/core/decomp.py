"""Ops with no neuron kernel that PyTorch can decompose run their decomposition on the device.

An aten op that reaches the backend without a kernel of ours would take the loud CPU fallback. Many of
them (pads, pools, upsampling, activations, losses, ...) have a decomposition in
``torch._decomp.decomposition_table`` into simpler aten ops, the ones Inductor and export lower to and
PyTorch tests against eager. Registered as the op's neuron kernel, that decomposition runs on neuron
tensors, so each of its ops reaches its own kernel; only pieces without one still fall back, each counted
under its own name. This is registered last, for ops no module registered, and skips:

- ops with a composite kernel: the dispatcher already runs those as other ops;
- view ops: a decomposition returns new memory where the op must alias its input;
- a decomposition that ends up calling its own op again: that inner call takes the CPU path (the
  decomposition only rewrites the case it handles and redispatches the rest); one that returns
  ``NotImplemented`` for the arguments does too.

out= overloads run the decomposition functionally and write the results (aten's resize and safe-cast
rules); in-place ones copy into ``self`` unless the decomposition already wrote it. bfloat16/float16
inputs are decomposed in float32 and rounded once, as aten's kernels do.
"""

from __future__ import annotations

import inspect
import threading

import torch
from torch._decomp import decomposition_table
from torch.utils._pytree import tree_leaves, tree_map

from .checks import meta_result
from .compose import write_outs
from .fallback import on_cpu
from .registry import LIB, scoped
from .variants import check_cast

_COMPOSITE = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
_REDUCED = (torch.bfloat16, torch.float16)
# aten computes these in the reduced dtype's own steps, which neither the decomposition nor float32 rounded
# once reproduces (linspace's bf16 points differ by an ulp): bf16/fp16 calls take the CPU path
_CPU_WHEN_REDUCED = frozenset({"aten::linspace", "aten::logspace"})
# decompositions that disagree with eager (torch 2.13): multilabel_margin_loss_forward gives a [1] loss for a
# 1-d input where eager (and the CPU) give a 0-d one, and its meta kernel inherits that
_NOT_EAGER = frozenset({"aten::multilabel_margin_loss_forward"})
# decompositions that do not check their arguments where the op's meta kernel does (a reflection pad as large as
# its dim is an IndexError of the gather they become): their meta kernel runs first and its error is the op's
_CHECKED_BY_META = frozenset(f"aten::{kind}_pad{d}d{grad}" for kind in ("reflection", "replication")
                             for d in (1, 2, 3) for grad in ("", "_backward"))
_running = threading.local()  # the ops whose decomposition is on this thread's stack


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def _is_view(op: torch._ops.OpOverload) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def eligible(op: torch._ops.OpOverload) -> bool:
    name = op.name()
    if not name.startswith("aten::") or _is_view(op) or name in _NOT_EAGER:
        return False
    return not any(_has_kernel(name, key) for key in ("PrivateUse1", *_COMPOSITE))


def _writes(op: torch._ops.OpOverload) -> tuple[list[str], list[int]]:
    """The names of the op's out= arguments, and the positions of the inputs it mutates (``self`` of a_)."""
    outs, mutated = [], []
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            (outs.append(a.name) if a.kwarg_only else mutated.append(i))
    return outs, mutated


def _callable_without_outs(decomposition, outs: list[str]) -> bool:
    """Decompositions of out= overloads are called functionally (their own out handling is not always
    there); one that requires its out arguments cannot be."""
    try:
        params = inspect.signature(decomposition).parameters
    except (TypeError, ValueError):
        return False
    return all(n not in params or params[n].default is not inspect.Parameter.empty for n in outs)


def _scalar_args(op: torch._ops.OpOverload) -> tuple[list[int], list[str]]:
    """Positions and keyword names of the op's ``Scalar`` arguments: aten converts those to the tensor's
    dtype (hardshrink's lambda in bfloat16), unlike ``float`` ones (eps, scale factors), kept in double."""
    pos, names = [], []
    for i, a in enumerate(op._schema.arguments):
        t = a.type.getElementType() if isinstance(a.type, torch._C.OptionalType) else a.type
        if isinstance(t, torch._C.NumberType):  # Scalar in the schema's text
            (names if a.kwarg_only else pos).append(a.name if a.kwarg_only else i)
    return pos, names


def _reduced(args, kwargs) -> torch.dtype | None:
    for v in tree_leaves((args, kwargs)):
        if isinstance(v, torch.Tensor) and v.dtype in _REDUCED:
            return v.dtype
    return None


def _up(v):
    return v.float() if isinstance(v, torch.Tensor) and v.dtype in _REDUCED else v


def _meta(v):
    return v.to("meta") if isinstance(v, torch.Tensor) else v


def _in_float32(decomposition, low: torch.dtype, scalars, mutated: list[int], args, kwargs):
    """A decomposition over bfloat16/float16 tensors computed in float32 and rounded once to the dtypes it
    gives for the original inputs (traced on meta tensors), as aten's own kernels compute reduced floats:
    one rounding at the end, not one per decomposed op. ``Scalar`` arguments are first rounded to the
    reduced dtype as aten converts them. Mutated inputs get their float32 updates back."""
    expected = decomposition(*tree_map(_meta, args), **tree_map(_meta, kwargs))

    def scalar(v):
        return torch.tensor(v, dtype=low).item() if v.__class__ is float else v

    # a result in the reduced dtype is TensorIterator's common dtype: a wrapped Python scalar (xlogy(x, 1e-38)
    # reaches xlogy.Tensor with a float) or a 0-d operand of a wider float dtype is cast to it first, so float16
    # xlogy(3, 1e-38) is 3 * log(0) = -inf, not 3 * -87.3
    common = {e.dtype for e in tree_leaves(expected) if isinstance(e, torch.Tensor)} == {low}

    def operand(v):
        if common and v.__class__ is float:
            return scalar(v)
        if common and isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point() and \
                v.dtype not in _REDUCED:
            return v.to(low).float()
        return _up(v)

    up_args = [scalar(v) if i in scalars[0] else operand(v) for i, v in enumerate(args)]
    up_args = tree_map(_up, up_args)
    up_kwargs = {k: scalar(v) if k in scalars[1] else v for k, v in kwargs.items()}
    result = decomposition(*up_args, **tree_map(_up, up_kwargs))
    for i in mutated:
        if up_args[i] is not args[i]:
            args[i].copy_(up_args[i])
    return tree_map(lambda r, e: r.to(e.dtype) if isinstance(r, torch.Tensor) else r, result, expected)


def _expected(op: torch._ops.OpOverload, args, kwargs, targets, outs):
    """The op's own meta result (shapes, dtypes) for these arguments, or None without a meta kernel."""
    try:
        return meta_result(op, *args, **dict(zip(outs, targets)), **kwargs)
    except (NotImplementedError, RuntimeError, TypeError, ValueError):
        return None


def _conform(result, expected):
    """A decomposition's result as the op's meta kernel says it is: dtype, and shape where only the shape
    differs (PyTorch's multilabel_margin_loss decomposition gives [1] for a 0-d loss)."""
    if expected is None or result is None:
        return result

    def fix(r, e):
        if not isinstance(r, torch.Tensor) or not isinstance(e, torch.Tensor):
            return r
        if r.shape != e.shape and r.numel() == e.numel():
            r = r.reshape(e.shape)
        return r if r.dtype == e.dtype else r.to(e.dtype)

    try:
        return tree_map(fix, result, expected)
    except (ValueError, TypeError):  # another structure: leave it to the comparison with torch
        return result


def _kernel(op: torch._ops.OpOverload, decomposition):
    outs, mutated = _writes(op)
    cpu_when_reduced = op.name() in _CPU_WHEN_REDUCED
    checked_by_meta = op.name() in _CHECKED_BY_META
    inplace = op._schema.name.endswith("_")  # returns its mutated self
    scalars = _scalar_args(op)

    def run(*args, **kwargs):
        active = _running.__dict__.setdefault("ops", set())
        if op in active:
            return on_cpu(op, *args, **kwargs)
        targets = [kwargs.pop(n) for n in outs if n in kwargs]
        low = _reduced(args, kwargs)
        if cpu_when_reduced and (low or _reduced((), targets)) is not None:
            return on_cpu(op, *args, **dict(zip(outs, targets)), **kwargs)
        if checked_by_meta:
            meta_result(op, *args, **dict(zip(outs, targets)), **kwargs)  # torch's errors for bad arguments
        expected = _expected(op, args, kwargs, targets, outs) if not outs else None
        active.add(op)
        try:
            if low is not None:
                result = _in_float32(decomposition, low, scalars, mutated, args, kwargs)
            else:
                result = decomposition(*args, **kwargs)
        finally:
            active.discard(op)
        if result is NotImplemented:  # the decomposition does not cover these arguments
            return on_cpu(op, *args, **dict(zip(outs, targets)), **kwargs)
        result = _conform(result, expected)
        if targets:
            results = result if isinstance(result, tuple | list) else (result,)
            for t, r in zip(targets, results):
                check_cast(r.dtype, t)
            written = write_outs(targets, results)
            return written if len(written) > 1 else written[0]
        if inplace:
            self = args[0]
            if result is not self:
                check_cast(result.dtype, self)
                self.copy_(result)
            return self
        return result

    run.__name__ = f"decomposed_{op.name().split('::')[1]}"
    return run


def register() -> list[torch._ops.OpOverload]:
    """Register the decompositions of the ops still without a neuron kernel; returns those ops."""
    done = []
    for op, decomposition in decomposition_table.items():
        if isinstance(op, torch._ops.OpOverload) and eligible(op) and _callable_without_outs(
                decomposition, _writes(op)[0]):
            LIB.impl(op, scoped(op._schema.name.split("::")[1], _kernel(op, decomposition)), "PrivateUse1")
            done.append(op)
    return done


DECOMPOSED: list[torch._ops.OpOverload] = []
