"""The dependency analysis (neuron_sim.deps): which earlier instructions each instruction waits for (RAW, WAR,
WAW) from exact read and write sets, the conservative approximations (coarse per-tensor tracking, merged records)
never losing a dependency, the same-engine producer (dependent issue), the successor CSR and the exact graph for
reordering; checked against a brute-force element-by-element reference."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN2, Act, DType, Engine, Program, Space, TensorArg, isa
from neuron_sim import deps
from neuron_sim.deps import Geometry, successors
from neuron_sim.encode import encode
from neuron_sim.plan import N_COMPUTE
from neuron_sim.timing import prepare_timing, run_timing


def preds_of(plan) -> list[set]:
    out = [set() for _ in range(plan.n)]
    for j in range(plan.n):
        for i in plan.succ_idx[plan.succ_ptr[j]:plan.succ_ptr[j + 1]]:
            out[int(i)].add(j)
    return out


def test_war_and_waw_waits():
    p = TRN2
    args = [TensorArg("x", (128, 512), "float32"), TensorArg("y", (128, 1024), "float32", "out")]
    buf = AP.sbuf("float32", 128, (512,))
    out = AP.sbuf("float32", 128, (512,), offset=8192)
    long_read = isa.Activation(out, buf, Act.exp)  # reads buf
    war = isa.DmaCopy(buf, AP.hbm(0, "float32", (128, 512)), queue=0)  # overwrites buf: waits for the read
    store_a = isa.DmaCopy(AP.hbm(1, "float32", (128, 512), row_stride=1024), out, queue=1)
    store_b = isa.DmaCopy(AP.hbm(1, "float32", (128, 512), offset=2048, row_stride=1024), buf, queue=2)
    store_c = isa.DmaCopy(AP.hbm(1, "float32", (128, 512), row_stride=1024), buf, queue=3)  # WAW on store_a
    plan = prepare_timing(Program("war", args, [long_read, war, store_a, store_b, store_c]), p)
    res = run_timing(plan, want_events=True)
    assert res.start[1] == pytest.approx(res.end[0])  # WAR
    assert res.start[2] == pytest.approx(res.end[0])  # RAW on out
    assert res.start[3] == pytest.approx(res.end[1])  # RAW on buf; interleaved columns of y: no false WAW
    assert res.start[4] == pytest.approx(max(res.end[2], res.end[1]))  # WAW on the same columns as store_a


def test_coarse_hbm_tracking_orders_against_fine_accesses(monkeypatch):
    """An HBM access too large to enumerate is tracked per tensor, conservatively."""
    monkeypatch.setattr(deps, "HBM_ACCESS_BLOCKS_MAX", 4)
    p = TRN2
    args = [TensorArg("t", (1024, 64), "float32", "inout")]
    idx = AP.sbuf("int32", 64, (1,), offset=60000)
    tile = AP.sbuf("float32", 64, (64,))
    small_store = isa.DmaCopy(AP.hbm(0, "float32", (1, 64), offset=100 * 256), AP.sbuf("float32", 1, (64,)), queue=0)
    gather = isa.DmaGather(tile, AP.hbm(0, "float32", (1024, 64)), idx, queue=1)  # coarse read of the whole table
    scatter = isa.DmaScatter(AP.hbm(0, "float32", (1024, 64)), tile, idx, queue=2)  # coarse write
    small_load = isa.DmaCopy(AP.sbuf("float32", 1, (64,), offset=30000), AP.hbm(0, "float32", (1, 64)), queue=3)
    res = run_timing(prepare_timing(Program("coarse", args, [small_store, gather, scatter, small_load]), p),
                     want_events=True)
    assert res.start[1] == pytest.approx(res.end[0])  # RAW: fine write then coarse read
    assert res.start[2] >= res.end[1]  # WAR/RAW on the tile and the table
    assert res.start[3] == pytest.approx(res.end[2])  # RAW: coarse write then fine read


def test_hbm_rows_sharing_a_block_do_not_falsely_depend():
    """Two tiles whose 128-byte rows interleave inside 512-byte blocks: exact byte ranges keep them apart."""
    p = TRN2
    args = [TensorArg("y", (64, 64), "float32", "out")]  # rows of 256 bytes
    left = AP.hbm(0, "float32", (64, 32), row_stride=64)  # columns 0..31: bytes [0, 128) of each row
    right = AP.hbm(0, "float32", (64, 32), offset=128, row_stride=64)  # columns 32..63
    src = AP.sbuf("float32", 64, (32,))
    prog = Program("rows", args, [isa.DmaCopy(left, src, queue=0), isa.DmaCopy(right, src, queue=1),
                                  isa.DmaCopy(left, src, queue=2)])
    res = run_timing(prepare_timing(prog, p), want_events=True)
    assert res.start[1] == pytest.approx(res.start[0])  # independent (two DGE units)
    assert res.start[2] == pytest.approx(res.end[0])  # WAW with the first store only


# ---- the dependency graph against a brute-force reference ----------------------------------------------
def _bytes(ap: AP) -> set:
    """Every (memory, partition, byte) an AP touches, element by element."""
    size = ap.dtype.itemsize
    offsets = [0]
    for s, stride in ap.free:
        offsets = [o + k * stride for o in offsets for k in range(s)]
    out = set()
    for p in range(ap.partitions):
        for o in offsets:
            if ap.space is Space.HBM:
                first = ap.offset + (p * ap.partition_stride + o) * size
                out.update(("hbm", ap.tensor, 0, first + b) for b in range(size))
            else:
                first = ap.offset + o * size
                out.update((ap.space.value, 0, ap.start_partition + p, first + b) for b in range(size))
    return out


def _footprints(prog) -> list[tuple[set, set]]:
    def union(aps):
        return set().union(*map(_bytes, aps)) if aps else set()

    return [(union(ins.reads()), union(ins.writes())) for ins in prog.instructions]


def _conflict(a, b) -> bool:
    (ra, wa), (rb, wb) = a, b
    return bool(wa & rb or ra & wb or wa & wb)


@st.composite
def random_program(draw, exact=True):
    """Random copies between SBUF and two HBM tensors. exact: contiguous on-chip tiles, HBM rows in separate
    512-byte blocks and at most 4 instructions per stream, where the model promises no false dependencies."""
    row = 128 if exact else 64
    args = [TensorArg("a", (8, row), "float32", "inout"), TensorArg("b", (8, row), "float32", "inout")]
    streams = ["vector", "gpsimd", 0, 1, 2]
    used = dict.fromkeys(streams, 0)
    ins = []
    for _ in range(draw(st.integers(2, 14 if exact else 40))):
        where = draw(st.sampled_from([s for s in streams if used[s] < 4 or not exact]))
        used[where] += 1
        parts = draw(st.sampled_from([1, 2, 4, 8]))
        start = draw(st.sampled_from([0, 32, 64, 96])) if isinstance(where, str) else draw(st.integers(0, 8))

        def sbuf(n, parts=parts, start=start):
            stride = 1 if exact else draw(st.sampled_from([1, 2, 3]))
            return AP(Space.SBUF, DType.float32, parts, ((n, stride),), start, 4 * draw(st.integers(0, 200)))

        if isinstance(where, str):  # an SBUF -> SBUF copy on an engine
            n = draw(st.integers(1, 40))
            ins.append(isa.TensorCopy(sbuf(n), sbuf(n), engine=Engine(where)))
            continue
        cols = draw(st.integers(1, 16))
        rows = min(parts, 8)
        hbm = AP.hbm(draw(st.integers(0, 1)), "float32", (rows, cols), row_stride=row,
                     offset=4 * (draw(st.integers(0, 8 - rows)) * row + draw(st.integers(0, row - cols))))
        tile = AP.sbuf("float32", rows, (cols,), offset=4 * draw(st.integers(0, 200)), start=start)
        ins.append(isa.DmaCopy(tile, hbm, queue=where) if draw(st.booleans()) else isa.DmaCopy(hbm, tile, queue=where))
    return Program("random", args, ins)


@settings(max_examples=120, deadline=None)
@given(prog=random_program(), exact=st.just(True))
def test_dependencies_match_brute_force(prog, exact):
    check_dependencies(prog, exact)


@settings(max_examples=60, deadline=None)
@given(prog=random_program(exact=False), coarse_limit=st.sampled_from([deps.HBM_ACCESS_BLOCKS_MAX, 2, 0]))
def test_dependencies_are_sound_when_approximate(prog, coarse_limit):
    """Strided tiles, crowded blocks (merged records) and HBM accesses tracked per tensor: still sound."""
    with mock.patch.object(deps, "HBM_ACCESS_BLOCKS_MAX", coarse_limit):
        check_dependencies(prog, exact=False)


def check_dependencies(prog, exact):
    plan = prepare_timing(prog, TRN2)
    n = plan.n
    foot = _footprints(prog)
    preds = [set() for _ in range(n)]
    for j in range(n):
        for i in plan.succ_idx[plan.succ_ptr[j]:plan.succ_ptr[j + 1]]:
            preds[int(i)].add(j)
    # Precision: every edge joins two instructions that really conflict (no false dependency).
    for i in range(n):
        for j in preds[i]:
            assert j < i and (_conflict(foot[j], foot[i]) or not exact), (j, i)
    # Soundness: every conflicting pair is ordered. ends_by[k]: what has ended when k ends (k, what ended
    # before k started, and every earlier instruction of its engine or queue: both complete in order);
    # started_after[i]: what has ended when i starts (its dependencies' ends_by, and on a compute engine
    # the previous instruction's).
    ends_by = [set() for _ in range(n)]
    last_on = {}
    for i in range(n):
        s = int(plan.stream[i])
        started_after = set()
        for k in preds[i]:
            started_after |= ends_by[k]
        if s in last_on and s < N_COMPUTE:
            started_after |= ends_by[last_on[s]]
        ends_by[i] = started_after | {i} | (ends_by[last_on[s]] if s in last_on else set())
        last_on[s] = i
        for j in range(i):
            if _conflict(foot[j], foot[i]):
                assert j in started_after, (j, i, str(prog.instructions[j]), str(prog.instructions[i]))


# ---- edges, streams and the dependent flag ---------------------------------------------------------------
def test_edges_leave_out_a_compute_engine_own_order_but_keep_a_queue():
    """A compute engine runs in program order, so an instruction needs no edge to its own engine's earlier ones;
    a DMA queue completes in order but starts DMAs while earlier ones are in flight, so its edges stay. The exact
    graph (for reordering) keeps every conflicting pair."""
    args = [TensorArg("x", (8, 16), "float32"), TensorArg("y", (8, 16), "float32", "out")]
    a, b, c = (AP.sbuf("float32", 8, (16,), offset=o) for o in (0, 512, 1024))
    prog = Program("edges", args, [
        isa.TensorCopy(b, a),  # 0
        isa.TensorCopy(c, b),  # 1: RAW on 0, same engine
        isa.DmaCopy(a, AP.hbm(0, "float32", (8, 16)), queue=2),  # 2: WAR on 0 (vector)
        isa.DmaCopy(AP.hbm(1, "float32", (8, 16)), a, queue=2),  # 3: RAW on 2, same queue
        isa.TensorCopy(b, c, engine=Engine.GPSIMD),  # 4: RAW on 1, WAW on 0, WAR on 1
    ])
    plan = prepare_timing(prog, TRN2, exact=True)
    assert preds_of(plan) == [set(), set(), {0}, {2}, {0, 1}]
    assert list(plan.pred_count) == [0, 0, 1, 1, 2]
    pred_ptr, exact = plan.exact
    full = [set(exact[pred_ptr[i]:pred_ptr[i + 1]].tolist()) for i in range(plan.n)]
    assert full == [set(), {0}, {0}, {2}, {0, 1}]


def test_producer_is_the_latest_writer_on_the_same_compute_engine():
    """Geometry.dependencies' third output: the latest instruction of an instruction's own compute engine whose
    output it reads (the dependent-issue drain; costs decide which engines drain); DMA queues have none."""
    args = [TensorArg("y", (8, 16), "float32", "out")]
    a, b, c, d = (AP.sbuf("float32", 8, (16,), offset=o) for o in (0, 512, 1024, 1536))
    acc = AP.psum("float32", 8, (16,))
    st1, mv = AP.sbuf("bfloat16", 8, (8,), offset=4096), AP.sbuf("bfloat16", 8, (16,), offset=4608)
    prog = Program("flag", args, [
        isa.TensorCopy(b, a),  # 0 vector
        isa.TensorCopy(d, c, engine=Engine.GPSIMD),  # 1 gpsimd
        isa.TensorCopy(c, b),  # 2 vector: reads 0 (its engine)
        isa.Activation(a, d, Act.exp),  # 3 scalar: reads 1 (another engine): none
        isa.TensorCopy(d, a),  # 4 vector: reads 3 (another engine): none
        isa.TensorCopy(a, b),  # 5 vector: reads 0 (its engine, 4 in between)
        isa.Matmul(acc, st1, mv),  # 6 tensor
        isa.Matmul(acc, st1, mv, accumulate=True),  # 7 tensor: reads 6's output
        isa.DmaCopy(AP.hbm(0, "float32", (8, 16)), a, queue=1),  # 8 dma q1: reads 5 (vector): none
        isa.DmaCopy(c, AP.hbm(0, "float32", (8, 16)), queue=1),  # 9 dma q1: reads 8's output: a queue, none
    ])
    enc = encode(prog, TRN2)
    _, _, producer = Geometry(prog, TRN2, enc).dependencies(enc.stream, enc.n_streams)
    assert list(producer) == [-1, -1, 0, -1, -1, 0, -1, 6, -1, -1]


def test_successors_invert_the_predecessors():
    pred_ptr = np.array([0, 0, 1, 3, 3, 5], np.int64)
    preds = np.array([0, 0, 1, 2, 0], np.int32)  # 1 <- 0; 2 <- 0, 1; 4 <- 2, 0
    succ_ptr, succ_idx, pred_count = successors(5, pred_ptr, preds)
    assert list(pred_count) == [0, 1, 2, 0, 2]
    succ = [sorted(succ_idx[succ_ptr[j]:succ_ptr[j + 1]].tolist()) for j in range(5)]
    assert succ == [[1, 2, 4], [2], [4], [], []]
