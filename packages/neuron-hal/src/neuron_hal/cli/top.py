"""``neuron-top``: live NeuronCore utilization and device memory of the processes using neuron devices.

Reads the telemetry each process publishes (:mod:`neuron_hal.telemetry`). A core's utilization over a refresh is
its engines' busy time over its device time in that interval (each engine's busy fraction, and their mean); the
first snapshot, and ``--once``, give the totals since each process started. ``--once`` prints one snapshot
(for scripts); otherwise the screen is redrawn every ``--delay`` seconds until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .. import telemetry
from ..isa import Engine
from .table import box, human_bytes

ENGINES = tuple(e.value for e in Engine if e is not Engine.SYNC)  # the compute engines, in ISA order
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: each refresh redraws the whole table


def _delta(now: dict, before: dict | None) -> dict:
    """A core's counters since ``before`` (its previous record), or all of them."""
    if not before or before.get("device_ns", 0) > now.get("device_ns", 0):
        return now
    busy = {e: ns - before.get("engine_busy_ns", {}).get(e, 0.0) for e, ns in now.get("engine_busy_ns", {}).items()}
    return {**now, "device_ns": now["device_ns"] - before["device_ns"], "engine_busy_ns": busy,
            "programs": now.get("programs", 0) - before.get("programs", 0)}


def rows(records: list[dict], previous: dict | None = None) -> list[dict]:
    """One row per (process, core): utilization per engine over the interval since ``previous``
    ({(pid, core): core record}), device time, programs and memory."""
    out = []
    for r in records:
        for core, c in sorted(r.get("cores", {}).items(), key=lambda kv: int(kv[0])):
            d = _delta(c, (previous or {}).get((r["pid"], core)))
            util = telemetry.core_utilization(d)
            engines = {e: util.get(e, 0.0) for e in ENGINES}
            out.append({"pid": r["pid"], "command": r.get("command", ""), "core": int(core),
                        "profile": r.get("profile"), "utilization": sum(engines.values()) / len(ENGINES),
                        "engines": engines, "dma": _dma(util), "device_ns": d.get("device_ns", 0.0),
                        "programs": d.get("programs", 0), "allocated": c.get("allocated", 0),
                        "reserved": c.get("reserved", 0)})
    return out


def _dma(util: dict[str, float]) -> float:
    """Mean busy fraction of the DMA queues used."""
    queues = [u for e, u in util.items() if e not in ENGINES]
    return sum(queues) / len(queues) if queues else 0.0


def render(table: list[dict]) -> str:
    head = f"neuron-top - {time.strftime('%H:%M:%S')} - {len({r['pid'] for r in table})} process(es) " \
           f"(telemetry: {telemetry.directory()})"
    if not table:
        return head + "\nno processes are using neuron devices"
    return head + "\n" + box(
        ["PID", "CORE", "UTIL", "TENSOR", "VECTOR", "SCALAR", "GPSIMD", "DMA", "DEVICE TIME", "PROGRAMS",
         "MEM ALLOCATED", "MEM RESERVED", "COMMAND"],
        [[r["pid"], r["core"], f"{r['utilization']:.1%}", *(f"{r['engines'][e]:.1%}" for e in ENGINES),
          f"{r['dma']:.1%}", f"{r['device_ns'] / 1e6:.3f} ms", r["programs"], human_bytes(r["allocated"]),
          human_bytes(r["reserved"]), r["command"][:40]] for r in table])


def _previous(records: list[dict]) -> dict:
    return {(r["pid"], core): c for r in records for core, c in r.get("cores", {}).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-top", description=__doc__.splitlines()[0])
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print the rows as JSON")
    parser.add_argument("--delay", "-d", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--iterations", "-n", type=int, default=0, help="refreshes before exiting (default: until "
                        "Ctrl-C)")
    args = parser.parse_args(argv)
    if not args.delay > 0:
        parser.error(f"--delay {args.delay}: must be a positive number of seconds")
    if args.iterations < 0:
        parser.error(f"--iterations {args.iterations}: must be >= 0 (0: until Ctrl-C)")
    if args.once:
        table = rows(telemetry.read_all())
        print(json.dumps(table, indent=2) if args.json else render(table))
        return 0
    previous, shown = None, 0
    try:
        while True:
            records = telemetry.read_all()
            sys.stdout.write(CLEAR + render(rows(records, previous)) + "\n")
            sys.stdout.flush()
            previous, shown = _previous(records), shown + 1
            if shown == args.iterations:
                return 0
            time.sleep(args.delay)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
