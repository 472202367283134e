"""What the attention kernels (flash_attention_*, short_attention_*: one contract) must meet against a float64
reference: the error bounds their tests share."""

import math

import ml_dtypes
import numpy as np
import torch

# max |error| / max |reference|: a few roundings of the dtype (probabilities are rounded to it before P V; the
# backward also rounds dP - D and dS before their matmuls, hence twice the forward's)
TOL = {np.dtype(np.float32): 1e-5, np.dtype(ml_dtypes.bfloat16): 1e-2, np.dtype(np.float16): 2e-3}
BWD_TOL = {dt: 2 * tol for dt, tol in TOL.items()}
# logsumexp, absolute (relative to max(1, |lse|)): 16-bit inputs round P to their dtype before the row sums (as
# before P V, so the output is normalised by the sum of what it multiplied), so log(l) is off by up to the dtype's
# unit roundoff (eps / 2: 2^-8 bfloat16, 2^-11 float16) when few keys' rounding errors do not average out
LSE_TOL = {np.dtype(np.float32): 1e-5, **{np.dtype(t): float(ml_dtypes.finfo(t).eps) / 2
                                         for t in (ml_dtypes.bfloat16, np.float16)}}


def assert_close(actual, ref, tol, what, floor=0.0):
    """max |error| <= tol * max |reference| (or tol * floor when the reference is smaller than that)."""
    actual = actual.astype(np.float64)
    assert actual.shape == ref.shape, what
    assert np.isfinite(actual).all(), f"{what}: non-finite values"
    err = np.abs(actual - ref).max() / max(np.abs(ref).max(), floor, 1e-30)
    assert err <= tol, f"{what}: max error {err:.3g} of max |reference| > {tol}"


BAD = [math.inf, -math.inf, math.nan, 1e20]


def check_future_key(fwd, bwd, bh, s, d, dtype, bad, seed):
    """Causal attention with ``bad`` in one element of key j against torch's CPU kernel (float64 [1, BH, S, D],
    which fills the scores of future keys with -inf): the outputs are non-finite exactly where the CPU's are
    (queries before j never see key j: its +inf or NaN score must not meet an added -inf); queries before j
    match as usual (out, and dq where the CPU's is finite), and every gradient is finite and close wherever
    the CPU's is."""
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((bh, s, d)).astype(dtype) for _ in range(4))
    b, j, e = rng.integers(bh), rng.integers(1, s), rng.integers(d)
    # the floors of dS's cancellation (test_attention.grad_floors) from the finite inputs
    natural = float(np.abs(do.astype(np.float64)).max() * np.abs(v.astype(np.float64)).max())
    floor = 0.1 * natural * float(np.abs(k.astype(np.float64)).max())
    with np.errstate(over="ignore"):  # 1e20 is inf in float16
        k[b, j, e] = bad
    out, lse = fwd(q, k, v, causal=True)
    grads = bwd(do, q, k, v, out, lse, causal=True)
    t = [torch.tensor(x.astype(np.float64))[None].requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True)
    ref.backward(torch.tensor(do.astype(np.float64))[None])
    got, want = out.astype(np.float64), ref.detach().numpy()[0]
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(got), special(want))
    tol, btol = TOL[np.dtype(dtype)], BWD_TOL[np.dtype(dtype)]
    assert_close(got[b, :j], want[b, :j], tol, "out before the key")
    dq, ref_dq = grads[0].astype(np.float64)[b, :j], t[0].grad.numpy()[0][b, :j]
    fin = np.isfinite(ref_dq)  # the CPU's dS K has 0 * inf = NaN in the bad column too
    assert_close(dq[fin], ref_dq[fin], btol, "dq before the key", floor)
    kmax = float(np.abs(np.where(np.isfinite(k), k, 0).astype(np.float64)).max())  # 1e20 conditions dS K
    floors = (0.0, max(floor, 0.1 * natural * kmax), floor, 0.0)
    for name, g, r, fl in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *(x.grad for x in t)), floors,
                              strict=True):
        r = r.detach().numpy()[0]
        fin = np.isfinite(r)
        if fin.any():
            assert_close(g.astype(np.float64)[fin], r[fin], btol if name != "out" else tol, name, fl)
