"""The ``neuron`` c10d backend: ``init_process_group("cpu:gloo,neuron:neuron")`` (what no backend means on a
neuron machine: see ``_default_backends``) and ``init_device_mesh("neuron", ...)`` under torchrun.

The backend is C++ (``csrc/ProcessGroupNeuron.cpp``, its own extension, built on first use and cached
like the core): FSDP2 calls ``_allgather_base`` / ``_reduce_scatter_base``, which a Python process group
cannot override on torch 2.13.

Data movement, and why: every collective runs on gloo over host-staged CPU tensors. Gloo is already
in every torch build, works across hosts through the store torchrun provides (TCPStore), and covers all
of c10d's collectives; a shared-memory transport would only serve one host. On the simulator device
memory is host-mappable, so a contiguous neuron tensor is staged as a host *alias* of its own memory
(zero copy: gloo reads and writes device memory directly); strided tensors, and every tensor on a driver
that cannot map device memory (hardware), are staged as host copies and copied back when the collective
completes (``TORCH_NEURON_DIST_STAGING=copy`` forces that path). Gloo lacks PREMUL_SUM (FSDP2's gradient
reduction): the backend scales the staged inputs by the factor, in their dtype as NCCL does, then sums.

Device time: each collective adds its NeuronLink time (``cost.py``) to the current queue of its device,
so ``torch.neuron.Event`` timings and ``torch.neuron.metrics()["device_ns"]["c10d.<op>"]`` include
communication.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..metrics import record_native
from ..ops.core.copy import host_alias, to_host
from ..runtime import runtime
from .cost import collective_ns

NAME = "neuron"
CSRC = Path(__file__).with_name("csrc")


def register() -> None:
    """Make ``neuron`` a c10d backend and the default one of the ``neuron`` device. Cheap: the extension
    is built when the first process group is created."""
    import torch.distributed as dist

    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=[NAME])
    import torch.distributed.device_mesh as mesh  # init_device_mesh calls its own imported name

    dist.init_process_group = _default_backends(dist.init_process_group)
    for module in (dist.distributed_c10d, mesh):
        module.init_process_group = dist.init_process_group


def _default_backends(init):
    """``init_process_group()`` with no backend on a neuron machine means ``"cpu:gloo,neuron:neuron"``.

    torch 2.13 builds only the accelerator's backend then, yet marks gloo as the group's default unless nccl is
    among its backends (``_new_process_group_helper``), so DDP's logger fails ("Could not find backend type 1 for
    Process Group with name gloo"); CUDA's world gets nccl there. Naming both backends keeps the default the
    device's, and CPU tensors (samplers, object collectives, a CPU metric) work in the same group."""
    import functools
    import inspect

    position = list(inspect.signature(init).parameters).index("backend")

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        given = kwargs.get("backend", args[position] if len(args) > position else None)
        if given is None and torch._C._get_accelerator().type == NAME:
            if len(args) > position:
                args = (*args[:position], f"cpu:gloo,{NAME}:{NAME}", *args[position + 1:])
            else:
                kwargs["backend"] = f"cpu:gloo,{NAME}:{NAME}"
        return init(*args, **kwargs)

    return init_process_group


def _extension():
    from .._extension import load

    return load(CSRC, name="torch_neuron_dist_C", prefix="dist-torch")


def _zero_copy() -> bool:
    from neuron_hal import Driver

    mode = os.environ.get("TORCH_NEURON_DIST_STAGING", "auto")
    if mode not in ("auto", "copy"):
        raise ValueError(f"TORCH_NEURON_DIST_STAGING must be 'auto' or 'copy', not {mode!r}")
    return mode == "auto" and type(runtime().driver).map is not Driver.map


class _Stager:
    """``stage(tensors, read) -> [(host, copied)]``: a host tensor standing in for each tensor in a
    collective; ``copied`` says the result must be copied back. ``read``: the values are inputs."""

    def __init__(self):
        self.zero_copy = _zero_copy()

    def __call__(self, tensors, read: bool):
        return [self._one(t, read) for t in tensors]

    def _one(self, t: torch.Tensor, read: bool):
        if t.device.type != NAME:
            return t, False
        if self.zero_copy and t.is_contiguous():
            return host_alias(t), False
        if read:
            return to_host(t).contiguous(), True
        return torch.empty(t.shape, dtype=t.dtype), True


class _Recorder:
    """``record(device, op, nbytes)``: charge a collective's NeuronLink time to the device's current queue."""

    def __init__(self, ranks: int):
        self.ranks = ranks

    def __call__(self, device: int, op: str, nbytes: int) -> None:
        if device == -1:
            return  # CPU tensors given to the neuron group: no device timeline
        if device == -2:
            device = torch.neuron.current_device()
        rt = runtime()
        ns = collective_ns(op, nbytes, self.ranks, rt.profile)
        queue = torch.neuron.current_stream(device).stream_id
        if rt.driver.enqueue(device, queue, ns) is not None:
            record_native(f"c10d.{op}", ns, programs=0)


def _create(store_opts, backend_opts):
    import torch.distributed as dist

    rank, size, timeout = store_opts.group_rank, store_opts.group_size, store_opts.timeout
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("neuron-gloo/", store_opts.store), rank, size, timeout)
    return _extension().ProcessGroupNeuron(gloo, rank, size, _Stager(), _Recorder(size))
