"""Matrix products on the neuron device against PyTorch CPU: mm, bmm, addmm, baddbmm, addbmm, addmv, mv,
dot, vdot (functional, out=, in-place), matmul / nn.Linear through them, transposed operands without
copies, and the loud CPU path for dtypes TensorE does not multiply exactly."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_neuron_testing.native import native

from torch_neuron.fallback import NeuronFallbackWarning

DEV = "neuron"
FLOATS = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}
SETTINGS = settings(max_examples=12, deadline=None)


def close(got, want, dtype=None):
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype or want.dtype])


def layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """t on the device as a contiguous tensor, as the transpose view of a contiguous one, or strided."""
    if kind == "contiguous":
        return t.to(DEV)
    if kind == "transposed":
        return t.transpose(-2, -1).contiguous().to(DEV).transpose(-2, -1)
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide.to(DEV)[..., ::2]


LAYOUTS = st.sampled_from(["contiguous", "transposed", "strided"])
DIM = st.sampled_from([1, 2, 5, 17, 64, 130])


@SETTINGS
@given(DIM, DIM, DIM, st.sampled_from(FLOATS), LAYOUTS, LAYOUTS)
def test_mm_matches_cpu(m, k, n, dtype, la, lb):
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    with native("mm"):
        got = torch.mm(layout(a, la), layout(b, lb))
    close(got, torch.mm(a.float(), b.float()).to(dtype))


def test_transposed_operands_are_not_copied():
    a, b = torch.randn(40, 24), torch.randn(24, 56)
    at, bt = layout(a, "transposed"), layout(b, "transposed")
    at3, bt3 = layout(a[None].repeat(3, 1, 1), "transposed"), layout(b[None].repeat(3, 1, 1), "transposed")
    copies = torch.neuron.metrics()["native"].get("copy_", 0)
    with native("mm", "bmm"):
        got = at @ bt
        got3 = torch.bmm(at3, bt3)
    assert torch.neuron.metrics()["native"].get("copy_", 0) == copies
    close(got, a @ b)
    close(got3, (a @ b)[None].expand(3, -1, -1))


BIAS_SHAPES = st.sampled_from(["scalar", "row", "row2d", "column", "full"])


def _bias(kind, m, n, dtype):
    shape = {"scalar": (), "row": (n,), "row2d": (1, n), "column": (m, 1), "full": (m, n)}[kind]
    return torch.randn(shape, dtype=dtype)


@SETTINGS
@given(DIM, DIM, DIM, st.sampled_from(FLOATS), BIAS_SHAPES, st.sampled_from([(1, 1), (0.5, 2.0), (0, -1.5)]),
       LAYOUTS)
def test_addmm_matches_cpu(m, k, n, dtype, bias_kind, beta_alpha, lb):
    beta, alpha = beta_alpha
    a, b, c = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype), _bias(bias_kind, m, n, dtype)
    with native("addmm"):
        got = torch.addmm(c.to(DEV), a.to(DEV), layout(b, lb), beta=beta, alpha=alpha)
    want = torch.addmm(c.float(), a.float(), b.float(), beta=beta, alpha=alpha).to(dtype)
    close(got, want)


def test_addmm_ignores_bias_when_beta_is_zero_and_handles_empty_contractions():
    c = torch.full((3, 4), float("nan"))
    a, b = torch.randn(3, 5), torch.randn(5, 4)
    with native("addmm", "mm"):
        got = torch.addmm(c.to(DEV), a.to(DEV), b.to(DEV), beta=0)
        empty_k = torch.addmm(torch.ones(4).to(DEV), torch.randn(3, 0).to(DEV), torch.randn(0, 4).to(DEV), beta=2)
        zeros = torch.mm(torch.randn(3, 0).to(DEV), torch.randn(0, 4).to(DEV))
        empty_m = torch.mm(torch.randn(0, 5).to(DEV), b.to(DEV))
    close(got, a @ b)
    close(empty_k, torch.full((3, 4), 2.0))
    close(zeros, torch.zeros(3, 4))
    assert empty_m.shape == (0, 4)


@SETTINGS
@given(st.sampled_from([1, 3]), DIM, DIM, DIM, st.sampled_from(FLOATS), LAYOUTS, LAYOUTS)
def test_bmm_and_baddbmm_match_cpu(batch, m, k, n, dtype, la, lb):
    a, b = torch.randn(batch, m, k, dtype=dtype), torch.randn(batch, k, n, dtype=dtype)
    c = torch.randn(batch, 1, n, dtype=dtype)
    with native("bmm", "baddbmm"):
        got = torch.bmm(layout(a, la), layout(b, lb))
        got2 = torch.baddbmm(c.to(DEV), layout(a, la), layout(b, lb), beta=0.5, alpha=-2)
    close(got, torch.bmm(a.float(), b.float()).to(dtype))
    want2 = torch.baddbmm(c.float(), a.float(), b.float(), beta=0.5, alpha=-2).to(dtype)  # rounded once
    close(got2, want2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_vector_products_match_cpu(dtype):
    mat, vec, vec2 = torch.randn(7, 33, dtype=dtype), torch.randn(33, dtype=dtype), torch.randn(33, dtype=dtype)
    bias, acc = torch.randn(7, dtype=dtype), torch.randn(7, 6, dtype=dtype)
    batches = (torch.randn(4, 7, 5, dtype=dtype), torch.randn(4, 5, 6, dtype=dtype))
    with native("mv", "addmv", "dot", "vdot", "addbmm"):
        got = {
            "mv": torch.mv(mat.to(DEV), vec.to(DEV)),
            "addmv": torch.addmv(bias.to(DEV), mat.to(DEV), vec.to(DEV), beta=2, alpha=0.5),
            "dot": torch.dot(vec.to(DEV), vec2.to(DEV)),
            "vdot": torch.vdot(vec.to(DEV), vec2.to(DEV)),
            "addbmm": torch.addbmm(acc.to(DEV), *(t.to(DEV) for t in batches), alpha=0.5),
        }
    f = lambda t: t.float()
    close(got["mv"], torch.mv(f(mat), f(vec)).to(dtype))
    close(got["addmv"], torch.addmv(f(bias), f(mat), f(vec), beta=2, alpha=0.5).to(dtype))
    close(got["dot"], torch.dot(f(vec), f(vec2)).to(dtype), dtype)
    close(got["vdot"], torch.vdot(f(vec), f(vec2)).to(dtype), dtype)
    close(got["addbmm"], torch.addbmm(f(acc), *map(f, batches), alpha=0.5).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_16_bit_results_round_where_torch_rounds(dtype):
    """baddbmm rounds beta * bias + alpha * (a @ b) once; addbmm accumulates batch by batch in the dtype;
    addr rounds every step in the dtype: beta * bias + (alpha * vec1) outer vec2."""
    torch.manual_seed(3)
    a, b = torch.randn(6, 8, 16, dtype=dtype), torch.randn(6, 16, 5, dtype=dtype)
    c3, c2 = torch.randn(6, 8, 5, dtype=dtype), torch.randn(8, 5, dtype=dtype)
    v1, v2 = torch.randn(8, dtype=dtype), torch.randn(5, dtype=dtype)
    with native("baddbmm", "addbmm", "addr"):
        got_b = torch.baddbmm(c3.to(DEV), a.to(DEV), b.to(DEV), beta=0.25, alpha=3)
        got_a = torch.addbmm(c2.to(DEV), a.to(DEV), b.to(DEV), beta=0.5, alpha=2)
        got_r = torch.addr(c2.to(DEV), v1.to(DEV), v2.to(DEV), beta=2, alpha=-1)
    f = lambda t: t.float()
    close(got_b, torch.baddbmm(f(c3), f(a), f(b), beta=0.25, alpha=3).to(dtype))
    want_a = (0.5 * f(c2) + 2 * (f(a[0]) @ f(b[0]))).to(dtype)
    for i in range(1, 6):
        want_a = (f(want_a) + 2 * (f(a[i]) @ f(b[i]))).to(dtype)
    close(got_a, want_a)
    assert torch.equal(got_r.cpu(), torch.addr(c2, v1, v2, beta=2, alpha=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta, alpha", [(0.6, 0.2), (0, 2.5), (1.3, -0.7), (1, 1)])
@pytest.mark.parametrize("bias_shape", [(9, 7), (7,), (1,)])
def test_addr_16_bit_equals_cpu(dtype, beta, alpha, bias_shape):
    # a fused fp32 result rounded once differed from torch by up to 8% where the two terms cancel
    g = torch.Generator().manual_seed(5)
    bias, v1, v2 = ((torch.randn(s, generator=g) * 5).to(dtype) for s in (bias_shape, (9,), (7,)))
    if beta == 0 and len(bias_shape) == 2:
        bias[0, 0] = float("nan")  # ignored when beta == 0
    with native("addr"):
        got = torch.addr(bias.to(DEV), v1.to(DEV), v2.to(DEV), beta=beta, alpha=alpha)
    want = torch.addr(bias, v1, v2, beta=beta, alpha=alpha)
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


def test_out_and_inplace_variants():
    a, b, c = torch.randn(6, 4), torch.randn(4, 5), torch.randn(6, 5)
    out = torch.empty(0, device=DEV)
    with native("mm", "addmm", "baddbmm"):
        assert torch.mm(a.to(DEV), b.to(DEV), out=out) is out
        target = torch.zeros(8, 6).to(DEV)
        view = target[1:7, :5]  # in place on a view writes through to its base
        view.addmm_(a.to(DEV), b.to(DEV), beta=0.5)
        batched = c[None].to(DEV)
        batched.baddbmm_(a[None].to(DEV), b[None].to(DEV))
    close(out, a @ b)
    want = torch.zeros(8, 6)
    want[1:7, :5] = a @ b
    close(target, want)
    close(batched, (c + a @ b)[None])
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype"):
        torch.mm(a.to(DEV), b.to(DEV), out=torch.empty(0, dtype=torch.float16, device=DEV))


@pytest.mark.parametrize("la, lb", [("contiguous", "transposed"), ("transposed", "contiguous"),
                                     ("strided", "contiguous"), ("transposed", "transposed")])
def test_repeated_signatures_bind_each_calls_tensors(la, lb):
    """mm/addmm/bmm remember a signature's launch (the fast path): every later call with that signature must
    compute on its own tensors (offsets into a larger storage included), and other signatures still get checked."""
    big = torch.randn(9, 16, 16)
    bias = torch.randn(16)
    dev, bias_d = big.to(DEV), bias.to(DEV)
    for i in range(5):
        a, b = layout(big[i], la), layout(big[i + 1], lb)
        if la != "strided":  # views at an offset into the same device storage
            a = dev[i] if la == "contiguous" else dev[i].t().contiguous().t()
        close(a @ b, big[i] @ big[i + 1])
        scaled = dict(beta=0.5, alpha=2.0)
        close(torch.addmm(bias_d, a, b, **scaled), torch.addmm(bias, big[i], big[i + 1], **scaled))
        close(torch.addmm(bias_d, a, b), torch.addmm(bias, big[i], big[i + 1]))
        close(torch.bmm(dev[i:i + 2], dev[i + 2:i + 4]), torch.bmm(big[i:i + 2], big[i + 2:i + 4]))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(dev[0], dev[0][:8])


def test_shape_and_dtype_errors_are_torchs():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(torch.randn(2, 3).to(DEV), torch.randn(4, 5).to(DEV))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(torch.randn(2, 3).to(DEV), torch.randn(3, 5, dtype=torch.bfloat16).to(DEV))
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(torch.randn(2, 3).to(DEV), torch.randn(3, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_broadcasting_reaches_bmm_and_mm(dtype):
    x, w = torch.randn(2, 3, 5, 8, dtype=dtype), torch.randn(8, 4, dtype=dtype)
    y, z = torch.randn(3, 5, 8, dtype=dtype), torch.randn(1, 8, 6, dtype=dtype)
    with native():
        got1, got2 = x.to(DEV) @ w.to(DEV), y.to(DEV) @ z.to(DEV)
    close(got1, (x.float() @ w.float()).to(dtype))
    close(got2, (y.float() @ z.float()).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(6, 12), (2, 7, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_backward_match_cpu(dtype, shape, bias):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(12, 10, bias=bias, dtype=dtype)
    dev = torch.nn.Linear(12, 10, bias=bias, dtype=dtype).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(shape, dtype=dtype)
    xd = x.to(DEV).requires_grad_()
    x.requires_grad_()
    grad = torch.randn(*shape[:-1], 10, dtype=dtype)
    before = torch.neuron.metrics()["fallback"]
    yd = dev(xd)
    yd.backward(grad.to(DEV))
    y = cpu(x)
    y.backward(grad)
    after = torch.neuron.metrics()["fallback"]
    for op in ("mm", "addmm", "bmm"):
        assert after.get(op, 0) == before.get(op, 0)
    close(yd, y.detach())
    close(xd.grad, x.grad)
    close(dev.weight.grad, cpu.weight.grad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_dtypes_tensore_cannot_multiply_exactly_run_on_the_cpu_loudly(dtype):
    a = (torch.randn(3, 4) * 100).to(dtype)
    b = (torch.randn(4, 2) * 100).to(dtype)
    before = torch.neuron.metrics()["fallback"].get("mm", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronFallbackWarning)  # warned once per op per process
        got = torch.mm(a.to(DEV), b.to(DEV))
    assert torch.neuron.metrics()["fallback"]["mm"] == before + 1
    torch.testing.assert_close(got.cpu(), a @ b, rtol=0, atol=0)
