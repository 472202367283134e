"""This process's telemetry for ``neuron-top`` and ``neuron-ls`` (the file format: :mod:`neuron_hal.telemetry`).

Each program launched is told to :func:`Publisher.on_report` (a ``report_observers`` entry), which only adds
to counters; a daemon thread writes the record every ``$NEURON_TELEMETRY_INTERVAL`` seconds (default 1) when
something changed, and the file is removed at exit. ``NEURON_TELEMETRY=0`` publishes nothing. Telemetry never fails
the process: an error writing it is reported once as a warning, and publishing goes on quietly.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from collections import defaultdict

from neuron_hal import telemetry as files

from ..metrics import report_observers

DEFAULT_INTERVAL = 1.0


def interval() -> float:
    text = os.environ.get("NEURON_TELEMETRY_INTERVAL", "")
    try:
        value = float(text) if text else DEFAULT_INTERVAL
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"NEURON_TELEMETRY_INTERVAL={text!r}: must be a positive number of seconds")
    return value


class Publisher:
    def __init__(self, runtime, period: float):
        self.runtime = runtime
        self.period = period
        self.pid = os.getpid()
        self.started = files.started(self.pid)
        self.command = " ".join(" ".join(getattr(sys, "orig_argv", sys.argv)).split()) or sys.executable  # one line
        self._lock = threading.Lock()
        self._cores: dict[int, dict] = defaultdict(lambda: {"device_ns": 0.0, "engine_busy_ns": defaultdict(float),
                                                            "programs": 0})
        self._programs = 0
        self._dirty = True
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="neuron-telemetry", daemon=True)

    def start(self) -> None:
        report_observers.append(self.on_report)
        atexit.register(self.stop)
        self._thread.start()

    def on_report(self, op: str, report) -> None:
        with self._lock:
            core = self._cores[report.device]
            core["device_ns"] += report.device_ns
            for engine, ns in report.engine_busy_ns.items():
                core["engine_busy_ns"][engine] += ns
            core["programs"] += 1
            self._programs += 1
            self._dirty = True

    def record(self) -> dict:
        stats = self.runtime.allocator.stats
        with self._lock:
            cores = {index: {**c, "engine_busy_ns": dict(c["engine_busy_ns"])} for index, c in self._cores.items()}
            programs = self._programs
        for index in set(cores) | set(stats):
            s = stats.get(index)
            core = cores.setdefault(index, {"device_ns": 0.0, "engine_busy_ns": {}, "programs": 0})
            core["allocated"] = s.allocated_bytes.current if s else 0
            core["reserved"] = s.reserved_bytes.current if s else 0
        return {"pid": self.pid, "started": self.started, "command": self.command, "driver": self.runtime.driver.name,
                "profile": self.runtime.profile.name, "updated": time.time(), "programs": programs,
                "cores": {str(i): c for i, c in sorted(cores.items())}}

    def publish(self) -> None:
        if os.getpid() != self.pid:  # a forked child: the file is the parent's
            return
        try:
            files.write(self.record())
        except Exception as e:  # telemetry must never fail the process
            self._warn(e)

    def _warn(self, e: Exception) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"neuron telemetry could not be written to {files.directory()} ({e!r}); "
                          "the program goes on (NEURON_TELEMETRY=0 turns telemetry off)", RuntimeWarning, stacklevel=3)

    def _run(self) -> None:
        last_memory = None
        while not self._stop.wait(self.period):
            try:
                memory = tuple((s.allocated_bytes.current, s.reserved_bytes.current)
                               for s in list(self.runtime.allocator.stats.values()))
            except Exception as e:  # e.g. the allocator torn down at exit
                self._warn(e)
                continue
            if self._dirty or memory != last_memory:
                self._dirty, last_memory = False, memory
                self.publish()

    def stop(self) -> None:
        """Stop publishing and remove the file (at exit): after the thread's last write, so none comes after."""
        self._stop.set()
        if self.on_report in report_observers:
            report_observers.remove(self.on_report)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if os.getpid() == self.pid:
            try:
                files.remove(self.pid)
            except OSError:
                pass


def start(runtime) -> Publisher | None:
    """Publish ``runtime``'s telemetry, unless ``NEURON_TELEMETRY`` turns it off."""
    if not files.enabled():
        return None
    try:
        period = interval()
    except ValueError as e:
        warnings.warn(f"neuron telemetry is off: {e}", RuntimeWarning, stacklevel=2)
        return None
    publisher = Publisher(runtime, period)
    publisher.start()
    return publisher
