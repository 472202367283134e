"""``optim_db`` on neuron against the CPU: every OptimizerInfo, each of its optimizer inputs, in each
implementation it supports (for-loop, ``foreach``, ``fused``), over a few steps.

The parameters (a weight, a bias and an empty tensor, as PyTorch's fused tests use) start equal on both
devices; each step's closure computes a quadratic loss and its gradients on the CPU from that device's
current parameters, so the comparison isolates the optimizer's own math. After every step the parameters,
and at the end the optimizer states, must match with PyTorch's default float32 tolerances (those of its
``test_fused_cpu_matches_cuda``), raised by the OptimizerInfo's own overrides for
``test_foreach_matches_forloop`` / ``test_fused_matches_forloop``. Configurations the CPU rejects must be
rejected on neuron too. ``differentiable`` (autograd through the step) is not a device comparison and is
not run.
"""

from __future__ import annotations

import time
import warnings

import torch
from torch.testing._internal.common_optimizers import optim_db

from . import transfer as tr
from .outcome import Outcome, describe, pick, seed
from .policy import policy

DTYPES = {"float32": torch.float32}
BASE_TOL = (1.3e-6, 1e-5)  # torch.testing defaults for float32 (assertEqual in _compare_between)
STEPS = 3
TESTS = {"forloop": "test_foreach_matches_forloop", "foreach": "test_foreach_matches_forloop",
         "fused": "test_fused_matches_forloop"}


def configs(info) -> list[tuple[str, dict]]:
    """(description, constructor kwargs) for each optimizer input and implementation."""
    impls = {"forloop": {"foreach": False}} if "foreach" in info.supported_impls else {"default": {}}
    if "foreach" in info.supported_impls:
        impls["foreach"] = {"foreach": True}
    if "fused" in info.supported_impls:
        impls["fused"] = {"fused": True}
    out = []
    for oi in info.optim_inputs_func(device="neuron"):
        if oi.params is not None:  # param-group layouts need matching parameters; the kwargs are what we test
            continue
        for name, flags in impls.items():
            kwargs = {k: v for k, v in oi.kwargs.items() if k not in ("foreach", "fused", "differentiable")}
            out.append((f"{oi.desc}/{name}", {**kwargs, **flags}))
    return out


def _params(device, only_2d: bool, no_empty: bool = False) -> list[torch.Tensor]:
    seed()
    ps = [torch.randn(10, 5), torch.randn(10), torch.empty(0)]
    return [p.to(device).requires_grad_() for p in (ps[:1] if only_2d else ps[:2] if no_empty else ps)]


def _closure(params, sparse: bool):
    """Loss and gradients computed on the CPU from ``params`` (on any device), stored as their .grad."""

    def closure():
        cpu = [p.detach().cpu().requires_grad_() for p in params]
        seed(1)
        x = torch.randn(5)
        w, rest = cpu[0], cpu[1:]
        loss = (w @ x + (rest[0] if rest else 0)).pow(2).sum() + sum(r.sum() for r in rest[1:])
        loss.backward()
        for p, c in zip(params, cpu):
            g = c.grad.to_sparse() if sparse else c.grad
            p.grad = g.to(p.device)
        return loss.detach().to(params[0].device)

    return closure


def _state(opt) -> list:
    return [v for s in opt.state_dict()["state"].values() for _, v in sorted(s.items())]


def run_config(info, kwargs: dict, rtol: float, atol: float) -> set[str]:
    """Returns the ops that fell back during the neuron steps."""
    only_2d = info.name == "Muon"  # Muon orthogonalizes matrices; it rejects 1-d parameters by design
    # torch's Adafactor divides by sqrt(numel): an empty parameter raises ZeroDivisionError on the CPU itself
    no_empty = info.name == "Adafactor"
    cpu_kwargs = {k: v for k, v in kwargs.items() if k != "capturable"}  # the math is the same
    cpu_p, dev_p = _params("cpu", only_2d, no_empty), _params("neuron", only_2d, no_empty)
    try:
        cpu_opt = info.optim_cls(cpu_p, **cpu_kwargs)
    except Exception as e:  # the CPU rejects this configuration: neuron must too
        try:
            info.optim_cls(dev_p, **kwargs)
        except type(e):
            return set()
        raise AssertionError(f"the CPU rejects {kwargs} ({e}) but neuron accepts it") from None
    dev_opt = info.optim_cls(dev_p, **kwargs)
    fell_back = set()
    for step in range(STEPS):
        cpu_opt.step(_closure(cpu_p, info.only_supports_sparse_grads))
        before = tr.fallback_counts()
        dev_opt.step(_closure(dev_p, info.only_supports_sparse_grads))
        fell_back |= tr.fallback_delta(before)
        tr.assert_matches([p.detach() for p in dev_p], [p.detach() for p in cpu_p], rtol, atol,
                          f"parameters after step {step + 1}")
    tr.assert_matches(_state(dev_opt), _state(cpu_opt), rtol, atol, "optimizer state", inputs=True)
    return fell_back


def run_optimizer(info, dtype, first: int | None = None, extra=()) -> Outcome:
    """``first``: how many of the (optimizer input, implementation) configurations to run (None: all)."""
    out, t0 = Outcome(info.name, "pass"), time.perf_counter()
    cases = configs(info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in pick(len(cases), first, extra):
            desc, kwargs = cases[i]
            impl = desc.rpartition("/")[2]
            pol = policy(info.decorators, "TestOptimRenewed", TESTS.get(impl, ""), dtype, *BASE_TOL)
            if pol.skip:
                continue
            out.samples += 1
            try:
                out.fallbacks |= run_config(info, kwargs, pol.rtol, pol.atol)
            except Exception as e:
                out.status, out.sample, out.reason = "fail", i, f"{desc}: {describe(e)}"
                break
    out.seconds = time.perf_counter() - t0
    return out


def optimizers() -> list:
    return list(optim_db)

