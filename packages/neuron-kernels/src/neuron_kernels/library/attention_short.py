"""Scaled-dot-product attention for sequences of one tile: many small heads per DMA.

The contract of ``flash_attention_fwd`` / ``flash_attention_bwd`` (attention.py: q, k, v, out, grad_out as
[BH, S, D] or as storage with ``layouts``; scale of any sign, top-left ``causal``, an additive float mask; the
float32 logsumexp of the scaled, masked scores, so either kernel's forward feeds either backward; rows whose
scores are all -inf give zeros), restricted to Sq <= pmax and Skv <= pmax queries and keys (and D <= pmax).

Why: with short sequences the flash kernels are bound by DMA *instructions* (every DMA costs the descriptor
generator ~600 ns whatever it moves), and they issue several per batch-head. Here one DMA moves an operand of a
whole *unit* of batch-heads: a tile [S, n, D] whose partition s holds row s of every head of the unit (n runs of D
elements per partition, or one run where the heads sit side by side in a [B, S, H * D] projection). Outputs
leave the same way, and the logsumexp of up to pmax batch-heads goes out in one DMA (rows after a TensorE
transpose).

Compute goes by *groups* of heads of a unit, sized so each PSUM tile of a group is one bank. TensorE transposes
Q, K (forward; backward also dO, V) into one PSUM tile copied out at once, pmax // D heads per transpose where the
ISA lets D-partition operands start at every multiple of D (_Transposed); S = Q K^T per head into a score tile
[Sq, g, Skv] (fp32). The causal mask (VectorE, S or -inf by a select, so a future key's +inf or NaN score never
meets an added -inf) or a mask (VectorE, scale * S + mask) goes into
SBUF for the whole group, where GpSimd takes every head's row maxima in one reduce (without either VectorE
reduces straight from PSUM); ScalarE exponentiates per head (its bias is a per-partition column) with the row
sums accumulated on the way; TensorE transposes P; O = P V; one VectorE divide normalizes the group straight into
the unit's output tile. The backward (FlashAttention-2 with the logsumexp) recomputes P with the -logsumexp as
the exp's bias (causal: GpSimd zeroes P above the diagonal with one affine_select per group), dS = P * (dP -
rowsum(dO * O)) as two wide instructions (VectorE, GpSimd), dV = P^T dO and dK = dS^T Q need no transpose (queries
on partitions), dQ = dS K after a TensorE transpose of dS.

Performance (trn2 simulator, bf16, causal, B=8, H=4, S=64, D=32 as the small GPT's heads come out of its qkv
projection): forward 13.0 us and 17 DMAs (flash_attention_fwd 50.4 us, 160 DMAs), backward 16.4 us and 33 DMAs
(flash_attention_bwd 87.8 us, 288 DMAs). The remaining DMAs still cost ~1/3 of the backward's time at the
descriptor generators; the rest is each group's dependency chain across the engines, overlapped by the pipeline.

Scheduling: groups are the jobs of attention._pipeline (engines run in program order, so emission order decides
the overlap), under PSUM budgets that keep at most 7 banks live by construction (one stays free for the
logsumexp transposes).
"""

from __future__ import annotations

import math

from neuron_hal import Act, Alu, Engine
from neuron_hal.validate import allowed_starts

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View
from .attention import (
    _TINY,
    _bwd_inputs,
    _causal_keep,
    _check_inputs,
    _copy,
    _Heads,
    _heads_of,
    _mask_rows,
    _pipeline,
    _result,
    max_floor,
)

_V, _S, _G = Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD
_NEG_INF = float("-inf")

# heads per DMA unit at most (SBUF permitting): large units issue fewer DMAs, small ones let the first
# compute start sooner. Tuned on the simulator (trn2, GPT shape B=8, H=4, S=64, D=32).
UNIT_HEADS = 8
GROUP_HEADS = 8  # heads per compute group at most: fewer make shorter per-group latency chains to overlap
UNIT_SBUF_SHARE = 8  # a unit's operand tiles take at most this fraction (1 / n) of a partition's SBUF
# (offset, stage) of the software pipelines (see attention._pipeline), in jobs (groups of heads)
FWD_SCHEDULE = [(-4.5, "load"), (-1.5, "qk_t"), (-1.05, "qk_copy"), (0.0, "s"), (0.3, "bias"), (0.45, "max"),
                (0.75, "exp"), (1.5, "pt"), (1.95, "pt_copy"), (2.7, "pv"), (3.3, "fin"), (3.75, "store")]
FWD_PSUM_BUDGET = {"tp": 2, "s": 2, "pt": 1, "o": 2}
BWD_SCHEDULE = [(-4.5, "load"), (-3.0, "di"), (-1.5, "tr"), (-1.05, "tr_copy"), (0.0, "mm1"), (0.45, "exp"),
                (0.9, "ds"), (1.5, "mm2"), (1.5, "dst"), (1.95, "dst_copy"), (2.4, "mm3"), (3.0, "fin"),
                (3.75, "store")]
BWD_PSUM_BUDGET = {"tr": 1, "sdp": 2, "dsT": 1, "kv": 2, "dq": 1}


def _pow2(n: int) -> int:
    """The power of two >= n: PSUM slices of that size never straddle a bank."""
    return 1 << max(0, n - 1).bit_length()


def _heads_transposed(x: View, g: int, shape, sq: int, skv: int, dt, name: str) -> View:
    """[sq, g, skv] per-head tiles transposed by TensorE into a PSUM tile [skv, g, sq] (of ``shape``)."""
    ps = nl.ndarray(shape, dt, buffer=nl.psum, name=f"{name}_psum")
    for i in range(g):
        nisa.nc_transpose(ps[:skv, i, :sq], x[:sq, i, :])
    return ps


def _heads_product(xt: View, y: View, j0: int, g: int, shape, sq: int, skv: int, d: int, name: str) -> View:
    """Per head i < g: xt[:skv, i, :sq]^T @ y[:skv, j0 + i, :d] into a float32 PSUM tile [sq, g, d] (of ``shape``)."""
    ps = nl.ndarray(shape, nl.float32, buffer=nl.psum, name=name)
    for i in range(g):
        nisa.nc_matmul(ps[:sq, i, :d], xt[:skv, i, :sq], y[:skv, j0 + i, :], accumulate=False)
    return ps


def _check_short(name: str, sq: int, skv: int) -> None:
    pmax = nl.tile_size.pmax
    for what, n in (("Sq", sq), ("Skv", skv)):
        if n > pmax:
            raise KernelError(f"{name}: {what}={n} > {pmax}: the short-sequence kernels hold a sequence in one tile "
                              "(use flash_attention for longer ones)")


def _unit_view(x: _Heads, u0: int, u1: int) -> list[tuple[int, int, View]]:
    """Batch-heads [u0, u1) of x as [S, n, D] HBM views (row s: row s of each head), as few as x's layout allows:
    one where the range lies in one batch element or covers whole ones, else one per batch element."""
    (nb, bs), (nh, hs), (s, ss), (d, ds) = x.view.dims
    owner, off, dt = x.view.owner, x.view.offset, x.view.dtype
    if u0 // nh == (u1 - 1) // nh or (u0 % nh == 0 and u1 % nh == 0):
        b, h = divmod(u0, nh)
        if u1 - u0 <= nh and u0 // nh == (u1 - 1) // nh:
            dims = ((s, ss), (u1 - u0, hs), (d, ds))
        else:
            dims = ((s, ss), ((u1 - u0) // nh, bs), (nh, hs), (d, ds))
        return [(u0, u1, type(x.view)(owner, dt, off + b * bs + h * hs, dims))]
    cut = (u0 // nh + 1) * nh
    return _unit_view(x, u0, cut) + _unit_view(x, cut, u1)


def _load(tile: View, x: _Heads, u0: int, u1: int, rows: int, cols: int) -> None:
    """tile[:rows, j, :cols] = batch-head u0 + j of x (rows x cols)."""
    for a, b, src in _unit_view(x, u0, u1):
        nisa.dma_copy(tile[:rows, a - u0:b - u0, :cols], src)


def _store(x: _Heads, tile: View, u0: int, u1: int, rows: int, cols: int) -> None:
    for a, b, dst in _unit_view(x, u0, u1):
        nisa.dma_copy(dst, tile[:rows, a - u0:b - u0, :cols])


def _as_heads(x) -> _Heads:
    return x if isinstance(x, _Heads) else _Heads(x.reshape(1, *x.shape))


def _plan(bh: int, heads: int, per_head_sbuf: int, group: int) -> list[dict]:
    """Jobs (groups of heads) of units of batch-heads: a unit is one DMA per operand; units stay inside a
    logsumexp block of pmax batch-heads and either inside one batch element or over whole ones."""
    pmax = nl.tile_size.pmax
    cap = max(1, min(UNIT_HEADS, pmax, nl.tile_size.sbuf_size_bytes // UNIT_SBUF_SHARE // per_head_sbuf))
    if heads <= cap:
        n = cap // heads * heads  # whole batch elements
    else:
        n = max(d for d in range(1, cap + 1) if heads % d == 0)  # equal parts of one batch element
    units, u0 = [], 0
    while u0 < bh:
        u1 = min(bh, u0 + n, (u0 // pmax + 1) * pmax)
        units.append((u0, u1))
        u0 = u1
    jobs = []
    for u0, u1 in units:
        unit = {"u0": u0, "u1": u1, "n": u1 - u0}
        for j0 in range(0, u1 - u0, group):
            jobs.append({"unit": unit, "j0": j0, "g": min(group, u1 - u0 - j0), "first": j0 == 0,
                         "last": j0 + group >= u1 - u0})
    for t, job in enumerate(jobs):
        b0 = job["unit"]["u0"] // pmax * pmax
        job["blk0"] = b0
        job["blk_first"] = t == 0 or jobs[t - 1]["unit"]["u0"] < b0
        job["blk_last"] = t == len(jobs) - 1 or jobs[t + 1]["unit"]["u0"] >= b0 + pmax
    return jobs


def _in_order(names):
    """``after`` for _pipeline: the stages ``names`` of consecutive jobs go in job order."""
    return lambda t, name: ((t - 1, name),) if t and name in names else ()


def _bias_tiles(mask, causal, sq, skv):
    """What every head shares, as [pmax, 1, Skv]: causal, the keys a query sees (1 where key j <= query p, else 0:
    a select predicate); else a [Sq, Skv] additive mask."""
    pmax = nl.tile_size.pmax
    if causal:
        return _causal_keep((pmax, 1, skv), (0, -1))
    if mask is not None and (len(mask.shape) == 2 or mask.shape[0] == 1):
        shared = nl.ndarray((pmax, 1, skv), mask.dtype, name="mask")
        nisa.dma_copy(shared[:sq, 0, :], _mask_rows(mask, 0))
        return shared
    return None


def _group_bias(job, shared, mask, sq, skv):
    """[Sq, g, Skv] view of the bias of a job's heads (None without causal / mask)."""
    g = job["g"]
    if shared is not None:
        return shared[:sq, :, :].broadcast_to((sq, g, skv))
    if mask is not None:
        return job["unit"]["mask"][:sq, job["j0"]:job["j0"] + g, :]
    return None


def _load_mask(unit, mask, sq, skv) -> None:
    """A unit's rows of a [BH, Sq, Skv] mask as [Sq, n, Skv] (one DMA)."""
    pmax = nl.tile_size.pmax
    u0, n = unit["u0"], unit["n"]
    mt = nl.ndarray((pmax, n, skv), mask.dtype, name="mask_rows")
    (_, r), (_, c), (_, e) = mask.dims
    src = type(mask)(mask.owner, mask.dtype, mask.offset + u0 * r, ((sq, c), (n, r), (skv, e)))
    nisa.dma_copy(mt[:sq], src)
    unit["mask"] = mt


class _Transposed:
    """Operands with D on partitions (Q^T, K^T, ...) of a group's heads, ``slots`` of them, in one PSUM tile that
    one copy per engine moves to SBUF. Where the ISA lets a D-partition operand start at every multiple of D
    (D = 32, 64 on trn2) one TensorE transpose takes ``pack`` = pmax // D heads at once ([S, pack * D] ->
    [pack * D, S], a quarter of the copy's elements per partition for D = 32); else one transpose per head.
    Head i sits at partition (i % pack) * D of column block i // pack."""

    def __init__(self, d: int, group: int, slots: int, cols: int, dt):
        pmax = nl.tile_size.pmax
        fits = all(h * d in allowed_starts(d) for h in range(pmax // d))
        self.d, self.pack, self.dt = d, pmax // d if fits else 1, dt
        self.shape = (pmax, slots, nl.cdiv(group, self.pack), cols)

    @staticmethod
    def group_limit(d: int, slots: int, cols: int, dt, bank: int) -> int:
        """Heads per group whose transposes fit one PSUM bank."""
        return _Transposed(d, 1, slots, cols, dt).pack * max(1, bank // (slots * cols * dt.itemsize))

    def transpose(self, rows_of, j0: int, g: int) -> View:
        """A PSUM tile whose slot k holds the transposes of heads j0 .. j0 + g - 1 of rows_of[k] = (tile, rows)."""
        tp = nl.ndarray(self.shape, self.dt, buffer=nl.psum, name="T_psum")
        for slot, (x, rows) in enumerate(rows_of):
            for blk in range(nl.cdiv(g, self.pack)):
                h0 = blk * self.pack
                hn = min(self.pack, g - h0)
                src = x[:rows, j0 + h0:j0 + h0 + hn, :].reshape(rows, hn * self.d)
                nisa.nc_transpose(tp[:hn * self.d, slot, blk, :rows], src)
        return tp

    def copy(self, dst: View, tp: View, slots: slice, g: int, rows: int, engine, mul=None) -> None:
        """dst = tp (times ``mul``) for ``slots`` of g heads: one instruction for the full blocks, one for a partial."""
        full, rem = divmod(g, self.pack)
        for parts, b0, b1 in ((self.pack * self.d, 0, full), (rem * self.d, full, full + 1)):
            if parts and b1 > b0:
                d_, s_ = dst[:parts, slots, b0:b1, :rows], tp[:parts, slots, b0:b1, :rows]
                if mul is None:
                    _copy(d_, s_, engine)
                else:
                    nisa.tensor_scalar(d_, s_, Alu.multiply, mul, engine=engine)

    def head(self, tt: View, slot: int, i: int, rows: int) -> View:
        """Head i's [D, rows] operand."""
        p0 = (i % self.pack) * self.d
        return tt[p0:p0 + self.d, slot, i // self.pack, :rows]


# -- forward -------------------------------------------------------------------------------------
@kernel
def short_attention_fwd(q, k, v, scale=None, causal=False, mask=None, layouts=None, out=None):
    """softmax(scale * q k^T + mask) v per batch-head -> (out [BH, Sq, D] in q's dtype, logsumexp [BH, Sq] fp32),
    for Sq, Skv <= pmax. Arguments as flash_attention_fwd's (no tunables)."""
    q, k, v = (_heads_of(x, n, layouts) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    bh, sq, skv, d = _check_inputs("short_attention_fwd", q, k, v, mask, causal)
    _check_short("short_attention_fwd", sq, skv)
    q, k, v = _as_heads(q), _as_heads(k), _as_heads(v)
    pmax = nl.tile_size.pmax
    dt = q.dtype
    it = dt.itemsize
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # exp(s_eff * S + nb) with s_eff > 0 keeps "max of S" the max of the scaled scores: fold the sign into q
    s_eff, qmul = (sc, None) if sc > 0 else (-sc, -1.0) if sc < 0 else (1.0, 0.0)
    spad, kpad, qpad, dpad = _pow2(max(sq, skv)), _pow2(skv), _pow2(sq), _pow2(d)
    bank = nl.tile_size.psum_bank_fmax * 4  # bytes per partition of a PSUM bank
    group = max(1, min(GROUP_HEADS, _Transposed.group_limit(d, 2, spad, dt, bank), bank // (kpad * 4),
                       bank // (qpad * it), bank // (dpad * 4)))
    qkT = _Transposed(d, group, 2, spad, dt)
    jobs = _plan(bh, q.heads, 4 * d * it + (skv * mask.dtype.itemsize if mask is not None else 0), group)
    res, new_out = _result(out, "out", layouts, (bh, sq, d), dt)
    out = _as_heads(res)
    lse = nl.ndarray((bh, sq), nl.float32, buffer=nl.hbm, name="lse")
    shared = _bias_tiles(mask, causal, sq, skv)
    blocks = {}

    def load(t):
        job = jobs[t]
        unit = job["unit"]
        if job["blk_first"]:
            blocks[job["blk0"]] = nl.ndarray((pmax, pmax), nl.float32, name="lse_cols")
        if not job["first"]:
            return
        u0, u1, n = unit["u0"], unit["u1"], unit["n"]
        for name, x, rows in (("q", q, sq), ("k", k, skv), ("v", v, skv)):
            unit[name] = nl.ndarray((pmax, n, d), dt, name=f"{name}_rows")
            _load(unit[name], x, u0, u1, rows, d)
        if mask is not None and shared is None:
            _load_mask(unit, mask, sq, skv)
        unit["o"] = nl.ndarray((pmax, n, d), dt, name="out_rows")

    def qk_t(t):  # Q^T and K^T of the group's heads (TensorE) into one PSUM tile
        job = jobs[t]
        unit = job["unit"]
        job["tp"] = qkT.transpose(((unit["q"], sq), (unit["k"], skv)), job["j0"], job["g"])

    def qk_copy(t):  # to SBUF (Q^T times the sign of scale): ScalarE, VectorE
        job = jobs[t]
        g, tp = job["g"], job.pop("tp")
        tt = nl.ndarray(qkT.shape, dt, name="qkT")
        qkT.copy(tt, tp, slice(0, 1), g, sq, _S if qmul is None else _V, qmul)
        qkT.copy(tt, tp, slice(1, 2), g, skv, _V)
        job["qkt"] = tt

    def scores(t):
        job = jobs[t]
        g, tt = job["g"], job.pop("qkt")
        s = nl.ndarray((pmax, group, kpad), nl.float32, buffer=nl.psum, name="scores")
        for i in range(g):
            nisa.nc_matmul(s[:sq, i, :skv], qkT.head(tt, 0, i, sq), qkT.head(tt, 1, i, skv), accumulate=False)
        job["s"] = s

    def bias(t):  # into SBUF (VectorE, the whole group): causal S or -inf, a mask s_eff * S + mask
        job = jobs[t]
        g = job["g"]
        s = job["s"][:sq, :g, :skv]
        job["src"], job["escale"] = s, s_eff
        if not (causal or mask is not None):
            return
        tt = nl.ndarray((pmax, group, skv), nl.float32, name="biased")
        if causal:  # selected, not added: a future key's score may be +inf or NaN (-inf stays -inf when scaled)
            nisa.select(tt[:sq, :g, :], shared[:sq, :, :].broadcast_to((sq, g, skv)), s, _NEG_INF)
        else:
            nisa.scalar_tensor_tensor(tt[:sq, :g, :], s, Alu.multiply, s_eff, Alu.add,
                                      _group_bias(job, shared, mask, sq, skv))
            job["escale"] = 1.0
        job["src"] = tt[:sq, :g, :]

    def rowmax(t):  # every head's row max (from PSUM VectorE, from SBUF GpSimd), negated and scaled (GpSimd)
        job = jobs[t]
        g = job["g"]
        mx = nl.ndarray((pmax, group, 1), nl.float32, name="rowmax")
        nisa.tensor_reduce(mx[:sq, :g, 0], job["src"], Alu.max, axis=2,
                           engine=_V if job["src"].space is nl.psum else _G)
        nb = nl.ndarray((pmax, group, 1), nl.float32, name="negmax")
        nisa.tensor_scalar(nb[:sq, :g, :], mx[:sq, :g, :], Alu.max, max_floor(job["escale"]), op1=Alu.multiply,
                           operand1=-job["escale"], engine=_G)
        job["nb"] = nb

    def expo(t):  # P = exp(escale * src + nb) per head, row sums on the way (ScalarE)
        job = jobs[t]
        g, src, nb = job["g"], job.pop("src"), job["nb"]
        p = nl.ndarray((pmax, group, skv), dt, name="probs")
        rs = nl.ndarray((pmax, group, 1), nl.float32, name="rowsum")
        for i in range(g):
            nisa.activation(p[:sq, i, :], Act.exp, src[:, i, :], bias=nb[:sq, i, :], scale=job["escale"],
                            reduce_res=rs[:sq, i, :])
        del job["s"]
        job.update(p=p, rs=rs)

    def pt(t):  # P^T per head (TensorE)
        jobs[t]["pt_ps"] = _heads_transposed(jobs[t]["p"], jobs[t]["g"], (pmax, group, qpad), sq, skv, dt, "pT")

    def pt_copy(t):
        job = jobs[t]
        ps, g = job.pop("pt_ps"), job["g"]
        ptile = nl.ndarray((pmax, group, qpad), dt, name="pT")
        nisa.tensor_copy(ptile[:skv, :g, :sq], ps[:skv, :g, :sq], engine=_V)
        job["pt"] = ptile
        del job["p"]

    def pv(t):  # O = P V per head into one PSUM tile
        job = jobs[t]
        unit, j0, ptile = job["unit"], job["j0"], job.pop("pt")
        job["o"] = _heads_product(ptile, unit["v"], j0, job["g"], (pmax, group, dpad), sq, skv, d, "o_psum")

    def fin(t):  # out = O / l into the unit's tile (VectorE); logsumexp log(l) - nb into the block's columns
        job = jobs[t]
        unit, j0, g = job["unit"], job["j0"], job["g"]
        rs = job.pop("rs")
        nisa.tensor_scalar(rs[:sq, :g, :], rs[:sq, :g, :], Alu.max, _TINY, engine=_G)  # an all -inf row: 0 / tiny
        nisa.tensor_tensor(unit["o"][:sq, j0:j0 + g, :], job.pop("o")[:sq, :g, :d],
                           rs[:sq, :g, :].broadcast_to((sq, g, d)), Alu.divide)
        c0 = unit["u0"] + j0 - job["blk0"]
        cols = blocks[job["blk0"]][:sq, c0:c0 + g]
        nisa.activation(cols, Act.log, rs[:sq, :g, 0])
        nisa.tensor_tensor(cols, cols, job.pop("nb")[:sq, :g, 0], Alu.subtract, engine=_G)

    def store(t):  # the unit's output (one DMA); a full block's logsumexps as rows (one DMA)
        job = jobs[t]
        unit = job["unit"]
        if job["last"]:
            _store(out, unit.pop("o"), unit["u0"], unit["u1"], sq, d)
            for name in ("q", "k", "v", "mask"):
                unit.pop(name, None)
        if job["blk_last"]:
            b0 = job["blk0"]
            nblk = unit["u1"] - b0
            cols = blocks.pop(b0)
            ps = nl.ndarray((pmax, qpad), nl.float32, buffer=nl.psum, name="lse_psum")
            nisa.nc_transpose(ps[:nblk, :sq], cols[:sq, :nblk])
            rows = nl.ndarray((pmax, qpad), nl.float32, name="lse_rows")
            nisa.tensor_copy(rows[:nblk, :sq], ps[:nblk, :sq], engine=_V)
            nisa.dma_copy(lse[b0:b0 + nblk, :], rows[:nblk, :sq])

    fns = {"load": load, "qk_t": qk_t, "qk_copy": qk_copy, "s": scores, "bias": bias, "max": rowmax, "exp": expo,
           "pt": pt, "pt_copy": pt_copy, "pv": pv, "fin": fin, "store": store}
    names = [name for _, name in FWD_SCHEDULE]
    stages = [(name, off, fns[name], names[i - 1:i]) for i, (off, name) in enumerate(FWD_SCHEDULE)]

    def usage(t, name):
        return {"qk_t": {"tp": 1}, "qk_copy": {"tp": -1}, "s": {"s": 1}, "exp": {"s": -1}, "pt": {"pt": 1},
                "pt_copy": {"pt": -1}, "pv": {"o": 1}, "fin": {"o": -1}}.get(name, {})

    _pipeline([1.0] * len(jobs), stages, _in_order(("load", "fin", "store")), usage, FWD_PSUM_BUDGET)
    return (res, lse) if new_out else lse


# -- backward ------------------------------------------------------------------------------------
@kernel
def short_attention_bwd(grad_out, q, k, v, out, logsumexp, scale=None, causal=False, mask=None, layouts=None,
                        dq=None, dk=None, dv=None):
    """Gradients of the attention forward -> (dq, dk, dv) in q's dtype (FlashAttention-2 with the logsumexp of
    either forward), for Sq, Skv <= pmax. Arguments as flash_attention_bwd's (no kv_block / resident)."""
    (grad_out, q, k, v, out), (bh, sq, skv, d) = _bwd_inputs("short_attention_bwd", grad_out, q, k, v, out,
                                                             logsumexp, mask, causal, layouts)
    _check_short("short_attention_bwd", sq, skv)
    dt = q.dtype
    grad_out, q, k, v, out = (_as_heads(x) for x in (grad_out, q, k, v, out))
    pmax = nl.tile_size.pmax
    it = dt.itemsize
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s_eff, qmul = (sc, None) if sc != 0 else (1.0, 0.0)  # scale 0: scores are 0 (q zeroed for them)
    spad, kpad, qpad, dpad = _pow2(max(sq, skv)), _pow2(skv), _pow2(sq), _pow2(d)
    bank = nl.tile_size.psum_bank_fmax * 4
    group = max(1, min(GROUP_HEADS, _Transposed.group_limit(d, 4, spad, dt, bank), bank // (2 * kpad * 4),
                       bank // (qpad * it), bank // (2 * dpad * 4)))
    ops_t = _Transposed(d, group, 4, spad, dt)
    per_head = 8 * d * it + 4 * d + (skv * mask.dtype.itemsize if mask is not None else 0)
    jobs = _plan(bh, q.heads, per_head, group)
    grads = [_result(x, name, layouts, (bh, rows, d), dt) for x, name, rows in
             ((dq, "dq", sq), (dk, "dk", skv), (dv, "dv", skv))]
    dq, dk, dv = (_as_heads(g) for g, _ in grads)
    shared = _bias_tiles(mask, False, sq, skv)  # causal: P is zeroed above the diagonal instead
    blocks = {}

    def load(t):  # the unit's operands (one DMA each); a block's logsumexps as columns -lse
        job = jobs[t]
        unit = job["unit"]
        if job["blk_first"]:
            b0 = job["blk0"]
            nblk = min(bh, b0 + pmax) - b0
            rows = nl.ndarray((pmax, qpad), nl.float32, name="lse_rows")
            nisa.dma_copy(rows[:nblk, :sq], logsumexp[b0:b0 + nblk, :])
            ps = nl.ndarray((pmax, pmax), nl.float32, buffer=nl.psum, name="lse_psum")
            nisa.nc_transpose(ps[:sq, :nblk], rows[:nblk, :sq])
            nlse = blocks[b0] = nl.ndarray((pmax, pmax, 1), nl.float32, name="neg_lse")
            nisa.tensor_scalar(nlse[:sq, :nblk, 0], ps[:sq, :nblk], Alu.multiply, -1.0)
        if not job["first"]:
            return
        u0, u1, n = unit["u0"], unit["u1"], unit["n"]
        for name, x, rows in (("q", q, sq), ("k", k, skv), ("v", v, skv), ("do", grad_out, sq), ("o", out, sq)):
            unit[name] = nl.ndarray((pmax, n, d), dt, name=f"{name}_rows")
            _load(unit[name], x, u0, u1, rows, d)
        if mask is not None and shared is None:
            _load_mask(unit, mask, sq, skv)
        for name in ("dq", "dk", "dv"):
            unit[name] = nl.ndarray((pmax, n, d), dt, name=f"{name}_rows")

    def di(t):  # -rowsum(dO * O) of every head of the unit (GpSimd)
        job = jobs[t]
        unit = job["unit"]
        if not job["first"]:
            return
        n = unit["n"]
        prod = nl.ndarray((pmax, n, d), nl.float32, name="do_o")
        nisa.tensor_tensor(prod[:sq], unit["do"][:sq], unit.pop("o")[:sq], Alu.multiply, engine=_G)
        ndi = unit["ndi"] = nl.ndarray((pmax, n, 1), nl.float32, name="neg_di")
        nisa.tensor_reduce(ndi[:sq, :, 0], prod[:sq], Alu.add, axis=2, negate=True, engine=_G)

    def tr(t):  # Q^T, K^T, dO^T, V^T of the group's heads (TensorE) into one PSUM tile
        job = jobs[t]
        unit = job["unit"]
        job["tp"] = ops_t.transpose(((unit["q"], sq), (unit["k"], skv), (unit["do"], sq), (unit["v"], skv)),
                                    job["j0"], job["g"])

    def tr_copy(t):  # Q^T, dO^T (ScalarE; Q^T zeroed for scale 0 on VectorE), K^T, V^T (VectorE)
        job = jobs[t]
        g, tp = job["g"], job.pop("tp")
        tt = nl.ndarray(ops_t.shape, dt, name="T")
        if qmul is None:
            ops_t.copy(tt, tp, slice(0, 3, 2), g, sq, _S)
        else:
            ops_t.copy(tt, tp, slice(0, 1), g, sq, _V, qmul)
            ops_t.copy(tt, tp, slice(2, 3), g, sq, _S)
        ops_t.copy(tt, tp, slice(1, 4, 2), g, skv, _V)
        job["tt"] = tt

    def mm1(t):  # S = Q K^T and dP = dO V^T per head (PSUM)
        job = jobs[t]
        tt, h = job.pop("tt"), ops_t.head
        sdp = nl.ndarray((pmax, 2, group, kpad), nl.float32, buffer=nl.psum, name="s_dp")
        for i in range(job["g"]):
            nisa.nc_matmul(sdp[:sq, 0, i, :skv], h(tt, 0, i, sq), h(tt, 1, i, skv), accumulate=False)
            nisa.nc_matmul(sdp[:sq, 1, i, :skv], h(tt, 2, i, sq), h(tt, 3, i, skv), accumulate=False)
        job["sdp"] = sdp

    def expo(t):  # P = exp(s_eff * S + bias - lse): the bias with the scale for the group (VectorE), exp per head
        job = jobs[t]
        unit, j0, g = job["unit"], job["j0"], job["g"]
        src, escale = job["sdp"][:sq, 0, :g, :skv], s_eff
        if mask is not None:
            tt = nl.ndarray((pmax, group, skv), nl.float32, name="biased")
            nisa.scalar_tensor_tensor(tt[:sq, :g, :], src, Alu.multiply, s_eff, Alu.add,
                                      _group_bias(job, shared, mask, sq, skv))
            src, escale = tt[:sq, :g, :], 1.0
        nlse = blocks[job["blk0"]]
        c0 = unit["u0"] + j0 - job["blk0"]
        p = nl.ndarray((pmax, group, skv), dt, name="probs")
        for i in range(g):
            nisa.activation(p[:sq, i, :], Act.exp, src[:, i, :], bias=nlse[:sq, c0 + i, :], scale=escale)
        if causal:  # P = 0 above the diagonal (key j > query p), every head at once (GpSimd)
            nisa.affine_select(p[:sq, :g, :], p[:sq, :g, :], steps=(0, -1), cmp_op=Alu.greater_equal,
                               on_false_value=0.0, channel_multiplier=1)
        job["p"] = p

    def ds(t):  # dS = P * (dP - rowsum(dO * O)): the subtraction on VectorE (from PSUM), the product on GpSimd
        job = jobs[t]
        unit, j0, g = job["unit"], job["j0"], job["g"]
        tmp = nl.ndarray((pmax, group, skv), dt, name="dp_minus_d")
        nisa.tensor_tensor(tmp[:sq, :g, :], job.pop("sdp")[:sq, 1, :g, :skv],
                           unit["ndi"][:sq, j0:j0 + g, :].broadcast_to((sq, g, skv)), Alu.add)
        dsm = nl.ndarray((pmax, group, skv), dt, name="dS")
        nisa.tensor_tensor(dsm[:sq, :g, :], tmp[:sq, :g, :], job["p"][:sq, :g, :], Alu.multiply, engine=_G)
        job["ds"] = dsm

    def mm2(t):  # dV = P^T dO, dK = dS^T Q per head (queries on partitions: no transpose)
        job = jobs[t]
        unit, j0 = job["unit"], job["j0"]
        p, dsm = job.pop("p"), job["ds"]
        kv = nl.ndarray((pmax, 2, group, dpad), nl.float32, buffer=nl.psum, name="dkv_psum")
        for i in range(job["g"]):
            nisa.nc_matmul(kv[:skv, 0, i, :d], p[:sq, i, :], unit["do"][:sq, j0 + i, :], accumulate=False)
            nisa.nc_matmul(kv[:skv, 1, i, :d], dsm[:sq, i, :], unit["q"][:sq, j0 + i, :], accumulate=False)
        job["kv"] = kv

    def dst(t):  # dS^T per head (TensorE)
        jobs[t]["dsT_ps"] = _heads_transposed(jobs[t]["ds"], jobs[t]["g"], (pmax, group, qpad), sq, skv, dt, "dsT")

    def dst_copy(t):
        job = jobs[t]
        g, ps = job["g"], job.pop("dsT_ps")
        sb = nl.ndarray((pmax, group, qpad), dt, name="dsT")
        nisa.tensor_copy(sb[:skv, :g, :sq], ps[:skv, :g, :sq], engine=_V)
        job["dsT"] = sb

    def mm3(t):  # dQ = dS K per head
        job = jobs[t]
        unit, j0, sb = job["unit"], job["j0"], job.pop("dsT")
        job["dq"] = _heads_product(sb, unit["k"], j0, job["g"], (pmax, group, dpad), sq, skv, d, "dq_psum")

    def fin(t):  # dV (ScalarE copy), dK = scale * acc (ScalarE), dQ = scale * acc (VectorE) into the unit's tiles
        job = jobs[t]
        unit, j0, g = job["unit"], job["j0"], job["g"]
        kv, dqp = job.pop("kv"), job.pop("dq")
        hs = slice(j0, j0 + g)
        _copy(unit["dv"][:skv, hs, :], kv[:skv, 0, :g, :d], _S)
        nisa.activation(unit["dk"][:skv, hs, :], Act.identity, kv[:skv, 1, :g, :d], scale=sc)
        nisa.tensor_scalar(unit["dq"][:sq, hs, :], dqp[:sq, :g, :d], Alu.multiply, sc)

    def store(t):  # the unit's gradients (one DMA each)
        job = jobs[t]
        unit = job["unit"]
        if job["last"]:
            for name, x, rows in (("dq", dq, sq), ("dk", dk, skv), ("dv", dv, skv)):
                _store(x, unit.pop(name), unit["u0"], unit["u1"], rows, d)
            for name in ("q", "k", "v", "do", "mask", "ndi"):
                unit.pop(name, None)
        if job["blk_last"]:
            del blocks[job["blk0"]]

    fns = {"load": load, "di": di, "tr": tr, "tr_copy": tr_copy, "mm1": mm1, "exp": expo, "ds": ds, "mm2": mm2,
           "dst": dst, "dst_copy": dst_copy, "mm3": mm3, "fin": fin, "store": store}
    preds = {"load": (), "di": ("load",), "tr": ("load",), "tr_copy": ("tr",), "mm1": ("tr_copy",),
             "exp": ("mm1",), "ds": ("exp", "di"), "mm2": ("ds",), "dst": ("ds",), "dst_copy": ("dst",),
             "mm3": ("dst_copy",), "fin": ("mm2", "mm3"), "store": ("fin",)}
    stages = [(name, off, fns[name], preds[name]) for off, name in BWD_SCHEDULE]

    def usage(t, name):
        return {"tr": {"tr": 1}, "tr_copy": {"tr": -1}, "mm1": {"sdp": 1}, "ds": {"sdp": -1}, "dst": {"dsT": 1},
                "dst_copy": {"dsT": -1}, "mm2": {"kv": 1}, "mm3": {"dq": 1}, "fin": {"kv": -1, "dq": -1}}.get(name, {})

    _pipeline([1.0] * len(jobs), stages, _in_order(("load", "di", "fin", "store")), usage, BWD_PSUM_BUDGET)
    return tuple(g for g, new in grads if new)
