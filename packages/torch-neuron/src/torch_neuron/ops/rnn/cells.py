"""The fused LSTM and GRU cell ops that ``nn.LSTM`` / ``nn.GRU`` / their cells call on non-CPU devices.

aten's RNN cells compute the gate pre-activations with ``linear`` and then, off the CPU, call
``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell`` (autograd: ``_thnn_fused_lstm_cell_backward_impl`` /
``_thnn_fused_gru_cell_backward``, or the composite ``_thnn_differentiable_*`` when the backward itself is
differentiated). These ops have no CPU kernel, so the CPU fallback cannot run them: they are registered here.

Each is a few pointwise formulas (pointwise.expr: FP32 inside, rounded once) over the gates. The gates come
gate-major in the last dim ([..., 4H]: i, f, g, o; [..., 3H]: r, z, n); a formula only broadcasts, so the
gates go to a gate-major copy [4, ..., H] whose planes are contiguous operands.

The workspace is what the backward reads, as in aten's CUDA kernels: LSTM [..., 4H] the activated gates
(sigmoid i, f, o; tanh g); GRU [..., 5H] r, z, n (activated), hx and the hidden n pre-activation (+ bias).
"""

from __future__ import annotations

import operator

import torch

from neuron_kernels.library.formula import act, formula, inputs, where

from ..core.checks import same_device
from ..core.dtypes import FLOATS, TORCH_TO_DTYPE
from ..core.launch import run
from ..core.variants import contig

_ALU = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul}
_ACT = {"sigmoid": torch.sigmoid, "tanh": torch.tanh}


def _eval(node, ts):
    """A formula on torch ops, for dtypes the kernels do not compute (float64: each op takes the loud CPU
    fallback, exact in that dtype, rather than running in FP32 here)."""
    if isinstance(node, float):
        return node
    if node[0] == "x":
        return ts[node[1]]
    if node[0] == "alu":
        return _ALU[node[1]](_eval(node[2], ts), _eval(node[3], ts))
    if node[0] == "select":
        return torch.where(_eval(node[1], ts), _eval(node[2], ts), _eval(node[3], ts))
    return _ACT[node[1]](_eval(node[2], ts) * node[3])


def _f(op, e, *tensors):
    """Formula ``e`` over ``tensors`` (broadcast), in the first tensor's dtype."""
    ts = [contig(t) for t in tensors]
    if ts[0].dtype not in FLOATS:
        return _eval(e.node, ts)
    return run(op, formula, *ts, expr=e.node, out_dtype=TORCH_TO_DTYPE[ts[0].dtype])[0]


def _sig(x):
    return act("sigmoid", x)


def _tanh(x):
    return act("tanh", x)


def _planes(gates, n):
    """[..., n*H] -> contiguous gate-major [n, ..., H] (one copy); its planes are contiguous."""
    h = gates.shape[-1] // n
    return gates.reshape(*gates.shape[:-1], n, h).movedim(-2, 0).contiguous()


def _interleave(planes):
    """Gate planes [..., H] -> [..., n*H] (the inverse of ``_planes``)."""
    return torch.stack(planes, dim=-2).flatten(-2)


def _gate_sums(ig, hg, biases, k0, k1):
    """(an Expr of the pre-activation sum, its operands) for gates k0..k1-1 as [k1 - k0, ..., H]: the input and
    hidden gate planes (``_planes``) plus the biases given (summed first, so a formula keeps inputs to spare)."""
    n = ig.shape[0]
    given = [b for b in biases if b is not None]
    ops = [ig[k0:k1], hg[k0:k1]]
    if given:
        bias = given[0] + given[1] if len(given) == 2 else given[0]
        ops.append(bias.view(n, *[1] * (ig.dim() - 2), -1)[k0:k1])
    xs = inputs(len(ops))
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total, ops


_SEL = {}


def _lstm_g_mask(device, ndim):
    """[4, 1, ...] bool: the cell gate g (tanh) among i, f, g, o (sigmoid); one per device and rank."""
    key = (device, ndim)
    if key not in _SEL:
        _SEL[key] = torch.tensor([False, False, True, False], device=device).view(4, *[1] * (ndim - 1))
    return _SEL[key]


def _check(name, gates, hx, n):
    same_device(*[t for t in gates if t is not None], hx)
    if gates[0].shape[-1] != n * hx.shape[-1] or gates[0].shape[:-1] != hx.shape[:-1]:
        raise RuntimeError(f"{name}: gates {list(gates[0].shape)} do not match the state {list(hx.shape)}")
    if gates[1].shape != gates[0].shape:
        raise RuntimeError(f"{name}: input gates {list(gates[0].shape)} and hidden gates {list(gates[1].shape)}")


# -- LSTM --------------------------------------------------------------------------------------------------
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    op = "_thnn_fused_lstm_cell"
    gates = (input_gates, hidden_gates, input_bias, hidden_bias)
    _check(op, gates, cx, 4)
    pre, ops = _gate_sums(_planes(input_gates, 4), _planes(hidden_gates, 4), gates[2:], 0, 4)
    sel = inputs(len(ops) + 1)[-1]
    acts = _f(op, where(sel, _tanh(pre), _sig(pre)), *ops, _lstm_g_mask(cx.device, cx.dim() + 1))
    i, fg, g, o = acts
    a, b, c, d = inputs(4)
    cy = _f(op, a * b + c * d, fg, cx, i, g)
    hy = _f(op, a * _tanh(b), o, cy)
    return hy, cy, contig(acts.movedim(0, -2)).flatten(-2)


def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    op = "_thnn_fused_lstm_cell_backward"
    i, fg, g, o = _planes(workspace, 4)
    a, b, c, d = inputs(4)
    if grad_hy is not None:  # hy = o tanh(cy): d cy = grad_cy + grad_hy o (1 - tanh(cy)^2)
        dc = a * b * (1.0 - _tanh(c) * _tanh(c))
        gcx = _f(op, dc + d, grad_hy, o, cy, grad_cy) if grad_cy is not None else _f(op, dc, grad_hy, o, cy)
        gog = _f(op, a * _tanh(b) * c * (1.0 - c), grad_hy, cy, o)  # sigmoid' = o (1 - o)
    else:
        gcx, gog = contig(grad_cy), torch.zeros_like(o)
    gig = _f(op, a * b * c * (1.0 - c), gcx, g, i)    # cy = f cx + i g
    gfg = _f(op, a * b * c * (1.0 - c), gcx, cx, fg)
    gcg = _f(op, a * b * (1.0 - c * c), gcx, i, g)    # tanh' = 1 - g^2
    grad_cx = _f(op, a * b, gcx, fg)
    grad_gates = _interleave([gig, gfg, gcg, gog])
    grad_bias = grad_gates.sum(dim=tuple(range(grad_gates.dim() - 1))) if has_bias else None
    return grad_gates, grad_cx, grad_bias


# -- GRU ---------------------------------------------------------------------------------------------------
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    op = "_thnn_fused_gru_cell"
    gates = (input_gates, hidden_gates, input_bias, hidden_bias)
    _check(op, gates, hx, 3)
    ig, hg = _planes(input_gates, 3), _planes(hidden_gates, 3)
    pre, ops = _gate_sums(ig, hg, gates[2:], 0, 2)
    r, z = _f(op, _sig(pre), *ops)
    # n = tanh(in + b_in + r (hn + b_hn)): the hidden part (with its bias) is also the workspace's hn
    x_in, x_hn = ig[2], hg[2]
    b_in = contig(input_bias).view(3, -1)[2] if input_bias is not None else None
    b_hn = contig(hidden_bias).view(3, -1)[2] if hidden_bias is not None else None
    a, b, c, d = inputs(4)
    hn = _f(op, a + b, x_hn, b_hn) if b_hn is not None else x_hn
    n = _f(op, _tanh(a + b + c * d), x_in, b_in, r, hn) if b_in is not None else _f(op, _tanh(a + b * c), x_in, r, hn)
    hy = _f(op, a + b * (c - a), n, z, hx)  # n + z (hx - n)
    return hy, _interleave([r, z, n, contig(hx), hn])


def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    op = "_thnn_fused_gru_cell_backward"
    r, z, n, hx, hn = _planes(workspace, 5)
    a, b, c, d = inputs(4)
    gz = _f(op, a * b * (1.0 - b) * (c - d), grad_hy, z, hx, n)   # d hy / d z = hx - n
    ghx = _f(op, a * b, grad_hy, z)
    gn = _f(op, a * (1.0 - b) * (1.0 - c * c), grad_hy, z, n)      # d hy / d n = 1 - z; tanh' = 1 - n^2
    ghn = _f(op, a * b, gn, r)
    gr = _f(op, a * b * c * (1.0 - c), gn, hn, r)                  # d n_pre / d r = hn
    g_in, g_hid = _interleave([gr, gz, gn]), _interleave([gr, gz, ghn])
    if not has_bias:
        return g_in, g_hid, ghx, None, None
    lead = tuple(range(g_in.dim() - 1))
    return g_in, g_hid, ghx, g_in.sum(dim=lead), g_hid.sum(dim=lead)
