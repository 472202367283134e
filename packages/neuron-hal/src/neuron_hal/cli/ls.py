"""``neuron-ls``: the neuron devices this machine's driver finds, and the processes using them.

Shaped like AWS's neuron-ls: one row per chip (its NeuronCores, HBM, profile and driver) with, beside it, one row
per process using its cores, from the telemetry processes publish (:mod:`neuron_hal.telemetry`): pid, command, the
cores it used, device memory reserved and programs run. ``--json-output`` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import telemetry
from ..registry import driver_names, get_driver
from .table import box, human_bytes


def devices(driver: str | None = None, profile: str | None = None) -> list[dict]:
    """One entry per chip of the selected driver and profile."""
    d = get_driver(driver, profile)
    infos = d.devices()
    per_chip = d.profile.cores_per_chip
    chips = []
    for start in range(0, len(infos), per_chip):
        cores = infos[start:start + per_chip]
        chips.append({"chip": start // per_chip, "cores": [c.index for c in cores], "nc_count": len(cores),
                      "nc_version": d.profile.nc_version, "hbm_bytes": cores[0].hbm_bytes,
                      "profile": d.profile.name, "driver": d.name})
    return chips


def processes(all_procs: bool = False) -> list[dict]:
    """Live processes' telemetry, reduced to what neuron-ls shows: those that used a core (ran a program or hold
    device memory), or every publishing process with ``all_procs``."""
    rows = []
    for r in telemetry.read_all():
        cores = r.get("cores", {})
        used = sorted(int(i) for i, c in cores.items() if c.get("programs") or c.get("reserved"))
        if not used and not all_procs:
            continue
        rows.append({"pid": r["pid"], "command": r.get("command", ""), "profile": r.get("profile"),
                     "driver": r.get("driver"), "cores": used,
                     "allocated": sum(c.get("allocated", 0) for c in cores.values()),
                     "reserved": sum(c.get("reserved", 0) for c in cores.values()),
                     "programs": r.get("programs", 0)})
    return rows


HEADERS = ["NEURON\nCHIP", "NEURON\nCORES", "CORE\nIDS", "NC\nVERSION", "NEURON\nMEMORY", "PROFILE", "DRIVER",
           "PID", "COMMAND", "PROCESS\nCORES", "MEMORY\nRESERVED", "PROGRAMS"]


def render(chips: list[dict], procs: list[dict]) -> str:
    """One table as AWS's: each chip's row, with the processes using its cores beside it (one row each)."""
    rows = []
    for c in chips:
        chip = [c["chip"], c["nc_count"], f"{c['cores'][0]}-{c['cores'][-1]}", f"v{c['nc_version']}",
                human_bytes(c["hbm_bytes"]), c["profile"], c["driver"]]
        mine = [p for p in procs if set(p["cores"]) & set(c["cores"]) or (not p["cores"] and c["chip"] == 0)]
        for k, p in enumerate(mine or [None]):
            proc = ["", "", "", "", ""] if p is None else [
                p["pid"], _short(p["command"]), ",".join(map(str, p["cores"])) or "-", human_bytes(p["reserved"]),
                p["programs"]]
            rows.append((chip if k == 0 else [""] * len(chip)) + proc)
    return box(HEADERS, rows)


def _short(command: str, width: int = 40) -> str:
    return command if len(command) <= width else command[:width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-ls", description=__doc__.splitlines()[0])
    parser.add_argument("--json-output", "--json", "-j", dest="json", action="store_true", help="print JSON")
    parser.add_argument("--show-all-procs", "-a", action="store_true",
                        help="also processes that publish telemetry but have used no core yet")
    parser.add_argument("--driver", help=f"driver to ask (installed: {', '.join(driver_names())}; "
                        "default $NEURON_HAL_DRIVER, else the best available)")
    parser.add_argument("--profile", help="device profile (trn1, trn2, trn3; default $NEURON_DEVICE_PROFILE or trn2)")
    args = parser.parse_args(argv)
    try:
        chips = devices(args.driver, args.profile)
    except (ValueError, LookupError) as e:
        print(f"neuron-ls: {e}", file=sys.stderr)
        return 2
    procs = processes(args.show_all_procs)
    print(json.dumps({"devices": chips, "processes": procs}, indent=2) if args.json else render(chips, procs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
