"""Executions recorded as one program (Driver.begin_graph / end_graph, neuron_hal.merge) on the simulator."""

import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN2, Act, Program, TensorArg, isa
from neuron_hal.merge import buffers, merge
from neuron_sim.driver import SimDriver
from neuron_sim.schedule import candidate_orders, reordered
from neuron_sim.timing import prepare_timing

ROWS, COLS = 128, 256


def unary(name: str, act: Act, offset: int = 0, scratch: bool = False) -> Program:
    """y = act(x) through one SBUF tile (at ``offset`` bytes per partition); optionally via a scratch tensor."""
    sb = AP.sbuf("float32", ROWS, (COLS,), offset=offset)
    args = [TensorArg("x", (ROWS, COLS), "float32"), TensorArg("y", (ROWS, COLS), "float32", "out")]
    body = [isa.DmaCopy(sb, AP.hbm(0, "float32", (ROWS, COLS))), isa.Activation(sb, sb, act)]
    if scratch:
        args.append(TensorArg("tmp", (ROWS, COLS), "float32", "scratch"))
        tmp = AP.hbm(2, "float32", (ROWS, COLS))
        body += [isa.DmaCopy(tmp, sb), isa.DmaCopy(sb, tmp)]
    body.append(isa.DmaCopy(AP.hbm(1, "float32", (ROWS, COLS)), sb))
    return Program(name, args, body)


def tensors(drv, n):
    return [drv.alloc(0, ROWS * COLS * 4) for _ in range(n)]


def read(drv, address, rows=ROWS):
    out = np.empty((rows, COLS), np.float32)
    drv.read(0, address, out)
    return out


def test_graph_computes_what_the_launches_compute_and_overlaps_independent_ones():
    drv = SimDriver(TRN2)
    x = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    exp, sq = drv.load(0, unary("exp", Act.exp, scratch=True)), drv.load(0, unary("square", Act.square))
    a, b, c, d = tensors(drv, 4)
    drv.write(0, a, x)
    separate = [drv.execute(0, exp, [a, b]).device_ns, drv.execute(0, sq, [a, c]).device_ns]
    drv.write(0, b, np.zeros_like(x))
    assert drv.begin_graph(0, 0)
    assert drv.execute(0, exp, [a, b]).in_graph
    drv.execute(0, sq, [a, c])  # independent of exp: overlaps it
    drv.execute(0, sq, [b, d])  # reads exp's output: after it
    before = drv.timeline(0, 0)
    report = drv.end_graph(0, 0)
    np.testing.assert_allclose(read(drv, b), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(read(drv, c), x * x, rtol=1e-6)
    np.testing.assert_allclose(read(drv, d), np.exp(x) ** 2, rtol=1e-6)
    assert report.start_ns == before and drv.timeline(0, 0) == report.end_ns
    assert max(separate) < report.device_ns < sum(separate) + separate[1]
    assert drv.end_graph(0, 0) is None  # closed


def test_merged_program_runs_to_the_same_bytes_as_the_sequence():
    drv = SimDriver(TRN2)
    x = np.random.default_rng(1).standard_normal((2 * ROWS, COLS)).astype(np.float32)
    progs = [unary("exp", Act.exp, scratch=True), unary("square", Act.square, offset=1024), unary("exp", Act.exp)]
    base = drv.alloc(0, 2 * ROWS * COLS * 4)
    out1, out2 = tensors(drv, 2)
    middle, upper = base + ROWS * COLS * 2, base + ROWS * COLS * 4  # views into one buffer
    bindings = [[base, out1], [middle, out2], [out2, upper]]  # the last writes part of what the second read
    drv.write(0, base, x)
    for p, args in zip(progs, bindings):
        drv.execute(0, drv.load(0, p), args)
    expected = [read(drv, a) for a in (base, out1, out2)]
    merged, addresses = merge(progs, bindings, TRN2)
    assert [a.role for a in merged.args] == ["inout"] * 3 + ["scratch"]  # base's views are one buffer
    plan = prepare_timing(merged, TRN2, exact=True)
    for program in [merged] + [reordered(merged, order) for order in candidate_orders(plan, TRN2)]:
        drv.write(0, base, x)  # the scheduler's reorderings of the merged program too
        drv.execute(0, drv.load(0, program), addresses)
        for address, want in zip((base, out1, out2), expected):
            np.testing.assert_array_equal(read(drv, address), want)


def test_kernels_too_big_to_sit_side_by_side_wrap_to_offset_zero():
    big = TRN2.sbuf_partition_bytes - COLS * 4  # the tile ends at the partition's last byte
    progs = [unary("a", Act.exp, offset=big), unary("b", Act.exp, offset=big)]
    drv = SimDriver(TRN2)
    a, b, c = tensors(drv, 3)
    merged, _ = merge(progs, [[a, b], [a, c]], TRN2)
    offsets = {ins.dst.offset for ins in merged.instructions if ins.dst.space.value == "sbuf"}
    assert offsets == {big}  # both at their own offset: no room to shift either


def test_graphs_are_per_thread_and_reuse_their_merged_program():
    drv = SimDriver(TRN2)
    prog = drv.load(0, unary("exp", Act.exp))
    a, b, c = tensors(drv, 3)
    drv.write(0, a, np.ones((ROWS, COLS), np.float32))
    ran_outside = []
    for _ in range(2):
        drv.begin_graph(0, 0)
        drv.execute(0, prog, [a, b])
        worker = threading.Thread(target=lambda: ran_outside.append(drv.execute(0, prog, [a, c])))
        worker.start()
        worker.join()
        drv.execute(0, prog, [b, c])
        drv.end_graph(0, 0)
    assert not any(r.in_graph for r in ran_outside)  # another thread's launches are not the graph's
    assert len(drv._merged_cache) == 1
    assert drv.begin_graph(0, 0) and not drv.begin_graph(0, 0)  # nested: the open graph records
    drv.end_graph(0, 0)


def test_a_cached_merged_program_keeps_its_programs_alive():
    """The merged-program cache is keyed by its programs' ids: while an entry lives its programs must, or a program
    made after one was let go of (an evicted launch) could take its id and be given the wrong merged program."""
    import gc
    import weakref

    drv = SimDriver(TRN2)
    prog = unary("exp", Act.exp)
    loaded = drv.load(0, prog)
    a, b = tensors(drv, 2)
    drv.begin_graph(0, 0)
    drv.execute(0, loaded, [a, b])
    drv.end_graph(0, 0)
    alive = weakref.ref(prog)
    drv.unload(0, loaded)
    del prog, loaded
    gc.collect()
    assert alive() is not None and len(drv._merged_cache) == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), min_size=1, max_size=12))
def test_buffers_group_overlapping_ranges_in_first_use_order(ranges):
    lo = np.array([s for s, _ in ranges], np.int64)
    hi = lo + np.array([n for _, n in ranges], np.int64)
    which, starts, ends = buffers(lo, hi)
    for i in range(lo.size):
        assert starts[which[i]] <= lo[i] and hi[i] <= ends[which[i]]
        for j in range(lo.size):
            if lo[i] < hi[j] and lo[j] < hi[i]:
                assert which[i] == which[j]
    assert list(dict.fromkeys(which.tolist())) == list(range(starts.size))  # numbered by first use
    assert np.all(starts[1:] != starts[:-1]) and (np.sort(ends)[:-1] <= np.sort(starts)[1:]).all()


def test_a_graph_schedule_is_addressed_by_its_kernels_and_buffer_sharing(tmp_path, monkeypatch):
    """The key a driver gives a merged program: the same graph recorded by another driver (process) at other
    addresses finds the stored schedule; the same kernels sharing buffers differently do not."""
    from neuron_hal import cache

    monkeypatch.setattr(cache, "_root", tmp_path)

    def run_graph(chained: bool, pad: int):
        drv = SimDriver(TRN2)
        drv.alloc(0, pad)  # the graph's tensors at other addresses than in the other drivers
        exp, sq = drv.load(0, unary("exp", Act.exp)), drv.load(0, unary("square", Act.square, offset=1024))
        a, b, c = tensors(drv, 3)
        drv.begin_graph(0, 0)
        drv.execute(0, exp, [a, b])
        drv.execute(0, sq, [b if chained else a, c])
        return drv.end_graph(0, 0).device_ns

    entries = lambda: sorted(p.name for p in (tmp_path / "schedules").iterdir())  # noqa: E731
    first = run_graph(True, 4096)
    assert len(entries()) == 1
    assert run_graph(True, 3 * 4096) == first and len(entries()) == 1
    run_graph(False, 4096)
    assert len(entries()) == 2


def test_a_kept_graph_is_timed_without_merging_it_and_traced_by_building_it(tmp_path, monkeypatch):
    """A driver (process) finding a graph's schedule and timing kept by another reports the same times without
    merging the programs; a trace of it merges them (once) and agrees."""
    import neuron_hal.merge as merging
    from neuron_hal import cache

    monkeypatch.setattr(cache, "_root", tmp_path)

    def run_graph(trace: bool):
        drv = SimDriver(TRN2)
        exp, sq = drv.load(0, unary("exp", Act.exp)), drv.load(0, unary("square", Act.square, offset=1024))
        a, b, c = tensors(drv, 3)
        drv.write(0, a, np.full((ROWS, COLS), 0.5, np.float32))
        drv.begin_graph(0, 0)
        drv.execute(0, exp, [a, b])
        drv.execute(0, sq, [b, c])
        report = drv.end_graph(0, 0, trace=trace)
        np.testing.assert_array_equal(read(drv, c), np.square(np.exp(np.float32(0.5))) * np.ones((ROWS, COLS)))
        return report

    first = run_graph(False)
    merged = []
    monkeypatch.setattr(merging, "merge", lambda *a, **k: merged.append(1) or merge(*a, **k))
    kept = run_graph(False)
    assert not merged
    assert (kept.program, kept.instructions, kept.device_ns, kept.engine_busy_ns, kept.engine_instructions,
            kept.dma_bytes) == (first.program, first.instructions, first.device_ns, first.engine_busy_ns,
                                first.engine_instructions, first.dma_bytes)
    traced = run_graph(True)
    assert merged == [1] and traced.trace and traced.device_ns == first.device_ns
