"""``linalg_matrix_exp`` composed from device ops: scaling and squaring with a [7/7] Padé approximant
(Higham 2005, the single-precision thresholds). float32 only.

NOT registered yet: on op_db's second matrix_exp sample (entries up to ~1e3, four squarings) no float32
algorithm other than the CPU's own matches the CPU to 1e-4 elementwise — against the float64 exponential
this one is off by 2.4x the tolerance at worst, the CPU's float32 result by 3.1x. Registering it would turn
a passing (fallback) op_db entry into a failing one; the op stays on the loud CPU path until the lead
decides. ``linalg_matrix_exp`` below is the kernel to register (tests call it directly).

Each matrix is scaled by its own 2^-s (s from its 1-norm) so that the Padé approximant is accurate to float32
rounding; the numerator and denominator are GEMMs on TensorE, the quotient one device LU solve, and the
squarings run for the largest s of the batch with matrices that need fewer keeping their value (a select).
"""

from __future__ import annotations

import torch

from ..core.checks import meta_result
from ..core.fallback import on_cpu
from ..core.registry import note_native
from .cholesky import batched, eye, native
from .lu import lu_factor
from .solve import lu_solve

aten = torch.ops.aten
THETA7 = 3.925724783138660  # largest 1-norm at which [7/7] Padé is exact to single precision (Higham, table 2.1)
PADE7 = (17297280.0, 8648640.0, 1995840.0, 277200.0, 25200.0, 1512.0, 56.0, 1.0)
MAX_SQUARINGS = 64  # beyond this the result overflows float32 anyway


def _pade7(a: torch.Tensor) -> torch.Tensor:
    """r_77(A) = (V - U)^-1 (V + U) for a batch [B, n, n] with ||A||_1 <= THETA7."""
    b = PADE7
    n = a.shape[-1]
    ident = eye(n, a.device).expand(a.shape)
    a2 = torch.bmm(a, a)
    a4 = torch.bmm(a2, a2)
    a6 = torch.bmm(a4, a2)
    u = torch.bmm(a, b[7] * a6 + b[5] * a4 + b[3] * a2 + b[1] * ident)
    v = b[6] * a6 + b[4] * a4 + b[2] * a2 + b[0] * ident
    w = (v - u).contiguous()
    piv, _ = lu_factor(w)
    return lu_solve(w, piv, v + u, True, False, a.shape)


def matrix_exp_batched(a: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.matrix_norm(a, 1)
    s = torch.ceil(torch.log2(norm / THETA7)).clamp(0, MAX_SQUARINGS)
    s = torch.where(torch.isnan(s), 0.0, s)  # NaN input: no scaling, the NaN propagates
    x = _pade7(a * torch.pow(2.0, -s).view(-1, 1, 1))
    for i in range(int(s.amax())):  # one host sync: how many squarings the batch needs
        x = torch.where((s > i).view(-1, 1, 1), torch.bmm(x, x), x)
    return x


def linalg_matrix_exp(a):
    meta = meta_result(aten.linalg_matrix_exp.default, a)
    if not native(a):
        return on_cpu(aten.linalg_matrix_exp.default, a)
    if a.numel() == 0:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=a.device)
    n = a.shape[-1]
    note_native("linalg_matrix_exp")
    return matrix_exp_batched(batched(a, a.shape[:-2], n, n)).reshape(meta.shape)

