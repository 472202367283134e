"""nll_loss forward and backward (torch semantics), each one program, on log-probabilities and int64 targets.

``nll_loss(logp, target, weight=None, ignore_index=-100, reduction="mean")`` is ``aten.nll_loss_forward`` for
logp [N, C] or [N, C, D] (torch's [N, C, d1, ...] with the trailing dims flattened) in float32/bfloat16/float16
and target [N] or [N, D], int64 (or int32):
    loss_e = -w[t_e] * logp[n, t_e, d]   for every entry e = (n, d), 0 where t_e == ignore_index;
"none" returns loss [target's shape] and total_weight 0, "sum"/"mean" their sum (/ total_weight) with
total_weight = sum over kept entries of w[t_e] (w = 1 without weights), both in logp's dtype. Sums accumulate
in fp32 and round once ("mean" with every entry ignored: 0 / 0 = nan).

``nll_loss_backward(grad_output, logp, target, weight, total_weight, ignore_index, reduction)`` is
``aten.nll_loss_backward``: zeros [logp's shape] except -w[t_e] * g_e at (n, t_e, d), g_e = grad_output[e]
("none") or grad_output / total_weight ("mean", rounded to the dtype first as torch's CPU kernel does) or
grad_output ("sum"). logp is only read for its shape and dtype.

Targets: the int64 values are read as int32 word pairs (no conversion launch). A value lies in [0, C) iff its
high word is 0 and its low word, unsigned, is below C; it equals ignore_index iff the low word does and the
high word is ignore_index's sign extension. Ignored entries read class 0 (or ignore_index, when it is a
class) and are masked with ``select``, so a NaN there cannot leak; any other entry's gather/scatter index is
made negative (-2**30 added), which the indirect DMA's bounds check rejects (the program fails with the
"indirect dma bounds" rule), so an out-of-range, negative or non-int32 target fails where torch raises.

How: entries on partitions, a x b slots per partition. Layout "rows" (n on partitions, b = D entries of each
n in one partition; D = 1 is the plain [N, C] case); layout "cols" (D > SLOTS: an n's entries do not fit a
partition) puts one n's d on the partitions. The flat logp index of a slot is affine in (partition, slot),
made by one ``iota`` issued while the target loads; comparisons of small values run on VectorE (exact in
FP32), index arithmetic on GpSimd's exact integer mode. The target logit and the class weight come from
indirect DMA gathers, one element per partition per slot; with D > 1 and at most ONEHOT_C classes the forward
reads whole rows instead (one load per class chunk, masked by a compare with the class index, summed over
the classes), which beats a gather per 128 entries. The forward reduces [-loss, weight] per partition and
sums partitions and tiles in one PSUM accumulation (ones matmul). The backward stores zeros over the whole
gradient and then scatters each entry's value into its target column (the simulator orders the scatters
after the stores by their HBM accesses); for [N, C] its slot columns cover disjoint row runs, so the
scatters of different columns run in parallel. With D > 1 the scatters of a slot column overlap and wait for
each other, so for up to ONEHOT_C classes the gradient rows are built in SBUF instead (per class chunk: the
same compare, a select of the value, one store). Where no gather or scatter checks every slot, one gather
per tile at each partition's smallest index does.

Speed (trn2 model, device time of one call): [512, 128] fp32 "mean": forward 8.3 us, backward 7.7 us, each
bound by three dependent DMA latencies of ~2 us (target load, gathers or zero store, result store or
scatters); [4, 21, 64, 64] fp32: 25 us and 23 us; [2048, 8192] bf16: 12 us and 101 us.
"""

from __future__ import annotations

from builtins import max as _max
from builtins import min as _min

import neuron_kernels as nk
from neuron_hal import Alu, DType
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl
from neuron_kernels.errors import KernelError

from .loss import REDUCTIONS, scalar_out, weight_row
from .reduce import F32, I32, Ctx, G, V, cdiv, row_tiles, tile, ts, view

I64, U32, U8 = DType.int64, DType.uint32, DType.uint8
SLOTS = 256  # entries per partition per tile: the per-tile state is a dozen [P, SLOTS] 4-byte tiles
ZERO_F = 4096  # elements per partition of the backward's zero tile
ONEHOT_F = 4096  # elements per partition of a one-hot gradient tile (a class chunk of a block)
ONEHOT_C = 256  # classes up to which, with D > 1, rows are read (forward) or built (backward) whole


def _dims(logp, target, weight, reduction, ignore_index, op: str) -> tuple[int, int, int]:
    """(N, C, D) after checking the arguments."""
    if logp.ndim not in (2, 3) or not logp.dtype.is_float:
        raise KernelError(f"{op}: logp must be a floating [N, C] or [N, C, D] tensor, got {logp.dtype} "
                          f"{list(logp.shape)}")
    N, C = logp.shape[:2]
    D = logp.shape[2] if logp.ndim == 3 else 1
    want = (N,) if logp.ndim == 2 else (N, D)
    if tuple(target.shape) != want or target.dtype not in (I64, I32):
        raise KernelError(f"{op}: target must be int64 or int32 {list(want)}, got {target.dtype} "
                          f"{list(target.shape)}")
    if weight is not None and (tuple(weight.shape) != (C,) or not weight.dtype.is_float):
        raise KernelError(f"{op}: weight must be a floating [{C}] tensor, got {weight.dtype} {list(weight.shape)}")
    if reduction not in REDUCTIONS:
        raise KernelError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not -(2**31) <= int(ignore_index) < 2**31:
        raise KernelError(f"{op}: ignore_index {ignore_index} does not fit int32")
    if C < 1 or N * C * D >= 2**30:
        raise KernelError(f"{op}: needs 1 <= C and N * C * D < 2**30 (int32 gather indices), got {N}, {C}, {D}")
    return N, C, D


class Block:
    """A tile of entries: ``p`` partitions x ``a`` x ``b`` slots; slot (i, j) of partition q is entry
    ``e0 + q * qs + i * ist + j``, at flat logp index ``base + q * pstep + i * astep + j`` (+ its class * D)."""

    def __init__(self, e0: int, p: int, a: int, b: int, qs: int, ist: int, base: int, C: int, D: int):
        self.e0, self.p, self.a, self.b, self.qs, self.ist, self.base = e0, p, a, b, qs, ist, base
        self.k = a * b
        if b == D:  # rows layout: entries qs / b and ist / b rows apart
            self.pstep, self.astep = qs // b * C * D, ist // b * C * D
        else:  # cols layout: one n, consecutive d
            self.pstep, self.astep = qs, ist
        self.rows = (p - 1) * self.pstep + (b - 1) + (C - 1) * D + 1  # a slot column's table

    def entries(self, t):
        """This block's entries of a tensor shaped like the target, as [p, a, b]."""
        return view(t, t.offset + self.e0, ((self.p, self.qs), (self.a, self.ist), (self.b, 1)))

    def table(self, t, i: int):
        """Slot column i's single-element table of logp (or of the gradient)."""
        return view(t, t.offset + self.base + i * self.astep, ((self.rows, 1), (1, 1)))


def blocks(P: int, N: int, C: int, D: int, disjoint: bool) -> list[Block]:
    """The tiles covering every entry. Rows layout (n on partitions, all D entries of an n in one partition):
    a partition's entries are consecutive (one contiguous target load), or with ``disjoint`` slot column i
    holds rows i * p + q, so each column's table is its own run of logp and the backward's scatters of
    different columns do not wait for each other (at the price of a strided target load). Cols layout
    (D > SLOTS): one n per tile, its d on partitions. An empty batch (N or D is 0) has no tiles."""
    if N * D == 0:
        return []
    if D <= SLOTS:
        a = _max(1, _min(SLOTS // D, cdiv(N, P)))
        return [Block(n0 * D, p, kk, D, D if disjoint else kk * D, p * D if disjoint else D, n0 * C * D, C, D)
                for n0, p, kk in row_tiles(N, P, a)]
    out = []
    a = _max(1, _min(SLOTS, cdiv(D, P)))
    for n in range(N):
        out += [Block(n * D + d0, p, kk, 1, kk, 1, n * C * D + d0, C, D) for d0, p, kk in row_tiles(D, P, a)]
    return out


def _load_target(ctx, target, blk: Block):
    """(low words, high words or None) of the block's targets, as [p, a, b] int32 views."""
    p, a, b = blk.p, blk.a, blk.b
    if target.dtype is I32:
        lo = tile((p, a, b), I32, "t32")
        ctx.load(lo, blk.entries(target))
        return lo, None
    words = tile((p, a, b, 2), I32, "tw")
    src = type(target)(target.owner, I32, 2 * (target.offset + blk.e0),
                       ((p, 2 * blk.qs), (a, 2 * blk.ist), (b, 2), (2, 1)))
    ctx.load(words, src)
    return words[:, :, :, 0], words[:, :, :, 1]


class Targets:
    """A block's targets: ``idx`` [p, k] int32 slot-local logp index (negative where the target is invalid),
    ``cls`` the class (0 where out of range), ``keep`` 1 where the entry counts (uint8).

    Comparisons of small values run on VectorE (FP32 is exact there), index arithmetic on GpSimd's exact
    integer mode; consecutive instructions of an engine are mostly independent (no issue stall)."""

    def __init__(self, ctx, target, blk: Block, C: int, D: int, ignore_index: int):
        p, k = blk.p, blk.k
        ii = int(ignore_index)
        idx = tile((p, blk.a, blk.b), I32, "idx")  # made while the target loads
        nisa.iota(idx, (0, 1), offset=0, channel_multiplier=blk.pstep)
        idx = idx.reshape(p, k)
        lo, hi = _load_target(ctx, target, blk)
        good = tile((p, k), U8, "good")  # 0 <= value < C: one unsigned compare of the low word (and hi == 0)
        ts(good, lo.with_dtype(U32), Alu.less, C, engine=G)
        ign = tile((p, k), U8, "ign")
        ts(ign, lo, Alu.equal, ii, engine=V if abs(ii) < 2**24 else G)
        if hi is not None:  # the value fits int32 and is non-negative iff hi == 0; equals ignore_index iff ...
            hz = tile((p, k), U8, "hz")
            ts(hz, hi, Alu.equal, 0, engine=V)
            hs = hz
            if ii < 0:  # ... the high word is its sign extension
                hs = tile((p, k), U8, "hs")
                ts(hs, hi, Alu.equal, -1, engine=V)
            nisa.tensor_tensor(good, good, hz, Alu.multiply, engine=G)
            nisa.tensor_tensor(ign, ign, hs, Alu.multiply, engine=V)
        cls = tile((p, k), I32, "cls")
        nisa.tensor_tensor(cls, lo, good, Alu.multiply, engine=G)
        if 0 <= ii < C:  # an ignored target is in range too: drop it
            keep = tile((p, k), U8, "keep")
            nisa.tensor_tensor(keep, good, ign, Alu.subtract, engine=V)
            ok = good
        else:
            keep, ok = good, tile((p, k), U8, "ok")
            nisa.tensor_tensor(ok, good, ign, Alu.add, engine=V)  # exclusive
        pen = tile((p, k), I32, "pen")  # -2**30 where the entry must raise (indices stay below 2**30)
        ts(pen, ok, Alu.multiply, float(2**30), Alu.subtract, float(2**30))
        col = cls
        if D > 1:
            col = tile((p, k), I32, "colD")
            ts(col, cls, Alu.multiply, D, engine=G)
        nisa.tensor_tensor(idx, idx, col, Alu.add, engine=G)
        nisa.tensor_tensor(idx, idx, pen, Alu.add, engine=G)
        self.idx, self.cls, self.keep, self.blk = idx, cls, keep, blk

    def gather(self, ctx, t, dtype, name="g"):
        """The logp element of every slot, as [p, k] ``dtype``."""
        blk = self.blk
        out = tile((blk.p, blk.k), dtype, name)
        for i in range(blk.a):
            table = blk.table(t, i)
            for j in range(i * blk.b, (i + 1) * blk.b):
                nisa.dma_gather(out[:, j:j + 1], table, self.idx[:, j:j + 1], queue=ctx.load_queue())
        return out

    def scatter(self, ctx, t, vals):
        blk = self.blk
        for i in range(blk.a):
            table = blk.table(t, i)
            for j in range(i * blk.b, (i + 1) * blk.b):
                nisa.dma_scatter(table, vals[:, j:j + 1], self.idx[:, j:j + 1], queue=ctx.store_queue())

    def class_weights(self, ctx, weight, C: int):
        """w[cls] [p, k] fp32, or None without weights."""
        if weight is None:
            return None
        blk = self.blk
        out = tile((blk.p, blk.k), F32, "wt")
        wtab = view(weight, weight.offset, ((C, 1), (1, 1)))
        for j in range(blk.k):
            nisa.dma_gather(out[:, j:j + 1], wtab, self.cls[:, j:j + 1], queue=ctx.load_queue())
        return out


def _results(ctx, out, tw, tot, reduction: str) -> None:
    """Store the loss ("sum"/"mean") and total_weight from the [1, 2] PSUM sums (None: no entries)."""
    res = tile((1, 2), F32, "res")
    if reduction == "none" or tot is None:  # "none": torch's total_weight is 0
        nisa.memset(res, 0.0, engine=V)
    else:
        nisa.tensor_copy(res[:, 1:2], tot[:, 1:2], engine=V)
    src = res if tot is None else tot
    if reduction == "mean":  # 0 / 0 = nan when every entry is ignored, as torch
        nisa.tensor_tensor(res[:, 0:1], src[:, 0:1], src[:, 1:2], Alu.divide, engine=V)
    elif reduction == "sum":
        nisa.tensor_copy(res[:, 0:1], src[:, 0:1], engine=V)
    if reduction != "none":
        ctx.store(scalar_out(out), res[:, 0:1])
    ctx.store(scalar_out(tw), res[:, 1:2])


@nk.kernel(name="nll_loss", version=1)
def nll_loss(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    """(loss, total_weight) of aten.nll_loss_forward for logp [N, C] / [N, C, D] and target [N] / [N, D]."""
    N, C, D = _dims(logp, target, weight, reduction, ignore_index, "nll_loss")
    ctx = Ctx()
    P = ctx.P
    out = nl.ndarray(tuple(target.shape) if reduction == "none" else (), logp.dtype, buffer=nl.hbm, name="loss")
    tw = nl.ndarray((), logp.dtype, buffer=nl.hbm, name="total_weight")
    tot = nl.ndarray((1, 2), F32, buffer=nl.psum, name="tot")  # [sum of losses, sum of kept weights]
    first = True
    todo = blocks(P, N, C, D, disjoint=False)
    dense = D > 1 and C <= ONEHOT_C and todo  # few classes: whole rows read, not one gather per slot
    if dense:
        classes = _class_chunks(ctx, C, todo[0].k)
        wrow = None if weight is None else weight_row(ctx, weight, C)[0]
    for blk in todo:
        tg = Targets(ctx, target, blk, C, D, ignore_index)
        p, k = blk.p, blk.k
        if dense:
            x, wt = _dense_pick(ctx, logp, blk, tg, classes, wrow, D)
        else:
            x, wt = tg.gather(ctx, logp, F32, name="xt"), tg.class_weights(ctx, weight, C)
        if wt is not None:  # x * w: one rounding of the product, as torch's -input * weight
            nisa.tensor_tensor(x, x, wt, Alu.multiply, engine=V)
        loss = tile((p, k), F32, "li")
        nisa.select(loss, tg.keep, x, 0.0)  # not a product: an ignored entry's gathered value may be nan
        if reduction == "none":
            ts(loss, loss, Alu.multiply, -1.0)
            ctx.store(blk.entries(out), loss.reshape(p, blk.a, blk.b))
            continue
        part = tile((p, 2), F32, "part")
        nisa.tensor_reduce(part[:, 0:1], loss, Alu.add, axis=1, negate=True, engine=V)
        den = tg.keep
        if wt is not None:
            den = tile((p, k), F32, "den")
            nisa.select(den, tg.keep, wt, 0.0)
        nisa.tensor_reduce(part[:, 1:2], den, Alu.add, axis=1, engine=G if wt is None else V)
        nisa.nc_matmul(tot, ctx.ones(P, 1)[0:p], part, accumulate=not first)  # across partitions and blocks
        first = False
    _results(ctx, out, tw, None if first else tot, reduction)
    return out, tw


def _zero_fill(ctx, out, total: int) -> None:
    """Store zeros over the first ``total`` elements of ``out``: P partitions x L elements per DMA."""
    P = ctx.P
    L = _max(1, _min(ZERO_F, cdiv(total, P)))
    z = tile((P, L), out.dtype, "zero")
    nisa.memset(z, 0.0, engine=G)
    q = 0
    while q < total:
        p = _min(P, (total - q) // L)
        if p == 0:  # the tail, shorter than a partition's run
            ctx.store(view(out, out.offset + q, ((1, total - q), (total - q, 1))), z[0:1, 0:total - q])
            return
        ctx.store(view(out, out.offset + q, ((p, L), (L, 1))), z[0:p])
        q += p * L


def _scale(ctx, grad_output, total_weight, reduction: str, dtype):
    """The gradient scale on every partition [P, 1] fp32 for "sum"/"mean": grad_output (/ total_weight,
    rounded to ``dtype`` like torch's scalar_t division)."""
    P = ctx.P
    g = tile((P, 1), F32, "gs")
    ctx.load(g, view(grad_output, grad_output.offset, ((P, 0), (1, 1))))
    if reduction == "sum":
        return g
    t = tile((P, 1), F32, "tws")
    ctx.load(t, view(total_weight, total_weight.offset, ((P, 0), (1, 1))))
    q = tile((P, 1), dtype, "gq")
    nisa.tensor_tensor(q, g, t, Alu.divide, engine=V)
    return q


def _bcast(t, p: int, dims):
    """A tile seen through free ``dims`` ((size, stride), ...; stride 0 repeats)."""
    return view(t, t.offset, (t[0:p].dims[0], *dims))


def _bounds_check(ctx, logp, blk: Block, tg: Targets) -> None:
    """One gather at each partition's smallest slot index: negative (rejected) when any target is invalid."""
    low = tile((blk.p, 1), I32, "minidx")
    nisa.tensor_reduce(low, tg.idx, Alu.min, axis=1, engine=G)  # integer mode: exact
    chk = tile((blk.p, 1), logp.dtype, "chk")
    nisa.dma_gather(chk, blk.table(logp, 0), low, queue=ctx.load_queue())


def _chunk_layout(blk: Block, w: int, D: int):
    """A class chunk of a block's rows in SBUF: (tile shape, class-index dims, per-slot dims, HBM dims after
    the partition, class axis). [p, a, w, b] in the rows layout (whole rows contiguous in HBM), [p, w, a]
    in the cols layout (runs of consecutive d)."""
    p, a, b = blk.p, blk.a, blk.b
    if b == 1 and blk.astep == 1:
        return (p, w, a), ((w, 1), (a, 0)), ((w, 0), (a, 1)), ((w, D), (a, 1)), 1
    return (p, a, w, b), ((a, 0), (w, 1), (b, 0)), ((a, b), (w, 0), (b, 1)), ((a, blk.astep), (w, D), (b, 1)), 2


def _class_masks(ctx, blk: Block, tg: Targets, classes, D: int):
    """Per class chunk: (first class, layout, mask [1 where the class is the slot's]) (compares on GpSimd)."""
    clsf = tile((blk.p, blk.a, blk.b), F32, "clsf")
    nisa.tensor_copy(clsf, tg.cls.reshape(blk.p, blk.a, blk.b), engine=G)
    for c0, w, ic in classes:
        lay = _chunk_layout(blk, w, D)
        mask = tile(lay[0], U8, "mask")
        nisa.tensor_tensor(mask, _bcast(ic, blk.p, lay[1]), _bcast(clsf, blk.p, lay[2]), Alu.equal, engine=G)
        yield c0, w, lay, mask


def _one_hot(ctx, out, logp, blk: Block, tg: Targets, v, classes, D: int) -> None:
    """Write the block's gradient whole: class c of slot (i, j) is v where c == its class, else +0, made in SBUF
    per class chunk (a select on VectorE) and stored."""
    _bounds_check(ctx, logp, blk, tg)
    for c0, _, lay, mask in _class_masks(ctx, blk, tg, classes, D):
        oh = tile(lay[0], out.dtype, "oh")
        nisa.select(oh, mask, _bcast(v, blk.p, lay[2]), 0.0)
        ctx.store(view(out, out.offset + blk.base + c0 * D, ((blk.p, blk.pstep), *lay[3])), oh)


def _dense_pick(ctx, logp, blk: Block, tg: Targets, classes, wrow, D: int):
    """(logp at each slot's class, its class weight or None) [p, k] fp32, read from the block's whole rows
    (few classes, D > 1: one load per class chunk instead of a gather per slot): the masked rows (select, so
    a NaN elsewhere in a row stays out) summed over the classes."""
    _bounds_check(ctx, logp, blk, tg)
    p, k = blk.p, blk.k
    picked = [None, None]
    for c0, w, lay, mask in _class_masks(ctx, blk, tg, classes, D):
        xc = tile(lay[0], logp.dtype, "xc")
        ctx.load(xc, view(logp, logp.offset + blk.base + c0 * D, ((p, blk.pstep), *lay[3])))
        srcs = [xc] if wrow is None else [xc, _bcast(wrow[:, c0:c0 + w], p, lay[1])]
        for n, src in enumerate(srcs):
            sel = tile(lay[0], F32, "sel")
            nisa.select(sel, mask, src, 0.0)
            part = tile((p, k), F32, "pick")
            nisa.tensor_reduce(part.reshape(p, blk.a, blk.b) if lay[4] == 2 else part, sel, Alu.add, axis=lay[4])
            if picked[n] is not None:
                nisa.tensor_tensor(part, part, picked[n], Alu.add, engine=V)
            picked[n] = part
    return picked[0], picked[1]


def _class_chunks(ctx, C: int, k: int):
    """(first class, classes, their index on every partition [P, w] fp32) per chunk of a one-hot tile."""
    cw = _max(1, _min(C, ONEHOT_F // k))
    out = []
    for c0 in range(0, C, cw):
        w = _min(cw, C - c0)
        t = tile((ctx.P, w), F32, "classes")
        nisa.iota(t, (1,), offset=c0)
        out.append((c0, w, t))
    return out


@nk.kernel(name="nll_loss_backward", version=1)
def nll_loss_backward(grad_output, logp, target, weight=None, total_weight=None, ignore_index=-100,
                      reduction="mean"):
    """aten.nll_loss_backward: d loss / d logp (logp's shape and dtype); total_weight [] is needed for "mean"."""
    op = "nll_loss_backward"
    N, C, D = _dims(logp, target, weight, reduction, ignore_index, op)
    want = tuple(target.shape) if reduction == "none" else ()
    if tuple(grad_output.shape) != want:
        raise KernelError(f"{op}: grad_output must have shape {list(want)} for reduction {reduction!r}, got "
                          f"{list(grad_output.shape)}")
    if reduction == "mean" and (total_weight is None or tuple(total_weight.shape) != ()):
        raise KernelError(f"{op}: \"mean\" needs total_weight of shape []")
    ctx = Ctx()
    out = nl.ndarray(tuple(logp.shape), logp.dtype, buffer=nl.hbm, name="grad_input")
    if N * D == 0:
        return out
    # zero-fill and scatter: DMA only, and for [N, C] the scatters of different slot columns run in parallel.
    # With D > 1 the scatters of one column wait for each other (their tables overlap), ~2 us per 128 entries:
    # for few classes, building the rows in SBUF (~C engine cycles per partition and entry) is cheaper
    scatter = D == 1 or C > ONEHOT_C
    todo = blocks(ctx.P, N, C, D, disjoint=scatter)
    if scatter:
        _zero_fill(ctx, out, N * C * D)
    else:
        classes = _class_chunks(ctx, C, todo[0].k)
    gs = None if reduction == "none" else _scale(ctx, grad_output, total_weight, reduction, logp.dtype)
    for blk in todo:
        tg = Targets(ctx, target, blk, C, D, ignore_index)
        p, k = blk.p, blk.k
        wt = tg.class_weights(ctx, weight, C)
        v = tile((p, k), F32, "v")
        if reduction == "none":
            ctx.load(v.reshape(p, blk.a, blk.b), blk.entries(grad_output))
            if wt is not None:
                nisa.tensor_tensor(v, v, wt, Alu.multiply, engine=V)
            ts(v, v, Alu.multiply, -1.0)
        elif wt is None:
            ts(v, view(gs, gs.offset, (gs[0:p].dims[0], (k, 0))), Alu.multiply, -1.0)
        else:
            ts(v, wt, Alu.multiply, gs[0:p], Alu.multiply, -1.0)
        vt = tile((p, k), logp.dtype, "vt")
        nisa.select(vt, tg.keep, v, 0.0)  # the mean's scale is inf when every entry is ignored
        if not scatter:
            _one_hot(ctx, out, logp, blk, tg, vt, classes, D)
            continue
        tg.scatter(ctx, out, vt)
    return out
