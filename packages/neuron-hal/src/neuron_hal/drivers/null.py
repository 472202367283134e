"""The null driver: real memory and copies, programs validated but not executed.

For fast contract tests of everything above the HAL. It never computes, so it is used only
when named (``NEURON_HAL_DRIVER=null``).
"""

from __future__ import annotations

from ..driver import ExecutionReport
from ..emulated import EmulatedDriver


class NullDriver(EmulatedDriver):
    name = "null"
    priority = -1

    def _values(self, device, loaded, addresses):
        pass  # validated at load; never computed

    def _time(self, device, loaded, start_ns, trace):
        program = loaded.program
        return ExecutionReport(program.name, device, 0, start_ns, start_ns, len(program.instructions),
                               trace={"traceEvents": []} if trace else None)
