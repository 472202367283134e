"""One fuzz case on neuron and on the CPU, and the verdict.

Results are compared with the output dtype's tolerance (integers and bools exactly). When they disagree, the
op computed in float64 on the CPU (from dense copies of the inputs, so a layout-dependent CPU path cannot bias
it; integer inputs stay integers, exact on the CPU, so there only the layout can make a difference) is the
arbiter: the device passes if it is within tolerance of
float64 wherever it disagrees with the CPU, or nearer to it than the CPU there; the case is then recorded as
"CPU wrong" when the CPU is out of tolerance of float64, "arbitrated" when both are within it, "nearer" when
both are out of it (float64 may then be computing another function: a clamp, an overflow float32 hits and
float64 does not) and the device is the nearer.

Errors: an exception both raise with the same type passes; the device raising where the CPU does not, a
different type, or an error from the project's own packages (KernelError, HAL errors) or an internal
Python error (NotImplementedError, AssertionError, ...) is a failure. One exception: an in-place op whose
written tensor overlaps itself, where the CPU writes an order-dependent result PyTorch calls undefined, passes
when the device raises torch's internal-overlap error instead.
"""

from __future__ import annotations

import contextlib
import math
import traceback
import warnings
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from .. import transfer as tr
from .spec import Case, T

SEED = 0
OWN_PACKAGES = ("neuron_hal", "neuron_sim", "neuron_kernels", "torch_neuron")
INTERNAL_TYPES = (NotImplementedError, AssertionError, KeyError, AttributeError, ZeroDivisionError, NameError,
                  UnboundLocalError, RecursionError, OverflowError)

# (rtol, atol) per result dtype: float32 as PyTorch's test_compare_cpu, 16-bit floats a few units of their
# last place (the device computes in float32 and rounds once; the CPU may round at every step)
TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-5),
             torch.float16: (2e-3, 1e-5), torch.complex64: (1e-4, 1e-5), torch.complex128: (1e-7, 1e-7)}


@dataclass
class Verdict:
    status: str  # pass | arbitrated | cpu_wrong | nearer | fail | skip (values not comparable)
    kind: str = ""  # for failures: mismatch, internal, device_error, error_mismatch, accepted
    detail: str = ""
    fallbacks: frozenset = frozenset()

    @property
    def failed(self) -> bool:
        return self.status == "fail"


class Mismatch(AssertionError):
    pass


def _call(fn, tensors, params):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*tensors, **params), None
    except Exception as e:  # judged against the other device's behaviour
        return None, e


def is_internal(e: BaseException) -> bool:
    module = type(e).__module__.split(".")[0]
    return module in OWN_PACKAGES or isinstance(e, INTERNAL_TYPES)


def where_raised(e: BaseException) -> str:
    """The innermost frame of the project's own code the error passed through (file:line function)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if any(p in f.filename for p in OWN_PACKAGES)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.rsplit('/src/', 1)[-1]}:{f.lineno} {f.name}"


def describe(e: BaseException, limit: int = 240) -> str:
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def device_inputs(case: Case, cpu_inputs: list) -> list:
    """The inputs on neuron, each tensor the same view of a copy of its storage (aliasing kept), sample
    trees moved leaf by leaf; tensors marked ``cpu`` stay on the CPU."""
    memo: dict = {}
    return [t if isinstance(spec, T) and spec.cpu else tr.to_neuron(t, _placement(spec), memo=memo)
            for spec, t in zip(case.tensors, cpu_inputs)]


def _placement(spec):
    """The input built for the meta device, where a spec can give one: a tensor still on the CPU there is one
    the op wants on the CPU (tensor_split's indices)."""
    return spec.placement() if hasattr(spec, "placement") else None


def _to_cpu(tree):
    return pytree.tree_map(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, tree)


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def _errors(a: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float, scale=None) -> torch.Tensor:
    """Per element, |a - ref| in units of the tolerance (0 where both are the same non-finite value, inf where
    only one is non-finite); a complex element's error is its larger part's."""
    if a.is_complex() or ref.is_complex():
        a, ref = a.to(torch.complex128), ref.to(torch.complex128)
        return _errors(_real(a), _real(ref), rtol, atol, scale).amax(-1) if a.numel() else a.real.double()
    a, ref = a.double(), ref.double()
    mag = ref.abs()
    if scale is not None:
        s = _real(scale).double().abs()
        # |z| bounds both parts of z; a NaN scale (NaN inputs) leaves |ref|
        mag = torch.fmax(mag, s.unsqueeze(-1) if s.dim() < mag.dim() else s)
    with torch.no_grad():
        err = (a - ref).abs() / (atol + rtol * mag)
    same = (a == ref) | (a.isnan() & ref.isnan())
    err = torch.where(same, torch.zeros_like(err), err)
    return torch.where(err.isnan(), torch.full_like(err, math.inf), err)


def _leaves(tree) -> list:
    return pytree.tree_flatten(tree)[0]


def _structure(dev, cpu, where: str) -> None:
    d_leaves, d_spec = pytree.tree_flatten(dev)
    c_leaves, c_spec = pytree.tree_flatten(cpu)
    if d_spec != c_spec:
        raise Mismatch(f"{where}: neuron returned structure {d_spec}, the CPU {c_spec}")
    for i, (d, c) in enumerate(zip(d_leaves, c_leaves)):
        if isinstance(c, torch.Tensor):
            if not isinstance(d, torch.Tensor):
                raise Mismatch(f"{where}[{i}]: neuron returned {type(d).__name__}, the CPU a tensor")
            if (d.dtype, tuple(d.shape)) != (c.dtype, tuple(c.shape)):
                raise Mismatch(f"{where}[{i}]: neuron gave {d.dtype} {tuple(d.shape)}, "
                               f"the CPU {c.dtype} {tuple(c.shape)}")
        elif type(d) is not type(c) or (not isinstance(c, float) and d != c):
            raise Mismatch(f"{where}[{i}]: neuron gave {d!r}, the CPU {c!r}")


def _tol(dtype: torch.dtype, factor: float) -> tuple[float, float]:
    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    return rtol * factor, atol * factor


def _leaf_errors(d, c, factor: float, scale) -> torch.Tensor | None:
    """Per-element errors of d against c (None: not a floating leaf, compare exactly)."""
    if isinstance(c, torch.Tensor) and (c.dtype.is_floating_point or c.dtype.is_complex):
        return _errors(d, c, *_tol(c.dtype, factor), scale)
    if isinstance(c, float):
        return _errors(torch.tensor(float(d)), torch.tensor(c), *_tol(torch.float32, factor), None)
    return None


def _exact_equal(d, c) -> bool:
    if isinstance(c, torch.Tensor):
        return c.numel() == 0 or bool(torch.equal(d, c))
    return d == c


def mismatched(dev, cpu, factor: float = 1.0, scales=None) -> list:
    """Per leaf: a bool mask of the elements that disagree (True for a whole non-floating leaf), or None."""
    scales = scales if scales is not None else [None] * len(_leaves(cpu))
    out = []
    for d, c, s in zip(_leaves(dev), _leaves(cpu), scales):
        err = _leaf_errors(d, c, factor, s)
        if err is None:
            out.append(None if _exact_equal(d, c) else True)
        else:
            bad = err > 1
            out.append(bad if bool(bad.any()) else None)
    return out


def _first_bad(d, c, mask) -> str:
    if mask is True:
        if isinstance(c, torch.Tensor) and c.numel():
            idx = (d != c).nonzero()
            at = tuple(idx[0].tolist()) if len(idx) else ()
            return f"at {at}: neuron {d[at].item()!r}, CPU {c[at].item()!r} ({int((d != c).sum())} differ)"
        return f"neuron {d!r}, CPU {c!r}"
    at = tuple(mask.nonzero()[0].tolist())
    return f"at {at}: neuron {d[at].item()!r}, CPU {c[at].item()!r} ({int(mask.sum())}/{mask.numel()} differ)"


def explain(dev, cpu, masks) -> str:
    for i, (d, c, m) in enumerate(zip(_leaves(dev), _leaves(cpu), masks)):
        if m is not None:
            return f"output[{i}] {_first_bad(d, c, m)}"
    return ""


def _dense64(inputs: list) -> list:
    """Dense float64 (complex128) copies of the floating tensors of ``inputs``, the others dense copies."""
    def up(t):
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach().contiguous().clone()
        if t.is_complex():
            return t.to(torch.complex128)
        return t.double() if t.dtype.is_floating_point else t

    return pytree.tree_map(up, inputs)


def _is_float(t) -> bool:
    return isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex)


def _leaf_vs_ref(a, r, factor: float, scale) -> torch.Tensor:
    """Per-element error of a result leaf against the float64 reference (exact leaves: 0 or inf)."""
    if _is_float(a):
        return _errors(a, r, *_tol(a.dtype, factor), scale)
    equal = a.double() == r.double()
    return torch.where(equal, torch.zeros(a.shape, dtype=torch.float64), torch.full(a.shape, math.inf))


def arbitrate(dev, cpu, ref64, masks, factor: float, scales) -> str | None:
    """How float64 judges the elements where the device and the CPU disagree: 'arbitrated' (both within
    tolerance of it), 'cpu_wrong' (the device within tolerance, the CPU not), 'nearer' (both out of
    tolerance, the device nearer everywhere), or None (the device is wrong)."""
    outcome = "arbitrated"
    for d, c, r, m, s in zip(_leaves(dev), _leaves(cpu), _leaves(ref64), masks, scales):
        if m is None:
            continue
        if not (isinstance(c, torch.Tensor) and isinstance(r, torch.Tensor)) or r.shape != c.shape:
            return None
        m = d != c if m is True else m
        e_dev, e_cpu = _leaf_vs_ref(d, r, factor, s)[m], _leaf_vs_ref(c, r, factor, s)[m]
        if not bool(((e_dev <= 1) | (e_dev < e_cpu)).all()):
            return None
        if bool((e_dev > 1).any()):
            outcome = "nearer"
        elif bool((e_cpu > 1).any()) and outcome == "arbitrated":
            outcome = "cpu_wrong"
    return outcome


def _fail(kind: str, detail: str, fallbacks=frozenset()) -> Verdict:
    return Verdict("fail", kind, detail, fallbacks)


def _own(e: BaseException) -> bool:
    return type(e).__module__.split(".")[0] in OWN_PACKAGES


def _located(e: BaseException) -> str:
    at = where_raised(e)
    return describe(e) + (f" [{at}]" if at else "")


def _judge_errors(dev_err, cpu_err, fallbacks) -> Verdict | None:
    """The verdict when either side raised (None: neither did)."""
    if dev_err is None and cpu_err is None:
        return None
    if dev_err is not None and cpu_err is not None and type(dev_err) is type(cpu_err) and not _own(dev_err):
        return Verdict("pass", detail="both raised " + type(cpu_err).__name__, fallbacks=fallbacks)
    if dev_err is not None and is_internal(dev_err):
        return _fail("internal", _located(dev_err), fallbacks)
    if dev_err is None:
        return _fail("accepted", f"the CPU raised {describe(cpu_err)}; neuron did not", fallbacks)
    if cpu_err is None:
        return _fail("device_error", _located(dev_err), fallbacks)
    return _fail("error_mismatch", f"neuron raised {_located(dev_err)}; the CPU {describe(cpu_err)}", fallbacks)


def run(op, case: Case) -> Verdict:
    """Run ``case`` through ``op`` (a :class:`~.ops.Op`) on neuron and on the CPU; the verdict."""
    cpu_tensors, params = case.build()
    dev_tensors = device_inputs(case, cpu_tensors)
    cpu_in = tr.clone_cpu(cpu_tensors)
    before = tr.fallback_counts()
    torch.manual_seed(SEED)
    with contextlib.nullcontext() if tr.mentions_neuron(dev_tensors) else tr.NEURON:  # factories: on neuron
        dev_out, dev_err = _call(op.fn, dev_tensors, params)
    fallbacks = frozenset(tr.fallback_delta(before))
    torch.manual_seed(SEED)
    cpu_out, cpu_err = _call(op.fn, cpu_in, params)
    if op.inplace and dev_err is not None and cpu_err is None and _writes_twice(cpu_tensors[0]) \
            and isinstance(dev_err, RuntimeError) and "more than one element of the written-to" in str(dev_err):
        return Verdict("pass", detail="the written tensor overlaps itself: PyTorch leaves the result undefined (the "
                       "CPU's depends on its loop order); neuron raises torch's internal-overlap error",
                       fallbacks=fallbacks)
    judged = _judge_errors(dev_err, cpu_err, fallbacks)
    if judged is not None:
        return judged
    dev_res, cpu_res = (dev_out, dev_tensors), (cpu_out, cpu_in)
    if not op.inplace:
        dev_res, cpu_res = dev_out, cpu_out
    try:
        _check_devices(dev_out, cpu_out)
        dev_c, cpu_c = _to_cpu(dev_res), _to_cpu(cpu_res)  # both rebuilt alike (a torch.Size becomes a tuple)
        if op.post is not None:
            dev_c, cpu_c = op.post(dev_c, cpu_tensors, params), op.post(cpu_c, cpu_tensors, params)
        _structure(dev_c, cpu_c, "output")
    except Mismatch as e:
        return _fail("mismatch", str(e), fallbacks)
    return _judge_values(op, case, cpu_tensors, params, dev_c, cpu_c, fallbacks)


def _writes_twice(t) -> bool:
    """Some two elements of the view share storage (from the addresses of a numbered copy of the storage)."""
    if not isinstance(t, torch.Tensor) or t.numel() < 2:
        return False
    numbered = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    return torch.as_strided(numbered, t.shape, t.stride(), t.storage_offset()).unique().numel() < t.numel()


def _check_devices(dev, cpu) -> None:
    for i, (d, c) in enumerate(zip(_leaves(dev), _leaves(cpu))):
        if isinstance(d, torch.Tensor) and isinstance(c, torch.Tensor) and d.device.type != "neuron":
            raise Mismatch(f"output[{i}] is on {d.device}, not on the neuron device")


def _scales(op, cpu_tensors, params, cpu_c):
    if op.scale is None:
        return [None] * len(_leaves(cpu_c))
    s, err = _call(op.scale, _dense64(cpu_tensors), params)
    if err is not None:
        return [None] * len(_leaves(cpu_c))
    leaves = _leaves(s)
    return leaves if len(leaves) == len(_leaves(cpu_c)) else [None] * len(_leaves(cpu_c))


def _judge_values(op, case, cpu_tensors, params, dev_c, cpu_c, fallbacks) -> Verdict:
    scales = _scales(op, cpu_tensors, params, cpu_c)
    masks = mismatched(dev_c, cpu_c, op.tol, scales)
    if all(m is None for m in masks):
        return Verdict("pass", fallbacks=fallbacks)
    what = explain(dev_c, cpu_c, masks)
    if op.random and _seed_dependent(op, cpu_tensors, params, cpu_c):
        return Verdict("skip", detail="the CPU's own results depend on the seed: values not comparable",
                       fallbacks=fallbacks)
    if not op.arbiter:
        return _fail("mismatch", what, fallbacks)
    ins64 = _rounded_scalars(_dense64(cpu_tensors), cpu_tensors)
    ref, err = _call(op.reference or op.fn, ins64, params)
    if err is not None:
        return _fail("mismatch", what + f" (float64 arbiter raised {describe(err)})", fallbacks)
    ref = (ref, ins64) if op.inplace else ref
    ref = op.post(ref, ins64, params) if op.post is not None else ref
    if len(_leaves(ref)) != len(masks):
        return _fail("mismatch", what, fallbacks)
    status = arbitrate(dev_c, cpu_c, ref, masks, op.tol, scales)
    if status is None:
        return _fail("mismatch", what + _reference_note(ref, masks), fallbacks)
    return Verdict(status, detail=what + _reference_note(ref, masks), fallbacks=fallbacks)


def _rounded_scalars(ins64: list, inputs: list) -> list:
    """Python float operands rounded to the dtype the op computes them in (a wrapped scalar takes the
    tensor's dtype: 1e-45 next to a float16 tensor is 0 there, in float64 too)."""
    first = next((t for t in inputs if isinstance(t, torch.Tensor)), None)
    if first is None:
        return ins64

    def rounded(v):
        dt = torch.result_type(first, v)
        return float(torch.tensor(v, dtype=dt)) if dt.is_floating_point else v
    return [rounded(v) if isinstance(v, float) else v for v in ins64]


def _seed_dependent(op, cpu_tensors, params, cpu_c) -> bool:
    with op.reseed() if op.reseed is not None else _seeded(SEED + 1):
        again, err = _call(op.fn, tr.clone_cpu(cpu_tensors), params)
    again = _to_cpu(again)
    if err is None and op.post is not None:
        again = op.post(again, cpu_tensors, params)
    return err is None and not tr.identical(again, cpu_c)


@contextlib.contextmanager
def _seeded(value: int):
    torch.manual_seed(value)
    yield


def _reference_note(ref, masks) -> str:
    """The float64 value at the first disagreeing element."""
    for r, m in zip(_leaves(ref), masks):
        if m is None or not isinstance(r, torch.Tensor):
            continue
        m = m if m is not True else torch.ones(r.shape, dtype=torch.bool)
        if r.shape != m.shape or not bool(m.any()):
            return ""
        at = tuple(m.nonzero()[0].tolist())
        return f"; float64 {r[at].item()!r}"
    return ""
