"""OpInfo ``op_db`` on neuron against the CPU, sample by sample, as PyTorch's ``TestCommon.test_compare_cpu``.

Per (op, dtype): samples are built on the CPU from a fixed seed (``op.sample_inputs("cpu", dtype)``), the
op's function variant runs on a neuron copy and on the CPU sample, and the outputs (after the sample's
``output_process_fn_grad``) and the inputs afterwards (in-place effects) must match. Tolerances: float32
uses test_compare_cpu's ``atol=rtol=1e-4``; bfloat16 uses ``torch.testing.assert_close``'s defaults (PyTorch's
device tests do not compare bf16 against the CPU); both are raised, never lowered, by the OpInfo's own
``toleranceOverride`` / ``precisionOverride`` for this test, as the device-type machinery does. Integer and
bool results must be equal. A bfloat16 result that is off from the CPU's is checked once more, with the
same tolerances, against the op computed in float32 on the CPU and rounded to bfloat16: aten's CPU kernels
round some bf16 ops at every step where neuron computes in float32 and rounds once (exactly what that
reference gives); such entries pass with a reason saying so (see ``ROUNDED_ONCE``).

Subsampling: ``samples`` limits each op to its first N samples (stable, since generation is seeded) plus
the sample an exclusion recorded as failing, so a known failure is always re-checked.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import freeze_rng_state
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils import _pytree as pytree

from . import transfer as tr
from .outcome import RANDOM, SEED, Outcome, describe, last_needed, pick, seed
from .policy import Policy, policy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# test_compare_cpu: self.assertEqual(device_results, cpu_results, atol=1e-4, rtol=1e-4)
BASE_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1.6e-2, 1e-5)}  # (rtol, atol)


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def ops_for(dtype: torch.dtype) -> list:
    """The op_db entries that support ``dtype`` on the CPU (the reference), in op_db order."""
    return [op for op in op_db if dtype in op.supported_dtypes("cpu")]


def op_policy(op, dtype: torch.dtype) -> Policy:
    """Skips and tolerances the OpInfo declares for ``TestCommon.test_compare_cpu`` on this device/dtype."""
    return policy(op.decorators, "TestCommon", "test_compare_cpu", dtype, *BASE_TOL[dtype])


def _generate(op, device: str, dtype, last: int | None) -> list:
    seed()
    gen = op.sample_inputs(device, dtype)
    return list(gen if last is None else itertools.islice(gen, last + 1))


def _placements(op, dtype, last, count: int) -> list:
    """The samples built for the meta device: where a tensor stays on the CPU, the op wants it there.
    Built only when they line up with the CPU samples (some generators need real data)."""
    try:
        metas = _generate(op, "meta", dtype, last)
    except Exception:
        return [None] * count
    return metas if len(metas) == count else [None] * count


def samples(op, dtype, first: int | None, extra=()):
    """(index, sample, placement) for the first ``first`` samples (all if None) and the indices in ``extra``."""
    last = last_needed(first, extra)
    cpu = _generate(op, "cpu", dtype, last)
    places = _placements(op, dtype, last, len(cpu))
    for i in pick(len(cpu), first, extra):
        yield i, cpu[i], places[i]


def _call(op, s):
    try:
        return op(s.input, *s.args, **s.kwargs), None
    except Exception as e:  # compared with the other device's behaviour below
        return None, e


def neuron_sample(s: SampleInput, placement: SampleInput | None) -> SampleInput:
    place = (placement.input, placement.args, placement.kwargs) if placement is not None else None
    tree = tr.to_neuron((s.input, s.args, s.kwargs), place)
    return SampleInput(tree[0], args=tree[1], kwargs=tree[2], output_process_fn_grad=s.output_process_fn_grad,
                       broadcasts_input=s.broadcasts_input, name=s.name)


@contextlib.contextmanager
def _other_seed(op):
    """Run under another seed: the global one, and the fixed one OpInfo wrappers of random ops set
    (``wrapper_set_seed`` seeds 42 inside the op; it is looked up in the wrapper's module globals)."""
    names = getattr(getattr(op.op, "__code__", None), "co_names", ())
    scope = op.op.__globals__ if "wrapper_set_seed" in names else {}
    original = scope.get("wrapper_set_seed")

    def reseeded(fn, *args, **kwargs):
        with freeze_rng_state():
            torch.manual_seed(SEED + 1)
            return fn(*args, **kwargs)

    seed(SEED + 1)
    if original is not None:
        scope["wrapper_set_seed"] = reseeded
    try:
        yield
    finally:
        if original is not None:
            scope["wrapper_set_seed"] = original


def _random(op, spare: SampleInput, cpu_out) -> bool:
    """Does the CPU give other values under another seed? (dropout, sampling, factory ops): then values
    are not comparable across devices (the device's RNG streams are not the CPU's), as PyTorch's
    test_ops skips such ops."""
    with _other_seed(op):
        again, err = _call(op, spare)
    return err is None and not tr.identical(again, cpu_out)


ROUNDED_ONCE = "matched the float32 computation rounded once (not the CPU's per-step bf16 rounding) in samples"
_REDUCED = (torch.bfloat16, torch.float16)


def _rounded_once(op, sample, dtype):
    """(outputs, inputs after the call) of ``op`` on float32 copies of the sample's ``dtype`` tensors, on
    the CPU, rounded back to ``dtype``; None when the op does not run that way."""
    def up(v):
        return v.float() if isinstance(v, torch.Tensor) and v.dtype == dtype else v

    def down(v):
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v

    wide = pytree.tree_map(up, tr.clone_cpu((sample.input, sample.args, sample.kwargs)))
    s = SampleInput(wide[0], args=wide[1], kwargs=wide[2])
    seed()
    out, err = _call(op, s)
    if err is not None:
        return None
    return pytree.tree_map(down, sample.output_process_fn_grad(out)), pytree.tree_map(down, wide)


def _compare(op, sample, dev, dev_out, cpu_out, pol: Policy, dtype) -> bool:
    """Outputs and inputs-after-call against the CPU; for bf16, else against the float32 result rounded once.
    Returns whether the rounded-once reference was needed."""
    dev_out, cpu_out = sample.output_process_fn_grad(dev_out), sample.output_process_fn_grad(cpu_out)
    dev_in, cpu_in = (dev.input, dev.args, dev.kwargs), (sample.input, sample.args, sample.kwargs)
    try:
        tr.assert_matches(dev_out, cpu_out, pol.rtol, pol.atol)
        tr.assert_matches(dev_in, cpu_in, pol.rtol, pol.atol, what="inputs after the call", inputs=True)
        return False
    except AssertionError:
        ref = _rounded_once(op, sample, dtype) if dtype in _REDUCED else None
        if ref is None:
            raise
    try:
        tr.assert_matches(dev_out, ref[0], pol.rtol, pol.atol)
        tr.assert_matches(dev_in, ref[1], pol.rtol, pol.atol, what="inputs after the call", inputs=True)
    except AssertionError:  # report the difference from the CPU, the primary reference
        tr.assert_matches(dev_out, cpu_out, pol.rtol, pol.atol)
        tr.assert_matches(dev_in, cpu_in, pol.rtol, pol.atol, what="inputs after the call", inputs=True)
    return True


def run_sample(op, sample, placement, pol: Policy, dtype=None) -> tuple[set[str], bool, bool]:
    """Run one sample on neuron and on the CPU and compare; returns (ops that fell back, random outputs,
    matched only the float32 result rounded once)."""
    dev = neuron_sample(sample, placement)
    c = tr.clone_cpu((sample.input, sample.args, sample.kwargs))
    spare = SampleInput(c[0], args=c[1], kwargs=c[2])
    # a sample that names no device (torch.arange(2)) runs with neuron as the default device
    where = contextlib.nullcontext() if tr.mentions_neuron((dev.input, dev.args, dev.kwargs)) else tr.NEURON
    seed()
    before = tr.fallback_counts()
    with where:
        dev_out, dev_err = _call(op, dev)
    fell_back = tr.fallback_delta(before)
    seed()
    cpu_out, cpu_err = _call(op, sample)
    if cpu_err is not None:
        if dev_err is None or type(dev_err) is not type(cpu_err):
            raise AssertionError(f"the CPU raised {type(cpu_err).__name__}: {cpu_err}; neuron "
                                 f"{'raised ' + type(dev_err).__name__ if dev_err else 'did not'}")
        return fell_back, False, False
    if dev_err is not None:
        raise dev_err
    if pol.skip or _random(op, spare, cpu_out):
        tr.assert_same_metadata(dev_out, cpu_out)
        return fell_back, not pol.skip, False
    return fell_back, False, _compare(op, sample, dev, dev_out, cpu_out, pol, dtype)


def run_op(op, dtype: torch.dtype, first: int | None = None, extra=()) -> Outcome:
    """Run ``op``'s samples (subsampled as in :func:`samples`); stops at the first failing sample."""
    key, pol, t0 = op_key(op), op_policy(op, dtype), time.perf_counter()
    out = Outcome(key, "skip" if pol.skip else "pass", pol.skip or "")
    rounded = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, s, place in samples(op, dtype, first, extra):
            out.samples += 1
            try:
                fell_back, random_out, once = run_sample(op, s, place, pol, dtype)
            except Exception as e:
                out.status, out.sample, out.reason = "fail", i, describe(e)
                break
            out.fallbacks |= fell_back
            rounded += [i] if once else []
            if random_out:  # the op's outputs are random: the remaining samples check metadata only
                out.status, out.reason = "skip", RANDOM
                pol = Policy(RANDOM, pol.rtol, pol.atol)
    if rounded and out.status == "pass":
        out.reason = f"{ROUNDED_ONCE} {rounded}"
    out.seconds = time.perf_counter() - t0
    return out
