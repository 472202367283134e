"""Fused optimizer steps over many parameters in one launch: AdamW, Adam (L2 decay) and SGD.

torch semantics (``torch.optim.AdamW``, ``Adam``, ``SGD``, single-tensor formulas), all math in float32,
every updated tensor rounded once to its own dtype (float32, bfloat16 or float16) and written back in
place: the kernel stores into its inputs, which makes them ``inout`` program arguments.

Calling convention: one flat list of tensors, list after list, then ``hyper``::

    adamw_step(*params, *grads, *exp_avgs, *exp_avg_sqs, hyper)           # [+ *max_exp_avg_sqs if amsgrad]
    adam_step(...)                                                          # same lists
    sgd_step(*params, *grads, hyper)                                        # [*momentum_buffers if momentum]

``hyper`` is a small float32 HBM tensor built on the host by :func:`adam_hyper` / :func:`sgd_hyper`
from the scalars of the step (learning rate, betas, eps, weight decay, step-dependent bias
corrections computed in float64), so changing them never retraces. Structural options (amsgrad,
maximize, whether weight decay or momentum is on, nesterov) are compile-time constants.

Each ``*_step`` object makes one ``@kernel`` per number of parameters (``.kernel(n, **options)``),
whose arguments are named ``param0 .. grad0 .. exp_avg0 ..``. Tensors of any shapes are packed into
column chunks of ``[128, cols]`` tiles: a tensor of ``e`` elements contributes ``[128, e // 128]``
(contiguous per partition) plus a ``[e % 128, 1]`` column, so many small tensors share one tile and one
set of instructions, while each keeps its own DMAs.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View
from .norms import ACT, POOL, VEC, _bcast_rows, _Engines, _pipeline, _scale_shift

# hyper layouts (float32 vectors): index of each scalar
ADAM_FIELDS = ("lr", "beta1", "one_minus_beta1", "beta2", "one_minus_beta2", "sqrt_one_minus_beta2",
               "weight_decay_factor", "inv_bias_correction2", "eps", "neg_step_size")
SGD_FIELDS = ("neg_lr", "weight_decay", "momentum", "buf_keep", "buf_add")
_A = {k: i for i, k in enumerate(ADAM_FIELDS)}
_S = {k: i for i, k in enumerate(SGD_FIELDS)}


def adam_hyper(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
               decoupled: bool = True) -> np.ndarray:
    """The ``hyper`` tensor of :data:`adamw_step` (``decoupled=True``) or :data:`adam_step` for step
    ``step`` (1-based, after the increment, as in torch). Scalars are computed in float64, then float32.

    ``weight_decay_factor`` is ``1 - lr * weight_decay`` (AdamW: ``param *= factor``) or
    ``weight_decay`` (Adam: ``grad += weight_decay * param``).
    """
    if step < 1:
        raise ValueError(f"adam_hyper: step is {step}; torch increments the step before the update (>= 1)")
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    vals = {"lr": lr, "beta1": beta1, "one_minus_beta1": 1.0 - beta1, "beta2": beta2,
            "one_minus_beta2": 1.0 - beta2, "sqrt_one_minus_beta2": math.sqrt(1.0 - beta2),
            "weight_decay_factor": 1.0 - lr * weight_decay if decoupled else weight_decay,
            "inv_bias_correction2": 1.0 / bc2, "eps": eps, "neg_step_size": -lr / bc1}
    return np.array([vals[k] for k in ADAM_FIELDS], np.float32)


def sgd_hyper(lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
              first_step: bool = False) -> np.ndarray:
    """The ``hyper`` tensor of :data:`sgd_step`. On the first step (``first_step``) torch initializes the
    momentum buffer to the gradient: ``buf = buf_keep * buf + buf_add * d`` with (0, 1) then, else
    (momentum, 1 - dampening). The buffer must then hold finite values (zeros) since 0 * buf is used.
    """
    keep, add = (0.0, 1.0) if first_step else (momentum, 1.0 - dampening)
    vals = {"neg_lr": -lr, "weight_decay": weight_decay, "momentum": momentum, "buf_keep": keep, "buf_add": add}
    return np.array([vals[k] for k in SGD_FIELDS], np.float32)


# ---------------------------------------------------------------------------------------------
# packing tensors of any shapes into [128, cols] chunks
# ---------------------------------------------------------------------------------------------
class _Segment:
    """Columns c0 .. c0 + w of a chunk hold columns col .. col + w of tensor ``i`` viewed as ``[parts,
    stride]`` from flat element ``base`` (the main part ``[128, e // 128]`` or the ``[e % 128, 1]`` rest)."""

    def __init__(self, i: int, c0: int, w: int, parts: int, base: int, stride: int, col: int):
        self.i, self.c0, self.w, self.parts = i, c0, w, parts
        self.base, self.stride, self.col = base, stride, col

    def hbm(self, t: View) -> View:
        flat = t.reshape(math.prod(t.shape))
        mat = flat[self.base:self.base + self.parts * self.stride].reshape(self.parts, self.stride)
        return mat if self.w == self.stride else mat[:, self.col:self.col + self.w]

    def sbuf(self, tile: View) -> View:
        return tile[:self.parts, self.c0:self.c0 + self.w]


def _pack(sizes, parts: int, cols: int, keys=None):
    """Chunks (lists of segments, chunk width) covering tensors of ``sizes`` elements. Tensors with
    different ``keys`` (their dtypes) never share a chunk, so every tile holds one dtype."""
    chunks, cur, used = [], [], 0

    def close():
        nonlocal cur, used
        if cur:
            chunks.append((cur, used))
        cur, used = [], 0

    keys = keys or [None] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: list(dict.fromkeys(keys)).index(keys[i]))
    for n, i in enumerate(order):
        e = sizes[i]
        if n and keys[i] != keys[order[n - 1]]:
            close()
        f, r = divmod(e, parts)
        done = 0
        while done < f:
            if used == cols:
                close()
            w = min(f - done, cols - used)
            cur.append(_Segment(i, used, w, parts, 0, f, done))
            used += w
            done += w
        if r:
            if used == cols:
                close()
            cur.append(_Segment(i, used, 1, r, parts * f, 1, 0))
            used += 1
    close()
    return chunks


class _Chunk:
    """The tiles of one chunk (one dtype per tensor list): ``load(name, tensors)`` gathers its segments."""

    def __init__(self, segs, width: int, parts: int, queues):
        self.segs, self.width, self.parts, self.queues = segs, width, parts, queues
        self.tiles = {}

    def load(self, name: str, tensors):
        tile = nl.ndarray((self.parts, self.width), tensors[self.segs[0].i].dtype, name=name)
        for s in self.segs:
            nisa.dma_copy(s.sbuf(tile), s.hbm(tensors[s.i]), queue=self.queues.load())
        self.tiles[name] = tile
        return tile

    def store(self, tile: View, tensors) -> None:
        for s in self.segs:
            nisa.dma_copy(s.hbm(tensors[s.i]), s.sbuf(tile), queue=self.queues.store())


class _Queues:
    def __init__(self):
        q = nl.profile().dma_queues
        self.loads, self.stores = list(range(q // 2)) or [0], list(range(q // 2, q)) or [0]
        self.nl = self.ns = 0

    def load(self) -> int:
        self.nl += 1
        return self.loads[(self.nl - 1) % len(self.loads)]

    def store(self) -> int:
        self.ns += 1
        return self.stores[(self.ns - 1) % len(self.stores)]


def _scalars(hyper: View, nfields: int, parts: int) -> View:
    """hyper [K] float32 -> [parts, K] SBUF, the same values on every partition."""
    if tuple(hyper.shape) != (nfields,) or hyper.dtype is not nl.float32:
        raise KernelError(f"hyper must be a float32 [{nfields}] tensor (see adam_hyper / sgd_hyper), "
                          f"got {hyper.dtype} {list(hyper.shape)}")
    h = nl.ndarray((parts, nfields), nl.float32, name="hyper")
    nisa.dma_copy(h, _bcast_rows(hyper, parts))
    return h


def _ts(bal: _Engines, dst: View, src: View, mul: View, add: View | None = None, act: bool = True) -> None:
    """dst = src * mul (+ add), per-partition columns, on the engine that finishes first."""
    n = dst.shape[1]
    costs = {VEC: n, POOL: n}
    if act:
        costs[ACT] = n
    _scale_shift(bal.pick(costs), dst, src, mul, add)


def _tt(bal: _Engines, dst: View, a: View, b: View, op) -> None:
    n = dst.shape[1]
    fast = all(t.dtype in (nl.bfloat16, nl.float16) for t in (dst, a, b)) and op in (nl.add, nl.multiply)
    nisa.tensor_tensor(dst, a, b, op, engine=bal.pick({VEC: n if fast else 2 * n, POOL: 2 * n}))


def _work(t: View, name: str) -> View:
    """A float32 tile to compute an intermediate of t's update in: t itself when it is float32 (the update
    is then in place), so 16-bit states are rounded once, when the final value is written."""
    return t if t.dtype is nl.float32 else nl.ndarray(t.shape, nl.float32, name=name)


def _act(bal: _Engines, dst: View, func, src: View, scale=1.0, bias: View | None = None) -> None:
    nisa.activation(dst, func, src, bias=bias, scale=scale)
    bal.book(ACT, dst.shape[1])


def _dtype_keys(lists: dict) -> list[tuple]:
    return [tuple(ts[i].dtype for ts in lists.values()) for i in range(len(lists["param"]))]


def _check_lists(kind: str, lists: dict) -> list[int]:
    params = lists["param"]
    sizes = []
    for i, p in enumerate(params):
        for name, ts in lists.items():
            t = ts[i]
            if t.dtype not in nl.COMPUTE_FLOATS:
                raise KernelError(f"{kind}: {name}{i} is {t.dtype}; use float32, bfloat16 or float16")
            if tuple(t.shape) != tuple(p.shape):
                raise KernelError(f"{kind}: {name}{i} shape {list(t.shape)} differs from param{i} {list(p.shape)}")
        sizes.append(math.prod(p.shape))
    return sizes


# ---------------------------------------------------------------------------------------------
# the update bodies
# ---------------------------------------------------------------------------------------------
def _adam_body(lists: dict, hyper: View, decoupled: bool, amsgrad: bool, maximize: bool, weight_decay: bool,
               cols: int) -> None:
    kind = "adamw_step" if decoupled else "adam_step"
    sizes = _check_lists(kind, lists)
    P = nl.tile_size.pmax
    chunks = _pack(sizes, P, cols, _dtype_keys(lists))
    if not chunks:
        return
    h = _scalars(hyper, len(ADAM_FIELDS), P)

    def col(name):
        return h[:, _A[name]:_A[name] + 1]

    # maximize: the update sees -grad; fold the sign into the first-moment coefficient (and Adam's L2 add)
    omb1 = col("one_minus_beta1")
    if maximize:
        omb1 = nl.ndarray((P, 1), nl.float32, name="n_omb1")
        nisa.tensor_scalar(omb1, col("one_minus_beta1"), nl.multiply, -1.0, engine=VEC)
    bal, q = _Engines(), _Queues()

    def s_load(c, _):  # loads, scaled terms
        segs, width = c
        ch = _Chunk(segs, width, P, q)
        p = ch.load("p", lists["param"])
        g = ch.load("g", lists["grad"])
        m = ch.load("m", lists["exp_avg"])
        v = ch.load("v", lists["exp_avg_sq"])
        vmax = ch.load("vmax", lists["max_exp_avg_sq"]) if amsgrad else None
        a_coef = omb1
        if not decoupled and weight_decay:  # Adam: g = g + wd * p (maximize: -g + wd * p)
            gd = nl.ndarray((P, width), nl.float32, name="gd")
            _ts(bal, gd, p, col("weight_decay_factor"))
            _tt(bal, gd, gd, g, nl.subtract if maximize else nl.add)
            g, a_coef = gd, col("one_minus_beta1")
        gg = nl.ndarray((P, width), nl.float32, name="gg")
        _act(bal, gg, nl.square, g, scale=col("sqrt_one_minus_beta2"))  # (1 - beta2) * g^2
        a = nl.ndarray((P, width), nl.float32, name="a")
        _ts(bal, a, g, a_coef)
        mb, vb = _work(m, "mb"), _work(v, "vb")  # float32, so each state is rounded once
        _ts(bal, mb, m, col("beta1"))
        _ts(bal, vb, v, col("beta2"))
        pd = p
        if decoupled and weight_decay:
            pd = _work(p, "pd")
            _ts(bal, pd, p, col("weight_decay_factor"))
        return ch, p, pd, m, mb, v, vb, vmax, gg, a

    def s_moments(c, st):  # m = beta1 m + (1 - beta1) g ; v = beta2 v + (1 - beta2) g^2
        ch, p, pd, m, mb, v, vb, vmax, gg, a = st
        _tt(bal, m, mb, a, nl.add)
        _tt(bal, v, vb, gg, nl.add)
        ch.store(m, lists["exp_avg"])
        ch.store(v, lists["exp_avg_sq"])
        if amsgrad:
            _tt(bal, vmax, vmax, v, nl.maximum)
            ch.store(vmax, lists["max_exp_avg_sq"])
        return st

    def s_denom(c, st):  # 1 / (sqrt(v / bias_correction2) + eps)
        ch, p, pd, m, mb, v, vb, vmax, gg, a = st
        _act(bal, gg, nl.sqrt, vmax if amsgrad else v, scale=col("inv_bias_correction2"))
        _act(bal, gg, nl.reciprocal, gg, bias=col("eps"))
        return st

    def s_update(c, st):  # u = -step_size * m / denom
        ch, p, pd, m, mb, v, vb, vmax, gg, a = st
        _tt(bal, gg, m, gg, nl.multiply)
        _ts(bal, gg, gg, col("neg_step_size"))
        return st

    def s_param(c, st):
        ch, p, pd, m, mb, v, vb, vmax, gg, a = st
        _tt(bal, p, pd, gg, nl.add)
        ch.store(p, lists["param"])

    _pipeline(chunks, s_load, s_moments, s_denom, s_update, s_param, lag=1)


def _sgd_body(lists: dict, hyper: View, momentum: bool, nesterov: bool, maximize: bool, weight_decay: bool,
              cols: int) -> None:
    sizes = _check_lists("sgd_step", lists)
    P = nl.tile_size.pmax
    chunks = _pack(sizes, P, cols, _dtype_keys(lists))
    if not chunks:
        return
    h = _scalars(hyper, len(SGD_FIELDS), P)

    def col(name):
        return h[:, _S[name]:_S[name] + 1]

    bal, q = _Engines(), _Queues()
    # maximize: d = -g (+ wd * p); the sign goes into the coefficient that first multiplies d
    neg = {}
    for name in ("buf_add", "neg_lr"):
        t = nl.ndarray((P, 1), nl.float32, name="neg_" + name)
        nisa.tensor_scalar(t, col(name), nl.multiply, -1.0, engine=VEC)
        neg[name] = t

    def s_load(c, _):
        segs, width = c
        ch = _Chunk(segs, width, P, q)
        p = ch.load("p", lists["param"])
        g = ch.load("g", lists["grad"])
        buf = ch.load("buf", lists["momentum_buffer"]) if momentum else None
        sign = 1.0
        d = g
        if weight_decay:  # d = g + wd * p  (maximize: wd * p - g)
            d = nl.ndarray((P, width), nl.float32, name="d")
            _ts(bal, d, p, col("weight_decay"))
            _tt(bal, d, d, g, nl.subtract if maximize else nl.add)
        elif maximize:
            sign = -1.0
        dd = bk = None
        if momentum:  # buf = keep * buf + add * d
            dd = nl.ndarray((P, width), nl.float32, name="dd")
            _ts(bal, dd, d, neg["buf_add"] if sign < 0 else col("buf_add"))
            bk = _work(buf, "bk")
            _ts(bal, bk, buf, col("buf_keep"))
        return ch, p, d, buf, bk, dd, sign

    def s_buf(c, st):
        ch, p, d, buf, bk, dd, sign = st
        if momentum:
            _tt(bal, buf, bk, dd, nl.add)
            ch.store(buf, lists["momentum_buffer"])
        return st

    def s_step(c, st):  # u = -lr * (d + momentum * buf if nesterov else buf if momentum else d)
        ch, p, d, buf, bk, dd, sign = st
        width = ch.width
        u = nl.ndarray((P, width), nl.float32, name="u")
        if momentum and nesterov:  # d + momentum * buf, d carrying the maximize sign
            _ts(bal, u, buf, col("momentum"))
            _tt(bal, u, u, d, nl.subtract if sign < 0 else nl.add)
            _ts(bal, u, u, col("neg_lr"))
        elif momentum:
            _ts(bal, u, buf, col("neg_lr"))
        else:
            _ts(bal, u, d, neg["neg_lr"] if sign < 0 else col("neg_lr"))
        return ch, p, u

    def s_param(c, st):
        ch, p, u = st
        _tt(bal, p, p, u, nl.add)
        ch.store(p, lists["param"])

    _pipeline(chunks, s_load, s_buf, s_step, s_param, lag=1)


# ---------------------------------------------------------------------------------------------
# one kernel per parameter count
# ---------------------------------------------------------------------------------------------
class FusedStep:
    """A fused optimizer step: ``step(*tensors, hyper, **options)`` runs it on numpy arrays (updated in
    place); ``step.kernel(n, **options)`` is the ``@kernel`` for ``n`` parameters (for tracing, the
    bench and the torch layer); ``step.lists(**options)`` names the tensor lists it takes, in order."""

    def __init__(self, name: str, lists, body, options: dict, doc: str):
        self.name, self._lists, self._body, self.options = name, lists, body, dict(options)
        self.__doc__ = doc
        self._kernels = {}

    def lists(self, **options) -> tuple[str, ...]:
        opts = {**self.options, **options}
        return self._lists(opts)

    def kernel(self, n: int, **options):
        opts = {**self.options, **options}
        unknown = set(options) - set(self.options)
        if unknown:
            raise KernelError(f"{self.name}: unknown options {sorted(unknown)}; known: {sorted(self.options)}")
        names = self._lists(opts)
        key = (n, names)
        if key not in self._kernels:
            self._kernels[key] = self._make(n, names)
        return self._kernels[key]

    def _make(self, n: int, names):
        P = inspect.Parameter
        params = [P(f"{nm}{i}", P.POSITIONAL_OR_KEYWORD) for nm in names for i in range(n)]
        params.append(P("hyper", P.POSITIONAL_OR_KEYWORD))
        params += [P(k, P.KEYWORD_ONLY, default=v) for k, v in self.options.items()]
        params.append(P("cols", P.KEYWORD_ONLY, default=1024))
        body = self._body

        def step(**kw):
            lists = {nm: [kw[f"{nm}{i}"] for i in range(n)] for nm in names}
            opts = {k: kw[k] for k in self.options}
            body(lists, kw["hyper"], cols=kw["cols"], **opts)

        step.__signature__ = inspect.Signature(params)
        step.__doc__ = self.__doc__
        return kernel(step, name=f"{self.name}_{n}", tunables={"cols": (1024, 512, 2048)}, version=1)

    def _split(self, tensors, options):
        names = self.lists(**options)
        if len(tensors) % len(names):
            raise KernelError(f"{self.name}: {len(tensors)} tensors do not split into the lists {names}")
        return len(tensors) // len(names)

    def __call__(self, *tensors, hyper, **options):
        opts = {k: v for k, v in options.items() if k != "cols"}
        n = self._split(tensors, opts)
        return self.kernel(n, **opts)(*tensors, hyper, **options)

    def trace(self, *tensors, hyper, profile=None, **options):
        opts = {k: v for k, v in options.items() if k != "cols"}
        n = self._split(tensors, opts)
        return self.kernel(n, **opts).trace(*tensors, hyper, profile=profile, **options)


def _adam_lists(opts):
    base = ("param", "grad", "exp_avg", "exp_avg_sq")
    return base + (("max_exp_avg_sq",) if opts["amsgrad"] else ())


def _sgd_lists(opts):
    return ("param", "grad") + (("momentum_buffer",) if opts["momentum"] else ())


def _adamw(lists, hyper, cols, amsgrad, maximize, weight_decay):
    _adam_body(lists, hyper, True, amsgrad, maximize, weight_decay, cols)


def _adam(lists, hyper, cols, amsgrad, maximize, weight_decay):
    _adam_body(lists, hyper, False, amsgrad, maximize, weight_decay, cols)


def _sgd(lists, hyper, cols, momentum, nesterov, maximize, weight_decay):
    if nesterov and not momentum:
        raise KernelError("sgd_step: nesterov needs momentum (momentum buffers), as in torch")
    _sgd_body(lists, hyper, momentum, nesterov, maximize, weight_decay, cols)


adamw_step = FusedStep("adamw_step", _adam_lists, _adamw, {"amsgrad": False, "maximize": False, "weight_decay": True},
                       """torch.optim.AdamW step (decoupled weight decay) over N parameters, in place.

    ``adamw_step(*params, *grads, *exp_avgs, *exp_avg_sqs, [*max_exp_avg_sqs,] hyper, amsgrad=False,
    maximize=False, weight_decay=True)`` with ``hyper = adam_hyper(lr, beta1, beta2, eps, weight_decay,
    step)``. ``weight_decay=False`` skips the decay multiply (torch skips it when the value is 0).""")
adam_step = FusedStep("adam_step", _adam_lists, _adam, {"amsgrad": False, "maximize": False, "weight_decay": False},
                      """torch.optim.Adam step (L2 weight decay added to the gradient) over N parameters, in place.

    Same lists as :data:`adamw_step`; ``hyper = adam_hyper(..., decoupled=False)``;
    ``weight_decay=True`` adds ``weight_decay * param`` to the gradient.""")
sgd_step = FusedStep("sgd_step", _sgd_lists, _sgd,
                     {"momentum": False, "nesterov": False, "maximize": False, "weight_decay": False},
                     """torch.optim.SGD step over N parameters, in place.

    ``sgd_step(*params, *grads, [*momentum_buffers,] hyper, momentum=False, nesterov=False,
    maximize=False, weight_decay=False)`` with ``hyper = sgd_hyper(lr, momentum, dampening,
    weight_decay, first_step)``. ``momentum=True`` means buffers are passed (torch: momentum != 0);
    ``weight_decay=True`` adds ``weight_decay * param`` to the gradient.""")
