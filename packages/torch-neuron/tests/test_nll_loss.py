"""nll_loss / cross_entropy on neuron against PyTorch CPU through the one-program kernels: forward values and
total_weight, backward through autograd, [N, C], [C] and [N, C, d1, d2] inputs, class weights, ignore_index
(targets equal to it, every entry ignored), the three reductions, float32/bfloat16/float16, out-of-range,
negative and non-int32 targets (IndexError), and one device program per call."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DEV = "neuron"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# the tolerances of test_nn.py's nll_loss / cross_entropy tests
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
GRAD_TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (4e-2, 4e-2), torch.float16: (4e-3, 4e-3)}
EXACTISH = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}
REDUCTIONS = ("none", "mean", "sum")
SET = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def close(dev, ref, tol, dtype):
    assert dev.device.type == DEV and dev.dtype == ref.dtype and dev.shape == ref.shape, (dev, ref)
    rtol, atol = tol[dtype]
    torch.testing.assert_close(dev.cpu(), ref, rtol=rtol, atol=atol, equal_nan=True)


@st.composite
def problems(draw):
    n = draw(st.integers(1, 300))
    c = draw(st.sampled_from([1, 2, 7, 128, 129, 1000, 3000]))
    dtype = draw(st.sampled_from(FLOATS))
    weighted = draw(st.booleans())
    reduction = draw(st.sampled_from(REDUCTIONS))
    ii = draw(st.sampled_from([-100, 0, 3, 2**31 - 1]))
    ignored = draw(st.sampled_from([0.0, 0.25, 1.0]))
    return n, c, dtype, weighted, reduction, ii, ignored, draw(st.integers(0, 2**16))


def _inputs(shape, tshape, dtype, weighted, ii, ignored, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(shape, generator=g) * 3, 1).to(dtype)
    t = torch.randint(0, shape[1], tshape, generator=g)
    t[torch.rand(tshape, generator=g) < ignored] = ii
    w = (torch.rand(shape[1], generator=g) + 0.5).to(dtype) if weighted else None
    return lp, t, w


def _forward_ref(lp, t, w, reduction, ii):
    """torch CPU; 16-bit sums as torch computes them in float32, rounded once (torch's CPU kernel sums a
    16-bit loss in the dtype, one rounding per term; test_nn.test_nll_loss_16_bit_sums_in_fp32)."""
    if lp.dtype == torch.float32 or reduction == "none":
        return F.nll_loss(lp, t, w, ignore_index=ii, reduction=reduction)
    wf = None if w is None else w.float()
    return F.nll_loss(lp.float(), t, wf, ignore_index=ii, reduction=reduction).to(lp.dtype)


def _check_grads(lp, t, w, reduction, ii, seed):
    """Forward and the gradient of lp through autograd, neuron against CPU."""
    dtype = lp.dtype
    lc, ld = lp.clone().requires_grad_(), lp.to(DEV).requires_grad_()
    wd = None if w is None else w.to(DEV)
    out_c = F.nll_loss(lc, t, w, ignore_index=ii, reduction=reduction)
    torch.neuron.reset_metrics()
    out_d = F.nll_loss(ld, t.to(DEV), wd, ignore_index=ii, reduction=reduction)
    close(out_d, _forward_ref(lp, t, w, reduction, ii), TOL if reduction == "none" else EXACTISH, dtype)
    g = torch.randn(out_c.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    out_c.backward(g)
    out_d.backward(g.to(DEV))
    assert not torch.neuron.metrics()["fallback"], torch.neuron.metrics()["fallback"]  # every op native
    close(ld.grad, lc.grad, GRAD_TOL, dtype)


@SET
@given(problems())
def test_nll_loss_matches_cpu(prob):
    n, c, dtype, weighted, reduction, ii, ignored, seed = prob
    lp, t, w = _inputs((n, c), (n,), dtype, weighted, ii, ignored, seed)
    _check_grads(lp, t, w, reduction, ii, seed)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_total_weight_ops(dtype, reduction):
    """aten.nll_loss_forward's (loss, total_weight) and nll_loss_backward given it, weighted, as torch."""
    red = REDUCTIONS.index(reduction)
    lp, t, w = _inputs((150, 11), (150,), dtype, True, 4, 0.2, 7)
    got = torch.ops.aten.nll_loss_forward(lp.to(DEV), t.to(DEV), w.to(DEV), red, 4)
    ref = torch.ops.aten.nll_loss_forward(lp, t, w, red, 4)
    close(got[0], _forward_ref(lp, t, w, reduction, 4), TOL if reduction == "none" else EXACTISH, dtype)
    close(got[1], ref[1] if reduction == "none" else (w.float()[t.clamp(0)] * (t != 4)).sum().to(dtype), EXACTISH,
          dtype)
    g = torch.randn(ref[0].shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    close(torch.ops.aten.nll_loss_backward(g.to(DEV), lp.to(DEV), t.to(DEV), w.to(DEV), red, 4, ref[1].to(DEV)),
          torch.ops.aten.nll_loss_backward(g, lp, t, w, red, 4, ref[1]), GRAD_TOL, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_one_dim_input(reduction, weighted):
    lp, _, w = _inputs((1, 9), (1,), torch.float32, weighted, -100, 0.0, 2)
    for target in (torch.tensor(4), torch.tensor(-100)):
        got = torch.ops.aten.nll_loss_forward(lp[0].to(DEV), target.to(DEV), None if w is None else w.to(DEV),
                                              REDUCTIONS.index(reduction), -100)
        ref = torch.ops.aten.nll_loss_forward(lp[0], target, w, REDUCTIONS.index(reduction), -100)
        close(got[0], ref[0], TOL, torch.float32)
        close(got[1], ref[1], TOL, torch.float32)
        _check_grads(lp[0], target, w, reduction, -100, 3)


@pytest.mark.parametrize("shape", [(2, 5, 3, 4), (3, 4, 130), (1, 6, 20, 20)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_images(shape, reduction):
    lp, t, w = _inputs(shape, shape[:1] + shape[2:], torch.float32, True, -100, 0.2, 5)
    _check_grads(lp, t, w, reduction, -100, 4)
    _check_grads(lp, t.masked_fill(t == -100, 1), None, reduction, 1, 4)  # ignore_index a class


@pytest.mark.parametrize("dtype", FLOATS)
def test_all_ignored(dtype):
    lp, _, _ = _inputs((5, 4), (5,), dtype, False, -100, 0.0, 0)
    lp[:, 0] = float("nan")  # ignored entries must not read it into the loss
    t = torch.full((5,), -100)
    for reduction in REDUCTIONS:
        _check_grads(lp, t, None, reduction, -100, 1)  # "mean": nan loss, zero gradient


@pytest.mark.parametrize("bad", [7, -1, 2**31, 2**32 + 1, -(2**40), 2**32 - 100, 2**63 - 1])
@pytest.mark.parametrize("shape", [(130, 7), (2, 7, 3)])
def test_out_of_range_targets_raise(bad, shape):
    lp, t, _ = _inputs(shape, shape[:1] + shape[2:], torch.float32, False, -100, 0.2, 6)
    t.view(-1)[-1] = bad
    ld, td = lp.to(DEV), t.to(DEV)
    with pytest.raises(IndexError):
        F.nll_loss(ld, td)
    g = torch.tensor(1.0).to(DEV)
    with pytest.raises(IndexError):
        torch.ops.aten.nll_loss_backward(g, ld, td, None, 1, -100, g) if len(shape) == 2 else \
            torch.ops.aten.nll_loss2d_backward(g, ld.unsqueeze(-1), td.unsqueeze(-1), None, 1, -100, g)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_one_program_each(reduction):
    """The forward and the backward are one device program each (the GPT's cross_entropy shape)."""
    lp = torch.log_softmax(torch.randn(512, 128), 1).to(DEV).requires_grad_()
    t = torch.randint(0, 128, (512,)).to(DEV)
    g = torch.ones(512 if reduction == "none" else ()).to(DEV)
    torch.neuron.reset_metrics()
    loss = F.nll_loss(lp, t, reduction=reduction)
    fwd = dict(torch.neuron.metrics()["programs"])
    loss.backward(g)
    bwd = {k: v - fwd.get(k, 0) for k, v in torch.neuron.metrics()["programs"].items() if v != fwd.get(k, 0)}
    assert fwd == {"nll_loss_forward": 1} and bwd == {"nll_loss_backward": 1}, (fwd, bwd)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("extra", [{}, {"weight": True}, {"label_smoothing": 0.1}])
@pytest.mark.parametrize("shape", [(0, 5), (0, 5, 3), (2, 5, 0), (0, 5, 0, 2)])
def test_empty_batch_matches_cpu(reduction, dtype, extra, shape):
    """N = 0 (an empty micro-batch) or an empty spatial dim: mean is NaN, sum 0 and none empty, as on the CPU,
    and backward gives an empty gradient; the empty logits reach the device program without an address error
    (and the kernel's tiling of no entries has no tiles)."""
    kw = {"reduction": reduction, **extra}
    logits, target = torch.randn(shape, dtype=dtype), torch.zeros(shape[:1] + shape[2:], dtype=torch.long)
    if kw.get("weight"):
        kw["weight"] = torch.rand(5, dtype=dtype)
    dev_kw = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    x = logits.to(DEV).requires_grad_()
    got = F.cross_entropy(x, target.to(DEV), **dev_kw)
    close(got, F.cross_entropy(logits, target, **kw), TOL, dtype)
    close(F.nll_loss(x.log_softmax(1), target.to(DEV), **{k: v for k, v in dev_kw.items() if k != "label_smoothing"}),
          F.nll_loss(logits.log_softmax(1), target, **{k: v for k, v in kw.items() if k != "label_smoothing"}),
          TOL, dtype)
    got.sum().backward()
    assert x.grad.shape == shape and x.grad.device.type == DEV
