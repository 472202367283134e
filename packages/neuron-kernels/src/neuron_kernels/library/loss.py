"""cross_entropy forward and backward on logits [N, C] with int32 class targets [N] (torch semantics).

``cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0)``
is ``torch.nn.functional.cross_entropy``: with lp = log_softmax(logits) (fp32 internally),
    nll_i    = -w[t_i] * lp[i, t_i]
    smooth_i = -sum_c w[c] * lp[i, c]            (w = 1 without weights)
    loss_i   = (1 - eps) * nll_i + eps / C * smooth_i, and 0 where t_i == ignore_index;
reduction "none" returns loss_i [N], "sum" their sum, "mean" their sum / sum_{i not ignored} w[t_i]
(nan when every target is ignored), in the logits' dtype (float32, bfloat16, float16).

``cross_entropy_backward(grad_output, logits, target, weight=None, ...)`` returns d loss / d logits
[N, C] for grad_output [] ("mean"/"sum") or [N] ("none"):
    grad[i, c] = g_i * ((1 - eps) * w[t_i] * (p_ic - [c == t_i]) + eps / C * (p_ic * sum(w) - w[c]))
with p = softmax(logits), g_i = grad_output (/ the mean's denominator).

How: rows on partitions (several per partition for small C). Per row: the max (VectorE/GpSimd, bf16
at 2 elements/cycle), then sum exp(x - max) split by the list scheduler between ScalarE (``exp``
with its free accumulate) and GpSimd/VectorE (``tensor_scalar`` computing pow(e, x - max) in fp32,
then a reduce), so the exponentials are not bound to the single ScalarE. The target logit comes from
an indirect DMA gather (one element per row); class weights from a gather on the weight vector. The
backward writes each row block once (ScalarE exp(x - max), one tensor_scalar for a / sum * e - c) and then
overwrites the target column with its exact value by an indirect DMA scatter, so no pass compares
every column with the target. Target values outside [0, C) other than ignore_index are clamped
(torch raises instead).

The forward streams each row tile in column chunks of ``tile_kib`` per partition, merging (max, sum)
online, and is software-pipelined ``depth`` chunks deep (the next chunks' loads and maxes are issued
before a chunk's exponentials) so the in-order engines always find independent work; N=4096,
C=32000 bf16 runs at ~85% of the DMA roofline (simulated trn2). The backward keeps whole rows
resident when they fit a third of SBUF (else two reads); it computes every exponential twice
(statistics, then probabilities) and is ScalarE/VectorE-bound (~35-40% of its DMA roofline).
"""

from __future__ import annotations

import math
from builtins import max as _max
from builtins import min as _min

import neuron_kernels as nk
from neuron_hal import Act, Alu
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl
from neuron_kernels.errors import KernelError

from .reduce import BF16, F32, I32, SLOT_N, Ctx, G, S, V, bcast, cdiv, reduce_free, row_tiles, tile, ts, view

E_F32 = float(math.e)
REDUCTIONS = ("none", "mean", "sum")


def _exp_sum(ctx: Ctx, s, x, nm, k: int, n: int, per_slot: bool, clobber: bool = False):
    """s [p, k, 1] = sum over n of exp(x + nm) for x [p, k, n, 1], nm = -max [p, k, 1] (``clobber``:
    ScalarE's unused elementwise output goes over x instead of a scratch tile).

    Per-row pieces go to ScalarE (activation exp, bias, accumulate) or to GpSimd/VectorE
    (tensor_scalar: (x + nm) then pow(e, .), then a reduce), whichever finishes first."""
    p = x.shape[0]
    if not per_slot:
        d = nl.ndarray(x.shape, F32, name="ced")
        size = k * n
        nisa.tensor_tensor(d, x, bcast(nm, n), Alu.add, engine=ctx.pick({e: ctx.cycles("tt", e, size) for e in (V, G)}))
        ctx.charge(S, ctx.cycles("act", S, size))
        nisa.activation(d, Act.exp, d)
        reduce_free(ctx, s, d, Alu.add)
        return

    def cost(e, size):  # VectorE is left to the max (bf16: 2 elements/cycle)
        if e is S:
            return ctx.cycles("act", S, size, reduce=True)
        return ctx.cycles("ts", G, size) + ctx.cycles("red", G, size) if e is G else None

    for j in range(k):
        sl = slice(j, j + 1)
        pieces = ctx.split(n, 4096, cost)
        dst = s[:, sl] if len(pieces) == 1 else tile((p, 1, len(pieces)), F32, "cep")
        for i, (e, a, b) in enumerate(pieces):
            xa = x[:, sl, a:b]
            r = dst if len(pieces) == 1 else dst[:, :, i:i + 1]
            if e is S:  # only the accumulate is wanted
                junk = xa if clobber else nl.ndarray((p, 1, b - a, 1), BF16, name="cej")
                nisa.activation(junk, Act.exp, xa, bias=nm[:, sl], reduce_res=r)
            else:
                t = nl.ndarray((p, 1, b - a, 1), F32, name="cepow")
                nisa.tensor_scalar(t, xa, Alu.add, nm[:, sl], op1=Alu.pow, operand1=E_F32, reverse1=True, engine=e)
                nisa.tensor_reduce(r, t, Alu.add, axis=2, engine=e)
        if len(pieces) > 1:
            nisa.tensor_reduce(s[:, sl], dst, Alu.add, axis=2, engine=V)


class Rows:
    """Per row tile [p, k] state shared by the forward and the backward."""

    def __init__(self, ctx: Ctx, logits, target, weight, ignore_index: int, eps: float, row0: int, p: int, k: int):
        self.ctx, self.row0, self.p, self.k = ctx, row0, p, k
        N, C = logits.shape
        self.C = C
        t = tile((p, k), I32, "tgt")
        ctx.load(t, view(target, target.offset + row0, ((p, k), (k, 1))))
        valid = tile((p, k), F32, "valid")
        nisa.tensor_scalar(valid, t, Alu.not_equal, float(ignore_index), engine=G)
        tc = tile((p, k), I32, "tcl")
        ts(tc, t, Alu.max, 0.0, Alu.min, float(C - 1), engine=G)  # clamped: ignored rows read column 0/C-1
        self.valid, self.tc = valid, tc
        # flat index of (row, target) inside this tile's rows: (partition * k + j) * C + t
        idx = tile((p, k), I32, "gidx")
        nisa.iota(idx, (C,), offset=0, channel_multiplier=k * C)
        nisa.tensor_tensor(idx, idx, tc, Alu.add, engine=G)
        self.idx = idx
        self.wt = None
        if weight is not None:
            wt = tile((p, k), F32, "wt")
            wtab = view(weight, weight.offset, ((C, 1), (1, 1)))
            for j in range(k):
                nisa.dma_gather(wt[:, j:j + 1], wtab, tc[:, j:j + 1], queue=ctx.load_queue())
            self.wt = wt

    def table(self, t):
        """This tile's rows of an [N, C] HBM tensor as a table of single elements."""
        return view(t, t.offset + self.row0 * self.C, ((self.p * self.k * self.C, 1), (1, 1)))

    def gather(self, logits):
        xt = tile((self.p, self.k), logits.dtype, "xt")
        tab = self.table(logits)
        for j in range(self.k):
            nisa.dma_gather(xt[:, j:j + 1], tab, self.idx[:, j:j + 1], queue=self.ctx.load_queue())
        return xt

    def denominator_terms(self):
        """valid * w[t] per row (the mean's denominator terms)."""
        if self.wt is None:
            return self.valid
        d = tile((self.p, self.k), F32, "dterm")
        nisa.tensor_tensor(d, self.valid, self.wt, Alu.multiply, engine=V)
        return d


def _neg_max(ctx: Ctx, nm, x, k: int, n: int, per_slot: bool):
    """nm [p, k, 1] = -max over n of x [p, k, n, 1]; long rows are cut into column pieces reduced on
    VectorE (bf16: 2 elements/cycle) or GpSimd, whichever finishes first, then combined."""
    fast = x.dtype is BF16
    if not per_slot or n < 2 * 4096:
        reduce_free(ctx, nm, x, Alu.max, negate=True, fast=fast, slots=per_slot and n >= 1024)
        return

    def cost(e, size):  # bf16: VectorE reduces 2 elements/cycle; GpSimd is kept for the exponentials
        if e is S or (fast and e is G):
            return None
        return ctx.cycles("red", e, size, fast and e is V)

    p = x.shape[0]
    for j in range(k):
        sl = slice(j, j + 1)
        pieces = ctx.split(n, 4096, cost)
        part = tile((p, 1, len(pieces)), x.dtype if fast else F32, "pmax")
        for i, (e, a, b) in enumerate(pieces):
            nisa.tensor_reduce(part[:, :, i:i + 1], x[:, sl, a:b], Alu.max, axis=2, engine=e)
        nisa.tensor_reduce(nm[:, sl], part, Alu.max, axis=2, negate=True, engine=V)


def _merge(ctx: Ctx, nma, sa, nmb, sb, engine=G):
    """Online (max, sum exp) merge of two column chunks: -max and the sum rescaled to the new max."""
    nn = tile(nma.shape, F32, "nmm")
    nisa.tensor_tensor(nn, nma, nmb, Alu.min, engine=engine)
    out = None
    for nm_i, s_i in ((nma, sa), (nmb, sb)):
        f = tile(nma.shape, F32, "mf")
        nisa.tensor_tensor(f, nn, nm_i, Alu.subtract, engine=engine)  # max_i - max
        nisa.activation(f, Act.exp, f)
        nisa.tensor_tensor(f, f, s_i, Alu.multiply, engine=engine)
        if out is None:
            out = f
        else:
            nisa.tensor_tensor(f, out, f, Alu.add, engine=engine)
            out = f
    return nn, out


class RowTile:
    """One tile of rows: its logits loaded (resident) or streamed in chunks, -max and the row sums."""

    def __init__(self, ctx: Ctx, logits, row0: int, p: int, k: int, C: int, E: int):
        self.ctx, self.logits, self.row0, self.p, self.k, self.C = ctx, logits, row0, p, k, C
        self.per_slot = C >= SLOT_N
        self.resident = C * k <= E
        self.E = E

    def load(self, c0: int, w: int):
        lg, p, k = self.logits, self.p, self.k
        x = nl.ndarray((p, k, w, 1), lg.dtype, name="x")
        self.ctx.load(x, view(lg, lg.offset + self.row0 * self.C + c0, ((p, k * self.C), (k, self.C), (w, 1), (1, 1))))
        return x

    def start(self):
        """Resident rows: load and the max (issued one tile ahead of the rest)."""
        if self.resident:
            self.x = self.load(0, self.C)
            self.nm = tile((self.p, self.k, 1), BF16 if self.x.dtype is BF16 else F32, "nm")
            _neg_max(self.ctx, self.nm, self.x, self.k, self.C, self.per_slot)

    def lse(self, want_sum: bool, wrow):
        """(lse [p, k], sum_c x (or sum_c w_c x) [p, k] or None)."""
        ctx, p, k = self.ctx, self.p, self.k
        if self.resident:
            chunks = [(self.x, 0, self.C, self.nm)]
        else:  # k == 1: chunks of the row, online max / sum
            chunks = []
            for c0 in range(0, self.C, self.E):
                w = _min(self.E, self.C - c0)
                xc = self.load(c0, w)
                nm = tile((p, k, 1), BF16 if xc.dtype is BF16 else F32, "nm")
                _neg_max(ctx, nm, xc, k, w, self.per_slot)
                chunks.append((xc, c0, w, nm))
        nM = s = xs = None
        for xc, c0, w, nm in chunks:
            sc = tile((p, k, 1), F32, "se")
            xsum = None
            if want_sum:
                xsum = tile((p, k, 1), F32, "xs")
                if wrow is None:
                    reduce_free(ctx, xsum, xc, Alu.add)
                else:
                    wx = nl.ndarray(xc.shape, F32, name="wx")
                    nisa.tensor_tensor(wx, xc, _wview(wrow, p, k, c0, w), Alu.multiply,
                                       engine=ctx.pick({e: ctx.cycles("tt", e, k * w) for e in (V, G)}))
                    reduce_free(ctx, xsum, wx, Alu.add)
            _exp_sum(ctx, sc, xc, nm, k, w, self.per_slot)  # last: ScalarE may overwrite nothing it needs
            if nM is None:
                nM, s, xs = nm, sc, xsum
                continue
            # online merge: max = max(a, b); s = s_a exp(max_a - max) + s_b exp(max_b - max)
            nn = tile((p, k, 1), F32, "nmm")
            nisa.tensor_tensor(nn, nM, nm, Alu.min, engine=V)
            fa = tile((p, k, 1), F32, "fa")
            nisa.tensor_tensor(fa, nn, nM, Alu.subtract, engine=V)
            nisa.activation(fa, Act.exp, fa)
            nisa.tensor_tensor(fa, fa, s, Alu.multiply, engine=V)
            fb = tile((p, k, 1), F32, "fb")
            nisa.tensor_tensor(fb, nn, nm, Alu.subtract, engine=V)
            nisa.activation(fb, Act.exp, fb)
            nisa.tensor_tensor(fb, fb, sc, Alu.multiply, engine=V)
            nisa.tensor_tensor(fa, fa, fb, Alu.add, engine=V)
            nM, s = nn, fa
            if want_sum:
                x2 = tile((p, k, 1), F32, "xs2")
                nisa.tensor_tensor(x2, xs, xsum, Alu.add, engine=V)
                xs = x2
        self.nM, self.s = nM, s  # -max and sum exp(x - max) per row
        lse = tile((p, k), F32, "lse")
        nisa.activation(lse, Act.log, s.reshape(p, k))
        nisa.tensor_tensor(lse, lse, nM.reshape(p, k), Alu.subtract, engine=V)  # log(sum) + max
        return lse, (xs.reshape(p, k) if want_sum else None)


def _wview(wrow, p: int, k: int, c0: int, w: int):
    """Columns c0..c0+w of the broadcast weight row as [p, k, w, 1] (stride 0 over k)."""
    return view(wrow, wrow.offset + c0, (wrow[0:p].dims[0], (k, 0), (w, 1), (1, 1)))


def weight_row(ctx: Ctx, weight, C: int):
    """weight broadcast on every partition [P, C] fp32 and its total W on every partition [P, 1]."""
    P = ctx.P
    wrow = tile((P, C), F32, "wrow")
    ctx.load(wrow, view(weight, weight.offset, ((P, 0), (C, 1))))
    W = tile((P, 1), F32, "wsum")
    nisa.tensor_reduce(W, wrow, Alu.add, axis=1, engine=V)
    return wrow, W


def _check(logits, target, weight, reduction, label_smoothing):
    if logits.ndim != 2:
        raise KernelError(f"cross_entropy: logits must be [N, C], got {list(logits.shape)}")
    if not logits.dtype.is_float:
        raise KernelError(f"cross_entropy: logits must be floating point, got {logits.dtype}")
    if tuple(target.shape) != (logits.shape[0],) or target.dtype is not I32:
        raise KernelError(f"cross_entropy: target must be int32 [{logits.shape[0]}], got {target.dtype} "
                          f"{list(target.shape)}")
    if weight is not None and tuple(weight.shape) != (logits.shape[1],):
        raise KernelError(f"cross_entropy: weight must be [{logits.shape[1]}], got {list(weight.shape)}")
    if reduction not in REDUCTIONS:
        raise KernelError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise KernelError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")


def _plan(ctx: Ctx, N: int, C: int, itemsize: int, budget: int):
    """(rows per partition, longest resident row chunk). Long rows take per-row instructions whose
    temporaries are per piece, so a row costs its own bytes; short rows use broadcast forms with an
    fp32 temporary per element. Residency is judged against a third of SBUF (double buffering)."""
    limit = _max(budget, ctx.prof.sbuf_partition_bytes // 3)
    isz = itemsize if C >= SLOT_N else itemsize + 4
    E = _max(1, limit // isz)
    if C <= E:
        k = _max(1, _min(budget // (isz * C), cdiv(N, ctx.P), ctx.prof.free_size_max))
    else:
        k = 1
    return k, _min(E, ctx.prof.free_size_max, ctx.prof.free_stride_max)


def scalar_out(out):
    return view(out, out.offset, ((1, 1), (1, 1)))


TUNE = {"tile_kib": (32, 16, 64)}


@nk.kernel(name="cross_entropy", tunables={"tile_kib": (32, 16, 24, 64), "depth": (2, 1, 3)})
def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  tile_kib=32, depth=2):
    """torch.nn.functional.cross_entropy(logits [N, C], target int32 [N], weight [C] or None, ...)."""
    _check(logits, target, weight, reduction, label_smoothing)
    ctx = Ctx()
    N, C = logits.shape
    eps = float(label_smoothing)
    out = nl.ndarray((N,) if reduction == "none" else (), logits.dtype, buffer=nl.hbm, name="loss")
    if N == 0:
        if reduction != "none":
            t = tile((1, 1), F32, "empty")
            nisa.memset(t, float("nan") if reduction == "mean" else 0.0, engine=V)
            ctx.store(scalar_out(out), t)
        return out
    P = ctx.P
    k, E = _plan(ctx, N, C, logits.dtype.itemsize, tile_kib * 1024)
    wrow = W = None
    if weight is not None and eps > 0:
        wrow, W = weight_row(ctx, weight, C)
    acc = None
    if reduction != "none":
        acc = tile((P, 2), F32, "acc")  # [sum of losses, denominator]
        nisa.memset(acc, 0.0, engine=V)
    # column chunks of tile_kib per partition (online max/sum merges), whole rows when they fit in one
    chunk = C if C < SLOT_N else _max(SLOT_N, _min(E, tile_kib * 1024 // logits.dtype.itemsize))
    state: dict = {}

    def start(item):
        """Load a chunk of a row tile and reduce its max (issued one chunk ahead of its exp pass)."""
        ti, row0, p, kk, c0, w = item
        if c0 == 0:
            state[ti] = {"rows": Rows(ctx, logits, target, weight, ignore_index, eps, row0, p, kk), "nM": None}
        x = nl.ndarray((p, kk, w, 1), logits.dtype, name="x")
        ctx.load(x, view(logits, logits.offset + row0 * C + c0, ((p, kk * C), (kk, C), (w, 1), (1, 1))))
        nm = tile((p, kk, 1), BF16 if x.dtype is BF16 else F32, "nm")
        _neg_max(ctx, nm, x, kk, w, C >= SLOT_N)
        return item, x, nm

    def finish(started):
        (ti, row0, p, kk, c0, w), x, nm = started
        st = state[ti]
        sc = tile((p, kk, 1), F32, "se")
        xsum = None
        if eps > 0:
            xsum = tile((p, kk, 1), F32, "xs")
            if wrow is None:
                reduce_free(ctx, xsum, x, Alu.add)
            else:
                wx = nl.ndarray(x.shape, F32, name="wx")
                nisa.tensor_tensor(wx, x, _wview(wrow, p, kk, c0, w), Alu.multiply,
                                   engine=ctx.pick({e: ctx.cycles("tt", e, kk * w) for e in (V, G)}))
                reduce_free(ctx, xsum, wx, Alu.add)
        _exp_sum(ctx, sc, x, nm, kk, w, C >= SLOT_N, clobber=True)
        if st["nM"] is None:
            st.update(nM=nm, s=sc, xs=xsum)
        else:
            st["nM"], st["s"] = _merge(ctx, st["nM"], st["s"], nm, sc)
            if eps > 0:
                x2 = tile((p, kk, 1), F32, "xs2")
                nisa.tensor_tensor(x2, st["xs"], xsum, Alu.add, engine=V)
                st["xs"] = x2
        if c0 + w < C:
            return
        del state[ti]
        rows = st["rows"]
        logs = tile((p, kk), F32, "logs")
        nisa.activation(logs, Act.log, st["s"].reshape(p, kk))
        lse = tile((p, kk), F32, "lse")
        nisa.tensor_tensor(lse, logs, st["nM"].reshape(p, kk), Alu.subtract, engine=V)  # log(sum) + max
        xt = rows.gather(logits)
        loss = tile((p, kk), F32, "li")  # -log p_t = log(sum) - (x_t - max): no cancellation at the max
        nisa.tensor_tensor(loss, xt, st["nM"].reshape(p, kk), Alu.add, engine=V)
        nisa.tensor_tensor(loss, logs, loss, Alu.subtract, engine=V)
        if rows.wt is not None:
            nisa.tensor_tensor(loss, loss, rows.wt, Alu.multiply, engine=V)
        if eps > 0:
            sm = tile((p, kk), F32, "smooth")  # W * lse - sum_c w_c x_c  (W = C without weights)
            if W is None:
                nisa.tensor_scalar(sm, lse, Alu.multiply, float(C), engine=V)
            else:
                nisa.tensor_scalar(sm, lse, Alu.multiply, W[0:p], engine=V)
            nisa.tensor_tensor(sm, sm, st["xs"].reshape(p, kk), Alu.subtract, engine=V)
            nisa.tensor_scalar(sm, sm, Alu.multiply, eps / C, engine=V)
            nisa.tensor_scalar(loss, loss, Alu.multiply, 1.0 - eps, engine=V)
            nisa.tensor_tensor(loss, loss, sm, Alu.add, engine=V)
        nisa.select(loss, rows.valid, loss, 0.0)
        if reduction == "none":
            ctx.store(view(out, out.offset + row0, ((p, kk), (kk, 1))), loss)
            return
        part = tile((p, 2), F32, "part")
        nisa.tensor_reduce(part[:, 0:1], loss, Alu.add, axis=1, engine=V)
        nisa.tensor_reduce(part[:, 1:2], rows.denominator_terms(), Alu.add, axis=1, engine=V)
        nisa.tensor_tensor(acc[0:p], acc[0:p], part, Alu.add, engine=V)

    # software pipelining over (row tile, column chunk): the loads and maxes of the next `depth`
    # chunks are issued before a chunk's exp pass, so in-order engines always find independent work
    pending = []
    for ti, (row0, p, kk) in enumerate(row_tiles(N, P, k)):
        for c0 in range(0, C, chunk):
            pending.append(start((ti, row0, p, kk, c0, _min(chunk, C - c0))))
            if len(pending) > depth:
                finish(pending.pop(0))
    while pending:
        finish(pending.pop(0))
    if reduction != "none":
        tot = nl.ndarray((1, 2), F32, buffer=nl.psum, name="tot")
        nisa.nc_matmul(tot, ctx.ones(P, 1), acc, accumulate=False)
        res = tile((1, 1), F32, "res")
        if reduction == "mean":
            nisa.tensor_tensor(res, tot[:, 0:1], tot[:, 1:2], Alu.divide, engine=V)
        else:
            nisa.tensor_copy(res, tot[:, 0:1], engine=V)
        ctx.store(scalar_out(out), res)
    return out


@nk.kernel(name="cross_entropy_backward", tunables=TUNE)
def cross_entropy_backward(grad_output, logits, target, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0, tile_kib=32):
    """d cross_entropy / d logits [N, C] (logits' dtype) given grad_output ([] or [N] for "none")."""
    _check(logits, target, weight, reduction, label_smoothing)
    ctx = Ctx()
    N, C = logits.shape
    P = ctx.P
    eps = float(label_smoothing)
    want = (N,) if reduction == "none" else ()
    if tuple(grad_output.shape) != want:
        raise KernelError(f"cross_entropy_backward: grad_output must have shape {list(want)} for reduction "
                          f"{reduction!r}, got {list(grad_output.shape)}")
    out = nl.ndarray((N, C), logits.dtype, buffer=nl.hbm, name="grad_logits")
    if N == 0 or C == 0:
        return out
    k, E = _plan(ctx, N, C, logits.dtype.itemsize, tile_kib * 1024)
    wrow = W = None
    if weight is not None and eps > 0:
        wrow, W = weight_row(ctx, weight, C)
    gs = None  # the per-row grad scale for "sum"/"mean", on every partition
    if reduction != "none":
        gs = tile((P, 1), F32, "gs")
        ctx.load(gs, view(grad_output, grad_output.offset, ((P, 0), (1, 1))))
        if reduction == "mean":
            acc = tile((P, 1), F32, "dacc")
            nisa.memset(acc, 0.0, engine=V)
            for row0, p, kk in row_tiles(N, P, k):
                rows = Rows(ctx, logits, target, weight, ignore_index, eps, row0, p, kk)
                part = tile((p, 1), F32, "dpart")
                nisa.tensor_reduce(part, rows.denominator_terms(), Alu.add, axis=1, engine=V)
                nisa.tensor_tensor(acc[0:p], acc[0:p], part, Alu.add, engine=V)
            den = nl.ndarray((P, 1), F32, buffer=nl.psum, name="den")
            nisa.nc_matmul(den, ctx.ones(P, P), acc, accumulate=False)  # the total on every partition
            g2 = tile((P, 1), F32, "gsm")
            nisa.tensor_tensor(g2, gs, den, Alu.divide, engine=V)
            gs = g2
    for row0, p, kk in row_tiles(N, P, k):
        rows = Rows(ctx, logits, target, weight, ignore_index, eps, row0, p, kk)
        rt = RowTile(ctx, logits, row0, p, kk, C, E)
        rt.start()
        rt.lse(False, None)
        g = tile((p, kk), F32, "g")
        if reduction == "none":
            ctx.load(g, view(grad_output, grad_output.offset + row0, ((p, kk), (kk, 1))))
        else:
            nisa.tensor_copy(g, view(gs, gs.offset, (gs[0:p].dims[0], (kk, 0))), engine=V)
        nisa.select(g, rows.valid, g, 0.0)  # not a product: the mean's scale is inf when all are ignored
        # grad = a * p - b * [c == t] - c * w_c ; a = g ((1-eps) w_t + eps/C W), b = g (1-eps) w_t, c = g eps/C
        wt = rows.wt
        b = tile((p, kk), F32, "cb")
        if wt is None:
            ts(b, g, Alu.multiply, 1.0 - eps)
        else:
            nisa.tensor_tensor(b, g, wt, Alu.multiply, engine=V)
            ts(b, b, Alu.multiply, 1.0 - eps)
        a = tile((p, kk), F32, "ca")
        if eps == 0:
            nisa.tensor_copy(a, b, engine=V)
        elif W is None and wt is None:
            nisa.tensor_copy(a, g, engine=V)  # (1-eps) + eps/C * C
        else:
            cW = tile((p, kk), F32, "cW")
            if W is None:
                ts(cW, g, Alu.multiply, eps)
            else:
                nisa.tensor_scalar(cW, g, Alu.multiply, W[0:p], op1=Alu.multiply, operand1=eps / C, engine=V)
            nisa.tensor_tensor(a, b, cW, Alu.add, engine=V)
        cc = tile((p, kk), F32, "cc")
        ts(cc, g, Alu.multiply, eps / C)
        # p = exp(x - max) / sum: ScalarE exponentiates with the exact shift, 1/sum folds into a
        nlse = tile((p, kk, 1), F32, "nmx")
        nisa.tensor_copy(nlse, rt.nM, engine=V)
        a_over = tile((p, kk), F32, "aos")
        nisa.tensor_tensor(a_over, a, rt.s.reshape(p, kk), Alu.divide, engine=V)
        a = a_over
        for c0 in range(0, C, rt.E if not rt.resident else C):
            w = _min(C if rt.resident else rt.E, C - c0)
            xc = rt.x if rt.resident else rt.load(c0, w)  # the gradient is written over it
            if rt.per_slot:
                for j in range(kk):
                    sl = slice(j, j + 1)
                    for e, a0, a1 in ctx.split(w, 2048, lambda en, size: ctx.cycles("ts", en, size)
                                               if en is not S else None):
                        ctx.charge(S, ctx.cycles("act", S, a1 - a0))
                        pr = nl.ndarray((p, 1, a1 - a0, 1), F32, name="prob")
                        nisa.activation(pr, Act.exp, xc[:, sl, a0:a1], bias=nlse[:, sl])
                        dst = xc[:, sl, a0:a1]
                        if wrow is None:
                            nisa.tensor_scalar(dst, pr, Alu.multiply, a[:, sl], op1=Alu.subtract,
                                               operand1=cc[:, sl], engine=e)
                        else:
                            nisa.tensor_scalar(pr, pr, Alu.multiply, a[:, sl], engine=e)
                            cw = nl.ndarray((p, 1, a1 - a0, 1), F32, name="cw")
                            nisa.tensor_scalar(cw, _wview(wrow, p, 1, c0 + a0, a1 - a0), Alu.multiply, cc[:, sl],
                                               engine=e)
                            nisa.tensor_tensor(dst, pr, cw, Alu.subtract, engine=e)
            else:
                pr = nl.ndarray((p, kk, w, 1), F32, name="bprob")
                nisa.tensor_tensor(pr, xc, bcast(nlse, w), Alu.add, engine=V)
                nisa.activation(pr, Act.exp, pr)
                nisa.tensor_tensor(pr, pr, bcast(a.reshape(p, kk, 1), w), Alu.multiply, engine=V)
                if wrow is None:
                    nisa.tensor_tensor(xc, pr, bcast(cc.reshape(p, kk, 1), w), Alu.subtract, engine=V)
                else:
                    cw = nl.ndarray((p, kk, w, 1), F32, name="cwb")
                    ccb = bcast(cc.reshape(p, kk, 1), w)
                    nisa.tensor_tensor(cw, _wview(wrow, p, kk, c0, w), ccb, Alu.multiply, engine=V)
                    nisa.tensor_tensor(xc, pr, cw, Alu.subtract, engine=V)
            ctx.store(view(out, out.offset + row0 * C + c0, ((p, kk * C), (kk, C), (w, 1), (1, 1))), xc)
        # the target column: a * p_t - b - c * w_t, exact, written over the row's value by a scatter
        xt = rows.gather(logits)
        v = tile((p, kk), F32, "vt")
        nisa.tensor_tensor(v, xt, rt.nM.reshape(p, kk), Alu.add, engine=V)  # x_t - max
        nisa.activation(v, Act.exp, v)
        nisa.tensor_tensor(v, v, a, Alu.multiply, engine=V)  # a * exp(x_t - max) / sum
        nisa.tensor_tensor(v, v, b, Alu.subtract, engine=V)
        if eps > 0:
            cwt = tile((p, kk), F32, "cwt")
            if rows.wt is None:
                nisa.tensor_copy(cwt, cc, engine=V)
            else:
                nisa.tensor_tensor(cwt, cc, rows.wt, Alu.multiply, engine=V)
            nisa.tensor_tensor(v, v, cwt, Alu.subtract, engine=V)
        vt = tile((p, kk), logits.dtype, "vtc")
        nisa.tensor_copy(vt, v, engine=V)
        tab = rows.table(out)
        for j in range(kk):
            nisa.dma_scatter(tab, vt[:, j:j + 1], rows.idx[:, j:j + 1], queue=ctx.store_queue())
    return out
