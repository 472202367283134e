"""``nisa`` wrappers of the newer instructions, run through the HAL against numpy: dma_transpose and
scalar_tensor_tensor."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels as nk
from neuron_hal import TRN1, TRN2, Alu, isa
from neuron_kernels import KernelError, TensorSpec
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

SETTINGS = settings(max_examples=25, deadline=None)
TRANSPOSE_DTYPES = [ml_dtypes.bfloat16, np.float32, np.float16, np.int16, np.int32]


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, -np.inf, -0.0][: x.size]
    return x.astype(dtype)


def _bits(x):
    return np.asarray(x).view({2: np.uint16, 4: np.uint32}[np.dtype(x.dtype).itemsize])


@nk.kernel
def transpose_from_hbm(a):
    """out = a.T, one DMA transpose per <= 128 columns of a (rows: any count)."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), a.dtype, buffer=nl.hbm)
    for c in nl.affine_range(nl.cdiv(cols, 128)):
        w = min(128, cols - c * 128)
        t = nl.ndarray((w, rows), a.dtype)
        nisa.dma_transpose(t, a[:, c * 128:c * 128 + w])
        nl.store(out[c * 128:c * 128 + w, :], t)
    return out


@nk.kernel
def transpose_on_chip(a):
    """out = a.T for a of at most 128 x 128: load, DMA transpose SBUF -> SBUF, store."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), a.dtype, buffer=nl.hbm)
    t = nl.ndarray((cols, rows), a.dtype)
    nisa.dma_transpose(t, nl.load(a))
    nl.store(out, t)
    return out


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 260), st.sampled_from(TRANSPOSE_DTYPES))
def test_dma_transpose_from_hbm(rows, cols, dtype):
    a = _random((rows, cols), dtype, rows * 1000 + cols)
    out = transpose_from_hbm(a)
    np.testing.assert_array_equal(_bits(out), _bits(np.ascontiguousarray(a.T)))
    ops = [i.opcode for i in transpose_from_hbm.trace(a).instructions]
    assert ops.count("dma_transpose") == -(-cols // 128)


@SETTINGS
@given(st.integers(1, 128), st.integers(1, 128), st.sampled_from(TRANSPOSE_DTYPES))
def test_dma_transpose_sbuf_to_sbuf(rows, cols, dtype):
    a = _random((rows, cols), dtype, rows * 7 + cols)
    out = transpose_on_chip(a)
    np.testing.assert_array_equal(_bits(out), _bits(np.ascontiguousarray(a.T)))


def test_dma_transpose_rules_reach_the_kernel_line():
    a = TensorSpec((64, 32), "bfloat16")
    with pytest.raises(KernelError, match=r"transpose_from_hbm.*\[dma transpose\] trn1 \(NC-v2\) has no DMA"):
        transpose_from_hbm.trace(a, profile=TRN1)
    with pytest.raises(KernelError, match=r"\[dma transpose dtype\].*1-byte elements"):
        transpose_from_hbm.trace(TensorSpec((64, 32), "float8_e4m3"), profile=TRN2)
    prog = transpose_from_hbm.trace(a, profile=TRN2)
    tp = [i for i in prog.instructions if isinstance(i, isa.DmaTranspose)]
    assert len(tp) == 1 and tp[0].dst.shape == (32, 64) and tp[0].src.shape == (64, 32)


_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "max": np.maximum, "min": np.minimum}


@nk.kernel
def stt(x, y, s, op0="subtract", op1="multiply", column=False, rev0=False, rev1=False, out_dtype="float32"):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), getattr(nl, out_dtype), buffer=nl.hbm)
    tx, ty = nl.load(x), nl.load(y)
    operand0 = nl.load(s) if column else 0.75
    r = nl.ndarray((rows, cols), getattr(nl, out_dtype))
    nisa.scalar_tensor_tensor(r, tx, getattr(Alu, op0), operand0, getattr(Alu, op1), ty, reverse0=rev0,
                              reverse1=rev1)
    nl.store(out, r)
    return out


@SETTINGS
@given(st.integers(1, 128), st.integers(1, 700), st.sampled_from([ml_dtypes.bfloat16, np.float32, np.float16]),
       st.sampled_from(list(_OPS)), st.sampled_from(list(_OPS)), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from(["float32", "bfloat16"]))
def test_scalar_tensor_tensor(rows, cols, dtype, op0, op1, column, rev0, rev1, out_dtype):
    x = _random((rows, cols), dtype, rows + cols)
    y = _random((rows, cols), dtype, rows * cols + 1)
    s = np.random.default_rng(rows).standard_normal((rows, 1)).astype(np.float32)
    out = stt(x, y, s, op0=op0, op1=op1, column=column, rev0=rev0, rev1=rev1, out_dtype=out_dtype)
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    sf = s if column else np.float32(0.75)
    with np.errstate(all="ignore"):
        r = _OPS[op0](sf, xf) if rev0 else _OPS[op0](xf, sf)
        r = _OPS[op1](yf, r) if rev1 else _OPS[op1](r, yf)
    want = r.astype(np.float32).astype(out.dtype)
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))


def test_scalar_tensor_tensor_cost_and_operand_check():
    x = TensorSpec((128, 512), "bfloat16")
    s = TensorSpec((128, 1), "float32")
    prog = stt.trace(x, x, s, profile=TRN2)
    ins = [i for i in prog.instructions if isinstance(i, isa.ScalarTensorTensor)]
    assert len(ins) == 1 and ins[0].op0 is Alu.subtract and ins[0].op1 is Alu.multiply

    @nk.kernel
    def bad(a):
        t = nl.load(a)
        nisa.scalar_tensor_tensor(t, t, nl.add, 1.0, nl.multiply, 2.0)
        return a

    with pytest.raises(KernelError, match="operand1 must be a tile"):
        bad.trace(x, profile=TRN2)
