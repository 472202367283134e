"""What the attention kernels (flash_attention_*, short_attention_*: one contract) must meet against a float64
reference: the error bounds their tests share."""

import ml_dtypes
import numpy as np

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
