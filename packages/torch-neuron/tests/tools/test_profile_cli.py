"""neuron-profile: capture (a script under torch.neuron.profiler, or a saved Program), view, compare profiles."""

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from neuron_hal import Program, get_driver
from neuron_kernels import TensorSpec
from neuron_kernels.library.matmul import matmul
from torch_neuron.tools import profile_cli
from torch_neuron.tools.summary import ENGINES, summarize

SCRIPT = """
import sys, torch
n = int(sys.argv[2])
before = torch.neuron.metrics()["device_ns_total"]
a, b = torch.randn(n, 2 * n).to("neuron"), torch.randn(2 * n, n).to("neuron")
c = (a @ b).relu()
torch.testing.assert_close(c.cpu(), (a.cpu() @ b.cpu()).relu(), rtol=1e-4, atol=1e-4)
open(sys.argv[1], "w").write(str(torch.neuron.metrics()["device_ns_total"] - before))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "mm.py"
    path.write_text(SCRIPT)
    return path


def _slices(trace, cat):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


def _self_contained(html: str) -> bool:
    return not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)


def test_capture_script(tmp_path, script, capsys):
    out, spent = tmp_path / "cap" / "trace.json", tmp_path / "spent"
    assert profile_cli.main(["capture", "-o", str(out), str(script), str(spent), "128"]) == 0
    printed = capsys.readouterr().out
    trace = json.loads(out.read_text())
    ops = _slices(trace, "op")
    assert {e["name"] for e in ops} >= {"mm", "relu"}
    device_ns = float(spent.read_text())  # the script's own metrics: what ran inside the capture
    assert sum(e["dur"] for e in ops) * 1e3 == pytest.approx(device_ns)
    (dev,) = summarize(trace)
    assert dev.device_ns == pytest.approx(device_ns) and dev.programs == len(ops)
    assert dev.engine_busy_ns["tensor"] > 0 and all(0 < u <= 1 for u in dev.utilization().values())
    assert [e for e in dev.engine_busy_ns if e in ENGINES] == [e for e in ENGINES if e in dev.engine_busy_ns]
    assert f"device time {device_ns / 1e3:.2f} us" in printed and "tensor" in printed and "dma q0" in printed
    html = out.with_suffix(".html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "mm" in html and _self_contained(html)
    svg = ET.fromstring(html[html.index("<svg"):html.index("</svg>") + 6])  # well-formed: one slice per rect
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert len(svg.findall("rect")) == len(slices) and all(r.find("title") is not None for r in svg.iter("rect"))
    assert profile_cli.main(["view", str(out)]) == 0
    assert capsys.readouterr().out.strip() == printed.split("\ntrace:")[0].strip()


def test_script_failure_still_writes_the_capture(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.ones(4, device='neuron') * 2\nraise RuntimeError('boom')\n")
    out = tmp_path / "t.json"
    assert profile_cli.main(["capture", "-o", str(out), str(bad)]) == 1
    assert _slices(json.loads(out.read_text()), "op")


def test_a_script_with_its_own_profile_is_captured_whole(tmp_path):
    """Profiles nest: the script's own profile (the demo profiles its last step) records its block, the capture
    everything, that block included."""
    own = tmp_path / "own.py"
    own.write_text("import torch\nx = torch.ones(4, device='neuron') * 2\n"
                   "with torch.neuron.profiler.profile() as inner:\n    x + 1\n"
                   "assert [e.op for e in inner.events] == ['add'], inner.events\n")
    out = tmp_path / "t.json"
    assert profile_cli.main(["capture", "-o", str(out), str(own)]) == 0
    ops = [e["name"] for e in _slices(json.loads(out.read_text()), "op")]
    assert "add" in ops and len(ops) >= 2, ops


def test_capture_saved_program(tmp_path, capsys):
    program = matmul.trace(TensorSpec((128, 256), np.float32), TensorSpec((256, 512), np.float32))
    saved = tmp_path / "matmul.json"
    saved.write_text(program.to_json())
    out = tmp_path / "p.json"
    assert profile_cli.main(["capture", "-o", str(out), str(saved)]) == 0
    (dev,) = summarize(json.loads(out.read_text()))
    driver = get_driver()
    expected = driver.estimate(0, driver.load(0, Program.from_json(saved.read_text())))
    assert dev.device_ns == pytest.approx(expected.device_ns) and dev.programs == 1
    assert dev.ops == {"matmul": [pytest.approx(expected.device_ns), 1]}
    assert dev.engine_busy_ns["tensor"] == pytest.approx(expected.engine_busy_ns["tensor"], abs=20.0)
    assert _self_contained(out.with_suffix(".html").read_text())


@pytest.mark.parametrize("argv, message", [
    (["capture", "missing.py"], "no such script or program: missing.py"),
    (["compare", "--profiles", "trn1,trn7", "x.py"], "known profiles are trn1, trn2, trn3"),
])
def test_bad_input_is_named(argv, message, capsys):
    assert profile_cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_not_a_program_or_script(tmp_path, capsys):
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "notes.txt").write_text("")
    assert profile_cli.main(["capture", str(tmp_path / "trace.json")]) == 2
    assert "not a saved neuron_hal Program" in capsys.readouterr().err
    assert profile_cli.main(["capture", str(tmp_path / "notes.txt")]) == 2
    assert "captures a Python script (.py) or a saved program (.json)" in capsys.readouterr().err
    assert profile_cli.main(["view", str(tmp_path / "notes.txt")]) == 2


def test_end_to_end_capture_and_compare(tmp_path, script):
    env = {k: v for k, v in os.environ.items() if k != "NEURON_DEVICE_PROFILE"}
    out = tmp_path / "e2e.json"
    run = subprocess.run([sys.executable, "-m", "torch_neuron.tools.profile_cli", "capture", "-o", str(out),
                          str(script), str(tmp_path / "spent"), "128"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ops = _slices(json.loads(out.read_text()), "op")
    assert sum(e["dur"] for e in ops) * 1e3 == pytest.approx(float((tmp_path / "spent").read_text()))
    assert _self_contained(out.with_suffix(".html").read_text())

    run = subprocess.run([sys.executable, "-m", "torch_neuron.tools.profile_cli", "--compare", "trn1,trn2,trn3",
                          str(script), str(tmp_path / "spent"), "128"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    head, total, *rows = run.stdout.splitlines()
    assert head.split() == ["trn1", "us", "x", "trn1", "trn2", "us", "x", "trn1", "trn3", "us", "x", "trn1"]
    assert total.startswith("total device time") and any(r.startswith("mm ") for r in rows)
    values = [float(v) for v in total.split()[3:]]
    times, ratios = values[0::2], values[1::2]
    assert ratios[0] == 1.0 and len(set(ratios)) == 3  # the profiles differ
    assert ratios[1] == pytest.approx(times[1] / times[0], abs=1e-3)
