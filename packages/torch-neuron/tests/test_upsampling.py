"""interpolate's backward on the neuron device (ops/upsample_backward.py) and its linear/cubic forwards
(ops/upsample.py) against PyTorch CPU: every mode and
dimensionality aten has a backward op for, integer, fractional and downsampling factors, explicit sizes,
align_corners both ways, bf16 gradients, the grad_input= overload and explicit scales; strict (no fallback)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch_neuron_testing.native import native

DEV = "neuron"
MODES = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "linear": (1,), "bilinear": (2,), "bicubic": (2,),
         "trilinear": (3,)}
BACKWARD = {"nearest": "upsample_nearest{}d_backward", "nearest-exact": "_upsample_nearest_exact{}d_backward",
            "linear": "upsample_linear1d_backward", "bilinear": "upsample_bilinear2d_backward",
            "bicubic": "upsample_bicubic2d_backward", "trilinear": "upsample_trilinear3d_backward"}
SIZES = [dict(scale_factor=2), dict(scale_factor=3), dict(scale_factor=0.5), dict(scale_factor=1.7),
         dict(scale_factor=2.5, recompute_scale_factor=True), "five", "three"]


def grads(x: torch.Tensor, **kw):
    """(output, input gradient) on the CPU and on the device for one random output gradient."""
    cpu, dev = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    want = F.interpolate(cpu, **kw)
    g = torch.randn_like(want)
    want.backward(g)
    got = F.interpolate(dev, **kw)
    got.backward(g.to(DEV))
    return got, want, dev.grad, cpu.grad


@pytest.mark.parametrize("mode,dims", [(m, d) for m, ds in MODES.items() for d in ds])
def test_interpolate_backward_matches_cpu(mode, dims):
    torch.manual_seed(0)
    x = torch.randn((2, 3, 4, 6, 5)[:2 + dims])
    aligns = [None] if "nearest" in mode else [False, True]
    for size in SIZES:
        for align in aligns:
            kw = dict(size=(5 if size == "five" else 3,) * dims) if isinstance(size, str) else dict(size)
            if align is not None:
                kw["align_corners"] = align
            with native(BACKWARD[mode].format(dims)):
                got, want, got_grad, want_grad = grads(x, mode=mode, **kw)
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got_grad.cpu(), want_grad, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, kw=kw: f"{kw}: {m}")


@pytest.mark.parametrize("mode,dims", [(m, d) for m, ds in MODES.items() for d in ds])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e20])
def test_interpolate_backward_inf_stays_in_its_taps(mode, dims, dtype, bad):
    """A non-finite (or huge) output gradient reaches only the inputs that output reads, as aten's backward adds
    it (NaN where aten multiplies it by a zero weight too): the dense map's matmul once made 0 * inf = NaN of
    every input along its line."""
    torch.manual_seed(0)
    x = torch.randn((2, 3, 4, 6, 5)[:2 + dims]).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps  # 16 bits: one rounding of an fp32 sum
    aligns = [None] if "nearest" in mode else [False, True]
    for size in (dict(scale_factor=2), dict(scale_factor=1.7), dict(scale_factor=0.5), "same"):
        for align in aligns:
            kw = dict(size=x.shape[2:]) if size == "same" else dict(size)
            if align is not None:
                kw["align_corners"] = align
            cpu, dev = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
            want = F.interpolate(cpu, mode=mode, **kw)
            g = torch.randn_like(want)
            g.view(-1)[g.numel() // 3] = bad
            want.backward(g)
            with native(BACKWARD[mode].format(dims)):
                F.interpolate(dev, mode=mode, **kw).backward(g.to(DEV))
            torch.testing.assert_close(dev.grad.cpu(), cpu.grad, rtol=tol, atol=tol, equal_nan=True,
                                       msg=lambda m, kw=kw: f"{kw}: {m}")


@pytest.mark.parametrize("mode,dims", [(m, d) for m, ds in MODES.items() for d in ds if "nearest" not in m])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e20])
def test_interpolate_inf_stays_in_its_taps(mode, dims, dtype, bad):
    """A non-finite (or huge) input reaches only the outputs whose taps read it, as aten's forward: w0 * a + w1 * b
    (inf where aten's is inf, NaN where aten multiplies it by a zero weight). torch's decomposition, which ran
    here before, used i and i + 1 with weight 0 for a same-size map and a + (b - a) * w (inf - inf = NaN)."""
    torch.manual_seed(0)
    x = torch.randn((2, 3, 4, 6, 5)[:2 + dims]).to(dtype)
    x.view(-1)[x.numel() // 3] = bad
    tol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps  # 16 bits: one rounding of an fp32 sum
    # a bicubic output sums terms of both signs up to twice the largest input: the CPU's fused multiply-adds
    # round them otherwise, which shows against 1e20
    atol = tol * 2 * float(x.float().abs().nan_to_num(0, 0, 0).max())
    for size in (dict(scale_factor=2), dict(scale_factor=1.7), dict(scale_factor=0.5), "same"):
        for align in (False, True):
            kw = dict(size=x.shape[2:]) if size == "same" else dict(size)
            want = F.interpolate(x.float(), mode=mode, align_corners=align, **kw).to(dtype)
            with native():
                got = F.interpolate(x.to(DEV), mode=mode, align_corners=align, **kw)
            torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=atol, equal_nan=True,
                                       msg=lambda m, kw=kw, align=align: f"{kw} align {align}: {m}")


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_backward_bf16_accumulates_in_float32(mode):
    torch.manual_seed(0)
    kw = {} if mode == "nearest" else dict(align_corners=mode == "bicubic")
    with native(None):
        _, _, got, want = grads(torch.randn(2, 3, 5, 7).bfloat16(), scale_factor=2, mode=mode, **kw)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_upsample_backward_overloads_and_explicit_scales():
    g = torch.randn(2, 3, 8, 8)
    out = torch.empty(0, device=DEV)
    op = torch.ops.aten.upsample_nearest2d_backward
    assert op.grad_input(g.to(DEV), [8, 8], [2, 3, 4, 4], None, None, grad_input=out) is out
    torch.testing.assert_close(out.cpu(), op(g, [8, 8], [2, 3, 4, 4]))
    bilinear = torch.ops.aten.upsample_bilinear2d_backward
    torch.testing.assert_close(bilinear(g.to(DEV), [8, 8], [2, 3, 3, 5], False, 2.7, 1.6).cpu(),
                               bilinear(g, [8, 8], [2, 3, 3, 5], False, 2.7, 1.6), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="shape of the output"):
        op(g.to(DEV), [8, 9], [2, 3, 4, 4])
