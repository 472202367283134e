"""The fast profile of the differential fuzzer (torch_neuron_testing.fuzz): one hypothesis search per op
family against the CPU, float64 as the arbiter, with a fixed seed and a small budget of cases, so it runs
in ``nox -s test``; ``nox -s fuzz`` is the long profile. Cases of known, reported defects are not run
(``fuzz/known.py``). Then the harness itself: it must see wrong values, internal errors and errors the
device misses, accept a device the float64 result vindicates, and shrink a failure to a minimal case."""

import math

import pytest
import torch
from hypothesis import strategies as st
from torch_neuron_testing.fuzz import compare, runner
from torch_neuron_testing.fuzz.families import NAMES, family
from torch_neuron_testing.fuzz.op import Op
from torch_neuron_testing.fuzz.spec import Case, T
from torch_neuron_testing.fuzz.strategies import shapes, tensors

SEED = 18
CAP = 4096  # elements per tensor: > 128 partitions and free dims of thousands, at a few ms per case
EXAMPLES = {"op_db": 40, "sorting": 40, "attention": 60}  # sort is slow on the simulator (known)
DEFAULT_EXAMPLES = 80


@pytest.mark.parametrize("name", NAMES)
def test_fuzz_family_matches_cpu(name):
    stats = runner.Stats()
    found = runner.search(family(name), CAP, EXAMPLES.get(name, DEFAULT_EXAMPLES), SEED, stats, exclude=True,
                          shrink_seconds=20)
    assert found is None, (f"{found.op}: {found.verdict.kind}: {found.verdict.detail}\n"
                           f"minimal reproducer: {found.op}: {found.case!r}")


# -- the harness ------------------------------------------------------------------------------------------
def _on_neuron(x) -> bool:
    return x.device.type == "neuron"


def _unary(name, fn, dtype=torch.float32, **kw):
    case = st.builds(lambda t: Case((t,)), shapes(64).flatmap(lambda s: tensors(s, dtype, with_edges=False)))
    return Op(name, fn, lambda cap: case, **kw)


def _case(*values, dtype=torch.float32):
    fill = "const" if dtype.is_floating_point else "small"
    return Case((T((len(values),), dtype, fill=fill, edges=tuple(enumerate(values))),))


def test_harness_fails_a_wrong_value_with_its_place():
    op = _unary("off", lambda x: x + (1e-2 if _on_neuron(x) else 0.0))
    v = compare.run(op, _case(1.0, 2.0))
    assert v.failed and v.kind == "mismatch" and "at (0,)" in v.detail and "float64" in v.detail


def test_harness_accepts_a_device_nearer_to_float64_as_cpu_wrong():
    # the "CPU" rounds (1 + 1e-3) - 1 in float32 steps of bf16 size; the device computes it exactly
    def fn(x):
        if _on_neuron(x) or x.dtype == torch.float64:
            return x * 1e-3
        return ((1 + x * 1e-3).bfloat16().float() - 1)
    v = compare.run(Op("cancel", fn, None), _case(1.0, 3.0))
    assert v.status == "cpu_wrong", v


def test_harness_records_a_device_nearer_float64_when_both_are_off():
    def fn(x):  # float64 is exact; the CPU is off by 10%, the device by 5%
        return x * (1.0 if x.dtype == torch.float64 else 1.05 if _on_neuron(x) else 1.1)
    assert compare.run(Op("off", fn, None), _case(1.0, 3.0)).status == "nearer"


def test_harness_fails_a_device_farther_from_float64_than_the_cpu():
    def fn(x):
        return x * (1.01 if _on_neuron(x) else 1.0)
    v = compare.run(Op("scaled", fn, None), _case(1.0, 3.0))
    assert v.failed and v.kind == "mismatch"


def test_harness_integer_results_are_exact():
    op = _unary("plus", lambda x: x + int(_on_neuron(x)), torch.int32)
    assert compare.run(op, _case(1, 2, dtype=torch.int32)).failed


def test_harness_passes_errors_both_devices_raise_with_the_same_type():
    def fn(x):
        raise IndexError("index 3 is out of bounds")
    assert compare.run(Op("both", fn, None), _case(1.0)).status == "pass"


def test_harness_fails_internal_errors_and_errors_the_device_misses():
    from neuron_kernels.errors import KernelError

    def internal(x):
        if _on_neuron(x):
            raise KernelError("vector engine does not compute on int64")
        raise RuntimeError("bad input")  # even where the CPU raises too: a KernelError is not torch-style

    def lenient(x):
        if not _on_neuron(x):
            raise RuntimeError("index out of range")
        return x
    assert compare.run(Op("internal", internal, None), _case(1.0)).kind == "internal"
    assert compare.run(Op("lenient", lenient, None), _case(1.0)).kind == "accepted"


def test_harness_compares_in_place_effects_on_the_inputs():
    def fn(x):
        if _on_neuron(x):
            x.add_(1)
        return x.sum()
    assert compare.run(Op("writes", fn, None, inplace=True), _case(1.0, 2.0)).failed


def test_harness_keeps_layouts_on_the_device():
    seen = {}

    def fn(x):
        seen[x.device.type] = (x.stride(), x.storage_offset())
        return x.clone()
    for layout in ("transposed", "sliced", "expanded", "overlapping"):
        assert compare.run(Op("layout", fn, None), Case((T((3, 4), torch.float32, layout),))).status == "pass"
        assert seen["neuron"] == seen["cpu"], (layout, seen)


def test_harness_shrinks_a_failure_to_a_minimal_case():
    # wrong only for NaN: the reproducer keeps one NaN and nothing else that does not matter
    def fn(x):
        return torch.where(x.isnan(), 0.0, x) if _on_neuron(x) else x.clone()
    op = Op("nan_wrong", fn, lambda cap: shapes(cap).flatmap(lambda s: tensors(s, torch.float32)).map(
        lambda t: Case((t,))), arbiter=False)
    found = runner.search([op], 256, 200, SEED, runner.Stats(), exclude=False)
    assert found is not None and found.verdict.kind == "mismatch"
    t = found.case.tensors[0]
    assert t.shape in ((), (1,)) and len(t.edges) == 1 and math.isnan(t.edges[0][1]), found.case


def test_harness_rebuilds_a_case_bit_for_bit():
    t = T((5, 3), torch.bfloat16, "overlapping", "wide", 7, ((2, math.inf), (9, -0.0)))
    a, b = t.build(), eval(repr(t), {"T": T, "torch": torch, "math": math}).build()
    assert torch.equal(a.view(torch.int16), b.view(torch.int16)) and a.stride() == b.stride()
