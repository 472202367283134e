"""``torch.compile(backend="neuron")``: Dynamo graphs through AOTAutograd into the neuron graph compiler.

Dynamo's graph first has its hand-written attention turned into ``scaled_dot_product_attention``
(``attention``) and its hand-written RMSNorms into ``rms_norm`` (``norms``), so forward and backward get the
flash and norm kernels. AOTAutograd then traces the forward and the
backward into functional aten graphs (no decompositions beyond the ones the dispatcher applies itself: matmuls,
softmax, norms, attention and the fused optimizer steps keep their single-kernel ops) and partitions them as eager
autograd does: the backward reads what the forward saved (the min-cut rematerializer would recompute elementwise
values instead, which pays off only when the recomputation fuses into the backward's kernels; here it would mostly
be extra programs). Each graph then goes through ``graph.fuse``, and each call of it runs as one device program
(``device_graph``); AOTAutograd's cache keeps the graphs for the next process (``aot_cache``, ``output_code``).
Dynamo finds the backend through the ``torch_dynamo_backends`` entry point.
"""

from __future__ import annotations

import logging

import torch
from functorch.compile import default_partition
from torch._dynamo.backends.common import aot_autograd

from ..metrics import record_compile
from . import aot_cache
from .attention import fuse_attention
from .norms import fuse_rms_norms
from .output_code import compiler

log = logging.getLogger("torch_neuron.compile")

_aot = aot_autograd(
    fw_compiler=compiler("forward"),
    bw_compiler=compiler("backward"),
    inference_compiler=compiler("inference"),
    partition_fn=default_partition,
    keep_inference_input_mutations=True,
)


def backend(gm: torch.fx.GraphModule, example_inputs):
    """Dynamo's graph: hand-written attention and RMSNorm to their kernels, then AOTAutograd (or its cache of
    graphs compiled before: ``aot_cache``) and the graph compiler."""
    for name, rewrite, kernel in (("attention_fused", fuse_attention, "scaled_dot_product_attention"),
                                  ("rms_norms_fused", fuse_rms_norms, "rms_norm")):
        fused = rewrite(gm)
        if fused:
            record_compile(name, fused)
            log.info("neuron: %d hand-written %s run as %s", fused, name.split("_")[0], kernel)
    with aot_cache.scope(gm):
        return _aot(gm, example_inputs)
