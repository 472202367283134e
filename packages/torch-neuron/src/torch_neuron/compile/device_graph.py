"""A compiled graph's launches as one device program per call.

Inside a compiled graph every kernel still runs when the graph reaches it (values are exact and in order,
and host reads, CPU fallbacks and data-dependent shapes see them), but the driver records the launches
of the call (``Driver.begin_graph``) and runs them on the device as one program (``neuron_hal.merge``):
independent kernels overlap on the engines and DMA queues instead of each waiting for the one before.
The call's device time is charged to ``compiled <kind> graph`` in the metrics, one program per call.
"""

from __future__ import annotations

import torch

from ..metrics import record_native
from ..runtime import runtime


def devices_of(example_inputs) -> tuple[int, ...]:
    """The neuron devices a graph's inputs live on."""
    return tuple(sorted({t.device.index or 0 for t in example_inputs
                         if isinstance(t, torch.Tensor) and t.device.type == "neuron"}))


def as_one_program(kind: str, devices: tuple[int, ...], forward):
    """``forward`` (boxed: a list of inputs) run with each device's launches recorded as one program."""
    if not devices:
        return forward
    op = f"compiled {kind} graph"

    def run(args):
        driver = runtime().driver
        opened = []
        for d in devices:
            queue = torch._C._accelerator_getStream(d).stream_id
            if driver.begin_graph(d, queue):
                opened.append((d, queue))
        try:
            return forward(args)
        finally:
            for d, queue in opened:
                report = driver.end_graph(d, queue)
                if report is not None:
                    record_native(op, report.device_ns, report=report)
    run._boxed_call = True
    return run
