"""conv2d (implicit im2col on TensorE) against a numpy reference, in fp32 and bf16."""

import ml_dtypes
import numpy as np
import pytest

from neuron_hal import TRN2, DType, isa
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels.library.conv import conv2d, reference

CASES = [
    dict(x=(2, 3, 9, 11), w=(4, 3, 3, 3)),
    dict(x=(1, 5, 8, 8), w=(6, 5, 3, 3), stride=2, padding=1, bias=True),
    dict(x=(1, 4, 10, 9), w=(4, 2, 3, 2), padding=(2, 1), dilation=(2, 1), groups=2, bias=True),
    dict(x=(1, 8, 7, 7), w=(8, 1, 3, 3), padding=1, groups=8),  # depthwise
    dict(x=(1, 130, 6, 6), w=(140, 130, 1, 1), bias=True),  # channel tiles on both sides of 128
    dict(x=(2, 3, 30, 40), w=(5, 3, 5, 5), stride=(1, 2), padding=2),  # several row bands
    dict(x=(1, 2, 5, 600), w=(3, 2, 1, 3)),  # rows wider than one PSUM bank
    dict(x=(1, 3, 4, 4), w=(2, 3, 4, 4), padding="valid"),
    dict(x=(1, 3, 6, 6), w=(2, 3, 3, 3), padding="same", bias=True),
]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_conv2d_matches_numpy(case, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case["x"]).astype(dtype)
    w = rng.standard_normal(case["w"]).astype(dtype)
    b = rng.standard_normal(case["w"][0]).astype(dtype) if case.get("bias") else None
    kw = {k: v for k, v in case.items() if k not in ("x", "w", "bias")}
    out = conv2d(x, w, b, **kw)
    ref_kw = dict(kw, padding={"valid": 0, "same": 1}.get(kw.get("padding"), kw.get("padding", 0)))
    ref = reference(x, w, b, **ref_kw)
    assert out.shape == ref.shape and out.dtype == np.dtype(dtype)
    scale = np.max(np.abs(ref.astype(np.float64)))
    tol = 1e-6 if dtype is np.float32 else 1e-2
    np.testing.assert_allclose(out.astype(np.float64) / scale, ref.astype(np.float64) / scale, rtol=0, atol=tol)


def test_conv2d_is_matmuls_not_elementwise():
    """Implicit im2col: a 3x3 conv over 64 channels is kh*kw matmuls per output tile, no per-element work."""
    prog = conv2d.trace(TensorSpec((1, 64, 16, 16), DType.bfloat16), TensorSpec((32, 64, 3, 3), DType.bfloat16),
                        None, 1, 1, profile=TRN2)
    kinds = [type(i) for i in prog.instructions]
    assert kinds.count(isa.Matmul) == 9
    assert len(prog.instructions) < 40


def test_conv2d_errors():
    with pytest.raises(KernelError, match="groups=3 must divide"):
        conv2d.trace(TensorSpec((1, 4, 8, 8), DType.float32), TensorSpec((6, 2, 3, 3), DType.float32), None, 1, 0, 1, 3)
    with pytest.raises(KernelError, match="does not fit"):
        conv2d.trace(TensorSpec((1, 1, 2, 2), DType.float32), TensorSpec((1, 1, 3, 3), DType.float32))
