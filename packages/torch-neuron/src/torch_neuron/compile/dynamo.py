"""``torch.compile(backend="neuron")``: Dynamo graphs through AOTAutograd into the neuron graph compiler.

Dynamo's graph first has its hand-written attention turned into ``scaled_dot_product_attention``
(``attention``) and its hand-written RMSNorms into ``rms_norm`` (``norms``), so forward and backward get the
flash and norm kernels. AOTAutograd then traces the forward and the
backward into functional aten graphs (no decompositions beyond the ones the dispatcher applies itself: matmuls,
softmax, norms, attention and the fused optimizer steps keep their single-kernel ops) and partitions them as eager
autograd does: the backward reads what the forward saved (the min-cut rematerializer would recompute elementwise
values instead, which pays off only when the recomputation fuses into the backward's kernels; here it would mostly
be extra programs). Each graph then goes through ``graph.fuse``, and each call of it runs as one device program
(``device_graph``). Dynamo finds the backend through the ``torch_dynamo_backends`` entry point.
"""

from __future__ import annotations

import logging

import torch
from functorch.compile import default_partition, make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from .. import program_cache
from ..metrics import record_compile
from .attention import fuse_attention
from .device_graph import as_one_program, devices_of
from .graph import fuse
from .norms import fuse_rms_norms

log = logging.getLogger("torch_neuron.compile")


def _compiler(kind: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        program_cache.enable()  # the directory the environment names now
        gm, regions = fuse(gm)
        record_compile(f"{kind}_graphs")
        record_compile("fused_regions", len(regions))
        eager = sum(1 for n in gm.graph.nodes if n.op == "call_function") - len(regions)
        log.info("neuron %s graph: %d fused regions, %d other calls", kind, len(regions), eager)
        log.debug("%s", gm.code)
        return as_one_program(kind, devices_of(example_inputs), make_boxed_func(gm.forward))
    return compile_graph


_aot = aot_autograd(
    fw_compiler=_compiler("forward"),
    bw_compiler=_compiler("backward"),
    inference_compiler=_compiler("inference"),
    partition_fn=default_partition,
    keep_inference_input_mutations=True,
)


def backend(gm: torch.fx.GraphModule, example_inputs):
    """Dynamo's graph: hand-written attention and RMSNorm to their kernels, then AOTAutograd and the graph
    compiler."""
    for name, rewrite, kernel in (("attention_fused", fuse_attention, "scaled_dot_product_attention"),
                                  ("rms_norms_fused", fuse_rms_norms, "rms_norm")):
        fused = rewrite(gm)
        if fused:
            record_compile(name, fused)
            log.info("neuron: %d hand-written %s run as %s", fused, name.split("_")[0], kernel)
    return _aot(gm, example_inputs)
