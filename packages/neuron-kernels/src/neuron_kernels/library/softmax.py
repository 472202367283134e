"""softmax / log_softmax over any dim, forward and backward (torch semantics), numerically stable.

- ``softmax(x, dim)``: exp(x - max) / sum, fp32 internally, rounded once to x's dtype.
- ``log_softmax(x, dim)``: x - max - log(sum exp(x - max)).
- ``softmax_backward(grad_output, output, dim)``: torch's ``_softmax_backward_data``:
  output * (grad_output - sum(grad_output * output)).
- ``log_softmax_backward(grad_output, output, dim)``: ``_log_softmax_backward_data``:
  grad_output - exp(output) * sum(grad_output).

Results have the dtype of x (forward) or grad_output (backward); float32, bfloat16, float16.

How (see reduce.py for the layouts): the softmax dim is R of ``[K0, R, K1]``.
- Rows on partitions (layout A). For the last dim (K1 = 1) with rows of >= 128 elements every
  instruction is per row: VectorE max (bf16: 2 elements/cycle, negated: it is the exp bias),
  ScalarE ``exp`` with its free accumulate giving the row sum in the same pass (fp32), then one
  divide by the row's sum (VectorE or GpSimd, ``tensor_scalar`` with a per-partition operand); each
  row's work starts when its row is loaded, and the engines are balanced by the list scheduler of
  :class:`reduce.Ctx`. Loads and stores use separate DMA queues; tiles rotate through SBUF.
  Short rows, or a softmax dim followed by K1 > 1 elements, pack many rows per partition and use
  broadcast (stride-0) operands.
- Rows longer than the SBUF budget run two passes: online (max, sum) over chunks, then a second read.
- Few rows (K0 * K1 small) and long: each row is cut across the partitions (layout B), per-partition
  (max, sum) are combined on GpSimd (max) and TensorE (ones-matrix matmul: the sum lands on every
  partition), then every partition normalizes its segment.
- The row loop is software-pipelined one tile deep (tile t's statistics are issued before tile t-1's
  output pass).

Performance (simulated trn2): the last dim of 16 MiB (rows of 4096) runs at 95-97% of the DMA
roofline in bf16 and fp32, forward and log; backward 57% (bf16) / 90% (fp32), engine-bound by its
~6 passes. A softmax dim followed by other dims (``dim=0`` of a matrix, ``dim=1`` of [B, S, H]) uses
broadcast forms (2 cycles/element on VectorE/GpSimd) and reaches ~25-50%: the known gap (a TensorE
transpose-based path would do better).
"""

from __future__ import annotations

import math
from builtins import max as _max
from builtins import min as _min
from builtins import sum as _sum

import neuron_kernels as nk
from neuron_hal import Act, Alu
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl
from neuron_kernels.errors import KernelError

from .reduce import (
    BF16,
    BF16_MAX,
    F32,
    FLT_MAX,
    INF,
    SLOT_N,
    Chunk,
    Ctx,
    G,
    S,
    V,
    bcast,
    cdiv,
    combine_gpsimd,
    combine_sum,
    hbm3,
    hbm_seg,
    is16,
    norm_dims,
    plan_layout,
    reduce_free,
    row_tiles,
    split3,
    sum_rows,
    tile,
    ts,
    view,
)

FWD, LOG, BWD, LOGBWD = "softmax", "log_softmax", "softmax_backward", "log_softmax_backward"


def _ew_engine(ctx: Ctx, kind: str, n: int, fast: bool = False):
    return ctx.pick({e: ctx.cycles(kind, e, n, fast and e is V) for e in (V, G)})


class Mode:
    """One of the four ops: per-row statistics of the resident inputs, then the output."""

    def __init__(self, ctx: Ctx, name: str, out_dt):
        self.ctx, self.name, self.out_dt = ctx, name, out_dt
        self.recompute = False  # forward, 16-bit: no fp32 copy of exp(x - max); ScalarE recomputes it
        self.e = None

    def scratch_bytes(self, itemsizes, per_row: bool) -> int:
        """SBUF bytes per element of a resident chunk (inputs + fp32 scratch). ``per_row``: rows take
        per-row instructions (else broadcast forms need an fp32 temporary)."""
        if self.name == FWD:
            if itemsizes[0] == 4:
                return 4 if per_row else 8
            return itemsizes[0] + (0 if self.recompute and per_row else 4)
        if self.name == LOG:  # broadcast forms keep x - max and exp(x - max) (over x when x is fp32)
            return itemsizes[0] + (0 if per_row else 4 if itemsizes[0] == 4 else 8)
        return _sum(itemsizes) + 4

    # ---- statistics: list of [p, k, kc] fp32 tiles -------------------------------------------
    def stats(self, xs, c: Chunk, keep: bool):
        """Per-row statistics of a chunk; ``keep``: the chunk stays resident for ``apply`` (so the
        forward may leave exp(x - max) in a scratch tile), else it is reloaded."""
        ctx = self.ctx
        if self.name in (FWD, LOG):
            x = xs[0]
            nm = tile(c.sshape, x.dtype if x.dtype is BF16 else F32, "nm")  # -max, exact
            reduce_free(ctx, nm, x, Alu.max, negate=True, fast=x.dtype is BF16, slots=c.per_slot and c.n >= 1024)
            if c.seg or not keep:  # a part of a row that merges with others: a part of only -inf (max -inf,
                # -max = inf) would give exp(-inf + inf) = NaN sums and exps; -max clamped to the largest finite
                # value gives 0s (and leaves a max of -FLT_MAX exact)
                ts(nm, nm, Alu.min, BF16_MAX if nm.dtype is BF16 else FLT_MAX,
                   engine=ctx.pick({e: ctx.cycles("ts", e, c.k * c.kc) for e in (V, G)}))
            s = tile(c.sshape, F32, "sum")
            e = None
            if self.name == FWD and keep and (x.dtype is F32 or not self.recompute):
                e = x if x.dtype is F32 else nl.ndarray(x.shape, F32, name="e")
            if c.per_slot:
                junk = e if e is not None else nl.ndarray((c.p, 1, c.n, 1), BF16, name="junk")
                for j in range(c.k):
                    sl = slice(j, j + 1)
                    ctx.charge(S, ctx.cycles("act", S, c.n, reduce=True))
                    dst = e[:, sl] if e is not None else junk
                    nisa.activation(dst, Act.exp, x[:, sl], bias=nm[:, sl], reduce_res=s[:, sl])
            else:
                d = e if e is not None else nl.ndarray(x.shape, F32, name="d")
                n = math.prod(x.shape[1:])
                nisa.tensor_tensor(d, x, bcast(nm, c.n), Alu.add, engine=_ew_engine(ctx, "tt", n))
                ctx.charge(S, ctx.cycles("act", S, n))
                if self.name == LOG and keep:  # x - max stays for the output, (x - max) - log(sum)
                    ex = x if x.dtype is F32 else nl.ndarray(x.shape, F32, name="ex")
                    nisa.activation(ex, Act.exp, d)
                    reduce_free(ctx, s, ex, Alu.add)
                    e = d
                else:
                    nisa.activation(d, Act.exp, d)
                    reduce_free(ctx, s, d, Alu.add)
            self.e = e
            return [nm, s]
        if self.name == BWD:
            g, y = xs
            s = tile(c.sshape, F32, "gys")
            gy = nl.ndarray(g.shape, F32, name="gy")
            if c.per_slot:
                for j in range(c.k):
                    sl = slice(j, j + 1)
                    nisa.tensor_tensor(gy[:, sl], g[:, sl], y[:, sl], Alu.multiply,
                                       engine=_ew_engine(ctx, "tt", c.n))
                sum_rows(ctx, s, gy, c)
            else:
                n = math.prod(g.shape[1:])
                nisa.tensor_tensor(gy, g, y, Alu.multiply, engine=_ew_engine(ctx, "tt", n))
                reduce_free(ctx, s, gy, Alu.add)
            self.e = gy
            return [s]
        g = xs[0]  # LOGBWD
        s = tile(c.sshape, F32, "gs")
        if c.per_slot:
            sum_rows(ctx, s, g, c)
        else:
            reduce_free(ctx, s, g, Alu.add)
        return [s]

    def merge(self, a, b):
        if self.name in (FWD, LOG):
            (nma, sa), (nmb, sb) = a, b
            nM = tile(nma.shape, F32, "nM")
            nisa.tensor_tensor(nM, nma, nmb, Alu.min, engine=V)
            out = None
            for nm_i, s_i in ((nma, sa), (nmb, sb)):
                f = tile(nma.shape, F32, "mf")
                nisa.tensor_tensor(f, nM, nm_i, Alu.subtract, engine=V)  # max_i - max <= 0
                nisa.activation(f, Act.exp, f)
                nisa.tensor_tensor(f, f, s_i, Alu.multiply, engine=V)
                if out is None:
                    out = f
                else:
                    o2 = tile(nma.shape, F32, "ms")
                    nisa.tensor_tensor(o2, out, f, Alu.add, engine=V)
                    out = o2
            return [nM, out]
        o = tile(a[0].shape, F32, "msum")
        nisa.tensor_tensor(o, a[0], b[0], Alu.add, engine=V)
        return [o]

    def combine(self, parts, kc: int):
        """parts: (stats [Q, 1, kc], Q) per group -> per-group stats as if each row were whole."""
        ctx = self.ctx
        if self.name in (FWD, LOG):
            nM = combine_gpsimd(ctx, [(st[0], Q) for st, Q in parts], Alu.min, parts[0][0][0].dtype, kc)
            scaled, nMb = [], []
            for (nm_i, s_i), Q in parts:
                b = tile((Q, 1, kc), F32, "cnM")
                nisa.partition_broadcast(b, nM)
                f = tile((Q, 1, kc), F32, "cf")
                nisa.tensor_tensor(f, b, nm_i, Alu.subtract, engine=V)
                nisa.activation(f, Act.exp, f)  # exp(max_i - max)
                sc = tile((Q, 1, kc), F32, "csc")
                nisa.tensor_tensor(sc, f, s_i, Alu.multiply, engine=V)
                scaled.append((sc, Q, None))
                nMb.append((b, f))
            out = []
            for ((nm_i, _), Q), (b, f) in zip(parts, nMb):
                tot = combine_sum(ctx, scaled, kc, bcast_to=Q)  # the row sum on this group's partitions
                if self.name == FWD:  # e_i = exp(x - max_i) is resident: scale it by exp(max_i - max) / sum
                    fac = tile((Q, 1, kc), F32, "cfac")
                    nisa.tensor_tensor(fac, f, tot, Alu.divide, engine=V)
                    out.append(["factor", fac])
                else:  # out = (x - max_i) + ((max_i - max) - log(sum)): x - max_i is kept; max_i - max is small
                    # where the max is large next to the spread, so log(sum) survives the rounding
                    corr = tile((Q, 1, kc), F32, "ccorr")
                    nisa.tensor_tensor(corr, b, nm_i, Alu.subtract, engine=V)
                    ls = tile((Q, 1, kc), F32, "cls")
                    nisa.activation(ls, Act.log, tot)
                    nisa.tensor_tensor(corr, corr, ls, Alu.subtract, engine=V)
                    out.append(["shift", nm_i, corr])
            return out
        tots = [(st[0], Q, None) for st, Q in parts]
        return [[combine_sum(ctx, tots, kc, bcast_to=Q)] for _, Q in parts]

    # ---- output ------------------------------------------------------------------------------
    def apply(self, xs, st, c: Chunk, resident: bool):
        """Output tile [p, k, n, kc] (written over an input tile where possible)."""
        ctx = self.ctx
        n = math.prod(xs[0].shape[1:])
        if self.name == FWD:
            x = xs[0]
            out = x if x.dtype == self.out_dt else nl.ndarray(x.shape, self.out_dt, name="out")
            if st[0] == "factor":  # layout B: resident e_i times a per-(partition, column) factor
                return self._scale(self.e, st[1], out, c, Alu.multiply)
            nm, s = st
            if resident and self.e is None:  # recompute: exp(x - max) again, in pieces
                return self._recompute(x, nm, s, out, c)
            if resident:
                e = self.e
            else:
                e = nl.ndarray(x.shape, F32, name="e2")
                if c.per_slot:
                    for j in range(c.k):
                        sl = slice(j, j + 1)
                        ctx.charge(S, ctx.cycles("act", S, c.n))
                        nisa.activation(e[:, sl], Act.exp, x[:, sl], bias=nm[:, sl])
                else:
                    nisa.tensor_tensor(e, x, bcast(nm, c.n), Alu.add, engine=_ew_engine(ctx, "tt", n))
                    ctx.charge(S, ctx.cycles("act", S, n))
                    nisa.activation(e, Act.exp, e)
            return self._scale(e, s, out, c, Alu.divide)
        if self.name == LOG:
            return self._log_out(xs[0], st, c, resident)
        if self.name == BWD:
            g, y = xs
            (s,) = st
            d = self.e if resident else nl.ndarray(g.shape, F32, name="gms")  # g - sum (over g * y if resident)
            self._scale(g, s, d, c, Alu.subtract)
            out = g if g.dtype == self.out_dt else nl.ndarray(g.shape, self.out_dt, name="out")
            if c.per_slot:
                for j in range(c.k):
                    sl = slice(j, j + 1)
                    nisa.tensor_tensor(out[:, sl], d[:, sl], y[:, sl], Alu.multiply, engine=_ew_engine(ctx, "tt", c.n))
            else:
                nisa.tensor_tensor(out, d, y, Alu.multiply, engine=_ew_engine(ctx, "tt", n))
            return out
        g, y = xs  # LOGBWD: g - exp(y) * sum
        (s,) = st
        e = nl.ndarray(g.shape, F32, name="ey")
        ctx.charge(S, ctx.cycles("act", S, n))
        nisa.activation(e, Act.exp, y)
        self._scale(e, s, e, c, Alu.multiply)
        out = g if g.dtype == self.out_dt else nl.ndarray(g.shape, self.out_dt, name="out")
        if c.per_slot:
            for j in range(c.k):
                sl = slice(j, j + 1)
                nisa.tensor_tensor(out[:, sl], g[:, sl], e[:, sl], Alu.subtract, engine=_ew_engine(ctx, "tt", c.n))
        else:
            nisa.tensor_tensor(out, g, e, Alu.subtract, engine=_ew_engine(ctx, "tt", n))
        return out

    def _log_out(self, x, st, c: Chunk, resident: bool):
        """(x - max) - log(sum), in that order as torch computes it: x - max is exact near the max, while
        x + (-max - log(sum)) loses log(sum) in the rounding of a large max (log_softmax of [1e20, 1e20] gave 0,
        of float16 65504s -0.6914)."""
        ctx = self.ctx
        if st[0] == "shift":  # layout B: (x - max_i) + corr, from the combine
            nm, ls, op = st[1], st[2], Alu.add
        else:
            nm, s = st
            ls, op = tile(c.sshape, F32, "lls"), Alu.subtract
            ctx.charge(S, ctx.cycles("act", S, c.k * c.kc))
            nisa.activation(ls, Act.log, s)
        out = x if x.dtype == self.out_dt else nl.ndarray(x.shape, self.out_dt, name="out")
        if c.per_slot:  # one two-op tensor_scalar per row on VectorE / GpSimd
            fast = is16(x.dtype) and is16(out.dtype)
            for j in range(c.k):
                sl = slice(j, j + 1)
                e = ctx.pick({en: ctx.cycles("ts", en, c.n, fast and en is V) for en in (V, G)})
                nisa.tensor_scalar(out[:, sl], x[:, sl], Alu.add, nm[:, sl], op1=op, operand1=ls[:, sl], engine=e)
            return out
        n = math.prod(x.shape[1:])
        d = self.e if resident and self.e is not None else None  # x - max, kept by the statistics
        if d is None:
            d = nl.ndarray(x.shape, F32, name="lxm")
            nisa.tensor_tensor(d, x, bcast(nm, c.n), Alu.add, engine=_ew_engine(ctx, "tt", n))
        nisa.tensor_tensor(out, d, bcast(ls, c.n), op, engine=_ew_engine(ctx, "tt", n))
        return out

    def _act_operand(self, st, op: Alu, c: Chunk):
        """A lazily made (scale, bias) pair of [p, k, kc] tiles so ScalarE computes op(x, st)."""
        made = []

        def get():
            if not made:
                if op is Alu.multiply:
                    made.append((st, None))
                elif op is Alu.add:
                    made.append((None, st))
                else:
                    t = tile(st.shape, F32, "actop")
                    if op is Alu.divide:
                        nisa.tensor_scalar(t, st, Alu.divide, 1.0, reverse0=True, engine=V)
                        made.append((t, None))
                    else:
                        nisa.tensor_scalar(t, st, Alu.multiply, -1.0, engine=V)
                        made.append((None, t))
            return made[0]
        return get

    def _recompute(self, x, nm, s, out, c: Chunk, piece: int = 1024):
        """out = exp(x - max) / sum for rows too long to keep exp(x - max) in fp32: ScalarE recomputes each piece of
        a row into a small fp32 tile and VectorE / GpSimd divide it into the 16-bit output. One ScalarE pass of
        exp(x + (-max - log(sum))) would be cheaper, but that bias loses log(sum) in a large max's rounding (rows of
        1e30 gave 1.0, not 1/n)."""
        ctx = self.ctx
        rs = tile(c.sshape, F32, "rrs")
        nisa.tensor_scalar(rs, s, Alu.divide, 1.0, reverse0=True, engine=V)
        for j in range(c.k):
            sl = slice(j, j + 1)
            for a in range(0, c.n, piece):
                b = _min(c.n, a + piece)
                e = nl.ndarray((c.p, 1, b - a, c.kc), F32, name="rpe")
                ctx.charge(S, ctx.cycles("act", S, b - a))
                nisa.activation(e, Act.exp, x[:, sl, a:b], bias=nm[:, sl])
                en = ctx.pick({g: ctx.cycles("ts", g, b - a) for g in (V, G)})
                nisa.tensor_scalar(out[:, sl, a:b], e, Alu.multiply, rs[:, sl], engine=en)
        return out

    def _scale(self, src, st, dst, c: Chunk, op: Alu):
        """dst = op(src, st) with st [p, k, kc] per row: per-row tensor_scalar (VectorE/GpSimd) or
        ScalarE activation(identity, scale=, bias=), or one broadcast op."""
        ctx = self.ctx
        if c.per_slot:
            fast = is16(src.dtype) and is16(dst.dtype)
            act = None  # the operand ScalarE needs: (scale, bias)
            if op in (Alu.multiply, Alu.divide, Alu.add, Alu.subtract):
                act = self._act_operand(st, op, c)
            for j in range(c.k):
                sl = slice(j, j + 1)
                opts = {e: ctx.cycles("ts", e, c.n, fast and e is V) for e in (V, G)}
                if act is not None:
                    opts[S] = ctx.cycles("act", S, c.n)
                e = ctx.pick(opts)
                if e is S:
                    scale, bias = act()
                    nisa.activation(dst[:, sl], Act.identity, src[:, sl],
                                    scale=scale[:, sl] if scale is not None else 1.0,
                                    bias=bias[:, sl] if bias is not None else None)
                else:
                    nisa.tensor_scalar(dst[:, sl], src[:, sl], op, st[:, sl], engine=e)
        else:
            n = math.prod(src.shape[1:])
            nisa.tensor_tensor(dst, src, bcast(st, c.n), op, engine=_ew_engine(ctx, "tt", n))
        return dst


STATS_BYTES = 3 * 4  # per row and column of a chunk: up to three fp32 statistics live (-max, sum, the log's bias)
# layout B, per column of a chunk: the statistics of two groups of segments and their combine (-max, sum, the
# broadcast max, exp(max_i - max), the scaled sum, the row sum, the factor; GpSimd's partials): up to 16 fp32
SEG_STATS_BYTES = 16 * 4


def run(ctx: Ctx, mode: Mode, srcs: list, out, dim: int, budget: int, layout: str = "auto"):
    """softmax-family op of srcs (HBM, same shape) along ``dim`` into out."""
    shape = tuple(srcs[0].shape)
    if math.prod(shape) == 0:
        return
    K0, R, K1 = split3(shape, dim)
    P = ctx.P
    flat = [hbm_flat(s) for s in srcs]
    oflat = hbm_flat(out)
    sizes = [s.dtype.itemsize for s in srcs]
    # a chunk is resident (one read of the input) if its rows fit in a share of SBUF that leaves room
    # for double buffering; the budget sets how much is loaded at once beyond that
    limit = _max(budget, ctx.prof.sbuf_partition_bytes // 3)
    per_row = K1 == 1 and R >= SLOT_N
    if mode.name == FWD and sizes[0] < 4 and per_row and R * mode.scratch_bytes(sizes, True) > limit:
        mode.recompute = True
    # the statistics are fp32 tiles per row and column: next to a short reduced dim (R = 1 with K1 = 20495 columns)
    # they take as much SBUF as the chunk itself
    isz = mode.scratch_bytes(sizes, per_row) + (cdiv(STATS_BYTES, R) if K1 > 1 else 0)
    cap = ctx.prof.free_size_max
    if layout == "auto" or (layout == "B" and K0 >= P):
        layout = plan_layout(ctx, K0, R, K1, isz, limit)
    if layout == "two_pass":
        mode.recompute = False
    if layout == "B" and R > 1:
        mode.recompute = False  # a segment's exp(x - max_i) is kept: the combine rescales it (16-bit rows of 40000)
        q = _min(P, R)
        L = R // q
        isz_b = mode.scratch_bytes(sizes, K1 == 1 and L >= SLOT_N)
        lim_b = _min(limit, ctx.prof.free_stride_max * isz_b)
        per_col = L * isz_b + SEG_STATS_BYTES
        kc = _min(K1, cap, _max(1, lim_b // per_col))
        if kc * per_col <= lim_b:  # a segment of every row fits: resident; else the two-pass rows path
            return run_segments(ctx, mode, flat, oflat, K0, R, K1, kc)
    # layout A: k0 rows on partitions ("two_pass": force the long-row path, for tests). A tile
    # [p, k, n, kc] also needs n * kc within the free stride limit.
    if layout == "two_pass":
        limit = _min(limit, _max(1, R * isz // 3))
    limit = _min(limit, ctx.prof.free_stride_max * isz)
    if R * isz <= limit:
        kc = _max(1, _min(K1, limit // (R * isz), cap))
        k = _max(1, _min(budget // (R * kc * isz), cdiv(K0, P), cap)) if kc == K1 else 1
        n = R
    else:  # two passes over chunks of the row
        E = _max(1, _min(budget // isz, ctx.prof.free_stride_max))
        kc = _min(K1, _max(1, E // 2048)) if K1 > 1 else 1
        n, k = _max(1, _min(E // kc, cap, -(-R // 2))), 1
    pending = []  # software pipelining: tile t's statistics are issued before tile t-1's output pass,
    # so in-order engines find independent work while a row's dependency chain completes

    def flush():
        xs, st, c, e, dst = pending.pop(0)
        mode.e = e
        ctx.store(dst, mode.apply(xs, st, c, resident=True))

    for row0, p, kk in row_tiles(K0, P, k):
        for c0 in range(0, K1, kc):
            w = _min(kc, K1 - c0)
            if n >= R:
                xs = [_load(ctx, f, K0, R, K1, row0, p, kk, 0, R, c0, w) for f in flat]
                c = Chunk(xs, p, kk, R, w)
                st = mode.stats(xs, c, keep=True)
                pending.append((xs, st, c, mode.e, hbm3(oflat, K0, R, K1, row0, p, kk, 0, R, c0, w)))
                if len(pending) > 1:
                    flush()
                continue
            st = None
            for r0 in range(0, R, n):
                nn = _min(n, R - r0)
                xs = [_load(ctx, f, K0, R, K1, row0, p, kk, r0, nn, c0, w) for f in flat]
                part = mode.stats(xs, Chunk(xs, p, kk, nn, w), keep=False)
                st = part if st is None else mode.merge(st, part)
            for r0 in range(0, R, n):
                nn = _min(n, R - r0)
                xs = [_load(ctx, f, K0, R, K1, row0, p, kk, r0, nn, c0, w) for f in flat]
                res = mode.apply(xs, st, Chunk(xs, p, kk, nn, w), resident=False)
                ctx.store(hbm3(oflat, K0, R, K1, row0, p, kk, r0, nn, c0, w), res)
    while pending:
        flush()


def run_segments(ctx: Ctx, mode: Mode, flat, oflat, K0, R, K1, kc):
    """Layout B: each row's R elements cut into q segments (partitions) + a group of the rest."""
    P = ctx.P
    q = _min(P, R)
    L = R // q
    rem = R - q * L
    grps = [(0, q, L)] + ([(q * L, rem, 1)] if rem else [])
    for k0 in range(K0):
        for c0 in range(0, K1, kc):
            w = _min(kc, K1 - c0)
            loaded = []
            for s0, Q, Lg in grps:
                xs = []
                for f in flat:
                    t = nl.ndarray((Q, 1, Lg, w), f.dtype, name="sx")
                    ctx.load(t, hbm_seg(f, R, K1, k0, s0, Q, Lg, 0, Lg, c0, w))
                    xs.append(t)
                c = Chunk(xs, Q, 1, Lg, w, r0=s0, seg=Lg)
                st = mode.stats(xs, c, keep=True)
                loaded.append((xs, c, st, getattr(mode, "e", None)))
            finals = mode.combine([(st, c.p) for _, c, st, _ in loaded], w)
            for (xs, c, _, e), fin, (s0, Q, Lg) in zip(loaded, finals, grps):
                mode.e = e
                res = mode.apply(xs, fin, c, resident=True)
                ctx.store(hbm_seg(oflat, R, K1, k0, s0, Q, Lg, 0, Lg, c0, w), res)


def hbm_flat(t):
    return view(t, t.offset, ((math.prod(t.shape), 1),))


def _load(ctx, f, K0, R, K1, row0, p, k, r0, n, c0, kc):
    t = nl.ndarray((p, k, n, kc), f.dtype, name="x")
    ctx.load(t, hbm3(f, K0, R, K1, row0, p, k, r0, n, c0, kc))
    return t


def _check(x, what):
    if not x.dtype.is_float:
        raise KernelError(f"{what}: expected a floating point tensor, got {x.dtype}")


def _dim(x, dim) -> int:
    if dim is None or isinstance(dim, tuple | list):
        raise KernelError("softmax takes one dim (an int)")
    if x.ndim == 0:
        norm_dims(1, dim)
        return 0
    return norm_dims(x.ndim, dim)[0]


TUNE = {"tile_kib": (16, 8, 32)}


def _fwd(name, x, dim, tile_kib, layout):
    _check(x, name)
    ctx = Ctx()
    out = nl.ndarray(tuple(x.shape), x.dtype, buffer=nl.hbm, name="out")
    src = x if x.ndim else hbm_flat(x)
    run(ctx, Mode(ctx, name, x.dtype), [src], out if x.ndim else hbm_flat(out), _dim(x, dim), tile_kib * 1024,
        layout)
    return out


def _bwd(name, grad_output, output, dim, tile_kib, layout):
    _check(grad_output, name)
    if tuple(grad_output.shape) != tuple(output.shape):
        raise KernelError(f"{name}: grad_output {list(grad_output.shape)} and output {list(output.shape)} differ")
    ctx = Ctx()
    out = nl.ndarray(tuple(grad_output.shape), grad_output.dtype, buffer=nl.hbm, name="grad_input")
    g, y = (grad_output, output) if grad_output.ndim else (hbm_flat(grad_output), hbm_flat(output))
    run(ctx, Mode(ctx, name, grad_output.dtype), [g, y], out if grad_output.ndim else hbm_flat(out),
        _dim(grad_output, dim), tile_kib * 1024, layout)
    return out


@nk.kernel(name="softmax", tunables=TUNE)
def softmax(x, dim, tile_kib=16, layout="auto"):
    """torch.softmax(x, dim)."""
    return _fwd(FWD, x, dim, tile_kib, layout)


@nk.kernel(name="log_softmax", tunables=TUNE)
def log_softmax(x, dim, tile_kib=16, layout="auto"):
    """torch.log_softmax(x, dim)."""
    return _fwd(LOG, x, dim, tile_kib, layout)


@nk.kernel(name="softmax_backward", tunables=TUNE)
def softmax_backward(grad_output, output, dim, tile_kib=16, layout="auto"):
    """torch._softmax_backward_data(grad_output, output, dim, dtype): output * (g - sum(g * output))."""
    return _bwd(BWD, grad_output, output, dim, tile_kib, layout)


@nk.kernel(name="log_softmax_backward", tunables=TUNE)
def log_softmax_backward(grad_output, output, dim, tile_kib=16, layout="auto"):
    """torch._log_softmax_backward_data(grad_output, output, dim, dtype): g - exp(output) * sum(g)."""
    return _bwd(LOGBWD, grad_output, output, dim, tile_kib, layout)


__all__ = ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "INF", "SLOT_N"]
