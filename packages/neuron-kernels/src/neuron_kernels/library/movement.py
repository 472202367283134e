"""Data movement: copies and casts, transposes, permutes, strided views, cat, index_select, gather, scatter.

Every kernel follows the torch op of the same name (argument order, result shape and dtype) and
returns a new contiguous row-major HBM tensor. Arguments that are not arrays (dims, shapes,
strides) are compile-time constants.

How data moves
--------------
All layout kernels reduce to one planner, :func:`_move`: copy a strided view of one HBM tensor into
a strided view of another with the same shape. It drops size-1 dims, merges dims contiguous on both
sides (8-byte elements become pairs of 4-byte words), estimates the device time of each strategy
from the profile (DMA bytes and descriptor runs, DMA issue, engine and TensorE cycles) and runs the
cheapest. Every DMA has long contiguous runs on both sides except where noted.

``dma``
    HBM-to-HBM DMAs (5-d access patterns, split at 8 MiB). Chosen when the innermost dim is
    contiguous on both sides with long runs (cat of wide pieces, permutes that keep the trailing
    dims, clones and casts, slicing views), or when nothing else is cheaper. Only then can a run be
    short or a single element: views without any unit stride (``x[:, ::2]``, broadcasts), or rows
    of a few elements that no on-chip strategy handles better. The simulator charges each run a
    descriptor cost; on hardware too such DMAs are slow, so the planner avoids them.
``rows``
    One dim is spread over the partitions, ``g`` consecutive values per partition, with every dim
    nested inside it (on either side) kept whole in the partition. Each partition loads its block
    with long runs, an engine copy (Vector, GpSimd and Scalar in turn) reorders it with a permuted
    access pattern, and stores write long runs. Batched transposes of small matrices, narrow
    transposes (``[N, 4] <-> [4, N]``), head splits ``[B, S, H, D] -> [B, H, S, D]``, NCHW with few
    channels.
``transpose``
    128 x 128 TensorE transposes into PSUM (2- and 4-byte words; 1-byte data is widened to 2 bytes
    by the load DMA and narrowed when PSUM is evacuated), for layout changes of large matrices.
    Loads take rows of the source-contiguous dim (128-row blocks, or ``u`` consecutive rows per
    partition when source rows are short, or whole small matrices of a batch), stores write rows of
    the destination-contiguous dim (``v`` consecutive rows per partition when those are short). A
    short run contiguous on both sides (the last dim of ``permute(1, 0, 2)`` of ``[M, N, 2]``)
    travels as interleaved components, each transposed on its own.

gather / scatter / scatter_add pick one element per index, so they are element-granular by nature:
flat element offsets are computed on-chip (iota + index * stride; out-of-range indices become an
offset the DMA rejects at run time) and indirect DMAs move one element per partition, 128 per
instruction. index_select gathers whole rows (the trailing dims) with ``dma_gather``.

HBM-to-HBM DMAs move each byte once; the simulator charges them once against the core's HBM share,
so they can exceed the (bytes read + bytes written) DMA roofline the bench reports.
"""

from __future__ import annotations

import inspect
import itertools
import math

import neuron_kernels as nk
from neuron_hal import Alu, DType
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl
from neuron_kernels.errors import KernelError
from neuron_kernels.tensors import View
from neuron_kernels.tracer import builder

__all__ = ["as_strided_copy", "cat", "contiguous", "copy", "gather", "index_select", "move", "permute", "scatter",
           "scatter_add", "transpose"]

# Runs at least this long count as long: DMAs of them stream near full rate (each run is a descriptor
# element). A policy threshold of the planner, not a limit of the device.
_LONG_RUN = 512
# Bytes per partition of one gathered index_select tile, and of the widest output row cat assembles in SBUF.
_BLOCK_MAX = 16384
# Largest single DMA the direct strategy issues; bigger moves are split so several are in flight.
_DMA_MAX = 8 << 20
# Largest source stride for which rows load the whole span and skip elements on chip (reads s x bytes).
_SUPERSET_MAX = 4
# Longest common contiguous run (bytes) S1 carries as interleaved components; longer runs stay DMA runs.
_COMPONENT_MAX = 64
# Elements per partition of one gather/scatter tile (each column is one indirect DMA). Scatters into
# one tile's target range wait for each other, so scatter tiles are narrower: several chains overlap.
_ELEMENTS_K = 512
_SCATTER_K = 16

_TILE_CHOICES = (16384, 8192, 32768, 4096)  # bytes per partition of a staged tile
_TUNABLES = {"tile_bytes": _TILE_CHOICES}


# -- views -----------------------------------------------------------------------------------------
def _hbm(t: View, offset: int, dims, dtype=None) -> View:
    """A view of HBM tensor ``t``'s storage: element ``offset`` and ``(size, stride)`` dims."""
    return type(t)(t.owner, dtype or t.dtype, int(offset), tuple((int(n), int(s)) for n, s in dims))


def _free(v: View, dims) -> View:
    """The on-chip view ``v`` with its free dims replaced (strides in elements from ``v``'s origin)."""
    return type(v)(v.owner, v.dtype, v.offset, (v.dims[0],) + tuple((int(n), int(s)) for n, s in dims))


def _row_major(shape) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def _norm_dim(dim: int, ndim: int, what: str = "dim") -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise KernelError(f"{what} {dim} is out of range for a tensor of {ndim} dims")
    return dim % max(ndim, 1)


def _queue(kind: int) -> int:
    """DMA queue for a load (kind 0) or a store (kind 1): loads and stores use separate halves of the
    queues, so a load never waits in a queue behind a store that waits for compute (prefetch)."""
    b = builder()
    turns = b.__dict__.setdefault("_movement_queues", [0, 0])
    half = max(1, nl.profile().dma_queues // 2)
    q = kind * half + turns[kind] % half
    turns[kind] += 1
    return q % nl.profile().dma_queues


def _load(dst: View, src: View) -> None:
    nisa.dma_copy(dst, src, queue=_queue(0))


def _store(dst: View, src: View) -> None:
    nisa.dma_copy(dst, src, queue=_queue(1))


def _engines() -> list:
    """Engines that copy SBUF to SBUF, in the order tiles take turns on them."""
    engines = [nisa.vector_engine, nisa.gpsimd_engine]
    if nl.profile().scalar_tensor_copy:
        engines.append(nisa.scalar_engine)
    return engines


def _psum_engines() -> list:
    """Engines that copy PSUM to SBUF (GpSimd cannot reach PSUM)."""
    return [nisa.vector_engine, nisa.scalar_engine] if nl.profile().scalar_tensor_copy else [nisa.vector_engine]


def _staged_cast_ok(src: DType, dst: DType) -> bool:
    """Whether an engine copy casts like the DMA does (through FP32): same dtype, to float, to bool. Not
    from or to 8-byte values (int64): the engines compute on at most 32 bits, only DMAs cast those."""
    if src is dst:
        return True
    return max(src.itemsize, dst.itemsize) <= 4 and (dst.is_float or dst is DType.bool_)


# -- the planner -----------------------------------------------------------------------------------
def _merge(dims):
    """Drop size-1 dims and merge neighbours contiguous on every side. dims: (size, stride, stride...)."""
    out = []
    for d in dims:
        if d[0] == 1:
            continue
        if out and all(o == s * d[0] for o, s in zip(out[-1][1:], d[1:])):
            prev = out.pop()
            d = (prev[0] * d[0], *d[1:])
        out.append(tuple(d))
    return out


def _prepare(dst: View, src: View):
    """(dst, src, src offset, dst offset, merged dims (size, src stride, dst stride)) of a move; 8-byte
    elements become pairs of 4-byte words (engines do not compute on 8-byte words). Dims go in dst's order
    (outermost first; a row-major dst keeps its order), so views laid out alike (a transposed view cast
    into a transposed result) merge into long runs."""
    so, do = src.offset, dst.offset
    dims = sorted(((n, ss, ds) for (n, ss), (_, ds) in zip(src.dims, dst.dims)), key=lambda d: -d[2])
    if src.dtype is dst.dtype and src.dtype.itemsize == 8:
        src, dst = _hbm(src, 0, (), DType.uint32), _hbm(dst, 0, (), DType.uint32)  # templates: owner + dtype
        so, do = 2 * so, 2 * do
        dims = [(n, 2 * ss, 2 * ds) for n, ss, ds in dims] + [(2, 1, 1)]
    return dst, src, so, do, _merge(dims) or [(1, 1, 1)]


def _room(src: View, so: int) -> int:
    """Elements of src's storage (in src's element size) from element ``so`` on."""
    h = src.owner
    return math.prod(h.shape) * h.dtype.itemsize // src.dtype.itemsize - so


def _choose(dims, sdt: DType, ddt: DType, tile_bytes: int, room: int = 0):
    """(estimated ns, strategy, plan): direct DMA (0), SBUF rows (1) or TensorE transposes (2); on equal
    estimates the earlier one. ``room``: source elements readable from the view's start (for supersets)."""
    best = (_dma_cost(dims, sdt, ddt), 0, None)
    if _staged_cast_ok(sdt, ddt) and best[0] > _staged_floor():
        for rho in range(len(dims)):
            plan = _rows_plan(dims, rho, sdt, ddt, tile_bytes, room)
            if plan is not None and plan["cost"] < best[0]:
                best = (plan["cost"], 1, plan)
        plan = _transpose_plan(dims, sdt, ddt, tile_bytes)
        if plan is not None and plan["cost"] < best[0]:
            best = (plan["cost"], 2, plan)
    return best


def _move_cost(dst: View, src: View, tile_bytes: int = _TILE_CHOICES[0]) -> float:
    if math.prod(dst.shape) == 0:
        return 0.0
    dst, src, so, do, dims = _prepare(dst, src)
    return _choose(dims, src.dtype, dst.dtype, tile_bytes, _room(src, so))[0]


def _dense_like(v: View, dtype: DType, owner: View | None = None) -> View:
    """A view of v's shape, dense in v's dim order (innermost = v's smallest stride), in ``dtype``: on a new
    scratch tensor, or on ``owner``'s storage as a template for cost estimates."""
    order = sorted(range(len(v.dims)), key=lambda i: v.dims[i][1])
    strides, acc = [0] * len(v.dims), 1
    for i in order:
        strides[i], acc = acc, acc * v.dims[i][0]
    base = owner if owner is not None else _scratch((acc,), dtype)
    return _hbm(base, 0, [(n, st) for (n, _), st in zip(v.dims, strides)], dtype)


def _cast_split(dst: View, src: View, tile_bytes: int):
    """For a cast no engine can stage (``_staged_cast_ok``), the dense intermediate in the narrower dtype and
    whether it is on the source's side, when a cast by long-run DMAs plus a same-dtype layout move of the
    narrower values beats the element-granular direct DMA; else None."""
    if src.dtype is dst.dtype or _staged_cast_ok(src.dtype, dst.dtype):
        return None
    cast_first = src.dtype.itemsize > dst.dtype.itemsize  # reorder the narrower values (fewer bytes, TensorE)
    side, narrow = (src, dst.dtype) if cast_first else (dst, src.dtype)
    mid = _dense_like(side, narrow, dst)
    split = _move_cost(mid, src, tile_bytes) + _move_cost(dst, mid, tile_bytes)
    return (side, narrow) if split < _move_cost(dst, src, tile_bytes) else None


def _move(dst: View, src: View, tile_bytes: int = _TILE_CHOICES[0], split: bool = True) -> None:
    """dst[...] = src[...] for two HBM views of one shape (any rank and strides); casts like a DMA."""
    if dst.shape != src.shape:
        raise KernelError(f"internal: moving {list(src.shape)} into {list(dst.shape)}")
    if math.prod(dst.shape) == 0:
        return
    how = _cast_split(dst, src, tile_bytes) if split else None
    if how is not None:  # through a dense scratch: a cast with long runs and a same-dtype reorder
        mid = _dense_like(*how)
        _move(mid, src, tile_bytes, split=False)
        _move(dst, mid, tile_bytes, split=False)
        return
    dst, src, so, do, dims = _prepare(dst, src)
    cost, kind, plan = _choose(dims, src.dtype, dst.dtype, tile_bytes, _room(src, so))
    n0, ss0, ds0 = dims[0]
    head = [(n0 - 1, ss0, ds0)] + dims[1:]
    if (n0 > 1 and kind == 0 and _choose(dims, src.dtype, dst.dtype, tile_bytes, math.inf)[0] < cost / 2
            and _choose(head, src.dtype, dst.dtype, tile_bytes, _room(src, so))[0] < cost / 2):
        # Loading whole spans would read past the end of the storage: the last outer index goes alone.
        rest = dims[1:]
        _move(_hbm(dst, do, [(n0 - 1, ds0)] + [(d[0], d[2]) for d in rest]),
              _hbm(src, so, [(n0 - 1, ss0)] + [(d[0], d[1]) for d in rest]), tile_bytes)
        _move(_hbm(dst, do + (n0 - 1) * ds0, [(d[0], d[2]) for d in rest] or [(1, 1)]),
              _hbm(src, so + (n0 - 1) * ss0, [(d[0], d[1]) for d in rest] or [(1, 1)]), tile_bytes)
        return
    if kind == 1:
        _rows(dst, src, so, do, dims, plan)
    elif kind == 2:
        _transpose(dst, src, so, do, plan)
    else:
        _dma(dst, src, so, do, dims)


# -- a rough cost model, to choose a strategy --------------------------------------------------------
def _dma_ns(nbytes: float, run_bytes: float) -> float:
    """Transfer time of ``nbytes`` in runs of ``run_bytes`` spread over all DMA engines."""
    return nl.profile().dma_transfer_ns(nbytes, run_bytes)


def _issue_ns(count: int) -> float:
    p = nl.profile()
    return count * p.dma_issue_time_ns() / p.dma_issuers


def _staged_floor() -> float:
    """What any staged strategy pays at least: a load and a store in sequence."""
    p = nl.profile()
    return 2 * max(p.dma_issue_time_ns(), p.dma_fixed_ns)


def _dma_cost(dims, sdt: DType, ddt: DType) -> float:
    n, ss, ds = dims[-1]
    run = n if ss == 1 and ds == 1 else 1
    numel = math.prod(d[0] for d in dims)
    count = max(1, numel * max(sdt.itemsize, ddt.itemsize) // _DMA_MAX)
    return _dma_ns(numel * max(sdt.itemsize, ddt.itemsize), run * min(sdt.itemsize, ddt.itemsize)) + \
        _issue_ns(count) + nl.profile().dma_fixed_ns


def _copy_rate(sdt: DType, ddt: DType, contiguous: bool, penalty: bool) -> float:
    """Elements per partition per ns that Vector, GpSimd and Scalar copies reach together."""
    p = nl.profile()
    half = sdt in (DType.bfloat16, DType.float16) and ddt in (DType.bfloat16, DType.float16)
    vec_f = (p.vector_perf_copy_factor if contiguous else p.vector_perf_copy_partial_factor) if half else 1
    rate = p.vector_ghz * vec_f + p.gpsimd_ghz
    if p.scalar_tensor_copy:
        rate += p.scalar_ghz * (p.scalar_perf_factor if half else 1)
    return rate / (2 if penalty else 1)


# -- S0 / S3: direct DMAs --------------------------------------------------------------------------
def _dma(dst: View, src: View, so: int, do: int, dims, max_bytes: int = _DMA_MAX, queue_kind=None) -> None:
    """HBM -> HBM DMAs, each a block of up to 5 dims, split so none exceeds ``max_bytes``."""
    block, outer = dims[-5:], dims[:-5]
    itemsize = max(src.dtype.itemsize, dst.dtype.itemsize)
    n0, ss0, ds0 = block[0]
    per_row = math.prod(d[0] for d in block[1:]) * itemsize
    rows = max(1, min(n0, max_bytes // max(per_row, 1)))
    for idx in itertools.product(*(range(d[0]) for d in outer)):
        s_off = so + sum(i * d[1] for i, d in zip(idx, outer))
        d_off = do + sum(i * d[2] for i, d in zip(idx, outer))
        for r0 in range(0, n0, rows):
            r = min(rows, n0 - r0)
            sv = _hbm(src, s_off + r0 * ss0, [(r, ss0)] + [(d[0], d[1]) for d in block[1:]])
            dv = _hbm(dst, d_off + r0 * ds0, [(r, ds0)] + [(d[0], d[2]) for d in block[1:]])
            nisa.dma_copy(dv, sv, queue=None if queue_kind is None else _queue(queue_kind))


# -- S2: rows of one dim spread over partitions, reordered inside each partition -----------------------
def _merged_ap(tdims, key: int):
    """Merge (size, stride...) dims contiguous in stride ``key``; sizes and that stride only."""
    out = []
    for d in tdims:
        if d[0] == 1:
            continue
        if out and out[-1][1] == d[key] * d[0]:
            out[-1] = (out[-1][0] * d[0], d[key])
        else:
            out.append((d[0], d[key]))
    return out or [(1, 1)]


def _rows_plan(dims, rho: int, sdt: DType, ddt: DType, tile_bytes: int, room: int = 0):
    """S2 with ``dims[rho]`` spread over partitions (g consecutive values each), every dim nested inside it
    on either side kept whole in the partition, the rest looped. None when it does not fit or apply.

    When no dim is contiguous in the source and the smallest source stride s is small (``x[:, ::2]``),
    partitions load the whole span (s times the bytes, in long runs) and the copy takes every s-th."""
    pmax = nl.tile_size.pmax
    nr, ssr, dsr = dims[rho]
    inside = [i for i, d in enumerate(dims) if i != rho and (d[1] < ssr or d[2] < dsr)]
    loops = [i for i in range(len(dims)) if i != rho and i not in inside]
    itemsize = max(sdt.itemsize, ddt.itemsize)
    inner = math.prod(dims[i][0] for i in inside)
    if inner * itemsize > tile_bytes or len(inside) > 3:
        return None
    g = max(1, min(tile_bytes // (inner * itemsize), -(-nr // pmax)))
    parts = min(pmax, -(-nr // g))
    # Tile dims: (size, src stride, dst stride, id); id -1 is rho's g values.
    tdims = [(g, ssr, dsr, -1)] + [(*dims[i], i) for i in inside]
    # broadcast dims (source stride 0) are not loaded: the engine copy reads them with stride 0
    load = sorted((d for d in tdims if d[1] != 0 or d[3] == -1), key=lambda d: -d[1])
    step = load[-1][1]
    superset = 1 < step <= _SUPERSET_MAX and sum((d[0] - 1) * d[1] for d in dims) + step <= room
    if superset:
        load.append((step, 1, 0, -2))  # the elements in between, loaded and skipped
        if math.prod(d[0] for d in load) * itemsize > max(tile_bytes, inner * itemsize * step):
            g = max(1, g // step)
            load[[d[3] for d in load].index(-1)] = (g, ssr, dsr, -1)
            tdims[0] = (g, ssr, dsr, -1)
            parts = min(pmax, -(-nr // g))
    split = sorted((d for d in tdims if d[2] > dsr), key=lambda d: -d[2])
    nested = sorted((d for d in tdims if d[2] <= dsr), key=lambda d: -d[2])
    if sum((d[0] - 1) * d[2] for d in nested if d[3] != -1) + 1 > dsr:
        return None  # the store's rows would interleave
    src_ap, dst_ap = _merged_ap(load, 1), _merged_ap(nested, 2)
    if len(src_ap) > 4 or len(dst_ap) > 4:
        return None
    # engine copy: iterate in store order; source strides are positions in the load layout
    lpos = dict(zip([d[3] for d in load], _row_major([d[0] for d in load])))
    store = split + nested
    pat = list(zip([d[0] for d in store], [lpos.get(d[3], 0) for d in store], _row_major([d[0] for d in store])))
    copy_pat = _merge(pat) or [(1, 1, 1)]
    numel = math.prod(d[0] for d in dims)
    tiles = math.prod(dims[i][0] for i in loops) * -(-nr // (parts * g))
    stores = tiles * math.prod(d[0] for d in split)
    load_run = src_ap[-1][0] if src_ap[-1][1] == 1 else 1
    store_run = dst_ap[-1][0] if dst_ap[-1][1] == 1 else 1
    reorder = copy_pat[-1][1] != 1 or len(copy_pat) > 1
    penalty = copy_pat[-1][1] * sdt.itemsize >= nl.profile().stride_penalty_bytes
    rows = numel / max(1, min(parts, nr))
    cost = max(_dma_ns(numel * sdt.itemsize * (step if superset else 1), load_run * sdt.itemsize)
               + _dma_ns(numel * ddt.itemsize, store_run * ddt.itemsize),
               rows / _copy_rate(sdt, ddt, not reorder, penalty), _issue_ns(tiles + stores)) + _staged_floor()
    return {"rho": rho, "g": g, "inside": inside, "loops": loops, "load": load, "split": split, "nested": nested,
            "copy": copy_pat, "cost": cost}


def _rows(dst: View, src: View, so: int, do: int, dims, plan) -> None:
    pmax = nl.tile_size.pmax
    nr, ssr, dsr = dims[plan["rho"]]
    g, load, split, nested = plan["g"], plan["load"], plan["split"], plan["nested"]
    loops = [dims[i] for i in plan["loops"]]
    per = math.prod(d[0] for d in load) // g  # loaded elements per value of rho
    per_out = math.prod(d[0] for d in split + nested) // g  # stored elements per value of rho
    n_nested = math.prod(d[0] for d in nested) // g
    split_pos = _row_major([d[0] for d in split])
    engines = _engines()
    turn = 0
    for idx in itertools.product(*(range(d[0]) for d in loops)):
        s_base = so + sum(i * d[1] for i, d in zip(idx, loops))
        d_base = do + sum(i * d[2] for i, d in zip(idx, loops))
        r0 = 0
        while r0 < nr:
            left = nr - r0
            parts, gg = (min(pmax, left // g), g) if left >= g else (1, left)
            ld, nst, spl = ([(gg if d[3] == -1 else d[0], *d[1:]) for d in t] for t in (load, nested, split))
            a = nl.ndarray((parts, gg * per), src.dtype, name="rows_in")
            _load(a, _hbm(src, s_base + r0 * ssr, [(parts, gg * ssr)] + _merged_ap(ld, 1)))
            b = nl.ndarray((parts, gg * per_out), dst.dtype, name="rows_out")
            lpos = dict(zip([d[3] for d in ld], _row_major([d[0] for d in ld])))
            store = spl + nst
            pat = _merge(list(zip([d[0] for d in store], [lpos.get(d[3], 0) for d in store],
                                  _row_major([d[0] for d in store]))))
            pat = pat or [(1, 1, 1)]
            head = pat[:-4] if len(pat) > 4 else []
            for hidx in itertools.product(*(range(d[0]) for d in head)):
                s_off = sum(i * d[1] for i, d in zip(hidx, head))
                d_off = sum(i * d[2] for i, d in zip(hidx, head))
                body = pat[len(head):]
                nisa.tensor_copy(_free(b[:, d_off:], [(d[0], d[2]) for d in body]),
                                 _free(a[:, s_off:], [(d[0], d[1]) for d in body]),
                                 engine=engines[turn % len(engines)])
            turn += 1
            chunk = gg * n_nested
            for sidx in itertools.product(*(range(d[0]) for d in split)):
                off = d_base + r0 * dsr + sum(i * d[2] for i, d in zip(sidx, split))
                _store(_hbm(dst, off, [(parts, gg * dsr)] + _merged_ap(nst, 2)),
                       b[:, sum(i * p for i, p in zip(sidx, split_pos)) * chunk:][:, :chunk])
            r0 += parts * gg


# -- S1: TensorE transposes ------------------------------------------------------------------------
def _transpose_plan(dims, sdt: DType, ddt: DType, tile_bytes: int):
    """S1's parameters and estimated cost, or None.

    j is the dst-contiguous dim, q the src-contiguous one, w the components (a short run contiguous
    on both sides), the largest other dim r is folded into the DMAs and the rest looped. Load
    partitions take rows of j: one row each in 128-row blocks, or U consecutive rows each when source
    rows are short (so a partition's load is one run), or whole (r, j) matrices when r is contiguous
    over j in the source ("merged"). Store partitions take rows of q: one each, or V consecutive rows
    each when destination rows are short.
    """
    if sdt.itemsize not in (1, 2, 4) or (sdt.itemsize == 1 and ddt is not sdt):
        return None
    w, body = 1, dims
    n, ss, ds = dims[-1]
    if ss == 1 and ds == 1:
        w, body = n, dims[:-1]
        if w * sdt.itemsize > _COMPONENT_MAX:
            return None  # runs this long move better as they are (direct DMA) than as interleaved components
    js = [i for i, d in enumerate(body) if d[2] == w]
    qs = [i for i, d in enumerate(body) if d[1] == w]
    if not js or not qs or js[0] == qs[0]:
        return None
    (jn, jss, _), (qn, _, qds) = body[js[0]], body[qs[0]]
    others = [d for i, d in enumerate(body) if i not in (js[0], qs[0])]
    pmax = nl.tile_size.pmax
    wide = sdt.itemsize == 1  # 1-byte data is transposed as uint16 (TensorE moves 2/4-byte words)
    tdt = DType.uint16 if wide else sdt
    ldt = tdt if wide else sdt
    bank = nl.profile().psum_bank_bytes // tdt.itemsize  # elements of one PSUM bank: one PSUM tile
    plans = []
    for ri in range(len(others)) if others else [None]:  # the batch dim folded into the DMAs
        (rn, rss, rds), loops = (others[ri], others[:ri] + others[ri + 1:]) if ri is not None else ((1, 0, 0), [])
        merge = rn > 1 and jn <= pmax // 2 and rss == jn * jss and jn <= bank
        plans += [_transpose_variant(merged, jn, jss, qn, qds, w, rn, rss, rds, loops, dims, sdt, ddt, tdt, ldt,
                                     bank, tile_bytes) for merged in ([False, True] if merge else [False])]
    return min(plans, key=lambda p: p["cost"])


def _transpose_variant(merged, jn, jss, qn, qds, w, rn, rss, rds, loops, dims, sdt, ddt, tdt, ldt, bank, tile_bytes):
    pmax = nl.tile_size.pmax
    isz = ldt.itemsize
    u = v = 1
    if merged:  # a partition block holds kr whole matrices: rows (r, j) are one strided dim in the source
        kr, tj, jb = pmax // jn, jn, jn
        rb = max(1, min(rn, bank // jn))
        rb = rb // kr * kr if rb >= kr else rb
        nblk = -(-rb // kr)
    else:
        kr, jb = 1, min(jn, pmax, bank)
        if qn * w * isz < _LONG_RUN and jss == qn * w and jn > pmax:
            u = max(1, min(bank // pmax, tile_bytes // (qn * w * isz), jn // pmax))
        if u > 1:
            tj, nb = pmax * u, u
        else:
            nb = max(1, min(-(-jn // jb), bank // jb))
            tj = min(jn, nb * jb)
        if u == 1 and tj >= jn and jn * w * isz < _LONG_RUN and qds == jn * w and qn > pmax:
            limit = min(bank // jn, tile_bytes // (nb * pmax * w * isz), qn // pmax)
            v = max((k for k in range(1, limit + 1) if qn % k == 0), default=1)
        rb = max(1, min(rn, bank // (tj * v)))
        nblk = rb * nb
    cg = max(1, min(w, bank // (rb * tj * v)))  # components per PSUM tile
    if u > 1:
        tq = qn
    elif v > 1:
        tq = pmax * v
    else:
        tq = max(1, tile_bytes // (nblk * w * isz))
        tq = min(qn, tq // pmax * pmax if tq >= pmax else tq)
    # cost: loads, stores (one per 128 q and batch index), TensorE, evacuation
    p = nl.profile()
    numel = math.prod(d[0] for d in dims)
    groups = math.prod(d[0] for d in loops) * -(-rn // rb) * -(-jn // tj) * -(-qn // tq)
    fold = (rb - 1) * rds + tj * w <= qds * v
    stores = groups * -(-min(tq, qn) // (pmax * v)) * (1 if fold else rb)
    rows_in = kr * jn if merged else min(jn, pmax)
    cols_out = min(qn, pmax)
    tensor_ns = numel / (rows_in * cols_out) * max(rows_in, min(p.mm_init_latency, cols_out)) / p.tensor_ghz
    evac_rate = p.vector_ghz * (p.vector_perf_copy_partial_factor if tdt in (DType.bfloat16, DType.float16) else 1)
    if p.scalar_tensor_copy:
        evac_rate += p.scalar_ghz
    penalty = 2 if (w > 1 and w * ddt.itemsize >= p.stride_penalty_bytes) or u > 1 else 1
    evac_ns = numel / cols_out * penalty / evac_rate
    load_run = (u * qn if u > 1 else min(tq, qn)) * w * sdt.itemsize
    if not merged and u == 1 and tj == jn <= jb and tq == qn and rss == qn * w:
        load_run *= rb  # the batch dim continues each row: (r, q) is one run
    store_run = (v * jn if v > 1 else min(tj, jn)) * w * ddt.itemsize
    if fold and tj == jn and rds == v * jn * w:
        store_run *= rb
    cost = max(_dma_ns(numel * isz, load_run) + _dma_ns(numel * ddt.itemsize, store_run), tensor_ns, evac_ns,
               _issue_ns(groups * (1 + (rb > 1)) + stores)) + _staged_floor()
    return {"j": (jn, jss), "q": (qn, qds), "w": w, "r": (rn, rss, rds), "loops": loops, "merged": merged,
            "kr": kr, "jb": jb, "tj": tj, "rb": rb, "cg": cg, "tq": tq, "u": u, "v": v, "wide": ldt is not sdt,
            "tdt": tdt, "ldt": ldt, "cost": cost}


def _transpose(dst: View, src: View, so: int, do: int, plan) -> None:
    """S1: load rows of j, transpose 128-blocks on TensorE into PSUM (one bank per tile, per group of
    components), evacuate to SBUF putting rows and components back in destination order, store rows of q."""
    (jn, jss), (qn, qds), w, (rn, rss, rds), loops = plan["j"], plan["q"], plan["w"], plan["r"], plan["loops"]
    merged, kr, jb, tj, rb, cg, tq = (plan[k] for k in ("merged", "kr", "jb", "tj", "rb", "cg", "tq"))
    u_, v = plan["u"], plan["v"]
    tdt, ldt = plan["tdt"], plan["ldt"]
    pmax = nl.tile_size.pmax
    if plan["wide"]:
        src, dst = src.with_dtype(DType.uint8), dst.with_dtype(DType.uint8)
    turn = 0
    engines = _psum_engines()
    for idx in itertools.product(*(range(d[0]) for d in loops)):
        s_base = so + sum(i * d[1] for i, d in zip(idx, loops))
        d_base = do + sum(i * d[2] for i, d in zip(idx, loops))
        for r0 in range(0, rn, rb):
            rr = min(rb, rn - r0)
            for j0 in range(0, jn, tj):
                rows = min(tj, jn - j0)
                u = u_ if rows % u_ == 0 else 1
                for q0 in range(0, qn, tq):
                    cols = min(tq, qn - q0)
                    s_off = s_base + r0 * rss + j0 * jss + q0 * w
                    d_off = d_base + r0 * rds + q0 * qds + j0 * w
                    # blocks: (load view [partitions, cols * w], r index, PSUM column)
                    if merged:
                        nb_ = -(-rr // kr)
                        load = nl.ndarray((kr * jn, nb_, cols * w), ldt, name="tr_in")
                        full, tail = divmod(rr, kr)
                        if full:
                            _load(load[:, :full], _hbm(src, s_off, [(kr * jn, jss), (full, kr * rss), (cols * w, 1)]))
                        if tail:
                            _load(load[:tail * jn, full:], _hbm(src, s_off + full * kr * rss,
                                                                [(tail * jn, jss), (1, 0), (cols * w, 1)]))
                        blocks = [(load[:min(kr, rr - b * kr) * jn, b], b * kr, 0) for b in range(nb_)]
                    elif u > 1:  # partition p holds rows p*u .. p*u+u-1: one contiguous run
                        parts = rows // u
                        load = nl.ndarray((parts, rr, u * cols * w), ldt, name="tr_in")
                        _load(load, _hbm(src, s_off, [(parts, u * jss), (rr, rss), (u * cols * w, 1)]))
                        blocks = [(load[:, r, k * cols * w:(k + 1) * cols * w], r, k * parts)
                                  for r in range(rr) for k in range(u)]
                    else:
                        full, tail = divmod(rows, jb)
                        nb_ = full + (1 if tail else 0)
                        load = nl.ndarray((jb, rr, nb_, cols * w), ldt, name="tr_in")
                        if full:
                            _load(load[:, :, :full], _hbm(src, s_off, [(jb, jss), (rr, rss), (full, jb * jss),
                                                                       (cols * w, 1)]))
                        if tail:
                            _load(load[:tail, :, full:], _hbm(src, s_off + full * jb * jss,
                                                              [(tail, jss), (rr, rss), (1, 0), (cols * w, 1)]))
                        blocks = [(load[:jb if b < full else tail, r, b], r, b * jb)
                                  for r in range(rr) for b in range(nb_)]
                    span = pmax * v  # q values per output chunk
                    chunks = -(-cols // span)
                    out = nl.ndarray((pmax, chunks, rr, v * rows * w), dst.dtype, name="tr_out")
                    for c in range(chunks):
                        qc = min(pmax, (cols - c * span) // v)
                        for t0 in range(0, w, cg):
                            tc = min(cg, w - t0)
                            ps = nl.ndarray((pmax, tc, rr, v, rows), tdt, buffer=nl.psum, name="tr_ps")
                            for t in range(tc):
                                for k in range(v):
                                    lo = (c * span + k) * w + t0 + t
                                    for view, r, col in blocks:
                                        pb = view.shape[0]
                                        nisa.nc_transpose(_free(ps[:qc, t, r, k, col:], [(pb, 1)]),
                                                          view[:, lo:lo + (qc - 1) * v * w + 1:v * w])
                            # PSUM [q, t, r, v, rows in block order] -> SBUF [q, r, v, j, t] (dst order)
                            jpat = [(u, rows // u, w), (rows // u, 1, u * w)] if u > 1 else [(rows, 1, w)]
                            pat = _merge([(rr, v * rows, v * rows * w), (v, rows, rows * w), *jpat,
                                          (tc, rr * v * rows, 1)]) or [(1, 1, 1)]
                            head = pat[:-4] if len(pat) > 4 else []
                            for hidx in itertools.product(*(range(d[0]) for d in head)):
                                s_o = sum(i * d[1] for i, d in zip(hidx, head))
                                d_o = sum(i * d[2] for i, d in zip(hidx, head))
                                body = pat[len(head):]
                                nisa.tensor_copy(_free(out[:qc, c, :, t0 + d_o:], [(d[0], d[2]) for d in body]),
                                                 _free(ps[:qc, :, :, :, s_o:], [(d[0], d[1]) for d in body]),
                                                 engine=engines[turn % len(engines)])
                            turn += 1
                    # HBM destinations need their partition dim outermost (validate: rows must not
                    # interleave), so each output chunk is its own store, and so is each batch index
                    # unless the batch dim nests inside a partition's rows.
                    fold = (rr - 1) * rds + v * rows * w <= v * qds
                    for c in range(chunks):
                        qc = min(pmax, (cols - c * span) // v)
                        for r in range(1 if fold else rr):
                            n_r = rr if fold else 1
                            _store(_hbm(dst, d_off + c * span * qds + r * rds,
                                        [(qc, v * qds), (n_r, rds), (v * rows * w, 1)]), out[:qc, c, r:r + n_r])


# -- helpers of the kernels ------------------------------------------------------------------------
def _dtype(dtype) -> DType | None:
    return None if dtype is None else DType.of(dtype)


def _promote(dtypes) -> DType:
    """torch.result_type of tensors: the common dtype of a cat's inputs."""
    dts = list(dict.fromkeys(dtypes))
    if len(dts) == 1:
        return dts[0]
    dts = [d for d in dts if d is not DType.bool_] or [DType.bool_]
    floats = [d for d in dts if d.is_float]
    if floats:
        if len(set(floats)) == 1:
            return floats[0]
        if any(d.is_fp8 for d in floats):
            raise KernelError(f"cat: promotion between {', '.join(map(str, floats))} is not supported (as in torch)")
        big = max(d.itemsize for d in floats)
        widest = [d for d in floats if d.itemsize == big]
        return widest[0] if len(widest) == 1 else DType.float32  # bfloat16 + float16 -> float32
    signed = [d.itemsize for d in dts if d.kind == "i"]
    unsigned = [d.itemsize for d in dts if d.kind == "u"]
    if not signed:
        return {1: DType.uint8, 2: DType.uint16, 4: DType.uint32, 8: DType.uint64}[max(unsigned)]
    size = max(max(signed), 2 * max(unsigned, default=0))
    return {1: DType.int8, 2: DType.int16, 4: DType.int32, 8: DType.int64}[min(size, 8)]


def _scratch(shape, dtype) -> View:
    """An HBM tensor the driver allocates for this run only (the language has no public form of it)."""
    b = builder()
    return b.tensor(f"scratch{len(b.handles)}", shape, dtype, "scratch")


def _flat(t: View, offset: int, n: int, dtype=None) -> View:
    return _hbm(t, offset, [(n, 1)], dtype)


# float -> int as torch's CPU casts on x86 (cvtt*: toward zero; NaN, inf and out-of-range values give the
# "integer indefinite", the range's minimum): int64 through int64, the narrower types through int32, whose
# low bits int8/int16/uint8/uint16 keep (C's conversion through int). The engines' and DMAs' own casts
# saturate and send NaN to 0 (the hardware's), so the kernels fix those values up. uint32/uint64 keep the
# saturating cast: torch's own CPU results for their out-of-range values differ between its vectorized and
# scalar loops, so there is no one behaviour to match.
_INDEFINITE = {DType.int8: 31, DType.uint8: 31, DType.int16: 31, DType.uint16: 31, DType.int32: 31, DType.int64: 63}
_E4M3FN_MAX = 448.0


def _engine_cast(src: DType, dst: DType) -> bool:
    """Whether ``src -> dst`` needs the engines to match torch (a DMA's cast alone does not)."""
    return (src.is_float and dst.kind in "iu") or _saturates_e4m3fn(src, dst)


def _saturates_e4m3fn(src: DType, dst: DType) -> bool:
    """torch saturates float8_e4m3fn casts at +-448 (inf too); the DMA (ml_dtypes) gives NaN from 464 on."""
    return dst is DType.float8_e4m3fn and src not in (DType.float8_e4m3fn, DType.bool_, DType.int8, DType.uint8)


def _trunc_tile(t: View, engines: list, turn: int, out_dtype: DType) -> View:
    """A tile of ``t`` rounded toward zero in FP32, with x86's integer indefinite (``-2**bits``) where
    ``|t| >= 2**bits`` or NaN: an FP32 tile for int64 and the unsigned 32/64-bit types, else int32."""
    frac = nl.ndarray(t.shape, nl.float32, name="cast_frac")
    nisa.tensor_scalar(frac, t, Alu.mod, 1.0, engine=engines[turn % len(engines)])
    r = nl.ndarray(t.shape, nl.float32, name="cast_trunc")
    nisa.tensor_tensor(r, t, frac, Alu.subtract, engine=nisa.vector_engine if turn % 2 else nisa.gpsimd_engine)
    bits = _INDEFINITE.get(out_dtype)
    if bits is None:
        return r
    ok = nl.ndarray(t.shape, nl.uint8, name="cast_ok")  # |t| < 2**bits (NaN compares false)
    nisa.tensor_scalar(ok, t, Alu.abs_max, 0.0, op1=Alu.less, operand1=2.0 ** bits,
                       engine=engines[(turn + 1) % len(engines)])
    res = nl.ndarray(t.shape, nl.float32 if bits == 63 else nl.int32, name="cast_out")
    nisa.select(res, ok, r, -2.0 ** bits)  # integers of the tile's range: exact casts
    return res


def _saturate_tile(t: View, engines: list, turn: int, out_dtype: DType) -> View:
    """A tile of ``t`` clamped to +-448 in FP32 (IEEE min/max keep NaN), for the store's float8_e4m3fn cast."""
    r = nl.ndarray(t.shape, nl.float32, name="cast_sat")
    nisa.tensor_scalar(r, t, Alu.min, _E4M3FN_MAX, op1=Alu.max, operand1=-_E4M3FN_MAX,
                       engine=engines[turn % len(engines)])
    return r


def _torch_cast(out: View, x: View, tile_bytes: int) -> None:
    """out = x (contiguous, same numel) cast as torch casts where the DMA's cast differs (``_engine_cast``):
    each tile is loaded, fixed up on the engines in FP32, and stored (the store DMA casts exactly)."""
    if x.dtype.itemsize == 8:  # int64 -> float8_e4m3fn: the engines take at most 32 bits; FP32 is enough
        wide, x = x, _scratch(x.shape, DType.float32)
        _move(x, wide, tile_bytes)
    tile_fn = _saturate_tile if out.dtype is DType.float8_e4m3fn else _trunc_tile
    pmax, n = nl.tile_size.pmax, math.prod(x.shape)
    f = max(1, tile_bytes // 4)
    # ScalarE copies from NC-v3 but runs tensor_scalar (the fmod, the clamp) natively only from NC-v4
    engines = [e for e in _engines() if e is not nisa.scalar_engine or nl.profile().scalar_tensor_scalar]
    turn, e0 = 0, 0
    while e0 < n:
        left = n - e0
        parts, cols = (min(pmax, left // f), f) if left >= f else (1, left)
        t = nl.ndarray((parts, cols), x.dtype, name="cast_in")
        _load(t, _hbm(x, e0, [(parts, cols), (cols, 1)]))
        _store(_hbm(out, e0, [(parts, cols), (cols, 1)]), tile_fn(t, engines, turn, out.dtype))
        turn += 1
        e0 += parts * cols


def _check_index(index: View, what: str) -> None:
    if index.dtype not in (DType.int32, DType.uint32):
        raise KernelError(f"{what}: index must be int32 (convert int64 indices before the call), got {index.dtype}")


# -- kernels ---------------------------------------------------------------------------------------
@nk.kernel
def copy(x, dtype=None):
    """``x.to(dtype)`` (a clone when dtype is None or x's): a new contiguous tensor of x's shape.

    Casts follow torch's CPU: float -> int rounds toward zero (``x - fmod(x, 1)`` on the engines, then an
    exact cast by the store DMA); NaN, +-inf and values outside int32's range (int64's for int64) give that
    range's minimum, whose low bits int8/int16/uint8/uint16 keep, as x86 casts (``_torch_cast``); int -> int
    wraps; -> bool is ``!= 0``; -> float8_e4m3fn saturates at +-448; everything else rounds to nearest even
    through FP32 (done by the DMA). Any dtype of the device, any shape (0-d and empty included).
    """
    dt = _dtype(dtype) or x.dtype
    out = nl.ndarray(x.shape, dt, buffer=nl.hbm)
    n = math.prod(x.shape)
    if n == 0:
        return out
    if _engine_cast(x.dtype, dt):
        _torch_cast(out, x, _TILE_CHOICES[0])
    else:
        _move(_flat(out, 0, n), _flat(x, 0, n))
    return out


def move(dst: View, src: View) -> None:
    """In a kernel's trace: ``dst[...] = src[...]`` for two HBM views of one shape, float values cast as a DMA
    casts them (round to nearest even through FP32): by DMAs alone, no engine work."""
    if not (dst.dtype.is_float and src.dtype.is_float):
        raise KernelError(f"move: float views only (a DMA's cast), got {src.dtype} -> {dst.dtype}")
    _move(dst, src)


def _permuted(x: View, perm, tile_bytes: int) -> View:
    xs = _row_major(x.shape)
    out = nl.ndarray(tuple(x.shape[d] for d in perm), x.dtype, buffer=nl.hbm)
    _move(out, _hbm(x, 0, [(x.shape[d], xs[d]) for d in perm]), tile_bytes)
    return out


@nk.kernel(tunables=_TUNABLES)
def permute(x, dims, tile_bytes=_TILE_CHOICES[0]):
    """``x.permute(dims).contiguous()``: out.shape[i] = x.shape[dims[i]]; any rank, any dtype.

    Permutes that keep the last dim are direct DMAs with runs of the trailing kept dims; the others
    reorder small blocks inside SBUF partitions or run 128 x 128 TensorE transposes (module doc).
    """
    nd = len(x.shape)
    perm = [_norm_dim(int(d), nd) for d in dims]
    if sorted(perm) != list(range(nd)):
        raise KernelError(f"permute: dims {list(dims)} are not a permutation of {nd} dims")
    return _permuted(x, perm, tile_bytes)


@nk.kernel(tunables=_TUNABLES)
def transpose(x, dim0=-2, dim1=-1, tile_bytes=_TILE_CHOICES[0]):
    """``torch.transpose(x, dim0, dim1).contiguous()``: the default swaps the last two dims (a batched
    matrix transpose; ``x.t()`` for 2-D). 2/4-byte dtypes use TensorE transposes, 1-byte ones are
    widened to 2 bytes for them, 8-byte ones move as word pairs; small matrices are reordered inside
    SBUF partitions instead.
    """
    nd = len(x.shape)
    if nd < 2 and (dim0, dim1) == (-2, -1):
        dim0 = dim1 = 0  # like x.t() of a 0-d or 1-d tensor: a copy
    perm = list(range(nd))
    if nd:
        a, b = _norm_dim(dim0, nd, "dim0"), _norm_dim(dim1, nd, "dim1")
        perm[a], perm[b] = perm[b], perm[a]
    return _permuted(x, perm, tile_bytes)


@nk.kernel(tunables=_TUNABLES)
def as_strided_copy(x, size, stride, storage_offset=0, tile_bytes=_TILE_CHOICES[0]):
    """``torch.as_strided(x, size, stride, storage_offset).contiguous()`` where x is the flat storage.

    ``x`` is read as its row-major storage whatever its shape; ``size``, ``stride`` (in elements,
    >= 0; 0 broadcasts) and ``storage_offset`` are constants. Every element the view names must lie
    inside the storage. The result is a new contiguous tensor of shape ``size``. Views with a
    unit-stride dim move with long runs (DMA, SBUF reordering or TensorE transposes); views with
    no unit stride at all (``x[:, ::2]``, broadcasts) are element-granular DMAs (slow on hardware).
    """
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if len(size) != len(stride):
        raise KernelError(f"as_strided: size {list(size)} and stride {list(stride)} differ in length")
    if any(s < 0 for s in size) or any(s < 0 for s in stride) or storage_offset < 0:
        raise KernelError(f"as_strided: negative size, stride or offset ({list(size)}, {list(stride)}, "
                          f"{storage_offset})")
    out = nl.ndarray(size, x.dtype, buffer=nl.hbm)
    if math.prod(size) == 0:
        return out
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= math.prod(x.shape):
        raise KernelError(f"as_strided: the view reaches element {last} of a storage of {math.prod(x.shape)}")
    _move(out, _hbm(x, storage_offset, list(zip(size, stride))), tile_bytes)
    return out


contiguous = as_strided_copy


@nk.kernel(tunables=_TUNABLES)
def strided_copy_(dst, src, size, dst_stride, src_stride, tile_bytes=_TILE_CHOICES[0]):
    """``torch.as_strided(dst, size, dst_stride).copy_(torch.as_strided(src, size, src_stride))``
    where ``dst`` and ``src`` are flat storages (1-d) starting at each view's first element; the
    values are cast to dst's dtype as ``copy`` casts. Writes dst in place (an ``inout`` argument).
    The views must not overlap each other; dst's view must not overlap itself (no zero strides).
    """
    size = tuple(int(n) for n in size)
    dst_stride, src_stride = tuple(int(s) for s in dst_stride), tuple(int(s) for s in src_stride)
    if not len(size) == len(dst_stride) == len(src_stride):
        raise KernelError(f"strided_copy_: size {list(size)}, dst_stride {list(dst_stride)} and src_stride "
                          f"{list(src_stride)} differ in length")
    if math.prod(size) == 0:
        return None
    for name, t, stride in (("dst", dst, dst_stride), ("src", src, src_stride)):
        last = sum((n - 1) * s for n, s in zip(size, stride))
        if any(s < 0 for s in stride) or last >= math.prod(t.shape):
            raise KernelError(f"strided_copy_: the {name} view (size {list(size)}, stride {list(stride)}) reaches "
                              f"element {last} of a storage of {math.prod(t.shape)}")
    dview = _hbm(dst, 0, list(zip(size, dst_stride)))
    sview = _hbm(src, 0, list(zip(size, src_stride)))
    if _engine_cast(src.dtype, dst.dtype):
        tmp = _scratch(size, src.dtype)
        _move(tmp, sview, tile_bytes)
        cast = _scratch(size, dst.dtype)
        _torch_cast(cast, tmp, tile_bytes)
        _move(dview, cast, tile_bytes)
    else:
        _move(dview, sview, tile_bytes)
    return None


# -- cat -------------------------------------------------------------------------------------------
def _cat_body(tensors, dim, dtype, tile_bytes):
    if not tensors:
        raise KernelError("cat: expected a non-empty list of tensors")
    live = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)]  # torch skips 1-d empties
    odt = _dtype(dtype) or _promote([t.dtype for t in tensors])
    if not live:
        return nl.ndarray((0,), odt, buffer=nl.hbm)
    ref = live[0].shape
    if not ref:
        raise KernelError("cat: zero-dimensional tensors cannot be concatenated")
    d = _norm_dim(dim, len(ref))
    for t in live:
        if len(t.shape) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref)) if i != d):
            raise KernelError(f"cat: sizes must match except in dim {d}: {list(ref)} vs {list(t.shape)}")
    widths = [t.shape[d] for t in live]
    shape = (*ref[:d], sum(widths), *ref[d + 1:])
    out = nl.ndarray(shape, odt, buffer=nl.hbm)
    rows, inner = math.prod(ref[:d]), math.prod(ref[d + 1:])
    total = sum(widths) * inner
    if rows * total == 0:
        return out
    itemsize = max([odt.itemsize] + [t.dtype.itemsize for t in live])
    short = any(0 < w * inner * min(odt.itemsize, t.dtype.itemsize) < _LONG_RUN for w, t in zip(widths, live))
    if (short and rows > 1 and total * itemsize <= _BLOCK_MAX and odt.itemsize <= 4
            and all(_staged_cast_ok(t.dtype, odt) for t in live)):
        _cat_assemble(out, live, widths, rows, inner, tile_bytes)
        return out
    off = 0
    for w, t in zip(widths, live):
        if w:
            _move(_hbm(out, off * inner, [(rows, total), (w * inner, 1)]), _hbm(t, 0, [(rows, w * inner),
                                                                                     (w * inner, 1)]), tile_bytes)
        off += w
    return out


def _cat_assemble(out: View, live, widths, rows: int, inner: int, tile_bytes: int) -> None:
    """Narrow inputs: each partition loads g rows of every input (contiguous), engines place them side by
    side in one tile, and one DMA stores g whole output rows."""
    pmax = nl.tile_size.pmax
    total = sum(widths) * inner
    g = max(1, min(tile_bytes // (total * out.dtype.itemsize), -(-rows // (4 * pmax))))
    engines = _engines()
    turn, r0 = 0, 0
    while r0 < rows:
        left = rows - r0
        parts, g_ = (min(pmax, left // g), g) if left >= g else (1, left)
        asm = nl.ndarray((parts, g_, total), out.dtype, name="cat_out")
        off = 0
        for w, t in zip(widths, live):
            if w:
                n = w * inner
                a = nl.ndarray((parts, g_, n), t.dtype, name="cat_in")
                _load(a, _hbm(t, r0 * n, [(parts, g_ * n), (g_, n), (n, 1)]))
                nisa.tensor_copy(asm[:, :, off:off + n], a, engine=engines[turn % len(engines)])
                turn += 1
            off += w * inner
        _store(_hbm(out, r0 * total, [(parts, g_ * total), (g_, total), (total, 1)]), asm)
        r0 += parts * g_


class _Cat:
    """``torch.cat(tensors, dim=0)``: one kernel per number of inputs (kernels take arrays one by one).

    ``cat([a, b, c], dim=1)`` runs; ``cat.kernel(3)`` is the ``nk.Kernel`` (parameters ``x0..x2``
    and keyword constants ``dim``, ``dtype``, tunable ``tile_bytes``) for tracing and tuning;
    ``cat.trace([specs], dim=1)`` traces. Inputs must match except along ``dim``; 1-d empty tensors
    are skipped (as torch does); the result dtype is torch's promotion of the inputs unless
    ``dtype`` is given. Wide pieces are direct DMAs; pieces narrower than 512 B per row are
    assembled side by side in SBUF so every store writes whole output rows.
    """

    def __init__(self):
        self._kernels: dict[int, nk.Kernel] = {}

    def kernel(self, n: int) -> nk.Kernel:
        if n < 1:
            raise KernelError("cat: expected a non-empty list of tensors")
        k = self._kernels.get(n)
        if k is None:
            names = [f"x{i}" for i in range(n)]

            def body(**kw):
                return _cat_body([kw[a] for a in names], kw["dim"], kw["dtype"], kw["tile_bytes"])

            P = inspect.Parameter
            body.__signature__ = inspect.Signature(
                [P(a, P.POSITIONAL_OR_KEYWORD) for a in names]
                + [P("dim", P.KEYWORD_ONLY, default=0), P("dtype", P.KEYWORD_ONLY, default=None),
                   P("tile_bytes", P.KEYWORD_ONLY, default=_TILE_CHOICES[0])])
            body.__name__ = body.__qualname__ = "cat"
            body.__doc__ = _Cat.__doc__
            k = self._kernels[n] = nk.kernel(body, name="cat", tunables=_TUNABLES)
        return k

    def __call__(self, tensors, dim: int = 0, **kwargs):
        return self.kernel(len(tensors))(*tensors, dim=dim, **kwargs)

    def trace(self, tensors, dim: int = 0, **kwargs):
        return self.kernel(len(tensors)).trace(*tensors, dim=dim, **kwargs)


cat = _Cat()


# -- index_select ----------------------------------------------------------------------------------
@nk.kernel
def index_select(x, dim, index):
    """``torch.index_select(x, dim, index)``: out has x's shape with ``shape[dim] = len(index)``.

    ``index`` is a 1-d (or 0-d) int32 tensor of values in ``[0, x.shape[dim])`` (others fail when the
    program runs). Each partition gathers one selected row with ``dma_gather``, 128 indices per DMA:
    the trailing dims after ``dim`` (up to 16 KiB of leading dims at a time). When those rows are
    short (< 512 B, e.g. selecting along the last dim) and leading dims exist, x is first moved to
    ``[x.shape[dim], leading, trailing]`` in scratch HBM if that is cheaper than gathering short runs,
    and the gathered ``[index, leading, trailing]`` rows are permuted into place.
    """
    nd = len(x.shape)
    _check_index(index, "index_select")
    if len(index.shape) > 1:
        raise KernelError(f"index_select: index must be 1-d, got shape {list(index.shape)}")
    d = _norm_dim(dim, nd)
    n = math.prod(index.shape)
    shape = list(x.shape) or [1]
    lead, size, inner = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
    out = nl.ndarray((*x.shape[:d], n, *x.shape[d + 1:]) if nd else index.shape, x.dtype, buffer=nl.hbm)
    if n * lead * inner == 0:
        return out
    pmax = nl.tile_size.pmax
    isz = x.dtype.itemsize
    per = max(1, _BLOCK_MAX // isz)  # elements a partition gathers at once
    long_rows = inner * isz >= _LONG_RUN
    # Gathered tiles hold [index, lead, inner]; out is [lead, index, inner]. With one lead row or long
    # rows, tiles store straight into out; otherwise into [index, lead, inner] scratch, then permuted.
    direct = lead == 1 or long_rows
    stage = out if direct else _scratch((n, lead, inner), x.dtype)
    # Short rows under several lead rows gather one short run per (index, lead row). When that costs
    # more than moving x to [size, lead, inner] first, gather whole [lead, inner] rows from that copy.
    table, row_stride, lead_stride = x, inner, size * inner
    if not direct:
        pre = _hbm(x, 0, [(size, inner), (lead, size * inner), (inner, 1)])
        shaped = [(size, lead * inner), (lead, inner), (inner, 1)]
        gathered = n * lead * inner * isz
        if _move_cost(_hbm(out, 0, shaped, x.dtype), pre) + _dma_ns(gathered, lead * inner * isz) < \
                _dma_ns(gathered, inner * isz):
            xt = _scratch((size, lead, inner), x.dtype)
            _move(xt, pre)
            table, row_stride, lead_stride = xt, lead * inner, inner
    cc = min(inner, per)
    ac = max(1, min(lead, per // cc))
    idx_flat = _flat(index, 0, n)
    for i0 in range(0, n, pmax):
        p = min(pmax, n - i0)
        idx = nl.ndarray((p, 1), index.dtype, name="sel_idx")
        _load(idx, _hbm(idx_flat, i0, [(p, 1), (1, 1)]))
        for a0 in range(0, lead, ac):
            a = min(ac, lead - a0)
            for c0 in range(0, inner, cc):
                c = min(cc, inner - c0)
                rows = nl.ndarray((p, a, c), x.dtype, name="sel_rows")
                nisa.dma_gather(rows, _hbm(table, a0 * lead_stride + c0, [(size, row_stride), (a, lead_stride),
                                                                          (c, 1)]), idx, queue=_queue(0))
                if direct:
                    for k in range(a):
                        _store(_hbm(out, (a0 + k) * n * inner + i0 * inner + c0, [(p, inner), (c, 1)]), rows[:, k])
                else:
                    _store(_hbm(stage, (i0 * lead + a0) * inner + c0, [(p, lead * inner), (a, inner), (c, 1)]),
                           rows)
    if not direct:
        _move(_hbm(out, 0, [(lead, n * inner), (n, inner), (inner, 1)]),
              _hbm(stage, 0, [(lead, inner), (n, lead * inner), (inner, 1)]))
    return out


# -- gather / scatter ------------------------------------------------------------------------------
def _element_tiles(dims, kmax: int = _ELEMENTS_K):
    """Cover an index space (merged dims ``(size, x_stride, index_stride, value_stride)``) with tiles.

    Yields ``(bases, parts, ka, after, a_strides)``: the tile spans ``parts * ka`` consecutive values of
    one dim (partition p takes ``ka`` of them) and all of the dims ``after`` it, so every stride kind is
    affine in (partition, free index): iota builds the x offsets, and index/values move as long runs.
    """
    pmax = nl.tile_size.pmax
    a = next(i for i in range(len(dims)) if len(dims) - 1 - i <= 3
             and math.prod(d[0] for d in dims[i + 1:]) <= kmax)
    after = dims[a + 1:]
    inner = math.prod(d[0] for d in after)
    na, strides = dims[a][0], dims[a][1:]
    ka = max(1, min(kmax // inner, -(-na // pmax)))
    outer = dims[:a]
    for idx in itertools.product(*(range(d[0]) for d in outer)):
        base = [sum(i * d[1 + k] for i, d in zip(idx, outer)) for k in range(len(strides))]
        a0 = 0
        while a0 < na:
            left = na - a0
            parts, kk = (min(pmax, left // ka), ka) if left >= ka else (min(pmax, left), 1)  # a tail of < ka
            yield [b + a0 * s for b, s in zip(base, strides)], parts, kk, after, strides
            a0 += parts * kk


def _tile_view(t: View, base: int, parts: int, kk: int, after, sa: int, k: int) -> View:
    """The HBM region of one element tile in tensor ``t`` (stride kind ``k`` of the merged dims)."""
    return _hbm(t, base, [(parts, kk * sa), (kk, sa)] + [(d[0], d[k]) for d in after])


def _flat_offsets(idx: View, xbase: int, parts: int, kk: int, after, sa_x: int, size: int, stride: int) -> View:
    """int32 [parts, K]: flat element offsets into x (-1 where the index is outside [0, size))."""
    K = kk * math.prod(d[0] for d in after)
    base = nl.ndarray((parts, kk, *(d[0] for d in after)), nl.int32, name="el_base")
    nisa.iota(base, [sa_x] + [d[1] for d in after], offset=xbase, channel_multiplier=kk * sa_x)
    valid = nl.ndarray((parts, K), nl.int32, name="el_valid")
    nisa.tensor_scalar(valid, idx.with_dtype(DType.uint32), nl.less, size, engine=nisa.gpsimd_engine)
    flat = nl.ndarray((parts, K), nl.int32, name="el_flat")
    nisa.tensor_scalar(flat, idx.with_dtype(DType.int32), nl.multiply, stride, engine=nisa.gpsimd_engine)
    nisa.tensor_tensor(flat, flat, base.reshape(parts, K), nl.add, engine=nisa.gpsimd_engine)
    final = nl.ndarray((parts, K), nl.int32, name="el_off")
    nisa.select(final, valid, flat, -1.0)
    return final


def _gather_dims(x_shape, index_shape, d: int, value_shape=None):
    xs = _row_major(x_shape)
    ist = _row_major(index_shape)
    vst = _row_major(value_shape) if value_shape is not None else ist
    dims = [(n, 0 if k == d else xs[k], ist[k], vst[k]) for k, n in enumerate(index_shape)]
    return _merge(dims) or [(1, 0, 0, 0)], xs[d]


def _check_gather_shapes(what: str, x, index, d: int, src=None) -> None:
    if len(index.shape) != len(x.shape):
        raise KernelError(f"{what}: index has {len(index.shape)} dims, x has {len(x.shape)}")
    for k, (ni, nx) in enumerate(zip(index.shape, x.shape)):
        if k != d and ni > nx:
            raise KernelError(f"{what}: index size {ni} > x size {nx} in dim {k}")
        if src is not None and ni > src.shape[k]:
            raise KernelError(f"{what}: index size {ni} > src size {src.shape[k]} in dim {k}")
    if math.prod(x.shape) >= 2**31:
        raise KernelError(f"{what}: x has {math.prod(x.shape)} elements; flat int32 offsets need < 2**31")


@nk.kernel
def gather(x, dim, index):
    """``torch.gather(x, dim, index)``: ``out[i][j][k] = x[i][index[i][j][k]][k]`` (dim=1), out shaped as index.

    ``index`` is int32 with x's rank, ``index.size(k) <= x.size(k)`` for k != dim, values in
    ``[0, x.size(dim))`` (others fail when the program runs). Every output element is its own
    source element, so this is an element-granular indirect DMA: offsets are computed on-chip and
    each ``dma_gather`` fetches one element per partition (128 per instruction).
    """
    _check_index(index, "gather")
    nd = len(x.shape)
    d = _norm_dim(dim, nd)
    out = nl.ndarray(index.shape, x.dtype, buffer=nl.hbm)
    if nd == 0:
        raise KernelError("gather: x must have at least one dim")
    _check_gather_shapes("gather", x, index, d)
    if math.prod(index.shape) == 0:
        return out
    dims, stride = _gather_dims(x.shape, index.shape, d)
    table = _hbm(x, 0, [(math.prod(x.shape), 1), (1, 1)])
    for (bx, bi, _), parts, kk, after, (sx, si, _) in _element_tiles(dims):
        K = kk * math.prod(a[0] for a in after)
        idx = nl.ndarray((parts, kk, *(a[0] for a in after)), index.dtype, name="el_idx")
        _load(idx, _tile_view(index, bi, parts, kk, after, si, 2))
        offs = _flat_offsets(idx.reshape(parts, K), bx, parts, kk, after, sx, x.shape[d], stride)
        vals = nl.ndarray((parts, K), x.dtype, name="el_vals")
        for k in range(K):
            nisa.dma_gather(vals[:, k:k + 1], table, offs[:, k:k + 1], queue=_queue(0))
        _store(_tile_view(out, bi, parts, kk, after, si, 2), vals.reshape(parts, kk, *(a[0] for a in after)))
    return out


def _scatter(x, dim, index, src, accumulate: bool, what: str):
    _check_index(index, what)
    nd = len(x.shape)
    if nd == 0:
        raise KernelError(f"{what}: x must have at least one dim")
    d = _norm_dim(dim, nd)
    tensor_src = isinstance(src, View)
    if tensor_src and src.dtype is not x.dtype:
        raise KernelError(f"{what}: src is {src.dtype} but x is {x.dtype} (torch requires the same dtype)")
    if tensor_src and len(src.shape) != nd:
        raise KernelError(f"{what}: src has {len(src.shape)} dims, x has {nd}")
    _check_gather_shapes(what, x, index, d, src if tensor_src else None)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
    n = math.prod(x.shape)
    if n == 0:
        return out
    if math.prod(index.shape) == 0:
        _dma(out, x, 0, 0, [(n, 1, 1)])
        return out
    dims, stride = _gather_dims(x.shape, index.shape, d, src.shape if tensor_src else None)
    half = max(1, nl.profile().dma_queues // 2)
    copied = 0
    for tile_no, ((bx, bi, bv), parts, kk, after, (sx, si, sv)) in enumerate(_element_tiles(dims, _SCATTER_K)):
        shape = (parts, kk, *(a[0] for a in after))
        K = math.prod(shape[1:])
        # The table is narrowed to the elements this tile can reach, so tiles with disjoint targets do
        # not wait for each other (an indirect DMA depends on everything its table covers); each tile's
        # chain of scatters has its own queue so chains overlap; out = x is copied piece by piece just
        # ahead of the tiles that need it, so DMA engines are not one long copy ahead of the scatters.
        hi = bx + (parts * kk - 1) * sx + sum((a[0] - 1) * a[1] for a in after) + (x.shape[d] - 1) * stride
        if hi >= copied:
            _dma(out, x, copied, copied, [(hi + 1 - copied, 1, 1)], max_bytes=_DMA_MAX // 8, queue_kind=0)
            copied = hi + 1
        table = _hbm(out, bx, [(hi - bx + 1, 1), (1, 1)])
        idx = nl.ndarray(shape, index.dtype, name="el_idx")
        _load(idx, _tile_view(index, bi, parts, kk, after, si, 2))
        offs = _flat_offsets(idx.reshape(parts, K), 0, parts, kk, after, sx, x.shape[d], stride)
        vals = nl.ndarray(shape, x.dtype, name="el_vals")
        if tensor_src:
            _load(vals, _tile_view(src, bv, parts, kk, after, sv, 3))
        else:
            nisa.memset(vals, float(src), engine=nisa.gpsimd_engine)
        flat_vals = vals.reshape(parts, K)
        for k in range(K):
            nisa.dma_scatter(table, flat_vals[:, k:k + 1], offs[:, k:k + 1], accumulate=accumulate,
                             queue=half + tile_no % half)
    if copied < n:
        _dma(out, x, copied, copied, [(n - copied, 1, 1)])
    return out


@nk.kernel
def scatter(x, dim, index, src):
    """``torch.scatter(x, dim, index, src)``: a copy of x with ``out[i][index[i][j][k]][k] = src[i][j][k]``.

    ``src`` is a tensor of x's dtype (``index.size(k) <= src.size(k)``) or a Python number (constant).
    Shape rules and index range as :func:`gather`. Where indices repeat, one of the values wins (torch
    leaves it unspecified). Element-granular: one element per partition per ``dma_scatter``, and each
    scatter waits for the previous one (their targets are unknown until run time).
    """
    return _scatter(x, dim, index, src, False, "scatter")


@nk.kernel
def scatter_add(x, dim, index, src):
    """``torch.scatter_add(x, dim, index, src)``: a copy of x with ``out[i][index[i][j][k]][k] += src[i][j][k]``.

    Repeated indices all add (floats accumulate in FP32 per 128-element scatter and round once into
    the result; integers add exactly and wrap). Shape rules as :func:`scatter`; ``src`` a tensor.
    """
    if not isinstance(src, View):
        raise KernelError("scatter_add: src must be a tensor")
    return _scatter(x, dim, index, src, True, "scatter_add")
