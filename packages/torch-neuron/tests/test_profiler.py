"""torch.neuron.profiler: each program an op launches, labelled with its aten op, on the device timeline;
record_function ranges; CPU fallbacks as markers; one Perfetto (Chrome JSON) trace with the driver's
per-instruction engine tracks."""

import json
import warnings

import pytest
import torch

from torch_neuron.profiler import OPS_TID, RANGES_TID, profile, record_function


def _work():
    x = torch.randn(32, 32).to("neuron")
    return x, lambda: (x @ x).sum()


def test_ops_are_recorded_with_their_device_time():
    x, work = _work()
    work()  # traced and loaded outside the profile
    before = torch.neuron.metrics()["device_ns_total"]
    with profile(instructions=False) as prof:
        work()
    spent = torch.neuron.metrics()["device_ns_total"] - before
    ops = [e.op for e in prof.events]
    assert ops[0] == "mm" and "sum" in ops
    assert prof.device_ns() == pytest.approx(spent)
    for a, b in zip(prof.events, prof.events[1:]):  # one queue: back to back, in order
        assert b.start_ns == pytest.approx(a.end_ns) and a.end_ns > a.start_ns
    assert [op for op, _, _ in prof.key_averages()] == sorted({*ops}, key=lambda o: -sum(
        e.end_ns - e.start_ns for e in prof.events if e.op == o))
    assert "mm" in prof.table()


def test_trace_has_op_range_fallback_and_instruction_tracks(tmp_path):
    _, work = _work()
    with profile() as prof:
        with record_function("my range"):
            work()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.neuron.NeuronFallbackWarning)
            torch.ones(2, dtype=torch.float64, device="neuron") + 1  # float64 always takes the CPU fallback
    trace = json.loads(open(prof.export_chrome_trace(tmp_path / "t.json")).read())["traceEvents"]
    slices = [e for e in trace if e["ph"] == "X"]
    ops = [e for e in slices if e["tid"] == OPS_TID]
    ranges = [e for e in slices if e["tid"] == RANGES_TID]
    instructions = [e for e in slices if e["tid"] not in (OPS_TID, RANGES_TID)]
    assert [e["name"] for e in ops][:1] == ["mm"] and len(ops) == len(prof.events)
    assert ranges[0]["name"] == "my range"
    end = ranges[0]["ts"] + ranges[0]["dur"]
    inside = [e for e in ops if e["ts"] + e["dur"] <= end + 1e-6]  # the next op may start exactly at `end`
    assert ranges[0]["ts"] == pytest.approx(ops[0]["ts"]) and ranges[0]["dur"] == pytest.approx(
        sum(e["dur"] for e in inside))
    assert instructions and all(ops[0]["ts"] - 1e-3 <= e["ts"] for e in instructions)  # absolute device time
    assert any(e["ph"] == "i" and e["name"].startswith("CPU fallback: add") for e in trace)
    names = [(e["pid"], e["tid"], e["name"]) for e in trace if e["ph"] == "M"]
    assert len(names) == len(set(names))  # each track named once although every program's trace names it


def test_profile_leaves_the_driver_as_it_was():
    driver = torch.neuron.runtime().driver
    with profile():
        assert "execute" in vars(driver)
        with profile():  # nested: the driver is wrapped once, and unwrapped by the outermost only
            assert "execute" in vars(driver)
        assert "execute" in vars(driver)
    assert "execute" not in vars(driver)
    _, work = _work()
    with record_function("outside a profile"):  # a no-op
        work()


def test_nested_profiles_each_record_their_block():
    _, work = _work()
    with profile(instructions=False) as outer:
        work()
        with profile(instructions=False) as inner, record_function("inner step"):
            work()
        work()
    assert len(outer.events) == 3 * len(inner.events) > 0
    assert [e for e in outer.events if inner.events[0].start_ns <= e.start_ns <= inner.events[-1].start_ns] \
        == inner.events
    assert [r[0] for r in inner.ranges] == [r[0] for r in outer.ranges] == ["inner step"]



def test_ranges_and_events_on_an_idle_stream_start_at_the_devices_present():
    x, work = _work()
    work()  # the default queue is busy up to now; a new stream's own queue has no work yet
    s = torch.neuron.Stream()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with s, profile(instructions=False) as prof:
        with record_function("on s"):
            start.record()
            x.t().contiguous()
            end.record()
    programs = sum(e.end_ns - e.start_ns for e in prof.events)
    assert start.elapsed_time(end) == pytest.approx(programs / 1e6)  # the transpose, not the time before it
    (name, _, a, b), = prof.ranges
    assert b - a == pytest.approx(programs) and a == pytest.approx(prof.events[0].start_ns)


def test_autograd_profiler_use_device_privateuse1(capfd):
    """torch.autograd.profiler.profile(use_device="neuron") times each op on the device clock: an op's device
    time is that of the programs it ran (torch keeps whole microseconds), CPU times are sane, nothing logged."""
    x = torch.randn(64, 64).to("neuron")
    (x @ x).sum()  # traced and loaded outside the profiles
    capfd.readouterr()
    with profile(instructions=False) as programs:
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            (x @ x).sum()
    err = capfd.readouterr().err
    assert "PrivateUse1" not in err and "RecordFunction" not in err
    device_ns = {op: ns for op, ns, _ in programs.key_averages()}
    events = {e.key: e for e in prof.key_averages()}
    assert events["aten::mm"].device_time_total == int(device_ns["mm"] / 1e3) > 0
    assert events["aten::matmul"].device_time_total == events["aten::mm"].device_time_total  # mm is its child
    assert events["aten::sum"].device_time_total == int(device_ns["sum"] / 1e3)
    assert events["aten::mm"].self_device_time_total == events["aten::mm"].device_time_total
    assert all(e.cpu_time_total >= 0 and e.device_time_total >= 0 for e in prof.function_events)
    assert "NEURON total" in prof.key_averages().table()


def test_key_averages_table():
    x, work = _work()
    work()
    with profile(instructions=False) as prof:
        work()
        x + 1
        x + 2
    averages = prof.key_averages()
    rows = [line.split() for line in averages.table(sort_by="count").splitlines()[3:-2]]
    assert [r[0] for r in rows][:1] == ["add"] and sorted(r[0] for r in rows) == sorted({e.op for e in prof.events})
    for op, total, _, avg, calls in rows:
        spent = [e.end_ns - e.start_ns for e in prof.events if e.op == op]
        assert (total, avg, int(calls)) == (f"{sum(spent) / 1e3:.3f}us", f"{sum(spent) / len(spent) / 1e3:.3f}us",
                                           len(spent))
    assert len(averages.table(row_limit=1).splitlines()) == 6 and "sum" in prof.table(sort_by="name")
    with pytest.raises(ValueError, match="sort_by='cpu_time'"):
        averages.table(sort_by="cpu_time")
