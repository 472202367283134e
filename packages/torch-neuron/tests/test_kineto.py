"""torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1]): each neuron program execution is a
device kernel event (csrc/Kineto.cpp, fed by torch_neuron.kineto) with its simulated device duration, named by its
program and user op, linked to the aten op that launched it; judged against torch.neuron.metrics() and
torch.neuron.profiler, which time the same programs."""

import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from torch_neuron.kineto import _observe
from torch_neuron.metrics import report_observers

DEVICE = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
NS = 1e-3  # us: the mapping onto the profiler's clock rounds each end to a whole ns


def _kernels(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _name(op: str, program: str) -> str:
    return op if program == op else f"{program} ({op})"


class _Reports:
    """The (user op, ExecutionReport) of each program run inside the block, as torch.neuron's telemetry sees them."""

    def __enter__(self):
        self.seen = []
        report_observers.append(self._see)
        return self

    def _see(self, op, report):
        self.seen.append((op, report))

    def __exit__(self, *exc):
        report_observers.remove(self._see)


def _work(device="neuron"):
    x = torch.randn(32, 32).to(device)
    (x @ x).sum()  # traced and loaded outside the profile
    return x


def _spent(before: dict, after: dict) -> dict:
    return {op: ns - before["device_ns"].get(op, 0.0) for op, ns in after["device_ns"].items()
            if ns != before["device_ns"].get(op, 0.0)}


def test_kineto():
    x = _work()
    before = torch.neuron.metrics()
    with profile(activities=DEVICE) as prof, _Reports() as reports:
        (x @ x).sum()
    spent = _spent(before, torch.neuron.metrics())
    kernels = _kernels(prof)
    assert [op for op, _ in reports.seen] == ["mm", "sum"] and set(spent) == {"mm", "sum"}
    assert [k.name for k in kernels] == [_name(op, r.program) for op, r in reports.seen]
    for k, (op, r) in zip(kernels, reports.seen):
        assert k.time_range.elapsed_us() == pytest.approx(spent[op] / 1e3, abs=NS) and k.device_index == 0
        assert k.time_range.elapsed_us() == pytest.approx(r.device_ns / 1e3, abs=NS)
    a, b = kernels
    assert b.time_range.start == pytest.approx(a.time_range.end, abs=NS)  # one queue: back to back on the device
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].self_device_time_total == pytest.approx(spent["mm"] / 1e3, abs=NS)
    assert averages["aten::matmul"].device_time_total == averages["aten::mm"].device_time_total  # mm is its child
    assert averages["aten::matmul"].self_device_time_total == 0
    assert averages["aten::sum"].device_time_total == pytest.approx(spent["sum"] / 1e3, abs=NS)
    assert averages[a.name].self_device_time_total == pytest.approx(spent["mm"] / 1e3, abs=NS)
    assert sum(e.self_device_time_total for e in prof.key_averages()) == pytest.approx(
        2 * sum(spent.values()) / 1e3, abs=4 * NS)  # each kernel's row and its launching op's
    assert "NEURON total" in prof.key_averages().table()


def test_profiler_correlation_id():
    x = _work()
    with profile(activities=DEVICE) as prof:
        (x @ x).sum()
    ops = {e.id: e for e in prof.events() if e.device_type == DeviceType.CPU}
    kernels = _kernels(prof)
    assert [ops[k.linked_correlation_id].name for k in kernels] == ["aten::mm", "aten::sum"]
    for k in kernels:
        (launched,) = ops[k.linked_correlation_id].kernels
        assert launched.name == k.name and launched.duration == pytest.approx(k.time_range.elapsed_us())


def test_kineto_agrees_with_the_neuron_profiler():
    x = _work()
    with torch.neuron.profiler.profile(instructions=False) as mine, profile(activities=DEVICE) as prof:
        (x @ x).sum()
        x.t().contiguous()
    kernels = _kernels(prof)
    assert [k.name for k in kernels] == [_name(e.op, e.program) for e in mine.events]
    assert [k.time_range.elapsed_us() for k in kernels] == pytest.approx(
        [(e.end_ns - e.start_ns) / 1e3 for e in mine.events], abs=NS)
    for k, e in zip(kernels, mine.events):  # one offset maps the device timeline onto the profiler's clock
        assert k.time_range.start - kernels[0].time_range.start == pytest.approx(
            (e.start_ns - mine.events[0].start_ns) / 1e3, abs=NS)


def test_export_chrome_trace(tmp_path):
    x = _work()
    with profile(activities=DEVICE) as prof:
        (x @ x).sum()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    kernels = [e for e in trace if e.get("cat") == "kernel"]
    ops = {e["name"]: e for e in trace if e.get("cat") == "cpu_op"}
    assert [e["name"] for e in kernels] == [k.name for k in _kernels(prof)]
    assert {(e["pid"], e["tid"]) for e in kernels} == {(0, 0)}  # device 0, queue 0
    assert [e["dur"] for e in kernels] == pytest.approx([k.time_range.elapsed_us() for k in _kernels(prof)], abs=NS)
    assert kernels[0]["args"]["External id"] == ops["aten::mm"]["args"]["External id"]
    assert kernels[0]["args"]["op"] == "mm" and kernels[1]["args"]["op"] == "sum"
    named = {(e["name"], e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] in (
        "process_name", "thread_name")}
    assert named[("process_name", 0, 0)] == "NeuronCore 0" and named[("thread_name", 0, 0)] == "queue 0"


def test_kineto_multidevice():
    if torch.neuron.device_count() < 2:
        pytest.skip("one neuron device")
    x, y = _work("neuron:0"), _work("neuron:1")
    before = torch.neuron.metrics()
    with profile(activities=DEVICE) as prof, _Reports() as reports:
        (y @ y).sum()
        x.relu()
    spent = _spent(before, torch.neuron.metrics())
    kernels = _kernels(prof)
    assert sorted((k.name, k.device_index) for k in kernels) == sorted(
        (_name(op, r.program), r.device) for op, r in reports.seen)
    assert {r.device for _, r in reports.seen} == {0, 1}
    assert sum(k.time_range.elapsed_us() for k in kernels) == pytest.approx(sum(spent.values()) / 1e3, abs=3 * NS)


def test_kineto_cpu_only_records_no_device_events():
    x = _work()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert _observe not in report_observers  # no session: programs are not observed at all
        (x @ x).sum()
    assert not _kernels(prof) and "aten::mm" in {e.name for e in prof.events()}
    assert "NEURON" not in prof.key_averages().table()


def test_kineto_observes_only_while_recording():
    x = _work()
    with profile(activities=DEVICE):
        assert report_observers.count(_observe) == 1
        x + 1
    assert _observe not in report_observers
    x + 1  # after the profile: nothing recorded anywhere
    assert torch.neuron._C._kineto_record(0, 0, 0.0, 1.0, "add", "add") is False


def test_kineto_without_device_ops(tmp_path):
    with profile(activities=DEVICE) as prof:
        torch.ones(3) + 1
    assert not _kernels(prof) and "aten::add" in {e.name for e in prof.events()}
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert trace and not [e for e in trace if e.get("cat") == "kernel"]


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_kineto_profiler_api():
    """A schedule's active steps each record their own kernels, across repeated cycles."""
    x = _work()
    x + 1
    x * 2
    cycles = []
    with profile(activities=DEVICE, schedule=schedule(wait=1, warmup=1, active=1, repeat=2),
                 on_trace_ready=lambda p: cycles.append([k.name for k in _kernels(p)])) as prof:
        for step in range(6):
            (x + 1) if step % 2 else (x * 2)
            prof.step()
    assert cycles == [["mul"], ["add"]]  # steps 2 and 5 (wait, warmup, active; twice)


def test_kineto_compiled_graph():
    x = _work()
    f = torch.compile(lambda a: (a * 2 + 1).relu().sum())
    f(x)  # compiled outside the profile
    before = torch.neuron.metrics()
    with profile(activities=DEVICE) as prof:
        f(x)
    spent = _spent(before, torch.neuron.metrics())
    (kernel,) = _kernels(prof)  # the graph's call is one program
    (op,) = spent
    assert op in kernel.name and kernel.time_range.elapsed_us() == pytest.approx(spent[op] / 1e3, abs=NS)


def test_kineto_backward():
    """Backward runs on autograd's device thread: its kernels are linked to the backward ops there."""
    w = torch.randn(16, 16).to("neuron").requires_grad_()
    x = torch.randn(8, 16).to("neuron")
    (x @ w).relu().sum().backward()  # traced and loaded outside the profile
    w.grad = None
    before = torch.neuron.metrics()
    with profile(activities=DEVICE) as prof:
        (x @ w).relu().sum().backward()
    spent = _spent(before, torch.neuron.metrics())
    kernels = _kernels(prof)
    ops = {e.id: e for e in prof.events() if e.device_type == DeviceType.CPU}
    assert sum(k.time_range.elapsed_us() for k in kernels) == pytest.approx(sum(spent.values()) / 1e3,
                                                                             abs=len(kernels) * NS)
    linked = [ops[k.linked_correlation_id] for k in kernels if k.linked_correlation_id in ops]
    assert len(linked) == len(kernels)
    assert len({e.thread for e in linked}) == 2  # the caller's and autograd's device thread
    assert any(e.name == "aten::threshold_backward" for e in linked)


def test_kineto_nested_profile_records_its_block():
    """torch runs one kineto profile at a time (the inner one ends the outer, as for CPU-only profiles); the
    inner one gets its own block's kernels."""
    x = _work()
    x * 2
    with profile(activities=DEVICE):
        x + 1
        with profile(activities=DEVICE) as inner:
            x * 2
    assert [k.name for k in _kernels(inner)] == ["mul"]
    with profile(activities=DEVICE) as after:  # and the next profile works as usual
        x + 1
    assert [k.name for k in _kernels(after)] == ["add"]
