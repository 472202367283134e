"""``module_db`` on neuron against the CPU, as PyTorch's ``TestModule.test_cpu_gpu_parity``.

Per module and module input (train and eval modes where they differ): the module is built on the CPU
from a fixed seed, deep-copied and moved with ``.to("neuron")``; the forward outputs, then the gradients
of the inputs and parameters after a backward pass with the same random output gradients, and the
buffers (running statistics) must match the CPU. Tolerance: test_cpu_gpu_parity's float32
``toleranceOverride`` (atol 5e-2, rtol 0), raised by the ModuleInfo's own overrides. Modules whose outputs
are random (dropout in training) have only their output metadata checked. Native means no CPU fallback
in forward and backward.
"""

from __future__ import annotations

import copy
import time
import warnings

import torch
from torch.testing._internal.common_modules import module_db
from torch.utils import _pytree as pytree

from . import transfer as tr
from .outcome import RANDOM, Outcome, describe, last_needed, pick, seed
from .policy import Policy, policy

DTYPES = {"float32": torch.float32}
BASE_TOL = {torch.float32: (0.0, 5e-2)}  # (rtol, atol): test_cpu_gpu_parity's toleranceOverride


def modules_for(dtype) -> list:
    return [m for m in module_db if dtype in m.dtypes]


def inputs(info, dtype, last: int | None) -> list[tuple[bool, object]]:
    """(training, ModuleInput) in a stable order: train mode, then eval mode where it differs."""
    out = []
    for training in (True, False) if info.train_and_eval_differ else (True,):
        seed()
        out += [(training, mi) for mi in info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                                                 training=training)]
        if last is not None and len(out) > last:
            break
    return out


def _build(info, mi, training: bool, dtype):
    seed()
    m = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs).to(dtype)
    m.train(training)
    if issubclass(info.module_cls, torch.nn.modules.lazy.LazyModuleMixin):
        with torch.no_grad():  # lazy modules size their parameters from a first input
            m(*tr.clone_cpu(mi.forward_input.args), **tr.clone_cpu(mi.forward_input.kwargs))
    return m


def _forward(m, args, kwargs, value: int):
    seed(value)
    return m(*args, **kwargs)


def _grads(tree) -> list:
    return [t.grad for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def _retain_grads(tree) -> None:
    """Inputs built by ops (non-leaves) keep their .grad too, as test_cpu_gpu_parity does."""
    for t in pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.retain_grad()


def _backward(outputs, grad_outputs) -> None:
    for out, g in zip(outputs, grad_outputs):
        out.backward(g, retain_graph=True)


def run_input(info, mi, training: bool, dtype, pol: Policy) -> tuple[set[str], bool]:
    """Forward and backward on both devices; returns (ops that fell back, random outputs)."""
    m_cpu = _build(info, mi, training, dtype)
    m_dev, m_spare = copy.deepcopy(m_cpu).to("neuron"), copy.deepcopy(m_cpu)
    args, kwargs = mi.forward_input.args, mi.forward_input.kwargs
    d_args, d_kwargs = tr.to_neuron((args, kwargs))
    s_args, s_kwargs = tr.clone_cpu((args, kwargs))
    _retain_grads((args, kwargs, d_args, d_kwargs))
    before = tr.fallback_counts()
    out_dev = _forward(m_dev, d_args, d_kwargs, 0)
    out_cpu = _forward(m_cpu, args, kwargs, 0)
    if pol.skip or not tr.identical(_forward(m_spare, s_args, s_kwargs, 1), out_cpu):
        tr.assert_same_metadata(out_dev, out_cpu)
        return tr.fallback_delta(before), not pol.skip
    tr.assert_matches(out_dev, out_cpu, pol.rtol, pol.atol)
    diff = [(c, d) for c, d in zip(pytree.tree_leaves(out_cpu), pytree.tree_leaves(out_dev))
            if isinstance(c, torch.Tensor) and c.requires_grad]
    seed()
    grad_outputs = [torch.randn_like(c) for c, _ in diff]
    _backward([c for c, _ in diff], grad_outputs)
    _backward([d for _, d in diff], [g.to("neuron") for g in grad_outputs])
    fell_back = tr.fallback_delta(before)
    tr.assert_matches(_grads((d_args, d_kwargs)), _grads((args, kwargs)), pol.rtol, pol.atol, "input grads")
    tr.assert_matches([p.grad for p in m_dev.parameters()], [p.grad for p in m_cpu.parameters()], pol.rtol, pol.atol,
                      "parameter grads")
    tr.assert_matches(list(m_dev.buffers()), list(m_cpu.buffers()), pol.rtol, pol.atol, "buffers")
    return fell_back, False


def run_module(info, dtype, first: int | None = None, extra=()) -> Outcome:
    pol = policy(info.decorators, "TestModule", "test_cpu_gpu_parity", dtype, *BASE_TOL[dtype])
    out, t0 = Outcome(info.name, "skip" if pol.skip else "pass", pol.skip or ""), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = inputs(info, dtype, last_needed(first, extra))
        for i in pick(len(cases), first, extra):
            training, mi = cases[i]
            if mi.forward_input is None:
                continue
            out.samples += 1
            try:
                fell_back, random_out = run_input(info, mi, training, dtype, pol)
            except Exception as e:
                out.status, out.sample, out.reason = "fail", i, describe(e)
                break
            out.fallbacks |= fell_back
            if random_out:
                out.status, out.reason, pol = "skip", RANDOM, Policy(RANDOM, pol.rtol, pol.atol)
    out.seconds = time.perf_counter() - t0
    return out
