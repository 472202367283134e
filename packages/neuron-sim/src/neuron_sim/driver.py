"""The ``sim`` driver: each device is a simulated NeuronCore of the profile's chip.

Values run on the chip's emulated HBM and each core's SBUF/PSUM (:mod:`.values`); timing comes from
the cost model (:mod:`.timing`). ``NEURON_SIM_TIMING_ONLY=1`` skips values (for timing studies of
programs whose results are not needed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from neuron_hal.driver import ExecutionReport
from neuron_hal.emulated import EmulatedDriver, Loaded, MergedGraph
from neuron_hal.isa import COMPUTE_ENGINES

from .schedule import Stored, in_order, schedule, stored
from .timing import prepare_timing, run_timing
from .trace import chrome_trace
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

    def _load_merged(self, graph: MergedGraph):
        known = stored(graph.key, self.profile, graph.instructions)
        if known is not None:  # scheduled and timed by an earlier process: the program is built only for a trace
            return _Known(graph, known)
        return Loaded(*schedule(graph.build(), self.profile, graph.key))  # the instructions reordered as a whole

    def estimate(self, device, loaded):
        self._device(device)
        return self._timed(device, loaded, 0.0, False)

    def _timed(self, device, loaded: Loaded, start_ns, trace):
        program = loaded.program
        timing = run_timing(loaded.prepared(), start_ns, want_events=trace)
        report = self._report(device, program.name, len(program.instructions), timing)
        if trace:
            report.trace = chrome_trace(program, loaded.prepared(), timing, device)
        return report

    def _report(self, device, name, instructions, timing):
        return ExecutionReport(name, device, 0, timing.start_ns, timing.end_ns, instructions,
                               dict(timing.engine_busy_ns), dict(timing.engine_instructions), self._clocks,
                               timing.dma_bytes)

    def _values(self, device, loaded, addresses):
        if self.values:
            core = self.core(device)
            try:
                run_values(loaded.program, self.hbm, addresses, core, self.profile)
            finally:
                core.repoison()  # every program starts from poisoned SBUF/PSUM, as after a fresh load

    def _time(self, device, loaded, start_ns, trace):
        if isinstance(loaded, _Known):
            if not trace:
                graph = loaded.graph
                return self._report(device, graph.name, graph.instructions, loaded.stored.timing(start_ns))
            loaded = loaded.loaded(self.profile)
        return self._timed(device, loaded, start_ns, trace)


@dataclass
class _Known:
    """A merged program whose schedule and timing the cache kept: its times come from there; the program (merged,
    in the kept order) and its timing plan are built the first time a trace needs its instructions."""

    graph: MergedGraph
    stored: Stored
    _loaded: Loaded | None = None

    def loaded(self, profile) -> Loaded:
        if self._loaded is None:
            self._loaded = Loaded(*in_order(self.graph.build(), self.stored.order, profile))
        return self._loaded
