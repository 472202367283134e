"""Fused optimizer steps: ``_fused_adamw_``, ``_fused_adam_`` and ``_fused_sgd_`` (what ``torch.optim.AdamW``,
``Adam`` and ``SGD`` call with ``fused=True``) as neuron-kernels' fused AdamW/Adam/SGD programs.

One launch updates every parameter of a call (params, grads and states packed into shared tiles; see
``neuron_kernels.library.optim``); the step-dependent scalars go in a small ``hyper`` tensor, so changing
the learning rate or the step never retraces. Parameters whose step counts differ (a parameter that got
no gradient on some steps) are launched per step count. AMP's ``grad_scale`` divides the gradients first
(stored back, as CUDA's fused kernels do) and a nonzero ``found_inf`` skips the step. Tensors the engines
cannot compute on (float64) run the whole call on the CPU, loudly.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from neuron_kernels.library import optim as kopt

from ...fallback import on_fallback
from ..core.copy import write_contiguous
from ..core.dtypes import FLOATS
from ..core.fallback import arguments
from ..core.launch import run


def _native(lists) -> bool:
    return all(t.device.type == "neuron" and t.dtype in FLOATS for ts in lists for t in ts)


def _scalar(v) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def _skip_step(grads, grad_scale, found_inf) -> bool:
    """AMP: True when ``found_inf`` is set (the step is skipped); otherwise unscale the gradients."""
    if found_inf is not None and _scalar(found_inf) != 0.0:
        return True
    if grad_scale is not None:
        torch._foreach_div_(grads, grad_scale)
    return False


def _on_cpu(name: str, op, lists: list, kwargs: dict) -> None:
    """The whole call on the CPU (a dtype the engines lack), results copied back into the lists."""
    on_fallback(name, arguments(lists, kwargs))
    cpu = [[t.cpu() for t in ts] for ts in lists]
    op(*cpu, **{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
    for ts, cs in zip(lists, cpu):
        for t, c in zip(ts, cs):
            t.copy_(c)


def _launch(name: str, step, lists: list, hyper, **options) -> None:
    """One fused-kernel launch over ``lists`` (each a list of n tensors), updated in place; non-contiguous
    tensors are updated through contiguous copies, empty ones need nothing."""
    keep = [i for i, p in enumerate(lists[0]) if p.numel()]
    if not keep:
        return
    lists = [[ts[i] for i in keep] for ts in lists]
    n = len(keep)
    flat = [t for ts in lists for t in ts]
    work = [t if t.is_contiguous() else t.contiguous() for t in flat]
    device = flat[0].device
    run(name, step.kernel(n, **options), *work, torch.from_numpy(hyper).to(device), **options)
    for t, w in zip(flat, work):
        if w is not t:
            t.copy_(w)


def _adam(name, step, decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf):
    if not params:
        return
    lists = [params, grads, exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if amsgrad else [])
    if not _native(lists):
        kwargs = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad,
                      maximize=maximize, grad_scale=grad_scale, found_inf=found_inf)
        op = getattr(torch.ops.aten, name)
        return _on_cpu(name, op, [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps], kwargs)
    if _skip_step(grads, grad_scale, found_inf):
        return
    lr = _scalar(lr)
    by_step = defaultdict(list)
    for i, s in enumerate(state_steps):
        by_step[_scalar(s)].append(i)
    for count, idx in by_step.items():
        hyper = kopt.adam_hyper(lr, beta1, beta2, eps, weight_decay, count, decoupled=decoupled)
        _launch(name, step, [[ts[i] for i in idx] for ts in lists], hyper, amsgrad=amsgrad, maximize=maximize,
                weight_decay=weight_decay != 0)


def fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    _adam("_fused_adamw_", kopt.adamw_step, True, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
          state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    _adam("_fused_adam_", kopt.adam_step, False, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
          state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


def fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
               is_first_step, grad_scale=None, found_inf=None):
    if not params:
        return
    lists = [params, grads] + ([momentum_buffer_list] if momentum_buffer_list else [])
    if not _native(lists):
        kwargs = dict(weight_decay=weight_decay, momentum=momentum, lr=lr, dampening=dampening, nesterov=nesterov,
                      maximize=maximize, is_first_step=is_first_step, grad_scale=grad_scale, found_inf=found_inf)
        return _on_cpu("_fused_sgd_", torch.ops.aten._fused_sgd_, [params, grads, momentum_buffer_list], kwargs)
    if _skip_step(grads, grad_scale, found_inf):
        return
    has_buf = bool(momentum_buffer_list)
    if has_buf and is_first_step:  # torch made the buffers with empty_like; the kernel reads 0 * buf
        for b in momentum_buffer_list:
            write_contiguous(b, torch.zeros(b.shape, dtype=b.dtype)) if b.is_contiguous() else b.copy_(
                torch.zeros(b.shape, dtype=b.dtype))
    hyper = kopt.sgd_hyper(_scalar(lr), momentum, dampening, weight_decay, first_step=is_first_step)
    _launch("_fused_sgd_", kopt.sgd_step, lists, hyper, momentum=has_buf, nesterov=nesterov, maximize=maximize,
            weight_decay=weight_decay != 0)
