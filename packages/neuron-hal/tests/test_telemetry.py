"""Telemetry files: per-user directory, atomic replace, records of dead processes and unreadable files ignored."""

import json
import os
import subprocess
import sys

import pytest

from neuron_hal import telemetry


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(tmp_path / "t"))
    return tmp_path / "t"


def _record(pid, **extra):
    return {"pid": pid, "command": "python train.py", "profile": "trn2", "driver": "sim", "programs": 3,
            "cores": {"0": {"device_ns": 1000.0, "engine_busy_ns": {"tensor": 250.0, "dma q0": 1500.0},
                            "programs": 3, "allocated": 4096, "reserved": 2 ** 20}}, **extra}


def test_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(tmp_path / "x"))
    assert telemetry.directory() == tmp_path / "x"
    monkeypatch.delenv("NEURON_TELEMETRY_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert telemetry.directory() == tmp_path / "neuron-telemetry"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert telemetry.directory().name == f"neuron-telemetry-{os.getuid()}"


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True)])
def test_off_switch(monkeypatch, value, on):
    monkeypatch.setenv("NEURON_TELEMETRY", value)
    assert telemetry.enabled() is on


def test_write_read_and_remove(folder):
    telemetry.write(_record(os.getpid()))
    assert [p.name for p in folder.iterdir()] == [f"{os.getpid()}.json"]  # no temporary left behind
    (record,) = telemetry.read_all()
    assert record["pid"] == os.getpid() and record["cores"]["0"]["allocated"] == 4096
    telemetry.write(_record(os.getpid(), programs=7))  # replaced whole
    assert telemetry.read_all()[0]["programs"] == 7
    telemetry.remove(os.getpid())
    telemetry.remove(os.getpid())  # already gone: fine
    assert telemetry.read_all() == []


def test_dead_processes_and_garbage_are_ignored(folder):
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(child.stdout)  # exited and reaped
    telemetry.write(_record(dead))
    telemetry.write(_record(os.getpid()))
    (folder / "junk.json").write_text("{not json")
    (folder / "other.json").write_text(json.dumps({"pid": "x"}))
    assert [r["pid"] for r in telemetry.read_all()] == [os.getpid()]


def test_a_reused_pid_is_not_the_recorded_process(folder):
    now = telemetry.started(os.getpid())
    assert now is not None and now == telemetry.started(os.getpid())
    telemetry.write(_record(os.getpid(), started=now - 1))  # this pid, but a process that started earlier
    assert telemetry.read_all() == []
    telemetry.write(_record(os.getpid(), started=now))
    assert [r["pid"] for r in telemetry.read_all()] == [os.getpid()]


def test_core_utilization():
    util = telemetry.core_utilization(_record(1)["cores"]["0"])
    assert util == {"tensor": 0.25, "dma q0": 1.0}  # busy over device time, capped at 1
    assert telemetry.core_utilization({"device_ns": 0, "engine_busy_ns": {"tensor": 5.0}}) == {"tensor": 0.0}
