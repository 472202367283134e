"""Telemetry files: what each process using neuron devices publishes for ``neuron-ls`` and ``neuron-top``.

A process writes one small JSON file, ``<pid>.json``, to a per-user directory (``$NEURON_TELEMETRY_DIR``, else
``$XDG_RUNTIME_DIR/neuron-telemetry``, else ``/tmp/neuron-telemetry-<uid>``), replacing it whole (write and rename,
:func:`neuron_hal.cache.write_atomic`) so readers never see half a file, and removes it at exit. A file whose pid
is no longer alive (the process was killed), or now belongs to another process, is ignored. ``NEURON_TELEMETRY=0``
turns publishing off.

A record: ``pid``, ``started`` (:func:`started`), ``command``, ``driver``, ``profile``, ``updated`` (Unix time),
``programs`` (executions run), and ``cores``: per device index, ``device_ns`` (device time of its executions),
``engine_busy_ns`` (per engine), ``programs``, ``allocated`` and ``reserved`` (bytes of device memory).
"""

from __future__ import annotations

import json
import os
import pathlib

from .cache import write_atomic

VERSION = 1


def enabled() -> bool:
    return os.environ.get("NEURON_TELEMETRY", "1").lower() not in ("0", "off", "false", "no")


def directory() -> pathlib.Path:
    if os.environ.get("NEURON_TELEMETRY_DIR"):
        return pathlib.Path(os.environ["NEURON_TELEMETRY_DIR"])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return pathlib.Path(runtime) / "neuron-telemetry"
    return pathlib.Path(f"/tmp/neuron-telemetry-{os.getuid()}")


def path_of(pid: int) -> pathlib.Path:
    return directory() / f"{pid}.json"


def write(record: dict) -> None:
    """Publish ``record`` (it must hold ``pid``) for its process, replacing the previous one."""
    folder = directory()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(folder / f"{record['pid']}.json", json.dumps({"version": VERSION, **record}))


def remove(pid: int) -> None:
    try:
        path_of(pid).unlink()
    except FileNotFoundError:
        pass


def started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux's /proc), None where that is not known: with it
    a record of a dead process whose pid was reused is told from the new process's."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` runs, and (given ``start``, from :func:`started`) is the same process as then."""
    if start is not None and started(pid) not in (None, start):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def read_all() -> list[dict]:
    """Records of live processes, by pid; unreadable files and those of dead pids are skipped."""
    folder = directory()
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not ours
        if record.get("version") == VERSION and alive(pid, record.get("started")):
            records.append(record)
    return sorted(records, key=lambda r: r["pid"])


def core_utilization(core: dict) -> dict[str, float]:
    """Busy fraction of each engine of one core's record over its device time."""
    span = core.get("device_ns") or 0.0
    return {e: (min(1.0, busy / span) if span else 0.0) for e, busy in core.get("engine_busy_ns", {}).items()}
