"""Instruction scheduling of merged programs (neuron_sim.schedule): every order it considers computes the same
bytes as program order, and the one it keeps is never slower."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN2, Act, Alu, Engine, Program, TensorArg, isa
from neuron_sim.driver import SimDriver
from neuron_sim.schedule import candidate_orders, reordered, schedule, stored
from neuron_sim.timing import prepare_timing, run_timing

P, W = 32, 16  # partitions and float32 elements of a tile; tiles overlap at W // 2 steps
SLOTS = 6  # tile start offsets 0, W/2, W, ... (in elements): neighbours share half their bytes


def tile(slot: int, partitions: int = P) -> AP:
    return AP.sbuf("float32", partitions, (W,), offset=slot * (W // 2) * 4)


def hbm(tensor: int, row: int) -> AP:
    return AP.hbm(tensor, "float32", (P, W), offset=row * W * 4, row_stride=W)


INSTRUCTIONS = st.one_of(
    st.tuples(st.just("load"), st.integers(0, SLOTS - 1), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("act"), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1),
              st.sampled_from([Act.exp, Act.square])),
    st.tuples(st.just("add"), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1),
              st.sampled_from([Engine.VECTOR, Engine.GPSIMD])),
    st.tuples(st.just("copy"), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1),
              st.sampled_from([Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD])),
    st.tuples(st.just("store"), st.integers(0, SLOTS - 1), st.integers(0, 3), st.integers(0, 3)),
)


def build(steps) -> Program:
    """A straight-line program over overlapping SBUF tiles and rows of an in/out HBM tensor: every kind of
    hazard (read after write, write after read, write after write) within and across engines and DMA queues.
    Tensor 0 is read-only input, tensor 1 is read and written; every tile is stored at the end."""
    body = [isa.Memset(tile(s), 0.0) for s in range(SLOTS + 1)]
    for step in steps:
        kind = step[0]
        if kind == "load":
            _, dst, row, queue = step
            body.append(isa.DmaCopy(tile(dst), hbm(row % 2, row // 2), queue=queue))
        elif kind == "act":
            _, dst, src, fn = step
            body.append(isa.Activation(tile(dst), tile(src), fn))
        elif kind == "add":
            _, dst, a, b, engine = step
            body.append(isa.TensorTensor(tile(dst), tile(a), tile(b), Alu.add, engine=engine))
        elif kind == "copy":
            _, dst, src, engine = step
            body.append(isa.TensorCopy(tile(dst), tile(src), engine=engine))
        else:
            _, src, row, queue = step
            body.append(isa.DmaCopy(hbm(1, row), tile(src), queue=queue))
    body += [isa.DmaCopy(hbm(2, s), tile(s)) for s in range(SLOTS)]
    args = [TensorArg("x", (4 * P, W), "float32"), TensorArg("y", (4 * P, W), "float32", "inout"),
            TensorArg("tiles", (SLOTS * P, W), "float32", "out")]
    return Program("hazards", args, body)


def run(drv, program, x, y):
    a, b, c = (drv.alloc(0, 4 * P * W * 4), drv.alloc(0, 4 * P * W * 4), drv.alloc(0, SLOTS * P * W * 4))
    drv.write(0, a, x)
    drv.write(0, b, y)
    drv.execute(0, drv.load(0, program), [a, b, c])
    out = [np.empty((4 * P, W), np.float32), np.empty((SLOTS * P, W), np.float32)]
    drv.read(0, b, out[0])
    drv.read(0, c, out[1])
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(INSTRUCTIONS, min_size=1, max_size=40))
def test_every_candidate_order_computes_what_program_order_computes(steps):
    program = build(steps)
    rng = np.random.default_rng(len(steps))
    x, y = (rng.uniform(-1, 1, (4 * P, W)).astype(np.float32) for _ in range(2))
    drv = SimDriver(TRN2)
    want = run(drv, program, x, y)
    plan = prepare_timing(program, TRN2, exact=True)
    for order in candidate_orders(plan, TRN2):
        assert sorted(order.tolist()) == list(range(len(program.instructions)))
        for got, expected in zip(run(drv, reordered(program, order), x, y), want):
            np.testing.assert_array_equal(got, expected)


@settings(max_examples=30, deadline=None)
@given(st.lists(INSTRUCTIONS, min_size=1, max_size=40))
def test_the_kept_schedule_is_never_slower(steps):
    program = build(steps)
    kept, plan = schedule(program, TRN2)
    assert run_timing(plan).end_ns <= run_timing(prepare_timing(program, TRN2)).end_ns
    assert sorted(map(id, kept.instructions)) == sorted(map(id, program.instructions))


def _blocked_program():
    big = 2048
    body = [isa.DmaCopy(AP.sbuf("float32", P, (big,)), AP.hbm(0, "float32", (P, big))),
            isa.TensorCopy(AP.sbuf("float32", P, (big,), offset=8 * big), AP.sbuf("float32", P, (big,)))]
    body += [isa.TensorCopy(AP.sbuf("float32", P, (big,), offset=(16 + 4 * i) * big),
                            AP.sbuf("float32", P, (big,), offset=(18 + 4 * i) * big)) for i in range(6)]
    return Program("blocked", [TensorArg("x", (P, big), "float32")], body)


def test_independent_work_is_not_held_behind_a_waiting_instruction():
    """A vector copy waiting for a slow load no longer holds back independent vector work queued after it."""
    program = _blocked_program()
    body = program.instructions
    kept, plan = schedule(program, TRN2)
    launch_plan = prepare_timing(program, TRN2)
    launch_order = run_timing(launch_plan, want_events=True)
    load = launch_order.end[0] - launch_order.start[0]
    copies = launch_order.engine_busy_ns["vector"]  # the seven copies, back to back on VectorE
    launch = TRN2.launch_pre_ns + TRN2.launch_post_ns
    assert load < copies - launch_plan.dur_ns[1]  # the six independent copies are long enough to hide the load
    assert launch_order.end_ns == pytest.approx(launch + load + copies, rel=1e-12)  # every copy behind the load
    assert run_timing(plan).end_ns == pytest.approx(launch + copies, rel=1e-12)  # the load hidden entirely
    assert kept.instructions.index(body[1]) > kept.instructions.index(body[2])  # the waiting copy moved back


def test_programs_beyond_the_exact_pass_limit_keep_their_order(monkeypatch):
    import neuron_sim.schedule as sched

    program = build([("act", 1, 0, Act.exp), ("copy", 0, 1, Engine.VECTOR)])
    monkeypatch.setattr(sched, "EXACT_STATE_MAX", len(program.instructions) * len(program.args) - 1)
    kept, plan = schedule(program, TRN2)
    assert kept is program and plan.exact is None


def test_a_stored_schedule_is_reused_by_content_address(tmp_path, monkeypatch):
    """Another process scheduling the same merged program (same key) loads the chosen order instead of searching;
    a torn or foreign entry is searched again and replaced; without a cache directory nothing is written."""
    import neuron_sim.schedule as sched
    from neuron_hal import cache

    program = _blocked_program()
    monkeypatch.setattr(cache, "_root", None)
    schedule(program, TRN2, "k")
    assert not any(tmp_path.iterdir())
    monkeypatch.setattr(cache, "_root", tmp_path)
    searched, plan = schedule(program, TRN2, "k")
    (entry,) = (tmp_path / "schedules").iterdir()
    assert searched.instructions != program.instructions  # the search moved the waiting copy: a real order stored

    monkeypatch.setattr(sched, "candidate_orders", lambda *a: (_ for _ in ()).throw(AssertionError("searched")))
    loaded, loaded_plan = schedule(program, TRN2, "k")
    assert loaded.instructions == searched.instructions
    assert run_timing(loaded_plan).end_ns == run_timing(plan).end_ns
    kept, timed = stored("k", TRN2, len(program.instructions)).timing(5.0), run_timing(plan, 5.0)
    assert (kept.start_ns, kept.end_ns, kept.engine_busy_ns, kept.engine_instructions, kept.dma_bytes) == \
        (timed.start_ns, timed.end_ns, timed.engine_busy_ns, timed.engine_instructions, timed.dma_bytes)
    assert stored("k", TRN2, len(program.instructions) + 1) is None  # not this program's order: a miss
    with np.testing.assert_raises(AssertionError):
        schedule(program, TRN2, "another key")

    monkeypatch.undo()
    monkeypatch.setattr(cache, "_root", tmp_path)
    for torn in (entry.read_bytes()[:20], b"", np.save.__doc__.encode()[:64]):
        entry.write_bytes(torn)
        assert schedule(program, TRN2, "k")[0].instructions == searched.instructions
        assert np.array_equal(np.sort(stored("k", TRN2, len(program.instructions)).order),
                              np.arange(len(program.instructions)))
