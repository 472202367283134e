"""Chrome / Perfetto traces of timed programs: valid JSON, one slice per instruction on its engine's or DMA
queue's track, timestamps consistent with the timing result, track names present, no overlaps per track."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import AP, TRN2, TRN3, Act, Alu, Engine, Program, TensorArg, isa
from neuron_sim.plan import ENGINE_NAMES, N_COMPUTE
from neuron_sim.timing import prepare_timing, run_timing
from neuron_sim.trace import chrome_trace


def mixed_program(repeat: int = 3) -> Program:
    args = [TensorArg("x", (128, 2048), "bfloat16"), TensorArg("y", (128, 2048), "float32", "out")]
    ins = []
    for k in range(repeat):
        xs = AP.sbuf("bfloat16", 128, (512,), offset=(k % 2) * 1024)
        w = AP.sbuf("bfloat16", 128, (128,), offset=4096)
        acc = AP.psum("float32", 128, (512,), offset=(k % 2) * 2048)
        o = AP.sbuf("float32", 128, (512,), offset=8192 + (k % 2) * 2048)
        ins += [
            isa.DmaCopy(xs, AP.hbm(0, "bfloat16", (128, 512), offset=k * 1024, row_stride=2048), queue=k % 2),
            isa.Memset(w, 0.0, engine=Engine.GPSIMD),
            isa.Matmul(acc, w, xs),
            isa.Activation(o, acc, Act.gelu),
            isa.TensorTensor(o, o, o, Alu.multiply),
            isa.Iota(AP.sbuf("int32", 128, (64,), offset=20000), (1,)),
            isa.DmaCopy(AP.hbm(1, "float32", (128, 512), offset=k * 2048, row_stride=2048), o, queue=5),
        ]
    return Program("mixed", args, ins)


def expected_track(ins) -> int:
    if ins.engine is Engine.SYNC:
        return N_COMPUTE + ins.queue
    return ENGINE_NAMES.index(ins.engine.value)


def traced(prog, profile=TRN2, device=0, start_ns=0.0):
    plan = prepare_timing(prog, profile)
    res = run_timing(plan, start_ns=start_ns, want_events=True)
    return plan, res, chrome_trace(prog, plan, res, device)


def test_trace_is_valid_json_with_every_instruction_on_its_track():
    prog = mixed_program()
    plan, res, trace = traced(prog, device=3, start_ns=1000.0)
    trace = json.loads(json.dumps(trace))  # plain JSON types only
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(prog.instructions)
    by_index = {e["args"]["index"]: e for e in slices}
    assert sorted(by_index) == list(range(len(prog.instructions)))
    for i, ins in enumerate(prog.instructions):
        e = by_index[i]
        assert e["name"] == ins.opcode
        assert e["pid"] == 3
        assert e["tid"] == expected_track(ins)
        assert e["args"]["line"] == prog.listing_line(i)
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
        # Timestamps in microseconds; ends match the timing result to the nanosecond.
        assert (e["ts"] + e["dur"]) * 1000 == pytest.approx(res.end[i], abs=1.0)
        if ins.engine is Engine.SYNC:
            assert e["ts"] * 1000 >= res.start[i] - 1.0  # a queue's slice starts at its issue or later
            assert e["args"]["bytes"] == ins.dst.num_elements * max(ins.dst.dtype.itemsize, ins.src.dtype.itemsize)
        else:
            assert e["ts"] * 1000 == pytest.approx(res.start[i], abs=1.0)
        assert e["ts"] * 1000 >= 1000.0 + TRN2.launch_pre_ns - 1e-6  # after the given device time and the start-up
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(names) == {e["tid"] for e in slices}
    assert names[0] == "tensor" and names[1] == "vector" and names[2] == "scalar" and names[3] == "gpsimd"
    assert names[N_COMPUTE + 0] == "dma q0" and names[N_COMPUTE + 5] == "dma q5"
    assert any(e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == 3 for e in events)


def assert_tracks_do_not_overlap(trace):
    tracks = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault(e["tid"], []).append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for spans in tracks.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start


def test_slices_on_a_track_never_overlap():
    _, _, trace = traced(mixed_program(8), TRN3)
    assert_tracks_do_not_overlap(trace)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), queues=st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_dma_queues_in_flight_trace_cleanly(n, queues):
    """Several DMAs in flight on one queue: slices are clipped to the previous completion, never overlap."""
    args = [TensorArg("x", (128, 4096), "float32")]
    ins = [isa.DmaCopy(AP.sbuf("float32", 128, (256,), offset=1024 * (k % 16)),
                       AP.hbm(0, "float32", (128, 256), offset=1024 * k, row_stride=4096),
                       queue=queues[k % len(queues)]) for k in range(n)]
    prog = Program("dmas", args, ins)
    plan, res, trace = traced(prog)
    assert_tracks_do_not_overlap(trace)
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == n


def test_trace_needs_events():
    prog = mixed_program(1)
    plan = prepare_timing(prog, TRN2)
    with pytest.raises(ValueError, match="want_events"):
        chrome_trace(prog, plan, run_timing(plan))
    assert chrome_trace(prog, plan, run_timing(plan, want_events=True))["traceEvents"]


def test_empty_program():
    prog = Program("empty", [], [])
    plan = prepare_timing(prog, TRN2)
    res = run_timing(plan, start_ns=5.0, want_events=True)
    assert res.end_ns == 5.0 + TRN2.launch_pre_ns + TRN2.launch_post_ns and res.dma_bytes == 0  # the launch alone
    trace = chrome_trace(prog, plan, res)
    assert [e for e in trace["traceEvents"] if e["ph"] == "X"] == []
