"""Neural-network families: softmax / log_softmax, the norms (layer, group, RMS, batch, instance,
normalize) and the losses (cross_entropy with indices or probabilities, nll, mse, l1, smooth-l1, huber,
bce, bce-with-logits, kl_div)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from .op import Op
from .pointwise import FLOATS
from .spec import Case
from .strategies import SIZES, dim, shapes, tensors

REDUCTION = st.sampled_from(("mean", "sum", "none"))


@st.composite
def _softmax(draw, cap, half_to_float):
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(shapes(cap))
    p = {"dim": draw(dim(len(shape)))}
    if half_to_float:
        p["dtype"] = torch.float32
    return Case((draw(tensors(shape, dtype)),), p)


SOFTMAX = [
    Op("softmax", lambda x, **p: torch.softmax(x, **p), lambda cap: _softmax(cap, False)),
    Op("log_softmax", lambda x, **p: torch.log_softmax(x, **p), lambda cap: _softmax(cap, False)),
    Op("softmin", lambda x, **p: F.softmin(x, **p), lambda cap: _softmax(cap, False)),
    Op("softmax_dtype", lambda x, **p: torch.softmax(x, **p), lambda cap: _softmax(cap, True)),
    Op("log_softmax_dtype", lambda x, **p: torch.log_softmax(x, **p), lambda cap: _softmax(cap, True)),
]


@st.composite
def _layer_norm(draw, cap, rms: bool):
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(shapes(cap, min_dims=1))
    k = draw(st.integers(1, len(shape)))
    normalized = shape[len(shape) - k:]
    affine = draw(st.booleans())
    ts = (draw(tensors(shape, dtype)),)
    if affine:
        ts += (draw(tensors(normalized, dtype)),) + (() if rms else (draw(tensors(normalized, dtype)),))
    eps = draw(st.sampled_from((1e-5, 1e-6, 0.1) if not rms else (None, 1e-5, 1e-6)))
    return Case(ts, {"normalized_shape": normalized, "eps": eps})


def _ln(x, w=None, b=None, **p):
    return F.layer_norm(x, p["normalized_shape"], w, b, eps=p["eps"])


def _rms(x, w=None, **p):
    return F.rms_norm(x, p["normalized_shape"], w, eps=p["eps"])


@st.composite
def _group_norm(draw, cap):
    dtype = draw(st.sampled_from(FLOATS))
    groups = draw(st.sampled_from((1, 2, 3, 4, 8)))
    per = draw(st.sampled_from((1, 2, 3, 16, 64)))
    n = draw(st.sampled_from((1, 2, 3, 0, 5)))
    c = groups * per
    spatial = draw(shapes(max(cap // max(n * c, 1), 1), max_dims=2))
    shape = (n, c) + spatial
    ts = (draw(tensors(shape, dtype)),)
    if draw(st.booleans()):
        ts += (draw(tensors((c,), dtype)), draw(tensors((c,), dtype)))
    return Case(ts, {"num_groups": groups, "eps": draw(st.sampled_from((1e-5, 0.1)))})


def _gn(x, w=None, b=None, **p):
    return F.group_norm(x, p["num_groups"], w, b, eps=p["eps"])


@st.composite
def _batch_norm(draw, cap, training):
    dtype = draw(st.sampled_from(FLOATS[:3]))
    c = draw(st.sampled_from((1, 2, 3, 5, 16, 131)))
    n = draw(st.sampled_from((2, 1, 3, 7)))
    spatial = draw(shapes(max(cap // (n * c), 1), max_dims=2))
    x = draw(tensors((n, c) + spatial, dtype))
    # running stats are written in place: no internal overlap (the CPU writes into an expanded running_var
    # without complaint, in an unspecified order; the device raises torch's internal-overlap error)
    dense = ("contiguous", "transposed", "sliced")
    stats = (draw(tensors((c,), torch.float32, layouts=dense, with_edges=False)),
             draw(tensors((c,), torch.float32, layouts=dense, fill_kinds=("positive",), with_edges=False)))
    affine = (draw(tensors((c,), dtype)), draw(tensors((c,), dtype))) if draw(st.booleans()) else ()
    return Case((x,) + stats + affine, {"training": training, "momentum": 0.1, "eps": 1e-5})


def _bn(x, mean, var, w=None, b=None, **p):
    return F.batch_norm(x, mean, var, w, b, **p)


@st.composite
def _instance_norm(draw, cap):
    dtype = draw(st.sampled_from(FLOATS[:3]))
    n, c = draw(st.sampled_from((1, 2, 3))), draw(st.sampled_from((1, 2, 3, 16)))
    spatial = draw(shapes(max(cap // (n * c), 1), min_dims=1, max_dims=2, min_size=2))
    return Case((draw(tensors((n, c) + spatial, dtype)),))


@st.composite
def _normalize(draw, cap):
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(shapes(cap, min_dims=1))
    return Case((draw(tensors(shape, dtype)),), {"p": draw(st.sampled_from((2.0, 1.0, 3.0))),
                                                 "dim": draw(dim(len(shape)))})


def _centered(x, dims, eps):
    """(|x| + |mean|) * rstd over the statistics' ``dims``: the magnitude the rounding of x - mean is relative
    to, amplified by 1/std (a nearly constant row turns rounding noise into O(1) values)."""
    mean, var = x.mean(dims, keepdim=True), x.var(dims, unbiased=False, keepdim=True)
    return (x.abs() + mean.abs()) / torch.sqrt(var + eps)


def _affine(s, w, b, channel_dim=None):
    """|w| * s + |b|, weight and bias per channel (``channel_dim``) or over the trailing dims."""
    if channel_dim is not None and w is not None:
        view = [1] * s.dim()
        view[channel_dim] = -1
        w, b = w.reshape(view), None if b is None else b.reshape(view)
    s = s * w.abs() if w is not None else s
    return s + b.abs() if b is not None else s


def _ln_scale(x, w=None, b=None, **p):
    k = len(p["normalized_shape"])
    return _affine(_centered(x, tuple(range(x.dim() - k, x.dim())), p["eps"]), w, b)


def _gn_scale(x, w=None, b=None, **p):
    if x.numel() == 0:
        return None
    s = _centered(x.reshape(x.shape[0], p["num_groups"], -1), (2,), p["eps"])
    return _affine(s.reshape(x.shape), w, b, channel_dim=1)


def _bn_scale(x, mean, var, w=None, b=None, **p):
    view = [1, -1] + [1] * (x.dim() - 2)
    s = (x.abs() + mean.abs().reshape(view)) / torch.sqrt(var.reshape(view) + p["eps"])
    return _affine(s, w, b, channel_dim=1)


def _in_scale(x):
    return _centered(x, tuple(range(2, x.dim())), 1e-5)


NORMS = [
    Op("layer_norm", _ln, lambda cap: _layer_norm(cap, False), scale=_ln_scale),
    Op("rms_norm", _rms, lambda cap: _layer_norm(cap, True)),
    Op("group_norm", _gn, _group_norm, scale=_gn_scale),
    Op("batch_norm_train", _bn, lambda cap: _batch_norm(cap, True), inplace=True),
    Op("batch_norm_eval", _bn, lambda cap: _batch_norm(cap, False), scale=_bn_scale),
    Op("instance_norm", F.instance_norm, _instance_norm, scale=_in_scale),
    Op("normalize", lambda x, **p: F.normalize(x, **p), _normalize),
]


@st.composite
def _classes(draw, cap, probs: bool, log_input: bool):
    """(N, C) or (N, C, d) scores and class-index or probability targets."""
    dtype = draw(st.sampled_from(FLOATS[:3] + (torch.float64,)))
    c = draw(st.sampled_from([s for s in SIZES if 0 < s <= min(cap, 4099)]))
    n = draw(st.sampled_from([s for s in (1, 2, 3, 0, 5, 7, 129, 257) if s * c <= cap] or [1]))
    extra = draw(st.sampled_from(((), (3,), (1,))))
    x = draw(tensors((n, c) + extra, dtype))
    p = {"reduction": draw(REDUCTION)}
    if probs:
        target = draw(tensors((n, c) + extra, dtype, fill_kinds=("positive",)))
        p["label_smoothing"] = draw(st.sampled_from((0.0, 0.1)))
        return Case((x, target), p)
    target = draw(tensors((n,) + extra, torch.int64, bounds=(0, c)))
    p["ignore_index"] = draw(st.sampled_from((-100, 0)))
    if not log_input:
        p["label_smoothing"] = draw(st.sampled_from((0.0, 0.1, 0.5)))
    weight = (draw(tensors((c,), dtype, fill_kinds=("positive",))),) if draw(st.booleans()) else ()
    return Case((x, target) + weight, p)


def _ce(x, target, weight=None, **p):
    return F.cross_entropy(x, target, weight, **p)


def _ce_probs(x, target, **p):
    return F.cross_entropy(x, target.softmax(1), **p)


def _nll(x, target, weight=None, **p):
    return F.nll_loss(x.log_softmax(1), target, weight, **p)


@st.composite
def _pairwise(draw, cap, dtypes=FLOATS, params=None):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap))
    p = {"reduction": draw(REDUCTION)}
    p.update(draw(params) if params is not None else {})
    return Case((draw(tensors(shape, dtype)), draw(tensors(shape, dtype))), p)


def _kl(a, b, **p):
    return F.kl_div(a, b if p["log_target"] else b.abs(), **p)


def _kl_scale(a, b, reduction, log_target):
    """p * (|log p| + |a|), reduced like the loss: what the rounding of log p - a is relative to."""
    p = b.exp() if log_target else b.abs()
    s = p * (p.log().abs() + a.abs())
    return s if reduction == "none" else s.sum() if reduction == "sum" else s.mean()


def _pair_loss(name, fn, params=None, **kw):
    return Op(name, fn, lambda cap: _pairwise(cap, params=params), **kw)


LOSSES = [
    Op("cross_entropy", _ce, lambda cap: _classes(cap, False, False)),
    Op("cross_entropy_probs", _ce_probs, lambda cap: _classes(cap, True, False)),
    Op("nll_loss", _nll, lambda cap: _classes(cap, False, True)),
    _pair_loss("mse_loss", lambda a, b, **p: F.mse_loss(a, b, **p)),
    _pair_loss("l1_loss", lambda a, b, **p: F.l1_loss(a, b, **p)),
    _pair_loss("smooth_l1_loss", lambda a, b, **p: F.smooth_l1_loss(a, b, **p),
               st.fixed_dictionaries({"beta": st.sampled_from((1.0, 0.5, 0.0))})),
    _pair_loss("huber_loss", lambda a, b, **p: F.huber_loss(a, b, **p),
               st.fixed_dictionaries({"delta": st.sampled_from((1.0, 0.5, 2.0))})),
    _pair_loss("binary_cross_entropy", lambda a, b, **p: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(), **p)),
    _pair_loss("bce_with_logits", lambda a, b, **p: F.binary_cross_entropy_with_logits(a, b.sigmoid(), **p)),
    _pair_loss("kl_div", _kl, st.fixed_dictionaries({"log_target": st.just(True)}), scale=_kl_scale),
    _pair_loss("kl_div_probs", _kl, st.fixed_dictionaries({"log_target": st.just(False)}), scale=_kl_scale),
    _pair_loss("soft_margin_loss", lambda a, b, **p: F.soft_margin_loss(a, b.sign(), **p)),
]
