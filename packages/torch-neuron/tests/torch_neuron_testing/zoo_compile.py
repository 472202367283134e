"""The zoo's forward and backward stages (:mod:`.zoo`) with the device model under
``torch.compile(backend="neuron")`` (default options: ``dynamic=False``, graph breaks allowed), against the same
CPU eager reference and tolerance.

The model is compiled in place (``nn.Module.compile``): its parameter names stay those of the CPU model, which the
backward stage pairs gradients by. ``attn="eager"`` switches the model (the CPU reference too) to the written-out
attention where the model supports the switch, so the compiler's attention rewrite (``compile/attention.py``) is
what runs. A stage that fails is run once more with the CPU model compiled by
``backend="aot_eager"`` (Dynamo and AOTAutograd without any neuron code): when that fails too, the failure is
torch's (``torch_too`` names the stages), not the backend's.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from . import zoo

STAGES = ("forward", "backward")


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


def run(arch: str, control: bool = True, attn: str | None = None) -> CompileResult:
    """Build ``arch`` tiny, compile its device copy, run forward and backward against the CPU and classify."""
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
    return result
