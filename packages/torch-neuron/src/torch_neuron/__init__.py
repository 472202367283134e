"""torch-neuron: PyTorch's ``neuron`` device on neuron-hal.

``import torch`` loads this package (entry point ``torch.backends``, through ``_torch_neuron_autoload``, which
warns instead of failing torch's import when this one fails; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that
off, then ``import torch_neuron`` does it). This module is ``torch.neuron``: devices, streams/events, RNG,
memory statistics, amp and ``metrics()``, shaped like ``torch.cuda``.
"""

from __future__ import annotations

import os
import sys

import torch  # noqa: E402  (imported first, torch's autoload finds this module half-imported and goes on)

from . import _extension  # noqa: E402

__version__ = "0.0.1"

_C = _extension.load()
sys.modules[__name__ + "._C"] = _C

from . import profiler  # noqa: E402  (torch.neuron.profiler)
from .amp import get_amp_supported_dtype, get_autocast_dtype, is_autocast_enabled, is_bf16_supported  # noqa: E402
from .device import (  # noqa: E402
    NeuronDeviceProperties,
    current_device,
    device,
    device_count,
    get_device_capability,
    get_device_name,
    get_device_properties,
    is_available,
    set_device,
    synchronize,
)
from .fallback import NeuronFallbackWarning, is_strict, set_strict  # noqa: E402
from .memory import (  # noqa: E402
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from .metrics import metrics, reset_metrics, top_ops  # noqa: E402
from .ops.core.copy import host_alias  # noqa: E402
from .random import (  # noqa: E402
    default_generator,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .runtime import runtime  # noqa: E402
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream  # noqa: E402

__all__ = [
    "Event", "NeuronDeviceProperties", "NeuronFallbackWarning", "Stream", "current_device", "current_stream",
    "default_generator", "default_stream", "device", "device_count", "empty_cache", "get_amp_supported_dtype",
    "get_autocast_dtype", "get_device_capability", "get_device_name", "get_device_properties", "get_rng_state",
    "get_rng_state_all", "host_alias", "init", "initial_seed", "is_autocast_enabled", "is_available",
    "is_bf16_supported", "is_initialized", "is_strict", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_summary", "metrics",
    "profiler", "reset_accumulated_memory_stats", "reset_metrics", "reset_peak_memory_stats", "runtime", "seed",
    "seed_all", "set_device", "set_rng_state", "set_rng_state_all", "set_stream", "set_strict", "stream",
    "synchronize", "top_ops",
]


def is_initialized() -> bool:
    return _C._is_initialized() and not _in_bad_fork


def init() -> None:
    """As ``torch.cuda.init()``: initialize the device runtime now. Importing torch already does (the driver is
    created when the backend loads), so this only checks that it did; it raises what a failed load raised. In a
    child forked after that, it raises as CUDA's does: the child holds a copy of the parent's runtime (the
    simulator's state; a hardware driver's handles are not usable there), so use the 'spawn' start method."""
    if _in_bad_fork:
        raise RuntimeError("Cannot re-initialize Neuron in forked subprocess. To use Neuron with multiprocessing, "
                           "you must use the 'spawn' start method")
    runtime()
    if not is_initialized():
        raise RuntimeError("torch.neuron.init(): the neuron runtime did not initialize; see the warning "
                           "`import torch` printed, or run `python -c 'import torch_neuron'`")


_in_bad_fork = False  # set in a child forked from a process whose runtime was up (CUDA's poison fork)


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def _poison_fork() -> None:
    global _in_bad_fork
    _in_bad_fork = bool(_C._is_initialized())


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() == "neuron":
        return
    rt = runtime()  # first: the driver and its environment fail here, before torch is changed (no half device)
    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", sys.modules[__name__])
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_packed_sequence=True,
                                                         for_storage=True)
    _C._init(rt, rt.device_count())
    from . import compat, distributed, ops, program_cache

    program_cache.enable()
    ops.register()
    compat.register(ops.registry.LIB)
    distributed.register()  # the c10d backend `neuron`; its extension is built on first use


_register()
os.register_at_fork(after_in_child=_poison_fork)
