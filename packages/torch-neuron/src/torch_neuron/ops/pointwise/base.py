"""How a pointwise aten overload (functional, in-place or ``out=``) runs as one kernel call.

Per call signature (operand shapes, dtypes and devices, scalar types, constants) a ``Plan`` is made once:
torch's own rules, run on meta tensors, give the result shape and dtype and raise torch's errors (bad
broadcasts, in-place results that cannot be cast back, bool subtraction, ...); the plan also says
whether the device computes the call exactly, otherwise it runs on the CPU through ``on_cpu``
(loudly: warning, counter, strict mode). Per call only the operands are prepared and the kernel is
launched; contiguous in-place and ``out=`` targets of the result dtype receive the kernel's output
directly (no temporary, no copy).

dtypes the engines compute on (``COMPUTE``): float32, bfloat16, float16, int8/16/32, uint8, bool. fp8
and the 16/32/64-bit unsigned types have no torch CPU arithmetic either, so they stay on the CPU path
(same errors as torch). int64 and float64 operands are converted only where torch's promotion converts
them anyway: to a float result dtype (``int64_tensor * 0.5``, ``exp(int64)``), and 0-d operands to the
promoted dtype (``int32_tensor + torch.tensor(3)``); the conversion is a device cast, the same rounding
torch applies. Signatures computing in int64 (arithmetic, comparisons, min/max/clamp/where, division by a
small int) go to the exact 32-bit-word kernels of pointwise.int64 through ``Plan.wide``, off the hot path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch._prims_common.wrappers import _maybe_resize_out

from neuron_kernels.errors import KernelError
from neuron_kernels.lru import LRU

from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import _key_part, execute, prepared, remembered
from ..core.registry import impl
from ..core.variants import check_cast

COMPUTE = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16,
                     torch.int32, torch.bool})
INTS = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32})
_WIDE_INTS = frozenset({torch.int64, torch.uint16, torch.uint32, torch.uint64})


@dataclass(slots=True)
class Plan:
    """What one call signature needs: ``shape``/``dtype`` of the functional result, ``R`` the promoted
    dtype of the operands (torch.result_type), ``cast`` the dtype int64/float64 operands are converted to,
    ``cpu`` when the call does not take the generic kernel path: it runs on the CPU, or, when ``wide`` is set,
    through that runner (exact int64 arithmetic from 32-bit words, see pointwise.int64)."""

    cpu: bool
    shape: torch.Size
    dtype: torch.dtype
    R: torch.dtype
    cast: torch.dtype | None
    device: torch.device
    numel: int
    launches: dict = field(default_factory=dict)  # prepared launches (weakly, see launch.remembered) by kernel and
    # constants
    seen: dict = field(default_factory=dict)  # distinct values of each scalar argument (see ``dynamic``)
    wide: object = None  # runner(entry, plan, args, kwargs, target) of an int64 signature, or None


PLANS_PER_OP = 256  # call signatures an overload keeps the plan of (the most recently used)


class Entry:
    """One registered overload: ``adapter(plan, *args, **kwargs)`` gives ``(kernel, operands, constants)``
    (or None: this call runs on the CPU); ``promoted`` names the arguments torch.result_type is taken over;
    ``supports(plan, *args, **kwargs)`` (signature-level) may send a whole signature to the CPU."""

    __slots__ = ("name", "overload", "functional", "adapter", "promoted", "supports", "out_arg", "plans")

    def __init__(self, name, overload, functional, adapter, promoted, supports):
        self.name, self.overload, self.functional, self.adapter = name, overload, functional, adapter
        self.promoted, self.supports = promoted, supports
        self.out_arg = next((a.name for a in overload._schema.arguments
                             if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only), None)
        self.plans = LRU(PLANS_PER_OP)  # by call signature


# -- signatures and plans ------------------------------------------------------------------------------
def _sig(v):
    if isinstance(v, torch.Tensor):
        return (v.shape, v.dtype, v.get_device())  # -1 on the CPU, else the neuron index
    if isinstance(v, bool | int | float | complex):
        return v.__class__  # a scalar's type decides promotion; its value is a kernel constant
    return v


def plan_of(entry: Entry, args, kwargs) -> Plan:
    key = (*map(_sig, args), *[(k, _sig(v)) for k, v in kwargs.items()])
    plan = entry.plans.get(key)
    if plan is None:
        plan = entry.plans[key] = _make_plan(entry, args, kwargs)
    return plan


def _meta(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _arg(entry: Entry, args, kwargs, name_or_index):
    if isinstance(name_or_index, int):
        return args[name_or_index] if name_or_index < len(args) else None
    if name_or_index in kwargs:
        return kwargs[name_or_index]
    names = [a.name for a in entry.overload._schema.arguments]
    i = names.index(name_or_index)
    return args[i] if i < len(args) else None


def _make_plan(entry: Entry, args, kwargs) -> Plan:
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    device = operand_device(tensors)
    margs, mkwargs = [_meta(a) for a in args], {k: _meta(v) for k, v in kwargs.items()}
    with warnings.catch_warnings():  # resize warnings come from the real call
        warnings.simplefilter("ignore")
        entry.overload(*margs, **mkwargs)  # torch's errors for this signature
        fkwargs = {k: v for k, v in mkwargs.items() if k != entry.out_arg}
        result = entry.functional(*margs, **fkwargs)
    promoted = [v for v in (_arg(entry, args, kwargs, p) for p in entry.promoted) if v is not None]
    R = elementwise_dtypes(*promoted, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
    # an int64 promotion with a float result (int64 / int64, exp(int64)) computes in that float, as torch does
    cast = R if R in COMPUTE else result.dtype if R in _WIDE_INTS and result.dtype in FLOATS else None
    if R is torch.int64 and result.dtype is torch.bool and all(t.dtype is torch.bool for t in tensors):
        cast = torch.bool  # bool tensors against a Python int: the comparison adapters compare in FP32
    plan = Plan(False, result.shape, result.dtype, R, cast, device, result.numel())
    cpu = result.dtype not in COMPUTE or cast is None
    fkwargs = {k: v for k, v in kwargs.items() if k != entry.out_arg}
    plan.cpu = cpu or (entry.supports is not None and not entry.supports(plan, *args, **fkwargs))
    if plan.cpu and R is torch.int64 and result.dtype in _WIDE_RESULTS and entry.name in WIDE:
        plan.wide = WIDE[entry.name]  # int64 math from 32-bit words; off the hot path (plan.cpu stays set)
    if plan.cpu and R is torch.complex64 and result.dtype is torch.complex64 and entry.name in COMPLEX:
        plan.wide = COMPLEX[entry.name]  # float32 math on the parts (pointwise.complex)
    return plan


def target_kwargs(entry: Entry, plan: Plan, args, kwargs: dict, target) -> dict:
    """For a runner below: an out= target resized to the result and dropped from the arguments, and aten's cast
    check of an in-place or out= target."""
    if target is not None and target is kwargs.get(entry.out_arg):
        kwargs = {k: v for k, v in kwargs.items() if k != entry.out_arg}
        resize_out(target, plan.shape, (*args, *kwargs.values()))
    if target is not None:
        check_cast(plan.dtype, target)
    return kwargs


def resize_out(out: torch.Tensor, shape: torch.Size, inputs) -> None:
    """An out= tensor resized to the result (with torch's deprecation warning), except one that is also an
    input: TensorIterator reads it as an operand, so it must already have the broadcast shape."""
    if out.shape != shape and any(x is out for x in inputs):
        raise RuntimeError(f"output with shape {list(out.shape)} doesn't match the broadcast shape {list(shape)}")
    _maybe_resize_out(out, shape)


# runner(entry, plan, args, kwargs, target) by metrics name, filled in by pointwise.int64; target is None
# (functional), the in-place self or the out= tensor
WIDE: dict = {}
COMPLEX: dict = {}  # the same for complex64 signatures, filled in by pointwise.complex
_WIDE_RESULTS = frozenset({torch.int64, torch.bool})


def operand_device(tensors) -> torch.device:
    """The neuron device of a pointwise call: every tensor on it, or a 0-d CPU tensor (TensorIterator reads
    those as scalars); torch's error otherwise."""
    neuron = [t.device for t in tensors if t.device.type == "neuron"]
    for t in tensors:
        if t.device != neuron[0] and not (t.device.type == "cpu" and t.dim() == 0):
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{neuron[0]} and {t.device}!")
    return neuron[0]


# -- operands and launches -----------------------------------------------------------------------------
class Raw:
    """An operand passed to the kernel in its own dtype (a bit view, a CPU-scalar-like operand torch reads at
    full precision), not converted to the promoted dtype."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


def _exact_in(src: torch.dtype, dst: torch.dtype) -> bool:
    """Every ``src`` value reads unchanged as ``dst`` (then the kernel needs no converted copy)."""
    if src is dst or src is torch.bool:
        return True
    if dst in FLOATS:
        return src in _SMALL_INTS or (dst is torch.float32 and src in FLOATS)
    if dst in INTS and src in INTS:
        a, b = torch.iinfo(src), torch.iinfo(dst)
        return b.min <= a.min and a.max <= b.max
    return False


_SMALL_INTS = frozenset({torch.int8, torch.uint8, torch.int16})


def prep(x, plan: Plan):
    """A kernel operand: a contiguous neuron tensor converted to the promoted dtype where torch converts it
    (0-d CPU tensors uploaded, int64/float64 operands cast); Python ints become floats when the computation
    is in a float although the promotion says int64."""
    if isinstance(x, torch.Tensor) and x.dtype is plan.cast and not x.is_cpu and x.is_contiguous():
        return x  # the common case, decided first
    raw = x.__class__ is Raw
    if raw:
        x = x.t
    if not isinstance(x, torch.Tensor):
        return float(x) if plan.R is not plan.cast and isinstance(x, int) and not isinstance(x, bool) else x
    want = plan.cast
    if x.dtype in _WIDE_INTS and plan.dtype in FLOATS and want not in FLOATS:
        want = plan.dtype  # an int-to-float op (true division of int8 by an int64 0-d): converted to the float, not
        # wrapped into the integer promotion first, as TensorIterator's promote_integer_inputs_to_float does
    if raw:
        want = x.dtype if x.dtype in COMPUTE else torch.float32 if want in FLOATS else want
    if x.dtype is not want and not _exact_in(x.dtype, want):
        x = x.to(device=plan.device, dtype=want)
    elif x.device.type != "neuron":
        x = x.to(plan.device)
    return x if x.is_contiguous() else x.contiguous()


def scalar_to(v, dtype: torch.dtype):
    """A Python scalar as torch's TensorIterator converts it to the promoted dtype before computing: ints
    wrapped into an integral dtype, floats rounded to bfloat16/float16 (float32: the kernel's FP32 immediate)."""
    if v.__class__ is int and dtype in INTS:
        info = torch.iinfo(dtype)
        return (v - info.min) % (info.max - info.min + 1) + info.min
    if v.__class__ is float and dtype in _REDUCED:
        return torch.tensor(v, dtype=dtype).item()
    return v


_REDUCED = frozenset({torch.bfloat16, torch.float16})


VOLATILE_AFTER = 4


def dynamic(plan: Plan, slot: str, value, dtype: torch.dtype):
    """A float scalar argument as a kernel constant while this signature has seen at most ``VOLATILE_AFTER``
    of its values, then as a 0-d neuron tensor of ``dtype`` (a learning rate, a bias correction, ...): one
    program then serves every value, instead of a trace per value and an ever growing program cache."""
    seen = plan.seen.setdefault(slot, set())
    if len(seen) <= VOLATILE_AFTER:
        seen.add(_key_part(value))
        if len(seen) <= VOLATILE_AFTER:
            return value
    return torch.tensor(value, dtype=dtype).to(plan.device)


def launch(name: str, kernel, operands, consts, outs=None, plan: Plan | None = None) -> list[torch.Tensor]:
    """Run the kernel; the prepared launch is remembered in ``plan`` per kernel and constants (the operand
    shapes and dtypes are the plan's)."""
    try:
        if plan is None:
            return execute(name, prepared(kernel, operands, consts), operands, consts, outs)
        key = (kernel, *[_key_part(x) for x in operands if x.__class__ is not torch.Tensor],
               *[(k, _key_part(v)) for k, v in consts.items()])
        return execute(name, remembered(plan.launches, key, kernel, operands, consts), operands, consts, outs)
    except OverflowError as e:  # a scalar that does not fit the result dtype: torch's error
        raise RuntimeError(f"value cannot be converted to the result type without overflow ({e})") from None
    except KernelError as e:
        raise RuntimeError(str(e)) from None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses of a view with non-negative strides."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    return start, start + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def check_overlap(target: torch.Tensor, operands) -> None:
    """torch's error for an input that partially overlaps the written-to tensor (both dense: the same
    memory in another layout); identical views are fine, undecidable (strided) cases are left to
    ``_separate``."""
    t0, t1 = _span(target)
    for x in operands:
        if x.__class__ is Raw:
            x = x.t
        if not isinstance(x, torch.Tensor) or x is target or not x.numel() or x.device != target.device:
            continue
        x0, x1 = _span(x)
        if x0 < t1 and t0 < x1 and not (x0 == t0 and x.shape == target.shape and x.stride() == target.stride()) \
                and is_non_overlapping_and_dense(x) and is_non_overlapping_and_dense(target):
            raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                               "refer to a single memory location. Please clone() the tensor before performing the "
                               "operation.")


def is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Its elements fill its span exactly (contiguous up to a permutation of the dims)."""
    return t.is_contiguous() or (_span(t)[1] - _span(t)[0] == t.numel() * t.element_size()
                                 and torch._debug_has_internal_overlap(t) == 0)


def _separate(target: torch.Tensor, operands) -> list:
    """Prepared operands that still share memory with ``target`` other than as the identical view are
    cloned (an elementwise kernel may read and write the same elements, not shifted ones)."""
    t0, t1 = _span(target)
    out = []
    for x in operands:
        if isinstance(x, torch.Tensor) and x.numel():
            x0, x1 = _span(x)
            if x0 < t1 and t0 < x1 and not (x0 == t0 and x.shape == target.shape and x.dtype == target.dtype):
                x = x.clone()
        out.append(x)
    return out


# -- the three variants --------------------------------------------------------------------------------
def functional(entry: Entry, args, kwargs):
    plan = plan_of(entry, args, kwargs)
    if plan.cpu:
        if plan.wide is not None:
            return plan.wide(entry, plan, args, kwargs, None)
        return on_cpu(entry.overload, *args, **kwargs)
    if plan.numel == 0:
        return torch.empty(plan.shape, dtype=plan.dtype, device=plan.device)
    call = entry.adapter(plan, *args, **kwargs)
    if call is None:
        return on_cpu(entry.overload, *args, **kwargs)
    kernel, operands, consts = call
    return launch(entry.name, kernel, [prep(x, plan) for x in operands], consts, plan=plan)[0]


def _into(entry: Entry, plan: Plan, target: torch.Tensor, args, kwargs) -> bool:
    """Compute into ``target`` (a tensor of the result's shape); False when this call must go to the CPU."""
    check_cast(plan.dtype, target)
    if plan.numel == 0:
        return True
    call = entry.adapter(plan, *args, **kwargs)
    if call is None:
        return False
    kernel, operands, consts = call
    check_overlap(target, operands)
    operands = [prep(x, plan) for x in operands]
    if target.is_contiguous() and target.dtype == plan.dtype:
        launch(entry.name, kernel, _separate(target, operands), consts, outs=[target], plan=plan)
    else:
        if torch._debug_has_internal_overlap(target) == 1:
            raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                               "single memory location. Please clone() the tensor before performing the operation.")
        target.copy_(launch(entry.name, kernel, operands, consts, plan=plan)[0])
    return True


def inplace(entry: Entry, args, kwargs):
    plan = plan_of(entry, args, kwargs)
    if plan.cpu and plan.wide is not None:
        return plan.wide(entry, plan, args, kwargs, args[0])
    if plan.cpu or not _into(entry, plan, args[0], args, kwargs):
        return on_cpu(entry.overload, *args, **kwargs)
    return args[0]


def out_variant(entry: Entry, args, kwargs):
    plan = plan_of(entry, args, kwargs)
    out = kwargs[entry.out_arg]
    if plan.cpu:
        if plan.wide is not None:
            return plan.wide(entry, plan, args, kwargs, out)
        return on_cpu(entry.overload, *args, **kwargs)
    fkwargs = {k: v for k, v in kwargs.items() if k != entry.out_arg}
    resize_out(out, plan.shape, (*args, *fkwargs.values()))
    if not _into(entry, plan, out, args, fkwargs):
        return on_cpu(entry.overload, *args, **kwargs)
    return out


# -- registration ----------------------------------------------------------------------------------------
def _overload(name: str):
    base, _, over = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), over or "default")


def _functional_of(overload):
    """The functional overload with the same arguments as an in-place or out= overload."""
    schema = overload._schema
    names = [(a.name, str(a.type)) for a in schema.arguments
             if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)]
    base = schema.name.removeprefix("aten::")
    if base.startswith("__i"):  # __ilshift__ -> __lshift__
        base = f"__{base[3:]}"
    elif not base.startswith("__"):
        base = base.removesuffix("_")
    packet = getattr(torch.ops.aten, base)
    for over in packet.overloads():
        op = getattr(packet, over)
        args = op._schema.arguments
        if [(a.name, str(a.type)) for a in args] == names and not any(a.alias_info is not None and a.alias_info.is_write
                                                      for a in args):
            return op
    raise LookupError(f"no functional overload of {schema.name} takes {names}")


def pointwise(name: str, functional_names=(), inplace_names=(), out_names=(), promoted=(0, 1), supports=None):
    """Register ``adapter(plan, *args, **kwargs) -> (kernel, operands, constants) | None`` as the neuron
    kernel of the given aten overloads (functional, in-place, out=). ``name`` is the metrics name."""

    def register(adapter):
        variants = ((functional_names, functional), (inplace_names, inplace), (out_names, out_variant))
        for names, runner in variants:
            for n in names:
                op = _overload(n)
                fn = op if runner is functional else _functional_of(op)
                entry = Entry(name, op, fn, adapter, promoted, supports)
                impl(n.removesuffix(".default"))(_bind(runner, entry))
        return adapter

    return register


def _bind(runner, entry: Entry):
    def kernel(*args, **kwargs):
        return runner(entry, args, kwargs)

    kernel.__name__ = f"{entry.name}_{runner.__name__}"
    return kernel
