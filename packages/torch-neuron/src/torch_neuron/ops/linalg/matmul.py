"""Matrix products on TensorE: mm, bmm, addmm, baddbmm, addbmm, addmv, mv, dot, vdot (functional, out=,
in-place).

``matmul`` and ``linear`` are CompositeImplicit in aten and reach these (nn.Linear: ``addmm`` forward for
flattened inputs with a bias, ``mm``/``matmul`` without; ``mm`` for both weight and input gradients, the
operands being ``t()`` views). A non-contiguous operand that is the transpose of a contiguous matrix (a
``t()`` / ``transpose(-2, -1)`` view) is handed to the kernel as that matrix with its transpose flag, so
nothing is copied; other strided operands are made contiguous first.

dtypes: float32, bfloat16, float16 (products accumulate in FP32 in PSUM and round once to the input
dtype, as torch does). Everything else (float64, integers: TensorE multiplies in FP32, inexact for large
integers; complex) runs on the CPU through ``on_cpu``, loudly.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import matmul, movement
from neuron_kernels.lru import LRU

from ..core.checks import meta_result, out_dtype_error, same_device, zeros
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import CACHE_ENTRIES, execute, prepared, recall, run
from ..core.variants import write_out

aten = torch.ops.aten


# -- operands --------------------------------------------------------------------------------------
def _last2(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(tensor, transposed): t itself when contiguous, the contiguous matrix t is the transpose of (the
    kernel's transpose flag), else a contiguous copy. Works on 2-D and batched 3-D operands."""
    if t.is_contiguous():
        return t, False
    tt = t.transpose(-2, -1)
    if tt.is_contiguous():
        return tt, True
    return t.contiguous(), False


def _bias2d(bias: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """The smallest contiguous view of a bias broadcastable to [m, n] the kernel takes: [], [n], [m, 1] or
    [m, n] (an expanded bias is read through its distinct elements, not materialized)."""
    e = bias.expand(m, n)
    s0, s1 = e.stride()
    row0 = s0 == 0 or m == 1
    col0 = s1 == 0 or n == 1
    if row0 and col0:
        return e[0, 0]
    if row0 and (s1 == 1):
        return e[0]
    if col0 and (s0 == 1):
        return e[:, :1]
    return e.contiguous()


def _gemm(op: str, a, b, bias=None, alpha=1.0, beta=1.0, blas_alpha=True, out_dtype=None,
          residual=None, activation=None):
    """beta * bias + alpha * (a @ b) for 2-D a [m, k], b [k, n] of one float dtype (bias optional).
    ``blas_alpha``: alpha == 0 ignores a and b as BLAS (and torch's GEMMs) do, NaN and inf included.
    ``out_dtype``: the result in a's dtype, then cast to this one (the kernel's store converts it).
    ``residual``: a contiguous [m, n] tensor the result (in a's dtype) is added to, in ``out_dtype``.
    ``activation`` (matmul.ACTIVATIONS; m, n, k > 0 and alpha != 0): returns (result, its activation)."""
    m, k = a.shape
    n = b.shape[1]
    if out_dtype is not None and out_dtype != a.dtype:
        cast = {"out_dtype": out_dtype}
    else:
        out_dtype, cast = a.dtype, {}
    if residual is not None:
        cast["residual"] = residual
    if activation is not None:
        cast["activation"] = activation
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=a.device)
    if k == 0 or (alpha == 0 and blas_alpha):  # no products: beta * bias (torch ignores bias when beta == 0)
        prod = zeros(op, (m, n), a.dtype, a.device)
        if bias is not None and beta != 0:
            prod = run(op, ew.add, prod, _bias2d(bias, m, n).contiguous(), alpha=beta)[0]
        return prod.to(out_dtype) if residual is None else torch.add(residual, prod)
    (x, ta), (y, tb) = _last2(a), _last2(b)
    if bias is None:
        return _launch(op, (a, b), matmul.matmul, (x, y), dict(transpose_a=ta, transpose_b=tb, **cast))
    return _launch(op, (bias, a, b), matmul.addmm, (_bias2d(bias, m, n), x, y),
                   dict(alpha=float(alpha), beta=float(beta), transpose_a=ta, transpose_b=tb, **cast))


def mm_to(a, b, dtype: torch.dtype) -> torch.Tensor:
    """``mm(a, b).to(dtype)`` in one kernel (a compiled graph's cast folded into the matmul's store)."""
    if not _native(a, b) or a.dtype != b.dtype:
        return mm(a, b).to(dtype)
    return _gemm("mm", a, b, out_dtype=dtype)


def gemm_add(residual, a, b, bias=None, *, beta=1, alpha=1) -> torch.Tensor:
    """``residual + mm(a, b)`` (``residual + addmm(bias, a, b, ...)`` with a bias) in one kernel: a compiled graph's
    add after a matmul (a residual connection), the product rounded to its dtype, then added as the add would."""
    plain = _native(residual, a, b, bias) and a.dtype == b.dtype and (bias is None or bias.dtype == a.dtype)
    if not plain or residual.shape != (a.shape[0], b.shape[1]):
        return torch.add(residual, mm(a, b) if bias is None else addmm(bias, a, b, beta=beta, alpha=alpha))
    out_dtype = torch.promote_types(residual.dtype, a.dtype)
    op = "mm+add" if bias is None else "addmm+add"  # not the plain ops' names: their fast path has no residual
    return _gemm(op, a, b, bias, alpha, beta, out_dtype=out_dtype, residual=residual.contiguous())


def gemm_act(a, b, bias=None, activation: str = "gelu", *, beta=1, alpha=1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p, f(p))`` for ``p = mm(a, b)`` (``addmm(bias, a, b, ...)`` with a bias) and ``f`` the activation named
    (matmul.ACTIVATIONS: the op's own kernel is that one ScalarE activation), in one kernel: a compiled graph's
    activation after a matmul whose output is also kept (saved for the activation's backward)."""
    plain = _native(a, b, bias) and a.dtype == b.dtype and (bias is None or bias.dtype == a.dtype)
    if plain and a.shape[0] and b.shape[1] and a.shape[1] and alpha != 0:  # else as the ops (empty, BLAS alpha)
        return _gemm("mm+act" if bias is None else "addmm+act", a, b, bias, alpha, beta, activation=activation)
    product = mm(a, b) if bias is None else addmm(bias, a, b, beta=beta, alpha=alpha)
    return product, _ACTIVATION_OPS[activation](product)


_ACTIVATION_OPS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
                   "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def addmm_to(bias, a, b, dtype: torch.dtype, *, beta=1, alpha=1) -> torch.Tensor:
    """``addmm(bias, a, b, beta=beta, alpha=alpha).to(dtype)`` in one kernel (see mm_to)."""
    if not _native(bias, a, b) or a.dtype != b.dtype or bias.dtype != a.dtype:
        return addmm(bias, a, b, beta=beta, alpha=alpha).to(dtype)
    meta_result(aten.addmm.default, bias, a, b, beta=beta, alpha=alpha)
    return _gemm("addmm", a, b, bias, alpha, beta, out_dtype=dtype)


def _bgemm(op: str, a, b, fp32: bool = False) -> torch.Tensor:
    """a [B, m, k] @ b [B, k, n]; ``fp32``: in float32 (16-bit operands widened exactly) for an epilogue that
    must round once at the end."""
    bs, m, k = a.shape
    n = b.shape[2]
    dtype = torch.float32 if fp32 else a.dtype
    if bs * m * n == 0:
        return torch.empty((bs, m, n), dtype=dtype, device=a.device)
    if k == 0:
        return zeros(op, (bs, m, n), dtype, a.device)
    (x, ta), (y, tb) = _last2(a), _last2(b)
    if fp32 and x.dtype != torch.float32:
        x, y = (run(op, movement.copy, t, dtype=torch.float32)[0] for t in (x, y))
    return _launch(op, (a, b), matmul.bmm, (x, y), dict(transpose_a=ta, transpose_b=tb))


# -- per-signature fast path -------------------------------------------------------------------------
# A launch binds tensors by address only, and the views the kernel is given (a transpose, a bias row) start
# at their tensor's address. So a call whose operands are all such views is remembered by its signature
# (shapes, strides, dtypes, devices, constants: everything the checks and the view choices depend on) and
# the next call with that signature goes straight to the prepared launch with the caller's tensors: the
# per-call overhead of a tiny matmul is the kernel's, not the checks'.
_FAST = LRU(CACHE_ENTRIES)  # signature -> (weak reference to the launch, constants)
_FAST_OPS = frozenset({"mm", "bmm", "addmm"})  # the ops that look their calls up (others share _gemm)


def _signature(op: str, tensors, consts=()) -> tuple:
    return (op, *consts, *[(t.shape, t.stride(), t.dtype, t.get_device()) for t in tensors])


def _launch(op: str, tensors, kernel, args, kwargs):
    """Run ``kernel(*args, **kwargs)`` (its output, or a tuple of them); remember the launch for ``tensors``'
    signature when every argument is a view at the address of the tensor in the same place (no operand was
    copied)."""
    launch = prepared(kernel, args, kwargs)
    if op in _FAST_OPS and all(x.data_ptr() == t.data_ptr() for x, t in zip(args, tensors)):
        _FAST[_signature(op, tensors, _consts(kwargs))] = (weakref.ref(launch), kwargs)
    outs = execute(op, launch, args, kwargs)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _consts(kwargs) -> tuple:
    return tuple((k, v) for k, v in kwargs.items() if k in ("alpha", "beta", "out_dtype"))


def _fast(op: str, tensors, consts=()) -> torch.Tensor | None:
    hit = _FAST.get(_signature(op, tensors, consts))
    launch = recall(hit[0]) if hit is not None else None  # None once the launch cache let it go
    return None if launch is None else execute(op, launch, tensors, hit[1])[0]


def _native(*tensors) -> bool:
    same_device(*tensors)
    return all(t is None or t.dtype in FLOATS for t in tensors)


def _strict_out(overload, out: torch.Tensor, result: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """out= of the structured matmul ops: the dtype must be the result's (torch's error otherwise)."""
    if out.dtype != result.dtype:
        out_dtype_error(overload, out, result, *args, **kwargs)
    return write_out(out, result)


# -- mm / bmm ----------------------------------------------------------------------------------------
def mm(a, b):
    hit = _fast("mm", (a, b))
    if hit is not None:
        return hit
    meta_result(aten.mm.default, a, b)
    if not _native(a, b):
        return on_cpu(aten.mm.default, a, b)
    return _gemm("mm", a, b)


def mm_out(a, b, *, out):
    return _strict_out(aten.mm.out, out, mm(a, b), a, b)


def bmm(a, b):
    hit = _fast("bmm", (a, b))
    if hit is not None:
        return hit
    meta_result(aten.bmm.default, a, b)
    if not _native(a, b):
        return on_cpu(aten.bmm.default, a, b)
    return _bgemm("bmm", a, b)


def bmm_out(a, b, *, out):
    return _strict_out(aten.bmm.out, out, bmm(a, b), a, b)


# -- addmm / baddbmm / addbmm ----------------------------------------------------------------------
def addmm(bias, a, b, *, beta=1, alpha=1):
    hit = _fast("addmm", (bias, a, b), (("alpha", float(alpha)), ("beta", float(beta))))
    if hit is not None:
        return hit
    meta_result(aten.addmm.default, bias, a, b, beta=beta, alpha=alpha)
    if not _native(bias, a, b):
        return on_cpu(aten.addmm.default, bias, a, b, beta=beta, alpha=alpha)
    return _gemm("addmm", a, b, bias, alpha, beta)


def addmm_out(bias, a, b, *, beta=1, alpha=1, out):
    kw = dict(beta=beta, alpha=alpha)
    return _strict_out(aten.addmm.out, out, addmm(bias, a, b, **kw), bias, a, b, **kw)


def addmm_(self, a, b, *, beta=1, alpha=1):
    meta_result(aten.addmm_.default, self, a, b, beta=beta, alpha=alpha)
    return self.copy_(addmm(self, a, b, beta=beta, alpha=alpha))


def _scaled_sum(op: str, prod: torch.Tensor, bias, alpha, beta) -> torch.Tensor:
    """beta * bias + alpha * prod on the engines (bias ignored when beta == 0, as torch)."""
    if alpha != 1:
        prod = run(op, ew.mul, prod, alpha)[0]
    if beta == 0:
        return prod
    bias = bias.expand(prod.shape)
    bias = bias if bias.is_contiguous() else bias.contiguous()
    return run(op, ew.add, prod, bias, alpha=beta)[0]


def baddbmm(bias, a, b, *, beta=1, alpha=1):
    meta_result(aten.baddbmm.default, bias, a, b, beta=beta, alpha=alpha)
    if not _native(bias, a, b):
        return on_cpu(aten.baddbmm.default, bias, a, b, beta=beta, alpha=alpha)
    if alpha == 1 and beta == 0:
        return _bgemm("baddbmm", a, b)
    # torch rounds beta * bias + alpha * (a @ b) once: 16-bit operands go through float32
    prod = _bgemm("baddbmm", a, b, fp32=True)
    if prod.numel() == 0:
        return prod.to(a.dtype)
    out = _scaled_sum("baddbmm", prod, bias, alpha, beta)
    return out if a.dtype == torch.float32 else run("baddbmm", movement.copy, out, dtype=a.dtype)[0]


def baddbmm_out(bias, a, b, *, beta=1, alpha=1, out):
    kw = dict(beta=beta, alpha=alpha)
    return _strict_out(aten.baddbmm.out, out, baddbmm(bias, a, b, **kw), bias, a, b, **kw)


def baddbmm_(self, a, b, *, beta=1, alpha=1):
    meta_result(aten.baddbmm_.default, self, a, b, beta=beta, alpha=alpha)
    return self.copy_(baddbmm(self, a, b, beta=beta, alpha=alpha))


def _flatten_batches(a, b):
    """a [B, m, k], b [B, k, n] -> [m, B*k] and [B*k, n]: sum_i a[i] @ b[i] as one GEMM."""
    bs, m, k = a.shape
    return a.permute(1, 0, 2).reshape(m, bs * k), b.reshape(bs * k, b.shape[2])


def addbmm(bias, a, b, *, beta=1, alpha=1):
    meta_result(aten.addbmm.default, bias, a, b, beta=beta, alpha=alpha)
    if not _native(bias, a, b):
        return on_cpu(aten.addbmm.default, bias, a, b, beta=beta, alpha=alpha)
    if a.dtype == torch.float32 or a.shape[0] <= 1:
        x, y = _flatten_batches(a, b)
        return _gemm("addbmm", x, y, bias, alpha, beta)
    # torch accumulates batch by batch, rounding each addmm to the dtype: 16-bit results follow it
    out = _gemm("addbmm", a[0], b[0], bias, alpha, beta)
    for i in range(1, a.shape[0]):
        out = _gemm("addbmm", a[i], b[i], out, alpha, 1)
    return out


def addbmm_out(bias, a, b, *, beta=1, alpha=1, out):
    kw = dict(beta=beta, alpha=alpha)
    return _strict_out(aten.addbmm.out, out, addbmm(bias, a, b, **kw), bias, a, b, **kw)


def addbmm_(self, a, b, *, beta=1, alpha=1):
    meta_result(aten.addbmm_.default, self, a, b, beta=beta, alpha=alpha)
    return self.copy_(addbmm(self, a, b, beta=beta, alpha=alpha))


# -- matrix-vector and vector-vector ---------------------------------------------------------------
def addmv(bias, mat, vec, *, beta=1, alpha=1):
    meta_result(aten.addmv.default, bias, mat, vec, beta=beta, alpha=alpha)
    if not _native(bias, mat, vec):
        return on_cpu(aten.addmv.default, bias, mat, vec, beta=beta, alpha=alpha)
    m = mat.shape[0]
    col = bias.expand(m).unsqueeze(1)  # [m, 1]: the bias of a one-column GEMM
    return _gemm("addmv", mat, vec.unsqueeze(1), col, alpha, beta).squeeze(1)


def addmv_out(bias, mat, vec, *, beta=1, alpha=1, out):
    kw = dict(beta=beta, alpha=alpha)
    return _strict_out(aten.addmv.out, out, addmv(bias, mat, vec, **kw), bias, mat, vec, **kw)


def addmv_(self, mat, vec, *, beta=1, alpha=1):
    meta_result(aten.addmv_.default, self, mat, vec, beta=beta, alpha=alpha)
    return self.copy_(addmv(self, mat, vec, beta=beta, alpha=alpha))


def mv(mat, vec):
    meta_result(aten.mv.default, mat, vec)
    if not _native(mat, vec):
        return on_cpu(aten.mv.default, mat, vec)
    return _gemm("mv", mat, vec.unsqueeze(1)).squeeze(1)


def mv_out(mat, vec, *, out):
    return _strict_out(aten.mv.out, out, mv(mat, vec), mat, vec)


def _dot(op: str, overload, a, b):
    meta_result(overload, a, b)
    if not _native(a, b):
        return on_cpu(overload, a, b)
    return _gemm(op, a.unsqueeze(0), b.unsqueeze(1)).reshape(())


def dot(a, b):
    return _dot("dot", aten.dot.default, a, b)


def vdot(a, b):  # conj(a) . b: real dtypes only reach the kernel (complex takes the CPU)
    return _dot("vdot", aten.vdot.default, a, b)


def dot_out(a, b, *, out):
    return _strict_out(aten.dot.out, out, dot(a, b), a, b)


def vdot_out(a, b, *, out):
    return _strict_out(aten.vdot.out, out, vdot(a, b), a, b)


# -- outer-product update ----------------------------------------------------------------------------
def addr(bias, vec1, vec2, *, beta=1, alpha=1):
    """beta * bias + alpha * outer(vec1, vec2) as a K=1 GEMM: one rounding, like torch's fused kernel."""
    meta = meta_result(aten.addr.default, bias, vec1, vec2, beta=beta, alpha=alpha)
    if not _native(bias, vec1, vec2) or not bias.dtype == vec1.dtype == vec2.dtype == meta.dtype:
        return on_cpu(aten.addr.default, bias, vec1, vec2, beta=beta, alpha=alpha)
    if meta.dtype in (torch.bfloat16, torch.float16):
        return _addr16(bias, vec1, vec2, beta, alpha, meta.dtype)
    # unlike the GEMMs, addr multiplies even when alpha == 0 (0 * inf is NaN)
    return _gemm("addr", vec1.unsqueeze(1), vec2.unsqueeze(0), bias, alpha, beta, blas_alpha=False)


def _addr16(bias, vec1, vec2, beta, alpha, dtype):
    """16-bit addr as torch's CPU computes it: every step in the dtype, each rounded (alpha and beta too):
    ``beta * bias + (alpha * vec1) outer vec2``; a fused one-rounding result differs by more than the
    bf16 tolerance where the two terms cancel. beta == 0 ignores bias (NaN in it does not propagate)."""
    al, be = (float(torch.tensor(float(v), dtype=dtype)) for v in (alpha, beta))
    scaled = run("addr", ew.mul, _contig(vec1), al)[0]
    outer = run("addr", ew.mul, scaled.unsqueeze(1), _contig(vec2).unsqueeze(0))[0]
    if be == 0:
        return outer
    return run("addr", ew.add, run("addr", ew.mul, _contig(bias), be)[0], outer)[0]


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def addr_out(bias, vec1, vec2, *, beta=1, alpha=1, out):
    return write_out(out, addr(bias, vec1, vec2, beta=beta, alpha=alpha))


def addr_(self, vec1, vec2, *, beta=1, alpha=1):
    meta_result(aten.addr_.default, self, vec1, vec2, beta=beta, alpha=alpha)
    return self.copy_(addr(self, vec1, vec2, beta=beta, alpha=alpha))
