"""neuron-top: per-core utilization (engine busy over device time) and memory from telemetry records."""

import json
import os

import pytest

from neuron_hal import telemetry
from neuron_hal.cli import top


def _record(device_ns, tensor, vector, dma, programs):
    return {"pid": os.getpid(), "command": "python job.py", "profile": "trn2", "driver": "sim", "programs": programs,
            "cores": {"2": {"device_ns": device_ns, "programs": programs, "allocated": 1024, "reserved": 2048,
                            "engine_busy_ns": {"tensor": tensor, "vector": vector, "dma q0": dma, "dma q1": 0.0}}}}


def test_rows_are_busy_fractions_of_device_time():
    (row,) = top.rows([_record(1000.0, 500.0, 100.0, 800.0, 4)])
    assert row["core"] == 2 and row["programs"] == 4 and row["allocated"] == 1024 and row["reserved"] == 2048
    assert row["engines"] == {"tensor": 0.5, "vector": 0.1, "scalar": 0.0, "gpsimd": 0.0}
    assert row["utilization"] == pytest.approx(0.6 / 4)
    assert row["dma"] == pytest.approx(0.4)  # mean of the queues used


def test_refresh_shows_the_interval_since_the_previous_snapshot():
    before = [_record(1000.0, 500.0, 100.0, 800.0, 4)]
    now = [_record(3000.0, 700.0, 100.0, 800.0, 6)]
    (row,) = top.rows(now, top._previous(before))
    assert row["device_ns"] == 2000.0 and row["programs"] == 2
    assert row["engines"]["tensor"] == pytest.approx(0.1) and row["engines"]["vector"] == 0.0


def test_once_prints_published_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(tmp_path))
    assert top.main(["--once"]) == 0
    assert "no processes are using neuron devices" in capsys.readouterr().out
    telemetry.write(_record(1000.0, 500.0, 100.0, 800.0, 4))
    assert top.main(["--once"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"| {os.getpid()} "))
    assert "| 2    | 15.0%" in line and "| 50.0%" in line and "python job.py" in line
    assert top.main(["--once", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["engines"]["tensor"] == 0.5


def test_refreshes_redraw_the_screen(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(tmp_path))
    telemetry.write(_record(1000.0, 500.0, 100.0, 800.0, 4))
    assert top.main(["--iterations", "2", "--delay", "0.01"]) == 0
    frames = capsys.readouterr().out.split(top.CLEAR)
    assert frames[0] == "" and len(frames) == 3
    first, second = ([x for x in f.splitlines() if x.startswith(f"| {os.getpid()} ")][0] for f in frames[1:])
    assert "| 15.0%" in first and "| 0.0%" in second  # the second covers an interval in which nothing ran


def test_bad_delay(capsys):
    with pytest.raises(SystemExit):
        top.main(["--delay", "0"])
    assert "--delay 0.0: must be a positive number" in capsys.readouterr().err
