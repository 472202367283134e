"""Normalization and fused-optimizer kernels on large tensors: the roofline is the DMA time of every byte
the kernel must read and write (activations, weights, statistics, optimizer state)."""


from neuron_kernels.library import norms
from neuron_kernels.library.optim import ADAM_FIELDS, adamw_step

from . import Case
from . import nbytes as _nbytes
from . import spec as _spec


def _row_cases():
    cases = []
    d = 4096
    for dtype, rows in (("bfloat16", 2048), ("float32", 1024)):  # 16 MiB of activations
        x, w = _spec((rows, d), dtype), _spec((d,), dtype)
        stat = _spec((rows, 1), "float32")
        label = f"{rows}x{d}"
        cases.append(Case("norms.rms_norm", norms.rms_norm, (x, w), label, dtype, "dma",
                          _nbytes(x, w, x, stat)))
        cases.append(Case("norms.layer_norm", norms.layer_norm, (x, w, w), label, dtype, "dma",
                          _nbytes(x, w, w, x, stat, stat)))
    x, w, stat = _spec((2048, d), "bfloat16"), _spec((d,), "bfloat16"), _spec((2048, 1), "float32")
    cases.append(Case("norms.layer_norm_backward", norms.layer_norm_backward, (x, x, stat, stat, w),
                      f"2048x{d}", "bfloat16", "dma", _nbytes(x, x, stat, stat, w, x, w, w)))
    # a UNet block: 32 groups of 16 channels over 64 x 64 positions, 16 MiB
    x, w, stat = _spec((4, 512, 64 * 64), "bfloat16"), _spec((512,), "bfloat16"), _spec((4, 32), "float32")
    cases.append(Case("norms.group_norm", norms.group_norm, (x, w, w), "4x512x4096 g32", "bfloat16", "dma",
                      _nbytes(x, w, w, x, stat, stat), {"num_groups": 32}))
    return cases


def _adamw_case():
    # 64 MiB of float32 parameters in 13 tensors; read param, grad, exp_avg, exp_avg_sq, write three of them
    shapes = [(1024, 1024)] * 12 + [(4096, 1024)]
    params = [_spec(s, "float32") for s in shapes]
    hyper = _spec((len(ADAM_FIELDS),), "float32")
    kernel = adamw_step.kernel(len(shapes))
    work = _nbytes(*params) * 7 + _nbytes(hyper)
    return Case("optim.adamw_step", kernel, tuple(params * 4) + (hyper,), f"{len(shapes)} tensors 64MiB",
                "float32", "dma", work)


CASES = _row_cases() + [_adamw_case()]
