"""Fused scaled-dot-product attention (flash style), forward and backward.

``torch.nn.functional.scaled_dot_product_attention`` semantics on batch-heads flattened by the caller:
q [BH, Sq, D], k and v [BH, Skv, D] (Sq != Skv allowed, any lengths), an optional additive float mask
broadcastable to [BH, Sq, Skv] ([Sq, Skv] or [1 or BH, Sq, Skv]; -inf entries drop keys), ``causal`` (top-left
aligned: query i sees keys 0..i, as torch's ``is_causal``; not together with a mask, as torch), ``scale``
(default 1/sqrt(D), any sign). float32 / bfloat16 / float16 inputs; outputs in the input dtype, the logsumexp
in float32. A row whose scores are all -inf (every key masked, or -inf from the inputs) gives zeros, as torch
2.13 does: the running max starts at a finite floor and the row sum is floored (``max_floor``), so no
exp(-inf + inf) arises; its logsumexp is then about -FLT_MAX, whose exps in the backward are 0. The mask is
divided by the scale inside, so masks must stay finite after that division (the op floors finfo.min entries).

Forward (online softmax). Per (batch-head, 128-query tile) the keys go by in chunks of ``kv_chunk`` (2048): TensorE
writes S = Q K^T in 512-column PSUM tiles (scores never reach HBM). The row max of each tile is split: VectorE
reduces its first columns in PSUM, ScalarE copies the rest to SBUF where GpSimd reduces them; GpSimd folds the
tiles' maxima and the running max m into the new m. ScalarE writes P = exp(scale * S - scale * m) (16-bit for
16-bit inputs) for VectorE's columns, GpSimd for the copied ones as the power (e^scale) ** (S - m). P^T (keys on
partitions) comes from SBUF->SBUF DMA transposes for a ``dma_share`` of the 256-key groups (16-bit P moves as
4-byte key pairs, so one DMA transposes 256 keys) and from TensorE transposes (copied out of PSUM by VectorE /
ScalarE) for the rest; both leave key pairs interleaved, [V | 1] keeps its rows in the same pair layout. P^T
multiplies [V | 1]: the ones column makes the same matmuls produce the row sums, so the fp32 accumulator
[P V | l] stays in PSUM for the whole key loop and each chunk only rescales it by exp(scale (m_old - m_new))
(ScalarE). Causal: chunks past the diagonal are never computed; in the diagonal block VectorE selects -inf
above the diagonal in PSUM (a select, not an added -inf: a future key's score may be +inf or NaN, and
inf - inf would make the row NaN; torch's CPU kernel fills them too). K^T and [V | 1] of a batch-head stay
resident in SBUF. Without causal / mask the key order is free (softmax only needs K and V to share it): each
partition loads contiguous rows of K and V and TensorE transposes K in an order that keeps those rows in the
pair layout; otherwise K^T comes from DMA transposes (TensorE on profiles without them). Q^T comes from DMA
transposes (TensorE without). Statistics, accumulation and the logsumexp are fp32.

Backward (FlashAttention-2). Key blocks of ``kv_block`` are the outer loop: per (key block, query tile)
TensorE recomputes S and dP = dO V^T, ScalarE P = exp(scale * S - lse) and dP - rowsum(dO * O), GpSimd
dS = P * (dP - rowsum) (and zeroes P above the causal diagonal with affine_select), TensorE accumulates
dV += P^T dO and dK += dS^T Q in PSUM (P and dS have queries on partitions: no transpose needed), transposes
dS and adds dS K into an fp32 SBUF dQ. Q, dO (both layouts) stay resident per batch-head when they fit a
quarter of SBUF, else each job streams its tiles (``resident``).

Scheduling. Engines run their instructions in program order, so the emission order decides the overlap:
each job's stages are emitted by a list scheduler (``_pipeline``) at offsets tuned on the simulator
(``FWD_SCHEDULE``, ``BWD_SCHEDULE``), under PSUM budgets that keep at most 8 banks live by construction.

Performance (trn2 cost model, bf16, D = 128, per 128 queries x 2048 keys of the forward): TensorE 1707 ns of
QK^T and P [V | 1] (the roofline's work) plus 53 ns per TensorE-transposed 128-key block; a DMA transpose of a
256-key group costs ~436 ns of the DMA engines' time; the exp is 1707 ns of ScalarE / GpSimd work, the row max
2133 ns of VectorE / ScalarE + GpSimd work. The P^T split between TensorE and the DMA queues balances the two
(TensorE and DMA each ~95% busy at seq 4096, ~75% of TensorE peak); without DMA transposes (trn1) TensorE's
transposes and their copies bound the forward near 2/3 of peak. The backward's dS transposes cap it at 5/6.

Limits: D <= 128 (one contraction tile). The forward keeps K^T and [V | 1] of a batch-head in SBUF: Skv up to
about 48K keys for 16-bit inputs, 24K for float32 on trn2 (trn1's smaller SBUF: about 44K / 20K); the longest
key ranges take shorter chunks. The backward handles any length up to its fp32 dQ
accumulator (4 * Sq bytes per partition: Sq up to about 40K).
"""

from __future__ import annotations

import math

from neuron_hal import Act, Alu, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import _FAR, View

_NEG_INF = float("-inf")
_FLT_MAX = 3.4028234663852886e38
_TINY = 1.1754943508222875e-38  # the smallest normal float32: a floor for row sums (every live row's is >= 1)


def max_floor(s_eff: float) -> float:
    """The floor of a running row max m, so that the exp's bias -s_eff * m stays finite: a row whose scores are
    all -inf (every key masked, or -inf from the inputs) then exponentiates to zeros (exp(-inf - bias)) instead
    of exp(-inf + inf) = NaN, and with its row sum floored at _TINY gives a zero output, as torch does. Scores
    below the floor are below -FLT_MAX once scaled, -inf in torch's float32 arithmetic as well."""
    return -_FLT_MAX / max(1.0, s_eff)
_V, _S, _G = Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD


# -- shared helpers ------------------------------------------------------------------------------
def _causal_keep(shape, steps) -> View:
    """A float32 tile, 1 where a causal query (partition p) sees key i (p + sum(steps * i) >= 0), else 0: the
    predicate of a select that sets the scores of future keys to -inf whatever they hold."""
    keep = nl.ndarray(shape, nl.float32, name="causal_keep")
    nisa.memset(keep, 1.0, engine=_G)
    nisa.affine_select(keep, keep, steps=steps, cmp_op=Alu.greater_equal, on_false_value=0.0, channel_multiplier=1)
    return keep


class _Heads:
    """A [B, H, S, D] HBM view indexed as [BH, S, D] (batch-head b: batch b // H, head b % H), so q, k, v, out
    and grad_out are read in place in any layout whose rows are contiguous (e.g. the heads of [B, S, H * D]
    projections seen as [B, H, S, D]), with no layout copy before the kernel."""

    def __init__(self, heads: View):
        b, h, s, d = heads.shape
        self.view, self.heads, self.shape, self.dtype = heads, h, (b * h, s, d), heads.dtype

    def __getitem__(self, key) -> View:
        key = key if isinstance(key, tuple) else (key,)
        b = int(key[0])
        return self.view[b // self.heads, b % self.heads][key[1:]]


def _heads_of(x: View, name: str, layouts) -> _Heads | View:
    """Argument ``name`` as batch-heads: a [BH, S, D] tensor, or where ``layouts`` has ``(name, sizes, strides)``
    the 1-d storage a [B, H, S, D] view of those element strides spans (inner stride 1)."""
    layout = {n: (sizes, strides) for n, sizes, strides in layouts or ()}.get(name)
    if layout is None:
        return _Heads(x.reshape(1, *x.shape)) if len(x.shape) == 3 else x  # others: _check_inputs says why
    sizes, strides = layout
    if len(sizes) != 4 or strides[-1] != 1:
        raise KernelError(f"{name}: a layout is [B, H, S, D] sizes with element strides ending in 1, got "
                          f"{list(sizes)}, {list(strides)}")
    return _Heads(x.as_strided(sizes, strides))


def _result(into, name: str, layouts, shape, dtype) -> tuple[_Heads | View, bool]:
    """A [BH, S, D] result: a new HBM output, or ``into`` (the storage of a tensor the caller allocated in the
    layout it wants, see _heads_of) written in place. Returns (the tensor, whether it is a new output)."""
    if into is None:
        return nl.ndarray(shape, dtype, buffer=nl.hbm, name=name), True
    heads = _heads_of(into, name, layouts)
    if heads.shape != shape or heads.dtype != dtype:
        raise KernelError(f"{name} must be {list(shape)} {dtype}, got {list(heads.shape)} {heads.dtype}")
    return heads, False


def _pairs_of_rows(x: View, n: int, pairs: int) -> View:
    """The first n * pairs rows of a 2-D HBM view as [n, pairs * cols] (one run per row pair) or, where the rows
    are not contiguous, [n, pairs, cols] (the same elements in the same order)."""
    cols = x.shape[1]
    try:
        return x[: n * pairs].reshape(n, pairs * cols)
    except KernelError:
        return x[: n * pairs].reshape(n, pairs, cols)


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


def _bwd_inputs(name, grad_out, q, k, v, out, logsumexp, mask, causal, layouts):
    """A backward's grad_out, q, k, v, out as batch-heads (see _heads_of), checked with the logsumexp against
    q; returns them and (bh, sq, skv, d)."""
    grad_out, q, k, v, out = (_heads_of(x, n, layouts) for x, n in
                              ((grad_out, "grad_out"), (q, "q"), (k, "k"), (v, "v"), (out, "out")))
    bh, sq, skv, d = _check_inputs(name, q, k, v, mask, causal)
    dt = q.dtype
    if grad_out.shape != q.shape or out.shape != q.shape or grad_out.dtype != dt or out.dtype != dt:
        raise KernelError(f"{name}: grad_out and out must be {list(q.shape)} {dt}, got "
                          f"{list(grad_out.shape)} {grad_out.dtype} and {list(out.shape)} {out.dtype}")
    if tuple(logsumexp.shape) != (bh, sq) or logsumexp.dtype != nl.float32:
        raise KernelError(f"{name}: logsumexp must be [{bh}, {sq}] float32, got "
                          f"{list(logsumexp.shape)} {logsumexp.dtype}")
    return (grad_out, q, k, v, out), (bh, sq, skv, d)


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


def _copy(dst: View, src: View, engine: Engine) -> None:
    """tensor_copy on ``engine``; ScalarE before NC-v3 copies by an identity activation."""
    if engine is _S and not nl.profile().scalar_tensor_copy:
        nisa.activation(dst, Act.identity, src)
    else:
        nisa.tensor_copy(dst, src, engine=engine)


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
            _copy(dst[:, g0 * pmax:c1], tp[:, : c1 - g0 * pmax], engines())
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


# -- forward -------------------------------------------------------------------------------------
def _wide(x: View) -> View:
    """The 4-byte view of a 16-bit on-chip view whose innermost dim is contiguous and even: each pair of
    elements becomes one uint32 (a bitcast halving the innermost dim), so a DMA transpose moves key pairs."""
    size, stride = x.dims[-1]
    part, elem = divmod(x.offset, _FAR)
    if x.dtype.itemsize != 2 or stride != 1 or size % 2 or elem % 2 or any(st % 2 for _, st in x.dims[1:-1]):
        raise KernelError(f"{x!r}: no 4-byte view (needs 16-bit elements, an even contiguous innermost dim)")
    dims = (x.dims[0],) + tuple((s, st // 2) for s, st in x.dims[1:-1]) + ((size // 2, 1),)
    return type(x)(x.owner, nl.uint32, part * _FAR + elem // 2, dims)


def _pair_rows(x: View, r0: int, ngroups: int, pairs: int) -> View:
    """[pmax, ngroups, pairs * cols] view of a 2-D HBM view: element [i, g, e * cols + c] is row
    r0 + (g * pmax + i) * pairs + e (partition i holds ``pairs`` consecutive rows of each group); rows that are
    not contiguous keep the pair as its own dim ([pmax, ngroups, pairs, cols], same order)."""
    pmax = nl.tile_size.pmax
    (_, rs), (cols, cs) = x.dims
    lead = ((pmax, pairs * rs), (ngroups, pmax * pairs * rs))
    inner = ((pairs * cols, 1),) if cs == 1 and rs == cols else ((pairs, rs), (cols, cs))
    return type(x)(x.owner, x.dtype, x.offset + r0 * rs, lead + inner)


# (step offset, stage) of the forward's software pipeline (see _pipeline); stages at equal offsets go in list order.
# Tuned on the simulator (trn2, seq 4096): a job's P V comes ~4 jobs after its QK^T, as the DMA transposes of
# its P arrive behind the queue of loads and earlier transposes.
FWD_SCHEDULE = [(-6.0, "head_pre"), (1.5, "kv_dma"), (3.577, "v_dma"), (-3.14, "q_dma"), (-1.0, "m_dma"),
                (1.25, "q_t"), (2.0, "qk"), (2.01, "bias"), (2.182, "vmax"), (2.192, "smax"), (3.034, "negmax"),
                (3.157, "exp"), (2.8, "dma_t"), (3.59, "transpose"), (4.085, "copy"), (4.446, "v_copy"),
                (5.961, "rescale"), (6.209, "pv"), (6.499, "fin")]
TILE_STEP = 0.05  # offset between the score tiles of a job ("qk", "bias", "vmax", "smax", "exp" go per tile)
# PSUM banks in flight (8 per partition): score tiles and TensorE P^T tiles share "banks", the accumulator "acc";
# the K^T / Q^T / logsumexp transposes take one more bank briefly
PSUM_BUDGET = {"banks": 6, "acc": 1}
# share of the P^T PSUM->SBUF copies VectorE takes (ScalarE the rest): with DMA transposes / TensorE ones only
COPY_ON_VECTOR = (0.756, 0.5)
MAX_ON_VECTOR = 0.676  # share of each score tile's row max VectorE takes; ScalarE copies the rest for GpSimd
MAX_SCORE_BANKS = 4  # score tiles (PSUM banks) per key chunk at most
WORK_TILES, WORK_FIXED_BYTES = 8, 16384  # SBUF estimate: chunk-wide tiles in flight, and the rest
QT_GROUP = 2  # query tiles per transposing Q load
K_FIRST_TILES = 2  # a head's first K loads are one score tile each (the first QK^T tiles start early)
ANY_ORDER = True  # without causal / mask, K and V load in partition-contiguous key order
TAIL_TE_JOBS = 1  # the last jobs transpose P on TensorE only (no DMA latency left to hide behind)
GEXP_SCALES = (1 / 32, 30.0)  # |scale| range where GpSimd computes (16-bit) exps as powers of e^|scale|


@kernel(tunables={"kv_chunk": (2048, 1024, 512), "dma_share": (0.563, 0.5, 0.625)}, version=2)
def flash_attention_fwd(q, k, v, scale=None, causal=False, mask=None, kv_chunk=2048, dma_share=0.563, layouts=None,
                        out=None):
    """softmax(scale * q k^T + mask) v per batch-head -> (out [BH, Sq, D] in q's dtype, logsumexp [BH, Sq] fp32).

    The logsumexp is of the scaled, masked scores (what flash_attention_bwd takes). ``kv_chunk``: keys per
    online-softmax step (at most four PSUM banks of scores). ``dma_share``: the share of P^T tiles the DMA
    engines transpose where the profile has DMA transposes and there is no mask (TensorE does the rest).
    ``layouts``: ``(name, [B, H, S, D], strides)`` of q, k or v passed as the storage they span (see _heads_of);
    with ``out`` (the storage of the output in the layout ``layouts`` gives it) the kernel writes the output there
    and returns only the logsumexp.
    """
    q, k, v = (_heads_of(x, n, layouts) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    bh, sq, skv, d = _check_inputs("flash_attention_fwd", q, k, v, mask, causal)
    prof = nl.profile()
    pmax = nl.tile_size.pmax
    mm_n = nl.tile_size.gemm_moving_fmax
    dt = q.dtype
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # exp(s_eff * T + nb) with s_eff > 0 keeps "max of T" the max of the scaled scores: fold the sign into q.
    s_eff, qmul = (sc, None) if sc > 0 else (-sc, -1.0) if sc < 0 else (1.0, 0.0)
    use_dma = bool(prof.dma_transpose)
    # with a mask the DMA queues carry the mask tiles (as many bytes as the scores): TensorE transposes all of P
    share_dma = min(1.0, max(0.0, float(dma_share))) if use_dma and mask is None else 0.0
    # keys per P^T group: one 128-partition tile of 4-byte elements (16-bit inputs: key pairs, so one DMA
    # transpose moves 256 keys); [V | 1] keeps each group's keys as [partition i, pair slot e] to match
    pairs = 4 // dt.itemsize
    gsize = pmax * pairs
    # keys per online-softmax step: at most MAX_SCORE_BANKS score tiles (float32 inputs: half, for their P tiles),
    # and smaller while the tiles in flight (about WORK_TILES P tiles and mask tiles of a chunk) would not fit
    # next to the resident K^T and [V | 1]
    nqt, ngroups = nl.cdiv(sq, pmax), nl.cdiv(skv, gsize)
    chunk = max(gsize, min(int(kv_chunk), MAX_SCORE_BANKS * mm_n * 2 // dt.itemsize) // gsize * gsize)
    free = nl.tile_size.sbuf_size_bytes - (skv + ngroups * pairs * (d + 1)) * dt.itemsize - WORK_FIXED_BYTES
    while chunk > gsize and chunk * WORK_TILES * (dt.itemsize + (4 if mask is not None else 0)) > free:
        chunk = max(gsize, chunk // 2 // gsize * gsize)
    per_bank = nl.tile_size.psum_bank_fmax * 4 // (pmax * dt.itemsize)  # P^T tiles per PSUM bank
    # GpSimd takes the exp of the score columns ScalarE copies out for its max, as a power: exp(s_eff (S - m)) =
    # (e^s_eff) ** (S - m). The FP32 rounding of the base moves P by |ln P| 2^-24 / s_eff relative: far below a
    # 16-bit P's own rounding for the P that matter (|ln P| <= 20) when s_eff >= GEXP_SCALES[0]; float32 P and
    # other scales keep every exp on ScalarE
    gexp_base = math.exp(s_eff) if dt.itemsize == 2 and GEXP_SCALES[0] <= s_eff <= GEXP_SCALES[1] else None

    out, new_out = _result(out, "out", layouts, (bh, sq, d), dt)
    lse = nl.ndarray((bh, sq), nl.float32, buffer=nl.hbm, name="lse")
    engines = _Alternate()

    diag = None
    if causal:  # which keys of a diagonal block a query sees: 1 where key <= query (i <= p), 0 above
        diag = _causal_keep((pmax, pmax), (-1,))

    # jobs: one per (batch-head, query tile, key chunk)
    jobs = []
    for b in range(bh):
        for qi in range(nqt):
            q0 = qi * pmax
            pq = min(pmax, sq - q0)
            kv_end = min(skv, q0 + pq) if causal else skv
            tile = {"b": b, "qi": qi, "q0": q0, "pq": pq}
            nch = nl.cdiv(kv_end, chunk)
            jobs += [{"t": tile, "c0": ci * chunk, "cw": min(chunk, kv_end - ci * chunk), "first": ci == 0,
                      "last": ci == nch - 1, "b_first": qi == 0 and ci == 0, "b_last": qi == nqt - 1 and ci == nch - 1}
                     for ci in range(nch)]
    prev_of = {}
    for t, job in enumerate(jobs):  # the previous chunk's job of the same query tile
        job["prev"] = prev_of.get(id(job["t"]))
        if job["prev"] is not None:
            jobs[job["prev"]]["next"] = t
        prev_of[id(job["t"])] = t
    # each chunk's 256-key groups go to the DMA or the TensorE transpose (error diffusion over the full groups, so
    # the DMA takes dma_share of them); a P^T unit is one 128-partition TensorE transpose (pair slot e of a group)
    acc = 0.0
    for t, job in enumerate(jobs):
        share_t = share_dma if t < len(jobs) - TAIL_TE_JOBS else 0.0
        dma_segs, te_segs = [], []
        for gc in range(0, job["cw"], gsize):
            w = min(gsize, job["cw"] - gc)
            seg = (gc, w, (job["c0"] + gc) // gsize)
            if w == gsize and share_t > 0:
                acc += share_t
                if acc >= 0.5:
                    acc -= 1.0
                    dma_segs.append(seg)
                    continue
            te_segs.append(seg)
        te_units = [(seg, e, nl.cdiv(seg[1] - e, pairs)) for seg in te_segs for e in range(pairs) if seg[1] > e]
        job.update(dma_segs=dma_segs, te_units=te_units, nsc=nl.cdiv(job["cw"], mm_n),
                   npt=nl.cdiv(len(te_units), per_bank))
    heads, qtiles = {}, {}
    share = [0.0]
    cov = COPY_ON_VECTOR[0 if share_dma else 1]
    # query tiles per load: 2 KiB per partition; a transposing load has its rows whole, so it can come in small
    # pieces just in time
    qgroup = QT_GROUP if use_dma else max(1, 2048 // (d * dt.itemsize))
    kgroup = max(1, nl.tile_size.psum_bank_fmax * 4 // (pmax * dt.itemsize))  # key tiles per load / transpose group
    vgroup = max(1, 2048 // (gsize * d * dt.itemsize // pmax))  # key groups per [V | 1] load
    # without causal / mask the key order is free (softmax only needs K and V to share it): the first
    # ao_keys keys are then numbered so that partition i of K and V holds contiguous rows (one DMA run each)
    ao_keys = (skv // gsize) * gsize if ANY_ORDER and not causal and mask is None else 0

    def k_ao(b):  # [pmax, ao_keys // pmax, d]: partition i holds rows i * R .. i * R + R - 1
        return k[b, :ao_keys].reshape(pmax, ao_keys // pmax, d)

    def v_ao(b):
        return v[b, :ao_keys].reshape(pmax, ao_keys // pmax, d)

    # the next batch-head's K^T and [V | 1] load during this one's when both fit in half of SBUF
    head_bytes = (skv + ngroups * pairs * (d + 1)) * dt.itemsize + nqt * 4
    overlap_heads = 2 * head_bytes <= nl.tile_size.sbuf_size_bytes // 2
    # DMA queues complete in order: loads, the P^T transposes (which wait for the exps) and the stores (which
    # wait for the results) each rotate over their own quarter / half / quarter of the queues
    nq = prof.dma_queues
    rot = {"load": (list(range(max(1, nq // 4))), [0]), "p": (list(range(nq // 4, 3 * nq // 4)) or [0], [0]),
           "store": (list(range(3 * nq // 4, nq)) or [0], [0])}

    def queue(kind):
        qs, n = rot[kind]
        n[0] += 1
        return qs[(n[0] - 1) % len(qs)]

    def new_head(b):
        vaug = nl.ndarray((pmax, ngroups * pairs, d + 1), dt, name="vaug")
        nisa.memset(vaug[:, :, d:d + 1], 1.0, engine=_G)
        lsum = nl.ndarray((pmax, nqt), nl.float32, name="rowsums")  # per query tile: l, then the logsumexp
        nisa.memset(lsum, 1.0, engine=_G)
        nbs = nl.ndarray((pmax, nqt), nl.float32, name="negmaxes")  # per query tile: the final exp bias
        nisa.memset(nbs, 0.0, engine=_G)
        heads[b] = {"vaug": vaug, "kT": nl.ndarray((d, skv), dt, name="kT"), "lsum": lsum, "nbs": nbs, "kl": 0, "vl": 0,
                    "kstage": [], "vstage": []}

    def load_kv(b, kend, vend):  # K^T columns up to key kend, [V | 1] groups up to key vend
        head = heads[b]
        while head["kl"] < kend:
            r0 = head["kl"]
            if r0 < ao_keys:  # any order: partition i's contiguous rows, transposed on TensorE (need_kt)
                g0 = r0 // gsize
                r1 = r0 + mm_n if r0 < K_FIRST_TILES * mm_n else (r0 // chunk + 1) * chunk
                g1 = min(ao_keys // gsize, max(g0 + 1, r1 // gsize))
                kst = nl.ndarray((pmax, (g1 - g0) * pairs, d), dt, name="kstage")
                nisa.dma_copy(kst, k_ao(b)[:, g0 * pairs:g1 * pairs, :], queue=queue("load"))
                head["kstage"].append((g0 * gsize, g1 * gsize, kst))
                r1 = g1 * gsize
            elif use_dma:  # K^T straight from HBM by a DMA transpose: one score tile first, then chunks
                r1 = min(skv, mm_n if r0 == 0 else (r0 // chunk + 1) * chunk)
                nisa.dma_transpose(head["kT"][:, r0:r1], k[b, r0:r1, :], queue=queue("load"))
            else:  # K rows (in order) in tiles that need_kt transposes on TensorE
                r1 = min(skv, r0 + (max(1, min(kgroup, r0 // pmax)) if causal else kgroup) * pmax)
                kst = nl.ndarray((pmax, kgroup, d), dt, name="kstage")
                _load_rows(kst, k[b, r0:r1], r1 - r0)
                head["kstage"].append((r0, r1, kst))
            head["kl"] = r1
        gend = nl.cdiv(min(skv, vend), gsize)
        while head["vl"] < gend:  # [V | 1] rows in pair layout: a staging tile copied in by need_v
            g0 = head["vl"]
            g1 = min(ngroups, g0 + vgroup)
            r0, r1 = g0 * gsize, min(skv, g1 * gsize)
            nfull = (r1 - r0) // gsize
            st = nl.ndarray((pmax, vgroup * pairs, d), dt, name="vstage")
            if nfull and r0 < ao_keys:  # any order: partition i's contiguous rows are its pair slots
                nisa.dma_copy(st[:, : nfull * pairs, :], v_ao(b)[:, g0 * pairs:(g0 + nfull) * pairs, :],
                              queue=queue("load"))
            elif nfull:
                nisa.dma_copy(st[:, : nfull * pairs, :].reshape(pmax, nfull, pairs * d),
                              _pair_rows(v[b], r0, nfull, pairs), queue=queue("load"))
            tail = r1 - r0 - nfull * gsize
            rt, n2 = r0 + nfull * gsize, tail // pairs
            if n2:
                nisa.dma_copy(st[:n2, nfull * pairs:(nfull + 1) * pairs, :].reshape(n2, pairs * d),
                              _pairs_of_rows(v[b, rt:], n2, pairs), queue=queue("load"))
            if tail % pairs:
                nisa.dma_copy(st[n2:n2 + 1, nfull * pairs, :], v[b, rt + n2 * pairs:rt + n2 * pairs + 1],
                              queue=queue("load"))
            head["vstage"].append((g0, nfull, tail, st))
            head["vl"] = g1

    def need_v(head, cols):  # [V | 1] groups of keys [0, cols): the staged rows copied in
        vaug = head["vaug"]
        while head["vstage"] and head["vstage"][0][0] * gsize < cols:
            g0, nfull, tail, st = head["vstage"].pop(0)
            if nfull:
                nisa.tensor_copy(vaug[:, g0 * pairs:(g0 + nfull) * pairs, :d], st[:, : nfull * pairs, :], engine=_V)
            for e in range(pairs):
                n = nl.cdiv(tail - e, pairs) if tail > e else 0
                if n:
                    nisa.tensor_copy(vaug[:n, (g0 + nfull) * pairs + e, :d], st[:n, nfull * pairs + e, :], engine=_V)

    def need_kt(head, cols):  # K^T columns [0, cols): the staged key tiles through TensorE
        while head["kstage"] and head["kstage"][0][0] < cols:
            c0, c1, kst = head["kstage"].pop(0)
            if c0 >= ao_keys:
                _transpose_rows(head["kT"][:, c0:c1], kst, c1 - c0, engines)
                continue
            # any order: slot r = g * pairs + e of partition i is key column g * gsize + i * pairs + e
            per = max(1, nl.tile_size.psum_bank_fmax * 4 // (gsize * dt.itemsize))  # groups per PSUM bank
            for g0 in range(c0 // gsize, c1 // gsize, per):
                g1 = min(c1 // gsize, g0 + per)
                tp = nl.ndarray((d, per * gsize), dt, buffer=nl.psum, name="kT_psum")
                for g in range(g0, g1):
                    for e in range(pairs):
                        r = (g - c0 // gsize) * pairs + e
                        nisa.nc_transpose(tp[:, (g - g0) * gsize + e:(g - g0 + 1) * gsize:pairs], kst[:, r, :])
                _copy(head["kT"][:, g0 * gsize:g1 * gsize], tp[:, : (g1 - g0) * gsize], engines())

    def head_pre(t):  # a batch-head's first keys, well ahead of its first job
        job = jobs[t]
        if job["b_first"]:
            if t == 0:
                q_dma(0)  # the first query tile goes ahead of the bulk loads
            new_head(job["t"]["b"])
            load_kv(job["t"]["b"], min(skv, 2 * chunk), 0)

    def kv_dma(t):  # K^T of the keys this job and the next touch
        job = jobs[t]
        load_kv(job["t"]["b"], min(skv, job["c0"] + job["cw"] + chunk), 0)

    def v_dma(t):  # [V | 1] of this job's keys, in time for its P V
        job = jobs[t]
        load_kv(job["t"]["b"], 0, job["c0"] + job["cw"])

    def v_copy(t):  # the staged V rows into [V | 1]
        job = jobs[t]
        need_v(heads[job["t"]["b"]], job["c0"] + job["cw"])

    def q_dma(t):  # query tiles, qgroup per DMA (transposed by it where the profile can)
        job = jobs[t]
        tile = job["t"]
        b, qi = tile["b"], tile["qi"]
        if job["first"] and (b, qi) not in qtiles:
            g1 = min(nqt, qi + max(1, min(qgroup, qi)))  # groups of 1, 1, 2, 4, ...: the first tiles gate the start
            r0, r1 = qi * pmax, min(sq, g1 * pmax)
            if use_dma:
                qt = nl.ndarray((d, qgroup * pmax), dt, name="qT")
                nisa.dma_transpose(qt[:, : r1 - r0], q[b, r0:r1, :], queue=queue("load"))
                for j in range(qi, g1):
                    qtiles[(b, j)] = qt[:, (j - qi) * pmax:(j - qi) * pmax + min(pmax, sq - j * pmax)]
            else:
                qnat = nl.ndarray((pmax, qgroup, d), dt, name="qnat")
                _load_rows(qnat, q[b, r0:r1], r1 - r0)
                for j in range(qi, g1):
                    qtiles[(b, j)] = qnat[:, j - qi:j - qi + 1, :]

    def m_dma(t):  # the chunk's mask tile
        job = jobs[t]
        if mask is not None:
            tile = job["t"]
            pq, c0, cw = tile["pq"], job["c0"], job["cw"]
            raw = nl.ndarray((pmax, chunk), mask.dtype, name="mask_raw")
            nisa.dma_copy(raw[:pq, :cw], _mask_rows(mask, tile["b"])[tile["q0"]:tile["q0"] + pq, c0:c0 + cw],
                          queue=queue("load"))
            job["mask_raw"] = raw

    def q_t(t):  # Q^T (scaled by the sign of scale); the mask divided by s_eff (GpSimd)
        job = jobs[t]
        tile = job["t"]
        if job["first"]:
            src = qtiles.pop((tile["b"], tile["qi"]))
            if use_dma:
                if qmul is not None:
                    nisa.tensor_scalar(src, src, Alu.multiply, qmul, engine=_G)
                tile["qT"] = src
            else:
                qt = nl.ndarray((d, pmax), dt, name="qT")
                _transpose_rows(qt[:, : tile["pq"]], src, tile["pq"], engines, mul=qmul)
                tile["qT"] = qt[:, : tile["pq"]]
        if mask is not None:
            pq, cw = tile["pq"], job["cw"]
            raw = job.pop("mask_raw")  # divided by s_eff, in place when it is float32 already
            mk = raw if mask.dtype == nl.float32 else nl.ndarray((pmax, chunk), nl.float32, name="mask")
            nisa.tensor_scalar(mk[:pq, :cw], raw[:pq, :cw], Alu.multiply, 1.0 / s_eff, engine=_G)
            job["mask"] = mk

    # per score tile i of a job (stages "qk:i", "bias:i", "vmax:i", "smax:i", "exp:i"): a tile's PSUM bank is taken by
    # its matmul and freed by its exp, so the next chunk's scores start as soon as banks free up
    def qk(t, i):  # S = Q K^T into PSUM: one bank (512 columns) per tile
        job = jobs[t]
        tile = job["t"]
        pq, c0, cw = tile["pq"], job["c0"], job["cw"]
        s0 = i * mm_n
        if s0 >= cw:
            return
        head = heads[tile["b"]]
        if i == 0:
            need_kt(head, c0 + cw)
            job["s"] = {}
            get_mx(job)
        s1 = min(cw, s0 + mm_n)
        s = nl.ndarray((pmax, mm_n), nl.float32, buffer=nl.psum, name="scores")
        nisa.nc_matmul(s[:pq, : s1 - s0], tile["qT"], head["kT"][:, c0 + s0:c0 + s1], accumulate=False)
        job["s"][i] = (s0, s1, s)

    def bias(t, i):  # VectorE, in PSUM: -inf selected above the causal diagonal; the mask added
        job = jobs[t]
        if i not in job.get("s", {}):
            return
        tile = job["t"]
        pq, q0, c0 = tile["pq"], tile["q0"], job["c0"]
        s0, s1, s = job["s"][i]
        if diag is not None:
            d0, d1 = max(q0, c0 + s0), min(q0 + pq, c0 + s1)
            if d0 < d1:
                blk = s[:pq, d0 - c0 - s0:d1 - c0 - s0]
                nisa.select(blk, diag[:pq, d0 - q0:d1 - q0], blk, _NEG_INF)
        if mask is not None:
            nisa.tensor_tensor(s[:pq, : s1 - s0], s[:pq, : s1 - s0], job["mask"][:pq, s0:s1], Alu.add)

    def get_mx(job):  # [pmax, 2 nsc + 1] row maxima: VectorE's per tile, the running max, GpSimd's per tile
        if "mx" not in job:
            nsc = job["nsc"]
            job["mx"] = nl.ndarray((pmax, 2 * nsc + 1), nl.float32, name="rowmax")
            job["ncol"] = nsc + 1
            if job["first"]:
                nisa.memset(job["mx"][: job["t"]["pq"], nsc:nsc + 1], max_floor(s_eff), engine=_G)
        return job["mx"]

    def split(w):  # columns of a score tile whose max VectorE takes
        return w if w < 2 * pmax else min(w, int(round(w * MAX_ON_VECTOR / 32)) * 32)

    def vmax(t, i):  # VectorE: the row max of the first columns of a score tile
        job = jobs[t]
        if i not in job.get("s", {}):
            return
        s0, s1, s = job["s"][i]
        pq = job["t"]["pq"]
        nisa.tensor_reduce(job["mx"][:pq, i:i + 1], s[:pq, : split(s1 - s0)], Alu.max, axis=1)

    def smax(t, i):  # the other columns: ScalarE copies them to SBUF, GpSimd takes their max
        job = jobs[t]
        if i not in job.get("s", {}):
            return
        s0, s1, s = job["s"][i]
        pq, nsc = job["t"]["pq"], job["nsc"]
        w = s1 - s0
        wv = split(w)
        if wv < w:
            scr = nl.ndarray((pmax, w - wv), nl.float32, name="scores_sb")
            _copy(scr[:pq], s[:pq, wv:w], _S)
            nisa.tensor_reduce(job["mx"][:pq, nsc + 1 + i:nsc + 2 + i], scr[:pq], Alu.max, axis=1, engine=_G)
            job["ncol"] = nsc + 2 + i
            job.setdefault("scr", {})[i] = (wv, scr)

    def negmax(t):  # GpSimd: m = max(m_old, the chunk's row max), written where the next chunk's max looks for it
        job = jobs[t]
        pq, nsc = job["t"]["pq"], job["nsc"]
        mx = job.pop("mx")
        if job["last"]:
            m = nl.ndarray((pmax, 1), nl.float32, name="runmax")[:pq]
        else:
            nxt = jobs[job["next"]]
            m = get_mx(nxt)[:pq, nxt["nsc"]:nxt["nsc"] + 1]
        nisa.tensor_reduce(m, mx[:pq, : job["ncol"]], Alu.max, axis=1, engine=_G)
        job["m"] = m
        if not job["first"]:
            job["m_old"] = mx[:pq, nsc:nsc + 1]

    def expo(t, i):  # ScalarE: nb = -s_eff m, P = exp(s_eff * S + nb) per score tile, alpha = exp(s_eff m_old + nb)
        job = jobs[t]
        if i not in job.get("s", {}):
            return
        pq = job["t"]["pq"]
        if i == 0:  # the tile's last chunk keeps its bias for the logsumexp
            qi = job["t"]["qi"]
            nb = (heads[job["t"]["b"]]["nbs"][:, qi:qi + 1] if job["last"] else
                  nl.ndarray((pmax, 1), nl.float32, name="negmax"))
            nisa.activation(nb[:pq], Act.identity, job["m"], scale=-s_eff)
            job["t"]["nb"] = job["nb"] = nb
            job["p"] = nl.ndarray((pmax, chunk), dt, name="probs")
        s0, s1, s = job["s"].pop(i)
        wv, scr = job.get("scr", {}).pop(i, (s1 - s0, None))
        if scr is not None and gexp_base is None:  # ScalarE takes the copied columns too
            wv = s1 - s0
        nisa.activation(job["p"][:pq, s0:s0 + wv], Act.exp, s[:pq, :wv], bias=job["nb"][:pq], scale=s_eff)
        if wv < s1 - s0:  # GpSimd: the copied columns as base ** (S - m), base = e^s_eff (= exp(s_eff (S - m)))
            nisa.tensor_scalar(job["p"][:pq, s0 + wv:s1], scr[:pq], Alu.subtract, job["m"], op1=Alu.pow,
                               operand1=gexp_base, reverse1=True, engine=_G)
        if i == 0 and not job["first"]:  # after the first tile, so it does not directly follow nb
            alpha = nl.ndarray((pmax, 1), nl.float32, name="alpha")
            nisa.activation(alpha[:pq], Act.exp, job.pop("m_old"), bias=job["nb"][:pq], scale=s_eff)
            job["alpha"] = alpha

    def dma_t(t):  # P^T of the DMA groups: one SBUF->SBUF DMA transpose per group (16-bit: of key pairs)
        job = jobs[t]
        pq, segs = job["t"]["pq"], job["dma_segs"]
        if not segs:
            return
        pd = nl.ndarray((pmax, len(segs), pmax * pairs), dt, name="pT_dma")
        for j, (gc, w, _) in enumerate(segs):
            dst, src = pd[:, j, : pq * pairs], job["p"][:pq, gc:gc + w]
            if pairs > 1:
                dst, src = _wide(dst), _wide(src)
            nisa.dma_transpose(dst, src, queue=queue("p"))
        job["pd"] = pd

    def transpose(t):  # P^T of the other groups through TensorE (pair slot e: keys e, e + pairs, ...)
        job = jobs[t]
        pq, units = job["t"]["pq"], job["te_units"]
        job["pt_psum"] = []
        for u0 in range(0, len(units), per_bank):
            grp = units[u0:u0 + per_bank]
            pt = nl.ndarray((pmax, len(grp), pmax), dt, buffer=nl.psum, name="pT")
            for j, ((gc, w, _), e, n) in enumerate(grp):
                nisa.nc_transpose(pt[:n, j, :pq], job["p"][:pq, gc + e:gc + w:pairs])
            job["pt_psum"].append((u0, grp, pt))

    def copy(t):  # the TensorE P^T tiles to SBUF, by VectorE and ScalarE
        job = jobs[t]
        pq = job["t"]["pq"]
        units = job["te_units"]
        if not units:
            return
        ps = nl.ndarray((pmax, len(units), pmax), dt, name="pT_sb")
        for u0, grp, pt in job.pop("pt_psum"):
            full = sum(1 for _, _, n in grp if n == pmax)  # full tiles come first (only a chunk's last group is short)
            share[0] += full * cov  # error diffusion: VectorE takes this share of the tiles overall
            nv = min(full, max(0, round(share[0])))
            share[0] -= nv
            if nv:
                nisa.tensor_copy(ps[:, u0:u0 + nv, :pq], pt[:, :nv, :pq], engine=_V)
            if full > nv:
                _copy(ps[:, u0 + nv:u0 + full, :pq], pt[:, nv:full, :pq], _S)
            for j in range(full, len(grp)):
                n = grp[j][2]
                nisa.tensor_copy(ps[:n, u0 + j, :pq], pt[:n, j, :pq], engine=_V)
        job["pT"] = ps

    def pv(t):  # O = alpha * O + P [V | 1]: the last column accumulates the row sums
        job = jobs[t]
        tile = job["t"]
        pq = tile["pq"]
        vaug = heads[tile["b"]]["vaug"]
        if job["first"]:
            tile["o"] = nl.ndarray((pmax, d + 1), nl.float32, buffer=nl.psum, name="acc")
        o = tile["o"][:pq]
        mms = []
        if job["te_units"]:
            ps = job.pop("pT")
            mms += [(ps[:n, j, :pq], vaug[:n, g * pairs + e, :]) for j, ((_, _, g), e, n) in enumerate(job["te_units"])]
        if job["dma_segs"]:
            pd = job.pop("pd")
            mms += [(pd[:, j, e:pq * pairs:pairs], vaug[:, g * pairs + e, :])
                    for j, (_, _, g) in enumerate(job["dma_segs"]) for e in range(pairs)]
        for i, (st, mv) in enumerate(mms):
            nisa.nc_matmul(o, st, mv, accumulate=not (job["first"] and i == 0))
        del job["p"]

    def rescale(t):  # O *= alpha, after the previous chunk's PV and before this chunk's
        job = jobs[t]
        if not job["first"]:
            o = job["t"]["o"][:job["t"]["pq"]]
            nisa.activation(o, Act.identity, o, scale=job.pop("alpha")[:job["t"]["pq"]])

    def fin(t):  # out = O / l; the head's logsumexps log(l) - nb at its end, their columns turned into rows
        job = jobs[t]
        tile = job["t"]
        b, pq, qi = tile["b"], tile["pq"], tile["qi"]
        head = heads[b]
        o = tile["o"][:pq]
        if job["last"]:
            res = nl.ndarray((pmax, d), dt, name="res")
            nisa.tensor_scalar(o[:, d:d + 1], o[:, d:d + 1], Alu.max, _TINY)  # an all -inf row: 0 / tiny = 0
            nisa.tensor_scalar(res[:pq], o[:, :d], Alu.divide, o[:, d:d + 1])
            nisa.dma_copy(out[b, tile["q0"]:tile["q0"] + pq, :], res[:pq], queue=queue("store"))
            nisa.tensor_copy(head["lsum"][:pq, qi:qi + 1], o[:, d:d + 1], engine=_V)
        if job["b_last"]:  # one log for the head (ScalarE's stream stays free for the exps)
            lcol = head["lsum"]
            nisa.activation(lcol, Act.log, lcol)
            nisa.tensor_tensor(lcol, lcol, head["nbs"], Alu.subtract, engine=_G)
            for g0 in range(0, nqt, pmax):
                g1 = min(nqt, g0 + pmax)
                tp = nl.ndarray((g1 - g0, pmax), nl.float32, buffer=nl.psum, name="lseT")
                nisa.nc_transpose(tp, lcol[:, g0:g1])
                rows = nl.ndarray((g1 - g0, pmax), nl.float32, name="lse_rows")
                nisa.tensor_copy(rows, tp, engine=_V)
                nfull = min(g1, sq // pmax) - g0
                if nfull > 0:
                    nisa.dma_copy(lse[b, g0 * pmax:(g0 + nfull) * pmax].reshape(nfull, pmax), rows[:nfull])
                if g0 + nfull < g1:
                    rem = sq - (g0 + nfull) * pmax
                    nisa.dma_copy(lse[b, (g0 + nfull) * pmax:sq].reshape(1, rem), rows[nfull:nfull + 1, :rem])
            del heads[b]

    tiled = ("qk", "bias", "vmax", "smax", "exp")  # stages per score tile
    fns = {"head_pre": head_pre, "kv_dma": kv_dma, "v_dma": v_dma, "v_copy": v_copy, "q_dma": q_dma, "m_dma": m_dma,
           "q_t": q_t,
           "negmax": negmax,
           "dma_t": dma_t, "transpose": transpose, "copy": copy, "rescale": rescale, "pv": pv, "fin": fin}
    preds = {"head_pre": (), "kv_dma": ("head_pre",), "v_dma": ("kv_dma",), "v_copy": ("v_dma",), "q_dma": (),
             "m_dma": (), "q_t": ("q_dma", "m_dma"),
             "negmax": (),
             "dma_t": (), "transpose": (), "copy": ("transpose",), "rescale": (),
             "pv": ("copy", "dma_t", "rescale", "v_copy"),
             "fin": ("pv",)}
    nst = nl.cdiv(chunk, mm_n)
    for i in range(nst):
        for name, f in (("qk", qk), ("bias", bias), ("vmax", vmax), ("smax", smax), ("exp", expo)):
            fns[f"{name}:{i}"] = (lambda f_, i_: lambda t: f_(t, i_))(f, i)
        preds[f"qk:{i}"] = ("kv_dma", "q_t") + ((f"qk:{i - 1}",) if i else ())
        preds[f"bias:{i}"] = (f"qk:{i}",)
        preds[f"vmax:{i}"] = (f"bias:{i}",)
        preds[f"smax:{i}"] = (f"vmax:{i}",)
        preds[f"exp:{i}"] = ("negmax",) + ((f"exp:{i - 1}",) if i else ())
    preds["negmax"] = tuple(f"smax:{i}" for i in range(nst))
    for name in ("dma_t", "transpose", "rescale"):
        preds[name] = (f"exp:{nst - 1}",)
    stages = []
    for off, name in FWD_SCHEDULE:
        if name in tiled:
            stages += [(f"{name}:{i}", off + i * TILE_STEP, fns[f"{name}:{i}"], preds[f"{name}:{i}"])
                       for i in range(nst)]
        else:
            stages.append((name, off, fns[name], preds[name]))
    first_of_head, fin_after, last_fin = {}, {}, {}
    for t, job in enumerate(jobs):
        first_of_head.setdefault(job["t"]["b"], t)
        if job["last"]:  # tiles finish in job order; the head's last job finishes last
            b = job["t"]["b"]
            if b in last_fin:
                fin_after[t] = last_fin[b]
            last_fin[b] = t

    def after(t, name):  # order the state that flows between jobs (budgets may hold an item back)
        job, prev = jobs[t], t - 1
        if name == "head_pre" and job["b_first"] and t and not overlap_heads:
            return ((prev, "fin"),)
        if name == "kv_dma":  # the head exists
            return ((first_of_head[job["t"]["b"]], "head_pre"),)
        if name == "qk:0" and t:  # key chunks (K^T transposes, the running max) in job order
            return ((prev, f"qk:{nst - 1}"),)
        if name in ("negmax", "rescale") and not job["first"]:  # running max; O rescaled between PVs
            return ((job["prev"], "negmax" if name == "negmax" else "pv"),)
        if name == "fin" and job["last"] and t in fin_after:
            return ((fin_after[t], "fin"),)  # the previous tile's: logsumexp columns complete at the head's end
        return ()

    def usage(t, name):  # PSUM banks: score tiles and P^T tiles; accumulators
        job = jobs[t]
        if name.startswith(("qk:", "exp:")):
            has = int(name.split(":")[1]) < job["nsc"]
            return {"banks": 1 if name.startswith("qk") else -1} if has else {}
        return {"transpose": {"banks": job["npt"]}, "copy": {"banks": -job["npt"]},
                "pv": {"acc": 1} if job["first"] else {}, "fin": {"acc": -1} if job["last"] else {}}.get(name, {})

    # every job counts as a full one: short (causal) chunks are latency-bound, not faster to pipeline
    _pipeline([1.0] * len(jobs), stages, after, usage, PSUM_BUDGET)
    return (out, lse) if new_out else lse


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
                        resident=None, layouts=None, dq=None, dk=None, dv=None):
    """Gradients of flash_attention_fwd -> (dq, dk, dv) in q's dtype (FlashAttention-2).

    Recomputes P = exp(scale * q k^T + mask - logsumexp) per (key block, query tile); fp32 accumulation.
    ``resident``: keep a batch-head's Q, dO, O and Q^T, dO^T in SBUF (None: when a quarter of SBUF holds them;
    False: load and transpose each job's tiles, for any sequence length). ``layouts``: as the forward's, for
    grad_out, q, k, v and out, and for ``dq``, ``dk``, ``dv`` given as the storage to write them into (those are
    then not returned).
    """
    (grad_out, q, k, v, out), (bh, sq, skv, d) = _bwd_inputs("flash_attention_bwd", grad_out, q, k, v, out,
                                                             logsumexp, mask, causal, layouts)
    dt = q.dtype
    pmax = nl.tile_size.pmax
    mm_n = nl.tile_size.gemm_moving_fmax
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s_eff, qmul = (sc, None) if sc != 0 else (1.0, 0.0)  # scale 0: scores are 0 (q zeroed for them)
    # keys per block: one PSUM bank of scores, no wider than the keys there are (a block's K^T and V^T tiles are
    # allocated whole: 512-key tiles for 12 keys overflowed SBUF with ~100 small heads in flight)
    blk = max(pmax, min(int(kv_block), mm_n, nl.cdiv(skv, pmax) * pmax) // pmax * pmax)
    nqt = nl.cdiv(sq, pmax)
    kpb = blk // pmax  # key tiles per block
    any_order = not causal and mask is None  # keys of a block in any order shared by K, V, dK, dV (see forward)
    # query tiles per load; at most pmax: the logsumexp rows of a load sit one tile per partition (tiny D)
    qgroup = max(1, min(pmax, 2048 // (d * dt.itemsize)))
    # Q, dO, O (queries on partitions) and Q^T, dO^T stay resident per batch-head when a quarter of SBUF holds
    # them; longer sequences stream each job's tiles (more DMA and TensorE transposes, any length)
    sbuf = nl.tile_size.sbuf_size_bytes
    if resident is None:
        resident = nqt * (3 * d + 2 * pmax) * dt.itemsize <= sbuf // 4
    head_bytes = nqt * (d + 2) * 4 + (nqt * (3 * d + 2 * pmax) * dt.itemsize if resident else 0)
    overlap_heads = 2 * head_bytes <= sbuf // 2  # else a head starts once the previous one is done

    (dq, new_dq), (dk, new_dk), (dv, new_dv) = (_result(x, name, layouts, (bh, rows, d), dt) for x, name, rows in
                                                ((dq, "dq", sq), (dk, "dk", skv), (dv, "dv", skv)))
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
    return tuple(g for g, new in ((dq, new_dq), (dk, new_dk), (dv, new_dv)) if new)
