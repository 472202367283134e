"""Fused optimizer steps (AdamW, Adam, SGD) over several steps against numpy versions of torch's formulas."""

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import language as nl
from neuron_kernels.library.optim import ADAM_FIELDS, adam_hyper, adam_step, adamw_step, sgd_hyper, sgd_step

SETTINGS = settings(max_examples=int(os.environ.get("OPTIM_EXAMPLES", 12)), deadline=None)
BF16 = ml_dtypes.bfloat16
RTOL = {np.dtype(np.float32): 2e-5, np.dtype(BF16): 1.6e-2, np.dtype(np.float16): 2e-3}
SHAPES = st.lists(st.sampled_from([(300, 7), (5,), (128,), (129,), (2, 3, 4), (0,), (1000,), (1, 1), (64, 130)]),
                  min_size=1, max_size=5)


def as_dtype(x, dtype):
    return np.asarray(x, np.float64).astype(dtype).astype(np.float64)


class TorchAdam:
    """torch.optim.Adam / AdamW (single-tensor, non-capturable) in float64; state rounded to its dtype."""

    def __init__(self, params, lr, betas, eps, weight_decay, decoupled, amsgrad, maximize):
        self.p = [np.asarray(p, np.float64) for p in params]
        self.m = [np.zeros_like(p) for p in self.p]
        self.v = [np.zeros_like(p) for p in self.p]
        self.vmax = [np.zeros_like(p) for p in self.p]
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.decoupled, self.amsgrad, self.maximize = decoupled, amsgrad, maximize
        self.t = 0

    def step(self, grads, dtype):
        self.t += 1
        lr, b1, b2, eps, wd, t = self.lr, self.b1, self.b2, self.eps, self.wd, self.t
        for i, g in enumerate(grads):
            g = -np.asarray(g, np.float64) if self.maximize else np.asarray(g, np.float64)
            p = self.p[i]
            if self.decoupled:
                p = p * (1 - lr * wd)
            elif wd:
                g = g + wd * p
            self.m[i] = as_dtype(self.m[i] * b1 + (1 - b1) * g, dtype)
            self.v[i] = as_dtype(self.v[i] * b2 + (1 - b2) * g * g, dtype)
            v = self.v[i]
            if self.amsgrad:
                self.vmax[i] = v = np.maximum(self.vmax[i], v)
            denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps
            self.p[i] = as_dtype(p - lr / (1 - b1 ** t) * self.m[i] / denom, dtype)


def check(got, ref, dtype, what):
    got = np.asarray(got).astype(np.float64)
    scale = np.abs(ref).max(initial=0)
    np.testing.assert_allclose(got, ref, rtol=RTOL[np.dtype(dtype)], atol=RTOL[np.dtype(dtype)] * scale + 1e-30,
                               err_msg=what)


@SETTINGS
@given(SHAPES, st.sampled_from([np.float32, BF16]), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([0.0, 0.05]), st.integers(0, 2**16))
def test_adam_steps_follow_torch(shapes, dtype, decoupled, amsgrad, maximize, wd, seed):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    states = [[np.zeros(s, dtype) for s in shapes] for _ in range(3)]
    ref = TorchAdam(params, 1e-2, (0.9, 0.999), 1e-8, wd, decoupled, amsgrad, maximize)
    step = adamw_step if decoupled else adam_step
    kernel = step.kernel(len(shapes), amsgrad=amsgrad, maximize=maximize, weight_decay=wd != 0)
    programs = None
    for t in range(1, 4):
        lr = 1e-2 * t  # a schedule: hyper changes, the program does not
        ref.lr = lr
        grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
        lists = params + grads + states[0] + states[1] + (states[2] if amsgrad else [])
        step(*lists, hyper=adam_hyper(lr, 0.9, 0.999, 1e-8, wd, t, decoupled=decoupled),
             amsgrad=amsgrad, maximize=maximize, weight_decay=wd != 0)
        ref.step(grads, dtype)
        if programs is None:
            programs = len(kernel._programs)
        assert len(kernel._programs) == programs  # hyper-parameters are data: no retrace
        for i in range(len(shapes)):
            check(params[i], ref.p[i], dtype, f"param{i} step {t}")
            check(states[0][i], ref.m[i], dtype, f"exp_avg{i} step {t}")
            check(states[1][i], ref.v[i], dtype, f"exp_avg_sq{i} step {t}")
            if amsgrad:
                check(states[2][i], ref.vmax[i], dtype, f"max_exp_avg_sq{i} step {t}")


def sgd_ref(params, bufs, grads, lr, momentum, dampening, wd, nesterov, maximize, first, dtype):
    out_p, out_b = [], []
    for p, b, g in zip(params, bufs, grads):
        d = -g if maximize else g
        if wd:
            d = d + wd * p
        if momentum:
            b = d.copy() if first else b * momentum + (1 - dampening) * d
            b = as_dtype(b, dtype)
            d = d + momentum * b if nesterov else b
        out_p.append(as_dtype(p - lr * d, dtype))
        out_b.append(b)
    return out_p, out_b


@SETTINGS
@given(SHAPES, st.sampled_from([np.float32, BF16, np.float16]), st.sampled_from([0.0, 0.9]),
       st.sampled_from([0.0, 0.3]), st.sampled_from([0.0, 0.01]), st.booleans(), st.booleans(),
       st.integers(0, 2**16))
def test_sgd_steps_follow_torch(shapes, dtype, momentum, dampening, wd, nesterov, maximize, seed):
    nesterov = nesterov and momentum > 0 and dampening == 0  # torch's requirement
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    bufs = [np.zeros(s, dtype) for s in shapes]
    ref_p = [p.astype(np.float64) for p in params]
    ref_b = [b.astype(np.float64) for b in bufs]
    for t in range(3):
        grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
        lists = params + grads + (bufs if momentum else [])
        sgd_step(*lists, hyper=sgd_hyper(0.1, momentum, dampening, wd, first_step=t == 0), momentum=momentum > 0,
                 nesterov=nesterov, maximize=maximize, weight_decay=wd != 0)
        ref_p, ref_b = sgd_ref(ref_p, ref_b, [g.astype(np.float64) for g in grads], 0.1, momentum, dampening, wd,
                               nesterov, maximize, t == 0, dtype)
        for i in range(len(shapes)):
            check(params[i], ref_p[i], dtype, f"param{i} step {t}")
            if momentum:
                check(bufs[i], ref_b[i], dtype, f"buf{i} step {t}")


def test_large_tensor_split_over_chunks_and_many_small_ones_packed():
    rng = np.random.default_rng(7)
    shapes = [(128 * 1500 + 77,)] + [(3, 5)] * 40 + [(256,)]
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    m = [np.zeros(s, np.float32) for s in shapes]
    v = [np.zeros(s, np.float32) for s in shapes]
    ref = TorchAdam(params, 1e-3, (0.9, 0.99), 1e-6, 0.1, True, False, False)
    for t in (1, 2):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        adamw_step(*params, *grads, *m, *v, hyper=adam_hyper(1e-3, 0.9, 0.99, 1e-6, 0.1, t), cols=512)
        ref.step(grads, np.float32)
    for i in range(len(shapes)):
        check(params[i], ref.p[i], np.float32, f"param{i}")
        check(v[i], ref.v[i], np.float32, f"exp_avg_sq{i}")


def test_parameters_of_different_dtypes_in_one_launch():
    rng = np.random.default_rng(8)
    dtypes = [np.float32, BF16, np.float16, BF16]
    shapes = [(300,), (200, 3), (5, 7), (1000,)]
    params = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
    m = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    v = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    refs = [TorchAdam([p], 1e-2, (0.9, 0.999), 1e-8, 0.01, True, False, False) for p in params]
    for t in (1, 2):
        grads = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        adamw_step(*params, *grads, *m, *v, hyper=adam_hyper(1e-2, 0.9, 0.999, 1e-8, 0.01, t))
        for ref, g, d in zip(refs, grads, dtypes):
            ref.step([g], d)
    for p, ref, d in zip(params, refs, dtypes):
        assert p.dtype == d
        check(p, ref.p[0], d, str(np.dtype(d)))


def test_kernel_arguments_are_updated_in_place():
    k = adamw_step.kernel(2)
    specs = [TensorSpec((4, 4), nl.float32)] * 8 + [TensorSpec((len(ADAM_FIELDS),), nl.float32)]
    prog = k.trace(*specs)
    roles = {a.name: a.role for a in prog.args}
    assert roles["param0"] == roles["exp_avg1"] == roles["exp_avg_sq0"] == "inout"
    assert roles["grad0"] == roles["hyper"] == "in"
    assert adamw_step.lists(amsgrad=True) == ("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def test_errors():
    with pytest.raises(KernelError, match="do not split into the lists"):
        adamw_step.trace(*[TensorSpec((4,), nl.float32)] * 3, hyper=TensorSpec((len(ADAM_FIELDS),), nl.float32))
    with pytest.raises(KernelError, match=r"hyper must be a float32 \[10\] tensor"):
        adamw_step.trace(*[TensorSpec((4,), nl.float32)] * 4, hyper=TensorSpec((3,), nl.float32))
    with pytest.raises(KernelError, match="grad0 shape"):
        sgd_step.trace(TensorSpec((4,), nl.float32), TensorSpec((5,), nl.float32), hyper=TensorSpec((5,), nl.float32))
    with pytest.raises(KernelError, match="nesterov needs momentum"):
        sgd_step.trace(*[TensorSpec((4,), nl.float32)] * 2, hyper=TensorSpec((5,), nl.float32), nesterov=True)
    with pytest.raises(KernelError, match="unknown options"):
        sgd_step.kernel(1, amsgrad=True)
    with pytest.raises(ValueError, match="step is 0"):
        adam_hyper(1e-3, 0.9, 0.999, 1e-8, 0.0, 0)
