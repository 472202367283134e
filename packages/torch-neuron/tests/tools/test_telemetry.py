"""The telemetry a process using neuron devices publishes: what neuron-top and neuron-ls read."""

import json
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch

from neuron_hal import telemetry as files
from neuron_hal.cli import top
from torch_neuron.metrics import metrics
from torch_neuron.runtime import runtime
from torch_neuron.tools import telemetry
from torch_neuron.tools.summary import summarize

ENV = {**os.environ, "NEURON_TELEMETRY_INTERVAL": "0.05"}


def _publisher():
    publisher = runtime().telemetry
    if publisher is None:
        pytest.skip("telemetry is off in this process (NEURON_TELEMETRY)")
    return publisher


def test_record_counts_what_ran():
    publisher = _publisher()
    x = torch.randn(64, 64, device="neuron")
    (x @ x).relu()  # traced outside the measurement
    before, spent = publisher.record()["cores"].get("0", {}), metrics()["device_ns_total"]
    with torch.neuron.profiler.profile() as prof:
        y = (x @ x).relu()
    after = publisher.record()
    core = after["cores"]["0"]
    spent = metrics()["device_ns_total"] - spent
    assert core["device_ns"] - before.get("device_ns", 0.0) == pytest.approx(spent)
    assert core["programs"] - before.get("programs", 0) == len(prof.events) == 2
    (dev,) = summarize(prof.chrome_trace())  # engine busy: the per-instruction tracks add up to the same
    tensor = core["engine_busy_ns"]["tensor"] - before.get("engine_busy_ns", {}).get("tensor", 0.0)
    assert tensor == pytest.approx(dev.engine_busy_ns["tensor"], abs=2.0 * dev.engine_instructions["tensor"])
    assert core["allocated"] == torch.neuron.memory_allocated(0) and core["reserved"] == torch.neuron.memory_reserved(0)
    assert after["pid"] == os.getpid() and after["profile"] == runtime().profile.name and y.device.type == "neuron"


def test_a_failing_write_warns_once_and_never_raises(tmp_path, monkeypatch):
    publisher = _publisher()
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(blocker / "sub"))  # under a file: mkdir fails
    monkeypatch.setattr(publisher, "_warned", False)
    with pytest.warns(RuntimeWarning, match="neuron telemetry could not be written"):
        publisher.publish()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        publisher.publish()  # quiet the second time


def test_bad_interval_is_named(monkeypatch):
    monkeypatch.setenv("NEURON_TELEMETRY_INTERVAL", "-1")
    with pytest.raises(ValueError, match="NEURON_TELEMETRY_INTERVAL='-1': must be a positive"):
        telemetry.interval()


def test_off_switch_publishes_nothing(tmp_path):
    code = "import torch; torch.ones(4, device='neuron') + 1; from torch_neuron.runtime import runtime; " \
           "print(runtime().telemetry)"
    env = {**ENV, "NEURON_TELEMETRY": "0", "NEURON_TELEMETRY_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "None" and list(tmp_path.iterdir()) == []


WORKER = """
import sys, torch
x = torch.randn(128, 128, device="neuron")
y = (x @ x).relu().sum()
print("ready", flush=True)
sys.stdin.read()  # until the test closes stdin
"""


def test_neuron_top_once_shows_a_running_process(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(tmp_path))
    env = {**ENV, "NEURON_TELEMETRY_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        row, deadline = None, time.monotonic() + 120  # a bound on a hang, not on speed
        while row is None and time.monotonic() < deadline:
            rows = [r for r in top.rows(files.read_all()) if r["pid"] == proc.pid and r["programs"] >= 3]
            row = rows[0] if rows else time.sleep(0.05)
        assert row is not None, "the worker's telemetry never appeared"
        assert row["device_ns"] > 0 and 0 < row["engines"]["tensor"] <= 1 and row["allocated"] > 0
        shown = subprocess.run([sys.executable, "-m", "neuron_hal.cli.top", "--once"], env=env,
                               capture_output=True, text=True, check=True).stdout
        assert any(line.startswith(f"| {proc.pid} ") for line in shown.splitlines()), shown
        listed = json.loads(subprocess.run([sys.executable, "-m", "neuron_hal.cli.ls", "--json"], env=env,
                                           capture_output=True, text=True, check=True).stdout)
        assert proc.pid in [p["pid"] for p in listed["processes"]]
    finally:
        proc.stdin.close()
        proc.wait(timeout=120)
    assert not (tmp_path / f"{proc.pid}.json").exists()  # removed at exit


def test_a_compiled_graph_counts_as_its_one_program():
    publisher = _publisher()
    f = torch.compile(lambda a: (a @ a).relu() + 1, backend="neuron")
    x = torch.randn(64, 64, device="neuron")
    f(x)  # compiled outside the measurement
    before, spent = publisher.record()["cores"]["0"], metrics()["device_ns_total"]
    torch.testing.assert_close(f(x).cpu(), (x.cpu() @ x.cpu()).relu() + 1, rtol=1e-4, atol=1e-4)
    core = publisher.record()["cores"]["0"]
    assert core["programs"] - before["programs"] == 1
    assert core["device_ns"] - before["device_ns"] == pytest.approx(metrics()["device_ns_total"] - spent)
