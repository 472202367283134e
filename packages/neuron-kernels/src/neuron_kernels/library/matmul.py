"""The matmul family on TensorE: ``matmul``, ``bmm``, ``addmm``, ``linear`` (torch semantics).

    C = op(a) @ op(b)   a [M, K] (or [K, M] with transpose_a), b [K, N] (or [N, K] with transpose_b)

Any M, N, K (partial tiles, size 1); bfloat16, float16, float8 (e4m3/e4m3fn/e5m2) and float32
inputs (float32 runs at ``matmul_fp32_factor`` x the TensorE cost, as the hardware does); products
accumulate in FP32 in PSUM and the result is written in the input dtype, as torch does.

Layout: TensorE computes ``stationary[K, M].T @ moving[K, N]`` with the contraction K on the 128
partitions, so both operands are needed *K-major* (K rows on partitions, M or N along the free
dim). ``a`` given as [K, M] (``transpose_a=True``) and ``b`` as [K, N] are K-major already and are
loaded with plain row DMAs (every partition reads whole rows: runs of the panel width). ``a`` as
[M, K] and ``b`` as [N, K] (``linear``'s weight) become K-major one of two ways (tunable
``transpose``):

- ``"dma"``: by the DMA engines (``dma_transpose``, NC-v3+, 2- and 4-byte dtypes): one DMA per
  whole K tile of a panel, stored rows [w, 128] -> [128, w] straight into the panel (the DMA moves
  at ``dma_transpose_hbm_fraction`` of a copy, rows of 256 B for bf16). A partial last K tile goes
  the TensorE way below (as a DMA transpose it would write kp < 128 partitions on ceil(kp / 8) DMA
  engines), read as rows of the panel's last 128 columns.
- ``"pe"``: loaded in their own layout (runs of K elements) and turned K-major on TensorE:
  ``nc_transpose`` of each 128x128 block into PSUM (in the input dtype, up to a bank of blocks at a
  time) and one Vector/Scalar copy per bank back to SBUF. The only way on trn1 and for fp8.

The default ``"auto"`` takes whichever :func:`_estimate` (a throughput estimate from the profile:
TensorE work, DMA bytes, runs and issues) finds faster: DMA transposes when TensorE is the
bottleneck (large, square GEMMs: they take the transposes off it), TensorE when the DMA is (skinny
shapes, long K with few rows: one DMA transpose per K tile). No dma_copy here ever transposes
element by element (the simulator charges each contiguous run a descriptor cost, and real DMA
engines crawl on 2-byte runs). A matrix with rows of one element ([K, 1] as a K-major operand,
[M, 1] as an output) is byte-identical to its transpose, so those cases are re-read in that layout
rather than moved one element per partition (a single stored row [1, K] is then one run: TensorE).

Schedule (see ``_plan`` and ``_Gemm``): the operand that needs TensorE transposes (else, when one
operand comes by DMA transposes, the order whose loads cost less, ties streaming the DMA-transposed
one so the cheap resident panel arrives first; else the one whose re-reads cost less DMA) is
*resident*: a panel [K, block] is made K-major once and stays in SBUF
while panels of the other operand stream past it through a ring of ``bufs`` buffers (the reference
``tiled_gemm`` keeps the moving panel resident instead; here the choice follows the transposes).
When both operands need TensorE transposes (``linear`` on plain x, ``"pe"``) and there is more than
one resident block, the streamed one is transposed once into an HBM scratch tensor [K, F] (rows of 512
columns) rather than again for every resident block. Output tiles [128, tile_n] (one PSUM bank)
accumulate over all of K and are copied out (cast; alpha and bias for addmm/linear) by VectorE or
ScalarE, whichever the cost model says is less loaded, and stored on their own DMA queues while
TensorE goes on. Each block's successor panels are loaded one block ahead, their transposes spread
between the current block's matmuls. Every large tile lives in a fixed ring (resident panels x2,
streamed x ``bufs``, background row tiles), sized for the largest panel, so placement never
fragments; panels are split evenly (1030 columns as 344 + 344 + 342, not 512 + 512 + 6) so no DMA
row is short.

Pipeline prologue: the first block's panels are loaded K tile by K tile in the order TensorE
consumes them, both operands interleaved over the load queues, and ``group`` output tiles
accumulate K tile by K tile together. The resident panel of the first block is cut into segments
(one tile, segment-major) matching the groups, so the first group's pieces carry only its own
columns and TensorE starts after ~200 KiB instead of whole panels. Epilogue: the last block runs
tile by tile and its very last tile in 128-column pieces, so the final copy-out and store are
short. When K is too large for a panel pair in SBUF, K is split in chunks and each output tile
accumulates over the chunks in PSUM.

Performance (trn2 cost model, bf16, fraction of TensorE peak): 4096^3 99% with a [K, M], 98.7% with
a [M, K]; 1024^3 84% and 78% (a [M, K] by DMA transposes; on TensorE its transposes were 12.5% of
TensorE's work, 73%; the first DMA's ~2 us latency and the last store's ~2 us bound the rest, and
the first block waits on the DMA, which the transposes make busier); fp32 1024^3 95% of the fp32
rate; linear 4096^3 96%.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from neuron_hal import Act, Alu, DType, Engine

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from ..tensors import View

P = 128  # partitions of a K tile; nl.tile_size.pmax on every profile
LOAD_QUEUES = range(0, 8)
STORE_QUEUES = range(8, 16)
SBUF_BUDGET = 0.86  # fraction of each SBUF partition the planner lets the panels use
RAW_STEPS = (1, 1, 2, 4)  # K tiles per first-block row piece, in order (the last repeats)
TP_BANKS = 2  # PSUM banks for transposes (the rest hold accumulators)
PIECE_BYTES = 1 << 20  # background panel loads are cut into DMAs of about this size (per the whole tile)

TUNABLES = {  # searched exhaustively by the autotuner: 144 configurations
    "order": ("auto", "m_outer", "n_outer"),  # which operand stays resident
    "block": (0, 1024, 512),  # resident panel width (0: the widest that fits SBUF)
    "tile_n": (512, 256),  # moving columns per matmul = PSUM tile width
    "group": (0, 2),  # output tiles accumulated together in the first block (0: as many as PSUM allows)
    "bufs": (0, 2),  # streamed panel ring depth (0: 3 when it fits, else 2)
    # operands stored [F, K]: DMA transposes (where the profile has them) or TensorE; the default "auto" is
    # whichever the throughput estimate (_estimate) prefers, so the search need not try it
    "transpose": ("dma", "pe"),
}
DMA_TRANSPOSE_ITEMSIZES = (2, 4)  # the DMA transposes 2- and 4-byte dtypes (fp8 goes through TensorE)


# ---- shapes and dtypes --------------------------------------------------------------------------
def _check_dtypes(kname: str, a, b) -> DType:
    da, db = a.dtype, b.dtype
    if da != db and not (da.is_fp8 and db.is_fp8):
        raise KernelError(f"{kname}: a is {da} and b is {db}; both operands must have the same dtype "
                          "(torch does not promote inside matmul); cast one first")
    from neuron_hal.dtypes import MATMUL_DTYPES

    if da not in MATMUL_DTYPES or db not in MATMUL_DTYPES:
        raise KernelError(f"{kname}: TensorE multiplies {', '.join(sorted(map(str, MATMUL_DTYPES)))}, "
                          f"not {da if da not in MATMUL_DTYPES else db}")
    return da


def _mk(kname, a, b, ta, tb):
    """(M, K, N) of op(a) @ op(b), checking the contraction."""
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError(f"{kname}: a and b must be 2-D, got {list(a.shape)} and {list(b.shape)}")
    m, ka = (a.shape[1], a.shape[0]) if ta else a.shape
    kb, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if ka != kb:
        raise KernelError(f"{kname}: op(a) is [{m}, {ka}] and op(b) is [{kb}, {n}]: contraction sizes differ")
    if min(m, n, ka) < 1:
        raise KernelError(f"{kname}: empty operand (M={m}, K={ka}, N={n})")
    return m, ka, n


def _view(v: View, offset: int, dims) -> View:
    """A view of the same tensor or tile at element ``offset`` (absolute) with ``dims``."""
    return type(v)(v.owner, v.dtype, offset, tuple(dims))


def _flat2(v: View, rows: int, cols: int) -> View:
    """A contiguous HBM view reinterpreted as [rows, cols] (a [K, 1] column is the [1, K] row)."""
    return _view(v, v.offset, ((rows, cols), (cols, 1)))


# ---- operands -------------------------------------------------------------------------------------
@dataclass
class _Operand:
    """A GEMM operand presented K-major, logical [K, F]; ``view`` as stored: [K, F] or [F, K]."""

    view: View
    kmajor: bool
    K: int
    F: int
    dmat: bool = False  # stored [F, K] but loaded K-major by DMA transposes (no TensorE transposes)

    def __post_init__(self):
        (r, rs), (c, cs) = self.view.dims
        contiguous = cs == 1 and rs == c
        if self.kmajor and self.F == 1 and self.K > 1 and contiguous:
            self.view, self.kmajor = _flat2(self.view, 1, self.K), False  # [K, 1] is the [1, K] row
        elif not self.kmajor and self.K == 1 and contiguous:
            self.view, self.kmajor = _flat2(self.view, 1, self.F), True  # [F, 1] is the [1, F] row

    @property
    def direct(self) -> bool:
        """Loaded K-major straight by DMA (a copy, or DMA transposes of its full K tiles)."""
        return self.kmajor or self.dmat

    @property
    def pe(self) -> bool:
        """Some of its blocks are transposed on TensorE: all of them, or with DMA transposes a partial last
        K tile (a DMA transpose of kp < 128 columns would write kp partitions on ceil(kp / 8) DMA engines)."""
        return not self.kmajor and (not self.dmat or self.K % P != 0)

    def cols(self, f0: int, w: int, k0: int, kp: int) -> View:
        """Stored [F, K] rows f0..f0+w, columns k0..k0+kp (the source of one DMA transpose) as [w, kp]."""
        (_, rs), (_, cs) = self.view.dims
        return _view(self.view, self.view.offset + f0 * rs + k0 * cs, ((w, rs), (kp, cs)))

    def rows(self, r0: int, nt: int, c0: int, w: int, rows_per: int = P) -> View:
        """Stored rows r0 + t*128 + p (p < rows_per, t < nt), columns c0..c0+w, as [rows_per, nt, w]."""
        (_, rs), (_, cs) = self.view.dims
        return _view(self.view, self.view.offset + r0 * rs + c0 * cs,
                     ((rows_per, rs), (nt, P * rs), (w, cs)))


# ---- the planner ----------------------------------------------------------------------------------
@dataclass
class _Plan:
    order: str  # "m_outer": operand 1 (stationary) resident; "n_outer": operand 2 (moving) resident
    block1: int  # columns of operand 1 per block
    block2: int  # columns of operand 2 per block
    tile_n: int
    group: int
    bufs: int
    kc: int  # K elements per chunk (K itself when it fits)
    acc_bufs: int
    tp_bufs: int


def _panel_bytes(k: int, f: int, isz: int) -> int:
    return math.ceil(k / P) * f * isz


def _plan(prof, M, N, K, isz, out_isz, t1: bool, t2: bool, order, block, tile_n, group, bufs,
          col_bias: bool = False, d1: bool = False, d2: bool = False) -> _Plan:
    """Pick the loop order and block sizes: the biggest resident panel that fits next to a stream.

    ``t1``/``t2``: the operand is made K-major on TensorE; ``d1``/``d2``: by DMA transposes (a partial last
    K tile still on TensorE).
    """
    if order == "auto" and t1 == t2 and d1 != d2:
        # One operand arrives by DMA transposes, dearer per byte than copies. Stream it (its loads spread
        # over the blocks while the cheap resident panel loads first) unless that re-reads it more.
        orders = ("n_outer", "m_outer") if d1 else ("m_outer", "n_outer")  # the one streaming it first
        plans = [_plan(prof, M, N, K, isz, out_isz, t1, t2, o, block, tile_n, group, bufs, col_bias, d1, d2)
                 for o in orders]
        w = 1.0 / prof.dma_transpose_hbm_fraction

        def load_cost(pl: _Plan) -> float:
            m_outer = pl.order == "m_outer"
            res, strm, blk = (M, N, pl.block1) if m_outer else (N, M, pl.block2)
            w_res, w_strm = (d1, d2) if m_outer else (d2, d1)
            passes = math.ceil(res / blk)  # the streamed operand is read once per resident block
            return res * (w if w_res else 1.0) + strm * passes * (w if w_strm else 1.0)

        return min(plans, key=load_cost)  # ties: the first, which streams the DMA-transposed operand
    budget = int(prof.sbuf_partition_bytes * SBUF_BUDGET)
    tile_n = min(tile_n, prof.gemm_moving_fmax, max(N, 1))
    tp_bufs = TP_BANKS if (t1 or t2 or ((d1 or d2) and K % P)) else 0
    acc_bufs = prof.psum_banks - tp_bufs - (1 if col_bias else 0)
    if order == "auto":
        if t1 != t2:
            order = "m_outer" if t1 else "n_outer"  # keep the operand that needs transposing resident
        else:  # the order that streams the fewest bytes (the resident panel as wide as SBUF allows)
            order = "m_outer" if M >= N else "n_outer"
    res, strm = (M, N) if order == "m_outer" else (N, M)
    t_res, t_strm = (t1, t2) if order == "m_outer" else (t2, t1)
    strm_w = tile_n if order == "m_outer" else P * max(1, min(4, math.ceil(min(M, 512) / P)))
    strm_w = min(strm_w, max(strm, 1))
    stage = 8 * tile_n * max(out_isz, 4) + 4096  # copy-out staging, bias tiles, first-block row pieces

    def need(kc, bres, depth):
        res, strm = _panel_bytes(kc, bres, isz), _panel_bytes(kc, strm_w, isz)
        # rings: resident x2, streamed x depth, background row tiles: x1 for the resident panel (refilled
        # once per resident panel; the first block's row pieces take the same room), x2 for the streamed
        return 2 * res + depth * strm + (res if t_res else 0) + (2 * strm if t_strm else 0) + stage

    def fits(kc, bres):
        return need(kc, bres, bufs or 2) <= budget

    kc = K
    fit_res = min(_round_up(res, P), 4096)
    if block:
        cands = [min(block, _round_up(res, P))]
    else:
        cands = sorted({fit_res} | {b for b in (2048, 1024, 512, 256, 128) if b <= fit_res}, reverse=True)
    bres = next((b for b in cands if fits(kc, b)), None)
    if bres is None:  # K too large for whole-K panels: chunk it, accumulate chunks in PSUM
        bres = min(cands[-1], P * max(1, acc_bufs // 2)) if not block else cands[0]
        while kc > P and not fits(kc, bres):
            kc = _round_up(kc // 2, P)
        if not fits(kc, bres):
            raise KernelError(f"matmul: no tiling of K={K} fits SBUF ({prof.sbuf_partition_bytes} bytes per "
                              f"partition) with block {bres}; use a smaller block or tile_n")
    if group == 0:
        group = min(4, acc_bufs // 2)
    group = max(1, min(group, acc_bufs // 2))
    b1, b2 = (bres, strm_w) if order == "m_outer" else (strm_w, bres)
    if kc < K:  # every output tile of a block stays in PSUM across the chunks: at most acc_bufs // 2
        most = acc_bufs // 2
        b1, b2 = (min(b1, P * most), tile_n) if order == "m_outer" else (P, min(b2, tile_n * most))
    if not bufs:
        bufs = 3 if need(kc, bres, 3) <= budget else 2
    return _Plan(order, b1, b2, tile_n, group, bufs, kc, acc_bufs, tp_bufs)


def _tp_psum(partitions: int, cols: int, dt: DType) -> View:
    """A PSUM bank for TensorE transposes: every transpose of the family shares this one ring of two."""
    return nl.ndarray((partitions, cols), dt, buffer=nl.psum, name="tp", bufs=TP_BANKS)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _split(total: int, most: int, unit: int = 1) -> list[tuple[int, int]]:
    """(start, size) pieces of ``total``, at most ``most`` each, as even as multiples of ``unit`` allow.

    Even pieces keep every DMA's rows long: 1030 columns in 512-wide tiles are 344 + 344 + 342, not
    512 + 512 + 6 (whose 12-byte rows would be mostly descriptor overhead).
    """
    n = math.ceil(total / most)
    size = min(most, _round_up(math.ceil(total / n), unit))
    return [(s, min(size, total - s)) for s in range(0, total, size)]


# ---- panels: K-major operand blocks in SBUF -------------------------------------------------------
class _Panel:
    """op[k0:k0+ksz, f0:f0+fsz] K-major in SBUF: panel[p, kt, f] = op[k0 + kt*128 + p, f0 + f].

    The columns are cut in *segments*, each its own tile [128, KT, width], so loads and transposes
    of one segment never look (to the dependency tracking) like writes to another. K-major operands
    arrive by DMA straight into the segments; the others arrive as row tiles in their own layout and
    become K-major through TensorE transposes ("items": up to a PSUM bank of 128x128 blocks each).
    """

    def __init__(self, g: _Gemm, op: _Operand, k0: int, ksz: int, f0: int, fsz: int, streamed: bool,
                 segw: int | None = None):
        self.g, self.op, self.k0, self.ksz, self.f0, self.fsz = g, op, k0, ksz, f0, fsz
        self.KT = math.ceil(ksz / P)
        self.dt = dt = op.view.dtype
        self.streamed = streamed
        # ring tiles all have the plan's largest panel shape (blocks and K chunks vary a little in size)
        wmax, kmax = g.wmax[op is g.x2], g.kmax
        self.segw = segw = min(segw or fsz, fsz)
        nseg = math.ceil(fsz / segw)
        if nseg == 1:
            segw = max(segw, wmax)
        # the ring's tiles hold the widest panel's segments (a narrower last block uses the first few)
        shape = (min(P, kmax), max(nseg, math.ceil(wmax / segw)), math.ceil(kmax / P), segw)  # segment-major
        if streamed:  # fixed rings: panels of one kind always land in the same few places (no fragmentation)
            self.t = nl.ndarray(shape, dt, name="stream", bufs=g.plan.bufs)
        else:
            self.t = nl.ndarray(shape, dt, name="resident", bufs=2)
        self.rowtile = None
        self.items: list[tuple[int, int, int, int]] = []
        self.cover: dict[tuple[int, int], int] = {}
        self.raw: dict[tuple[int, int], tuple[View, int, int]] = {}  # (j, kt) -> (row tile, jj, kk)
        self.emitted = 0

    def kp(self, kt: int) -> int:
        return min(P, self.ksz - kt * P)

    def fp(self, j: int) -> int:
        return min(P, self.fsz - j * P)

    def seg(self, c0: int, w: int) -> tuple[View, int]:
        s = c0 // self.segw
        assert c0 + w <= (s + 1) * self.segw, f"columns {c0}..{c0 + w} straddle panel segments"
        return self.t[:, s, :, :], c0 - s * self.segw

    # -- loading --------------------------------------------------------------------------------
    def load(self, c0: int, w: int, kt0: int, kt1: int, jbatch: bool = True) -> None:
        """Load columns c0..c0+w (inside one segment; multiples of 128 unless at the end) of K tiles kt0..kt1."""
        g, op = self.g, self.op
        if op.kmajor:
            t, o = self.seg(c0, w)
            full = kt1 if self.kp(kt1 - 1) == P else kt1 - 1
            if full > kt0:
                g.load(t[:, kt0:full, o:o + w], op.rows(self.k0 + kt0 * P, full - kt0, self.f0 + c0, w))
            if full < kt1:
                kp = self.kp(full)
                g.load(t[:kp, full, o:o + w], op.rows(self.k0 + full * P, 1, self.f0 + c0, w, kp))
            return
        if op.dmat:  # one DMA transpose per full K tile: stored rows f0+c0.. (its 128 columns) -> [128, w]
            t, o = self.seg(c0, w)
            for kt in range(kt0, kt1):
                if self.kp(kt) == P:
                    g.load_transposed(t[:, kt, o:o + w], op.cols(self.f0 + c0, w, self.k0 + kt * P, P))
            if self.kp(kt1 - 1) == P:
                return
            kt0, jbatch = kt1 - 1, True  # a partial last K tile: transposed on TensorE from row tiles
        j0, j1 = c0 // P, math.ceil((c0 + w) / P)
        kk0, kw = kt0 * P, min(self.ksz, kt1 * P) - kt0 * P
        if op.dmat:  # rows of the panel's last 128 columns (runs as long as the DMA transposes'); kp used
            kk0, kw = self.ksz - P, P
        nj = j1 - j0
        if jbatch:  # first-block pieces: small tiles of their own
            rt = nl.ndarray((min(P, w), nj, kw), self.dt, name="rows")
        else:  # background row tiles: slices of one tile per panel, in a ring of two
            if self.rowtile is None:
                wmax = max(self.fsz, g.wmax[op is g.x2])
                shape = (min(P, wmax), math.ceil(wmax / P), g.kmax)
                if self.streamed:
                    self.rowtile = nl.ndarray(shape, self.dt, name="srows", bufs=2)
                else:
                    self.rowtile = nl.ndarray(shape, self.dt, name="rrows", bufs=1)
            rt = self.rowtile[:, j0:j1, kk0:kk0 + kw]
        fullj = j1 if self.fp(j1 - 1) == P else j1 - 1
        if fullj > j0:
            g.load(rt[:, 0:fullj - j0, :], op.rows(self.f0 + j0 * P, fullj - j0, self.k0 + kk0, kw))
        if fullj < j1:
            fp = self.fp(fullj)
            g.load(rt[:fp, fullj - j0, :], op.rows(self.f0 + fullj * P, 1, self.k0 + kk0, kw, fp))
        for j in range(j0, j1):
            for kt in range(kt0, kt1):
                self.raw[(j, kt)] = (rt, j - j0, kt * P - kk0)
        cap = g.prof.psum_bank_bytes // (P * self.dt.itemsize)  # blocks per PSUM bank
        if jbatch or nj > 1:  # per K tile, a bank of consecutive column blocks (contiguous writes)
            for kt in range(kt0, kt1):
                for a in range(j0, j1, cap):
                    self._item(a, min(j1, a + cap), kt, kt + 1)
        else:  # one column block, a bank of K tiles
            full = [k for k in range(kt0, kt1) if self.kp(k) == P]
            for a in range(0, len(full), cap):
                self._item(j0, j1, full[a], full[min(len(full), a + cap) - 1] + 1)
            for k in range(kt0, kt1):
                if self.kp(k) != P:
                    self._item(j0, j1, k, k + 1)

    def _item(self, j0, j1, kt0, kt1):
        for j in range(j0, j1):
            for kt in range(kt0, kt1):
                self.cover[(j, kt)] = len(self.items)
        self.items.append((j0, j1, kt0, kt1))

    # -- transposes -----------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self.items) - self.emitted

    def need(self, kt: int, c0: int, w: int) -> None:
        """Make columns c0..c0+w of K tile kt K-major: emit every transpose item up to theirs."""
        if self.op.kmajor or kt >= self.KT or (self.op.dmat and self.kp(kt) == P):
            return
        last = max(self.cover[(j, kt)] for j in range(c0 // P, math.ceil((c0 + w) / P)))
        while self.emitted <= last:
            self.step()

    def step(self) -> None:
        """Emit the next transpose item: TensorE transposes into one PSUM bank, then one copy to SBUF."""
        j0, j1, kt0, kt1 = self.items[self.emitted]
        self.emitted += 1
        g, kp = self.g, self.kp(kt0)
        nblk = (j1 - j0) * (kt1 - kt0)
        ps = _tp_psum(kp, nblk * P, self.dt)
        i = 0
        for j in range(j0, j1):
            for kt in range(kt0, kt1):
                rt, jj, kk = self.raw.pop((j, kt))
                fp = self.fp(j)
                nisa.nc_transpose(ps[:kp, i * P:i * P + fp], rt[:fp, jj, kk:kk + kp])
                i += 1
        width = min(self.fsz, j1 * P) - j0 * P
        t, o = self.seg(j0 * P, width)
        if kt1 - kt0 == 1:
            g.copy(t[:kp, kt0, o:o + width], ps[:kp, 0:width])
        else:
            g.copy(t[:kp, kt0:kt1, o:o + width], ps.reshape(kp, nblk, P)[:, :, 0:width])

    def view(self, kt: int, c0: int, w: int) -> View:
        t, o = self.seg(c0, w)
        return t[:self.kp(kt), kt, o:o + w]


# ---- epilogue (copy-out of PSUM) ------------------------------------------------------------------
@dataclass
class _Epilogue:
    alpha: float = 1.0
    beta: float = 1.0
    bias: View | None = None  # HBM view broadcastable to the core output [F1, F2]: (1|F1, 1|F2)
    cache: dict = field(default_factory=dict)
    rounding: DType | None = None  # results round to this dtype before the store converts them to the output's
    residual: View | None = None  # HBM [F1, F2] added to the (rounded) result, in float32, before the store
    act: Act | None = None  # a ScalarE activation of the (rounded) result, stored into act_out
    act_out: View | None = None


def _output(kname: str, shape, dt: DType, out_dtype) -> tuple[View, DType | None]:
    """The HBM output of a product of dtype ``dt`` and the dtype its tiles round to before the store: an
    ``out_dtype`` other than ``dt`` gets the product rounded to ``dt`` and converted by the store DMA, exactly
    the product followed by a cast (a compiled graph's cast after a matmul, without its own kernel)."""
    odt = dt if out_dtype is None else DType.of(out_dtype)
    if not odt.is_float:
        raise KernelError(f"{kname}: out_dtype must be a float dtype, got {odt}")
    return nl.ndarray(shape, odt, buffer=nl.hbm, name="out"), (dt if odt != dt else None)


# ---- the GEMM core -------------------------------------------------------------------------------
class _IO:
    """DMA queues (loads and stores apart) and PSUM copy-out balanced between VectorE and ScalarE."""

    def __init__(self):
        self.prof = nl.profile()
        self._lq = self._sq = 0
        self.busy = {Engine.VECTOR: 0.0, Engine.SCALAR: 0.0, Engine.GPSIMD: 0.0}

    # -- instruction helpers ------------------------------------------------------------------
    def load(self, dst: View, src: View) -> None:
        nisa.dma_copy(dst, src, queue=LOAD_QUEUES[self._lq % len(LOAD_QUEUES)])
        self._lq += 1

    def load_transposed(self, dst: View, src: View) -> None:
        nisa.dma_transpose(dst, src, queue=LOAD_QUEUES[self._lq % len(LOAD_QUEUES)])
        self._lq += 1

    def store(self, dst: View, src: View) -> None:
        nisa.dma_copy(dst, src, queue=STORE_QUEUES[self._sq % len(STORE_QUEUES)])
        self._sq += 1

    def _cost_ns(self, eng: Engine, n: int, dst: View, src: View) -> float:
        """The cost model's copy estimate, to balance PSUM evacuation between VectorE and ScalarE."""
        p = self.prof
        f16 = {DType.bfloat16, DType.float16}
        both16 = dst.dtype in f16 and src.dtype in f16
        if eng is Engine.VECTOR:
            f = p.vector_perf_copy_partial_factor if both16 else 1
            return max(p.min_ii, n / f) / p.vector_ghz
        f = p.scalar_perf_factor if both16 else 1
        return max(p.min_ii, n / f) / p.scalar_ghz

    def _pick(self, n: int, dst: View, src: View, engines=(Engine.VECTOR, Engine.SCALAR)) -> Engine:
        best = min(engines, key=lambda e: self.busy[e] + self._cost_ns(e, n, dst, src))
        self.busy[best] += self._cost_ns(best, n, dst, src)
        return best

    def copy(self, dst: View, src: View) -> None:
        n = math.prod(src.shape[1:])
        if self._pick(n, dst, src) is Engine.VECTOR:
            nisa.tensor_copy(dst, src, engine=Engine.VECTOR)
        else:
            nisa.activation(dst, Act.identity, src)



class _Gemm(_IO):
    """out[F1, F2] = X1.T @ X2 for K-major operands X1 [K, F1] (stationary) and X2 [K, F2] (moving)."""

    def __init__(self, x1: _Operand, x2: _Operand, out: View, epi: _Epilogue, plan: _Plan):
        super().__init__()
        self.x1, self.x2, self.out, self.epi, self.plan = x1, x2, out, epi, plan
        self.F1, self.F2, self.K = x1.F, x2.F, x1.K
        self.wmax = (min(plan.block1, x1.F), min(plan.block2, x2.F))  # widest panel of each operand
        self.kmax = min(plan.kc, self.K)

    # -- blocks -------------------------------------------------------------------------------
    def blocks(self):
        pl = self.plan
        r1 = _split(self.F1, pl.block1, P)
        r2 = _split(self.F2, pl.block2, P if pl.order == "n_outer" else 1)
        ks = [(s, min(pl.kc, self.K - s)) for s in range(0, self.K, pl.kc)]
        outer, inner = (r1, r2) if pl.order == "m_outer" else (r2, r1)
        out = []
        for o in outer:
            for i in inner:
                b1, b2 = (o, i) if pl.order == "m_outer" else (i, o)
                for c, k in enumerate(ks):
                    out.append(dict(r1=b1, r2=b2, k=k, first=c == 0, last=c == len(ks) - 1))
        return out

    def _groups(self, blk, first_block: bool, last_block: bool):
        """The block's output tiles (c1, w1, c2, w2), in groups accumulated K tile by K tile together.

        Tiles run along the resident panel in the outer loop, so a group's footprint in it is a
        contiguous range. Groups > 1 feed TensorE while the first block's panels are still arriving;
        later blocks (data already there) go tile by tile. The very last tile is split into
        128-column pieces so the final copy-out and store are short.
        """
        (_, s1), (_, s2) = blk["r1"], blk["r2"]
        tn = self.plan.tile_n
        t1 = [(a, min(P, s1 - a)) for a in range(0, s1, P)]  # PSUM partitions: 128-row tiles
        t2 = _split(s2, tn)
        if self.plan.order == "m_outer":
            tiles = [(a, wa, b, wb) for a, wa in t1 for b, wb in t2]
        else:
            tiles = [(a, wa, b, wb) for b, wb in t2 for a, wa in t1]
        chunked = self.plan.kc < self.K
        g = len(tiles) if chunked else self.plan.group if first_block else 1
        groups = [tiles[a:a + n] for a, n in _split(len(tiles), g)]
        if last_block and not chunked:
            groups = groups[:-1] + [[t] for t in groups[-1]]
            a, wa, b, wb = groups[-1][0]
            if wb >= 2 * P:  # pieces of 128 columns, the last one taking the remainder
                cuts = list(range(0, wb - P + 1, P))
                groups = groups[:-1] + [[(a, wa, b + c, (cuts[k + 1] if k + 1 < len(cuts) else wb) - c)]
                                        for k, c in enumerate(cuts)]
        return groups

    def _footprints(self, groups, which: int):
        """Column ranges of panel ``which`` each group touches, merged where they overlap."""
        spans = []
        for grp in groups:
            cs = [(t[0], t[1]) if which == 1 else (t[2], t[3]) for t in grp]
            lo, hi = min(c for c, _ in cs), max(c + w for c, w in cs)
            if spans and lo < spans[-1][1]:
                spans[-1] = (min(spans[-1][0], lo), max(spans[-1][1], hi))
            else:
                spans.append((lo, hi))
        return spans

    def _panel(self, which: int, blk, streamed: bool, segw=None) -> _Panel:
        op = self.x1 if which == 1 else self.x2
        f0, fsz = blk["r1"] if which == 1 else blk["r2"]
        k0, ksz = blk["k"]
        return _Panel(self, op, k0, ksz, f0, fsz, streamed, segw)

    def _background_loads(self, pan: _Panel) -> None:
        """A panel needed by the next block: about PIECE_BYTES per DMA, row tiles one by one."""
        isz = pan.dt.itemsize
        if pan.op.direct:
            step = max(1, PIECE_BYTES // max(1, pan.fsz * isz * P))
            for a in range(0, pan.KT, step):
                pan.load(0, pan.fsz, a, min(pan.KT, a + step))
        else:
            for c in range(0, pan.fsz, P):
                pan.load(c, min(P, pan.fsz - c), 0, pan.KT, jbatch=False)

    def _first_loads(self, pans: dict, groups) -> None:
        """The first block's pieces, in the order TensorE consumes them: K tile by K tile for the first
        group (both panels interleaved), then each further segment of the resident panel."""
        res = 1 if self.plan.order == "m_outer" else 2
        strm = 3 - res

        def pieces(pan: _Panel, c0: int, w: int):
            per_kt = w * pan.dt.itemsize * P
            out, a, i = [], 0, 0
            while a < pan.KT:
                step = max(1, -(-65536 // per_kt))
                if not pan.op.direct:  # row pieces grow: longer runs once TensorE has started
                    step = max(step, RAW_STEPS[min(i, len(RAW_STEPS) - 1)])
                end = min(pan.KT, a + step)
                if end == pan.KT - 1 and pan.kp(end) < P:
                    end = pan.KT  # a lone partial K tile would make a piece of very short rows
                out.append((pan, c0, w, a, end))
                a = end
                i += 1
            return out

        spans = self._footprints(groups, res)
        if pans[res].op.pe:  # row tiles are transposed in 128-column blocks: whole blocks, once each
            cuts, done = [], 0
            for lo, hi in spans:
                lo, hi = max(done, lo // P * P), min(pans[res].fsz, _round_up(hi, P))
                if hi > lo:
                    cuts.append((lo, hi))
                    done = hi
            spans = cuts
        first = pieces(pans[res], spans[0][0], spans[0][1] - spans[0][0])
        other = pieces(pans[strm], 0, pans[strm].fsz)
        order = []
        for i in range(max(len(first), len(other))):
            order += first[i:i + 1] + other[i:i + 1]
        for lo, hi in spans[1:]:
            order += pieces(pans[res], lo, hi - lo)
        for pan, c0, w, kt0, kt1 in order:
            pan.load(c0, w, kt0, kt1)

    def run(self) -> None:
        blocks = self.blocks()
        pl = self.plan
        resident = 1 if pl.order == "m_outer" else 2
        key = lambda b, w: (w, b["r1"] if w == 1 else b["r2"], b["k"])  # noqa: E731
        groups = [self._groups(b, i == 0, i == len(blocks) - 1) for i, b in enumerate(blocks)]
        panels: dict = {}
        b0 = blocks[0]
        spans = self._footprints(groups[0], resident)
        segw = max(hi - lo for lo, hi in spans)
        if any(lo % segw for lo, _ in spans) or (segw % P and (self.x1, self.x2)[resident - 1].pe):
            segw = None  # groups not aligned (merged spans, transposes of 128-column blocks): one segment
        first = {w: self._panel(w, b0, w != resident, segw if w == resident else None) for w in (1, 2)}
        self._first_loads(first, groups[0])
        for w in (1, 2):
            panels[key(b0, w)] = first[w]
        acc = {}
        for i, blk in enumerate(blocks):
            bg = []
            if i + 1 < len(blocks):  # the next block's new panels load now, transpose during this block
                for w in (1, 2):
                    k = key(blocks[i + 1], w)
                    if k not in panels:
                        panels[k] = self._panel(w, blocks[i + 1], streamed=w != resident)
                        self._background_loads(panels[k])
                        bg.append(panels[k])
            self._block(blk, groups[i], panels[key(blk, 1)], panels[key(blk, 2)], acc, bg)
            for p in bg:  # whatever was not spread over this block
                while p.pending:
                    p.step()
            keep = {key(blocks[i + 1], w) for w in (1, 2)} if i + 1 < len(blocks) else set()
            for k in [k for k in panels if k not in keep]:  # a panel lives while consecutive blocks use it
                del panels[k]  # (its ring slot is reused; a later block with the same key loads it again)

    def _block(self, blk, groups, p1: _Panel, p2: _Panel, acc: dict, bg: list[_Panel]):
        KT = math.ceil(blk["k"][1] / P)
        total_bg = sum(p.pending for p in bg)
        steps = sum(len(g) for g in groups) * KT
        done = spread = 0
        r1, r2 = blk["r1"][0], blk["r2"][0]
        for gi, grp in enumerate(groups):
            nxt = groups[gi + 1] if gi + 1 < len(groups) else []
            if blk["first"]:
                for c1, w1, c2, w2 in grp:
                    acc[(r1 + c1, r2 + c2, w2)] = nl.ndarray((w1, w2), nl.float32, buffer=nl.psum, name="acc",
                                                             bufs=self.plan.acc_bufs)
            if len(grp) == 1:
                order = [(grp[0], kt) for kt in range(KT)]
            else:
                order = [(t, kt) for kt in range(KT) for t in grp]
            for t, kt in order:
                c1, w1, c2, w2 = t
                p1.need(kt, c1, w1)
                p2.need(kt, c2, w2)
                nisa.nc_matmul(acc[(r1 + c1, r2 + c2, w2)], p1.view(kt, c1, w1), p2.view(kt, c2, w2),
                               accumulate=not (blk["first"] and kt == 0))
                if t is grp[0] or len(grp) == 1:  # after the group's first matmul of this K tile: the
                    ahead = [(tt, kt + 1) for tt in grp] if kt + 1 < KT else []  # next K tile's transposes
                    if kt + 2 >= KT:  # (their copies run during the rest), and near the end the next group's
                        ahead += [(tt, k) for tt in nxt for k in range(min(2, KT))]
                    for (a1, b1, a2, b2), k in ahead:
                        p1.need(k, a1, b1)
                        p2.need(k, a2, b2)
                done += 1
                want = total_bg * done // max(steps, 1)
                while spread < want:
                    for p in bg:
                        if p.pending:
                            p.step()
                            break
                    spread += 1
            if blk["last"]:
                for t in grp:
                    self._evacuate(blk, t, acc.pop((r1 + t[0], r2 + t[2], t[3])))

    # -- copy-out -----------------------------------------------------------------------------
    def _evacuate(self, blk, t, a: View) -> None:
        c1, w1, c2, w2 = t
        r0, s0 = blk["r1"][0] + c1, blk["r2"][0] + c2
        epi = self.epi
        stage = nl.ndarray((w1, w2), epi.rounding or self.out.dtype, name="stage")
        bias = self._bias(r0, w1, s0, w2) if epi.bias is not None and epi.beta != 0 else None
        if bias is None:
            if epi.alpha == 1.0:
                self.copy(stage, a)
            else:
                nisa.activation(stage, Act.identity, a, scale=epi.alpha)
                self.busy[Engine.SCALAR] += self._cost_ns(Engine.SCALAR, w2, stage, a)
        elif bias[0] == "col":  # per-partition: one ScalarE pass does alpha and bias
            nisa.activation(stage, Act.identity, a, scale=epi.alpha, bias=bias[1])
            self.busy[Engine.SCALAR] += self._cost_ns(Engine.SCALAR, w2, stage, a)
        else:
            if epi.alpha == 1.0:
                nisa.tensor_tensor(stage, a, bias[1], Alu.add)
            else:
                tmp = nl.ndarray((w1, w2), nl.float32, name="scaled")
                nisa.activation(tmp, Act.identity, a, scale=epi.alpha)
                self.busy[Engine.SCALAR] += self._cost_ns(Engine.SCALAR, w2, tmp, a)
                nisa.tensor_tensor(stage, tmp, bias[1], Alu.add, engine=Engine.GPSIMD)
            self.busy[Engine.VECTOR] += w2 / self.prof.vector_ghz
        if epi.residual is not None:  # out = residual + the rounded product, as the add after it computes
            res = nl.ndarray((w1, w2), epi.residual.dtype, name="residual")
            self.load(res, epi.residual[r0:r0 + w1, s0:s0 + w2])
            total = nl.ndarray((w1, w2), self.out.dtype, name="total")
            nisa.tensor_tensor(total, stage, res, Alu.add, engine=Engine.GPSIMD)
            stage = total
        if epi.act is not None:  # the activation of the rounded result, as the activation op after it computes
            post = nl.ndarray((w1, w2), epi.act_out.dtype, name="activated")
            nisa.activation(post, epi.act, stage)
            self.busy[Engine.SCALAR] += self._cost_ns(Engine.SCALAR, w2, post, stage)
            self.store(epi.act_out[r0:r0 + w1, s0:s0 + w2], post)
        self.store(self.out[r0:r0 + w1, s0:s0 + w2], stage)

    def _bias(self, r0, w1, s0, w2):
        """("col", [w1, 1] fp32 tile) or ("full", [w1, w2] tile), beta applied."""
        epi, b = self.epi, self.epi.bias
        rows, cols = b.shape
        beta = epi.beta
        if cols == 1:  # per output row (partition): the column is read as a row and transposed
            key = ("col", r0, w1)
            if key not in epi.cache:
                epi.cache.clear() if len(epi.cache) > 64 else None
                if rows == 1:
                    one = nl.ndarray((1, 1), b.dtype, name="bias1")
                    self.load(one, b[0:1, 0:1])
                    row = nl.ndarray((1, w1), nl.float32, name="biasrow")
                    nisa.tensor_copy(row, _view(one, one.offset, ((1, one.dims[0][1]), (w1, 0))),
                                     engine=Engine.GPSIMD)
                else:
                    row = nl.ndarray((1, w1), b.dtype, name="biasrow")
                    self.load(row, _view(b, b.offset + r0 * b.dims[0][1], ((1, 0), (w1, b.dims[0][1]))))
                ps = nl.ndarray((w1, 1), row.dtype, buffer=nl.psum, name="biastp", bufs=1)
                nisa.nc_transpose(ps, row)
                col = nl.ndarray((w1, 1), nl.float32, name="biascol")
                nisa.tensor_scalar(col, ps, Alu.multiply, beta)
                epi.cache[key] = ("col", col)
            return epi.cache[key]
        if rows == 1:  # one row broadcast to every partition (a DMA reading the same row w1 times)
            key = ("row", s0, w2, w1)
            for have, (_, tile) in list(epi.cache.items()):  # a wider row tile already loaded: a slice of it
                if have[0] == "row" and have[1] <= s0 and s0 + w2 <= have[1] + have[2] and w1 <= have[3]:
                    epi.cache.setdefault(key, ("full", tile[:w1, s0 - have[1]:s0 - have[1] + w2]))
            if key not in epi.cache:
                if len(epi.cache) > 64:
                    epi.cache.clear()
                raw = nl.ndarray((w1, w2), b.dtype, name="biasraw")
                self.load(raw, _view(b, b.offset + s0 * b.dims[1][1], ((w1, 0), (w2, b.dims[1][1]))))
                if beta == 1.0:  # the epilogue's add reads any dtype: nothing to scale or widen
                    epi.cache[key] = ("full", raw)
                    return epi.cache[key]
                t = nl.ndarray((w1, w2), nl.float32, name="biasrow")
                nisa.tensor_scalar(t, raw, Alu.multiply, beta, engine=Engine.GPSIMD)
                epi.cache[key] = ("full", t)
            return epi.cache[key]
        raw = nl.ndarray((w1, w2), b.dtype, name="biasfull")
        self.load(raw, b[r0:r0 + w1, s0:s0 + w2])
        if beta == 1.0:
            return ("full", raw)
        t = nl.ndarray((w1, w2), nl.float32, name="biasscaled")
        nisa.tensor_scalar(t, raw, Alu.multiply, beta, engine=Engine.GPSIMD)
        return ("full", t)


# ---- entry points ---------------------------------------------------------------------------------
def _gemm2d(kname, a: View, b: View, out: View, ta: bool, tb: bool, epi: _Epilogue, order, block, tile_n, group,
            bufs, transpose="auto"):
    """out[M, N] = op(a) @ op(b) (+ epilogue) for 2-D HBM views."""
    M, K, N = _mk(kname, a, b, ta, tb)
    x1 = _Operand(a, ta, K, M)  # A^T: K-major when a is given [K, M]
    x2 = _Operand(b, not tb, K, N)  # B: K-major when b is given [K, N]
    dst = out
    if N == 1 and M > 1:  # C [M, 1] is the row C^T [1, M]: compute that, stores stay contiguous
        x1, x2 = x2, x1
        dst = _flat2(out, 1, M)
        if epi.bias is not None:
            r, c = epi.bias.shape
            epi = dataclasses.replace(epi, bias=_view(epi.bias, epi.bias.offset, ((c, 0 if c == 1 else 1),
                                                                                (r, 0 if r == 1 else 1))))
        if epi.residual is not None or epi.act_out is not None:
            epi = dataclasses.replace(epi, residual=epi.residual and _flat2(epi.residual, 1, M),
                                      act_out=epi.act_out and _flat2(epi.act_out, 1, M))
    prof = nl.profile()
    col_bias = epi.bias is not None and epi.beta != 0 and epi.bias.shape[1] == 1
    if transpose not in ("auto", *TUNABLES["transpose"]):
        raise KernelError(f"{kname}: transpose={transpose!r} is not one of auto, {', '.join(TUNABLES['transpose'])}")

    def plan_for(x1, x2):
        return _plan(prof, x1.F, x2.F, K, x1.view.dtype.itemsize, out.dtype.itemsize, not x1.direct,
                     not x2.direct, order, block, tile_n, group, bufs, col_bias, x1.dmat, x2.dmat)

    # Operands stored [F, K] become K-major by DMA transposes (where the profile has them, for 2- and 4-byte
    # dtypes) or on TensorE; "auto" takes the combination the throughput estimate finds fastest.
    can = prof.dma_transpose and x1.view.dtype.itemsize in DMA_TRANSPOSE_ITEMSIZES
    ways = {"dma": (True,), "pe": (False,), "auto": (True, False)}[transpose] if can else (False,)

    def choices(x):  # a single stored row [1, K] is one contiguous run (one row load, TensorE transposes);
        return ways if not x.kmajor and x.F > 1 and x.K >= P else (False,)  # K < 128 has no whole K tile

    combos = [(d1, d2) for d1 in choices(x1) for d2 in choices(x2)]
    if len(combos) > 1:
        def estimate(combo):
            x1.dmat, x2.dmat = combo
            return _estimate(prof, plan_for(x1, x2), x1, x2, K, out.dtype.itemsize)

        best = min(combos, key=estimate)  # ties: the first (DMA transposes)
    else:
        best = combos[0]
    x1.dmat, x2.dmat = best
    plan = plan_for(x1, x2)
    if not x1.direct and not x2.direct:
        # Both need transposing: the streamed one would be transposed again for every resident block.
        # When there is more than one, transpose it once into an HBM scratch instead (K-major, long rows).
        res, blk = (x1.F, plan.block1) if plan.order == "m_outer" else (x2.F, plan.block2)
        if res > blk:
            if plan.order == "m_outer":
                x2 = _transpose_to_hbm(x2)
            else:
                x1 = _transpose_to_hbm(x1)
            plan = plan_for(x1, x2)
    _Gemm(x1, x2, dst, epi, plan).run()


def _estimate(prof, pl: _Plan, x1: _Operand, x2: _Operand, K: int, out_isz: int) -> float:
    """Throughput estimate (ns) of a plan from the profile: the busiest of TensorE (matmuls and TensorE
    transposes), the DMA engines (bytes, DMA transposes at their fraction of the bandwidth, a descriptor per
    contiguous run) and the DMA issue (one DMA transpose per K tile of a panel). Used only to choose how
    operands stored [F, K] become K-major; latencies and overlap are left to the simulator."""
    isz = x1.view.dtype.itemsize
    KT, kc = math.ceil(K / P), min(pl.kc, K)
    chunks = math.ceil(K / kc)
    F1, F2 = x1.F, x2.F
    n1, n2 = math.ceil(F1 / pl.block1), math.ceil(F2 / pl.block2)
    m_outer = pl.order == "m_outer"
    n_res, n_strm = (n1, n2) if m_outer else (n2, n1)
    res_passes = 1 if chunks == 1 or n_strm == 1 else n_strm
    strm_passes = 1 if chunks == 1 and n_strm == 1 else n_res
    passes = (res_passes, strm_passes) if m_outer else (strm_passes, res_passes)
    factor = prof.matmul_fp32_factor if isz == 4 else 1
    ii = max(min(prof.mm_init_latency, min(P, F1)), min(pl.tile_n, F2))
    te = math.ceil(F1 / P) * math.ceil(F2 / pl.tile_n) * KT * ii * factor
    bw = prof.dma_bytes_per_ns
    run_ns = prof.dma_run_min_ns / prof.dma_engines  # at most a run's floor on top of its bytes
    dma = F1 * F2 * out_isz / bw + F1 * math.ceil(F2 / pl.tile_n) * run_ns  # the output
    issues = 0
    both_pe = not x1.direct and not x2.direct
    for x, n, blk, k in ((x1, passes[0], pl.block1, 0), (x2, passes[1], pl.block2, 1)):
        nbytes = n * x.F * K * isz
        if x.kmajor:
            dma += nbytes / bw + n * K * math.ceil(x.F / blk) * run_ns
        elif x.dmat:
            full, tail = K // P, K % P  # a partial last K tile is loaded as rows and transposed on TensorE
            dma += n * x.F * isz * (full * P / (bw * prof.dma_transpose_hbm_fraction) + tail / bw)
            dma += n * x.F * (full + (tail > 0)) * run_ns
            issues += n * full * math.ceil(x.F / blk)
            te += n * math.ceil(x.F / P) * (tail > 0) * max(min(P, x.F), min(prof.mm_init_latency, tail))
        else:
            streamed = k == (1 if m_outer else 0)
            if both_pe and streamed and n > 1:  # transposed once through an HBM scratch, then read K-major
                te += math.ceil(x.F / P) * KT * max(min(P, x.F), min(prof.mm_init_latency, P))
                dma += (2 * x.F * K * isz + nbytes) / bw
                continue
            te += n * math.ceil(x.F / P) * KT * max(min(P, x.F), min(prof.mm_init_latency, min(P, K)))
            dma += nbytes / bw + n * x.F * chunks * run_ns
    return max(te / prof.tensor_ghz, dma, issues * prof.dma_issue_time_ns() / prof.dma_issuers)


def _transpose_to_hbm(op: _Operand) -> _Operand:
    """op stored [F, K] -> a scratch HBM tensor [K, F] (rows of 512 columns), transposed on TensorE."""
    from ..tracer import builder

    b = builder()
    dt, F, K = op.view.dtype, op.F, op.K
    io = _IO()
    xt = b.tensor(f"scratch{len(b.handles)}", (K, F), dt, "scratch")
    cap = io.prof.psum_bank_bytes // (P * dt.itemsize)
    kchunk = max(P, min(K, (16384 // (4 * dt.itemsize)) // P * P))  # row tiles of <= 16 KiB per partition
    for f0, fw in _split(F, 4 * P, P):
        nj = math.ceil(fw / P)
        for k0 in range(0, K, kchunk):
            kw = min(kchunk, K - k0)
            rows = nl.ndarray((min(P, fw), nj, kw), dt, name="trows")
            fullj = nj if fw % P == 0 else nj - 1
            if fullj:
                io.load(rows[:, 0:fullj, :], op.rows(f0, fullj, k0, kw))
            if fullj < nj:
                io.load(rows[:fw - fullj * P, fullj, :], op.rows(f0 + fullj * P, 1, k0, kw, fw - fullj * P))
            kts = [(a, min(P, kw - a)) for a in range(0, kw, P)]
            for g0 in range(0, len(kts), 8):
                grp = kts[g0:g0 + 8]
                kp0 = grp[0][1]
                stage = nl.ndarray((kp0, len(grp), fw), dt, name="tstage")
                for t, (a, kp) in enumerate(grp):
                    for j0 in range(0, nj, cap):
                        j1 = min(nj, j0 + cap)
                        ps = _tp_psum(kp, (j1 - j0) * P, dt)
                        for j in range(j0, j1):
                            fp = min(P, fw - j * P)
                            nisa.nc_transpose(ps[:kp, (j - j0) * P:(j - j0) * P + fp], rows[:fp, j, a:a + kp])
                        width = min(fw, j1 * P) - j0 * P
                        io.copy(stage[:kp, t, j0 * P:j0 * P + width], ps[:kp, 0:width])
                for t, (a, kp) in enumerate(grp):  # one store per K tile: rows of fw columns
                    io.store(_view(xt, (k0 + a) * F + f0, ((kp, F), (fw, 1))), stage[:kp, t, :])
    return _Operand(xt, True, K, F)


# activations an epilogue applies: the ScalarE function of each (what the op's own kernel runs)
ACTIVATIONS = {"gelu": Act.gelu, "gelu_tanh": Act.gelu_tanh, "silu": Act.silu, "sigmoid": Act.sigmoid,
               "tanh": Act.tanh}


def _activation(kname, epi: _Epilogue, activation, out: View) -> View | None:
    """Set up ``epi`` to apply ``activation`` (None: nothing); returns the activation's HBM output."""
    if activation is None:
        return None
    if activation not in ACTIVATIONS:
        raise KernelError(f"{kname}: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    if not out.dtype.is_float:
        raise KernelError(f"{kname}: an activation needs a float result, not {out.dtype}")
    epi.act = ACTIVATIONS[activation]
    epi.act_out = nl.ndarray(tuple(out.shape), out.dtype, buffer=nl.hbm, name="activated")
    return epi.act_out


def _residual2d(kname, residual: View | None, M: int, N: int) -> View | None:
    if residual is None:
        return None
    if tuple(residual.shape) != (M, N) or not residual.dtype.is_float:
        raise KernelError(f"{kname}: residual must be a float [{M}, {N}], got {residual.dtype} {list(residual.shape)}")
    return residual


def _bias2d(kname, bias: View, M: int, N: int) -> View:
    """Normalize a bias broadcastable to [M, N] to a 2-D view (1|M, 1|N)."""
    if bias.ndim == 0:
        return _view(bias, bias.offset, ((1, 0), (1, 0)))
    if bias.ndim == 1:
        bias = _view(bias, bias.offset, ((1, 0),) + bias.dims)
    if bias.ndim != 2:
        raise KernelError(f"{kname}: bias must have at most 2 dims, got {list(bias.shape)}")
    r, c = bias.shape
    if r not in (1, M) or c not in (1, N):
        raise KernelError(f"{kname}: bias of shape {list(bias.shape)} does not broadcast to [{M}, {N}]")
    return bias


@kernel(tunables=TUNABLES, version=2)
def matmul(a, b, transpose_a=False, transpose_b=False, order="auto", block=0, tile_n=512, group=0, bufs=0,
           transpose="auto", out_dtype=None, residual=None, activation=None):
    """C = op(a) @ op(b); op(a) = a.T when ``transpose_a`` (a given [K, M]), op(b) = b.T when ``transpose_b``.
    ``out_dtype``: C rounded to the operands' dtype, then converted to this one (see _output). ``residual``:
    an [M, N] tensor added to the rounded C (in float32, rounded once to ``out_dtype``): a matmul and the add
    after it (a residual connection) in one kernel. ``activation`` (a name of ACTIVATIONS): also that function
    of C, as its own kernel would compute it (one ScalarE activation of C), returned after C."""
    dt = _check_dtypes("matmul", a, b)
    m, _, n = _mk("matmul", a, b, transpose_a, transpose_b)
    out, rounding = _output("matmul", (m, n), dt, out_dtype)
    epi = _Epilogue(rounding=rounding, residual=_residual2d("matmul", residual, m, n))
    act_out = _activation("matmul", epi, activation, out)
    _gemm2d("matmul", a, b, out, transpose_a, transpose_b, epi, order, block, tile_n, group, bufs, transpose)
    return out if act_out is None else (out, act_out)


@kernel(tunables=TUNABLES, version=2)
def bmm(a, b, transpose_a=False, transpose_b=False, order="auto", block=0, tile_n=512, group=0, bufs=0,
        transpose="auto"):
    """C[i] = op(a[i]) @ op(b[i]) for a [B, M, K] (or [B, K, M]) and b [B, K, N] (or [B, N, K])."""
    dt = _check_dtypes("bmm", a, b)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise KernelError(f"bmm: a and b must be 3-D with the same batch, got {list(a.shape)} and {list(b.shape)}")
    m, _, n = _mk("bmm", a[0], b[0], transpose_a, transpose_b)
    out = nl.ndarray((a.shape[0], m, n), dt, buffer=nl.hbm, name="out")
    for i in range(a.shape[0]):
        _gemm2d("bmm", a[i], b[i], out[i], transpose_a, transpose_b, _Epilogue(), order, block, tile_n, group,
                bufs, transpose)
    return out


@kernel(tunables=TUNABLES, version=2)
def addmm(bias, a, b, alpha=1.0, beta=1.0, transpose_a=False, transpose_b=False, order="auto", block=0,
          tile_n=512, group=0, bufs=0, transpose="auto", out_dtype=None, residual=None, activation=None):
    """beta * bias + alpha * (op(a) @ op(b)); bias broadcasts to [M, N] ([N], [1, N], [M, 1], [M, N], []).
    ``out_dtype``, ``residual``, ``activation``: as matmul's (the result rounded to the operands' dtype,
    then converted, added to the residual, activated)."""
    dt = _check_dtypes("addmm", a, b)
    m, _, n = _mk("addmm", a, b, transpose_a, transpose_b)
    out, rounding = _output("addmm", (m, n), dt, out_dtype)
    epi = _Epilogue(float(alpha), float(beta), _bias2d("addmm", bias, m, n), rounding=rounding,
                    residual=_residual2d("addmm", residual, m, n))
    act_out = _activation("addmm", epi, activation, out)
    _gemm2d("addmm", a, b, out, transpose_a, transpose_b, epi, order, block, tile_n, group, bufs, transpose)
    return out if act_out is None else (out, act_out)


@kernel(tunables=TUNABLES, version=2)
def linear(x, weight, bias=None, order="auto", block=0, tile_n=512, group=0, bufs=0, transpose="auto"):
    """torch.nn.functional.linear: x [M, K] @ weight[N, K].T (+ bias [N]); leading dims flattened by the caller."""
    dt = _check_dtypes("linear", x, weight)
    m, _, n = _mk("linear", x, weight, False, True)
    out = nl.ndarray((m, n), dt, buffer=nl.hbm, name="out")
    epi = _Epilogue(bias=None if bias is None else _bias2d("linear", bias, m, n))
    _gemm2d("linear", x, weight, out, False, True, epi, order, block, tile_n, group, bufs, transpose)
    return out


def reference(a, b, transpose_a=False, transpose_b=False, bias=None, alpha=1.0, beta=1.0):
    """numpy reference: FP64 products of the (exactly widened) inputs, cast to the input dtype."""
    import numpy as np

    dt = a.dtype
    x = np.asarray(a, np.float64)
    y = np.asarray(b, np.float64)
    x = np.swapaxes(x, -1, -2) if transpose_a else x
    y = np.swapaxes(y, -1, -2) if transpose_b else y
    c = alpha * (x @ y)
    if bias is not None and beta != 0:
        c = c + beta * np.asarray(bias, np.float64)
    return c.astype(np.float32).astype(dt)
