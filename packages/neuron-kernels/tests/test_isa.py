"""``nisa`` wrappers of the newer instructions, run through the HAL against numpy: dma_transpose,
scalar_tensor_tensor, tensor_tensor_scan, bn_stats and bn_aggr."""

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


# ---- tensor_tensor_scan ---------------------------------------------------------------------------
_SCAN_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "max": np.maximum, "min": np.minimum}


def _scan_reference(x0, x1, init, op0, op1, rev0=False, rev1=False):
    """NKI's definition, column by column in FP32 (numpy's FP32 ufuncs), the state kept in FP32."""
    f0, f1 = _SCAN_OPS[op0], _SCAN_OPS[op1]
    s = np.broadcast_to(np.asarray(init, np.float32).reshape(-1), (x0.shape[0],)).copy()
    out = np.empty(x0.shape, np.float32)
    with np.errstate(all="ignore"):
        for i in range(x0.shape[1]):
            a, b = x0[:, i].astype(np.float32), x1[:, i].astype(np.float32)
            t = f0(s, a) if rev0 else f0(a, s)
            s = (f1(b, t) if rev1 else f1(t, b)).astype(np.float32)
            out[:, i] = s
    return out


@nk.kernel
def scan(x0, x1, init, op0="multiply", op1="add", column=False, imm=0.0, rev0=False, rev1=False,
         out_dtype="float32"):
    rows, cols = x0.shape
    out = nl.ndarray((rows, cols), getattr(nl, out_dtype), buffer=nl.hbm)
    t0, t1 = nl.load(x0), nl.load(x1)
    r = nl.ndarray((rows, cols), getattr(nl, out_dtype))
    nisa.tensor_tensor_scan(r, t0, t1, nl.load(init) if column else imm, getattr(Alu, op0), getattr(Alu, op1),
                            reverse0=rev0, reverse1=rev1)
    nl.store(out, r)
    return out


@nk.kernel
def chunked_scan(a, b, chunk=512):
    """NKI's example: scan chunk by chunk, each chunk starting from the previous one's last column."""
    rows, cols = a.shape
    out = nl.ndarray((rows, cols), nl.float32, buffer=nl.hbm)
    ta, tb = nl.load(a), nl.load(b)
    c = nl.ndarray((rows, cols), nl.float32)
    for k in nl.sequential_range(nl.cdiv(cols, chunk)):
        lo, hi = k * chunk, min(cols, (k + 1) * chunk)
        initial = 0.0 if k == 0 else c[:, lo - 1:lo]
        nisa.tensor_tensor_scan(c[:, lo:hi], ta[:, lo:hi], tb[:, lo:hi], initial, nl.multiply, nl.add)
    nl.store(out, c)
    return out


@SETTINGS
@given(st.integers(1, 128), st.integers(1, 700), st.sampled_from([ml_dtypes.bfloat16, np.float32, np.float16]),
       st.sampled_from(list(_SCAN_OPS)), st.sampled_from(list(_SCAN_OPS)), st.booleans(),
       st.sampled_from([0.0, 1.0, -0.5, float("inf")]), st.booleans(), st.booleans(),
       st.sampled_from(["float32", "bfloat16", "float16"]))
def test_tensor_tensor_scan(rows, cols, dtype, op0, op1, column, imm, rev0, rev1, out_dtype):
    x0 = _random((rows, cols), dtype, rows + cols) * np.asarray(0.5, dtype)  # keep multiply chains tame
    x1 = _random((rows, cols), dtype, rows * cols + 1)
    init = np.random.default_rng(cols).standard_normal((rows, 1)).astype(np.float32)
    out = scan(x0, x1, init, op0=op0, op1=op1, column=column, imm=imm, rev0=rev0, rev1=rev1, out_dtype=out_dtype)
    want = _scan_reference(x0, x1, init if column else np.float32(imm), op0, op1, rev0, rev1)
    with np.errstate(all="ignore"):
        want = want.astype(out.dtype)
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))


@SETTINGS
@given(st.integers(1, 128), st.sampled_from([1, 511, 512, 1024, 1300]), st.sampled_from([512, 100]))
def test_chunked_scan_equals_one_scan(rows, cols, chunk):
    rng = np.random.default_rng(rows * cols)
    a, b = rng.random((rows, cols)).astype(np.float32), rng.random((rows, cols)).astype(np.float32)
    out = chunked_scan(a, b, chunk=chunk)
    np.testing.assert_array_equal(out, _scan_reference(a, b, 0.0, "multiply", "add"))
    golden = np.zeros((rows, cols))  # NKI's own check: float64 recurrence, allclose
    golden[:, 0] = b[:, 0]
    for i in range(1, cols):
        golden[:, i] = a[:, i] * golden[:, i - 1] + b[:, i]
    assert np.allclose(out, golden)
    ops = [i.opcode for i in chunked_scan.trace(a, b, chunk=chunk).instructions]
    assert ops.count("tensor_tensor_scan") == -(-cols // chunk)


def test_tensor_tensor_scan_trace_and_rules():
    x = TensorSpec((128, 512), "float32")
    col = TensorSpec((128, 1), "float32")
    prog = scan.trace(x, x, col, column=True, profile=TRN2)
    ins = [i for i in prog.instructions if isinstance(i, isa.TensorTensorScan)]
    assert len(ins) == 1 and ins[0].op0 is Alu.multiply and ins[0].op1 is Alu.add
    assert ins[0].initial.shape == (128, 1) and ins[0].data0.shape == (128, 512)

    @nk.kernel
    def bad(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.hbm)
        t = nl.load(a)
        nisa.tensor_tensor_scan(t, t, t, 0.0, nl.bitwise_and, nl.add)
        nl.store(out, t)
        return out

    with pytest.raises(KernelError, match=r"bad.*\[scan op\] op0 is bitwise_and"):
        bad.trace(TensorSpec((8, 8), "int32"), profile=TRN2)

    @nk.kernel
    def not_a_tile(a):
        t = nl.load(a)
        nisa.tensor_tensor_scan(t, t, 1.0, 0.0, nl.multiply, nl.add)
        return a

    with pytest.raises(KernelError, match="data1 must be a tile"):
        not_a_tile.trace(TensorSpec((8, 8), "float32"), profile=TRN2)


# ---- bn_stats / bn_aggr ---------------------------------------------------------------------------
@nk.kernel
def mean_var(x, stats_dtype="float32", out_dtype="float32"):
    """Per-row mean and population variance: bn_stats on chunks of bn_stats_fmax, one bn_aggr (NKI's example 2)."""
    rows, cols = x.shape
    fmax = nl.tile_size.bn_stats_fmax
    k = nl.cdiv(cols, fmax)
    t = nl.load(x)
    stats = nl.ndarray((rows, 6 * k), getattr(nl, stats_dtype))
    for i in nl.affine_range(k):
        nisa.bn_stats(stats[:, 6 * i:6 * i + 6], t[:, i * fmax:min(cols, (i + 1) * fmax)])
    mv = nl.ndarray((rows, 2), getattr(nl, out_dtype))
    nisa.bn_aggr(mv, stats)
    out = nl.ndarray((rows, 2), getattr(nl, out_dtype), buffer=nl.hbm)
    nl.store(out, mv)
    return out


@nk.kernel
def stats_only(x):
    rows, cols = x.shape
    out = nl.ndarray((rows, 6), nl.float32, buffer=nl.hbm)
    s = nl.ndarray((rows, 6), nl.float32)
    nisa.bn_stats(s, nl.load(x))
    nl.store(out, s)
    return out


@SETTINGS
@given(st.integers(1, 128), st.one_of(st.sampled_from([1, 2, 511, 512, 513, 1024, 3000]), st.integers(1, 1200)),
       st.sampled_from([ml_dtypes.bfloat16, np.float32, np.float16]), st.sampled_from([1.0, 100.0, 1e-3]))
def test_bn_stats_bn_aggr_mean_and_variance(rows, cols, dtype, scale):
    rng = np.random.default_rng(rows * 10000 + cols)
    x = ((rng.random((rows, cols)) * 2 + 1) * scale).astype(np.float32).astype(dtype)  # mean away from 0
    got = mean_var(x)
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=1), x64.var(axis=1)  # population variance, as NKI's test compares
    u = 2.0 ** -24
    # Welford / Chan in FP32: mean within n u max|x|, M2 = n var within n u sum x^2 (constants with margin)
    np.testing.assert_array_less(np.abs(got[:, 0] - mean), 4 * cols * u * np.abs(x64).max(axis=1) + 1e-30)
    np.testing.assert_array_less(np.abs(got[:, 1] - var), 8 * u * (x64 ** 2).sum(axis=1) + 1e-30)
    assert np.allclose(got[:, 0], mean) and np.allclose(got[:, 1], var, rtol=1e-4, atol=1e-6 * scale ** 2)


def test_bn_stats_record_layout():
    """(count, mean, variance * count) of the even elements, then of the odd ones."""
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 9) ** 2  # 1 4 9 ... 81
    rec = stats_only(x)[0]
    even, odd = x[0, 0::2].astype(np.float64), x[0, 1::2].astype(np.float64)
    want = [5, even.mean(), even.var() * 5, 4, odd.mean(), odd.var() * 4]
    np.testing.assert_allclose(rec, want, rtol=1e-6)
    assert rec[0] == 5 and rec[3] == 4


def test_bn_rules_reach_the_kernel_line():
    with pytest.raises(KernelError, match=r"stats_only.*\[bn_stats free size\] src has 513 elements per partition "
                                          r"> bn_stats_fmax 512"):
        stats_only.trace(TensorSpec((4, 513), "float32"), profile=TRN2)
    prog = mean_var.trace(TensorSpec((128, 1300), "bfloat16"), profile=TRN2)
    ops = [i.opcode for i in prog.instructions]
    assert ops.count("bn_stats") == 3 and ops.count("bn_aggr") == 1
    aggr = next(i for i in prog.instructions if isinstance(i, isa.BnAggr))
    assert aggr.src.shape == (128, 18) and aggr.dst.shape == (128, 2)

    @nk.kernel
    def odd_records(a):
        out = nl.ndarray((a.shape[0], 2), nl.float32, buffer=nl.hbm)
        mv = nl.ndarray((a.shape[0], 2), nl.float32)
        nisa.bn_aggr(mv, nl.load(a))
        nl.store(out, mv)
        return out

    with pytest.raises(KernelError, match=r"\[bn_aggr input\] src has 4 elements"):
        odd_records.trace(TensorSpec((8, 4), "float32"), profile=TRN2)
