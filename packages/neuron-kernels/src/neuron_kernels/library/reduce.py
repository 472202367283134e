"""Reductions with torch semantics: sum, mean, prod, amax/amin, max/min (values, indices), argmax/argmin,
var/std (``correction``), logsumexp, and cumsum, over any dims of a contiguous tensor.

Problem shape
-------------
Size-1 dims are dropped and neighbouring dims of the same kind (reduced or kept) are merged, so every
reduction is a chain of *stages* ``[K0, R, K1]``: reduce the R elements of each (k0, k1), R strided by
K1 in HBM. One reduced group is one stage; several non-adjacent groups (``dim=(0, 2)`` of a 3-d tensor)
run one stage per group, last first, through fp32 HBM scratch whose size is the input's divided by the
reduced group (sum, prod, amax, amin, mean, logsumexp and var/std, whose stages carry (mean, M2) pairs).
max/min with indices, argmax/argmin and cumsum take one dim (or the flattened tensor).

Layouts of a stage (chosen by :func:`plan_layout` from estimated engine time and DMA descriptors)
----------------------------------------------------------------------------------------------------
- A, rows on partitions: partition p holds ``k`` consecutive k0's; a tile is ``[p, k, n, kc]`` (n of the
  R elements, kc of the K1 ones), reduced over its third axis by one ``tensor_reduce`` (VectorE or
  GpSimd), or for long rows by one instruction per row with [p, 1] operands: sums and logsumexp on
  ScalarE ``activation`` with its free accumulate (``reduce_res``, fp32), var as
  ``activation(square, x, scale=n, bias=-sum)``. Work is split over the engines by a trace-time list
  scheduler using the documented instruction costs (:class:`Ctx`). Used when K0 fills the partitions.
- B, the reduced dim across partitions, for few k0's (a full reduction, ``sum(dim=0)`` of a matrix).
  Float sums/means: each [128 rows, <=128 columns] block is the stationary operand of a TensorE matmul
  with a ones column, accumulating column sums in fp32 PSUM (64 cycles per 128x128 block, 4x in fp32:
  faster than the DMA that feeds it), then transposed back to rows for contiguous stores. Other ops:
  R is cut into q <= 128 segments of L (+ a group of the R mod q remaining elements), each partition
  reduces its segment along the free dims, and the partials are combined across partitions: sums on
  TensorE (ones-matrix matmul), max/min/prod and index selection on GpSimd (``partition_reduce`` /
  ``partition_broadcast``; TensorE has no max). No data transposes; every HBM run is >= 2 KiB.

Numerics and dtypes (torch rules)
---------------------------------
- Float inputs accumulate in fp32 (sums, products, means, M2) and round once into the input dtype.
  max/min are exact. var/std: per-chunk two-pass (mean, then sum of squared deviations, ScalarE
  ``square`` with the mean as bias), chunks and partitions merged with Chan's formula; the result is
  M2 / max(0, N - correction) (so 0/0 = nan like torch).
- Integer/bool inputs (int8/16/32, uint8, bool; int64 values must fit int32): sum/prod/cumsum return
  int64 like torch but accumulate exactly in int32 on GpSimd, wrapping mod 2**32 when a partial sum
  leaves the int32 range (documented limit). max/min/amax/amin/argmax are exact (GpSimd integer mode).
- Indices (argmax/argmin, max/min with dim) are int64, first occurrence on ties; NaN is the maximum
  and the minimum (propagated; its first index is returned). Known gap: a row holding +inf (-inf for
  min) before its first NaN returns the index of that inf. Indices are exact up to 2**24 elements
  along the reduced dim.
- logsumexp shifts by the max, with infinite maxima replaced by 0 (torch's rule): all -inf -> -inf.
- Empty reductions: sum 0, prod 1, mean/var nan, logsumexp -inf; max/argmax over an empty dim raise.

cumsum: along the last dim (rows on partitions) each block of 128 columns is one VectorE scan
(``tensor_tensor_scan``, FP32 state) from its FP32 carry, the carries being the prefix of the blocks'
totals; along an outer dim each [128, 128] block is transposed on TensorE, scanned from the columns'
running totals and transposed back. No triangular 0/1 matmul: it would multiply every later element by
0, so one inf or NaN would turn the outputs before it into NaN. Short scans (and integers, exact in
int32 on GpSimd) run a log-step (Hillis-Steele) scan along the free dim.
"""

from __future__ import annotations

import math
from builtins import max as _max
from builtins import min as _min
from builtins import sum as _sum
from dataclasses import dataclass

import neuron_kernels as nk
from neuron_hal import Act, Alu, DType, Engine
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl
from neuron_kernels.errors import KernelError

V, S, G, T = Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD, Engine.TENSOR
F32, BF16, I32, I64 = DType.float32, DType.bfloat16, DType.int32, DType.int64
INF = float("inf")
FLT_MAX, BF16_MAX = 3.4028234663852886e38, 3.3895313892515355e38  # the largest finite float32, bfloat16
IDX_BIG = float(1 << 24)  # indices are exact fp32 below this
INT_BIG = float(1 << 30)
SLOT_N = 128  # row length from which per-row instructions beat one broadcast instruction over all rows


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def is_int(dt: DType) -> bool:
    return dt.kind in "iub"


def is16(dt: DType) -> bool:
    return dt in (DType.bfloat16, DType.float16)


# ================================================================================================
# Shapes
# ================================================================================================
def norm_dims(ndim: int, dim) -> tuple[int, ...]:
    """torch's dim argument -> sorted unique non-negative dims; None or () means every dim."""
    if dim is None or (isinstance(dim, tuple | list) and len(dim) == 0):
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        d = int(d)
        if not -_max(ndim, 1) <= d < _max(ndim, 1):
            raise KernelError(f"dim {d} out of range for a {ndim}-d tensor")
        d = d % _max(ndim, 1)
        if d in out:
            raise KernelError(f"dim {d} appears more than once in {dim}")
        out.append(d)
    return tuple(sorted(d for d in out if d < ndim))


def reduced_shape(shape, dims, keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in dims)


def groups_of(shape, dims) -> list[list]:
    """[[size, reduced], ...]: size-1 dims dropped, neighbours of the same kind merged.

    Always holds at least one reduced group (of size 1 when nothing is really reduced)."""
    out: list[list] = []
    for d, s in enumerate(shape):
        if s == 1:
            continue
        red = d in dims
        if out and out[-1][1] == red:
            out[-1][0] *= s
        else:
            out.append([s, red])
    if not any(r for _, r in out):
        out.append([1, True])
    return out


def split3(shape, dim: int) -> tuple[int, int, int]:
    """[K0, R, K1] around one dim."""
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


# ================================================================================================
# Views
# ================================================================================================
def view(base, offset: int, dims) -> object:
    """A view of ``base``'s tensor/tile at element ``offset`` with explicit (size, stride) dims."""
    return type(base)(base.owner, base.dtype, int(offset), tuple((int(s), int(st)) for s, st in dims))


def bcast(state, n: int):
    """A [p, a, b] state tile seen as [p, a, n, b] (stride 0 along the inserted axis)."""
    p, a, b = state.shape
    return state.reshape(p, a, 1, b).broadcast_to((p, a, n, b))


def hbm3(x, K0: int, R: int, K1: int, row0: int, p: int, k: int, r0: int, n: int, c0: int, kc: int):
    """[p, k, n, kc] block of x seen as [K0, R, K1]: rows row0 + p*k + j, reduce r0.., kept c0.."""
    return view(x, x.offset + (row0 * R + r0) * K1 + c0, ((p, k * R * K1), (k, R * K1), (n, K1), (kc, 1)))


def hbm_seg(x, R: int, K1: int, k0: int, s0: int, Q: int, L: int, j0: int, n: int, c0: int, kc: int):
    """[Q, 1, n, kc] block of x seen as [K0, R, K1]: partition s holds r = s0 + s*L + j0 + j."""
    return view(x, x.offset + (k0 * R + s0 + j0) * K1 + c0, ((Q, L * K1), (1, 1), (n, K1), (kc, 1)))


# ================================================================================================
# Trace context: engine balancing, DMA queues, constants
# ================================================================================================
class Ctx:
    """Per-trace helper: a list scheduler over the Vector/Scalar/GpSimd engines using the documented
    instruction costs (docs/hardware.md §3, numbers from the profile), DMA queues split between loads and
    stores (a queue completes in order, so a store waiting on compute must not hold up loads), and
    constant tiles made once per kernel."""

    def __init__(self):
        self.prof = nl.profile()
        self.P = nl.tile_size.pmax
        self.busy = {V: 0.0, S: 0.0, G: 0.0}
        nq = self.prof.dma_queues
        half = _max(1, nq // 2)
        self.lq = list(range(half))
        self.sq = list(range(half, nq)) or [0]
        self.li = self.si = 0
        self.consts: dict = {}

    # -- DMA ----------------------------------------------------------------------------------
    def load_queue(self) -> int:
        self.li += 1
        return self.lq[(self.li - 1) % len(self.lq)]

    def store_queue(self) -> int:
        self.si += 1
        return self.sq[(self.si - 1) % len(self.sq)]

    def load(self, dst, src):
        nisa.dma_copy(dst, src, queue=self.load_queue())

    def store(self, dst, src):
        nisa.dma_copy(dst, src, queue=self.store_queue())

    # -- costs (engine cycles; docs/hardware.md §3 formulas) --------------------------------------------
    def ghz(self, e: Engine) -> float:
        return {V: self.prof.vector_ghz, S: self.prof.scalar_ghz, G: self.prof.gpsimd_ghz}[e]

    def cycles(self, kind: str, e: Engine, n: int, fast: bool = False, reduce: bool = False) -> float:
        p = self.prof
        if kind == "act":
            return _max(p.min_ii, n) + (p.act_read_accumulator_cycles if reduce else 0)
        if kind == "ts":  # tensor_scalar / tensor_copy; fast = 16-bit in and out
            f = (p.vector_perf_copy_factor if e is V else p.scalar_perf_factor if e is S else 1) if fast else 1
            return _max(p.min_ii, n / f)
        if kind == "tt":  # fast = all 16-bit add/sub/mul, or one input in PSUM
            return _max(p.min_ii, n if fast else 2 * n)
        if kind == "red":  # fast = bf16 in and out, add or max
            return _max(p.min_ii, n / 2 if fast else n)
        raise ValueError(kind)

    def ns(self, e: Engine, cycles: float) -> float:
        return cycles / self.ghz(e)

    def pick(self, options: dict) -> Engine:
        """The engine that would finish this instruction first; charges it."""
        e = _min(options, key=lambda k: (self.busy[k] + self.ns(k, options[k]), k.value))
        self.busy[e] += self.ns(e, options[e])
        return e

    def charge(self, e: Engine, cycles: float) -> Engine:
        self.busy[e] += self.ns(e, cycles)
        return e

    def split(self, total: int, unit: int, cost) -> list[tuple[Engine, int, int]]:
        """Cut ``total`` units of work into pieces of >= ``unit`` and assign each to the engine that
        finishes it first; ``cost(engine, size)`` gives cycles or None when the engine cannot."""
        m = _max(1, _min(total // _max(unit, 1), 9))
        bounds = [round(i * total / m) for i in range(m + 1)]
        out = []
        for a, b in zip(bounds, bounds[1:]):
            if b <= a:
                continue
            opts = {e: c for e in (V, S, G) if (c := cost(e, b - a)) is not None}
            out.append((self.pick(opts), a, b))
        return out

    # -- constants -----------------------------------------------------------------------------
    def const(self, key, make):
        t = self.consts.get(key)
        if t is None:
            t = self.consts[key] = make()
        return t

    def ones(self, p: int, m: int, dtype=F32):
        def make():
            t = nl.ndarray((p, m), dtype, name="ones")
            nisa.memset(t, 1.0, engine=G)
            return t
        return self.const(("ones", p, m, dtype), make)

    def filled(self, p: int, m: int, value: float, dtype=F32):
        def make():
            t = nl.ndarray((p, m), dtype, name="fill")
            nisa.memset(t, value, engine=G)
            return t
        return self.const(("fill", p, m, value, dtype), make)


# ================================================================================================
# Small elementwise helpers on state tiles (few elements per partition)
# ================================================================================================
def tile(shape, dtype=F32, name="s"):
    return nl.ndarray(tuple(int(s) for s in shape), dtype, name=name)


def ts(dst, src, op0, v0, op1=None, v1=None, rev0=False, engine=V):
    nisa.tensor_scalar(dst, src, op0, v0, reverse0=rev0, op1=op1, operand1=v1, engine=engine)


def nan_to(ctx, m, value: float):
    """m with NaN replaced by ``value`` (a new tile)."""
    ok = tile(m.shape, F32, "nok")
    nisa.tensor_tensor(ok, m, m, Alu.equal, engine=V)  # 0 where NaN
    out = tile(m.shape, F32, "nfix")
    nisa.select(out, ok, m, value)
    return out


def flat2(t):
    """A [p, a, b] (or any) contiguous tile as [p, a*b]."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


# ================================================================================================
# Reduction operators: chunk -> state, merge states, combine across partitions, finish
# ================================================================================================
@dataclass
class Chunk:
    """One loaded block [p, k, n, kc]: ``xs`` input tiles (1, or 2 for var partials), element
    ``r0`` of the reduced dim at n = 0, ``seg`` = segment length when partitions hold segments
    (layout B: partition s starts at r0 + s * seg), ``count`` elements summarized per input value."""

    xs: list
    p: int
    k: int
    n: int
    kc: int
    r0: int = 0
    seg: int = 0
    count: int = 1

    @property
    def scalar(self) -> bool:
        return self.k * self.kc == 1

    @property
    def per_slot(self) -> bool:
        """Rows long enough to take one instruction each with [p, 1] operands (tensor_scalar,
        activation bias/reduce_res) rather than broadcast tensor_tensor forms over all rows."""
        return self.kc == 1 and (self.k == 1 or self.n >= SLOT_N)

    @property
    def sshape(self):
        return (self.p, self.k, self.kc)


class Op:
    """A reduction. State: a list of [p, k, kc] tiles."""

    name = "?"
    identity = 0.0

    def __init__(self, ctx: Ctx, dt: DType):
        self.ctx, self.dt, self.int = ctx, dt, is_int(dt)

    exact_int = True  # integer inputs reduce exactly in int32 (stage partials stay int32)

    @property
    def work_dt(self) -> DType:
        """dtype the input is loaded as."""
        return I32 if self.int and self.exact_int else F32 if self.int else self.dt

    @property
    def partial_dt(self) -> DType:
        """dtype of stage partials in HBM scratch."""
        return I32 if self.int and self.exact_int else F32

    def widest(self, wdt: DType) -> int:
        """Bytes per element of the widest [p, k, n, kc] tile a chunk makes: what sizes the chunks."""
        return wdt.itemsize

    def chunk(self, c: Chunk) -> list:
        raise NotImplementedError

    def merge(self, a: list, b: list, na: int, nb: int) -> list:
        raise NotImplementedError

    def combine(self, parts: list[tuple[list, int, int]], kc: int) -> list:
        """parts: (state [Q, 1, kc], Q, elements per partition) per group -> state [1, 1, kc]."""
        raise NotImplementedError

    def finish(self, st: list, total: int, final: bool) -> list:
        """state -> output tiles (final) or stage partials (not final)."""
        return st

    n_partials = 1


def reduce_free(ctx: Ctx, dst, x, op: Alu, engine=None, fast=False, negate=False, slots=False):
    """tensor_reduce of [p, k, n, kc] over n into [p, k, kc] on Vector or GpSimd (``slots``: one
    instruction per row slot, so later per-row work can start as soon as its row is reduced)."""
    k, n, kc = x.shape[1], x.shape[2], x.shape[3]
    parts = [(j, j + 1) for j in range(k)] if slots and k > 1 else [(0, k)]
    for a, b in parts:
        size = (b - a) * n * kc
        e = engine or ctx.pick({en: ctx.cycles("red", en, size, fast and en is V) for en in (V, G)})
        nisa.tensor_reduce(dst[:, a:b], x[:, a:b], op, axis=2, negate=negate, engine=e)


class SumOp(Op):
    name = "sum"
    identity = 0.0

    def __init__(self, ctx, dt, scale: float = 1.0):
        super().__init__(ctx, dt)
        self.scale = scale  # mean: 1/N at the final stage

    def chunk(self, c: Chunk) -> list:
        ctx, x = self.ctx, c.xs[0]
        if self.int:
            dst = tile(c.sshape, I32, "isum")
            nisa.tensor_reduce(dst, x, Alu.add, axis=2, engine=ctx.charge(G, ctx.cycles("red", G, c.k * c.n * c.kc)))
            return [dst]
        dst = tile(c.sshape, F32, "sum")
        sum_rows(ctx, dst, x, c)
        return [dst]

    def merge(self, a, b, na, nb):
        out = tile(a[0].shape, a[0].dtype, "summ")
        nisa.tensor_tensor(out, a[0], b[0], Alu.add, engine=G if self.int else V)
        return [out]

    def combine(self, parts, kc):
        if self.int:
            return [combine_gpsimd(self.ctx, [(st[0], Q) for st, Q, _ in parts], Alu.add, I32, kc)]
        return [combine_sum(self.ctx, [(st[0], Q, None) for st, Q, _ in parts], kc)]

    def finish(self, st, total, final):
        if final and self.scale != 1.0:
            out = tile(st[0].shape, F32, "mean")
            ts(out, st[0], Alu.multiply, self.scale)
            return [out]
        return st


def sum_rows(ctx: Ctx, dst, x, c: Chunk, neg: bool = False):
    """dst [p, k, kc] fp32 = sum (``neg``: minus the sum) of x [p, k, n, kc] over n, split over Vector,
    GpSimd and ScalarE (activation identity with its free accumulate; x is rewritten unchanged)."""
    n, k, kc = c.n, c.k, c.kc
    sc = -1.0 if neg else 1.0
    if k > 1:
        def cost(e, size):
            if e is S:
                return ctx.cycles("act", S, n, reduce=True) * size if kc == 1 else None
            return ctx.cycles("red", e, size * n * kc)
        for e, a, b in ctx.split(k, _max(1, 2048 // _max(n * kc, 1)), cost):
            if e is S:
                for j in range(a, b):
                    xj = x[:, j:j + 1]
                    nisa.activation(junk_of(xj, neg), Act.identity, xj, scale=sc, reduce_res=dst[:, j:j + 1])
            else:
                nisa.tensor_reduce(dst[:, a:b], x[:, a:b], Alu.add, axis=2, negate=neg, engine=e)
        return

    def cost(e, size):
        if e is S:
            return ctx.cycles("act", S, size, reduce=True) if kc == 1 else None
        return ctx.cycles("red", e, size * kc)
    pieces = ctx.split(n, 2048, cost)
    if len(pieces) == 1:
        e = pieces[0][0]
        if e is S:
            nisa.activation(junk_of(x, neg), Act.identity, x, scale=sc, reduce_res=dst)
        else:
            nisa.tensor_reduce(dst, x, Alu.add, axis=2, negate=neg, engine=e)
        return
    part = tile((c.p, len(pieces), kc), F32, "sump")
    for i, (e, a, b) in enumerate(pieces):
        xa = x[:, :, a:b]
        if e is S:
            nisa.activation(junk_of(xa, neg), Act.identity, xa, scale=sc, reduce_res=part[:, i:i + 1])
        else:
            nisa.tensor_reduce(part[:, i:i + 1], xa, Alu.add, axis=2, negate=neg, engine=e)
    nisa.tensor_reduce(dst, part.reshape(c.p, 1, len(pieces), kc), Alu.add, axis=2, engine=V)


def junk_of(x, neg: bool):
    """Where ScalarE's elementwise result goes when only its accumulate is wanted: x itself when the
    result equals x (identity), else a scratch tile."""
    return tile(x.shape, x.dtype, "junk") if neg else x


def combine_sum(ctx: Ctx, parts, kc: int, bcast_to: int = 0):
    """Sum over partitions of fp32 [Q, 1, kc] tiles (optionally scaled per group: (tile, Q, w)) on
    TensorE: ones[Q, 1] (or ones[Q, bcast_to] to replicate the result on ``bcast_to`` partitions).
    Returns a SBUF tile [1 or bcast_to, 1, kc] fp32."""
    m = _max(1, bcast_to)
    out = tile((m, 1, kc), F32, "csum")
    step = nl.tile_size.psum_fmax
    for c0 in range(0, kc, step):
        w = _min(step, kc - c0)
        ps = nl.ndarray((m, w), F32, buffer=nl.psum, name="csum_ps")
        for i, (t, Q, scale) in enumerate(parts):
            stat = ctx.ones(Q, m) if scale is None else ctx.filled(Q, m, scale)
            nisa.nc_matmul(ps, stat, flat2(t)[:, c0:c0 + w], accumulate=i > 0)
        nisa.tensor_copy(flat2(out)[:, c0:c0 + w], ps, engine=V)
    return out


def combine_gpsimd(ctx: Ctx, parts, op: Alu, dtype: DType, kc: int):
    """op-reduction over partitions of [Q, 1, kc] tiles on GpSimd -> [1, 1, kc]."""
    acc = None
    for t, _q in parts:
        r = tile((1, 1, kc), dtype, "cg")
        nisa.partition_reduce(r, t, op)
        if acc is None:
            acc = r
        else:
            nxt = tile((1, 1, kc), dtype, "cg")
            nisa.tensor_tensor(nxt, acc, r, op, engine=G)
            acc = nxt
    return acc


class ProdOp(Op):
    name = "prod"
    identity = 1.0

    def chunk(self, c):
        ctx, x = self.ctx, c.xs[0]
        dst = tile(c.sshape, I32 if self.int else F32, "prod")
        reduce_free(ctx, dst, x, Alu.multiply, engine=G if self.int else None)
        return [dst]

    def merge(self, a, b, na, nb):
        out = tile(a[0].shape, a[0].dtype, "prodm")
        nisa.tensor_tensor(out, a[0], b[0], Alu.multiply, engine=G if self.int else V)
        return [out]

    def combine(self, parts, kc):
        return [combine_gpsimd(self.ctx, [(st[0], Q) for st, Q, _ in parts], Alu.multiply, parts[0][0][0].dtype, kc)]


class ExtOp(Op):
    """amax / amin (exact: state in the input dtype)."""

    def __init__(self, ctx, dt, is_max: bool):
        super().__init__(ctx, dt)
        self.is_max = is_max
        self.alu = Alu.max if is_max else Alu.min
        self.name = "amax" if is_max else "amin"
        self.identity = -INF if is_max else INF

    def chunk(self, c):
        ctx, x = self.ctx, c.xs[0]
        dst = tile(c.sshape, self.work_dt, "ext")
        fast = self.is_max and self.dt is BF16
        reduce_free(ctx, dst, x, self.alu, engine=G if self.int else None, fast=fast)
        return [dst]

    def merge(self, a, b, na, nb):
        out = tile(a[0].shape, a[0].dtype, "extm")
        nisa.tensor_tensor(out, a[0], b[0], self.alu, engine=G if self.int else V)
        return [out]

    def combine(self, parts, kc):
        return [combine_gpsimd(self.ctx, [(st[0], Q) for st, Q, _ in parts], self.alu, parts[0][0][0].dtype, kc)]


class LseOp(Op):
    """logsumexp. State (nm, S): nm = -max, S = sum exp(x - max). torch's rule (an infinite max is
    the result) is applied at the end, so the ScalarE pass needs nothing but the reduce before it."""

    name = "logsumexp"
    identity = -INF
    exact_int = False

    def chunk(self, c):
        ctx, x = self.ctx, c.xs[0]
        nm = tile(c.sshape, F32, "lnm")
        reduce_free(ctx, nm, x, Alu.max, negate=True, slots=c.per_slot and c.n >= 1024)
        s = tile(c.sshape, F32, "lsum")
        if c.per_slot:
            for j in range(c.k):
                sl = slice(j, j + 1)
                ctx.charge(S, ctx.cycles("act", S, c.n, reduce=True))
                nisa.activation(x[:, sl], Act.exp, x[:, sl], bias=nm[:, sl], reduce_res=s[:, sl])
        else:
            d = tile(x.shape, F32, "esd")
            n = math.prod(x.shape[1:])
            e = ctx.pick({en: ctx.cycles("tt", en, n) for en in (V, G)})
            nisa.tensor_tensor(d, x, bcast(nm, c.n), Alu.add, engine=e)
            ctx.charge(S, ctx.cycles("act", S, n))
            nisa.activation(d, Act.exp, d)
            reduce_free(ctx, s, d, Alu.add)
        return [nm, s]

    def _rescale(self, nm_i, s_i, nM, shape):
        """s_i * exp(max_i - max), with s_i taken as 0 where max_i = -inf (its s_i is nan)."""
        live = tile(shape, F32, "llive")
        ts(live, nm_i, Alu.not_equal, INF)
        s0 = tile(shape, F32, "ls0")
        nisa.select(s0, live, s_i, 0.0)
        f = tile(shape, F32, "lf")
        nisa.tensor_tensor(f, nM, nm_i, Alu.subtract, engine=V)
        nisa.activation(f, Act.exp, f)
        nisa.tensor_tensor(f, f, s0, Alu.multiply, engine=V)
        return f

    def merge(self, a, b, na, nb):
        (nma, Sa), (nmb, Sb) = a, b
        nM = tile(nma.shape, F32, "lnM")
        nisa.tensor_tensor(nM, nma, nmb, Alu.min, engine=V)
        fa = self._rescale(nma, Sa, nM, nma.shape)
        fb = self._rescale(nmb, Sb, nM, nma.shape)
        nisa.tensor_tensor(fa, fa, fb, Alu.add, engine=V)
        return [nM, fa]

    def combine(self, parts, kc):
        ctx = self.ctx
        nM = combine_gpsimd(ctx, [(st[0], Q) for st, Q, _ in parts], Alu.min, F32, kc)
        scaled = []
        for (nm_i, s_i), Q, _ in parts:
            b = tile((Q, 1, kc), F32, "lcb")
            nisa.partition_broadcast(b, nM)
            scaled.append((self._rescale(nm_i, s_i, b, (Q, 1, kc)), Q, None))
        return [nM, combine_sum(ctx, scaled, kc)]

    def finish(self, st, total, final):
        nm, s = st
        r = tile(nm.shape, F32, "lse")
        nisa.activation(r, Act.log, s)
        nisa.tensor_tensor(r, r, nm, Alu.subtract, engine=V)
        m = tile(nm.shape, F32, "lm")
        ts(m, nm, Alu.multiply, -1.0)
        fin = tile(nm.shape, F32, "lfin")
        ts(fin, nm, Alu.abs_max, 0.0, Alu.not_equal, INF)
        out = tile(nm.shape, F32, "lout")
        nisa.select(out, fin, r, m)
        return [out]


class VarOp(Op):
    """var/std. State (mean, M2) for ``count`` elements per row (a static number)."""

    name = "var"
    identity = 0.0
    n_partials = 2
    exact_int = False

    def __init__(self, ctx, dt, correction: float, std: bool):
        super().__init__(ctx, dt)
        self.correction, self.std = correction, std

    def chunk(self, c):
        ctx = self.ctx
        x = c.xs[0]
        m2_in = c.xs[1] if len(c.xs) > 1 else None
        ns = tile(c.sshape, F32, "vns")  # minus the sum
        if m2_in is None:
            sum_rows(ctx, ns, x, Chunk([x], c.p, c.k, c.n, c.kc), neg=True)
        else:
            reduce_free(ctx, ns, x, Alu.add, negate=True)
        m2 = tile(c.sshape, F32, "vm2")
        if c.per_slot:
            # (n x - sum)^2 = n^2 (x - mean)^2, summed by ScalarE's accumulate: no op between the sum and it
            junk = tile((c.p, 1, c.n, 1), F32, "vj")
            for j in range(c.k):
                sl = slice(j, j + 1)
                ctx.charge(S, ctx.cycles("act", S, c.n, reduce=True))
                nisa.activation(junk, Act.square, x[:, sl], scale=float(c.n), bias=ns[:, sl], reduce_res=m2[:, sl])
            ts(m2, m2, Alu.multiply, float(c.count) / (c.n * c.n))
        else:
            mean = tile(c.sshape, F32, "vmb")
            ts(mean, ns, Alu.multiply, -1.0 / c.n)
            d = tile(x.shape, F32, "vd")
            n = math.prod(x.shape[1:])
            e = ctx.pick({en: ctx.cycles("tt", en, n) for en in (V, G)})
            nisa.tensor_tensor(d, x, bcast(mean, c.n), Alu.subtract, engine=e)
            ctx.charge(S, ctx.cycles("act", S, n))
            nisa.activation(d, Act.square, d)
            reduce_free(ctx, m2, d, Alu.add)
            if c.count != 1:
                ts(m2, m2, Alu.multiply, float(c.count))
        mean = tile(c.sshape, F32, "vmean")
        ts(mean, ns, Alu.multiply, -1.0 / c.n)
        if m2_in is not None:
            extra = tile(c.sshape, F32, "vm2i")
            reduce_free(ctx, extra, m2_in, Alu.add)
            nisa.tensor_tensor(m2, m2, extra, Alu.add, engine=V)
        return [mean, m2]

    def merge(self, a, b, na, nb):
        """Chan et al.: counts na, nb (static)."""
        (ma, Ma), (mb, Mb) = a, b
        n = na + nb
        d = tile(ma.shape, F32, "vmd")
        nisa.tensor_tensor(d, mb, ma, Alu.subtract, engine=V)
        mean = tile(ma.shape, F32, "vmm")
        nisa.tensor_scalar(mean, d, Alu.multiply, nb / n, op1=Alu.add, operand1=0.0)
        nisa.tensor_tensor(mean, mean, ma, Alu.add, engine=V)
        m2 = tile(ma.shape, F32, "vmm2")
        nisa.tensor_tensor(m2, d, d, Alu.multiply, engine=V)
        ts(m2, m2, Alu.multiply, na * nb / n)
        nisa.tensor_tensor(m2, m2, Ma, Alu.add, engine=V)
        nisa.tensor_tensor(m2, m2, Mb, Alu.add, engine=V)
        return [mean, m2]

    def combine(self, parts, kc):
        ctx = self.ctx
        total = _sum(Q * cnt for _, Q, cnt in parts)
        devs = []
        gmean_out = None
        for (_, _), Qh, _ in parts:
            # global mean replicated on this group's Qh partitions
            gm = combine_sum(ctx, [(st[0], Q, cnt / total) for st, Q, cnt in parts], kc, bcast_to=Qh)
            devs.append(gm)
        m2s = []
        for ((mean_i, m2_i), Q, cnt), gm in zip(parts, devs):
            d = tile((Q, 1, kc), F32, "vcd")
            nisa.tensor_tensor(d, mean_i, gm, Alu.subtract, engine=V)
            nisa.tensor_tensor(d, d, d, Alu.multiply, engine=V)
            ts(d, d, Alu.multiply, float(cnt))
            nisa.tensor_tensor(d, d, m2_i, Alu.add, engine=V)
            m2s.append((d, Q, None))
            if gmean_out is None:
                gmean_out = gm
        m2 = combine_sum(ctx, m2s, kc)
        mean = tile((1, 1, kc), F32, "vcm")
        nisa.tensor_copy(mean, gmean_out[0:1], engine=V)
        return [mean, m2]

    def finish(self, st, total, final):
        if not final:
            return st
        out = tile(st[1].shape, F32, "var")
        div = _max(0.0, total - self.correction)
        ts(out, st[1], Alu.multiply, 1.0 / div if div > 0 else INF)
        if self.std:
            nisa.activation(out, Act.sqrt, out)
        return [out]


class ArgOp(Op):
    """argmax/argmin (+ values). State (value, index fp32 global)."""

    def __init__(self, ctx, dt, is_max: bool):
        super().__init__(ctx, dt)
        self.is_max = is_max
        self.alu = Alu.max if is_max else Alu.min
        self.name = "argmax" if is_max else "argmin"

    def widest(self, wdt):
        return _max(wdt.itemsize, 4)  # the int32/fp32 position keys beside a 16-bit input

    def _key_value(self, m):
        """m with NaN mapped past every number (float) so (x cmp m') marks non-matches."""
        if self.int:
            return m
        return nan_to(self.ctx, m, INF if self.is_max else -INF)

    def chunk(self, c):
        ctx, x = self.ctx, c.xs[0]
        shape4 = (c.p, c.k, c.n, c.kc)
        n = c.k * c.n * c.kc
        v = tile(c.sshape, self.work_dt, "av")
        reduce_free(ctx, v, x, self.alu, engine=G if self.int else None, fast=self.is_max and self.dt is BF16)
        idx = tile(c.sshape, I32 if self.int else F32, "ai")
        if self.int:
            rev = ctx.const(("riota", shape4, c.seg), lambda: _rev_iota(shape4, c.seg))
            eq = tile(shape4, I32, "aeq")
            if c.per_slot:
                for j in range(c.k):
                    sl = slice(j, j + 1)
                    ts(eq[:, sl], x[:, sl], Alu.equal, v[:, sl], engine=ctx.charge(G, ctx.cycles("ts", G, c.n)))
            else:
                nisa.tensor_tensor(eq, x, bcast(v, c.n), Alu.equal, engine=ctx.charge(G, ctx.cycles("tt", G, n)))
            nisa.tensor_tensor(eq, eq, rev, Alu.multiply, engine=ctx.charge(G, ctx.cycles("tt", G, n)))
            best = tile(c.sshape, I32, "abest")
            nisa.tensor_reduce(best, eq, Alu.max, axis=2, engine=ctx.charge(G, ctx.cycles("red", G, n)))
            ts(idx, best, Alu.subtract, INT_BIG + c.r0, rev0=True, engine=G)  # INT_BIG + r0 - best (exact)
            return [v, idx]
        mk = self._key_value(v)
        cmp = Alu.less if self.is_max else Alu.greater
        sio = ctx.const(("siota", shape4, c.seg), lambda: _scaled_iota(shape4, c.seg))
        key = tile(shape4, F32, "akey")
        if c.per_slot:
            for j in range(c.k):
                sl = slice(j, j + 1)
                e = ctx.pick({en: ctx.cycles("ts", en, c.n) for en in (V, G)})
                ts(key[:, sl], x[:, sl], cmp, mk[:, sl], engine=e)
        else:
            e = ctx.pick({en: ctx.cycles("tt", en, n) for en in (V, G)})
            nisa.tensor_tensor(key, x, bcast(mk, c.n), cmp, engine=e)
        e = ctx.pick({en: ctx.cycles("tt", en, n) for en in (V, G)})
        nisa.tensor_tensor(key, key, sio, Alu.add, engine=e)
        best = tile(c.sshape, F32, "abest")
        reduce_free(ctx, best, key, Alu.min)
        ts(idx, best, Alu.multiply, IDX_BIG, Alu.add, float(c.r0))
        return [v, idx]

    def merge(self, a, b, na, nb):
        """b (later elements) replaces a where strictly better, or b is NaN and a is not."""
        (va, ia), (vb, ib) = a, b
        eng = G if self.int else V
        take = tile(va.shape, F32, "atk")
        nisa.tensor_tensor(take, vb, va, Alu.greater if self.is_max else Alu.less, engine=eng)
        if not self.int:
            nb_ = tile(va.shape, F32, "anb")
            nisa.tensor_tensor(nb_, vb, vb, Alu.not_equal, engine=V)  # b is NaN
            na_ = tile(va.shape, F32, "ana")
            nisa.tensor_tensor(na_, va, va, Alu.equal, engine=V)  # a is not NaN
            nisa.tensor_tensor(nb_, nb_, na_, Alu.logical_and, engine=V)
            nisa.tensor_tensor(take, take, nb_, Alu.logical_or, engine=V)
        v = tile(va.shape, va.dtype, "amv")
        i = tile(va.shape, ia.dtype, "ami")
        if self.int:
            # v = va + take * (vb - va) exactly in int mode
            d = tile(va.shape, I32, "amd")
            tk = tile(va.shape, I32, "amt")
            nisa.tensor_copy(tk, take, engine=G)
            nisa.tensor_tensor(d, vb, va, Alu.subtract, engine=G)
            nisa.tensor_tensor(d, d, tk, Alu.multiply, engine=G)
            nisa.tensor_tensor(v, va, d, Alu.add, engine=G)
        else:
            nisa.select(v, take, vb, va)
        nisa.select(i, take, ib, ia)
        return [v, i]

    def combine(self, parts, kc):
        ctx = self.ctx
        vdt = parts[0][0][0].dtype
        vm = combine_gpsimd(ctx, [(st[0], Q) for st, Q, _ in parts], self.alu, vdt, kc)
        mk = self._key_value(vm) if not self.int else vm
        best = None
        for (v_i, i_i), Q, _ in parts:
            b = tile((Q, 1, kc), mk.dtype, "acb")
            nisa.partition_broadcast(b, mk)
            key = tile((Q, 1, kc), i_i.dtype, "ack")
            if self.int:
                nisa.tensor_tensor(key, v_i, b, Alu.not_equal, engine=G)
            else:
                nisa.tensor_tensor(key, v_i, b, Alu.less if self.is_max else Alu.greater, engine=V)
            ts(key, key, Alu.multiply, INT_BIG if self.int else IDX_BIG, engine=G)
            nisa.tensor_tensor(key, key, i_i, Alu.add, engine=G)
            r = tile((1, 1, kc), i_i.dtype, "acr")
            nisa.partition_reduce(r, key, Alu.min)
            if best is None:
                best = r
            else:
                b2 = tile((1, 1, kc), i_i.dtype, "acr")
                nisa.tensor_tensor(b2, best, r, Alu.min, engine=G)
                best = b2
        return [vm, best]


def _scaled_iota(shape4, seg: int):
    """fp32 tile of (j + seg * p) / 2**24 over [p, k, n, kc] (index along n)."""
    it = nl.ndarray(shape4, I32, name="iota")
    nisa.iota(it, (0, 1, 0), offset=0, channel_multiplier=seg)
    out = nl.ndarray(shape4, F32, name="siota")
    nisa.tensor_scalar(out, it, Alu.multiply, 1.0 / IDX_BIG, engine=G)
    return out


def _rev_iota(shape4, seg: int):
    """int32 tile of 2**30 - (j + seg * p)."""
    it = nl.ndarray(shape4, I32, name="riota")
    nisa.iota(it, (0, -1, 0), offset=int(INT_BIG), channel_multiplier=-seg)
    return it


# ================================================================================================
# Stage runner
# ================================================================================================
def plan_layout(ctx: Ctx, K0: int, R: int, K1: int, isz: int = 4, limit: int = 0) -> str:
    """'A' (k0 on partitions) or 'B' (R across partitions, one k0 at a time), by estimated time:
    DMA bytes plus a run's floor per contiguous run (``dma_run_min_ns``), against per-partition
    element work (about one engine cycle per element) plus a combine per (k0, column chunk) for B.
    ``limit``: bytes per partition a tile may take (sets how many K1 columns a partition holds)."""
    P, prof = ctx.P, ctx.prof
    if R <= 1 or K0 >= P:
        return "A"
    limit = limit or 32 * 1024
    desc = prof.dma_run_min_ns / prof.dma_engines
    nbytes = K0 * R * K1 * isz
    dma = nbytes / prof.dma_bytes_per_ns
    ghz = prof.vector_ghz

    def runs(width):  # contiguous runs when a partition holds `width` of the K1 columns of its rows
        return K0 * R * cdiv(K1, width) if width < K1 else K0 * R / _max(1, R if width >= K1 else 1)

    kc_a = _max(1, _min(K1, limit // _max(1, R * isz)))
    a = _max(dma + (K0 * R * cdiv(K1, kc_a) if kc_a < K1 else K0) * desc, cdiv(K0, P) * R * K1 / ghz)
    L = _max(1, R // _min(P, R))
    kc_b = _max(1, _min(K1, limit // _max(1, L * isz)))
    combine = (4 * prof.min_ii + 8 * prof.gpsimd_start) / ghz  # partition ops + matmuls per chunk
    b = _max(dma + K0 * (cdiv(R, L) * cdiv(K1, kc_b) if kc_b < K1 else P) * desc,
             K0 * (L * K1 / ghz + combine * cdiv(K1, kc_b)))
    return "B" if b < a else "A"


def row_tiles(K0: int, P: int, k: int) -> list[tuple[int, int, int]]:
    """(first row, partitions, rows per partition) covering K0 rows."""
    out, r = [], 0
    full = K0 // (P * k)
    for _ in range(full):
        out.append((r, P, k))
        r += P * k
    rest = K0 - r
    if rest >= k and k > 1:
        out.append((r, rest // k, k))
        r += (rest // k) * k
        rest = K0 - r
    while rest > 0:
        p = _min(P, rest)
        out.append((r, p, 1))
        r += p
        rest -= p
    return out


def run_stage(ctx: Ctx, op: Op, srcs: list, dsts: list, K0: int, R: int, K1: int, *, count: int, total: int,
              final: bool, budget: int, layout: str = "auto"):
    """Reduce srcs (HBM, seen as [K0, R, K1]) over R into dsts (HBM, [K0, K1] elements each)."""
    P = ctx.P
    wdt = op.work_dt if count == 1 else op.partial_dt
    # elements per partition per tile; also bounds every free stride of a [p, k, n, kc] tile
    E = _max(1, _min(budget // op.widest(wdt), ctx.prof.free_stride_max))
    cap = ctx.prof.free_size_max
    if layout == "auto" or (layout == "B" and (R <= 1 or K0 >= P)):
        layout = plan_layout(ctx, K0, R, K1)
    if layout == "A":
        if R * K1 <= E:
            kc, n, k = K1, R, _max(1, _min(E // _max(R * K1, 1), cdiv(K0, P), cap))
        elif K1 <= E:
            kc, n, k = K1, _min(E // K1, cap), 1
        else:
            kc, n, k = _min(E, cap), 1, 1
        for row0, p, kk in row_tiles(K0, P, k):
            for c0 in range(0, K1, kc):
                w = _min(kc, K1 - c0)
                st, seen = None, 0
                for r0 in range(0, R, n):
                    nn = _min(n, R - r0)
                    xs = []
                    for src in srcs:
                        t = nl.ndarray((p, kk, nn, w), wdt, name="x")
                        ctx.load(t, hbm3(src, K0, R, K1, row0, p, kk, r0, nn, c0, w))
                        xs.append(t)
                    part = op.chunk(Chunk(xs, p, kk, nn, w, r0=r0, count=count))
                    st = part if st is None else op.merge(st, part, seen * count, nn * count)
                    seen += nn
                outs = op.finish(st, total, final)
                for o, dst in zip(outs, dsts):
                    ctx.store(view(dst, dst.offset + row0 * K1 + c0, ((p, kk * K1), (kk, K1), (w, 1))), o)
        return
    # layout B
    if isinstance(op, SumOp) and not op.int and K1 >= 64 and cdiv(K1, 2) >= 64:
        return sum_outer_tensore(ctx, op, srcs[0], dsts[0], K0, R, K1, wdt, E, final)
    q = _min(P, R)
    L = R // q
    rem = R - q * L
    grps = [(0, q, L)] + ([(q * L, rem, 1)] if rem else [])
    kc = _min(K1, E, cap)
    if L * kc > E:  # keep each partition's HBM runs >= 2 KiB, then as many of its L rows as fit
        kc = _min(kc, _max(E // L, 2048 // wdt.itemsize, 1))
    n = _max(1, _min(L, E // kc, cap))
    for k0 in range(K0):
        for c0 in range(0, K1, kc):
            w = _min(kc, K1 - c0)
            parts = []
            for s0, Q, Lg in grps:
                st, seen = None, 0
                ng = _min(n, Lg)
                for j0 in range(0, Lg, ng):
                    nn = _min(ng, Lg - j0)
                    xs = []
                    for src in srcs:
                        t = nl.ndarray((Q, 1, nn, w), wdt, name="xb")
                        ctx.load(t, hbm_seg(src, R, K1, k0, s0, Q, Lg, j0, nn, c0, w))
                        xs.append(t)
                    part = op.chunk(Chunk(xs, Q, 1, nn, w, r0=s0 + j0, seg=Lg, count=count))
                    st = part if st is None else op.merge(st, part, seen * count, nn * count)
                    seen += nn
                parts.append((st, Q, Lg * count))
            st = op.combine(parts, w) if len(parts) > 1 or parts[0][1] > 1 else parts[0][0]
            outs = op.finish(st, total, final)
            for o, dst in zip(outs, dsts):
                ctx.store(view(dst, dst.offset + k0 * K1 + c0, ((1, K1), (1, K1), (w, 1))), o)


def sum_outer_tensore(ctx: Ctx, op, x, dst, K0: int, R: int, K1: int, wdt: DType, E: int, final: bool):
    """Float sums over an outer dim on TensorE: each [<=128 rows, <=128 columns] block is the stationary
    operand of a matmul with a ones column (64 cycles per 128x128 block, x4 in fp32; every input
    element is read once), accumulating the column sums in fp32 PSUM, columns on partitions. They are
    then transposed back to rows (TensorE) for contiguous stores."""
    P = ctx.P
    pdt = wdt if wdt in (F32, BF16, DType.float16) else F32  # TensorE's float dtypes; exact products with ones
    kc = _min(K1, E, P * nl.tile_size.psum_fmax)  # columns per load: the per-partition budget
    rows = _min(P, R)  # rows of R per load, on partitions
    ones = ctx.ones(P, 1, pdt)
    scale = op.scale if final else 1.0
    for k0 in range(K0):
        for c0 in range(0, K1, kc):
            w = _min(kc, K1 - c0)
            nb = cdiv(w, P)
            ps = nl.ndarray((P, nb), F32, buffer=nl.psum, name="osum")
            first = True
            for r0 in range(0, R, rows):
                q = _min(rows, R - r0)
                t = nl.ndarray((q, w), pdt, name="xo")
                ctx.load(t, view(x, x.offset + (k0 * R + r0) * K1 + c0, ((q, K1), (w, 1))))
                for b in range(nb):
                    cw = _min(P, w - b * P)
                    nisa.nc_matmul(ps[0:cw, b:b + 1], t[:, b * P:b * P + cw], ones[0:q], accumulate=not first)
                first = False
            cols = tile((P, nb), F32, "osc")
            ts(cols, ps, Alu.multiply, scale)
            for b0 in range(0, nb, P):
                m = _min(P, nb - b0)
                tp = nl.ndarray((m, P), F32, buffer=nl.psum, name="ost")
                nisa.nc_transpose(tp, cols[:, b0:b0 + m])
                res = tile((m, P), F32, "osr")
                nisa.tensor_copy(res, tp, engine=V)
                full = m if (b0 + m) * P <= w else m - 1
                base = dst.offset + k0 * K1 + c0 + b0 * P
                if full:
                    ctx.store(view(dst, base, ((full, P), (P, 1))), res[0:full])
                if full < m:
                    tail = w - (b0 + full) * P
                    ctx.store(view(dst, base + full * P, ((1, P), (tail, 1))), res[full:full + 1, 0:tail])


def fill(ctx: Ctx, out, value: float):
    """Write ``value`` into every element of an HBM tensor (empty reductions)."""
    total = math.prod(out.shape)
    if total == 0:
        return
    P = ctx.P
    flat = view(out, out.offset, ((total, 1),))
    rows = _min(P, total)
    per = cdiv(total, rows)
    t = tile((rows, per), F32, "fill")
    nisa.memset(t, value, engine=V)
    full = total // per
    if full:
        ctx.store(view(flat, flat.offset, ((full, per), (per, 1))), t[0:full])
    if total - full * per:
        ctx.store(view(flat, flat.offset + full * per, ((1, 1), (total - full * per, 1))), t[0:1, 0:total - full * per])


def reduce_all(ctx: Ctx, op: Op, x, dims, outs: list, *, budget: int, layout: str = "auto"):
    """Run the stages of op over ``dims`` of x into the HBM outputs ``outs``."""
    shape = tuple(x.shape)
    grps = groups_of(shape, dims)
    total = math.prod(shape[d] for d in dims) if dims else 1
    if math.prod(shape) == 0:
        if any(math.prod(o.shape) for o in outs):
            if op.name in ("amax", "amin", "argmax", "argmin"):
                raise KernelError(f"{op.name}: cannot reduce over an empty dim")
            value = {"sum": 0.0, "prod": 1.0, "logsumexp": -INF}.get(op.name, float("nan"))
            if op.name == "sum" and op.scale != 1.0:
                value = float("nan")
            for o in outs:
                fill(ctx, o, value)
        return
    cur = [view(x, x.offset, ((math.prod(shape), 1),))]
    count = 1
    while True:
        j = _max(i for i, (_, r) in enumerate(grps) if r)
        K0 = math.prod(s for s, _ in grps[:j])
        R = grps[j][0]
        K1 = math.prod(s for s, _ in grps[j + 1:])
        final = not any(r for _, r in grps[:j])
        if final:
            dsts = [view(o, o.offset, ((K0 * K1, 1),)) for o in outs]
        else:
            dsts = [nl.ndarray((K0 * K1,), op.partial_dt, buffer=nl.hbm, name=f"scratch_{op.name}{i}")
                    for i in range(op.n_partials)]
        run_stage(ctx, op, cur, dsts, K0, R, K1, count=count, total=total, final=final, budget=budget,
                  layout=layout)
        if final:
            return
        count *= R
        del grps[j]
        merged: list[list] = []
        for s, r in grps:
            if merged and merged[-1][1] == r:
                merged[-1][0] *= s
            else:
                merged.append([s, r])
        grps = merged
        cur = dsts


# ================================================================================================
# Kernels
# ================================================================================================
TUNE = {"tile_kib": (16, 8, 32, 64)}


def _out(shape, dtype, name):
    return nl.ndarray(tuple(shape), dtype, buffer=nl.hbm, name=name)


def _float_only(x, what):
    if not x.dtype.is_float:
        raise KernelError(f"{what}: expected a floating point input, got {x.dtype}")


@nk.kernel(name="sum", tunables=TUNE)
def sum(x, dim=None, keepdim=False, dtype=None, tile_kib=16, layout="auto"):  # noqa: A001
    """torch.sum(x, dim, keepdim). Floats keep their dtype (fp32 accumulation) or, with ``dtype`` float32, give
    float32 (the sum of the exactly widened values: what summing a float32 copy gives); ints/bool -> int64
    (exact int32 accumulation, wrapping beyond it)."""
    ctx = Ctx()
    dims = norm_dims(x.ndim, dim)
    if dtype is not None and (not x.dtype.is_float or dtype != F32):
        raise KernelError(f"sum: dtype={dtype} is only taken for float inputs summed into float32, got {x.dtype}")
    odt = I64 if is_int(x.dtype) else (dtype or x.dtype)
    out = _out(reduced_shape(x.shape, dims, keepdim), odt, "out")
    reduce_all(ctx, SumOp(ctx, x.dtype), x, dims, [out], budget=tile_kib * 1024, layout=layout)
    return out


@nk.kernel(name="mean", tunables=TUNE)
def mean(x, dim=None, keepdim=False, tile_kib=16, layout="auto"):
    """torch.mean(x, dim, keepdim) for floats."""
    _float_only(x, "mean")
    ctx = Ctx()
    dims = norm_dims(x.ndim, dim)
    total = math.prod(x.shape[d] for d in dims)
    out = _out(reduced_shape(x.shape, dims, keepdim), x.dtype, "out")
    reduce_all(ctx, SumOp(ctx, x.dtype, scale=1.0 / total if total else float("nan")), x, dims, [out],
               budget=tile_kib * 1024, layout=layout)
    return out


@nk.kernel(name="prod", tunables=TUNE)
def prod(x, dim=None, keepdim=False, tile_kib=16, layout="auto"):
    """torch.prod(x, dim, keepdim) (fp32 products; ints -> int64 with int32 wrapping)."""
    ctx = Ctx()
    dims = norm_dims(x.ndim, dim)
    odt = I64 if is_int(x.dtype) else x.dtype
    out = _out(reduced_shape(x.shape, dims, keepdim), odt, "out")
    reduce_all(ctx, ProdOp(ctx, x.dtype), x, dims, [out], budget=tile_kib * 1024, layout=layout)
    return out


def _ext(x, dim, keepdim, is_max, tile_kib, layout):
    ctx = Ctx()
    dims = norm_dims(x.ndim, dim)
    out = _out(reduced_shape(x.shape, dims, keepdim), x.dtype, "out")
    reduce_all(ctx, ExtOp(ctx, x.dtype, is_max), x, dims, [out], budget=tile_kib * 1024, layout=layout)
    return out


@nk.kernel(name="amax", tunables=TUNE)
def amax(x, dim=(), keepdim=False, tile_kib=16, layout="auto"):
    """torch.amax(x, dim, keepdim) (exact, NaN propagates)."""
    return _ext(x, dim, keepdim, True, tile_kib, layout)


@nk.kernel(name="amin", tunables=TUNE)
def amin(x, dim=(), keepdim=False, tile_kib=16, layout="auto"):
    """torch.amin(x, dim, keepdim)."""
    return _ext(x, dim, keepdim, False, tile_kib, layout)


def _arg(x, dim, keepdim, is_max, values: bool, tile_kib, layout):
    ctx = Ctx()
    if dim is None:
        dims = tuple(range(x.ndim))
        oshape = (1,) * x.ndim if keepdim else ()
        src = view(x, x.offset, ((math.prod(x.shape), 1),))
        dims_flat = (0,)
    else:
        dims = norm_dims(x.ndim, dim)
        if len(dims) != 1 and x.ndim:
            raise KernelError("argmax/argmin/max/min take one dim")
        oshape = reduced_shape(x.shape, dims, keepdim)
        src, dims_flat = x, dims
    del dims
    outs = [_out(oshape, x.dtype, "values")] if values else []
    idx = _out(oshape, I64, "indices")
    op = ArgOp(ctx, x.dtype, is_max)
    tmp_v = outs[0] if values else nl.ndarray(oshape or (1,), x.dtype, buffer=nl.hbm, name="scratch_values")
    reduce_all(ctx, op, src, dims_flat if src.ndim else (), [tmp_v, idx], budget=tile_kib * 1024, layout=layout)
    return (outs[0], idx) if values else idx


@nk.kernel(name="argmax", tunables=TUNE)
def argmax(x, dim=None, keepdim=False, tile_kib=16, layout="auto"):
    """torch.argmax -> int64 (first occurrence; dim=None: index into the flattened tensor)."""
    return _arg(x, dim, keepdim, True, False, tile_kib, layout)


@nk.kernel(name="argmin", tunables=TUNE)
def argmin(x, dim=None, keepdim=False, tile_kib=16, layout="auto"):
    """torch.argmin -> int64."""
    return _arg(x, dim, keepdim, False, False, tile_kib, layout)


@nk.kernel(name="max", tunables=TUNE)
def max(x, dim, keepdim=False, tile_kib=16, layout="auto"):  # noqa: A001
    """torch.max(x, dim, keepdim) -> (values, indices int64)."""
    return _arg(x, dim, keepdim, True, True, tile_kib, layout)


@nk.kernel(name="min", tunables=TUNE)
def min(x, dim, keepdim=False, tile_kib=16, layout="auto"):  # noqa: A001
    """torch.min(x, dim, keepdim) -> (values, indices int64)."""
    return _arg(x, dim, keepdim, False, True, tile_kib, layout)


def _var(x, dim, correction, keepdim, std, tile_kib, layout):
    _float_only(x, "std" if std else "var")
    ctx = Ctx()
    dims = norm_dims(x.ndim, dim)
    out = _out(reduced_shape(x.shape, dims, keepdim), x.dtype, "out")
    reduce_all(ctx, VarOp(ctx, x.dtype, float(correction), std), x, dims, [out], budget=tile_kib * 1024, layout=layout)
    return out


@nk.kernel(name="var", tunables=TUNE)
def var(x, dim=None, correction=1, keepdim=False, tile_kib=16, layout="auto"):
    """torch.var(x, dim, correction=, keepdim=)."""
    return _var(x, dim, correction, keepdim, False, tile_kib, layout)


@nk.kernel(name="std", tunables=TUNE)
def std(x, dim=None, correction=1, keepdim=False, tile_kib=16, layout="auto"):
    """torch.std(x, dim, correction=, keepdim=)."""
    return _var(x, dim, correction, keepdim, True, tile_kib, layout)


@nk.kernel(name="logsumexp", tunables=TUNE)
def logsumexp(x, dim, keepdim=False, tile_kib=16, layout="auto"):
    """torch.logsumexp(x, dim, keepdim) (floats keep their dtype; ints -> float32)."""
    ctx = Ctx()
    dims = norm_dims(x.ndim, dim)
    odt = F32 if is_int(x.dtype) else x.dtype
    out = _out(reduced_shape(x.shape, dims, keepdim), odt, "out")
    op = LseOp(ctx, x.dtype)
    reduce_all(ctx, op, x, dims, [out], budget=tile_kib * 1024, layout=layout)
    return out


# ================================================================================================
# cumsum
# ================================================================================================
def scan_logstep(ctx: Ctx, t, n: int, int_mode: bool):
    """In-place inclusive prefix sum of t [p, k, n, kc] along n: ceil(log2 n) shifted adds
    (Hillis-Steele; each instruction reads its whole input before writing)."""
    s = 1
    while s < n:
        size = math.prod(t.shape[1:]) // n * (n - s)
        e = G if int_mode else ctx.pick({en: ctx.cycles("tt", en, size) for en in (V, G)})
        nisa.tensor_tensor(t[:, :, s:n], t[:, :, s:n], t[:, :, 0:n - s], Alu.add, engine=e)
        s *= 2


def cumsum_logstep(ctx: Ctx, x, out, K0: int, R: int, K1: int, wdt: DType, E: int):
    """Rows (k0) on partitions, [k, n, kc] free; chunks of R carry their last row forward."""
    P = ctx.P
    int_mode = is_int(wdt)
    if R * K1 <= E:
        kc, n, k = K1, R, _max(1, _min(E // (R * K1), cdiv(K0, P)))
    else:
        kc = _min(K1, _max(1, E // 2))
        n, k = _max(1, _min(R, E // kc)), 1
    for row0, p, kk in row_tiles(K0, P, k):
        for c0 in range(0, K1, kc):
            w = _min(kc, K1 - c0)
            carry = None
            for r0 in range(0, R, n):
                nn = _min(n, R - r0)
                t = nl.ndarray((p, kk, nn, w), wdt, name="cx")
                ctx.load(t, hbm3(x, K0, R, K1, row0, p, kk, r0, nn, c0, w))
                scan_logstep(ctx, t, nn, int_mode)
                if carry is not None:
                    nisa.tensor_tensor(t, t, bcast(carry, nn), Alu.add, engine=G if int_mode else V)
                if r0 + nn < R:
                    carry = tile((p, kk, w), wdt, "carry")
                    nisa.tensor_copy(carry, t[:, :, nn - 1], engine=G if int_mode else V)
                ctx.store(hbm3(out, K0, R, K1, row0, p, kk, r0, nn, c0, w), t)


def scan_add(dst, src, initial, unused=None) -> None:
    """dst = initial + inclusive prefix sum of src along its free dim (VectorE scan, FP32 state, dst rounded
    once). Each element only meets the elements before it, so an inf or NaN never reaches earlier outputs
    (a triangular 0/1 matmul would make 0 * inf = NaN of them). op1 is bypass: its operand ``unused``
    (default src; an SBUF tile where src is in PSUM) only fills the slot."""
    nisa.tensor_tensor_scan(dst, src, src if unused is None else unused, initial, Alu.add, Alu.bypass)


def cumsum_rows_scan(ctx: Ctx, x, out, K0: int, R: int, E: int):
    """Float cumsum along the last dim. Per row tile [p, columns]: the totals of its 128-column blocks
    (one reduce) and their prefix (log-step on [p, blocks]) give each block's FP32 carry; each block is
    one scan from its carry, so no block waits for another."""
    P = ctx.P
    cols = _max(P, _min(R, (E // P) * P))  # columns per load
    for row0, p, _ in row_tiles(K0, P, 1):
        carry_in = None
        for c0 in range(0, R, cols):
            w = _min(cols, R - c0)
            nb = cdiv(w, P)
            t = nl.ndarray((p, w), x.dtype, name="crx")
            ctx.load(t, view(x, x.offset + row0 * R + c0, ((p, R), (w, 1))))
            more = c0 + w < R  # then w is whole blocks (cols is a multiple of P) and the last total carries on
            nred = nb if more else nb - 1
            tot = tile((p, nb + 1), F32, "ctot")  # tot[:, b] = carry into block b (b = nb: into the next load)
            if carry_in is None:
                nisa.memset(tot[:, 0:1], 0.0, engine=V)
            else:
                nisa.tensor_copy(tot[:, 0:1], carry_in, engine=V)
            if nred:
                reduce_free(ctx, view(tot, tot.offset + 1, (tot.dims[0], (nred, 1), (1, 1))),
                            view(t, t.offset, (t.dims[0], (nred, P), (P, 1), (1, 1))), Alu.add)
                scan_logstep(ctx, tot[:, 0:nred + 1].reshape(p, 1, nred + 1, 1), nred + 1, False)
            carry_in = tot[:, nb:nb + 1] if more else None
            res = nl.ndarray((p, w), x.dtype, name="cres")
            for b in range(nb):
                cw = _min(P, w - b * P)
                ctx.charge(V, 2 * cw)
                scan_add(res[:, b * P:b * P + cw], t[:, b * P:b * P + cw], tot[:, b:b + 1])
            ctx.store(view(out, out.offset + row0 * R + c0, ((p, R), (w, 1))), res)


def cumsum_outer_scan(ctx: Ctx, x, out, K0: int, R: int, K1: int):
    """Float cumsum along an outer dim. Per [<=128 scanned rows, <=512 columns] tile (one load, one store),
    each 128-column block is transposed (TensorE), scanned along the free dim from its columns' FP32
    running totals (VectorE) and transposed back into one PSUM tile; a scan's last column carries on."""
    P, W = ctx.P, nl.tile_size.psum_fmax
    for k0 in range(K0):
        for c0 in range(0, K1, W):
            w = _min(W, K1 - c0)
            blocks = [(b0, _min(P, w - b0)) for b0 in range(0, w, P)]
            carry = [0.0] * len(blocks)
            for r0 in range(0, R, P):
                q = _min(P, R - r0)
                t = nl.ndarray((q, w), x.dtype, name="cox")
                ctx.load(t, view(x, x.offset + (k0 * R + r0) * K1 + c0, ((q, K1), (w, 1))))
                back = nl.ndarray((q, w), F32, buffer=nl.psum, name="coback")
                for j, (b0, cw) in enumerate(blocks):
                    tp = nl.ndarray((cw, q), F32, buffer=nl.psum, name="cotp")
                    nisa.nc_transpose(tp, t[:, b0:b0 + cw])
                    st = nl.ndarray((cw, q), F32, name="cost")
                    ctx.charge(V, 2 * q)
                    scan_add(st, tp, carry[j], unused=st)
                    carry[j] = st[:, q - 1:q]
                    nisa.nc_transpose(back[:, b0:b0 + cw], st)
                res = nl.ndarray((q, w), out.dtype if out.dtype.is_float else F32, name="cores")
                _evacuate(ctx, res, back)
                ctx.store(view(out, out.offset + (k0 * R + r0) * K1 + c0, ((q, K1), (w, 1))), res)


def _evacuate(ctx: Ctx, dst, ps) -> None:
    """dst = ps (PSUM) on VectorE or ScalarE, whichever the scheduler finds free first."""
    e = ctx.pick({V: ctx.cycles("ts", V, ps.shape[1]), S: ctx.cycles("act", S, ps.shape[1])})
    if e is S:
        nisa.activation(dst, Act.identity, ps)
    else:
        nisa.tensor_copy(dst, ps, engine=V)


@nk.kernel(name="cumsum", tunables=TUNE)
def cumsum(x, dim, tile_kib=16):
    """torch.cumsum(x, dim): floats keep their dtype (fp32 accumulation); ints/bool -> int64 (exact
    int32 accumulation on GpSimd, wrapping beyond it)."""
    ctx = Ctx()
    odt = I64 if is_int(x.dtype) else x.dtype
    out = _out(x.shape, odt, "out")
    if x.ndim == 0:
        dims = (0,)
        shape = (1,)
    else:
        dims = norm_dims(x.ndim, dim)
        shape = tuple(x.shape)
    if len(dims) != 1:
        raise KernelError("cumsum takes one dim")
    K0, R, K1 = split3(shape, dims[0])
    if K0 * R * K1 == 0:
        return out
    flat_x = view(x, x.offset, ((K0 * R * K1, 1),))
    flat_o = view(out, out.offset, ((K0 * R * K1, 1),))
    E = _max(1, _min(tile_kib * 1024 // 4, ctx.prof.free_stride_max))
    if is_int(x.dtype) or R <= 64 or (K1 > 1 and K1 < 64):
        cumsum_logstep(ctx, flat_x, flat_o, K0, R, K1, I32 if is_int(x.dtype) else F32, E)
    elif K1 == 1:
        cumsum_rows_scan(ctx, flat_x, flat_o, K0, R, E)
    else:
        cumsum_outer_scan(ctx, flat_x, flat_o, K0, R, K1)
    return out
