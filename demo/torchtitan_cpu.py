"""TorchTitan's trainer on the CPU with gloo: the reference run for ``demo/run_torchtitan.py``.

torchtitan 0.2.2 has no CPU device (it takes the accelerator, else "cuda"), so before its trainer is
imported (by any of its modules) torch's device lookup answers "cpu" and the small CPU stand-in below.
Gloo has no PREMUL_SUM, which FSDP2 picks for torchtitan's gradient divide factor 1.0: this run forces
FSDP2's plain-SUM path instead (the same values: the factor is 1). Only this reference run is patched;
the neuron run is torchtitan and torch unchanged. Run under torchrun with torch_neuron not loaded
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) and the trainer's own arguments.
"""

from __future__ import annotations

import runpy
import types

import torch
import torch._utils


def _cpu_module() -> types.SimpleNamespace:
    props = types.SimpleNamespace(name="cpu", total_memory=1 << 40)
    return types.SimpleNamespace(
        current_device=lambda: 0, set_device=lambda device: None, synchronize=lambda *a: None,
        empty_cache=lambda: None, get_device_name=lambda *a: "cpu", get_device_properties=lambda *a: props,
        memory_stats=lambda *a: {}, reset_peak_memory_stats=lambda *a: None, set_stream=lambda s: None,
        memory=torch.cpu,
    )


def _force_sum_reduction() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    divide_factors = collectives._get_gradient_divide_factors

    def summed(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type="", factor=None, force=False):
        return divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type, factor, True)

    collectives._get_gradient_divide_factors = summed


if __name__ == "__main__":
    _force_sum_reduction()
    cpu = _cpu_module()
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = lambda device_type=None: cpu
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
