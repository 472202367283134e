"""The ``sim`` driver: each device is a simulated NeuronCore of the profile's chip.

Values run on the chip's emulated HBM and each core's SBUF/PSUM (:mod:`.values`); timing comes from
the cost model (:mod:`.timing`). ``NEURON_SIM_TIMING_ONLY=1`` skips values (for timing studies of
programs whose results are not needed).
"""

from __future__ import annotations

import os

from neuron_hal.driver import ExecutionReport
from neuron_hal.emulated import EmulatedDriver, Loaded
from neuron_hal.isa import COMPUTE_ENGINES

from .schedule import schedule
from .timing import chrome_trace, prepare_timing, run_timing
from .values import CoreMemory, run_values


class SimDriver(EmulatedDriver):
    name = "sim"
    priority = 10  # below hardware drivers, above nothing: it always finds its devices

    def __init__(self, profile, values: bool | None = None):
        super().__init__(profile)
        self.values = values if values is not None else os.environ.get("NEURON_SIM_TIMING_ONLY", "0") != "1"
        self._cores: dict[int, CoreMemory] = {}
        self._clocks = {e.value: profile.clock_ghz(e.value) for e in COMPUTE_ENGINES}

    def core(self, device: int) -> CoreMemory:
        """The on-chip memories of one core (created on first use, poisoned)."""
        if device not in self._cores:
            self._cores[self._device(device)] = CoreMemory(self.profile)
        return self._cores[device]

    def _prepare(self, program):
        return prepare_timing(program, self.profile)

    def _load_merged(self, program, key):
        return Loaded(*schedule(program, self.profile, key))  # a compiled graph's instructions, scheduled as a whole

    def estimate(self, device, loaded):
        self._device(device)
        return self._report(device, loaded, run_timing(loaded.prepared(), 0.0), False)

    def _report(self, device, loaded, timing, trace):
        program = loaded.program
        report = ExecutionReport(
            program.name, device, 0, timing.start_ns, timing.end_ns, len(program.instructions),
            dict(timing.engine_busy_ns), dict(timing.engine_instructions), self._clocks, timing.dma_bytes,
        )
        if trace:
            report.trace = chrome_trace(program, loaded.prepared(), timing, device)
        return report

    def _values(self, device, loaded, addresses):
        if self.values:
            core = self.core(device)
            try:
                run_values(loaded.program, self.hbm, addresses, core, self.profile)
            finally:
                core.repoison()  # every program starts from poisoned SBUF/PSUM, as after a fresh load

    def _time(self, device, loaded, start_ns, trace):
        return self._report(device, loaded, run_timing(loaded.prepared(), start_ns, want_events=trace), trace)
