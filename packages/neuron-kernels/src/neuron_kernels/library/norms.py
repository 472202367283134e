"""Normalization kernels: layer_norm, rms_norm and group_norm, forward and backward (torch semantics).

Layout. ``x`` is ``[..., D]`` (layer/rms norm, normalized over the last dim) or ``[N, C, *]`` (group
norm), contiguous row-major. Rows go to partitions: a row tile holds ``np`` partitions of ``nj``
consecutive rows each (partition ``p`` gets rows ``r0 + p * nj ..``), so every DMA moves contiguous
runs of ``nj * D`` elements per partition. Rows too long to keep whole in SBUF go in column chunks
(chunk statistics combined with Chan's formula, the data reloaded for the second pass). Group norm
puts (n, c) rows on partitions, a tile holding whole groups; group sums reduce each group's own rows
after a TensorE transpose, never a 0/1-matrix matmul, so a non-finite value stays in its group
(groups wider than 128 channels take a second pass).

Numerics. Inputs may be float32, bfloat16 or float16; statistics (mean, rstd, row sums) are float32,
every intermediate is float32 and each output is rounded once. Variances come from centered values
(two passes over SBUF, one DMA read), so a large mean does not cancel them. (For 16-bit outputs,
ScalarE may compute ``x * rstd - mean * rstd``, whose float32 rounding is far below the output's.)

Engines. Each row slot's work is a chain (statistics -> scale -> weight -> bias) spread over ScalarE,
VectorE and GpSimd by estimated busy time, and software-pipelined: stage i of row slot k is issued
with stage 0 of slot k + i * lag, so the in-order engine queues hold work of different slots.
Per-column vectors (weight, bias) are broadcast to all partitions once on TensorE (ones[1, P] as
stationary, the vector as moving), kept in PSUM when they fit: a VectorE ``tensor_tensor`` with one
operand in PSUM and the other in SBUF costs N cycles instead of 2N. Weight/bias gradients are column
sums over rows on TensorE into PSUM accumulators that live across all row tiles.

SBUF. Tiles are placed by liveness, so how many row slots are alive at once follows from the pipeline;
the resident-rows decision uses a measured estimate (``DEPTH``), and if placement still overflows the
kernel retraces with a smaller budget (``_Retrying``): every shape traces.
"""

from __future__ import annotations

import contextvars
import itertools
import math

from neuron_hal import DType

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import Kernel
from ..tensors import HBMTensor, View
from ..tracer import builder

ACT, VEC, POOL = nisa.scalar_engine, nisa.vector_engine, nisa.gpsimd_engine


# ---------------------------------------------------------------------------------------------
# helpers shared by the kernels of this module
# ---------------------------------------------------------------------------------------------
def _hbm_view(t: View, offset: int, dims) -> View:
    """A view of HBM tensor ``t`` with an explicit element offset and (size, stride) dims."""
    return HBMTensor(t.owner, t.dtype, offset, tuple(dims))


def _bcast_rows(vec: View, parts: int) -> View:
    """``[parts, n]`` view of a contiguous HBM vector ``[n]`` that reads it once per partition."""
    return _hbm_view(vec, vec.offset, ((parts, 0),) + tuple(vec.dims))


def _scratch(shape, dtype, name: str) -> View:
    """An HBM tensor only this kernel uses (allocated by the driver, never copied to the host)."""
    return builder().tensor(name, shape, dtype, "scratch")


def _check_float(name: str, t: View | None) -> None:
    if t is not None and t.dtype not in nl.COMPUTE_FLOATS:
        raise KernelError(f"{name} is {t.dtype}; normalization kernels take float32, bfloat16 or float16")


def _rows_2d(x: View) -> tuple[View, int, int]:
    if x.ndim < 1:
        raise KernelError("normalization input needs at least one dim")
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    return x.reshape(rows, d), rows, d


def _row_tiles(rows: int, parts: int, nj: int):
    """(first row, partitions, rows per partition) covering ``rows``: full tiles of parts x nj rows, then
    one tile of parts x k rows, then one partial tile of < parts rows."""
    r0 = 0
    while rows - r0 >= parts * nj:
        yield r0, parts, nj
        r0 += parts * nj
    k = (rows - r0) // parts
    if k:
        yield r0, parts, k
        r0 += parts * k
    if rows > r0:
        yield r0, rows - r0, 1


def _chunks(d: int, dc: int):
    return [(c0, min(dc, d - c0)) for c0 in range(0, d, dc)]


def _copy(eng, dst: View, src: View) -> None:
    """dst = src on ``eng``; ScalarE copies with activation(identity) where it has no tensor_copy (NC-v2)."""
    if eng is ACT and not nl.profile().scalar_tensor_copy:
        nisa.activation(dst, nl.identity, src)
    else:
        nisa.tensor_copy(dst, src, engine=eng)


def _col(value: float, parts: int, name: str) -> View:
    t = nl.ndarray((parts, 1), nl.float32, name=name)
    nisa.memset(t, value, engine=VEC)
    return t


class _Bcast:
    """A per-column vector ``[D]`` broadcast to ``[P, D]`` on TensorE (ones[1, P] stationary).

    ``place``: "psum" (float32, resident in PSUM: a VectorE ``tensor_tensor`` reading it and an SBUF
    operand costs N, not 2N), "psum16" (same in the vector's 16-bit dtype, staged through SBUF since
    TensorE writes float32), "sbuf" (float32, resident in SBUF) or "stream" (each ``get`` broadcasts one
    chunk into a rotating PSUM tile). ``get(c0, n)`` is the ``[P, n]`` view of columns ``c0 .. c0 + n``.
    """

    def __init__(self, vec: View, parts: int, place: str, tag: str):
        self.vec, self.parts, self.place, self.tag = vec, parts, place, tag
        self.d = d = vec.shape[0]
        fmax = nl.tile_size.psum_fmax
        self.ones = nl.ndarray((1, parts), vec.dtype, name=f"{tag}_ones")
        nisa.memset(self.ones, 1.0, engine=POOL)
        self.sbuf = None  # an SBUF copy next to a PSUM-resident one, for engines that cannot read PSUM
        if place == "stream":
            return
        row = nl.ndarray((1, d), vec.dtype, name=f"{tag}_row")
        nisa.dma_copy(row, vec.reshape(1, d))
        if place == "psum":
            self.full = nl.ndarray((parts, d), nl.float32, buffer=nl.psum, name=f"{tag}_bc")
            for c0, n in _chunks(d, fmax):
                nisa.nc_matmul(self.full[:, c0:c0 + n], self.ones, row[:, c0:c0 + n])
            if d * vec.dtype.itemsize <= nl.tile_size.sbuf_size_bytes // 16:
                self.sbuf = nl.ndarray((parts, d), vec.dtype, name=f"{tag}_alt")
                _copy(ACT, self.sbuf, self.full)
            return
        staged = nl.ndarray((parts, d), nl.float32 if place == "sbuf" else vec.dtype, name=f"{tag}_bc")
        for i, (c0, n) in enumerate(_chunks(d, fmax)):
            ps = nl.ndarray((parts, n), nl.float32, buffer=nl.psum, name=f"{tag}_ps")
            nisa.nc_matmul(ps, self.ones, row[:, c0:c0 + n])
            _copy(ACT if i % 2 else VEC, staged[:, c0:c0 + n], ps)
        self.full = staged
        if place == "psum16":
            self.sbuf = staged
            self.full = nl.ndarray((parts, d), vec.dtype, buffer=nl.psum, name=f"{tag}_bc16")
            nisa.tensor_copy(self.full, staged, engine=VEC)

    def alt(self, c0: int, n: int) -> View | None:
        """The SBUF copy of columns c0 .. c0 + n when the broadcast lives in PSUM and has one."""
        return None if self.sbuf is None else self.sbuf[:, c0:c0 + n]

    def get(self, c0: int, n: int) -> View:
        if self.place != "stream":
            return self.full[:, c0:c0 + n]
        row = nl.ndarray((1, n), self.vec.dtype, name=f"{self.tag}_crow")
        nisa.dma_copy(row, self.vec.reshape(1, self.d)[:, c0:c0 + n])
        ps = nl.ndarray((self.parts, n), nl.float32, buffer=nl.psum, name=f"{self.tag}_cps", bufs=2)
        for k0, k in _chunks(n, nl.tile_size.psum_fmax):
            nisa.nc_matmul(ps[:, k0:k0 + k], self.ones, row[:, k0:k0 + k])
        return ps


_BUILD_ORDER = {"sbuf": 0, "stream": 0, "psum16": 1, "psum": 2}


def _make_bcasts(parts: int, named, places) -> dict:
    """_Bcast for each (tag, vector) that is not None. SBUF-placed ones are built first and PSUM-resident
    float32 ones last, so the transient PSUM of each build is free again (see ``_places``)."""
    todo = [(tag, v) for tag, v in named if v is not None]
    order = sorted(range(len(todo)), key=lambda i: _BUILD_ORDER[places[i]])
    return {todo[i][0]: _Bcast(todo[i][1], parts, places[i], todo[i][0]) for i in order}


STREAM_COLS = 1024  # column chunk when a broadcast vector streams: 2 PSUM buffers of 2 banks per vector
SMALL_TILES_BYTES = 8 << 10  # SBUF per partition left for small tiles (statistics, constants, index columns)
# Row slots' worth of large tiles each kernel's pipeline keeps alive at once, by element size (measured: the
# smallest SBUF each kernel places its tiles in, over rows up to 4096 elements, divided by one slot's
# tiles). It sizes the resident-rows decision; when it is off, _Retrying retraces with a smaller budget.
DEPTH = {"rms": {2: 3.0, 4: 2.4}, "ln": {2: 4.0, 4: 2.8}, "bwd": {2: 2.6, 4: 2.0},
         "gn": {2: 4.6, 4: 4.5}, "gnb": {2: 1.0, 4: 0.9}}
_BUDGET = contextvars.ContextVar("norms_budget_scale", default=1.0)


class _Retrying(Kernel):
    """A kernel whose row kernels shrink their SBUF budget and retrace when tile placement overflows SBUF.

    How many tiles a software pipeline keeps alive depends on the allocator's placement, which is only
    known after tracing; the estimate (``DEPTH``) is tuned for speed, and this makes any shape trace: at
    small budgets rows go in small column chunks, which always fit.
    """

    def _trace(self, bound, profile):
        scale = 1.0
        while True:
            token = _BUDGET.set(scale)
            try:
                return super()._trace(bound, profile)
            except (KernelError, IndexError) as e:  # IndexError: the allocator with no free interval left
                if isinstance(e, KernelError) and "SBUF overflow" not in str(e) or scale < 0.1:
                    raise
                scale *= 0.75
            finally:
                _BUDGET.reset(token)


def _kernel(tunables: dict | None = None):
    return lambda fn: _Retrying(fn, None, tunables, 1)


def _places(d: int, vecs, reserved_banks: int = 0) -> list[str]:
    """Where each broadcast vector of ``d`` columns lives: as many as possible resident in PSUM (float32
    preferred, else in their 16-bit dtype), the others in SBUF (up to a quarter of it), else streamed."""
    p = nl.profile()
    free = p.psum_banks - reserved_banks

    def banks(itemsize):
        return -(-d * itemsize // p.psum_bank_bytes)

    def fits(combo):
        if any(c.startswith("psum") for c in combo) and d > p.vector_fmax_psum:
            return False
        used = 0
        for c in sorted(combo, key=_BUILD_ORDER.get):  # build order: a staged build needs one spare bank
            if c in ("sbuf", "psum16") and used + 1 > free:
                return False
            used += banks(4) if c == "psum" else banks(2) if c == "psum16" else 0
        return used <= free

    fallback = "sbuf" if d * 4 <= p.sbuf_partition_bytes // 4 else "stream"
    options = [["psum"] + (["psum16"] if v.dtype.itemsize == 2 else []) + [fallback] for v in vecs]
    best, score = [fallback] * len(vecs), (0, 0)
    for combo in itertools.product(*options):
        if fits(combo):
            sc = (sum(c.startswith("psum") for c in combo), sum(c == "psum" for c in combo))
            if sc > score:
                best, score = list(combo), sc
    return best


def _reserve(d: int, vecs, places) -> int:
    """SBUF bytes per partition the broadcast vectors keep for the whole kernel."""
    total = 0
    for v, place in zip(vecs, places):
        if place == "sbuf":
            total += d * 4
        elif place == "psum16":
            total += d * 2
        elif place == "psum" and d * v.dtype.itemsize <= nl.tile_size.sbuf_size_bytes // 16:
            total += d * v.dtype.itemsize
    return total


class _Engines:
    """Static balancing of streaming work over VectorE, ScalarE and GpSimd by estimated busy time.

    ``pick({engine: cycles})`` returns the engine that would finish the work first and books it.
    """

    def __init__(self):
        p = nl.profile()
        self.ghz = {VEC: p.vector_ghz, ACT: p.scalar_ghz, POOL: p.gpsimd_ghz}
        self.busy = dict.fromkeys(self.ghz, 0.0)

    def pick(self, costs: dict):
        e = min(costs, key=lambda k: self.busy[k] + costs[k] / self.ghz[k])
        self.busy[e] += costs[e] / self.ghz[e]
        return e

    def book(self, engine, cycles: float) -> None:
        self.busy[engine] += cycles / self.ghz[engine]


def _f16(*ts) -> bool:
    return all(t.dtype in (nl.bfloat16, nl.float16) for t in ts)


def _fast_copy() -> int:
    return nl.profile().vector_perf_copy_factor


def _rowsum(eng, dst: View, src: View, junk: View) -> None:
    """dst [P, 1] = sum of src [P, n] over its free dim, in float32."""
    if eng is ACT:
        nisa.activation(junk[:src.shape[0], :src.shape[1]], nl.identity, src, reduce_res=dst)
    else:
        nisa.tensor_reduce(dst, src, nl.add, 1, engine=eng)


def _scale_shift(eng, dst: View, src: View, mul: View, add: View | None) -> None:
    """dst = src * mul + add (per-partition [P, 1] columns)."""
    if eng is ACT:
        nisa.activation(dst, nl.identity, src, bias=add, scale=mul)
    elif add is None:
        nisa.tensor_scalar(dst, src, nl.multiply, mul, engine=eng)
    else:
        nisa.tensor_scalar(dst, src, nl.multiply, mul, op1=nl.add, operand1=add, engine=eng)


def _tt_costs(n: int, dst: View, a: View, b: View) -> dict:
    """Engines that can run tensor_tensor(dst, a, b) and their cycles."""
    split = (a.space is nl.psum) != (b.space is nl.psum)
    vec = n if split or _f16(dst, a, b) else 2 * n
    costs = {VEC: vec}
    if a.space is not nl.psum and b.space is not nl.psum:
        costs[POOL] = 2 * n
    return costs


def _tt(bal: _Engines, dst: View, a: View, b: View, op, b_sbuf: View | None = None) -> None:
    """dst = a op b on the engine that finishes first; ``b_sbuf`` is an SBUF copy of a PSUM ``b`` that
    GpSimd (which cannot read PSUM) may use instead."""
    n = math.prod(dst.shape[1:])
    costs = _tt_costs(n, dst, a, b)
    if b_sbuf is not None and POOL not in costs:
        costs[POOL] = 2 * n
    eng = bal.pick(costs)
    if eng is POOL and b.space is nl.psum:
        b = b_sbuf
    nisa.tensor_tensor(dst, a, b, op, engine=eng)


def _rows_of(t: View | None, np_: int) -> View | None:
    return None if t is None else t[:np_]


def _ts_costs(n: int, dst: View, src: View, act_ok: bool = True) -> dict:
    costs = {VEC: n / _fast_copy() if _f16(dst, src) else n, POOL: n}
    if act_ok:
        costs[ACT] = n
    return costs


def _bcast_last(t: View, k: int) -> View:
    """Append a broadcast (stride 0) dim of size k to an on-chip view."""
    return type(t)(t.owner, t.dtype, t.offset, tuple(t.dims) + ((k, 0),))


def _rows_per_partition(d: int, itemsize: int, requested: int) -> int:
    if requested:
        return max(1, min(requested, (32 << 10) // (d * itemsize)))
    return max(1, (8 << 10) // (d * itemsize))


def _stats_pass(bal, xc: View, j: int, ci: int, n: int, s: View, nm: View, m2: View, junk: View) -> None:
    """Chunk statistics of row slot j: s = sum, nm = -chunk mean, m2 = sum of squares about the chunk mean."""
    _rowsum(bal.pick({ACT: n, VEC: n, POOL: n}), s[:, j, ci:ci + 1], xc, junk)
    nisa.activation(nm[:, j, ci:ci + 1], nl.identity, s[:, j, ci:ci + 1], scale=-1.0 / n)
    nisa.activation(junk[:xc.shape[0], :n], nl.square, xc, bias=nm[:, j, ci:ci + 1], reduce_res=m2[:, j, ci:ci + 1])
    bal.book(ACT, n)


def _combine(np_: int, nj: int, chunks, s: View, nm: View, m2: View, d: int, counts: View | None):
    """Chan's combination of chunk statistics: (-mean [np, nj], M2 [np, nj]) over whole rows."""
    nch = len(chunks)
    if nch == 1:
        return nm[:, :, 0], m2[:, :, 0]
    tot = nl.ndarray((np_, nj), nl.float32, name="c_tot")
    nisa.tensor_reduce(tot, s, nl.add, 2, engine=VEC)
    negmean = nl.ndarray((np_, nj), nl.float32, name="c_nmean")
    nisa.activation(negmean, nl.identity, tot, scale=-1.0 / d)
    diff = nl.ndarray((np_, nj, nch), nl.float32, name="c_diff")
    nisa.tensor_tensor(diff, nm, _bcast_last(negmean, nch), nl.subtract, engine=VEC)
    nisa.tensor_tensor(diff, diff, diff, nl.multiply, engine=VEC)
    cnt = type(counts)(counts.owner, counts.dtype, counts.offset,
                       (counts.dims[0], (nj, 0), counts.dims[1]))[:np_]
    nisa.tensor_tensor(diff, diff, cnt, nl.multiply, engine=VEC)
    nisa.tensor_tensor(diff, diff, m2, nl.add, engine=VEC)
    tm2 = nl.ndarray((np_, nj), nl.float32, name="c_m2")
    nisa.tensor_reduce(tm2, diff, nl.add, 2, engine=VEC)
    return negmean, tm2


def _chunk_counts(parts: int, chunks) -> View | None:
    if len(chunks) == 1:
        return None
    t = nl.ndarray((parts, len(chunks)), nl.float32, name="counts")
    for ci, (_, n) in enumerate(chunks):
        nisa.memset(t[:, ci:ci + 1], float(n), engine=VEC)
    return t


class _Queues:
    """Explicit DMA queues: loads and stores on disjoint queue sets, so a store waiting for compute never
    holds up the loads behind it."""

    def __init__(self):
        q = nl.profile().dma_queues
        self.loads = list(range(q // 2)) or [0]
        self.stores = list(range(q // 2, q)) or [0]
        self.nl = self.ns = 0

    def load(self, dst, src):
        nisa.dma_copy(dst, src, queue=self.loads[self.nl % len(self.loads)])
        self.nl += 1

    def store(self, dst, src):
        nisa.dma_copy(dst, src, queue=self.stores[self.ns % len(self.stores)])
        self.ns += 1


def _pipeline(slots, *stages, lag: int = 2) -> None:
    """Software pipelining: stage i of slot k is issued with stage 0 of slot k + i * lag.

    Every stage returns the state the next one takes (``stage(slot, state)``; stage 0 gets None). Each
    engine's in-order queue then holds work of different slots, so a chain of dependent instructions
    that crosses engines (stats -> scale -> multiply -> add) does not serialize them.
    """
    slots = list(slots)
    state = [None] * len(slots)
    n, depth = len(slots), len(stages)
    for step in range(n + (depth - 1) * lag):
        for i in reversed(range(depth)):
            k = step - i * lag
            if 0 <= k < n:
                state[k] = stages[i](slots[k], state[k])


class _Tile:
    """One row tile: rows r0 .. r0 + np * nj, partition p holding rows r0 + p * nj + j."""

    def __init__(self, r0: int, np_: int, nj: int):
        self.r0, self.np, self.nj = r0, np_, nj

    def rows(self, t2d: View) -> View:
        """The tile's rows of an HBM [rows, D] view as [np, nj, D]."""
        return t2d[self.r0:self.r0 + self.np * self.nj].reshape(self.np, self.nj, t2d.shape[1])


def _slots(rows: int, parts: int, nj: int):
    for r0, np_, k in _row_tiles(rows, parts, nj):
        tile = _Tile(r0, np_, k)
        for j in range(k):
            yield tile, j


def _default_eps(dtype, eps):
    """``eps=None``: the machine epsilon of the computation dtype, float32 for every device dtype (16-bit inputs
    compute in float32), as torch's rms_norm takes it."""
    if eps is not None:
        return float(eps)
    return 2.0 ** -23


def _stat_shape(x: View) -> tuple[int, ...]:
    return tuple(x.shape[:-1]) + (1,)


# ---------------------------------------------------------------------------------------------
# row kernels: tiling, chunking and pipelining shared by layer_norm and rms_norm
# ---------------------------------------------------------------------------------------------
class _RowKernel:
    """Shared setup of the row-wise kernels: tiling, chunking, queues, engine balance.

    A kernel is a list of phases ``(fns, after)``. Each ``fn(slot, ctx, ci, item) -> item`` handles
    chunk ``ci`` of a row slot (``item`` is what the previous fn returned for that chunk, None for the
    first fn of a phase over chunked rows; ``ctx`` is a per-slot dict); ``after(slot, ctx)`` runs once
    the phase saw every chunk. Rows that stay resident (one chunk) get one pipeline stage per fn, items
    flowing through all phases; chunked rows get one stage per phase, streaming each chunk through the
    phase's fns so only one chunk's tiles are alive at a time (a later phase reloads what it needs).
    """

    def __init__(self, rows: int, d: int, io_dtypes, tmp_tiles: int, rows_per_tile: int = 0,
                 streaming: bool = False, depth: float = 4.0, parts: int | None = None, reserve: int = 0,
                 share: float = 1.0):
        """``io_dtypes``: dtypes of the row tiles kept whole per row tile (inputs and the output);
        ``tmp_tiles``: float32 temporaries of one row slot; ``depth``: how many row slots' tiles the
        kernel's pipeline keeps alive at once (measured for each kernel: tiles are placed by liveness);
        ``reserve``: SBUF bytes per partition held by other tiles (broadcast vectors); ``share``: the
        fraction of SBUF this pass may use (for kernels with two passes). Rows stay whole in SBUF when
        that fits, else go in column chunks."""
        self.P = parts or nl.tile_size.pmax
        self.rows, self.d = rows, d
        budget = int((nl.tile_size.sbuf_size_bytes - reserve - SMALL_TILES_BYTES) * share * _BUDGET.get())
        io = sum(nl.float32.itemsize if dt is None else dt.itemsize for dt in io_dtypes)
        tmp = 4 * tmp_tiles

        def need(cols, nj):  # live tiles of `depth` row slots, plus the junk tile
            return depth * cols * (nj * io + tmp) + 2 * cols

        isz = max(dt.itemsize for dt in io_dtypes if dt is not None)
        want = _rows_per_partition(d, isz, rows_per_tile)
        fits = [nj for nj in dict.fromkeys((want, 1)) if need(d, nj) <= budget]
        self.resident = bool(fits)
        if self.resident:
            self.nj, dc = fits[0], d
        else:
            self.nj = 1
            dc = max(512, int(budget // (depth * (io + tmp) + 2)) // 512 * 512)
            dc = min(dc, STREAM_COLS if streaming else 2048)
        self.chunks = _chunks(d, dc)
        self.dc = dc
        self.q, self.bal = _Queues(), _Engines()
        self.junk = nl.ndarray((self.P, dc), nl.bfloat16, name="junk", bufs=1)

    def load_rows(self, t: _Tile, name: str, hbm2d: View, dtype) -> None:
        """Load the tile's rows of an input, kept whole for all its row slots (resident rows only)."""
        if not self.resident:
            return
        tile = nl.ndarray((t.np, t.nj, self.d), dtype, name=name)
        self.q.load(tile, t.rows(hbm2d))
        setattr(t, name, tile)

    def chunk_in(self, t: _Tile, hbm_rows: View, j: int, ci: int, name: str, dtype) -> View:
        """Row slot j, chunk ci of an input: a view of the resident tile, or a fresh chunk load."""
        c0, n = self.chunks[ci]
        if self.resident:
            return getattr(t, name)[:, j, c0:c0 + n]
        tile = nl.ndarray((t.np, n), dtype, name=name + "c")
        self.q.load(tile, hbm_rows[:, j, c0:c0 + n])
        return tile

    def out_chunk(self, t: _Tile, j: int, ci: int, name: str, dtype) -> View:
        """Where chunk ci of row slot j of the output is written before its store."""
        c0, n = self.chunks[ci]
        if self.resident:
            if not hasattr(t, name):
                setattr(t, name, nl.ndarray((t.np, t.nj, self.d), dtype, name=name))
            return getattr(t, name)[:, j, c0:c0 + n]
        return nl.ndarray((t.np, n), dtype, name=name + "c")

    def store_chunk(self, t: _Tile, j: int, ci: int, name: str, hbm2d: View, tile: View) -> None:
        """Store an output chunk (chunked rows) or, after the tile's last row slot, the whole tile."""
        c0, n = self.chunks[ci]
        if not self.resident:
            self.q.store(t.rows(hbm2d)[:, j, c0:c0 + n], tile)
        elif j == t.nj - 1:
            self.q.store(t.rows(hbm2d), getattr(t, name))

    def run(self, phases, lag: int) -> None:
        stages = []
        nch = len(self.chunks)
        for fns, after in phases:
            if self.resident:
                last = len(fns) - 1
                for i, f in enumerate(fns):  # the item carries over phases: nothing is dropped
                    def stage(slot, carry, f=f, after=after if i == last else None):
                        ctx, item = carry if carry is not None else ({}, None)
                        item = f(slot, ctx, 0, item)
                        if after is not None:
                            after(slot, ctx)
                        return ctx, item
                    stages.append(stage)
            else:
                def stage(slot, carry, fns=fns, after=after):
                    ctx = carry[0] if carry is not None else {}
                    for ci in range(nch):
                        item = None
                        for f in fns:
                            item = f(slot, ctx, ci, item)
                    if after is not None:
                        after(slot, ctx)
                    return ctx, None
                stages.append(stage)
        _pipeline(_slots(self.rows, self.P, self.nj), *stages, lag=lag)


# ---------------------------------------------------------------------------------------------
# rms_norm
# ---------------------------------------------------------------------------------------------
@_kernel(tunables={"rows_per_tile": (0, 1, 2, 4)})
def rms_norm(x, weight=None, eps=None, rows_per_tile=0):
    """torch ``_fused_rms_norm`` / ``F.rms_norm`` over the last dim: returns ``(out, rstd)``.

    ``out = x * rstd * weight`` in x's dtype (float32 math, one rounding); ``rstd = 1 / sqrt(mean(x**2)
    + eps)``, float32, shape ``x.shape[:-1] + (1,)``. ``weight`` (``[D]``, any float dtype) is optional;
    ``eps=None`` means float32's machine epsilon (the computation dtype's), as in torch. ``rows_per_tile``: rows
    per partition in one
    DMA (0: about 8 KiB per partition).
    """
    _check_float("x", x)
    _check_float("weight", weight)
    x2, rows, d = _rows_2d(x)
    if weight is not None and tuple(weight.shape) != (d,):
        raise KernelError(f"rms_norm: weight shape {list(weight.shape)} must be [{d}]")
    eps = _default_eps(x.dtype, eps)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm, name="out")
    rstd = nl.ndarray(_stat_shape(x), nl.float32, buffer=nl.hbm, name="rstd")
    if rows == 0 or d == 0:
        return out, rstd
    out2, rstd2 = out.reshape(rows, d), rstd.reshape(rows, 1)
    vecs = [weight] if weight is not None else []
    places = _places(d, vecs)
    k = _RowKernel(rows, d, (x.dtype, x.dtype), 1, rows_per_tile, "stream" in places,
                   depth=DEPTH["rms"][x.dtype.itemsize],
                   reserve=_reserve(d, vecs, places))
    P, q, bal, chunks = k.P, k.q, k.bal, k.chunks
    wb = _make_bcasts(P, (("w", weight),), places).get("w")
    eps_col = _col(eps, P, "eps")

    def sumsq(slot, ctx, ci, _):
        t, j = slot
        if j == 0 and ci == 0:
            t.rs = nl.ndarray((t.np, t.nj), nl.float32, name="rs")
            k.load_rows(t, "x", x2, x.dtype)
        if ci == 0:
            ctx["ss"] = nl.ndarray((t.np, len(chunks)), nl.float32, name="ss")
        xc = k.chunk_in(t, t.rows(x2), j, ci, "x", x.dtype)
        n = chunks[ci][1]
        nisa.activation(k.junk[:t.np, :n], nl.square, xc, reduce_res=ctx["ss"][:, ci:ci + 1])
        bal.book(ACT, n)

    def rsqrt(slot, ctx):
        t, j = slot
        tot = ctx["ss"]
        if len(chunks) > 1:
            tot = nl.ndarray((t.np, 1), nl.float32, name="sstot")
            nisa.tensor_reduce(tot, ctx["ss"], nl.add, 1, engine=VEC)
        nisa.activation(t.rs[:, j:j + 1], nl.rsqrt, tot, bias=eps_col[:t.np], scale=1.0 / d)

    def scale(slot, ctx, ci, _):
        t, j = slot
        n = chunks[ci][1]
        xc = k.chunk_in(t, t.rows(x2), j, ci, "x", x.dtype)
        oc = k.out_chunk(t, j, ci, "o", x.dtype) if wb is None else \
            nl.ndarray((t.np, n), nl.float32, name="xs")
        costs = _ts_costs(n, oc, xc)
        if wb is not None and wb.place.startswith("psum"):
            costs.pop(VEC)  # VectorE is the engine that reads the PSUM weight next
        _scale_shift(bal.pick(costs), oc, xc, t.rs[:, j:j + 1], None)
        return oc

    def weigh(slot, ctx, ci, oc):
        t, j = slot
        c0, n = chunks[ci]
        if wb is not None:
            xsc, oc = oc, k.out_chunk(t, j, ci, "o", x.dtype)
            _tt(bal, oc, xsc, wb.get(c0, n)[:t.np], nl.multiply, _rows_of(wb.alt(c0, n), t.np))
        k.store_chunk(t, j, ci, "o", out2, oc)

    def store_rstd(slot, ctx):
        t, j = slot
        if j == t.nj - 1:
            q.store(rstd2[t.r0:t.r0 + t.np * t.nj].reshape(t.np, t.nj), t.rs)

    k.run([((sumsq,), rsqrt), ((scale, weigh), store_rstd)], lag=3)
    return out, rstd


# ---------------------------------------------------------------------------------------------
# layer_norm
# ---------------------------------------------------------------------------------------------
@_kernel(tunables={"rows_per_tile": (0, 1, 2, 4)})
def layer_norm(x, weight=None, bias=None, eps=1e-5, rows_per_tile=0, out_dtype=None):
    """torch ``native_layer_norm`` over the last dim: returns ``(out, mean, rstd)``.

    ``out = (x - mean) * rstd * weight + bias`` in x's dtype (float32 math, one rounding); ``mean`` and
    ``rstd = 1 / sqrt(var + eps)`` (biased variance, from centered values) are float32 of shape
    ``x.shape[:-1] + (1,)``. ``weight`` and ``bias`` (``[D]``, any float dtype) are optional. ``out_dtype``:
    ``out`` computed in x's dtype as above, then converted by the store DMA (the output followed by a cast).
    """
    _check_float("x", x)
    _check_float("weight", weight)
    _check_float("bias", bias)
    x2, rows, d = _rows_2d(x)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and tuple(v.shape) != (d,):
            raise KernelError(f"layer_norm: {name} shape {list(v.shape)} must be [{d}]")
    odt = x.dtype if out_dtype is None else DType.of(out_dtype)
    if not odt.is_float:
        raise KernelError(f"layer_norm: out_dtype must be a float dtype, got {odt}")
    out = nl.ndarray(x.shape, odt, buffer=nl.hbm, name="out")
    mean = nl.ndarray(_stat_shape(x), nl.float32, buffer=nl.hbm, name="mean")
    rstd = nl.ndarray(_stat_shape(x), nl.float32, buffer=nl.hbm, name="rstd")
    if rows == 0:
        return out, mean, rstd
    if d == 0:
        raise KernelError("layer_norm: the normalized dim is empty")
    out2, mean2, rstd2 = out.reshape(rows, d), mean.reshape(rows, 1), rstd.reshape(rows, 1)
    vecs = [v for v in (weight, bias) if v is not None]
    places = _places(d, vecs)
    k = _RowKernel(rows, d, (x.dtype, x.dtype), 1, rows_per_tile, "stream" in places,
                   depth=DEPTH["ln"][x.dtype.itemsize],
                   reserve=_reserve(d, vecs, places))
    P, q, bal, chunks = k.P, k.q, k.bal, k.chunks
    bc = _make_bcasts(P, (("w", weight), ("b", bias)), places)
    wb, bb = bc.get("w"), bc.get("b")
    eps_col = _col(eps, P, "eps")
    counts = _chunk_counts(P, chunks)
    nch = len(chunks)
    # x * rstd - mean * rstd on ScalarE rounds twice before cancelling: only where the output is 16-bit
    act_xhat = x.dtype.itemsize == 2

    def stats(slot, ctx, ci, _):
        t, j = slot
        if j == 0 and ci == 0:
            t.rs = nl.ndarray((t.np, t.nj), nl.float32, name="rs")
            t.mo = nl.ndarray((t.np, t.nj), nl.float32, name="mo")
            k.load_rows(t, "x", x2, x.dtype)
        if ci == 0:
            for key in ("s", "nm", "m2"):
                ctx[key] = nl.ndarray((t.np, 1, nch), nl.float32, name=key)
        xc = k.chunk_in(t, t.rows(x2), j, ci, "x", x.dtype)
        _stats_pass(bal, xc, 0, ci, chunks[ci][1], ctx["s"], ctx["nm"], ctx["m2"], k.junk)

    def finish_stats(slot, ctx):
        t, j = slot
        negmean, tm2 = _combine(t.np, 1, chunks, ctx["s"], ctx["nm"], ctx["m2"], d, counts)
        nisa.activation(t.rs[:, j:j + 1], nl.rsqrt, tm2, bias=eps_col[:t.np], scale=1.0 / d)
        nisa.activation(t.mo[:, j:j + 1], nl.identity, negmean, scale=-1.0)
        ctx["negmean"] = negmean
        if act_xhat:
            ctx["nmr"] = nl.ndarray((t.np, 1), nl.float32, name="nmr")
            nisa.activation(ctx["nmr"], nl.identity, negmean, scale=t.rs[:, j:j + 1])

    def normalize(slot, ctx, ci, _):
        t, j = slot
        n = chunks[ci][1]
        rs = t.rs[:, j:j + 1]
        xc = k.chunk_in(t, t.rows(x2), j, ci, "x", x.dtype)
        if wb is None and bb is None:
            xh = k.out_chunk(t, j, ci, "o", x.dtype)
        else:
            xh = nl.ndarray((t.np, n), nl.float32, name="xh")
        costs = _ts_costs(n, xh, xc, act_ok=act_xhat)
        if wb is not None and wb.place.startswith("psum"):
            costs.pop(VEC)  # VectorE is the engine that reads the PSUM weight next
        eng = bal.pick(costs)
        if eng is ACT:
            nisa.activation(xh, nl.identity, xc, bias=ctx["nmr"], scale=rs)
        else:  # (x - mean) * rstd, as torch rounds it
            nisa.tensor_scalar(xh, xc, nl.add, ctx["negmean"], op1=nl.multiply, operand1=rs, engine=eng)
        return xh

    def affine_w(slot, ctx, ci, xh):
        t, j = slot
        c0, n = chunks[ci]
        if wb is None:
            return xh
        o = k.out_chunk(t, j, ci, "o", x.dtype) if bb is None else xh  # in place: xhat * w
        _tt(bal, o, xh, wb.get(c0, n)[:t.np], nl.multiply, _rows_of(wb.alt(c0, n), t.np))
        return o

    def affine_b(slot, ctx, ci, o):
        t, j = slot
        c0, n = chunks[ci]
        if bb is not None:
            src, o = o, k.out_chunk(t, j, ci, "o", x.dtype)
            _tt(bal, o, src, bb.get(c0, n)[:t.np], nl.add, _rows_of(bb.alt(c0, n), t.np))
        k.store_chunk(t, j, ci, "o", out2, o)

    def store_stats(slot, ctx):
        t, j = slot
        if j == t.nj - 1:
            span = slice(t.r0, t.r0 + t.np * t.nj)
            q.store(mean2[span].reshape(t.np, t.nj), t.mo)
            q.store(rstd2[span].reshape(t.np, t.nj), t.rs)

    fns = (normalize,) + ((affine_w,) if wb is not None else ()) + (affine_b,)
    k.run([((stats,), finish_stats), (fns, store_stats)], lag=2)
    return out, mean, rstd


# ---------------------------------------------------------------------------------------------
# backward of layer_norm / rms_norm
# ---------------------------------------------------------------------------------------------
class _ColAcc:
    """Column sums over rows on TensorE, into a float32 PSUM accumulator that lives across all row tiles.

    The accumulator is kept as [128 columns, blocks]: a block of up to 128 columns of the source is the
    stationary operand and ones[np, 1] the moving one, so each matmul costs ~64 cycles per 128 columns.
    ``store(dst)`` transposes the blocks back into rows and writes ``dst`` [D].
    """

    def __init__(self, d: int, tag: str):
        self.P = nl.tile_size.pmax
        self.d, self.tag = d, tag
        self.nblk = -(-d // self.P)
        self.acc = nl.ndarray((self.P, self.nblk), nl.float32, buffer=nl.psum, name=f"{tag}_acc")
        self.ones = {}
        self.used = False

    @staticmethod
    def banks(d: int) -> int:
        p = nl.profile()
        return -(-(-(-d // p.pmax) * 4) // p.psum_bank_bytes)

    def _ones(self, dtype):
        if dtype not in self.ones:
            t = nl.ndarray((self.P, 1), dtype, name=f"{self.tag}_one")
            nisa.memset(t, 1.0, engine=POOL)
            self.ones[dtype] = t
        return self.ones[dtype]

    def add(self, src: View, c0: int) -> None:
        """Add the column sums of ``src`` [np, n] into columns c0 .. c0 + n."""
        np_, n = src.shape
        ones = self._ones(src.dtype)[:np_]
        b0 = c0
        while b0 < c0 + n:
            blk, off = divmod(b0, self.P)
            w = min(self.P - off, c0 + n - b0)
            nisa.nc_matmul(self.acc[off:off + w, blk:blk + 1], src[:, b0 - c0:b0 - c0 + w], ones)
            b0 += w
        self.used = True

    def store(self, dst: View) -> None:
        P, d = self.P, self.d
        sb = nl.ndarray((P, self.nblk), nl.float32, name=f"{self.tag}_sb")
        if self.used:
            nisa.tensor_copy(sb, self.acc, engine=VEC)
        else:  # no rows: the sums are zero
            nisa.memset(sb, 0.0, engine=VEC)
        full = d // P
        for g0 in range(0, self.nblk, P):
            nb = min(P, self.nblk - g0)
            tp = nl.ndarray((nb, P), nl.float32, buffer=nl.psum, name=f"{self.tag}_tp")
            nisa.nc_transpose(tp, sb[:, g0:g0 + nb])
            rows = nl.ndarray((nb, P), dst.dtype, name=f"{self.tag}_rows")
            nisa.tensor_copy(rows, tp, engine=VEC)
            nfull = max(0, min(nb, full - g0))
            if nfull:
                nisa.dma_copy(dst[g0 * P:(g0 + nfull) * P].reshape(nfull, P), rows[:nfull])
            if g0 + nb > full and d % P:
                nisa.dma_copy(dst[full * P:d].reshape(1, d % P), rows[full - g0:full - g0 + 1, :d % P])


def _norm_backward(centered: bool, dy, x, mean, rstd, weight, mask, rows_per_tile: int, residual=None,
                   cast_dtype=None):
    """grad_input (+ residual, and its cast), grad_weight, grad_bias (``centered``: layer_norm) of
    ``out = xhat * weight (+ bias)`` with ``xhat = (x - mean) * rstd`` (rms_norm: ``x * rstd``)."""
    name = "layer_norm_backward" if centered else "rms_norm_backward"
    for nm_, t in (("grad_out", dy), ("input", x), ("weight", weight), ("rstd", rstd), ("mean", mean),
                   ("residual", residual)):
        _check_float(nm_, t)
    cdt = _grad_epilogue(name, x, mask, residual, cast_dtype)
    if tuple(dy.shape) != tuple(x.shape):
        raise KernelError(f"{name}: grad_out {list(dy.shape)} and input {list(x.shape)} differ")
    x2, rows, d = _rows_2d(x)
    dy2 = dy.reshape(rows, d)
    for nm_, t in (("rstd", rstd), ("mean", mean)):
        if t is not None and math.prod(t.shape) != rows:
            raise KernelError(f"{name}: {nm_} has {math.prod(t.shape)} elements for {rows} rows")
    if weight is not None and tuple(weight.shape) != (d,):
        raise KernelError(f"{name}: weight shape {list(weight.shape)} must be [{d}]")
    want_dx, want_dw, want_db = mask[0], mask[1], centered and mask[2]
    if want_dw and weight is None:
        raise KernelError(f"{name}: grad_weight requested (output_mask[1]) without a weight")
    pdtype = weight.dtype if weight is not None else dy.dtype
    dx = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm, name="grad_input") if want_dx else None
    cast = nl.ndarray(x.shape, cdt, buffer=nl.hbm, name="grad_input_cast") if cdt is not None else None
    dw = nl.ndarray((d,), pdtype, buffer=nl.hbm, name="grad_weight") if want_dw else None
    db = nl.ndarray((d,), pdtype, buffer=nl.hbm, name="grad_bias") if want_db else None
    outs = tuple(o for o in (dx, cast, dw, db) if o is not None)
    if not outs:
        raise KernelError(f"{name}: output_mask {tuple(mask)} asks for nothing")
    if d == 0:
        return outs
    accs = {}
    if want_dw:
        accs["w"] = _ColAcc(d, "dw")
    if want_db:
        accs["b"] = _ColAcc(d, "db")
    if rows:
        dxs = None if dx is None else _GradOut(dx.reshape(rows, d), _2d(residual, rows, d), _2d(cast, rows, d))
        _norm_backward_rows(centered, dy2, x2, mean, rstd, weight, dxs, accs, rows, d, rows_per_tile)
    for key, dst in (("w", dw), ("b", db)):
        if key in accs:
            accs[key].store(dst)
    return outs


def _grad_epilogue(name: str, x: View, mask, residual: View | None, cast_dtype):
    """Check the grad_input epilogue (a residual added, a cast written); returns the cast's DType or None."""
    if (residual is not None or cast_dtype is not None) and not mask[0]:
        raise KernelError(f"{name}: residual and cast_dtype apply to grad_input, which output_mask[0] turns off")
    if residual is not None and tuple(residual.shape) != tuple(x.shape):
        raise KernelError(f"{name}: residual {list(residual.shape)} must have input's shape {list(x.shape)}")
    if cast_dtype is None:
        return None
    cdt = DType.of(cast_dtype)
    if cdt not in nl.COMPUTE_FLOATS:
        raise KernelError(f"{name}: cast_dtype is {cdt}; it must be float32, bfloat16 or float16")
    return cdt


def _2d(t: View | None, rows: int, d: int) -> View | None:
    return None if t is None else t.reshape(rows, d)


class _GradOut:
    """Where grad_input goes ([rows, D] HBM views): ``dx`` (x's dtype; ``residual`` added to each rounded tile
    in float32, rounded once to dx's dtype: the add after the backward) and ``cast`` (the stored values in
    another dtype, converted by a second store DMA: the cast after it)."""

    def __init__(self, dx: View, residual: View | None, cast: View | None):
        self.dx, self.residual, self.cast = dx, residual, cast
        self.dtype = dx.dtype


# backward: float32 tiles per element of a resident row slot (xhat, g -> gs, q -> gx) and the pipeline lag
_BWD_F32_TILES = 3
_BWD_LAG = 1


def _norm_backward_rows(centered, dy2, x2, mean, rstd, weight, dx, accs, rows, d, rows_per_tile):
    """dx = rstd * g - rstd * sum(g) / D - xhat * rstd * sum(g * xhat) / D with g = dy * w (layer_norm;
    rms_norm drops the sum(g) term); dw += dy * xhat and db += dy on TensorE."""
    vecs = [weight] if weight is not None else []
    places = _places(d, vecs, reserved_banks=len(accs) * _ColAcc.banks(d))
    isz = max(x2.dtype.itemsize, dy2.dtype.itemsize)
    res = dx.residual if dx is not None else None
    # the residual is one more whole row tile per row tile (the sum is written over the dx tile, in place)
    io = (x2.dtype, dy2.dtype, dx.dtype if dx is not None else None) + ((res.dtype,) if res is not None else ())
    k = _RowKernel(rows, d, io, _BWD_F32_TILES, rows_per_tile, "stream" in places, depth=DEPTH["bwd"][isz],
                   reserve=_reserve(d, vecs, places))
    P, q, bal, chunks = k.P, k.q, k.bal, k.chunks
    wb = _make_bcasts(P, (("w", weight),), places).get("w")
    dx2 = dx.dx if dx is not None else None
    rstd2 = rstd.reshape(rows, 1)
    mean2 = mean.reshape(rows, 1) if centered else None
    nch = len(chunks)
    act_xhat = not centered or isz == 2  # x*rstd - mean*rstd on ScalarE only where inputs are 16-bit
    need_q = "w" in accs or weight is None
    b_scaled = weight is not None and not need_q  # B is then summed from gs = rstd * g
    inv_d = 1.0 / d

    def setup(t):
        span = slice(t.r0, t.r0 + t.np * t.nj)
        t.rs = nl.ndarray((t.np, t.nj), nl.float32, name="rs")
        q.load(t.rs, rstd2[span].reshape(t.np, t.nj))
        t.nrs = nl.ndarray((t.np, t.nj), nl.float32, name="nrs")
        nisa.activation(t.nrs, nl.identity, t.rs, scale=-inv_d)
        if centered:
            t.nm = nl.ndarray((t.np, t.nj), nl.float32, name="nm")
            q.load(t.nm, mean2[span].reshape(t.np, t.nj))
            nisa.activation(t.nm, nl.identity, t.nm, scale=-1.0)
            if act_xhat:
                t.nmr = nl.ndarray((t.np, t.nj), nl.float32, name="nmr")
                nisa.tensor_tensor(t.nmr, t.nm, t.rs, nl.multiply, engine=VEC)
        k.load_rows(t, "x", x2, x2.dtype)
        k.load_rows(t, "dy", dy2, dy2.dtype)

    def xhat(t, j, ci):
        n = chunks[ci][1]
        xc = k.chunk_in(t, t.rows(x2), j, ci, "x", x2.dtype)
        xh = nl.ndarray((t.np, n), nl.float32, name="xh")
        eng = bal.pick(_ts_costs(n, xh, xc, act_ok=act_xhat))
        rs = t.rs[:, j:j + 1]
        if not centered:
            _scale_shift(eng, xh, xc, rs, None)
        elif eng is ACT:
            nisa.activation(xh, nl.identity, xc, bias=t.nmr[:, j:j + 1], scale=rs)
        else:  # (x - mean) * rstd, as torch rounds it
            nisa.tensor_scalar(xh, xc, nl.add, t.nm[:, j:j + 1], op1=nl.multiply, operand1=rs, engine=eng)
        return xh

    def grad(t, j, ci):
        c0, n = chunks[ci]
        dyc = k.chunk_in(t, t.rows(dy2), j, ci, "dy", dy2.dtype)
        if wb is None:
            return dyc, dyc
        g = nl.ndarray((t.np, n), nl.float32, name="g")
        _tt(bal, g, dyc, wb.get(c0, n)[:t.np], nl.multiply, _rows_of(wb.alt(c0, n), t.np))
        return dyc, g

    def f_a(slot, ctx, ci, _):  # xhat, g = dy * w
        t, j = slot
        if j == 0 and ci == 0:
            setup(t)
        if ci == 0:
            ctx["sums"] = nl.ndarray((t.np, 2, nch), nl.float32, name="sums")
        return (xhat(t, j, ci),) + grad(t, j, ci)

    def f_b(slot, ctx, ci, item):  # gs = rstd * g (+ its row sum), q = dy * xhat, column sums on TensorE
        t, j = slot
        xh, dyc, g = item
        c0, n = chunks[ci]
        gs = g if g.dtype is nl.float32 and g is not dyc else nl.ndarray((t.np, n), nl.float32, name="gs")
        if centered:
            nisa.activation(gs, nl.identity, g, scale=t.rs[:, j:j + 1], reduce_res=ctx["sums"][:, 0, ci:ci + 1])
            bal.book(ACT, n)
        else:
            _scale_shift(bal.pick(_ts_costs(n, gs, g)), gs, g, t.rs[:, j:j + 1], None)
        qq = None
        if need_q:
            qq = nl.ndarray((t.np, n), nl.float32, name="q")
            _tt(bal, qq, dyc, xh, nl.multiply)
            if "w" in accs:
                accs["w"].add(qq, c0)
        if "b" in accs:
            accs["b"].add(dyc, c0)
        return xh, g, gs, qq

    def f_c(slot, ctx, ci, item):  # B = sum(g * xhat)
        t, j = slot
        xh, g, gs, qq = item
        c0, n = chunks[ci]
        if wb is None:
            gx = qq
        elif qq is not None:  # in place: q is only read by the column sums, issued before
            gx = qq
            _tt(bal, gx, qq, wb.get(c0, n)[:t.np], nl.multiply, _rows_of(wb.alt(c0, n), t.np))
        else:  # g was scaled in place into gs = rstd * g: B = sum(gs * xhat) / rstd
            gx = nl.ndarray((t.np, n), nl.float32, name="gx")
            _tt(bal, gx, g, xh, nl.multiply)
        _rowsum(bal.pick({ACT: n, VEC: n, POOL: n}), ctx["sums"][:, 1, ci:ci + 1], gx, k.junk)
        if res is not None and j == 0 and ci == 0:  # loaded two stages before its add: alive no longer than that
            k.load_rows(t, "r", res, res.dtype)
        return xh, gs

    def totals(slot, ctx):
        t, j = slot
        tot = ctx["sums"]
        if nch > 1:
            tot = nl.ndarray((t.np, 2, 1), nl.float32, name="tot")
            nisa.tensor_reduce(tot, ctx["sums"], nl.add, 2, engine=VEC)
        ctx["tot"] = tot

    def f_d(slot, ctx, ci, item):  # t = xhat * (-rstd * B / D) - A_s / D
        t, j = slot
        n = chunks[ci][1]
        if item is not None:
            xh, gs = item
        else:  # chunked rows: the chunk was dropped after the statistics; recompute
            xh = xhat(t, j, ci)
            _, g = grad(t, j, ci)
            gs = nl.ndarray((t.np, n), nl.float32, name="gs2")
            _scale_shift(bal.pick(_ts_costs(n, gs, g)), gs, g, t.rs[:, j:j + 1], None)
        tot = ctx["tot"]
        tt_ = xh  # in place: xhat is not needed after this
        eng = bal.pick(_ts_costs(n, tt_, xh))
        c1 = nl.ndarray((t.np, 1), nl.float32, name="c1")
        c0_ = nl.ndarray((t.np, 1), nl.float32, name="c0") if centered else None
        c1_scale = -inv_d if b_scaled else t.nrs[:, j:j + 1]
        if eng is ACT:
            nisa.activation(c1, nl.identity, tot[:, 1, :], scale=c1_scale)
            if centered:
                nisa.activation(c0_, nl.identity, tot[:, 0, :], scale=-inv_d)
        else:
            nisa.tensor_scalar(c1, tot[:, 1, :], nl.multiply, c1_scale, engine=eng)
            if centered:
                nisa.tensor_scalar(c0_, tot[:, 0, :], nl.multiply, -inv_d, engine=eng)
        _scale_shift(eng, tt_, xh, c1, c0_)
        return gs, tt_

    def f_e(slot, ctx, ci, item):  # dx = gs + t (rounded), + residual (rounded again), stored and cast
        t, j = slot
        gs, tt_ = item
        o = k.out_chunk(t, j, ci, "o", dx2.dtype)
        _tt(bal, o, gs, tt_, nl.add)
        if res is not None:  # in place: the rounded dx is read once, by this add
            _tt(bal, o, o, k.chunk_in(t, t.rows(res), j, ci, "r", res.dtype), nl.add)
        k.store_chunk(t, j, ci, "o", dx2, o)
        if dx.cast is not None:
            k.store_chunk(t, j, ci, "o", dx.cast, o)

    if dx2 is None:
        k.run([((f_a, f_b), None)], lag=2)
    else:
        k.run([((f_a, f_b, f_c), totals), ((f_d, f_e), None)], lag=_BWD_LAG)


@_kernel(tunables={"rows_per_tile": (0, 1, 2)})
def layer_norm_backward(grad_out, input, mean, rstd, weight=None, output_mask=(True, True, True),  # noqa: A002
                        rows_per_tile=0, residual=None, cast_dtype=None):
    """torch ``native_layer_norm_backward`` over the last dim.

    ``mean``/``rstd`` are the forward's (any float dtype, one value per row). Returns the outputs that
    ``output_mask`` asks for, in order: ``grad_input`` (input's dtype), ``grad_weight`` and
    ``grad_bias`` (``[D]``, the weight's dtype, else grad_out's). grad_weight needs a weight.

    With grad_input: ``residual`` (input's shape, any float dtype) is added to it, as an add after the
    backward computes it (grad_input rounded to its dtype, the sum in float32 rounded once to it); ``cast_dtype``
    adds an output right after grad_input: the same values converted to that dtype (round to nearest even).
    """
    return _norm_backward(True, grad_out, input, mean, rstd, weight, tuple(output_mask), rows_per_tile,
                          residual, cast_dtype)


@_kernel(tunables={"rows_per_tile": (0, 1, 2)})
def rms_norm_backward(grad_out, input, rstd, weight=None, output_mask=(True, True), rows_per_tile=0,  # noqa: A002
                      residual=None, cast_dtype=None):
    """torch ``_fused_rms_norm_backward`` over the last dim.

    ``rstd`` is the forward's (any float dtype, one value per row). Returns the outputs that
    ``output_mask`` asks for, in order: ``grad_input`` (input's dtype) and ``grad_weight`` (``[D]``, the
    weight's dtype). grad_weight needs a weight. ``residual``, ``cast_dtype``: as layer_norm_backward's.
    """
    return _norm_backward(False, grad_out, input, None, rstd, weight, tuple(output_mask), rows_per_tile,
                          residual, cast_dtype)


# ---------------------------------------------------------------------------------------------
# group_norm
# ---------------------------------------------------------------------------------------------
def _gn_shape(name: str, x: View, num_groups: int):
    if x.ndim < 2:
        raise KernelError(f"{name}: input must be [N, C, *], got {list(x.shape)}")
    n, c = x.shape[0], x.shape[1]
    hw = math.prod(x.shape[2:])
    if num_groups <= 0 or c % num_groups:
        raise KernelError(f"{name}: {c} channels do not split into {num_groups} groups")
    return n, c, hw, c // num_groups


def _group_rows(vec: View, dst: View, r0: int, per: int) -> None:
    """dst[p, 0] = vec[(r0 + p) // per] for the dst's partitions (vec: a flat HBM vector), in <= 3 DMAs."""
    np_ = dst.shape[0]
    p = 0
    while p < np_:
        g, off = divmod(r0 + p, per)
        if off or np_ - p < per:  # a partial group: one value read len times
            ln = min(per - off, np_ - p)
            src = _hbm_view(vec, vec.offset + g, ((ln, 0), (1, 1)))
        else:  # whole groups: value g + i read per times each
            k = (np_ - p) // per
            ln = k * per
            src = _hbm_view(vec, vec.offset + g, ((k, 1), (per, 0)))
        nisa.dma_copy(dst[p:p + ln], src)
        p += ln


def _channel_rows(vec: View, dst: View, r0: int, c: int) -> None:
    """dst[p, 0] = vec[(r0 + p) % c] for the dst's partitions (vec: [C] in HBM), in <= 3 DMAs."""
    np_ = dst.shape[0]
    p = 0
    while p < np_:
        c0 = (r0 + p) % c
        if c0 or np_ - p < c:
            ln = min(c - c0, np_ - p)
            src = _hbm_view(vec, vec.offset + c0, ((ln, 1), (1, 1)))
        else:
            k = (np_ - p) // c
            ln = k * c
            src = _hbm_view(vec, vec.offset, ((k, 0), (c, 1)))
        nisa.dma_copy(dst[p:p + ln], src)
        p += ln


class _GroupOps:
    """Group sums and their broadcast back to rows for a tile of whole groups (rows p of group p // cg).

    No 0/1-matrix matmul: it would multiply every row's value by the 0 of every other group, so one
    inf or NaN (or a square that overflows) would turn 0 * inf into NaN in every group of the tile.
    Instead each value column is transposed to one partition (TensorE transposes are data movement),
    where a VectorE reduce sums each group's own cg entries; group values go back the same way,
    each read cg times (stride 0) by the transpose. Group values live as ``[1, k, ng]`` rows."""

    def __init__(self, cg: int):
        self.cg = cg

    def to_groups(self, vals: View, name: str) -> View:
        """[np, k] row values (SBUF) -> [1, k, ng] group sums (SBUF, float32)."""
        np_, k = vals.shape
        ng = np_ // self.cg
        tp = nl.ndarray((1, k, np_), nl.float32, buffer=nl.psum, name=name + "_tp")
        for j in range(k):
            nisa.nc_transpose(tp[:, j, :], vals[:, j:j + 1])
        out = nl.ndarray((1, k, ng), nl.float32, name=name)
        nisa.tensor_reduce(out, tp.reshape(1, k, ng, self.cg), nl.add, 3, engine=VEC)
        return out

    def to_rows(self, gvals: View, np_: int, name: str) -> View:
        """[1, k, ng] group values -> [np, k] row values (SBUF)."""
        k = gvals.shape[1]
        rep = _bcast_last(gvals, self.cg)  # [1, k, ng, cg]: each group value read cg times
        ps = nl.ndarray((np_, k), nl.float32, buffer=nl.psum, name=name + "_ps")
        for j in range(k):
            nisa.nc_transpose(ps[:, j:j + 1], rep[:, j])
        out = nl.ndarray((np_, k), nl.float32, name=name)
        nisa.tensor_copy(out, ps, engine=VEC)
        return out


def _gn_tile_rows(cg: int) -> int:
    return nl.tile_size.pmax // cg * cg


def _gn_affine_cols(t: _Tile, weight, bias, c: int):
    """Per-row weight and bias columns [np, 1] (float32) of a tile of (n, c) rows."""
    cols = []
    for v, name in ((weight, "wcol"), (bias, "bcol")):
        col = None
        if v is not None:
            col = nl.ndarray((t.np, 1), nl.float32, name=name)
            _channel_rows(v, col, t.r0, c)
        cols.append(col)
    return cols


def _gn_scale_shift(t: _Tile, m_row: View, rs_row: View, wcol, bcol):
    """a = rstd * w, b = bias - mean * a: out = x * a + b (torch's fused group-norm parameters)."""
    a = rs_row
    if wcol is not None:
        a = nl.ndarray((t.np, 1), nl.float32, name="gn_a")
        nisa.tensor_tensor(a, rs_row, wcol, nl.multiply, engine=VEC)
    b = nl.ndarray((t.np, 1), nl.float32, name="gn_b")
    nisa.tensor_tensor(b, m_row, a, nl.multiply, engine=VEC)
    if bcol is not None:
        nisa.tensor_tensor(b, bcol, b, nl.subtract, engine=VEC)
    else:
        nisa.tensor_scalar(b, b, nl.multiply, -1.0, engine=VEC)
    return a, b


def _gn_apply(k: _RowKernel, t: _Tile, ci: int, x2: View, out2: View, a: View, b: View) -> None:
    n = k.chunks[ci][1]
    xc = k.chunk_in(t, t.rows(x2), 0, ci, "x", x2.dtype)
    oc = k.out_chunk(t, 0, ci, "o", out2.dtype)
    _scale_shift(k.bal.pick(_ts_costs(n, oc, xc)), oc, xc, a, b)
    k.store_chunk(t, 0, ci, "o", out2, oc)


def _gn_load_x(k: _RowKernel, t: _Tile, x2: View, name: str = "x") -> None:
    k.load_rows(t, name, x2, x2.dtype)


@_kernel()
def group_norm(x, weight=None, bias=None, num_groups=1, eps=1e-5):
    """torch ``native_group_norm``: x ``[N, C, *]`` normalized over each group of ``C / num_groups``
    channels (and all spatial positions); returns ``(out, mean, rstd)``.

    ``out = (x - mean) * rstd * weight[c] + bias[c]`` in x's dtype (computed as ``x * a + b`` with
    per-channel ``a = rstd * weight``, ``b = bias - mean * a``, as torch does); ``mean``, ``rstd``
    (biased variance from centered values) are float32 ``[N, num_groups]``.
    """
    for name, v in (("input", x), ("weight", weight), ("bias", bias)):
        _check_float(name, v)
    n, c, hw, cg = _gn_shape("group_norm", x, num_groups)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and tuple(v.shape) != (c,):
            raise KernelError(f"group_norm: {name} shape {list(v.shape)} must be [{c}]")
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm, name="out")
    mean = nl.ndarray((n, num_groups), nl.float32, buffer=nl.hbm, name="mean")
    rstd = nl.ndarray((n, num_groups), nl.float32, buffer=nl.hbm, name="rstd")
    rows, size = n * c, cg * hw
    if rows == 0:
        return out, mean, rstd
    if hw == 0:
        raise KernelError("group_norm: the spatial size is 0")
    x2, out2 = x.reshape(rows, hw), out.reshape(rows, hw)
    mean1, rstd1 = mean.reshape(n * num_groups), rstd.reshape(n * num_groups)
    P = nl.tile_size.pmax
    eps_col = _col(eps, P, "eps")
    if cg > P:
        _gn_forward_wide(x, weight, bias, num_groups, eps_col, out2, mean, rstd, n, c, hw, cg)
        return out, mean, rstd
    T = _gn_tile_rows(cg)
    k = _RowKernel(rows, hw, (x.dtype, x.dtype), 0, 1, depth=DEPTH["gn"][x.dtype.itemsize], parts=T)
    chunks, nch = k.chunks, len(k.chunks)
    gm = _GroupOps(cg)
    counts = nl.ndarray((T, nch), nl.float32, name="counts")
    for ci, (_, ln) in enumerate(chunks):
        nisa.memset(counts[:, ci:ci + 1], float(ln), engine=VEC)

    def stats(slot, ctx, ci, _):
        t, _j = slot
        if ci == 0:
            _gn_load_x(k, t, x2)
            for key in ("s", "nm", "m2"):
                ctx[key] = nl.ndarray((t.np, 1, nch), nl.float32, name=key)
        xc = k.chunk_in(t, t.rows(x2), 0, ci, "x", x.dtype)
        _stats_pass(k.bal, xc, 0, ci, chunks[ci][1], ctx["s"], ctx["nm"], ctx["m2"], k.junk)

    last = nch - 1  # the group steps run once the row's last chunk is in (one pipeline stage each)

    def group_mean(slot, ctx, ci, _):
        t, _j = slot
        if ci != last:
            return
        s_r = ctx["s"][:, 0, :]
        if nch > 1:
            s_r = nl.ndarray((t.np, 1), nl.float32, name="s_r")
            nisa.tensor_reduce(s_r, ctx["s"][:, 0, :], nl.add, 1, engine=VEC)
        ctx["m_g"] = nl.ndarray((1, 1, t.np // cg), nl.float32, name="m_g")
        nisa.activation(ctx["m_g"], nl.identity, gm.to_groups(s_r, "s_g"), scale=1.0 / size)

    def group_var(slot, ctx, ci, _):
        t, _j = slot
        if ci != last:
            return
        ng = t.np // cg
        m_row = ctx["m_row"] = gm.to_rows(ctx["m_g"], t.np, "m_row")
        # group M2 = sum over the group's rows and chunks of M2_chunk + n_chunk * (m_chunk - m_group)^2
        diff = nl.ndarray((t.np, 1, nch), nl.float32, name="gdiff")
        nisa.tensor_tensor(diff, ctx["nm"], _bcast_last(m_row, nch), nl.add, engine=VEC)
        nisa.tensor_tensor(diff, diff, diff, nl.multiply, engine=VEC)
        cnt = type(counts)(counts.owner, counts.dtype, counts.offset, (counts.dims[0], (1, 0), counts.dims[1]))
        nisa.tensor_tensor(diff, diff, cnt[:t.np], nl.multiply, engine=VEC)
        nisa.tensor_tensor(diff, diff, ctx["m2"], nl.add, engine=VEC)
        q_r = nl.ndarray((t.np, 1), nl.float32, name="q_r")
        nisa.tensor_reduce(q_r, diff[:, 0, :], nl.add, 1, engine=VEC)
        ctx["rs_g"] = nl.ndarray((1, 1, ng), nl.float32, name="rs_g")
        nisa.activation(ctx["rs_g"], nl.rsqrt, gm.to_groups(q_r, "q_g"), bias=eps_col[:1], scale=1.0 / size)
        g0 = t.r0 // cg
        k.q.store(mean1[g0:g0 + ng].reshape(1, 1, ng), ctx["m_g"])
        k.q.store(rstd1[g0:g0 + ng].reshape(1, 1, ng), ctx["rs_g"])

    def group_affine(slot, ctx, ci, _):
        t, _j = slot
        if ci != last:
            return
        rs_row = gm.to_rows(ctx["rs_g"], t.np, "rs_row")
        wcol, bcol = _gn_affine_cols(t, weight, bias, c)
        ctx["a"], ctx["b"] = _gn_scale_shift(t, ctx["m_row"], rs_row, wcol, bcol)

    def apply(slot, ctx, ci, _):
        _gn_apply(k, slot[0], ci, x2, out2, ctx["a"], ctx["b"])

    k.run([((stats, group_mean, group_var, group_affine), None), ((apply,), None)], lag=2)
    return out, mean, rstd


def _gn_forward_wide(x, weight, bias, num_groups, eps_col, out2, mean, rstd, n, c, hw, cg):
    """Groups of more than 128 channels: statistics with groups as rows ([N * G, cg * hw]), then the
    affine pass over (n, c) rows reading each row's group statistics back."""
    size, rows_g = cg * hw, n * num_groups
    xg = x.reshape(rows_g, size)
    mean2, rstd2 = mean.reshape(rows_g, 1), rstd.reshape(rows_g, 1)
    ks = _RowKernel(rows_g, size, (x.dtype,), 0, 1, depth=DEPTH["gn"][x.dtype.itemsize], share=0.5)
    chunks, nch = ks.chunks, len(ks.chunks)
    counts = _chunk_counts(ks.P, chunks)

    def stats(slot, ctx, ci, _):
        t, j = slot
        if j == 0 and ci == 0:
            t.rs = nl.ndarray((t.np, t.nj), nl.float32, name="rs")
            t.mo = nl.ndarray((t.np, t.nj), nl.float32, name="mo")
            ks.load_rows(t, "x", xg, x.dtype)
        if ci == 0:
            for key in ("s", "nm", "m2"):
                ctx[key] = nl.ndarray((t.np, 1, nch), nl.float32, name=key)
        xc = ks.chunk_in(t, t.rows(xg), j, ci, "x", x.dtype)
        _stats_pass(ks.bal, xc, 0, ci, chunks[ci][1], ctx["s"], ctx["nm"], ctx["m2"], ks.junk)

    def finish(slot, ctx):
        t, j = slot
        negmean, tm2 = _combine(t.np, 1, chunks, ctx["s"], ctx["nm"], ctx["m2"], size, counts)
        nisa.activation(t.rs[:, j:j + 1], nl.rsqrt, tm2, bias=eps_col[:t.np], scale=1.0 / size)
        nisa.activation(t.mo[:, j:j + 1], nl.identity, negmean, scale=-1.0)
        if j == t.nj - 1:
            span = slice(t.r0, t.r0 + t.np * t.nj)
            ks.q.store(mean2[span].reshape(t.np, t.nj), t.mo)
            ks.q.store(rstd2[span].reshape(t.np, t.nj), t.rs)

    ks.run([((stats,), finish)], lag=2)

    rows = n * c
    x2 = x.reshape(rows, hw)
    mean1, rstd1 = mean.reshape(rows_g), rstd.reshape(rows_g)
    k = _RowKernel(rows, hw, (x.dtype, x.dtype), 0, 1, depth=DEPTH["gn"][x.dtype.itemsize], share=0.5)

    def params(slot, ctx, ci, _):
        t, _j = slot
        if ci == 0:
            _gn_load_x(k, t, x2)
            m_row = nl.ndarray((t.np, 1), nl.float32, name="m_row")
            rs_row = nl.ndarray((t.np, 1), nl.float32, name="rs_row")
            _group_rows(mean1, m_row, t.r0, cg)
            _group_rows(rstd1, rs_row, t.r0, cg)
            wcol, bcol = _gn_affine_cols(t, weight, bias, c)
            ctx["a"], ctx["b"] = _gn_scale_shift(t, m_row, rs_row, wcol, bcol)

    def apply(slot, ctx, ci, _):
        _gn_apply(k, slot[0], ci, x2, out2, ctx["a"], ctx["b"])

    k.run([((params, apply), None)], lag=2)


def _gn_row_sums(k: _RowKernel, t: _Tile, ctx: dict, ci: int, dy2: View, x2: View) -> None:
    """Chunk ci of the per-row sums ds = sum(dy * x), db = sum(dy) (ctx["sums"]: [np, 2, nch])."""
    n = k.chunks[ci][1]
    dyc = k.chunk_in(t, t.rows(dy2), 0, ci, "dy", dy2.dtype)
    xc = k.chunk_in(t, t.rows(x2), 0, ci, "x", x2.dtype)
    prod = nl.ndarray((t.np, n), nl.float32, name="prod")
    _tt(k.bal, prod, dyc, xc, nl.multiply)
    sums = ctx["sums"]
    _rowsum(k.bal.pick({ACT: n, VEC: n, POOL: n}), sums[:, 0, ci:ci + 1], prod, k.junk)
    _rowsum(k.bal.pick({ACT: n, VEC: n, POOL: n}), sums[:, 1, ci:ci + 1], dyc, k.junk)


def _gn_row_totals(t: _Tile, ctx: dict, nch: int) -> View:
    if nch == 1:
        return ctx["sums"][:, :, 0]
    tot = nl.ndarray((t.np, 2), nl.float32, name="rtot")
    nisa.tensor_reduce(tot, ctx["sums"], nl.add, 2, engine=VEC)
    return tot


def _gn_param_rows(t: _Tile, tot: View, m_row: View, rs_row: View, dg_planes: View | None) -> None:
    """dgamma/dbeta contributions of each (n, c) row, (ds - db * mean) * rstd and db, to scratch planes."""
    if dg_planes is None:
        return
    dg = nl.ndarray((t.np, 1), nl.float32, name="dg")
    nisa.tensor_tensor(dg, tot[:, 1:2], m_row, nl.multiply, engine=VEC)
    nisa.tensor_tensor(dg, tot[:, 0:1], dg, nl.subtract, engine=VEC)
    nisa.tensor_tensor(dg, dg, rs_row, nl.multiply, engine=VEC)
    span = slice(t.r0, t.r0 + t.np)
    nisa.dma_copy(dg_planes[0, span].reshape(t.np, 1), dg)
    nisa.dma_copy(dg_planes[1, span].reshape(t.np, 1), tot[:, 1:2])


def _gn_coeffs(ds_g: View, db_g: View, m_g: View, rs_g: View, c2: View, c3: View, size: int) -> None:
    """c2, c3 (views shaped like m_g) from the group sums ds_g = sum ds * w, db_g = sum db * w:
    c2 = (db_g * mean - ds_g) * rstd^3 / size, c3 = -c2 * mean - db_g * rstd / size (torch's formulas)."""
    t1 = nl.ndarray(m_g.shape, nl.float32, name="cc_t1")
    r3 = nl.ndarray(m_g.shape, nl.float32, name="cc_r3")
    nisa.tensor_tensor(t1, db_g, m_g, nl.multiply, engine=VEC)
    nisa.tensor_tensor(t1, t1, ds_g, nl.subtract, engine=VEC)
    nisa.tensor_tensor(r3, rs_g, rs_g, nl.multiply, engine=VEC)
    nisa.tensor_tensor(r3, r3, rs_g, nl.multiply, engine=VEC)
    nisa.tensor_tensor(t1, t1, r3, nl.multiply, engine=VEC)
    nisa.tensor_scalar(c2, t1, nl.multiply, 1.0 / size, engine=VEC)
    nisa.tensor_tensor(t1, c2, m_g, nl.multiply, engine=VEC)
    nisa.tensor_tensor(r3, db_g, rs_g, nl.multiply, engine=VEC)
    nisa.tensor_scalar(r3, r3, nl.multiply, 1.0 / size, engine=VEC)
    nisa.tensor_tensor(t1, t1, r3, nl.add, engine=VEC)
    nisa.tensor_scalar(c3, t1, nl.multiply, -1.0, engine=VEC)


def _gn_dx(k: _RowKernel, t: _Tile, ci: int, dy2: View, x2: View, dx2: View, c1: View, c2: View, c3: View):
    """dx = c1 * dy + c2 * x + c3."""
    n = k.chunks[ci][1]
    dyc = k.chunk_in(t, t.rows(dy2), 0, ci, "dy", dy2.dtype)
    xc = k.chunk_in(t, t.rows(x2), 0, ci, "x", x2.dtype)
    u = nl.ndarray((t.np, n), nl.float32, name="gn_u")
    _scale_shift(k.bal.pick(_ts_costs(n, u, xc)), u, xc, c2, c3)
    v = nl.ndarray((t.np, n), nl.float32, name="gn_v")
    _scale_shift(k.bal.pick(_ts_costs(n, v, dyc)), v, dyc, c1, None)
    o = k.out_chunk(t, 0, ci, "o", dx2.dtype)
    _tt(k.bal, o, u, v, nl.add)
    k.store_chunk(t, 0, ci, "o", dx2, o)


def _gn_param_grads(dg_planes: View, n: int, c: int, dgamma: View | None, dbeta: View | None) -> None:
    """dgamma[c] = sum over n of plane 0, dbeta of plane 1: TensorE sums over partitions (samples)."""
    P, fmax = nl.tile_size.pmax, nl.tile_size.psum_fmax
    ones = nl.ndarray((P, 1), nl.float32, name="pg_ones")
    nisa.memset(ones, 1.0, engine=POOL)
    for plane, dst in enumerate((dgamma, dbeta)):
        if dst is None:
            continue
        vals = dg_planes[plane].reshape(n, c)
        for c0, w in _chunks(c, fmax):
            ps = nl.ndarray((1, w), nl.float32, buffer=nl.psum, name="pg_ps")
            if n == 0:
                res = nl.ndarray((1, w), dst.dtype, name="pg_res")
                nisa.memset(res, 0.0, engine=VEC)
            else:
                for n0, nb in _chunks(n, P):
                    blk = nl.ndarray((nb, w), nl.float32, name="pg_blk")
                    nisa.dma_copy(blk, vals[n0:n0 + nb, c0:c0 + w])
                    nisa.nc_matmul(ps, ones[:nb], blk)
                res = nl.ndarray((1, w), dst.dtype, name="pg_res")
                nisa.tensor_copy(res, ps, engine=VEC)
            nisa.dma_copy(dst.reshape(1, c)[:, c0:c0 + w], res)


@_kernel()
def group_norm_backward(grad_out, input, mean, rstd, weight=None, num_groups=1,  # noqa: A002
                        output_mask=(True, True, True)):
    """torch ``native_group_norm_backward``: returns the outputs ``output_mask`` asks for, in order:
    ``grad_input`` (input's dtype), ``grad_weight`` and ``grad_bias`` (``[C]``, the weight's dtype,
    else grad_out's). ``mean``/``rstd`` are the forward's ``[N, num_groups]`` (any float dtype).
    grad_weight needs a weight.
    """
    x, dy = input, grad_out
    for name, v in (("grad_out", dy), ("input", x), ("mean", mean), ("rstd", rstd), ("weight", weight)):
        _check_float(name, v)
    n, c, hw, cg = _gn_shape("group_norm_backward", x, num_groups)
    if tuple(dy.shape) != tuple(x.shape):
        raise KernelError(f"group_norm_backward: grad_out {list(dy.shape)} and input {list(x.shape)} differ")
    for name, v in (("mean", mean), ("rstd", rstd)):
        if math.prod(v.shape) != n * num_groups:
            raise KernelError(f"group_norm_backward: {name} must have N * num_groups = {n * num_groups} values")
    if weight is not None and tuple(weight.shape) != (c,):
        raise KernelError(f"group_norm_backward: weight shape {list(weight.shape)} must be [{c}]")
    want_dx, want_dw, want_db = output_mask
    if want_dw and weight is None:
        raise KernelError("group_norm_backward: grad_weight requested (output_mask[1]) without a weight")
    pdtype = weight.dtype if weight is not None else dy.dtype
    dx = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm, name="grad_input") if want_dx else None
    dw = nl.ndarray((c,), pdtype, buffer=nl.hbm, name="grad_weight") if want_dw else None
    db = nl.ndarray((c,), pdtype, buffer=nl.hbm, name="grad_bias") if want_db else None
    outs = tuple(o for o in (dx, dw, db) if o is not None)
    if not outs:
        raise KernelError(f"group_norm_backward: output_mask {tuple(output_mask)} asks for nothing")
    rows, size = n * c, cg * hw
    if rows == 0 or c == 0:
        if dw is not None or db is not None:
            _gn_param_grads(None, 0, c, dw, db)
        return outs
    if hw == 0:
        raise KernelError("group_norm_backward: the spatial size is 0")
    dg_planes = _scratch((2, rows), nl.float32, "dg_planes") if (want_dw or want_db) else None
    x2, dy2 = x.reshape(rows, hw), dy.reshape(rows, hw)
    dx2 = dx.reshape(rows, hw) if dx is not None else None
    mean1, rstd1 = mean.reshape(n * num_groups), rstd.reshape(n * num_groups)
    if cg <= nl.tile_size.pmax:
        _gn_backward_narrow(dy2, x2, dx2, mean1, rstd1, weight, dg_planes, rows, c, hw, cg, size)
    else:
        _gn_backward_wide(dy2, x2, dx2, mean1, rstd1, weight, dg_planes, n, c, hw, cg, size, num_groups)
    if dg_planes is not None:
        _gn_param_grads(dg_planes, n, c, dw, db)
    return outs


def _gn_backward_narrow(dy2, x2, dx2, mean1, rstd1, weight, dg_planes, rows, c, hw, cg, size):
    """Groups within one tile: group sums and their broadcast back to rows on TensorE, one read of dy, x."""
    T = _gn_tile_rows(cg)
    io = (x2.dtype, dy2.dtype, dx2.dtype if dx2 is not None else None)
    k = _RowKernel(rows, hw, io, 3, 1, depth=DEPTH["gnb"][max(x2.dtype.itemsize, dy2.dtype.itemsize)], parts=T)
    nch = len(k.chunks)
    last = nch - 1
    gm = _GroupOps(cg)

    def sums(slot, ctx, ci, _):
        t, _j = slot
        if ci == 0:
            _gn_load_x(k, t, x2)
            _gn_load_x(k, t, dy2, "dy")
            ctx["sums"] = nl.ndarray((t.np, 2, nch), nl.float32, name="sums")
            ctx["m_row"] = nl.ndarray((t.np, 1), nl.float32, name="m_row")
            ctx["rs_row"] = nl.ndarray((t.np, 1), nl.float32, name="rs_row")
            _group_rows(mean1, ctx["m_row"], t.r0, cg)
            _group_rows(rstd1, ctx["rs_row"], t.r0, cg)
            ctx["wcol"] = _gn_affine_cols(t, weight, None, c)[0]
        _gn_row_sums(k, t, ctx, ci, dy2, x2)

    def group_sums(slot, ctx, ci, _):
        t, _j = slot
        if ci != last:
            return
        tot = _gn_row_totals(t, ctx, nch)
        _gn_param_rows(t, tot, ctx["m_row"], ctx["rs_row"], dg_planes)
        if dx2 is None:
            return
        wv, wcol = tot, ctx["wcol"]
        if wcol is not None:
            wv = nl.ndarray((t.np, 2), nl.float32, name="wv")
            nisa.tensor_scalar(wv, tot, nl.multiply, wcol, engine=VEC)
        ctx["gs"] = gm.to_groups(wv, "gsum")

    def coeffs(slot, ctx, ci, _):
        t, _j = slot
        if ci != last or dx2 is None:
            return
        ng, g0 = t.np // cg, t.r0 // cg
        m_g = nl.ndarray((1, ng), nl.float32, name="m_g")
        rs_g = nl.ndarray((1, ng), nl.float32, name="rs_g")
        nisa.dma_copy(m_g, mean1[g0:g0 + ng].reshape(1, ng))
        nisa.dma_copy(rs_g, rstd1[g0:g0 + ng].reshape(1, ng))
        gs, cc = ctx.pop("gs"), nl.ndarray((1, 2, ng), nl.float32, name="cc")
        _gn_coeffs(gs[:, 0, :], gs[:, 1, :], m_g, rs_g, cc[:, 0, :], cc[:, 1, :], size)
        ctx["cc"] = cc

    def row_coeffs(slot, ctx, ci, _):
        t, _j = slot
        if ci != last or dx2 is None:
            return
        c1, wcol = ctx["rs_row"], ctx["wcol"]
        if wcol is not None:
            c1 = nl.ndarray((t.np, 1), nl.float32, name="c1")
            nisa.tensor_tensor(c1, ctx["rs_row"], wcol, nl.multiply, engine=VEC)
        ctx["c1"], ctx["crow"] = c1, gm.to_rows(ctx["cc"], t.np, "crow")

    def grad_x(slot, ctx, ci, _):
        t, _j = slot
        crow = ctx["crow"]
        _gn_dx(k, t, ci, dy2, x2, dx2, ctx["c1"], crow[:, 0:1], crow[:, 1:2])

    def all_coeffs(slot, ctx):  # one stage: the backward is compute bound, a deeper pipeline only costs SBUF
        for step in (group_sums, coeffs, row_coeffs):
            step(slot, ctx, last, None)

    phases = [((sums,), all_coeffs)] + ([((grad_x,), None)] if dx2 is not None else [])
    k.run(phases, lag=2)


def _gn_backward_wide(dy2, x2, dx2, mean1, rstd1, weight, dg_planes, n, c, hw, cg, size, num_groups):
    """Groups of more than 128 channels: per-row sums to scratch, group coefficients from them, then dx
    in a second pass over dy and x."""
    rows = n * c
    ws = _scratch((2, rows), nl.float32, "w_planes") if dx2 is not None else None
    depth = DEPTH["gnb"][max(x2.dtype.itemsize, dy2.dtype.itemsize)]
    k = _RowKernel(rows, hw, (x2.dtype, dy2.dtype), 1, 1, depth=depth, share=0.4)
    nch = len(k.chunks)

    def rowvals(slot, t):
        m_row = nl.ndarray((t.np, 1), nl.float32, name="m_row")
        rs_row = nl.ndarray((t.np, 1), nl.float32, name="rs_row")
        _group_rows(mean1, m_row, t.r0, cg)
        _group_rows(rstd1, rs_row, t.r0, cg)
        wcol = _gn_affine_cols(t, weight, None, c)[0]
        return m_row, rs_row, wcol

    def sums(slot, ctx, ci, _):
        t, _j = slot
        if ci == 0:
            _gn_load_x(k, t, x2)
            _gn_load_x(k, t, dy2, "dy")
            ctx["sums"] = nl.ndarray((t.np, 2, nch), nl.float32, name="sums")
        _gn_row_sums(k, t, ctx, ci, dy2, x2)

    def finish(slot, ctx):
        t, _j = slot
        tot = _gn_row_totals(t, ctx, nch)
        m_row, rs_row, wcol = rowvals(slot, t)
        _gn_param_rows(t, tot, m_row, rs_row, dg_planes)
        if ws is not None:
            wv = tot
            if wcol is not None:
                wv = nl.ndarray((t.np, 2), nl.float32, name="wv")
                nisa.tensor_scalar(wv, tot, nl.multiply, wcol, engine=VEC)
            span = slice(t.r0, t.r0 + t.np)
            nisa.dma_copy(ws[0, span].reshape(t.np, 1), wv[:, 0:1])
            nisa.dma_copy(ws[1, span].reshape(t.np, 1), wv[:, 1:2])

    k.run([((sums,), finish)], lag=2)
    if dx2 is None:
        return
    # group coefficients: groups on partitions, their cg row sums along the free dim
    ngr = n * num_groups
    cc_planes = _scratch((2, ngr), nl.float32, "cc_planes")
    P = nl.tile_size.pmax
    for g0, ng in _chunks(ngr, P):
        gs = nl.ndarray((ng, 2), nl.float32, name="gsum")
        for plane in range(2):
            blk = nl.ndarray((ng, cg), nl.float32, name="gblk")
            nisa.dma_copy(blk, ws[plane].reshape(ngr, cg)[g0:g0 + ng])
            nisa.tensor_reduce(gs[:, plane:plane + 1], blk, nl.add, 1, engine=VEC)
        m_g = nl.ndarray((ng, 1), nl.float32, name="m_g")
        rs_g = nl.ndarray((ng, 1), nl.float32, name="rs_g")
        nisa.dma_copy(m_g, mean1[g0:g0 + ng].reshape(ng, 1))
        nisa.dma_copy(rs_g, rstd1[g0:g0 + ng].reshape(ng, 1))
        cc = nl.ndarray((ng, 2), nl.float32, name="cc")
        _gn_coeffs(gs[:, 0:1], gs[:, 1:2], m_g, rs_g, cc[:, 0:1], cc[:, 1:2], size)
        nisa.dma_copy(cc_planes[0, g0:g0 + ng].reshape(ng, 1), cc[:, 0:1])
        nisa.dma_copy(cc_planes[1, g0:g0 + ng].reshape(ng, 1), cc[:, 1:2])
    k2 = _RowKernel(rows, hw, (x2.dtype, dy2.dtype, dx2.dtype), 2, 1, depth=depth, share=0.6)

    def grad_x(slot, ctx, ci, _):
        t, _j = slot
        if ci == 0:
            _gn_load_x(k2, t, x2)
            _gn_load_x(k2, t, dy2, "dy")
            _, rs_row, wcol = rowvals(slot, t)
            c1 = rs_row
            if wcol is not None:
                c1 = nl.ndarray((t.np, 1), nl.float32, name="c1")
                nisa.tensor_tensor(c1, rs_row, wcol, nl.multiply, engine=VEC)
            crow = nl.ndarray((t.np, 2), nl.float32, name="crow")
            _group_rows(cc_planes[0], crow[:, 0:1], t.r0, cg)
            _group_rows(cc_planes[1], crow[:, 1:2], t.r0, cg)
            ctx["c1"], ctx["crow"] = c1, crow
        crow = ctx["crow"]
        _gn_dx(k2, t, ci, dy2, x2, dx2, ctx["c1"], crow[:, 0:1], crow[:, 1:2])

    k2.run([((grad_x,), None)], lag=2)
