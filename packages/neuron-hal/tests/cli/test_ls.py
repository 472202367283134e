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


def _publish(pid, cores):
    telemetry.write({"pid": pid, "command": "python train.py --steps 3", "profile": "trn1", "driver": "null",
                     "programs": 12, "cores": cores})


def test_table_shows_chip_and_processes(capsys):
    _publish(os.getpid(), {"0": {"device_ns": 0.0, "engine_busy_ns": {}, "programs": 0, "allocated": 0,
                                 "reserved": 0},
                           "1": {"device_ns": 5.0, "engine_busy_ns": {}, "programs": 12, "allocated": 3 * 2 ** 20,
                                 "reserved": 4 * 2 ** 20}})
    assert ls.main(["--driver", "null", "--profile", "trn1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split("|")[1:3] == [" NEURON ", " NEURON "] and out[2].split("|")[1].strip() == "CHIP"
    row = [c.strip() for c in out[4].split("|")[1:-1]]
    assert row == ["0", "2", "0-1", "v2", "32.0 GiB", "trn1", "null", str(os.getpid()), "python train.py --steps 3",
                   "1", "4.0 MiB", "12"]  # core 0 was opened but not used


def test_idle_processes_only_with_show_all_procs(capsys):
    _publish(os.getpid(), {})  # a runtime that has not used a core
    assert ls.main(["--json", "--driver", "null"]) == 0
    assert json.loads(capsys.readouterr().out)["processes"] == []
    assert ls.main(["-a", "--driver", "null"]) == 0
    row = [c.strip() for c in capsys.readouterr().out.splitlines()[4].split("|")[1:-1]]
    assert row[7:10] == [str(os.getpid()), "python train.py --steps 3", "-"]


def test_bad_profile_is_a_clear_error(capsys):
    assert ls.main(["--profile", "trn9"]) == 2
    assert "unknown device profile 'trn9'" in capsys.readouterr().err


def test_unknown_driver_is_a_clear_error(capsys):
    assert ls.main(["--driver", "nope"]) == 2
    assert "no neuron HAL driver 'nope'" in capsys.readouterr().err
