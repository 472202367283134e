"""torch.autocast("neuron"): CUDA's cast policy (PyTorch's own op lists, registered in csrc/Autocast.cpp) —
matmuls and convolutions in the autocast dtype, precision-sensitive ops (softmax, norms, losses, reductions,
exp/log) in float32, mixed-input ops promoted, everything else in its input dtype; values as the CPU gives
for the same casts; float32 gradients for float32 parameters."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

LOW = torch.bfloat16


def _inputs():
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    return a, b, a.to("neuron"), b.to("neuron")


LOWER_PRECISION = {  # CUDA's lower_precision_fp list
    "mm": lambda a, b: a @ b,
    "addmm": lambda a, b: torch.addmm(a, a, b),
    "bmm": lambda a, b: torch.bmm(a[None], b[None]),
    "baddbmm": lambda a, b: torch.baddbmm(a[None], a[None], b[None]),
    "linear": lambda a, b: F.linear(a, b, a[0]),
    "conv2d": lambda a, b: F.conv2d(a[None, None], b[None, None, :3, :3]),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], b[None]),
}
FP32 = {  # CUDA's fp32 and fp32_set_opt_dtype lists
    "softmax": lambda a, b: torch.softmax(a @ b, -1),
    "log_softmax": lambda a, b: torch.log_softmax(a @ b, -1),
    "exp": lambda a, b: torch.exp(a @ b),
    "sum": lambda a, b: torch.sum(a @ b),
    "cumsum": lambda a, b: torch.cumsum(a @ b, 0),
    "layer_norm": lambda a, b: F.layer_norm(a @ b, (8,)),
    "mse_loss": lambda a, b: F.mse_loss(a @ b, b),
    "cross_entropy": lambda a, b: F.cross_entropy(a @ b, torch.arange(8, device=a.device)),
}
PROMOTE = {"addcmul": lambda a, b: torch.addcmul(a, a @ b, b)}  # widest input dtype
UNLISTED = {"relu": lambda a, b: torch.relu(a @ b), "add": lambda a, b: (a @ b) + (a @ b)}  # input dtype


@pytest.mark.parametrize("table,expected", [(LOWER_PRECISION, LOW), (FP32, torch.float32),
                                            (PROMOTE, torch.float32), (UNLISTED, LOW)],
                         ids=["lower_precision", "fp32", "promote", "unlisted"])
def test_cast_policy(table, expected):
    _, _, a, b = _inputs()
    with torch.autocast("neuron", dtype=LOW):
        for name, fn in table.items():
            assert fn(a, b).dtype == expected, name


def test_autocast_is_per_device_and_can_be_disabled():
    _, _, a, b = _inputs()
    with torch.autocast("neuron", dtype=LOW):
        assert torch.is_autocast_enabled("neuron") and torch.neuron.is_autocast_enabled()
        assert torch.neuron.get_autocast_dtype() == LOW
        assert (a.cpu() @ b.cpu()).dtype == torch.float32  # CPU ops are not affected
        with torch.autocast("neuron", enabled=False):
            assert (a @ b).dtype == torch.float32
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", dtype=torch.float16):
        assert (a @ b).dtype == torch.float16
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]


def test_values_match_the_cpu_with_the_same_casts():
    a, b, da, db = _inputs()
    with torch.autocast("neuron", dtype=LOW):
        mm, sm = da @ db, torch.softmax(da @ db, -1)
    torch.testing.assert_close(mm.cpu(), a.to(LOW) @ b.to(LOW))
    torch.testing.assert_close(sm.cpu(), torch.softmax((a.to(LOW) @ b.to(LOW)).float(), -1))


def test_float32_parameters_get_float32_grads():
    a, _, da, _ = _inputs()
    w = torch.randn(8, 8)
    grads = []
    for x, dev in ((a, "cpu"), (da, "neuron")):
        p = w.to(dev, copy=True).requires_grad_()
        with torch.autocast(dev, dtype=LOW):
            loss = F.cross_entropy(x @ p, torch.arange(8, device=dev))
        loss.backward()
        assert p.grad.dtype == torch.float32
        grads.append(p.grad.cpu())
    # same casts on both (mm in bf16, loss in fp32): bf16 rounding of the products bounds the difference
    torch.testing.assert_close(grads[1], grads[0], rtol=2e-2, atol=2e-3)


def test_grad_scaler_on_neuron():
    torch.manual_seed(0)
    w = torch.randn(4, 4, device="neuron", requires_grad=True)
    x = torch.randn(4, 4, device="neuron")
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=1024.0)
    with torch.autocast("neuron", dtype=torch.float16):
        loss = (x @ w).float().pow(2).sum()
    before = w.detach().cpu().clone()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    expected_grad = 2 * x.cpu().T @ (x.cpu().half() @ before.half()).float()
    torch.testing.assert_close(w.grad.cpu(), expected_grad, rtol=1e-2, atol=1e-2)  # step() unscaled it in place
    torch.testing.assert_close(w.detach().cpu(), before - 0.1 * expected_grad, rtol=1e-2, atol=1e-2)
    assert scaler.get_scale() == 1024.0


def test_grad_scaler_skips_steps_with_non_finite_grads():
    w = torch.ones(3, device="neuron", requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=8.0)
    scaler.scale((w * torch.tensor([1.0, float("inf"), 1.0], device="neuron")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert w.detach().cpu().tolist() == [1.0, 1.0, 1.0] and scaler.get_scale() == 4.0


def test_grad_scaler_ops_run_on_the_device_like_the_cpu():
    from torch_neuron_testing.native import native

    results = {}
    for dev in ("cpu", "neuron"):
        grads = [torch.tensor([1.0, 2.0], device=dev), torch.tensor([[4.0]], device=dev, dtype=torch.bfloat16),
                 torch.empty(0, device=dev)]
        found, inv = torch.zeros(1, device=dev), torch.full((1,), 0.5, device=dev)
        bad = [torch.tensor([1.0, float("nan")], device=dev)]
        scale, tracker = torch.full((1,), 2.0 ** 127, device=dev), torch.zeros(1, dtype=torch.int32, device=dev)
        trail = []
        with native() if dev == "neuron" else contextlib.nullcontext():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
            trail.append(found.item())
            torch._amp_foreach_non_finite_check_and_unscale_(bad, found, inv)
            trail.append(found.item())
            for flag in (0.0, 0.0, 1.0, 0.0, 0.0, 0.0):  # growth at the interval, kept when it would overflow
                torch._amp_update_scale_(scale, tracker, torch.full((1,), flag, device=dev), 2.0, 0.5, 2)
                trail.append((scale.item(), tracker.item()))
        results[dev] = ([g.cpu() for g in grads], trail)
    for g, e in zip(results["neuron"][0], results["cpu"][0]):
        assert g.dtype == e.dtype and torch.equal(g, e)
    assert results["neuron"][1] == results["cpu"][1]
