"""NN ops on neuron against PyTorch CPU: softmax/log_softmax (+ backward), layer/rms/group/batch norm,
nll_loss / cross_entropy, mse/smooth_l1/huber/binary_cross_entropy, embedding — forward values and dtypes,
autograd gradients, edge cases — and a small transformer block whose forward and backward use them."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

DEV = "neuron"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
GRAD_TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (4e-2, 4e-2), torch.float16: (4e-3, 4e-3)}
# aten ops this change runs natively; a call of one of them must never take the CPU fallback
NATIVE = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
          "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward", "native_group_norm",
          "native_group_norm_backward", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
          "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward",
          "huber_loss", "huber_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
          "embedding", "embedding_dense_backward", "sum",
          "mean", "amax", "var_mean", "native_dropout", "native_dropout_backward", "native_batch_norm",
          "native_batch_norm_backward"}


@contextlib.contextmanager
def none_of_ours_falls_back():
    torch.neuron.reset_metrics()
    yield
    ours = {op for op in torch.neuron.metrics()["fallback"] if op.split(".")[0] in NATIVE}
    assert not ours, f"fell back to the CPU: {ours}"


def check(dev, ref, dtype=torch.float32, tol=TOL):
    if isinstance(ref, tuple | list):
        for a, b in zip(dev, ref, strict=True):
            check(a, b, dtype, tol)
        return
    if ref is None:
        assert dev is None
        return
    assert dev.device.type == DEV and dev.dtype == ref.dtype and dev.shape == ref.shape, (dev, ref)
    rtol, atol = tol[dtype]
    torch.testing.assert_close(dev.cpu(), ref, rtol=rtol, atol=atol, equal_nan=True)


def data(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def both(x: torch.Tensor):
    """(CPU leaf, neuron leaf) with the same values, both requiring grad."""
    return x.clone().requires_grad_(), x.to(DEV).requires_grad_()


def grads_match(fn, inputs, dtype=torch.float32, seed=1):
    """fn's output and the gradients of every input agree between CPU and neuron."""
    pairs = [both(t) if t is not None else (None, None) for t in inputs]
    out_c = fn(*[c for c, _ in pairs])
    with none_of_ours_falls_back():
        out_d = fn(*[d for _, d in pairs])
        g = data(out_c.shape, out_c.dtype, seed)
        out_d.backward(g.to(DEV))
    out_c.backward(g)
    check(out_d, out_c.detach(), dtype)
    for c, d in pairs:
        if c is not None:
            check(d.grad, c.grad, dtype, GRAD_TOL)


# -- softmax ------------------------------------------------------------------------------------
@st.composite
def shape_dim(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
    return shape, draw(st.integers(-len(shape), len(shape) - 1))


@pytest.mark.parametrize("log", [False, True])
@settings(max_examples=15, deadline=None)
@given(case=shape_dim(), dtype=st.sampled_from(FLOATS))
def test_softmax_forward_and_backward(log, case, dtype):
    shape, dim = case
    fn = (lambda x: torch.log_softmax(x, dim)) if log else (lambda x: torch.softmax(x, dim))
    grads_match(fn, [data(shape, dtype, seed=len(shape), scale=3)], dtype)


@pytest.mark.parametrize("shape, dim", [((5, 2000), 1), ((300, 33), 0), ((2, 700, 3), 1)])
def test_softmax_longer_rows(shape, dim):
    grads_match(lambda x: torch.softmax(x, dim), [data(shape, scale=4)])
    grads_match(lambda x: torch.log_softmax(x, dim), [data(shape, scale=4)])


def test_softmax_specials_zero_dim_empty_and_strides():
    x = torch.tensor([[0.0, -math.inf, 1.0], [math.inf, 0.0, 1.0], [-math.inf] * 3, [math.nan, 0.0, 1.0]])
    xd = x.to(DEV)
    check(torch.softmax(xd, 1), torch.softmax(x, 1))
    check(torch.log_softmax(xd, 1), torch.log_softmax(x, 1))
    s = torch.tensor(1.5)
    check(torch.softmax(s.to(DEV), 0), torch.softmax(s, 0))
    check(torch.log_softmax(s.to(DEV), -1), torch.log_softmax(s, -1))
    e = torch.empty(0, 4)
    check(torch.softmax(e.to(DEV), 1), torch.softmax(e, 1))
    y = data((6, 5))
    check(torch.softmax(y.to(DEV).t(), 0), torch.softmax(y.t(), 0))


def test_softmax_dtype_argument_and_half_to_float():
    x = data((4, 7), torch.bfloat16)
    xd = x.to(DEV)
    with none_of_ours_falls_back():
        got = (torch.softmax(xd, -1, dtype=torch.float32), torch.ops.aten._softmax(xd, 1, True),
               torch.ops.aten._log_softmax(xd, 1, True))
    check(got[0], torch.softmax(x, -1, dtype=torch.float32))
    check(got[1:], (torch.softmax(x.float(), 1), torch.log_softmax(x.float(), 1)))
    g, y = data((4, 7)), torch.softmax(x.float(), 1)
    back = torch.ops.aten._softmax_backward_data(g.to(DEV), y.to(DEV), 1, torch.bfloat16)
    check(back, torch.ops.aten._softmax_backward_data(g, y, 1, torch.float32).bfloat16(), torch.bfloat16)


def test_softmax_out_variants():
    x = data((3, 5))
    out = torch.empty(0, device=DEV)
    torch.ops.aten._softmax.out(x.to(DEV), 1, False, out=out)
    check(out, torch.softmax(x, 1))
    out = torch.empty(0, device=DEV)
    torch.log_softmax(x.to(DEV), 0, out=out)
    check(out, torch.log_softmax(x, 0))


def test_softmax_float64_takes_the_cpu_path():
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.neuron.reset_metrics()
    check(torch.softmax(x.to(DEV), 1), torch.softmax(x, 1), tol={torch.float32: (0, 0)})
    assert "_softmax" in torch.neuron.metrics()["fallback"]


# -- layer norm / rms norm / group norm ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, normalized, affine", [((4, 16), (16,), True), ((2, 3, 40), (40,), False),
                                                       ((2, 3, 5), (3, 5), True), ((3, 700), (700,), True)])
def test_layer_norm(dtype, shape, normalized, affine):
    x = data(shape, dtype, scale=2) + 3
    w = data(normalized, dtype, seed=2) if affine else None
    b = data(normalized, dtype, seed=3) if affine else None
    with none_of_ours_falls_back():
        got = torch.native_layer_norm(x.to(DEV), normalized, w if w is None else w.to(DEV),
                                      b if b is None else b.to(DEV), 1e-5)
    check(got, torch.native_layer_norm(x, normalized, w, b, 1e-5), dtype)
    grads_match(lambda x, w, b: F.layer_norm(x, normalized, w, b), [x, w, b], dtype)


def test_layer_norm_mixed_dtype_statistics_are_float32():
    x, w, b = data((3, 8), torch.bfloat16), data((8,), seed=1), data((8,), seed=2)
    got = torch.native_layer_norm(x.to(DEV), [8], w.to(DEV), b.to(DEV), 1e-5)
    ref = torch.native_layer_norm(x, [8], w, b, 1e-5)
    assert [t.dtype for t in got] == [t.dtype for t in ref] == [torch.bfloat16, torch.float32, torch.float32]
    check(got, ref, torch.bfloat16)


def test_layer_norm_empty_and_module():
    e = torch.empty(0, 6)
    check(torch.native_layer_norm(e.to(DEV), [6], None, None, 1e-5), torch.native_layer_norm(e, [6], None, None, 1e-5))
    m = nn.LayerNorm(12)
    md = nn.LayerNorm(12).to(DEV)
    md.load_state_dict(m.state_dict())
    x = data((5, 12))
    check(md(x.to(DEV)), m(x).detach())


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, normalized, affine, eps", [((4, 32), (32,), True, 1e-6),
                                                            ((2, 3, 8), (3, 8), False, None),
                                                            ((6, 300), (300,), True, None)])
def test_rms_norm(dtype, shape, normalized, affine, eps):
    x = data(shape, dtype, scale=2)
    w = data(normalized, dtype, seed=2) if affine else None
    torch.neuron.reset_metrics()
    grads_match(lambda x, w: F.rms_norm(x, normalized, w, eps), [x, w], dtype)
    native = torch.neuron.metrics()["native"]
    assert native.get("_fused_rms_norm") and native.get("_fused_rms_norm_backward"), native


def test_rms_norm_outputs_like_cpu():
    x, w = data((3, 10), torch.bfloat16), data((10,), torch.bfloat16, seed=1)
    check(torch._fused_rms_norm(x.to(DEV), [10], w.to(DEV), 1e-5), torch._fused_rms_norm(x, [10], w, 1e-5),
          torch.bfloat16)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, groups, affine", [((2, 6, 5), 3, True), ((3, 4, 2, 3), 2, False),
                                                   ((1, 8, 70), 1, True), ((2, 256, 3), 2, True)])
def test_group_norm(dtype, shape, groups, affine):
    x = data(shape, dtype, scale=2) - 1
    c = shape[1]
    w = data((c,), dtype, seed=2) if affine else None
    b = data((c,), dtype, seed=3) if affine else None
    hw = math.prod(shape[2:])
    with none_of_ours_falls_back():
        got = torch.native_group_norm(x.to(DEV), w if w is None else w.to(DEV), b if b is None else b.to(DEV),
                                      shape[0], c, hw, groups, 1e-5)
    check(got, torch.native_group_norm(x, w, b, shape[0], c, hw, groups, 1e-5), dtype)
    grads_match(lambda x, w, b: F.group_norm(x, groups, w, b), [x, w, b], dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e20])
@pytest.mark.parametrize("shape, groups, at", [((2, 4, 3), 2, (1, 0, 0)), ((3, 6, 5), 3, (0, 5, 4))])
def test_group_norm_inf_stays_in_its_group(dtype, bad, shape, groups, at):
    """One non-finite (or overflowing) input makes only its own group non-finite, forward and backward, as on
    the CPU (the group sums once went through a 0/1 matmul: 0 * inf = NaN in every sample and group)."""
    x = data(shape, dtype, scale=2) - 1
    x[at] = bad
    c = shape[1]
    grads_match(lambda x, w, b: F.group_norm(x, groups, w, b), [x, data((c,), dtype, 2), data((c,), dtype, 3)], dtype)


@pytest.mark.parametrize("dtype, pdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                           (torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(dtype, pdtype, training):
    x = data((4, 3, 5, 2), dtype, scale=2) + 1
    w, b = (data((3,), seed=2) * 0.2 + 1).to(pdtype), data((3,), seed=3).to(pdtype)
    rm, rv = data((3,), seed=4).to(pdtype) * 0.1, (data((3,), seed=5).abs() + 0.5).to(pdtype)
    rmd, rvd = rm.to(DEV), rv.to(DEV)
    ref = torch.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    with none_of_ours_falls_back():
        got = torch.native_batch_norm(x.to(DEV), w.to(DEV), b.to(DEV), rmd, rvd, training, 0.1, 1e-5)
    check(got, ref, dtype)
    check((rmd, rvd), (rm, rv), dtype)  # running statistics updated in place (training) or untouched
    grads_match(lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b, training), [x, w, b], dtype)


# the tolerances of PyTorch's test_compare_cpu for 16-bit results
EXACTISH = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 5, 5), (3, 2, 3, 4), (2, 4)])
def test_batch_norm_16_bit_rounds_its_statistics_like_cpu(dtype, shape):
    # torch's CPU kernel stores mean / invstd in the 16-bit parameter dtype and normalizes with the rounded
    # values; outputs near zero (x close to the mean) then differ from an fp32 normalization by ~1e-2
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(shape, generator=g) * 17 - 8.5).to(dtype)
    c = shape[1]
    w, b = (torch.rand(c, generator=g) * 17 - 8.5).to(dtype), (torch.rand(c, generator=g) * 17 - 8.5).to(dtype)
    rm, rv = torch.rand(c, generator=g).to(dtype), (torch.rand(c, generator=g) + 0.5).to(dtype)
    rmd, rvd = rm.to(DEV), rv.to(DEV)
    ref = torch.native_batch_norm(x, w, b, rm, rv, True, 0.3, 1e-5)
    with none_of_ours_falls_back():
        got = torch.native_batch_norm(x.to(DEV), w.to(DEV), b.to(DEV), rmd, rvd, True, 0.3, 1e-5)
    check(got, ref, dtype, EXACTISH)
    check((rmd, rvd), (rm, rv), dtype, EXACTISH)  # the running statistics' rounding points too


def test_batch_and_instance_norm_modules():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.BatchNorm1d(6), nn.Unflatten(1, (2, 3)), nn.InstanceNorm1d(2, affine=True))
    dev = nn.Sequential(nn.BatchNorm1d(6), nn.Unflatten(1, (2, 3)), nn.InstanceNorm1d(2, affine=True)).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x = data((8, 6))
    for train in (True, False):
        cpu.train(train)
        dev.train(train)
        check(dev(x.to(DEV)), cpu(x).detach())
    for (name, a), b in zip(dev.state_dict().items(), cpu.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b, msg=name)


# -- losses -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy(dtype, reduction, weighted):
    x = data((9, 13), dtype, scale=3)
    t = torch.tensor([0, 12, 5, -100, 7, 7, 1, -100, 3])
    w = (torch.rand(13, generator=torch.Generator().manual_seed(4)) + 0.5).to(dtype) if weighted else None
    xc, xd = both(x)
    ref = F.cross_entropy(xc, t, w, reduction=reduction)
    with none_of_ours_falls_back():
        got = F.cross_entropy(xd, t.to(DEV), None if w is None else w.to(DEV), reduction=reduction)
        g = data(ref.shape, dtype, seed=5)
        got.backward(g.to(DEV))
    ref.backward(g)
    check(got, ref.detach(), dtype)
    check(xd.grad, xc.grad, dtype, GRAD_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_log_softmax_16_bit_is_fp32_rounded_once(dtype):
    # torch's CPU kernel rounds the row's sum of exps and its log to the dtype on the last dim (an output near
    # 0 then differs by ~4e-3); the device computes in fp32 and rounds once, as torch does on other dims
    x = data((40, 7), dtype, scale=5)
    x[0] = torch.tensor([-8.5, -1.77, -4.31, -2.41, 8.375, 1.82, 2.33])
    for dim in (-1, 0):
        with none_of_ours_falls_back():
            got = torch.log_softmax(x.to(DEV), dim)
        check(got, torch.log_softmax(x.float(), dim).to(dtype), dtype, EXACTISH)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nll_loss_16_bit_sums_in_fp32(dtype, reduction):
    # torch's CPU kernel sums a 16-bit loss in the dtype, one rounding per term; the device sums in fp32 and
    # rounds once: the float32 computation rounded to the dtype (the op_db harness accepts that too)
    x = data((2, 3, 2, 2), dtype, scale=5)
    t = torch.tensor([[[2, 0], [1, 0]], [[0, 0], [2, 2]]])
    with none_of_ours_falls_back():
        got = F.nll_loss(x.to(DEV), t.to(DEV), reduction=reduction)
    check(got, F.nll_loss(x.float(), t, reduction=reduction).to(dtype), dtype, EXACTISH)


def test_nll_loss_ops_and_total_weight():
    lp = torch.log_softmax(data((6, 4)), 1)
    t = torch.tensor([3, 1, 2, 2, 0, 1])
    w = torch.tensor([0.5, 1.0, 2.0, 0.25])
    for red in (0, 1, 2):
        for ig in (-100, 2):
            got = torch.ops.aten.nll_loss_forward(lp.to(DEV), t.to(DEV), w.to(DEV), red, ig)
            ref = torch.ops.aten.nll_loss_forward(lp, t, w, red, ig)
            check(got, ref)
            g = data(ref[0].shape, seed=2)
            check(torch.ops.aten.nll_loss_backward(g.to(DEV), lp.to(DEV), t.to(DEV), w.to(DEV), red, ig,
                                                   ref[1].to(DEV)),
                  torch.ops.aten.nll_loss_backward(g, lp, t, w, red, ig, ref[1]))


def test_nll_loss_one_dim_input_and_all_ignored():
    lp = torch.log_softmax(data((5,)), 0)
    check(F.nll_loss(lp.to(DEV), torch.tensor(3).to(DEV)), F.nll_loss(lp, torch.tensor(3)))
    x = torch.log_softmax(data((3, 4)), 1)
    t = torch.full((3,), -100)
    check(F.nll_loss(x.to(DEV), t.to(DEV)), F.nll_loss(x, t))  # nan: nothing to average
    x[0, 0] = math.nan  # an ignored row's class-0 entry must not leak into the loss
    t = torch.tensor([-100, 1, 2])
    check(F.nll_loss(x.to(DEV), t.to(DEV), reduction="sum"), F.nll_loss(x, t, reduction="sum"))


def test_cross_entropy_images_and_label_smoothing():
    x = data((2, 5, 3, 4), scale=2)
    t = torch.randint(0, 5, (2, 3, 4), generator=torch.Generator().manual_seed(0))
    t[0, 1, 2] = -100
    grads_match(lambda x: F.cross_entropy(x, t.to(x.device)), [x])
    y = data((7, 6))
    ty = torch.tensor([0, 1, 2, 3, 4, 5, 0])
    grads_match(lambda y: F.cross_entropy(y, ty.to(y.device), label_smoothing=0.1), [y])


@pytest.mark.parametrize("bad", [7, -1, 2**32 + 1, -(2**40)])
def test_out_of_range_targets_raise(bad):
    x = torch.log_softmax(data((3, 7)), 1).to(DEV)
    t = torch.tensor([1, bad, 2]).to(DEV)
    with pytest.raises(IndexError):
        F.nll_loss(x, t)


ELEMENTWISE_LOSSES = {
    "mse": lambda a, b, r: F.mse_loss(a, b, reduction=r),
    "smooth_l1": lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.5),
    "smooth_l1_beta0": lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.0),
    "huber": lambda a, b, r: F.huber_loss(a, b, reduction=r, delta=0.7),
    "bce": lambda a, b, r: F.binary_cross_entropy(a, b, reduction=r),
}
IN_UNIT_INTERVAL = {"bce"}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE_LOSSES))
def test_elementwise_losses(dtype, reduction, name):
    a, b = data((5, 6), dtype), data((5, 6), dtype, seed=1)
    b[0, :2] = a[0, :2]  # zero differences: the branch points of the backward
    if name in IN_UNIT_INTERVAL:
        a, b = torch.sigmoid(a), torch.sigmoid(b)
    fn = ELEMENTWISE_LOSSES[name]
    grads_match(lambda a, b: fn(a, b, reduction), [a, b], dtype)


def test_binary_cross_entropy_weights_edges_and_range_check():
    p = torch.tensor([[0.0, 1.0, 0.5], [0.25, 1e-30, 1.0 - 1e-7]])
    t = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 1.0]])  # log(0) clamps at -100
    w = torch.tensor([2.0, 0.5, 1.0])
    grads_match(lambda p: F.binary_cross_entropy(p, t.to(p.device), w.to(p.device)), [p])
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(torch.tensor([1.5]).to(DEV), torch.tensor([1.0]).to(DEV))
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(torch.tensor([math.nan]).to(DEV), torch.tensor([1.0]).to(DEV))


# -- embedding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_forward_backward(dtype, index_dtype):
    w = data((11, 6), dtype)
    idx = torch.tensor([[1, 10, 0, 3], [3, 3, 7, 1]], dtype=index_dtype)
    grads_match(lambda w: F.embedding(idx.to(w.device), w), [w], dtype)
    grads_match(lambda w: F.embedding(idx.to(w.device), w, padding_idx=3), [w], dtype)
    grads_match(lambda w: F.embedding(idx.to(w.device), w, scale_grad_by_freq=True), [w], dtype)


def test_embedding_many_rows_and_empty_indices():
    w = data((300, 40))
    idx = torch.randint(0, 300, (5, 77), generator=torch.Generator().manual_seed(3))
    grads_match(lambda w: F.embedding(idx.to(w.device), w), [w])
    e = torch.empty(0, 3, dtype=torch.int64)
    check(F.embedding(e.to(DEV), w.to(DEV)), F.embedding(e, w))


@pytest.mark.parametrize("bad, dtype", [(11, torch.int64), (-1, torch.int64), (2**31, torch.int64),
                                        (2**32 + 2, torch.int64), (-(2**62), torch.int64), (-1, torch.int32),
                                        (11, torch.int32)])
def test_embedding_out_of_range_raises(bad, dtype):
    w = data((11, 4)).to(DEV)
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([0, bad], dtype=dtype).to(DEV), w)


def test_out_variants_of_nn_ops():
    x, g, w = data((3, 4)), data((3, 4), seed=1), data((4,), seed=2)
    _, mean, rstd = torch.native_layer_norm(x, [4], w, None, 1e-5)
    outs = [torch.empty(0, device=DEV) for _ in range(3)]
    torch.ops.aten.native_layer_norm_backward.out(g.to(DEV), x.to(DEV), [4], mean.to(DEV), rstd.to(DEV), w.to(DEV),
                                                  None, [True, True, False], out0=outs[0], out1=outs[1], out2=outs[2])
    ref = torch.ops.aten.native_layer_norm_backward(g, x, [4], mean, rstd, w, None, [True, True, False])
    check(outs[:2], ref[:2])
    assert outs[2].numel() == 0  # not asked for: left alone
    loss, total = torch.empty(0, device=DEV), torch.empty(0, device=DEV)
    lp, t = torch.log_softmax(x, 1), torch.tensor([0, 3, 1])
    torch.ops.aten.nll_loss_forward.output(lp.to(DEV), t.to(DEV), None, 1, -100, output=loss, total_weight=total)
    check((loss, total), torch.ops.aten.nll_loss_forward(lp, t, None, 1, -100))
    out, table = torch.empty(0, device=DEV), data((4, 5), seed=3)
    torch.ops.aten.embedding.out(table.to(DEV), t.to(DEV), out=out)
    check(out, F.embedding(t, table))


def test_cpu_tensors_mixed_in_raise_torch_error():
    x = data((3, 4)).to(DEV)
    for call in (lambda: F.layer_norm(x, (4,), torch.ones(4)), lambda: F.embedding(torch.tensor([1]), x),
                 lambda: F.nll_loss(x, torch.tensor([0, 1, 2])), lambda: F.mse_loss(x, torch.zeros(3, 4)),
                 lambda: torch.ops.aten._softmax_backward_data(x, x.cpu(), 1, torch.float32)):
        with pytest.raises(RuntimeError, match="same device"):
            call()


# -- a transformer block -------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, vocab=17, d=16, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.RMSNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 2 * d), nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, tokens):
        x = self.emb(tokens)
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        x = x + F.dropout(self.fc(self.ln2(x)), 0.0, self.training) @ self.fc.weight * 0.1
        return F.log_softmax(self.out(x), -1)


def test_transformer_block_forward_backward_matches_cpu():
    torch.manual_seed(0)
    cpu = Block()
    dev = Block().to(DEV)
    dev.load_state_dict(cpu.state_dict())
    tokens = torch.randint(0, 17, (2, 5), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 17, (2, 5), generator=torch.Generator().manual_seed(2))
    loss_c = F.nll_loss(cpu(tokens).flatten(0, 1), targets.flatten())
    with none_of_ours_falls_back():
        loss_d = F.nll_loss(dev(tokens.to(DEV)).flatten(0, 1), targets.flatten().to(DEV))
        loss_d.backward()
    loss_c.backward()
    check(loss_d, loss_c.detach(), tol={torch.float32: (1e-4, 1e-5)})
    for (name, pc), (_, pd) in zip(cpu.named_parameters(), dev.named_parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, rtol=1e-3, atol=1e-5, msg=name)
