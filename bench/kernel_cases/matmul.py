"""Matmul family: bf16 GEMMs at 1024^3 and 4096^3 (a given [K, M] — no transposes — and the plain
[M, K] layout, made K-major by DMA transposes or on TensorE, as the kernel's default ``transpose="auto"``
picks), an fp32 GEMM (4x TensorE cost, roofline at the fp32 rate), linear with torch's weight layout, and
a 3x3 conv2d. Roofline: 2*M*N*K FLOPs at TensorE peak."""

from neuron_hal import DType
from neuron_kernels import TensorSpec
from neuron_kernels.library.conv import conv2d, out_size
from neuron_kernels.library.matmul import linear, matmul

from . import Case


def _gemm(m, n, k, dtype="bfloat16", transpose_a=False):
    dt = DType.of(dtype)
    a = TensorSpec((k, m) if transpose_a else (m, k), dt)
    layout = "a[K,M]" if transpose_a else "a[M,K]"
    return Case("matmul", matmul, (a, TensorSpec((k, n), dt)), f"{m}x{n}x{k} {layout}", dtype, "tensor",
                2.0 * m * n * k, {"transpose_a": transpose_a})


def _conv(n, c, h, w, o, kh, dtype="bfloat16"):
    dt = DType.of(dtype)
    oh, ow = out_size(h, kh, 1, kh // 2, 1), out_size(w, kh, 1, kh // 2, 1)
    return Case("conv2d", conv2d, (TensorSpec((n, c, h, w), dt), TensorSpec((o, c, kh, kh), dt), None, 1, kh // 2),
                f"{n}x{c}x{h}x{w} * {o}x{c}x{kh}x{kh}", dtype, "tensor", 2.0 * n * o * oh * ow * c * kh * kh)


CASES = [
    _gemm(1024, 1024, 1024, transpose_a=True),
    _gemm(1024, 1024, 1024),
    _gemm(4096, 4096, 4096, transpose_a=True),
    _gemm(4096, 4096, 4096),
    _gemm(1024, 1024, 1024, "float32"),
    Case("linear", linear, (TensorSpec((4096, 4096), DType.bfloat16), TensorSpec((4096, 4096), DType.bfloat16)),
         "x[4096,4096] w[4096,4096]", "bfloat16", "tensor", 2.0 * 4096**3),
    _conv(8, 256, 28, 28, 256, 3),
]
