"""NKI kernels written for these tests from NKI's API documentation (nki.language / nki.isa), in the current NKI
dialect: they would run unchanged under AWS's ``nki``. Imported by the tests through neuron-kernels' front end."""

from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import jit
from neuron_kernels.nki import language as nl


@jit
def tensor_add(a, b):
    """out = a + b, 128 rows at a time (quick-start style)."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, cols = a.shape
    for i in nl.affine_range((rows + nl.tile_size.pmax - 1) // nl.tile_size.pmax):
        start = i * nl.tile_size.pmax
        n = min(nl.tile_size.pmax, rows - start)
        ta = nl.ndarray((n, cols), dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((n, cols), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a[start:start + n, :])
        nisa.dma_copy(dst=tb, src=b[nl.ds(start, n), :])
        tc = nl.ndarray((n, cols), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=tc, data1=ta, data2=tb, op=nl.add)
        nisa.dma_copy(dst=out[start:start + n, :], src=tc)
    return out


@jit
def matmul(lhs_t, rhs):
    """out[M, N] = lhs_t[K, M].T @ rhs[K, N]: K in 128-row slabs accumulated in one PSUM tile per output block."""
    k_dim, m_dim = lhs_t.shape
    _, n_dim = rhs.shape
    tk, tm, tn = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((m_dim, n_dim), dtype=nl.float32, buffer=nl.hbm)
    for m in nl.affine_range(m_dim // tm):
        for n in nl.affine_range((n_dim + tn - 1) // tn):
            nn = min(tn, n_dim - n * tn)
            acc = nl.ndarray((tm, nn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // tk):
                lt = nl.ndarray((tk, tm), dtype=lhs_t.dtype, buffer=nl.sbuf)
                rt = nl.ndarray((tk, nn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lt, src=lhs_t[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
                nisa.dma_copy(dst=rt, src=rhs[k * tk:(k + 1) * tk, n * tn:n * tn + nn])
                nisa.nc_matmul(dst=acc, stationary=lt, moving=rt)
            res = nl.ndarray((tm, nn), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * tm:(m + 1) * tm, n * tn:n * tn + nn], src=res)
    return out


@jit
def transpose(x):
    """out[F, P] = x[P, F] through TensorE (P, F <= 128)."""
    p, f = x.shape
    out = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    tp = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=t)
    res = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=tp)
    nisa.dma_copy(dst=out, src=res)
    return out


@jit
def rmsnorm(x, gamma, eps):
    """out = x / sqrt(mean(x^2, -1) + eps) * gamma: activation with a fused sum, rsqrt with a float bias, gamma
    broadcast to every partition by an access pattern with partition step 0."""
    rows, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((rows + 127) // 128):
        start = i * 128
        n = min(128, rows - start)
        xt = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[start:start + n, :])
        g = nl.ndarray((n, d), dtype=gamma.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=g, src=gamma.ap(pattern=[[0, n], [1, d]]))
        sq = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rs = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rs, op=nl.rsqrt, data=ss, scale=1.0 / d, bias=eps)
        y = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xt, op0=nl.multiply, operand0=rs)
        yo = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=yo, data1=y, data2=g, op=nl.multiply)
        nisa.dma_copy(dst=out[start:start + n, :], src=yo)
    return out


@jit
def softmax(x):
    """Row softmax: tensor_reduce (max, negated) -> exp with that bias and a fused row sum -> reciprocal -> scale."""
    rows, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((rows + 127) // 128):
        start = i * 128
        n = min(128, rows - start)
        xt = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[start:start + n, :])
        neg_max = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=xt, axis=1, negate=True, keepdims=True)
        e = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=xt, bias=neg_max, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=s)
        y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=r)
        nisa.dma_copy(dst=out[start:start + n, :], src=y)
    return out


@jit
def causal_iota(x):
    """iota and affine_select: out[p, f] = x[p, f] where p >= f else -1, plus index[p, f] = 7 + p * F + f."""
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    index = nl.ndarray((p, f), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    m = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=m, pattern=[[-1, f]], offset=0, channel_multiplier=1, on_true_tile=t,
                       on_false_value=-1.0, cmp_op=nl.greater_equal)
    nisa.dma_copy(dst=out, src=m)
    idx = nl.ndarray((p, f), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=idx, pattern=[[1, f]], offset=7, channel_multiplier=f)
    nisa.dma_copy(dst=index, src=idx)
    return out, index


@jit
def attention(q, k, v, causal):
    """softmax(q @ k.T / sqrt(d)) @ v for one head (S <= 128, d <= 128): TensorE transposes and matmuls, VectorE
    max, ScalarE exp with a fused row sum, GpSimd causal mask, the 1/sum applied to the output."""
    s, d = q.shape
    out = nl.ndarray((s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    qt, kt = [], []
    for src in (q, k):
        t = nl.ndarray((s, d), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        tp = nl.ndarray((d, s), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=t)
        ts = nl.ndarray((d, s), dtype=src.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=ts, src=tp)
        (qt if src is q else kt).append(ts)
    vt = nl.ndarray((s, d), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=vt, src=v)
    scores = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=scores, stationary=qt[0], moving=kt[0])
    sc = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=sc, data=scores, op0=nl.multiply, operand0=1.0 / d ** 0.5)
    if causal:  # keep key j <= query i: i - j >= 0
        nisa.affine_select(dst=sc, pattern=[[-1, s]], offset=0, channel_multiplier=1, on_true_tile=sc,
                           on_false_value=-30000.0, cmp_op=nl.greater_equal)
    neg_max = nl.ndarray((s, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=sc, axis=1, negate=True)
    probs = nl.ndarray((s, s), dtype=q.dtype, buffer=nl.sbuf)
    total = nl.ndarray((s, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=probs, op=nl.exp, data=sc, bias=neg_max, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    pt_psum = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=pt_psum, data=probs)
    pt = nl.ndarray((s, s), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=pt, src=pt_psum)
    o = nl.ndarray((s, d), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=o, stationary=pt, moving=vt)
    inv = nl.ndarray((s, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=total)
    res = nl.ndarray((s, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=res, data=o, op0=nl.multiply, operand0=inv)
    nisa.dma_copy(dst=out, src=res)
    return out
