"""Optimizers on neuron against the CPU.

* ``test_optim_db``: PyTorch's ``optim_db`` (every optimizer, its optimizer inputs, for-loop / foreach /
  fused implementations; see ``torch_neuron_testing.optims``), with the known failures in
  ``opinfo_exclusions.toml``.
* AdamW / Adam / SGD, foreach and fused, over several steps: they must match the CPU and run natively
  (``_fused_*`` and ``_foreach_*`` kernels, no CPU fallback).
* The ``_foreach_*`` ops themselves against the CPU (shapes, 0-d, empty, non-contiguous, dtypes), and the
  AMP (grad_scale / found_inf) and float64 paths of the fused ops.
"""

import pytest
import torch
from torch_neuron_testing import optims, report, settings

CASES = [pytest.param(dname, info, id=report.param_id(dname, info.name))
         for dname in optims.DTYPES for info in optims.optimizers()]


@pytest.mark.parametrize("dname, info", CASES)
def test_optim_db(dname, info, record_property):
    first = settings.configs_per_optimizer()
    report.run_entry(record_property, f"optim_db.{dname}", info.name,
                     lambda extra: optims.run_optimizer(info, optims.DTYPES[dname], first, extra))


# -- AdamW / Adam / SGD, foreach and fused, natively --------------------------------------------------------
SHAPES = [(3, 4), (5,), (130, 7), (), (0,), (2, 3, 4)]
# The reference is the CPU's single-tensor (for-loop) implementation, as in PyTorch's
# test_fused_matches_forloop / test_foreach_matches_forloop, float32 tolerances by default. For bfloat16 the
# reference runs in float32 with parameters and states rounded to bf16 after every step: bf16 storage and
# float32 math, as the fused kernels and torch's opmath scalars (the CPU's own bf16 paths round scalars
# such as momentum=0.9 to bf16, and in torch 2.13 its fused bf16 SGD leaves tensors of >= 16 elements
# unchanged). foreach rounds every op's result to bf16, so its states may differ by a rounding per op at
# the scale of what they accumulate (momentum cancels: a small buffer can carry an error of large grads):
# state tolerances allow two bf16 ulps of the largest value of that state over all parameters.
# bf16 tolerance: the bf16 defaults with the OptimizerInfo's atol override (5e-3), combined as
# assertEqual combines them.
TOL = {torch.float32: {}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 5e-3}}
STEPS = 4


def _model_params(dtype):
    torch.manual_seed(0)
    cpu = [torch.randn(s).to(dtype).requires_grad_() for s in SHAPES]
    return cpu, [p.detach().to("neuron").requires_grad_() for p in cpu]


def _round_to(dtype, params, opt) -> None:
    """Store the float32 reference's parameters and floating states as ``dtype`` would."""
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(dtype))
            for v in opt.state[p].values():
                if torch.is_tensor(v) and v.is_floating_point() and v.dim():
                    v.copy_(v.to(dtype))


def _run_steps(name, kwargs, impl, dtype, sched=True):
    """STEPS steps of ``impl`` on neuron and of the reference (see TOL) on the CPU, with the same gradients
    (and a learning rate that changes every step when ``sched``); returns the optimizers, parameters and
    the ops that fell back on neuron after the states were created."""
    cpu, dev = _model_params(dtype)
    emulate = dtype != torch.float32
    cpu = [c.detach().float().requires_grad_() for c in cpu]
    cls = getattr(torch.optim, name)
    opt_c, opt_d = cls(cpu, **kwargs, foreach=False), cls(dev, **kwargs, **{impl: True})
    for step in range(STEPS):
        for c, d in zip(cpu, dev):
            g = torch.randn(c.shape).to(dtype)
            c.grad, d.grad = g.to(c.dtype), g.to("neuron")
        opt_c.step()
        if emulate:
            _round_to(dtype, cpu, opt_c)
        if step == 1:  # states exist now: from here on only the step's own ops run
            torch.neuron.reset_metrics()
        opt_d.step()
        if sched:
            for opt in (opt_c, opt_d):
                for group in opt.param_groups:
                    group["lr"] *= 0.7
    return opt_c, opt_d, cpu, dev, set(torch.neuron.metrics()["fallback"])


CONFIGS = [
    ("AdamW", {}), ("AdamW", {"weight_decay": 0.1, "amsgrad": True}), ("AdamW", {"maximize": True, "weight_decay": 0}),
    ("Adam", {}), ("Adam", {"weight_decay": 0.1}), ("Adam", {"amsgrad": True, "maximize": True}),
    ("SGD", {"lr": 0.1}), ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "maximize": True}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl", ["foreach", "fused"])
@pytest.mark.parametrize("name, kwargs", CONFIGS, ids=[f"{n}-{k}" for n, k in CONFIGS])
def test_optimizer_matches_cpu_natively(name, kwargs, impl, dtype):
    opt_c, opt_d, cpu, dev, fell_back = _run_steps(name, kwargs, impl, dtype)
    assert not fell_back, f"{name}({impl}) steps took the CPU fallback for {sorted(fell_back)}"
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.detach().cpu().to(c.dtype), c.detach(), **TOL[dtype])
    scale = {}
    for sc in opt_c.state.values():
        for k, v in sc.items():
            scale[k] = max(scale.get(k, 0.0), v.abs().max().item() if v.numel() else 0.0)
    for sc, sd in zip(opt_c.state.values(), opt_d.state.values()):
        for k in sc:
            tol = dict(TOL[dtype])
            if dtype == torch.bfloat16 and impl == "foreach":
                tol["atol"] = max(tol["atol"], 2 * 2.0**-8 * scale[k])
            torch.testing.assert_close(sd[k].cpu().to(sc[k].dtype), sc[k], **tol, msg=lambda m, k=k: f"state {k}: {m}")


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_changing_the_learning_rate_never_retraces(impl):
    def traced():  # launches prepared so far (the cache's size stops growing once it is full)
        return torch.neuron.metrics()["caches"]["launch"]["misses"]

    _, opt, _, dev, _ = _run_steps("AdamW", {"weight_decay": 0.1}, impl, torch.float32)
    before = traced()
    for lr in (1e-3, 3e-4, 1e-4):
        for group in opt.param_groups:
            group["lr"] = lr
        for d in dev:
            d.grad = torch.randn(d.shape).to("neuron")
        opt.step()
    assert traced() == before


def _adam_lists(device, dtype=torch.float32):
    torch.manual_seed(1)
    shapes = [(4, 3), (7,)]
    lists = [[torch.randn(s, dtype=dtype) for s in shapes] for _ in range(2)]
    lists += [[torch.zeros(s, dtype=dtype) for s in shapes] for _ in range(2)]
    steps = [torch.tensor(3.0), torch.tensor(1.0)]  # parameters at different step counts
    return [[t.to(device) for t in ts] for ts in lists] + [[], [s.to(device) for s in steps]]


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_fused_adamw_amp_grad_scale_and_found_inf(found_inf):
    kw = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
    cpu, dev = _adam_lists("cpu"), _adam_lists("neuron")
    torch._fused_adamw_(*cpu, **kw, grad_scale=torch.tensor(8.0), found_inf=torch.tensor(found_inf))
    torch._fused_adamw_(*dev, **kw, grad_scale=torch.tensor(8.0, device="neuron"),
                        found_inf=torch.tensor(found_inf, device="neuron"))
    for ts_c, ts_d in zip(cpu, dev):  # params, (unscaled) grads and states
        for c, d in zip(ts_c, ts_d):
            torch.testing.assert_close(d.cpu(), c)


def test_fused_adam_on_float64_runs_on_the_cpu_loudly():
    kw = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    cpu, dev = _adam_lists("cpu", torch.float64), _adam_lists("neuron", torch.float64)
    torch.neuron.reset_metrics()
    torch._fused_adam_(*cpu, **kw)
    torch._fused_adam_(*dev, **kw)
    assert torch.neuron.metrics()["fallback"].get("_fused_adam_") == 1
    for c, d in zip(cpu[0], dev[0]):
        torch.testing.assert_close(d.cpu(), c)
    torch.neuron.set_strict(True)
    try:
        with pytest.raises(NotImplementedError, match="_fused_adam_"):
            torch._fused_adam_(*dev, **kw)
    finally:
        torch.neuron.set_strict(False)


# -- the _foreach_* ops ----------------------------------------------------------------------------------
FOREACH_SHAPES = [(3, 4), (5,), (), (2, 0), (130, 7), (4, 3)]


def _lists(device, dtype, n=3):
    """n tensor lists (positive values: sqrt and division are defined); the last tensor of each list is a
    transposed (non-contiguous) view."""
    torch.manual_seed(2)
    out = []
    for _ in range(n):
        ts = [(torch.rand(s) + 0.5).to(dtype) for s in FOREACH_SHAPES]
        ts[-1] = ts[-1].t()
        out.append(ts)
    if device == "cpu":
        return out
    return [[t.detach().to(device) if t.is_contiguous() else t.t().to(device).t() for t in ts] for ts in out]


def _scalar(device, like):
    """A 0-d tensor operand of the list's dtype (a float32 one would promote the list's 0-d tensors)."""
    return torch.tensor(0.25, device=device, dtype=like[0].dtype)


FOREACH = {  # name: f(a, b, c, device) calling the op (in-place variants mutate a)
    "add.Scalar": lambda a, b, c, d, f: f("add", a, 1.5),
    "add.ScalarList": lambda a, b, c, d, f: f("add", a, [0.5 * i for i in range(len(a))]),
    "add.List": lambda a, b, c, d, f: f("add", a, b, alpha=-0.3),
    "add.Tensor": lambda a, b, c, d, f: f("add", a, _scalar(d, a)),
    "sub.Scalar": lambda a, b, c, d, f: f("sub", a, 0.75),
    "sub.List": lambda a, b, c, d, f: f("sub", a, b),
    "mul.Scalar": lambda a, b, c, d, f: f("mul", a, 0.999),
    "mul.ScalarList": lambda a, b, c, d, f: f("mul", a, [1.0 + i for i in range(len(a))]),
    "mul.List": lambda a, b, c, d, f: f("mul", a, b),
    "mul.Tensor": lambda a, b, c, d, f: f("mul", a, _scalar(d, a)),
    "div.Scalar": lambda a, b, c, d, f: f("div", a, 3.0),
    "div.ScalarList": lambda a, b, c, d, f: f("div", a, [0.7 + i for i in range(len(a))]),
    "div.List": lambda a, b, c, d, f: f("div", a, b),
    "maximum.List": lambda a, b, c, d, f: f("maximum", a, b),
    "minimum.List": lambda a, b, c, d, f: f("minimum", a, b),
    "lerp.Scalar(0.1)": lambda a, b, c, d, f: f("lerp", a, b, 0.1),
    "lerp.Scalar(0.8)": lambda a, b, c, d, f: f("lerp", a, b, 0.8),
    "addcmul.Scalar": lambda a, b, c, d, f: f("addcmul", a, b, c, 0.001),
    "addcmul.ScalarList": lambda a, b, c, d, f: f("addcmul", a, b, c, [0.1 * i for i in range(len(a))]),
    "addcmul.Tensor": lambda a, b, c, d, f: f("addcmul", a, b, c, torch.arange(len(a), dtype=torch.float32)),
    "addcdiv.Scalar": lambda a, b, c, d, f: f("addcdiv", a, b, c),
    "addcdiv.ScalarList": lambda a, b, c, d, f: f("addcdiv", a, b, c, [-0.01 * i for i in range(len(a))]),
    "sqrt": lambda a, b, c, d, f: f("sqrt", a),
    "neg": lambda a, b, c, d, f: f("neg", a),
}


def _out_of_place(name, *args, **kwargs):
    return getattr(torch, f"_foreach_{name}")(*args, **kwargs)


def _in_place(name, *args, **kwargs):
    getattr(torch, f"_foreach_{name}_")(*args, **kwargs)
    return args[0]


def _expected(case, cpu, call, dtype):
    """The CPU result; for 16-bit floats computed in float32 and rounded once (opmath: torch's CUDA foreach
    kernels and ours; the CPU's bf16/fp16 path rounds ``alpha`` to the tensor's dtype first)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return FOREACH[case](*cpu, "cpu", call)
    wide = [[t.float() for t in ts] for ts in cpu]
    out = [r.to(dtype) if r.dtype == torch.float32 else r for r in FOREACH[case](*wide, "cpu", call)]
    if call is _in_place:  # the float32 copies were updated: store them like the inputs would be
        for t, w in zip(cpu[0], wide[0]):
            t.copy_(w)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32], ids=str)
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("case", list(FOREACH))
def test_foreach_op_matches_cpu(case, inplace, dtype):
    call = _in_place if inplace else _out_of_place
    cpu, dev = _lists("cpu", dtype), _lists("neuron", dtype)
    if dtype == torch.int32 and case.startswith(("sqrt", "div", "lerp", "addcdiv")):
        pytest.skip("not defined for integer tensors (torch raises on the CPU too)")
    try:
        expected = _expected(case, cpu, call, dtype)
    except RuntimeError:  # e.g. float alpha with integer tensors: neuron must refuse too (the error's
        with pytest.raises((RuntimeError, ValueError, TypeError)):  # type is the per-tensor op's business)
            FOREACH[case](*dev, "neuron", call)
        return
    before = dict(torch.neuron.metrics()["fallback"])
    actual = FOREACH[case](*dev, "neuron", call)
    fell_back = {k for k, v in torch.neuron.metrics()["fallback"].items() if v != before.get(k)}
    for d, c in zip(actual, expected):
        assert d.device.type == "neuron"
        torch.testing.assert_close(d.cpu(), c)
    if dtype.is_floating_point:
        assert not fell_back, f"_foreach_{case} fell back to the CPU for {sorted(fell_back)}"


def test_foreach_checks_list_lengths_like_torch():
    a, b = _lists("neuron", torch.float32, 2)
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add_(a, b[:-1])
    with pytest.raises(RuntimeError, match="at least one tensor"):
        torch._foreach_mul_([], 2.0)
