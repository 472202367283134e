"""OpInfo ``op_db`` (float32 and bfloat16 samples) on neuron against the CPU, one test per (dtype, op).

See ``torch_neuron_testing`` for how samples are built and compared, ``settings`` for subsampling and
``opinfo_exclusions.toml`` for the known failures. The run ends with a summary line per dtype: ops passing
all their samples, and ops that ran natively (no CPU fallback during the op call).
"""

import pytest
import torch
from torch_neuron_testing import opinfo, report, settings

CASES = [pytest.param(dname, op, id=report.param_id(dname, opinfo.op_key(op)))
         for dname, dtype in opinfo.DTYPES.items() for op in opinfo.ops_for(dtype)]


@pytest.mark.parametrize("dname, op", CASES)
def test_op_db(dname, op, record_property):
    first = settings.samples_per_op()
    report.run_entry(record_property, f"op_db.{dname}", opinfo.op_key(op),
                     lambda extra: opinfo.run_op(op, opinfo.DTYPES[dname], first, extra))


# -- the harness itself: it must see wrong values, randomness and fallbacks -----------------------------------
def _variant(name: str, fn):
    import copy

    op = copy.copy(next(o for o in opinfo.ops_for(opinfo.DTYPES["float32"]) if o.name == name))
    op.op = fn
    return op


def test_harness_fails_an_op_that_is_wrong_on_neuron():
    op = _variant("abs", lambda x: x.abs() + (1e-3 if x.device.type == "neuron" else 0.0))
    out = opinfo.run_op(op, opinfo.DTYPES["float32"], first=2)
    assert out.status == "fail" and out.sample == 0 and "not close" in out.reason


def test_harness_accepts_bf16_rounded_once_and_says_so():
    def op_fn(x):  # the CPU rounds x + 100 to bf16 (steps of 0.5 there); computed in float32 it is exact
        if x.device.type == "neuron":
            return ((x.float() + 100) - 100).to(x.dtype)
        return (x + 100) - 100

    out = opinfo.run_op(_variant("abs", op_fn), opinfo.DTYPES["bfloat16"], first=2)
    assert out.status == "pass" and out.reason.startswith(opinfo.ROUNDED_ONCE)


def test_harness_fails_a_bf16_result_off_from_both_references():
    def op_fn(x):
        return (x.float() + (0.5 if x.device.type == "neuron" else 0.0)).to(x.dtype)

    out = opinfo.run_op(_variant("abs", op_fn), opinfo.DTYPES["bfloat16"], first=2)
    assert out.status == "fail" and "not close" in out.reason


def test_harness_sees_wrong_in_place_effects_on_the_inputs():
    def op_fn(x):
        result = x.abs()
        if x.device.type == "neuron":
            x.add_(1)
        return result

    out = opinfo.run_op(_variant("abs", op_fn), opinfo.DTYPES["float32"], first=1)
    assert out.status == "fail" and "inputs after the call" in out.reason


def test_harness_skips_random_outputs_with_a_reason():
    op = _variant("abs", lambda x: x + torch.rand(x.shape, dtype=x.dtype).to(x.device))
    out = opinfo.run_op(op, opinfo.DTYPES["float32"], first=2)
    assert out.status == "skip" and "random" in out.reason


def test_harness_skips_ops_that_seed_their_own_randomness():
    randn = next(o for o in opinfo.ops_for(opinfo.DTYPES["float32"]) if o.name == "randn")  # wrapper_set_seed
    out = opinfo.run_op(randn, opinfo.DTYPES["float32"], first=1)
    assert out.status == "skip" and "random" in out.reason


def test_harness_runs_device_less_factory_samples_on_neuron():
    arange = _variant("arange", lambda *a, **k: torch.arange(*a, **k).device.type)
    f32 = opinfo.DTYPES["float32"]
    plain = next(i for i, s, _ in opinfo.samples(arange, f32, None) if not s.kwargs and not s.args)  # arange(n)
    out = opinfo.run_op(arange, f32, first=0, extra=(plain,))
    assert out.status == "fail" and "neuron gave 'neuron', the CPU 'cpu'" in out.reason


def test_harness_counts_cpu_fallbacks():
    op = _variant("abs", lambda x: x.double().sin().float())  # float64 math always takes the CPU fallback
    out = opinfo.run_op(op, opinfo.DTYPES["float32"], first=2)
    assert out.status == "pass" and not out.native and any("sin" in f for f in out.fallbacks)
