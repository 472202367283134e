"""Ops without a neuron kernel run PyTorch's decomposition on the device (torch_neuron.ops.decomp)."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_neuron.ops.core import decomp

DTYPES = [torch.float32, torch.bfloat16]


def _fallbacks():
    return dict(torch.neuron.metrics()["fallback"])


def _native(fn, *cpu_args):
    """fn on neuron copies of the args (no CPU fallback allowed) and on the CPU."""
    before = _fallbacks()
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.neuron.NeuronFallbackWarning)
        got = fn(*[a.to("neuron") for a in cpu_args])
    assert _fallbacks() == before
    return got, fn(*cpu_args)


CASES = {
    "upsample_nearest": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "log_sigmoid": F.logsigmoid,
    "glu": lambda x: F.glu(x, dim=-1),
    "hardshrink": lambda x: F.hardshrink(x, 0.3),
    # their index arithmetic is on int64 tensors, which takes the counted CPU path piece by piece
    "reflect": lambda x: F.pad(x, (2, 3, 1, 1), mode="reflect"),
    "replicate": lambda x: F.pad(x, (2, 3, 1, 1), mode="replicate"),
}
INT64_PIECES = {"reflect", "replicate"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_decomposed_ops_match_cpu(case, dtype):
    x = torch.randn(2, 3, 5, 6).to(dtype)
    if case in INT64_PIECES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, want = CASES[case](x.to("neuron")), CASES[case](x)
        assert not {"reflection_pad2d", "replication_pad2d"} & set(torch.neuron.metrics()["fallback"])  # the op itself
    else:
        got, want = _native(CASES[case], x)
    torch.testing.assert_close(got.cpu(), want)


def test_out_variant_writes_its_out_tensor():
    x = torch.randn(2, 7)
    out = torch.empty(0, device="neuron")
    r = torch.ops.aten.reflection_pad1d.out(x.to("neuron"), [2, 2], out=out)
    assert r is out and out.shape == (2, 11)
    torch.testing.assert_close(out.cpu(), F.pad(x, (2, 2), mode="reflect"))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ops.aten.reflection_pad1d.out(x.to("neuron"), [2, 2], out=torch.empty(0, dtype=torch.int32,
                                                                                      device="neuron"))


@pytest.mark.parametrize("pad, shape", [((0, 2, 0, 0), (2, 3, 7, 1)), ((0, 0, 5, 0), (1, 2, 5, 4)), ((3, 3), (2, 3))])
def test_reflection_pad_as_large_as_its_dim_raises_torchs_error(pad, shape):
    """The reflection pads' decompositions do not check the padding against the input (their gather raised an
    IndexError): the op's meta kernel checks first, so the error is torch's RuntimeError, as on the CPU."""
    x = torch.randn(shape)
    for t in (x, x.to("neuron")):
        with pytest.raises(RuntimeError, match="Padding size should be less than the corresponding input dimension"):
            F.pad(t, pad, mode="reflect")


def test_in_place_variant_updates_self():
    x = torch.rand(10) * 0.8 + 0.1
    d = x.to("neuron")
    assert d.logit_() is d
    torch.testing.assert_close(d.cpu(), x.logit())


def test_reduced_precision_is_computed_in_float32_and_rounded_once():
    # one rounding: log_sigmoid of bfloat16 equals the float32 result rounded, as aten's CPU kernel gives
    x = torch.randn(64).to(torch.bfloat16)
    got = F.logsigmoid(x.to("neuron")).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.logsigmoid(x.float()).to(torch.bfloat16), rtol=0, atol=0)


def test_a_decomposition_that_reenters_its_op_takes_the_cpu_path():
    op = torch.ops.aten.reflection_pad1d.out
    calls = []

    def reentering(x, padding, out=None):
        calls.append(1)
        return kernel(x, padding, out=torch.empty(0, device=x.device)) if len(calls) == 1 else None

    kernel = decomp._kernel(op, reentering)
    x = torch.randn(1, 5)
    before = _fallbacks().get("reflection_pad1d.out", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = kernel(x.to("neuron"), [1, 1], out=torch.empty(0, device="neuron"))
    assert len(calls) == 1 and _fallbacks()["reflection_pad1d.out"] == before + 1
    torch.testing.assert_close(out.cpu(), F.pad(x, (1, 1), mode="reflect"))


def test_not_implemented_goes_to_the_cpu():
    kernel = decomp._kernel(torch.ops.aten.log_sigmoid_forward.default, lambda *a, **k: NotImplemented)
    x = torch.randn(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, buffer = kernel(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), F.logsigmoid(x))


def test_views_and_ops_with_kernels_are_not_decomposed():
    names = {op.name() for op in decomp.DECOMPOSED}
    assert "aten::reflection_pad2d" in names
    assert not any(decomp._is_view(op) for op in decomp.DECOMPOSED)
    assert "aten::add" not in names and "aten::mm" not in names  # neuron kernels


def test_scalar_arguments_are_rounded_to_the_tensor_dtype_as_aten_does():
    # hardshrink's lambda is a Scalar: aten compares bf16 x against bf16(0.3) = 0.30078125, so x = 0.30078125
    # is shrunk to 0; computing the comparison against the double 0.3 would keep it
    x = torch.tensor([0.30078125, -0.30078125, 0.3125, 0.25], dtype=torch.bfloat16)
    got, want = _native(lambda t: F.hardshrink(t, 0.3), x)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert want[0] == 0
    # a `float` argument (upsample's scale factor) is not rounded: the output size follows the double
    y = torch.randn(1, 1, 5, dtype=torch.bfloat16)
    got, want = _native(lambda t: F.interpolate(t, scale_factor=1.7, mode="nearest"), y)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_python_scalar_operand_is_cast_to_the_common_dtype_as_tensoriterator_does(dtype):
    """xlogy(x, 1e-38) in a 16-bit dtype: the wrapped scalar is cast to the common dtype (0 in float16, and
    1.4e-45 is 0 in bfloat16) before log, so the result is -inf; computing log(1e-38) in float32 gave x * -87.3.
    A 0-d tensor operand of a wider dtype is cast the same way; infinite operands follow torch."""
    x = torch.tensor([3.0, 0.5, 0.0, -2.0], dtype=dtype)
    for y in (1.1754943508222875e-38, 1.401298464324817e-45, float("inf"), 1e-3):
        got, want = _native(lambda t, y=y: torch.xlogy(t, y), x)
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
        got, want = _native(lambda t, y=y: torch.xlogy(y, t), x)
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    got, want = _native(lambda t: torch.xlogy(t, torch.tensor(1.401298464324817e-45)), x)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    assert want[0] == -float("inf")
