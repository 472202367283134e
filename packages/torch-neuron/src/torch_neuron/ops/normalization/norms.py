"""Normalization layers: ``native_layer_norm``, ``_fused_rms_norm`` (what ``F.rms_norm`` dispatches to once a
device has it) and ``native_group_norm``, forward and backward, on the ``norms`` kernels.

The kernels normalize the last dim of a contiguous ``[rows, D]`` view (group norm: ``[N, C, HxW]``) and
return fp32 statistics; they are handed back in torch's CPU dtype: the input's, or fp32 when a 16-bit
input comes with fp32 parameters ("mixed type"), and always fp32 for rms_norm's ``rstd``.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import movement, norms

from ..core.checks import same_device
from ..core.compose import const, write_outs
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig

aten = torch.ops.aten


def param_dtype(x: torch.Tensor, *params) -> torch.dtype | None:
    """dtype of the statistics, or None when torch's CPU kernel would refuse the combination."""
    given = {p.dtype for p in params if p is not None}
    if x.dtype not in FLOATS or not given <= {x.dtype, torch.float32}:
        return None
    if x.dtype != torch.float32 and torch.float32 in given:
        return torch.float32 if given == {torch.float32} else None
    return x.dtype


def _as(t: torch.Tensor, dtype: torch.dtype, shape, op: str) -> torch.Tensor:
    t = t.view(shape)
    return t if t.dtype == dtype else run(op, movement.copy, t, dtype)[0]


def _flat(p: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if p is None else contig(p).view(n)


# -- layer norm -----------------------------------------------------------------------------------
def _rows(x: torch.Tensor, normalized_shape):
    axis = x.dim() - len(normalized_shape)
    if axis < 0 or tuple(x.shape[axis:]) != tuple(normalized_shape):
        return None
    return axis, math.prod(x.shape[:axis]), math.prod(normalized_shape)


def layer_norm(input, normalized_shape, weight, bias, eps, out_dtype=None):  # noqa: A002
    """aten.native_layer_norm; ``out_dtype`` (compiled graphs): the output then cast to it, in the same kernel."""
    same_device(input, weight, bias)
    sdt, rows = param_dtype(input, weight, bias), _rows(input, normalized_shape)
    if sdt is None or rows is None or rows[2] == 0:
        out, mean, rstd = on_cpu(aten.native_layer_norm.default, input, normalized_shape, weight, bias, eps)
        return (out if out_dtype is None else out.to(out_dtype)), mean, rstd
    axis, m, d = rows
    stat_shape = tuple(input.shape[:axis]) + (1,) * len(normalized_shape)
    if m == 0:
        empty = torch.empty(stat_shape, dtype=sdt, device=input.device)
        out = torch.empty_like(input, dtype=out_dtype or input.dtype, memory_format=torch.contiguous_format)
        return out, empty, empty.clone()
    x2 = contig(input).view(m, d)
    cast = {"out_dtype": out_dtype} if out_dtype is not None and out_dtype != input.dtype else {}
    out, mean, rstd = run("native_layer_norm", norms.layer_norm, x2, _flat(weight, d), _flat(bias, d), float(eps),
                          **cast)
    op = "native_layer_norm"
    return out.view(input.shape), _as(mean, sdt, stat_shape, op), _as(rstd, sdt, stat_shape, op)


def _grads(outs, mask, shapes) -> list:
    it = iter(outs)
    return [next(it).view(shape) if want else None for want, shape in zip(mask, shapes)]


def layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask,  # noqa: A002
                        *, residual=None, cast_dtype=None):
    """aten.native_layer_norm_backward. With ``residual`` or ``cast_dtype`` (compiled graphs: the add and the cast
    after the backward, written by its kernel): ``(grad_input + residual, grad_input.to(cast_dtype) or None,
    grad_weight, grad_bias)``, the same values as the op, then ``torch.add``, then ``_to_copy``."""
    return _with_epilogue("native_layer_norm_backward", _ln_backward,
                          (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask), residual,
                          cast_dtype)


def _with_epilogue(op: str, backward, args: tuple, residual, cast_dtype) -> tuple:
    """``backward(*args)`` (a norm backward; ``args[1]`` its input, ``args[-1]`` its output_mask) with grad_input
    plus ``residual`` and cast to ``cast_dtype`` (the cast inserted after grad_input): by the kernel where it
    takes them (``backward(*args, residual, cast_dtype)`` returns one output more then), else by torch ops."""
    if residual is None and cast_dtype is None:
        return backward(*args)
    x, mask = args[1], args[-1]
    if not mask[0]:
        raise ValueError(f"{op}: residual and cast_dtype need grad_input (output_mask[0])")
    epilogue = (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                     and residual.device == x.device)) and \
        (cast_dtype is None or cast_dtype in FLOATS)
    grads = backward(*args, residual if epilogue else None, cast_dtype if epilogue else None)
    if epilogue and len(grads) == len(mask) + 1:  # the kernel wrote them
        return tuple(grads)
    dx = grads[0] if residual is None else torch.add(residual, grads[0])
    return dx, None if cast_dtype is None else dx.to(cast_dtype), *grads[1:]


def _epilogue_kwargs(residual, cast_dtype, m: int, d: int) -> dict:
    """The norm backward kernel's grad_input epilogue arguments (none: the plain backward)."""
    epilogue = {}
    if residual is not None:
        epilogue["residual"] = contig(residual).view(m, d)
    if cast_dtype is not None:
        epilogue["cast_dtype"] = cast_dtype
    return epilogue


def _epilogue_grads(outs, mask, shapes, epilogue: dict) -> tuple:
    """The grads of a norm backward kernel's outputs; with an epilogue, grad_input's cast (or None) after it."""
    if not epilogue:
        return tuple(_grads(outs, mask, shapes))
    outs = list(outs)
    cast = outs.pop(1).view(shapes[0]) if "cast_dtype" in epilogue else None
    dx, *rest = _grads(outs, mask, shapes)
    return dx, cast, *rest


def _ln_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask,  # noqa: A002
                 residual=None, cast_dtype=None):
    """The op's grads; the kernel's 4-tuple (see layer_norm_backward) when it takes ``residual``/``cast_dtype``."""
    same_device(input, grad_out, mean, rstd, weight, bias)
    rows = _rows(input, normalized_shape)
    mask = [bool(output_mask[0]), bool(output_mask[1]) and weight is not None, bool(output_mask[2])]
    if (param_dtype(input, weight, bias) is None or rows is None or rows[2] == 0 or grad_out.dtype != input.dtype
            or grad_out.shape != input.shape or not any(mask)):
        return on_cpu(aten.native_layer_norm_backward.default, grad_out, input, normalized_shape, mean, rstd, weight,
                      bias, output_mask)
    _, m, d = rows
    shapes = (input.shape, tuple(normalized_shape), tuple(normalized_shape))
    pdt = weight.dtype if weight is not None else grad_out.dtype
    if m == 0:
        return (torch.empty_like(input) if mask[0] else None, *(const(s, 0, pdt, input.device) if w else None
                                                                for w, s in zip(mask[1:], shapes[1:])))
    epilogue = _epilogue_kwargs(residual, cast_dtype, m, d)
    outs = run("native_layer_norm_backward", norms.layer_norm_backward, contig(grad_out).view(m, d),
               contig(input).view(m, d), contig(mean).view(m, 1), contig(rstd).view(m, 1), _flat(weight, d),
               tuple(mask), **epilogue)
    return _epilogue_grads(outs, mask, shapes, epilogue)


# -- rms norm --------------------------------------------------------------------------------------
def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    same_device(input, weight)
    rows = _rows(input, normalized_shape)
    if param_dtype(input, weight) is None or rows is None or rows[2] == 0:
        return on_cpu(aten._fused_rms_norm.default, input, normalized_shape, weight, eps)
    axis, m, d = rows
    stat_shape = tuple(input.shape[:axis]) + (1,) * len(normalized_shape)
    if m == 0:
        return (torch.empty_like(input, memory_format=torch.contiguous_format),
                torch.empty(stat_shape, dtype=torch.float32, device=input.device))
    out, rstd = run("_fused_rms_norm", norms.rms_norm, contig(input).view(m, d), _flat(weight, d),
                    None if eps is None else float(eps))
    return out.view(input.shape), rstd.view(stat_shape)


def rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask,  # noqa: A002
                      *, residual=None, cast_dtype=None):
    """aten._fused_rms_norm_backward. With ``residual`` or ``cast_dtype`` (compiled graphs, as layer_norm_backward):
    ``(grad_input + residual, grad_input.to(cast_dtype) or None, grad_weight)``."""
    return _with_epilogue("_fused_rms_norm_backward", _rms_backward,
                          (grad_out, input, normalized_shape, rstd, weight, output_mask), residual, cast_dtype)


def _rms_backward(grad_out, input, normalized_shape, rstd, weight, output_mask,  # noqa: A002
                  residual=None, cast_dtype=None):
    """The op's grads; the kernel's 3-tuple (see rms_norm_backward) when it takes ``residual``/``cast_dtype``."""
    same_device(input, grad_out, rstd, weight)
    rows = _rows(input, normalized_shape)
    mask = [bool(output_mask[0]), bool(output_mask[1]) and weight is not None]
    if (param_dtype(input, weight) is None or rows is None or rows[2] == 0 or grad_out.dtype != input.dtype
            or grad_out.shape != input.shape or not any(mask)):
        return on_cpu(aten._fused_rms_norm_backward.default, grad_out, input, normalized_shape, rstd, weight,
                      output_mask)
    _, m, d = rows
    shapes = (input.shape, tuple(normalized_shape))
    if m == 0:
        return (torch.empty_like(input) if mask[0] else None,
                const(shapes[1], 0, weight.dtype, input.device) if mask[1] else None)
    epilogue = _epilogue_kwargs(residual, cast_dtype, m, d)
    outs = run("_fused_rms_norm_backward", norms.rms_norm_backward, contig(grad_out).view(m, d),
               contig(input).view(m, d), contig(rstd).view(m, 1), _flat(weight, d), tuple(mask), **epilogue)
    return _epilogue_grads(outs, mask, shapes, epilogue)


# -- group norm ------------------------------------------------------------------------------------
def group_norm(input, weight, bias, N, C, HxW, group, eps):  # noqa: A002, N803
    same_device(input, weight, bias)
    sdt = param_dtype(input, weight, bias)
    if sdt is None or HxW == 0 or input.numel() != N * C * HxW or C % group:
        return on_cpu(aten.native_group_norm.default, input, weight, bias, N, C, HxW, group, eps)
    if N * C == 0:
        return (torch.empty_like(input, memory_format=torch.contiguous_format),
                torch.empty((N, group), dtype=sdt, device=input.device),
                torch.empty((N, group), dtype=sdt, device=input.device))
    x = contig(input).view(N, C, HxW)
    out, mean, rstd = run("native_group_norm", norms.group_norm, x, _flat(weight, C), _flat(bias, C), int(group),
                          float(eps))
    op = "native_group_norm"
    return out.view(input.shape), _as(mean, sdt, (N, group), op), _as(rstd, sdt, (N, group), op)


def group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):  # noqa: A002, N803
    same_device(input, grad_out, mean, rstd, weight)
    mask = [bool(output_mask[0]), bool(output_mask[1]) and weight is not None, bool(output_mask[2])]
    if (param_dtype(input, weight) is None or HxW == 0 or grad_out.dtype != input.dtype or C % group
            or grad_out.shape != input.shape or input.numel() != N * C * HxW or not any(mask)):
        return on_cpu(aten.native_group_norm_backward.default, grad_out, input, mean, rstd, weight, N, C, HxW, group,
                      output_mask)
    shapes = (input.shape, (C,), (C,))
    pdt = weight.dtype if weight is not None else grad_out.dtype
    if N * C == 0:
        return (torch.empty_like(input) if mask[0] else None, *(const(s, 0, pdt, input.device) if w else None
                                                                for w, s in zip(mask[1:], shapes[1:])))
    outs = run("native_group_norm_backward", norms.group_norm_backward, contig(grad_out).view(N, C, HxW),
               contig(input).view(N, C, HxW), contig(mean).view(N, group), contig(rstd).view(N, group),
               _flat(weight, C), int(group), tuple(mask))
    return tuple(_grads(outs, mask, shapes))


def _triple_out(fn):
    def run_out(*args, out0, out1, out2):
        return write_outs((out0, out1, out2), fn(*args))
    return run_out
