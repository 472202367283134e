"""The zoo's forward and backward stages (:mod:`.zoo`) with the device model under
``torch.compile(backend="neuron")`` (default options: ``dynamic=False``, graph breaks allowed), against the same
CPU eager reference and tolerance.

The model is compiled in place (``nn.Module.compile``): its parameter names stay those of the CPU model, which the
backward stage pairs gradients by. ``attn="eager"`` switches the model (the CPU reference too) to the written-out
attention where the model supports the switch, so the compiler's attention rewrite (``compile/attention.py``) is
what runs. A stage that fails is run once more with the CPU model compiled by
``backend="aot_eager"`` (Dynamo and AOTAutograd without any neuron code): when that fails too, the failure is
torch's (``torch_too`` names the stages), not the backend's.

``run(timing=True)`` also measures one training step, the backward stage's own (``zoo.stage_backward``: forward,
the cross-entropy of the logits, backward; its comparison with the CPU is rerun too and only reported), in
simulated device time and device programs launched, on the compiled model and on a separate eager copy on the
device (the CPU model's weights after the same stages, so the same weights and inputs; not compiled). Each is
measured in steady state: the step once to warm up (graphs, launches and merged schedules exist), then an
identical step timed, by ``torch.neuron.metrics()``: ``device_ns_total`` sums every program's own span on the
device timeline and ``programs`` counts executions (a compiled graph's call is one program, the kernels in it
none). A ``torch.neuron.Event`` pair around the step must agree (it marks the stream's timeline, which on the one
stream used here is the same programs back to back). Timing runs after the stages and after their metrics are
taken, and changes no status: a step that cannot be measured leaves its figures None and says why in ``timing``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from . import zoo

STAGES = ("forward", "backward")
# the timing of the result ``run`` hands to ``checked``: what stands if the process does not survive the timing
UNTIMED = "not measured: the process ended while the steps were timed"


@dataclass
class CompileResult(zoo.StageResult):
    stages: ClassVar[tuple[str, ...]] = STAGES
    arch: str
    forward: str = "not run"
    backward: str = "not run"
    fallback: list[str] = field(default_factory=list)
    reason: str = ""
    torch_too: list[str] = field(default_factory=list)  # stages that fail under backend="aot_eager" on the CPU
    compile: dict = field(default_factory=dict)  # torch.neuron.metrics()["compile"]: graphs, regions, rewrites
    graph_breaks: int = 0
    params: int = 0
    seconds: float = 0.0
    # one steady-state training step (the backward stage's), simulated device ns and programs launched; None
    # where not measured, with the reason (or what is doubtful about a measured one) in ``timing``
    eager_step_ns: float | None = None
    compiled_step_ns: float | None = None
    eager_programs: int | None = None
    compiled_programs: int | None = None
    timing: str = ""


_STAGE_FNS = {"forward": zoo.stage_forward, "backward": zoo.stage_backward}


@contextmanager
def _device(name: str):
    """The zoo stages move the prompt to ``zoo.DEV``; the aot_eager control runs them with the CPU instead."""
    saved, zoo.DEV = zoo.DEV, name
    try:
        yield
    finally:
        zoo.DEV = saved


def _problem(fn, *args) -> str:
    try:
        return fn(*args)
    except zoo.CpuReferenceError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - the reason is the report
        return f"{zoo._first_line(e)} at {zoo._where(e)}"


def _fails_under_aot_eager(cpu, stage: str, ids, mask) -> bool:
    """Whether ``stage`` fails with the CPU model compiled by Dynamo + AOTAutograd alone."""
    torch._dynamo.reset()
    control = copy.deepcopy(cpu)
    control.compile(backend="aot_eager")
    with _device("cpu"):
        return bool(_problem(_STAGE_FNS[stage], cpu, control, ids, mask))


def _set_attention(model, attn: str | None) -> None:
    """The attention implementation ``attn`` where the model can switch to it (some have only their own)."""
    if attn is not None and getattr(model.config, "_attn_implementation", attn) != attn:
        try:
            model.set_attn_implementation(attn)
        except (ValueError, AttributeError):
            pass  # the model keeps its only implementation


class _Unmeasured(Exception):
    """A step ran but its device time cannot be trusted (the message says why)."""


def _device_totals() -> tuple[float, int, int]:
    """Simulated device ns, programs executed and graphs compiled so far (``torch.neuron.metrics()``)."""
    m = torch.neuron.metrics()
    graphs = sum(n for k, n in m["compile"].items() if k.endswith("_graphs"))
    return m["device_ns_total"], sum(m["programs"].values()), graphs


def _timed_step(cpu, model, ids, mask) -> tuple[float, int, str]:
    """Device ns and programs of ``model``'s steady-state training step (``zoo.stage_backward``, once to warm up
    and once measured), and a note when the measured step's gradients differ from the CPU's."""
    zoo.stage_backward(cpu, model, ids, mask)
    device = torch.device(zoo.DEV)
    torch.neuron.synchronize(device)
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    ns0, programs0, graphs0 = _device_totals()
    start.record()
    problem = zoo.stage_backward(cpu, model, ids, mask)
    end.record()
    torch.neuron.synchronize(device)
    ns1, programs1, graphs1 = _device_totals()
    ns, event_ns = ns1 - ns0, start.elapsed_time(end) * 1e6
    if graphs1 != graphs0:
        raise _Unmeasured(f"{graphs1 - graphs0} graph(s) compiled again in the measured step: not steady")
    if abs(event_ns - ns) > 1e-6 * ns + 1e-3:
        raise _Unmeasured(f"the metrics' {ns:.0f} ns and the events' {event_ns:.0f} ns disagree")
    if ns <= 0:
        raise _Unmeasured("no device time recorded")
    return ns, programs1 - programs0, f"its measured step's gradients: {problem}" if problem else ""


def _time_steps(result: CompileResult, cpu, dev, ids, mask) -> None:
    """The eager and the compiled training step's device time and programs into ``result`` (None and the
    reason in ``result.timing`` for one that cannot be measured); never changes a stage's status."""
    notes = []
    try:
        eager = copy.deepcopy(cpu)  # the weights the compiled copy has after the same stages, not compiled
        eager.zero_grad(set_to_none=True)
        eager = eager.to(zoo.DEV)
    except Exception as e:  # noqa: BLE001 - the reason is the report
        eager, notes = None, [f"eager: copying the model to {zoo.DEV}: {zoo._first_line(e)} at {zoo._where(e)}"]
    for which, model in (("eager", eager), ("compiled", dev)):
        if model is None:
            continue
        try:
            ns, programs, note = _timed_step(cpu, model, ids, mask)
        except (zoo.CpuReferenceError, _Unmeasured) as e:
            notes.append(f"{which}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - the reason is the report
            notes.append(f"{which}: {zoo._first_line(e)} at {zoo._where(e)}")
            continue
        setattr(result, f"{which}_step_ns", round(ns, 1))
        setattr(result, f"{which}_programs", programs)
        if note:
            notes.append(f"{which}: {note}")
    result.timing = "; ".join(notes)


def run(arch: str, control: bool = True, attn: str | None = None, timing: bool = False,
        checked: Callable[[CompileResult], None] | None = None) -> CompileResult:
    """Build ``arch`` tiny, compile its device copy, run forward and backward against the CPU and classify; with
    ``timing``, then measure the training step's device time eager and compiled (see the module's docstring).
    ``checked`` is given the result once the stages are classified, before any timing (a supervisor keeps it
    should the process not survive the timing)."""
    start = time.time()
    result = CompileResult(arch)
    try:
        cpu, result.params = zoo.build(arch)
        _set_attention(cpu, attn)
        dev = copy.deepcopy(cpu).to(zoo.DEV)
        ids, mask = zoo.prompt(cpu)
    except zoo.NotApplicable as e:
        result.forward = result.backward = "n/a"
        result.reason = str(e)
        return result
    except Exception as e:  # noqa: BLE001
        result.forward = result.backward = "fail"
        result.reason = f"build: {zoo._first_line(e)} at {zoo._where(e)}"
        return result
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.neuron.reset_metrics()
    dev.compile(backend="neuron")
    reasons = []
    for stage in STAGES:
        problem = _problem(_STAGE_FNS[stage], cpu, dev, ids, mask)
        setattr(result, stage, "fail" if problem else "pass")
        if problem:
            reasons.append(f"{stage}: {problem}")
    metrics = torch.neuron.metrics()
    result.fallback = sorted(metrics["fallback"])
    result.compile = dict(metrics["compile"])
    result.graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    if control:
        result.torch_too = [s for s in STAGES if getattr(result, s) == "fail"
                            and _fails_under_aot_eager(cpu, s, ids, mask)]
    result.reason = "; ".join(reasons)
    result.seconds = round(time.time() - start, 1)
    if timing:
        result.timing = UNTIMED if result.passed else "not measured: a stage fails"
        if checked is not None:
            checked(result)
        if result.passed:  # the control above runs only for a failing stage: dev's graphs are still compiled
            _time_steps(result, cpu, dev, ids, mask)
            result.seconds = round(time.time() - start, 1)
    return result
