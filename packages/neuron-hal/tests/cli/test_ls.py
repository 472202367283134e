"""neuron-ls: chips of the selected driver and profile, and the processes publishing telemetry."""

import json
import os

import pytest

from neuron_hal import PROFILES, telemetry
from neuron_hal.cli import ls


@pytest.fixture(autouse=True)
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_TELEMETRY_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_json_lists_the_profiles_chip(capsys, name):
    assert ls.main(["--json", "--driver", "null", "--profile", name]) == 0
    out = json.loads(capsys.readouterr().out)
    profile = PROFILES[name]
    (chip,) = out["devices"]
    assert chip["nc_count"] == profile.cores_per_chip == len(chip["cores"])
    assert chip["hbm_bytes"] == profile.hbm_bytes and chip["nc_version"] == profile.nc_version
    assert chip["profile"] == name and chip["driver"] == "null"
    assert out["processes"] == []


def test_table_shows_chip_and_processes(capsys):
    telemetry.write({"pid": os.getpid(), "command": "python train.py --steps 3", "profile": "trn1", "driver": "null",
                     "programs": 12, "cores": {"1": {"device_ns": 5.0, "engine_busy_ns": {}, "programs": 12,
                                                     "allocated": 3 * 2 ** 20, "reserved": 4 * 2 ** 20}}})
    assert ls.main(["--driver", "null", "--profile", "trn1"]) == 0
    out = capsys.readouterr().out
    assert "| 0           | 2            | 0-1      | v2         | 32.0 GiB | trn1    | null   |" in out
    row = next(line for line in out.splitlines() if line.startswith(f"| {os.getpid()} "))
    assert "python train.py --steps 3" in row and "3.0 MiB" in row and "4.0 MiB" in row and "| 12 " in row


def test_bad_profile_is_a_clear_error(capsys):
    assert ls.main(["--profile", "trn9"]) == 2
    assert "unknown device profile 'trn9'" in capsys.readouterr().err


def test_unknown_driver_is_a_clear_error(capsys):
    assert ls.main(["--driver", "nope"]) == 2
    assert "no neuron HAL driver 'nope'" in capsys.readouterr().err
