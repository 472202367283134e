"""Fused scaled-dot-product attention (flash style), forward and backward.

``torch.nn.functional.scaled_dot_product_attention`` semantics on batch-heads flattened by the caller:
q [BH, Sq, D], k and v [BH, Skv, D] (Sq != Skv allowed, any lengths), an optional additive float mask
broadcastable to [BH, Sq, Skv] ([Sq, Skv] or [1 or BH, Sq, Skv]; -inf entries drop keys), ``causal`` (top-left
aligned: query i sees keys 0..i, as torch's ``is_causal``; not together with a mask, as torch), ``scale``
(default 1/sqrt(D), any sign). float32 / bfloat16 / float16 inputs; outputs in the input dtype, the logsumexp
in float32. A row whose keys are all masked gives NaN, as torch.

Forward (online softmax). Per (batch-head, 128-query tile) the keys go by in chunks of ``kv_chunk``: TensorE
writes S = Q K^T in 512-column PSUM tiles (scores never reach HBM), VectorE takes the row max of each, GpSimd
folds it into the running max (kept as the exp bias -scale * m), ScalarE writes P = exp(scale * S - scale * m)
(16-bit for 16-bit inputs) to SBUF, TensorE transposes P in 128x128 tiles (keys onto partitions) and
multiplies by [V | 1]: the ones column makes the same matmuls produce the row sums, so the fp32 accumulator
[P V | l] stays in one PSUM bank for the whole key loop and each chunk only rescales it by exp(m_old - m_new)
(ScalarE). Causal: chunks past the diagonal are never computed; the diagonal block gets a -inf upper
triangle (built once by affine_select) added in PSUM. K^T (TensorE transposes) and [V | 1] of a batch-head
stay resident in SBUF; without causal / mask each partition loads contiguous key rows (softmax does not care
about the key order as long as K and V share it). Statistics, accumulation and the logsumexp are fp32.

Backward (FlashAttention-2). Key blocks of ``kv_block`` are the outer loop: per (key block, query tile)
TensorE recomputes S and dP = dO V^T, ScalarE P = exp(scale * S - lse) and dP - rowsum(dO * O), GpSimd
dS = P * (dP - rowsum) (and zeroes P above the causal diagonal with affine_select), TensorE accumulates
dV += P^T dO and dK += dS^T Q in PSUM (P and dS have queries on partitions: no transpose needed), transposes
dS and adds dS K into an fp32 SBUF dQ. Q, dO (both layouts) stay resident per batch-head when they fit a
quarter of SBUF, else each job streams its tiles (``resident``).

Scheduling. Engines run their instructions in program order, so the emission order decides the overlap:
each job's stages are emitted by a list scheduler (``_pipeline``) at offsets tuned on the simulator
(``FWD_SCHEDULE``, ``BWD_SCHEDULE``), under PSUM budgets that keep at most 8 banks live by construction.

Performance (trn2 cost model, bf16, D = 128, per 128 queries x 1024 keys of the forward): TensorE 1283 ns
(QK^T 427 + P transposes 427 + P [V | 1] 430, of which 853 are the roofline's), VectorE row max 1067 ns,
ScalarE exp 853 ns, and the P^T PSUM->SBUF copies 533 ns on VectorE or 853 ns on ScalarE. With TensorE
transposes the forward cannot pass 2/3 of TensorE peak, and Vector + Scalar work bounds it near 63%; the
backward's dS transposes cap it at 5/6.

Limits: D <= 128 (one contraction tile). The forward keeps K^T and [V | 1] of a batch-head in SBUF: Skv up to
about 48K keys for 16-bit inputs, 24K for float32. The backward handles any length up to its fp32 dQ
accumulator (4 * Sq bytes per partition: Sq up to about 40K).
"""

from __future__ import annotations

import math

from neuron_hal import Act, Alu, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View

_NEG_INF = float("-inf")
_V, _S, _G = Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD


# -- shared helpers ------------------------------------------------------------------------------
def _check_inputs(name, q, k, v, mask, causal):
    if len(q.shape) != 3 or len(k.shape) != 3 or len(v.shape) != 3:
        raise KernelError(f"{name}: q, k, v must be [BH, S, D], got {list(q.shape)}, {list(k.shape)}, "
                          f"{list(v.shape)}")
    bh, sq, d = q.shape
    skv = k.shape[1]
    if k.shape != (bh, skv, d) or v.shape != k.shape:
        raise KernelError(f"{name}: k and v must be [{bh}, Skv, {d}], got {list(k.shape)} and {list(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (nl.float32, nl.bfloat16, nl.float16):
        raise KernelError(f"{name}: q, k, v must share one of float32, bfloat16, float16; got "
                          f"{q.dtype}, {k.dtype}, {v.dtype}")
    if min(bh, sq, skv, d) == 0:
        raise KernelError(f"{name}: empty input (BH={bh}, Sq={sq}, Skv={skv}, D={d})")
    if d > nl.tile_size.pmax:
        raise KernelError(f"{name}: head dim {d} > {nl.tile_size.pmax} is not supported (one contraction tile)")
    if mask is not None:
        if causal:
            raise KernelError(f"{name}: pass causal=True or a mask, not both (as torch)")
        ms = tuple(mask.shape)
        if not (ms == (sq, skv) or (len(ms) == 3 and ms[0] in (1, bh) and ms[1:] == (sq, skv))):
            raise KernelError(f"{name}: mask must be [{sq}, {skv}] or [1 or {bh}, {sq}, {skv}], got {list(ms)}")
        if not mask.dtype.is_float:
            raise KernelError(f"{name}: the mask must be an additive float mask, got {mask.dtype}")
    return bh, sq, skv, d


def _mask_rows(mask, b):
    """The [Sq, Skv] mask of batch-head b."""
    if len(mask.shape) == 2:
        return mask
    return mask[0 if mask.shape[0] == 1 else b]


def _row_tiles(x: View, r0: int, ntiles: int) -> View:
    """[pmax, ntiles, cols] view of a 2-D HBM view: element [p, t, c] is row r0 + t * pmax + p."""
    pmax = nl.tile_size.pmax
    (_, rs), (cols, cs) = x.dims
    return type(x)(x.owner, x.dtype, x.offset + r0 * rs, ((pmax, rs), (ntiles, pmax * rs), (cols, cs)))


def _load_rows(dst: View, x: View, rows: int, any_order: bool = False) -> None:
    """Rows of a 2-D HBM view into key tiles dst[p, t, :] (at least 2 KiB per partition per DMA).

    In order: tile t, partition p holds row t * pmax + p (one descriptor run per row). ``any_order``:
    partition p holds rows p * R .. p * R + R - 1 of the first R * pmax rows (one run per partition; tile t,
    partition p is row p * R + t), then the remaining rows in order in tile R.
    """
    pmax = nl.tile_size.pmax
    cols = x.shape[1]
    nfull = rows // pmax
    if any_order and nfull:
        nisa.dma_copy(dst[:, :nfull, :cols], x[: nfull * pmax].reshape(pmax, nfull, cols))
    else:
        group = max(1, 2048 // (cols * x.dtype.itemsize))
        for g0 in range(0, nfull, group):
            g1 = min(nfull, g0 + group)
            nisa.dma_copy(dst[:, g0:g1, :cols], _row_tiles(x, g0 * pmax, g1 - g0))
    if rows > nfull * pmax:
        nisa.dma_copy(dst[: rows - nfull * pmax, nfull, :cols], x[nfull * pmax:rows])


class _Alternate:
    """Round-robin of the engines that may move PSUM data to SBUF (VectorE, ScalarE)."""

    def __init__(self):
        self.i = 0

    def __call__(self) -> Engine:
        self.i += 1
        return _V if self.i % 2 else _S


def _transpose_rows(dst: View, nat: View, rows: int, engines: _Alternate, mul: float | None = None) -> None:
    """dst[c, r] = nat[r % pmax, r // pmax, c] for r < rows: TensorE transposes, a PSUM bank of them per copy.

    ``mul`` scales while copying out of PSUM (VectorE)."""
    pmax = nl.tile_size.pmax
    cols = dst.shape[0]
    ntiles = nl.cdiv(rows, pmax)
    per = nl.tile_size.psum_bank_fmax * 4 // (pmax * dst.dtype.itemsize)  # tiles per PSUM bank
    for g0 in range(0, ntiles, per):
        g1 = min(ntiles, g0 + per)
        c1 = min(rows, g1 * pmax)
        tp = nl.ndarray((cols, (g1 - g0) * pmax), dst.dtype, buffer=nl.psum, name="tpose")
        for t in range(g0, g1):
            w = min(pmax, rows - t * pmax)
            nisa.nc_transpose(tp[:, (t - g0) * pmax:(t - g0) * pmax + w], nat[:w, t, :cols])
        if mul is None:
            nisa.tensor_copy(dst[:, g0 * pmax:c1], tp[:, : c1 - g0 * pmax], engine=engines())
        else:
            nisa.tensor_scalar(dst[:, g0 * pmax:c1], tp[:, : c1 - g0 * pmax], Alu.multiply, mul)


def _pipeline(sizes, stages, after=None, usage=None, budget=None) -> None:
    """Emit a software pipeline: a list schedule of (job, stage) items in program order.

    Job t sits at position sum(sizes[:t]) (its work in units of a full job); stage (name, offset, fn, preds)
    of job t has priority key position + offset. An item can go once the job's stages ``preds`` and the
    items ``after(t, name)`` have gone, and when the resources it takes (``usage(t, name)``: {resource:
    +n / -n}) fit ``budget``; among those the lowest key goes first. Engines run their instructions in
    program order, so this order decides how independent jobs overlap on each engine; the budgets bound
    the tiles in flight (PSUM banks)."""
    import heapq

    pos, acc = [], 0.0
    for s in sizes:
        pos.append(acc)
        acc += s
    spec = {name: (off, f, tuple(preds)) for name, off, f, preds in stages}
    rank = {name: i for i, (name, _, _, _) in enumerate(stages)}  # ties: list order
    succ = {name: [n2 for n2, (_, _, p2) in spec.items() if name in p2] for name in spec}
    after = after or (lambda t, name: ())
    usage = usage or (lambda t, name: {})
    budget = dict(budget or {})
    done, offered, heap, blocked, waiting = set(), set(), [], [], {}

    def offer(t, name):
        if (t, name) in offered or any((t, p) not in done for p in spec[name][2]):
            return
        pending = [d for d in after(t, name) if d not in done]
        if pending:
            waiting.setdefault(pending[0], []).append((t, name))
            return
        offered.add((t, name))
        heapq.heappush(heap, (pos[t] + spec[name][0], rank[name], t, name))

    for t in range(len(sizes)):
        for name, (_, _, preds) in spec.items():
            if not preds:
                offer(t, name)
    while heap or blocked:
        if not heap:
            raise RuntimeError("attention pipeline: resource budget deadlock")  # budgets < one job's needs
        item = heapq.heappop(heap)
        t, name = item[2], item[3]
        need = usage(t, name)
        if any(budget.get(r, 0) < n for r, n in need.items() if n > 0):
            blocked.append(item)
            continue
        for r, n in need.items():
            budget[r] = budget.get(r, 0) - n
        spec[name][1](t)
        done.add((t, name))
        for n2 in succ[name]:
            offer(t, n2)
        for t2, n2 in waiting.pop((t, name), ()):
            offer(t2, n2)
        if any(n < 0 for n in need.values()):  # something freed: blocked items may go now
            for b in blocked:
                heapq.heappush(heap, b)
            blocked = []


# (step offset, stage) of the forward's software pipeline; stages at equal offsets go in list order
FWD_SCHEDULE = [(-6.0, "head_pre"), (-1.5, "kv_dma"), (-2.0, "q_dma"), (1.25, "q_t"), (2.25, "qk"), (2.75, "rowmax"),
                (3.5, "negmax"), (3.5, "exp"), (3.75, "transpose"), (4.0, "copy"), (3.75, "rescale"), (4.25, "pv"),
                (4.75, "fin")]
# PSUM banks in flight (8 per partition): score tiles, P^T tiles, accumulators; the K^T / Q^T / logsumexp
# transposes take one more bank briefly
PSUM_BUDGET = {"scores": 4, "pT": 2, "acc": 1}
COPY_ON_VECTOR = 0.6  # share of the P^T PSUM->SBUF copies VectorE takes (ScalarE the rest)


# -- forward -------------------------------------------------------------------------------------
@kernel(tunables={"kv_chunk": (1024, 512)}, version=1)
def flash_attention_fwd(q, k, v, scale=None, causal=False, mask=None, kv_chunk=1024):
    """softmax(scale * q k^T + mask) v per batch-head -> (out [BH, Sq, D] in q's dtype, logsumexp [BH, Sq] fp32).

    The logsumexp is of the scaled, masked scores (what flash_attention_bwd takes). ``kv_chunk``: keys per
    online-softmax step (at most one PSUM bank of P^T: 1024 for 16-bit inputs, 512 for float32).
    """
    bh, sq, skv, d = _check_inputs("flash_attention_fwd", q, k, v, mask, causal)
    pmax = nl.tile_size.pmax
    mm_n = nl.tile_size.gemm_moving_fmax
    dt = q.dtype
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # exp(s_eff * T + nb) with s_eff > 0 keeps "max of T" the max of the scaled scores: fold the sign into q.
    s_eff, qmul = (sc, None) if sc > 0 else (-sc, -1.0) if sc < 0 else (1.0, 0.0)
    # keys per softmax step: P^T of a chunk ([keys, queries] in 128-key tiles) fills at most one PSUM bank
    chunk = max(pmax, min(int(kv_chunk), nl.tile_size.psum_bank_fmax * 4 // dt.itemsize) // pmax * pmax)
    nqt, nkt = nl.cdiv(sq, pmax), nl.cdiv(skv, pmax)

    out = nl.ndarray((bh, sq, d), dt, buffer=nl.hbm, name="out")
    lse = nl.ndarray((bh, sq), nl.float32, buffer=nl.hbm, name="lse")
    engines = _Alternate()

    diag = None
    if causal:  # additive bias of a diagonal block: 0 where key <= query (i <= p), -inf above
        zero = nl.ndarray((pmax, pmax), nl.float32, name="zero")
        nisa.memset(zero, 0.0, engine=_G)
        diag = nl.ndarray((pmax, pmax), nl.float32, name="diag")
        nisa.affine_select(diag, zero, steps=(-1,), cmp_op=Alu.greater_equal, on_false_value=_NEG_INF,
                           channel_multiplier=1)

    # jobs: one per (batch-head, query tile, key chunk)
    jobs = []
    for b in range(bh):
        for qi in range(nqt):
            q0 = qi * pmax
            pq = min(pmax, sq - q0)
            kv_end = min(skv, q0 + pq) if causal else skv
            tile = {"b": b, "qi": qi, "q0": q0, "pq": pq}
            nch = nl.cdiv(kv_end, chunk)
            for ci in range(nch):
                jobs.append({"t": tile, "c0": ci * chunk, "cw": min(chunk, kv_end - ci * chunk),
                             "first": ci == 0, "last": ci == nch - 1,
                             "b_first": qi == 0 and ci == 0, "b_last": qi == nqt - 1 and ci == nch - 1})
    heads, qtiles = {}, {}
    share = [0.0]
    qgroup = max(1, 2048 // (d * dt.itemsize))  # query tiles per load
    kgroup = max(1, nl.tile_size.psum_bank_fmax * 4 // (pmax * dt.itemsize))  # key tiles per load / transpose group
    # softmax does not care about key order as long as K and V share it: without causal / mask each partition
    # can then load contiguous rows (one DMA run per partition instead of one per 128-element row)
    any_order = not causal and mask is None
    # the next batch-head's K^T and [V | 1] load during this one's when both fit in half of SBUF
    head_bytes = (skv + nkt * (d + 1)) * dt.itemsize + nqt * 4
    overlap_heads = 2 * head_bytes <= nl.tile_size.sbuf_size_bytes // 2

    def new_head(b):
        vaug = nl.ndarray((pmax, nkt, d + 1), dt, name="vaug")
        nisa.memset(vaug[:, :, d:d + 1], 1.0, engine=_G)
        lcol = nl.ndarray((pmax, nqt), nl.float32, name="lse_cols")
        nisa.memset(lcol, 0.0, engine=_G)
        heads[b] = {"vaug": vaug, "loaded": 0, "kT": nl.ndarray((d, skv), dt, name="kT"), "lse": lcol,
                    "kstage": [], "vstage": []}

    def load_kv(b, end):  # K and V rows [loaded, end) in groups (causal: 1, 1, 2, 4, ... tiles, the first gate)
        head = heads[b]
        while head["loaded"] < end:
            r0 = head["loaded"]
            r1 = min(skv, r0 + (max(1, min(kgroup, r0 // pmax)) if causal else kgroup) * pmax)
            g0 = r0 // pmax
            kst = nl.ndarray((pmax, kgroup, d), dt, name="kstage")  # K rows until need_kt transposes them
            _load_rows(kst, k[b, r0:r1], r1 - r0, any_order)
            head["kstage"].append((r0, r1, kst))
            if any_order:  # contiguous rows land in a staging tile; GpSimd interleaves them with the ones column
                vst = nl.ndarray((pmax, kgroup, d), dt, name="vstage")
                _load_rows(vst, v[b, r0:r1], r1 - r0, True)
                head["vstage"].append((r0, r1, vst))
            else:
                _load_rows(head["vaug"][:, g0:], v[b, r0:r1], r1 - r0)
            head["loaded"] = r1

    def head_pre(t):  # a batch-head's first keys, well ahead of its first job
        job = jobs[t]
        if job["b_first"]:
            if t == 0:
                q_dma(0)  # the first query tile goes ahead of the bulk loads
            new_head(job["t"]["b"])
            load_kv(job["t"]["b"], min(skv, 2 * chunk))

    def kv_dma(t):  # K and V of the keys this job touches, with some lookahead
        job = jobs[t]
        load_kv(job["t"]["b"], min(skv, job["c0"] + job["cw"] + chunk // 2))

    def need_v(head, cols):  # [V | 1] rows [0, cols): the staged groups copied in by GpSimd
        while head["vstage"] and head["vstage"][0][0] < cols:
            r0, r1, vst = head["vstage"].pop(0)
            g0, nfull = r0 // pmax, (r1 - r0) // pmax
            if nfull:
                nisa.tensor_copy(head["vaug"][:, g0:g0 + nfull, :d], vst[:, :nfull, :], engine=_G)
            if r1 - r0 > nfull * pmax:
                rem = r1 - r0 - nfull * pmax
                nisa.tensor_copy(head["vaug"][:rem, g0 + nfull, :d], vst[:rem, nfull, :], engine=_G)

    def need_kt(head, cols):  # K^T columns [0, cols): the staged key groups through TensorE
        while head["kstage"] and head["kstage"][0][0] < cols:
            r0, r1, kst = head["kstage"].pop(0)
            _transpose_rows(head["kT"][:, r0:r1], kst, r1 - r0, engines)

    def q_dma(t):  # query tiles, qgroup per DMA; the mask tile of the chunk
        job = jobs[t]
        tile = job["t"]
        b, qi = tile["b"], tile["qi"]
        if job["first"] and (b, qi) not in qtiles:
            g1 = min(nqt, qi + max(1, min(qgroup, qi)))  # groups of 1, 1, 2, 4, ...: the first tiles gate the start
            r0, r1 = qi * pmax, min(sq, g1 * pmax)
            qnat = nl.ndarray((pmax, qgroup, d), dt, name="qnat")
            _load_rows(qnat, q[b, r0:r1], r1 - r0)
            for j in range(qi, g1):
                qtiles[(b, j)] = qnat[:, j - qi:j - qi + 1, :]
        if mask is not None and "mask_raw" not in job:
            pq, c0, cw = tile["pq"], job["c0"], job["cw"]
            raw = nl.ndarray((pmax, chunk), mask.dtype, name="mask_raw")
            nisa.dma_copy(raw[:pq, :cw], _mask_rows(mask, b)[tile["q0"]:tile["q0"] + pq, c0:c0 + cw])
            job["mask_raw"] = raw

    def q_t(t):  # Q^T (scaled by the sign of scale); the mask divided by s_eff (GpSimd)
        job = jobs[t]
        tile = job["t"]
        if job["first"]:
            qt = nl.ndarray((d, pmax), dt, name="qT")
            nat = qtiles.pop((tile["b"], tile["qi"]))
            _transpose_rows(qt[:, : tile["pq"]], nat, tile["pq"], engines, mul=qmul)
            tile["qT"] = qt
        if mask is not None:
            pq, cw = tile["pq"], job["cw"]
            mk = nl.ndarray((pmax, chunk), nl.float32, name="mask")
            nisa.tensor_scalar(mk[:pq, :cw], job.pop("mask_raw")[:pq, :cw], Alu.multiply, 1.0 / s_eff, engine=_G)
            job["mask"] = mk

    def qk(t):  # S = Q K^T into PSUM: one bank (512 columns) per tile, so each frees after its exp
        job = jobs[t]
        tile = job["t"]
        pq, c0, cw = tile["pq"], job["c0"], job["cw"]
        head = heads[tile["b"]]
        need_kt(head, c0 + cw)
        job["s"] = []
        for s0 in range(0, cw, mm_n):
            s1 = min(cw, s0 + mm_n)
            s = nl.ndarray((pmax, mm_n), nl.float32, buffer=nl.psum, name="scores")
            nisa.nc_matmul(s[:pq, : s1 - s0], tile["qT"][:, :pq], head["kT"][:, c0 + s0:c0 + s1], accumulate=False)
            job["s"].append((s0, s1, s))

    def rowmax(t):  # VectorE: causal / mask bias, then the row max of each score tile
        job = jobs[t]
        tile = job["t"]
        pq, q0, c0 = tile["pq"], tile["q0"], job["c0"]
        mx = nl.ndarray((pmax, len(job["s"])), nl.float32, name="rowmax")
        mk = job.pop("mask", None)
        for i, (s0, s1, s) in enumerate(job["s"]):
            if diag is not None:
                d0, d1 = max(q0, c0 + s0), min(q0 + pq, c0 + s1)
                if d0 < d1:
                    blk = s[:pq, d0 - c0 - s0:d1 - c0 - s0]
                    nisa.tensor_tensor(blk, blk, diag[:pq, d0 - q0:d1 - q0], Alu.add)
            if mk is not None:
                nisa.tensor_tensor(s[:pq, : s1 - s0], s[:pq, : s1 - s0], mk[:pq, s0:s1], Alu.add)
            nisa.tensor_reduce(mx[:pq, i:i + 1], s[:pq, : s1 - s0], Alu.max, axis=1)
        job["mx"] = mx

    def negmax(t):  # GpSimd: nb = -s_eff * max(m_old, rowmax) (stored as the exp bias)
        job = jobs[t]
        tile = job["t"]
        pq = tile["pq"]
        mx = job.pop("mx")
        if mx.shape[1] > 1:
            m = nl.ndarray((pmax, 1), nl.float32, name="chunkmax")
            nisa.tensor_reduce(m[:pq], mx[:pq], Alu.max, axis=1, engine=_G)
            mx = m
        nb = nl.ndarray((pmax, 1), nl.float32, name="negmax")
        if job["first"]:
            nisa.tensor_scalar(nb[:pq], mx[:pq], Alu.multiply, -s_eff, engine=_G)
        else:
            nisa.tensor_scalar(nb[:pq], mx[:pq], Alu.multiply, -s_eff, op1=Alu.min, operand1=tile["nb"][:pq],
                               engine=_G)
            job["nb_old"] = tile["nb"]
        tile["nb"] = job["nb"] = nb

    def expo(t):  # ScalarE: P = exp(s_eff * S + nb) per score tile, alpha = exp(nb - nb_old)
        job = jobs[t]
        pq = job["t"]["pq"]
        if not job["first"]:  # first, so the rescale reading alpha does not directly follow it
            alpha = nl.ndarray((pmax, 1), nl.float32, name="alpha")
            nisa.activation(alpha[:pq], Act.exp, job.pop("nb_old")[:pq], bias=job["nb"][:pq], scale=-1.0)
            job["alpha"] = alpha
        p = nl.ndarray((pmax, chunk), dt, name="probs")
        for s0, s1, s in job.pop("s"):
            nisa.activation(p[:pq, s0:s1], Act.exp, s[:pq, : s1 - s0], bias=job["nb"][:pq], scale=s_eff)
        job["p"] = p

    def transpose(t):  # P^T (keys on partitions) through TensorE, copied to SBUF by VectorE and ScalarE
        job = jobs[t]
        tile = job["t"]
        pq, cw = tile["pq"], job["cw"]
        nsub = nl.cdiv(cw, pmax)
        pt = nl.ndarray((pmax, chunk // pmax, pmax), dt, buffer=nl.psum, name="pT")
        for j in range(nsub):
            w = min(pmax, cw - j * pmax)
            nisa.nc_transpose(pt[:w, j, :pq], job["p"][:pq, j * pmax:j * pmax + w])
        job["pT_psum"] = pt
        del job["p"]

    def copy(t):
        job = jobs[t]
        pq, cw = job["t"]["pq"], job["cw"]
        need_v(heads[job["t"]["b"]], job["c0"] + cw)
        nsub = nl.cdiv(cw, pmax)
        pt = job.pop("pT_psum")
        ps = nl.ndarray((pmax, chunk // pmax, pmax), dt, name="pT_sb")
        full = cw // pmax
        share[0] += full * COPY_ON_VECTOR  # error diffusion: VectorE takes this share of the tiles overall
        half = min(full, max(0, round(share[0])))
        share[0] -= half
        if half:
            nisa.tensor_copy(ps[:, :half, :pq], pt[:, :half, :pq], engine=_V)
        if full > half:
            nisa.tensor_copy(ps[:, half:full, :pq], pt[:, half:full, :pq], engine=_S)
        if full < nsub:
            w = cw - full * pmax
            nisa.tensor_copy(ps[:w, full, :pq], pt[:w, full, :pq], engine=_V)
        job["pT"] = ps

    def pv(t):  # O = alpha * O + P [V | 1]: the last column accumulates the row sums
        job = jobs[t]
        tile = job["t"]
        b, pq, c0, cw = tile["b"], tile["pq"], job["c0"], job["cw"]
        head = heads[b]
        if job["first"]:
            tile["o"] = nl.ndarray((pmax, d + 1), nl.float32, buffer=nl.psum, name="acc")
        o = tile["o"][:pq]
        ps = job.pop("pT")
        for j in range(nl.cdiv(cw, pmax)):
            w = min(pmax, cw - j * pmax)
            nisa.nc_matmul(o, ps[:w, j, :pq], head["vaug"][:w, (c0 // pmax) + j, :],
                           accumulate=not (job["first"] and j == 0))

    def rescale(t):  # O *= alpha, after the previous chunk's PV and before this chunk's
        job = jobs[t]
        if not job["first"]:
            o = job["t"]["o"][:job["t"]["pq"]]
            nisa.activation(o, Act.identity, o, scale=job.pop("alpha")[:job["t"]["pq"]])

    def fin(t):  # out = O / l, logsumexp = log(l) - nb; per batch-head the logsumexp columns become rows
        job = jobs[t]
        tile = job["t"]
        b, pq = tile["b"], tile["pq"]
        head = heads[b]
        o = tile["o"][:pq]
        if job["last"]:
            res = nl.ndarray((pmax, d), dt, name="res")
            nisa.tensor_scalar(res[:pq], o[:, :d], Alu.divide, o[:, d:d + 1])
            nisa.dma_copy(out[b, tile["q0"]:tile["q0"] + pq, :], res[:pq])
            lg = nl.ndarray((pmax, 1), nl.float32, name="logsum")
            nisa.activation(lg[:pq], Act.log, o[:, d:d + 1])
            nisa.tensor_tensor(head["lse"][:pq, tile["qi"]:tile["qi"] + 1], lg[:pq], tile["nb"][:pq], Alu.subtract)
        if job["b_last"]:  # logsumexp columns -> rows, stored contiguously
            for g0 in range(0, nqt, pmax):
                g1 = min(nqt, g0 + pmax)
                tp = nl.ndarray((g1 - g0, pmax), nl.float32, buffer=nl.psum, name="lseT")
                nisa.nc_transpose(tp, head["lse"][:, g0:g1])
                rows = nl.ndarray((g1 - g0, pmax), nl.float32, name="lse_rows")
                nisa.tensor_copy(rows, tp, engine=_V)
                nfull = min(g1, sq // pmax) - g0
                if nfull > 0:
                    nisa.dma_copy(lse[b, g0 * pmax:(g0 + nfull) * pmax].reshape(nfull, pmax), rows[:nfull])
                if g0 + nfull < g1:
                    rem = sq - (g0 + nfull) * pmax
                    nisa.dma_copy(lse[b, (g0 + nfull) * pmax:sq].reshape(1, rem), rows[nfull:nfull + 1, :rem])
            del heads[b]

    fns = {"head_pre": head_pre, "kv_dma": kv_dma, "q_dma": q_dma, "q_t": q_t, "qk": qk, "rowmax": rowmax,
           "negmax": negmax, "exp": expo, "transpose": transpose, "copy": copy, "rescale": rescale, "pv": pv,
           "fin": fin}
    preds = {"head_pre": (), "kv_dma": ("head_pre",), "q_dma": (), "q_t": ("q_dma",), "qk": ("kv_dma", "q_t"),
             "rowmax": ("qk",), "negmax": ("rowmax",), "exp": ("negmax",), "transpose": ("exp",),
             "copy": ("transpose",), "rescale": ("exp",), "pv": ("copy", "rescale"), "fin": ("pv",)}
    first_of_head, first_of_tile = {}, {}
    for t, job in enumerate(jobs):
        first_of_head.setdefault(job["t"]["b"], t)
        first_of_tile.setdefault(id(job["t"]), t)

    def after(t, name):  # order the state that flows between jobs (budgets may hold an item back)
        job, prev = jobs[t], t - 1
        if name == "head_pre" and job["b_first"] and t and not overlap_heads:
            return ((prev, "fin"),)
        if name == "kv_dma":  # the head exists
            return ((first_of_head[job["t"]["b"]], "head_pre"),)
        if name == "qk" and t:  # key chunks (K^T transposes, the running max) in job order
            return ((prev, "qk"),)
        if name in ("negmax", "rescale") and not job["first"]:  # running max; O rescaled between PVs
            return ((prev, "negmax" if name == "negmax" else "pv"),)
        f = first_of_tile[id(job["t"])]
        if name == "fin" and job["last"] and f and jobs[f - 1]["t"]["b"] == job["t"]["b"]:
            return ((f - 1, "fin"),)  # the previous tile's: logsumexp columns complete at the head's end
        return ()

    def usage(t, name):  # PSUM banks: score tiles, P^T tiles, accumulators
        job = jobs[t]
        nsc = nl.cdiv(job["cw"], mm_n)
        return {"qk": {"scores": nsc}, "exp": {"scores": -nsc}, "transpose": {"pT": 1}, "copy": {"pT": -1},
                "pv": {"acc": 1} if job["first"] else {}, "fin": {"acc": -1} if job["last"] else {}}.get(name, {})

    # every job counts as a full one: short (causal) chunks are latency-bound, not faster to pipeline
    _pipeline([1.0] * len(jobs), [(n, off, fns[n], preds[n]) for off, n in FWD_SCHEDULE], after, usage, PSUM_BUDGET)
    return out, lse


# -- backward ------------------------------------------------------------------------------------
def _store_rows(x: View, src: View, rows: int, any_order: bool = False) -> None:
    """x rows [0, rows) = src key tiles, the inverse of _load_rows. In order this is one DMA per tile (an HBM
    destination may not interleave rows of different partitions); ``any_order`` is one DMA."""
    pmax = nl.tile_size.pmax
    cols = x.shape[1]
    nfull = rows // pmax
    if any_order and nfull:
        nisa.dma_copy(x[: nfull * pmax].reshape(pmax, nfull, cols), src[:, :nfull, :cols])
    else:
        for t in range(nfull):
            nisa.dma_copy(x[t * pmax:(t + 1) * pmax], src[:, t, :cols])
    if rows > nfull * pmax:
        nisa.dma_copy(x[nfull * pmax:rows], src[: rows - nfull * pmax, nfull, :cols])


# (offset, stage) of the backward's software pipeline (see _pipeline); equal offsets go in list order
BWD_SCHEDULE = [(-6.0, "head"), (-4.0, "kv"), (-4.0, "q_dma"), (-1.0, "q_prep"), (0.0, "mm1"), (0.5, "exp"),
                (0.75, "ds"), (1.5, "mm2"), (1.25, "transpose"), (1.25, "copy"), (2.0, "dq"), (2.0, "fin_kv"),
                (2.5, "fin_q")]
BWD_PSUM_BUDGET = {"s": 2, "dp": 2, "dsT": 1, "dkv": 2}


@kernel(tunables={"kv_block": (512, 256)}, version=1)
def flash_attention_bwd(grad_out, q, k, v, out, logsumexp, scale=None, causal=False, mask=None, kv_block=512,
                        resident=None):
    """Gradients of flash_attention_fwd -> (dq, dk, dv) in q's dtype (FlashAttention-2).

    Recomputes P = exp(scale * q k^T + mask - logsumexp) per (key block, query tile); fp32 accumulation.
    ``resident``: keep a batch-head's Q, dO, O and Q^T, dO^T in SBUF (None: when a quarter of SBUF holds them;
    False: load and transpose each job's tiles, for any sequence length).
    """
    bh, sq, skv, d = _check_inputs("flash_attention_bwd", q, k, v, mask, causal)
    dt = q.dtype
    if grad_out.shape != q.shape or out.shape != q.shape or grad_out.dtype != dt or out.dtype != dt:
        raise KernelError(f"flash_attention_bwd: grad_out and out must be {list(q.shape)} {dt}, got "
                          f"{list(grad_out.shape)} {grad_out.dtype} and {list(out.shape)} {out.dtype}")
    if tuple(logsumexp.shape) != (bh, sq) or logsumexp.dtype != nl.float32:
        raise KernelError(f"flash_attention_bwd: logsumexp must be [{bh}, {sq}] float32, got "
                          f"{list(logsumexp.shape)} {logsumexp.dtype}")
    pmax = nl.tile_size.pmax
    mm_n = nl.tile_size.gemm_moving_fmax
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s_eff, qmul = (sc, None) if sc != 0 else (1.0, 0.0)  # scale 0: scores are 0 (q zeroed for them)
    blk = max(pmax, min(int(kv_block), mm_n) // pmax * pmax)  # keys per block: one PSUM bank of scores
    nqt = nl.cdiv(sq, pmax)
    kpb = blk // pmax  # key tiles per block
    any_order = not causal and mask is None  # keys of a block in any order shared by K, V, dK, dV (see forward)
    qgroup = max(1, 2048 // (d * dt.itemsize))  # query tiles per load
    # Q, dO, O (queries on partitions) and Q^T, dO^T stay resident per batch-head when a quarter of SBUF holds
    # them; longer sequences stream each job's tiles (more DMA and TensorE transposes, any length)
    sbuf = nl.tile_size.sbuf_size_bytes
    if resident is None:
        resident = nqt * (3 * d + 2 * pmax) * dt.itemsize <= sbuf // 4
    head_bytes = nqt * (d + 2) * 4 + (nqt * (3 * d + 2 * pmax) * dt.itemsize if resident else 0)
    overlap_heads = 2 * head_bytes <= sbuf // 2  # else a head starts once the previous one is done

    dq = nl.ndarray((bh, sq, d), dt, buffer=nl.hbm, name="dq")
    dk = nl.ndarray((bh, skv, d), dt, buffer=nl.hbm, name="dk")
    dv = nl.ndarray((bh, skv, d), dt, buffer=nl.hbm, name="dv")
    engines = _Alternate()

    # jobs: (batch-head, key block, query tile); causal: only query tiles that see some key of the block
    jobs, empty = [], []
    for b in range(bh):
        for kb in range(nl.cdiv(skv, blk)):
            k0 = kb * blk
            kw = min(blk, skv - k0)
            block = {"b": b, "k0": k0, "kw": kw, "first_q": {}}
            tiles = [qi for qi in range(nqt) if not causal or min(sq, (qi + 1) * pmax) - 1 >= k0]
            if not tiles:
                empty.append(block)
                continue
            for n, qi in enumerate(tiles):
                q0 = qi * pmax
                pq = min(pmax, sq - q0)
                kvw = min(kw, q0 + pq - k0) if causal else kw  # keys of the block this tile sees
                jobs.append({"b": b, "blk": block, "qi": qi, "q0": q0, "pq": pq, "kvw": kvw,
                             "blk_first": n == 0, "blk_last": n == len(tiles) - 1})
    last_job = {}
    for t, job in enumerate(jobs):
        job["head_first"] = t == 0 or jobs[t - 1]["b"] != job["b"]
        job["head_last"] = t == len(jobs) - 1 or jobs[t + 1]["b"] != job["b"]
        last_job[(job["b"], job["qi"])] = t
    for t, job in enumerate(jobs):
        job["q_last"] = last_job[(job["b"], job["qi"])] == t
    # per key tile of a block: rows the first contribution covers; fewer than the tile's rows -> zero it first
    for job in jobs:
        for j in range(kpb):
            w = max(0, min(pmax, job["kvw"] - j * pmax))
            job["blk"]["first_q"].setdefault(j, (id(job), w)) if w else None
    heads = {}

    def head(t):  # per batch-head: -logsumexp, -rowsum(dO * O), the dQ accumulator (+ resident Q, dO, O)
        job = jobs[t]
        if job["head_first"]:
            h = heads[job["b"]] = {"nlse": nl.ndarray((pmax, nqt), nl.float32, name="neg_lse"),
                                   "ndi": nl.ndarray((pmax, nqt), nl.float32, name="neg_di"),
                                   "dq": nl.ndarray((pmax, nqt, d), nl.float32, name="dq_acc"),
                                   "dq_set": set(), "di_set": set(), "loaded": 0, "groups": []}
            if resident:
                h.update(qn=nl.ndarray((pmax, nqt, d), dt, name="q_nat"),
                         don=nl.ndarray((pmax, nqt, d), dt, name="do_nat"),
                         on=nl.ndarray((pmax, nqt, d), dt, name="o_nat"),
                         qT=nl.ndarray((d, nqt * pmax), dt, name="qT"),
                         doT=nl.ndarray((d, nqt * pmax), dt, name="doT"))

    def q_dma(t):  # Q, dO (O, logsumexp on a tile's first visit) of this job's tile
        job = jobs[t]
        h, b, qi, q0, pq = heads[job["b"]], job["b"], job["qi"], job["q0"], job["pq"]
        if not resident:  # streaming: this job's own tiles
            first = qi not in h["di_set"]
            for name, src_ in (("qn", q), ("don", grad_out)) + ((("on", out),) if first else ()):
                job[name] = nl.ndarray((pmax, 1, d), dt, name=f"{name}_tile")
                nisa.dma_copy(job[name][:pq, 0, :], src_[b, q0:q0 + pq, :])
            if first:
                job["lse"] = nl.ndarray((pmax, 1), nl.float32, name="lse_col")
                nisa.dma_copy(job["lse"][:pq], logsumexp[b, q0:q0 + pq].reshape(pq, 1))
                h["di_set"].add(qi)
            return
        while h["loaded"] <= qi:  # resident: groups of 1, 1, 2, 4, ... tiles, the first ones gate the start
            g0 = h["loaded"]
            g1 = min(nqt, g0 + max(1, min(qgroup, g0)))
            r0, r1 = g0 * pmax, min(sq, g1 * pmax)
            for src_, dst_ in ((q, h["qn"]), (grad_out, h["don"]), (out, h["on"])):
                _load_rows(dst_[:, g0:], src_[b, r0:r1], r1 - r0)
            lrows = nl.ndarray((qgroup, pmax), nl.float32, name="lse_rows")
            nfull = (r1 - r0) // pmax
            if nfull:
                nisa.dma_copy(lrows[:nfull], logsumexp[b, r0:r0 + nfull * pmax].reshape(nfull, pmax))
            if r1 > r0 + nfull * pmax:
                nisa.dma_copy(lrows[nfull:nfull + 1, : r1 - r0 - nfull * pmax],
                              logsumexp[b, r0 + nfull * pmax:r1].reshape(1, -1))
            h["groups"].append((g0, g1, lrows))
            h["loaded"] = g1

    def rowsum(h, qi, pq, don, on):  # -rowsum(dO * O) of a tile: GpSimd (idle in the backward)
        prod = nl.ndarray((pmax, d), nl.float32, name="do_o")
        nisa.tensor_tensor(prod[:pq], don, on, Alu.multiply, engine=_G)
        nisa.tensor_reduce(h["ndi"][:pq, qi:qi + 1], prod[:pq], Alu.add, axis=1, negate=True, engine=_G)

    def q_prep(t):  # Q^T, dO^T (TensorE); -logsumexp, -rowsum(dO * O) on a tile's first visit
        job = jobs[t]
        h, qi, q0, pq = heads[job["b"]], job["qi"], job["q0"], job["pq"]
        if not resident:
            qt = nl.ndarray((d, pmax), dt, name="qT_tile")
            _transpose_rows(qt[:, :pq], job["qn"], pq, engines, mul=qmul)
            dot = nl.ndarray((d, pmax), dt, name="doT_tile")
            _transpose_rows(dot[:, :pq], job["don"], pq, engines)
            job.update(qT=qt[:, :pq], doT=dot[:, :pq], qn=job["qn"][:, 0, :], don=job["don"][:, 0, :])
            if "on" in job:
                nisa.tensor_scalar(h["nlse"][:pq, qi:qi + 1], job.pop("lse")[:pq], Alu.multiply, -1.0, engine=_G)
                rowsum(h, qi, pq, job["don"][:pq], job.pop("on")[:pq, 0, :])
            return
        while h["groups"] and h["groups"][0][0] <= qi:
            g0, g1, lrows = h["groups"].pop(0)
            r0, r1 = g0 * pmax, min(sq, g1 * pmax)
            _transpose_rows(h["qT"][:, r0:r1], h["qn"][:, g0:], r1 - r0, engines, mul=qmul)
            _transpose_rows(h["doT"][:, r0:r1], h["don"][:, g0:], r1 - r0, engines)
            tp = nl.ndarray((pmax, qgroup), nl.float32, buffer=nl.psum, name="lseT")
            nisa.nc_transpose(tp[:, : g1 - g0], lrows[: g1 - g0])
            nisa.tensor_scalar(h["nlse"][:, g0:g1], tp[:, : g1 - g0], Alu.multiply, -1.0)
        if qi not in h["di_set"]:
            rowsum(h, qi, pq, h["don"][:pq, qi, :], h["on"][:pq, qi, :])
            h["di_set"].add(qi)
        job.update(qT=h["qT"][:, q0:q0 + pq], doT=h["doT"][:, q0:q0 + pq], qn=h["qn"][:, qi, :],
                   don=h["don"][:, qi, :])

    def kv(t):  # per key block: K (keys on partitions, the dQ moving operand), K^T and V^T (scores, dP)
        job = jobs[t]
        bl = job["blk"]
        if not job["blk_first"]:
            return
        b, k0, kw = job["b"], bl["k0"], bl["kw"]
        kn = nl.ndarray((pmax, kpb, d), dt, name="k_nat")
        vn = nl.ndarray((pmax, kpb, d), dt, name="v_nat")
        _load_rows(kn, k[b, k0:k0 + kw], kw, any_order)
        _load_rows(vn, v[b, k0:k0 + kw], kw, any_order)
        kt = nl.ndarray((d, blk), dt, name="kT")
        _transpose_rows(kt[:, :kw], kn, kw, engines)
        vt = nl.ndarray((d, blk), dt, name="vT")
        _transpose_rows(vt[:, :kw], vn, kw, engines)
        bl.update(kn=kn, kT=kt, vT=vt)

    def mm1(t):  # S = Q K^T and dP = dO V^T for this tile and block (PSUM)
        job = jobs[t]
        bl = job["blk"]
        q0, pq, w = job["q0"], job["pq"], job["kvw"]
        s = nl.ndarray((pmax, blk), nl.float32, buffer=nl.psum, name="s")
        nisa.nc_matmul(s[:pq, :w], job["qT"], bl["kT"][:, :w], accumulate=False)
        dp = nl.ndarray((pmax, blk), nl.float32, buffer=nl.psum, name="dp")
        nisa.nc_matmul(dp[:pq, :w], job["doT"], bl["vT"][:, :w], accumulate=False)
        job.update(s=s, dp=dp)
        if mask is not None:
            raw = nl.ndarray((pmax, blk), mask.dtype, name="mask_raw")
            k0 = bl["k0"]
            nisa.dma_copy(raw[:pq, :w], _mask_rows(mask, job["b"])[q0:q0 + pq, k0:k0 + w])
            job["mask_raw"] = raw

    def expo(t):  # P = exp(s_eff * S (+ mask) - lse); causal: zero above the diagonal (GpSimd)
        job = jobs[t]
        h = heads[job["b"]]
        qi, q0, pq, w, k0 = job["qi"], job["q0"], job["pq"], job["kvw"], job["blk"]["k0"]
        s = job.pop("s")
        if mask is not None:
            mk = nl.ndarray((pmax, blk), nl.float32, name="mask")
            nisa.tensor_scalar(mk[:pq, :w], job.pop("mask_raw")[:pq, :w], Alu.multiply, 1.0 / s_eff, engine=_G)
            nisa.tensor_tensor(s[:pq, :w], s[:pq, :w], mk[:pq, :w], Alu.add)
        p = nl.ndarray((pmax, blk), dt, name="p")
        nisa.activation(p[:pq, :w], Act.exp, s[:pq, :w], bias=h["nlse"][:pq, qi:qi + 1], scale=s_eff)
        if causal and k0 + w - 1 > q0:  # keys after the query: (q0 + row) - (k0 + col) < 0
            nisa.affine_select(p[:pq, :w], p[:pq, :w], steps=(-1,), cmp_op=Alu.greater_equal, on_false_value=0.0,
                               offset=q0 - k0, channel_multiplier=1)
        job["p"] = p

    def ds(t):  # dS = P * (dP - rowsum(dO * O)): the subtraction on ScalarE, the product on GpSimd
        job = jobs[t]
        h = heads[job["b"]]
        qi, pq, w = job["qi"], job["pq"], job["kvw"]
        tt = nl.ndarray((pmax, blk), dt, name="dp_minus_d")
        nisa.activation(tt[:pq, :w], Act.identity, job.pop("dp")[:pq, :w], bias=h["ndi"][:pq, qi:qi + 1])
        dsm = nl.ndarray((pmax, blk), dt, name="dS")
        nisa.tensor_tensor(dsm[:pq, :w], tt[:pq, :w], job["p"][:pq, :w], Alu.multiply, engine=_G)
        job["ds"] = dsm

    def mm2(t):  # dV += P^T dO, dK += dS^T Q (keys on the output partitions; PSUM across query tiles)
        job = jobs[t]
        bl = job["blk"]
        pq, w = job["pq"], job["kvw"]
        if job["blk_first"]:
            bl["dv"] = nl.ndarray((pmax, kpb, d), nl.float32, buffer=nl.psum, name="dv_acc")
            bl["dk"] = nl.ndarray((pmax, kpb, d), nl.float32, buffer=nl.psum, name="dk_acc")
            for j in range(nl.cdiv(bl["kw"], pmax)):  # key rows the first contribution misses stay zero
                rows = min(pmax, bl["kw"] - j * pmax)
                if bl["first_q"].get(j, (None, 0))[1] < rows:
                    nisa.memset(bl["dv"][:, j, :], 0.0)
                    nisa.memset(bl["dk"][:, j, :], 0.0)
        p, dsm = job["p"], job["ds"]
        for j in range(nl.cdiv(w, pmax)):
            r = min(pmax, w - j * pmax)
            fresh = bl["first_q"][j] == (id(job), r) and r == min(pmax, bl["kw"] - j * pmax)
            nisa.nc_matmul(bl["dv"][:r, j, :], p[:pq, j * pmax:j * pmax + r], job["don"][:pq], accumulate=not fresh)
            nisa.nc_matmul(bl["dk"][:r, j, :], dsm[:pq, j * pmax:j * pmax + r], job["qn"][:pq], accumulate=not fresh)

    def transpose(t):  # dS^T (keys on partitions) for dQ
        job = jobs[t]
        pq, w = job["pq"], job["kvw"]
        dst = nl.ndarray((pmax, kpb, pmax), dt, buffer=nl.psum, name="dsT")
        dsm = job["ds"]
        for j in range(nl.cdiv(w, pmax)):
            r = min(pmax, w - j * pmax)
            nisa.nc_transpose(dst[:r, j, :pq], dsm[:pq, j * pmax:j * pmax + r])
        job["dsT_psum"] = dst

    def copy(t):
        job = jobs[t]
        pq, w = job["pq"], job["kvw"]
        dst = job.pop("dsT_psum")
        sb = nl.ndarray((pmax, kpb, pmax), dt, name="dsT_sb")
        full = w // pmax
        if full:
            nisa.tensor_copy(sb[:, :full, :pq], dst[:, :full, :pq], engine=_V)
        if w > full * pmax:
            nisa.tensor_copy(sb[: w - full * pmax, full, :pq], dst[: w - full * pmax, full, :pq], engine=_V)
        job["dsT"] = sb

    def dqs(t):  # dQ_tile += dS K over the block's key tiles; added into the fp32 accumulator
        job = jobs[t]
        bl, h = job["blk"], heads[job["b"]]
        qi, pq, w = job["qi"], job["pq"], job["kvw"]
        sb = job.pop("dsT")
        acc = nl.ndarray((pmax, d), nl.float32, buffer=nl.psum, name="dq_part")
        n = nl.cdiv(w, pmax)
        for j in range(n):
            r = min(pmax, w - j * pmax)
            nisa.nc_matmul(acc[:pq], sb[:r, j, :pq], bl["kn"][:r, j, :], accumulate=j > 0)
        last = job["q_last"]
        if qi in h["dq_set"] and last:  # the last contribution: add, scale and cast straight to the output tile
            tot = nl.ndarray((pmax, d), nl.float32, name="dq_tot")
            nisa.tensor_tensor(tot[:pq], h["dq"][:pq, qi, :], acc[:pq], Alu.add)
            res = nl.ndarray((pmax, d), dt, name="dq_out")
            nisa.tensor_scalar(res[:pq], tot[:pq], Alu.multiply, sc, engine=_G)
        elif last:
            res = nl.ndarray((pmax, d), dt, name="dq_out")
            nisa.tensor_scalar(res[:pq], acc[:pq], Alu.multiply, sc)
        elif qi in h["dq_set"]:
            nisa.tensor_tensor(h["dq"][:pq, qi, :], h["dq"][:pq, qi, :], acc[:pq], Alu.add)
        else:
            nisa.tensor_copy(h["dq"][:pq, qi, :], acc[:pq], engine=_V)
        h["dq_set"].add(qi)
        if last:
            nisa.dma_copy(dq[job["b"], job["q0"]:job["q0"] + pq, :], res[:pq])

    def fin_kv(t):  # dK = scale * acc, dV = acc, cast and stored after the block's last query tile
        job = jobs[t]
        if not job["blk_last"]:
            return
        bl = job["blk"]
        b, k0, kw = bl["b"], bl["k0"], bl["kw"]
        n = nl.cdiv(kw, pmax)
        ok = nl.ndarray((pmax, kpb, d), dt, name="dk_out")
        ov = nl.ndarray((pmax, kpb, d), dt, name="dv_out")
        full = kw // pmax
        parts = ([(pmax, 0, full)] if full else []) + ([(kw - full * pmax, full, n)] if n > full else [])
        for rows, j0, j1 in parts:
            nisa.tensor_scalar(ok[:rows, j0:j1, :], bl["dk"][:rows, j0:j1, :], Alu.multiply, sc)
            nisa.activation(ov[:rows, j0:j1, :], Act.identity, bl["dv"][:rows, j0:j1, :])
        _store_rows(dk[b, k0:k0 + kw], ok, kw, any_order)
        _store_rows(dv[b, k0:k0 + kw], ov, kw, any_order)
        for key in ("dk", "dv", "kn", "kT", "vT"):
            del bl[key]

    def fin_q(t):  # the head's operands are done with
        job = jobs[t]
        if job["head_last"]:
            del heads[job["b"]]

    for bl in empty:  # causal key blocks past every query: zero gradients
        z = nl.ndarray((pmax, kpb, d), dt, name="zeros")
        nisa.memset(z, 0.0, engine=_G)
        _store_rows(dk[bl["b"], bl["k0"]:bl["k0"] + bl["kw"]], z, bl["kw"])
        _store_rows(dv[bl["b"], bl["k0"]:bl["k0"] + bl["kw"]], z, bl["kw"])

    fns = {"head": head, "q_dma": q_dma, "q_prep": q_prep, "kv": kv, "mm1": mm1, "exp": expo, "ds": ds, "mm2": mm2,
           "transpose": transpose, "copy": copy, "dq": dqs, "fin_kv": fin_kv, "fin_q": fin_q}
    preds = {"head": (), "q_dma": ("head",), "q_prep": ("q_dma",), "kv": (), "mm1": ("q_prep", "kv"), "exp": ("mm1",),
             "ds": ("exp",), "mm2": ("ds",), "transpose": ("ds",), "copy": ("transpose",), "dq": ("copy",),
             "fin_kv": ("mm2", "dq"), "fin_q": ("dq", "fin_kv")}
    first_of_head, first_of_blk = {}, {}
    for t, job in enumerate(jobs):
        first_of_head.setdefault(job["b"], t)
        first_of_blk.setdefault(id(job["blk"]), t)

    def after(t, name):
        job = jobs[t]
        if name == "head" and job["head_first"] and t and not overlap_heads:
            return ((t - 1, "fin_q"),)
        if name == "q_dma" and not job["head_first"]:  # tiles load in order
            return ((t - 1, "q_dma"),)
        if name == "q_prep" and not job["head_first"]:
            return ((t - 1, "q_prep"),)
        if name == "q_dma":
            return ((first_of_head[job["b"]], "head"),)
        if name == "mm1":  # the block's operands exist
            return ((first_of_blk[id(job["blk"])], "kv"),)
        if name in ("mm2", "dq", "fin_kv", "fin_q") and t:  # accumulators in job order
            return ((t - 1, name if name in ("mm2", "dq") else "mm2"),) + (((t - 1, "dq"),) if name == "fin_q" else ())
        return ()

    def usage(t, name):
        job = jobs[t]
        return {"mm1": {"s": 1, "dp": 1}, "exp": {"s": -1}, "ds": {"dp": -1}, "transpose": {"dsT": 1},
                "copy": {"dsT": -1}, "mm2": {"dkv": 2} if job["blk_first"] else {},
                "fin_kv": {"dkv": -2} if job["blk_last"] else {}}.get(name, {})

    if jobs:
        _pipeline([j["kvw"] / blk for j in jobs], [(n, off, fns[n], preds[n]) for off, n in BWD_SCHEDULE],
                  after, usage, BWD_PSUM_BUDGET)
    return dq, dk, dv
