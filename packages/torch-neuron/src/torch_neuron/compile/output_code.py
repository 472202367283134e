"""A compiled graph as torch's ``OutputCode``: what AOTAutograd's cache (``aot_cache``) keeps of our forward and
backward graphs.

It holds the AOTAutograd graph as data (``graph_io``) and the callable made of it (``build``: the graph compiler,
each call one device program). Written to the cache, it keeps only the data; loaded from it, ``post_compile``
builds the callable again, as the first compile did.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
from functorch.compile import make_boxed_func
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._inductor.output_code import OutputCode

from .. import program_cache
from ..metrics import record_compile
from . import graph_io
from .device_graph import as_one_program, devices_of
from .graph import fuse

log = logging.getLogger("torch_neuron.compile")


def build(kind: str, root: torch.nn.Module, graph: torch.fx.Graph, devices: tuple[int, ...]):
    """``graph`` (its constants in ``root``) through the graph compiler, as a boxed callable whose every call is
    one device program."""
    program_cache.enable()  # the directory the environment names now
    regions = fuse(graph)
    gm = torch.fx.GraphModule(root, graph)  # its code generated once, for the fused graph
    record_compile(f"{kind}_graphs")
    record_compile("fused_regions", len(regions))
    eager = sum(1 for n in gm.graph.nodes if n.op == "call_function") - len(regions)
    log.info("neuron %s graph: %d fused regions, %d other calls", kind, len(regions), eager)
    log.debug("%s", gm.code)
    return as_one_program(kind, devices, make_boxed_func(gm.forward))


@dataclasses.dataclass
class NeuronOutputCode(OutputCode):
    kind: str = "forward"
    devices: tuple = ()
    graph: graph_io.GraphData | None = None  # None: the graph cannot be cached (``unserializable`` says why)
    unserializable: str = ""
    run: Callable | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        # called with the list of inputs; an instance attribute, as torch's wrappers copy the instance's dict
        self._boxed_call = True

    def __call__(self, inputs):
        return self.run(inputs)

    def prepare_for_serialization(self) -> None:
        if self.graph is None:
            raise BypassAOTAutogradCache(f"neuron {self.kind} graph: {self.unserializable}")
        self.run = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        if self.run is None:
            self.run = build(self.kind, *graph_io.load(self.graph), self.devices)

    def set_triton_bundle(self, triton_bundle) -> None:
        pass  # no Triton kernels


def compiler(kind: str) -> SerializableAOTDispatchCompiler:
    """AOTAutograd's compiler of ``kind`` graphs (forward, backward, inference)."""
    def compile_graph(gm: torch.fx.GraphModule, example_inputs) -> NeuronOutputCode:
        try:
            data, why = graph_io.dump(gm), ""  # before ``fuse`` rewrites the graph
        except Exception as e:  # noqa: BLE001 - a graph the cache cannot hold is compiled each time, nothing else
            data, why = None, f"{type(e).__name__}: {e}"
        devices = devices_of(example_inputs)
        return NeuronOutputCode(kind=kind, devices=devices, graph=data, unserializable=why,
                                run=build(kind, gm, gm.graph, devices))
    return SerializableAOTDispatchCompiler(NeuronOutputCode, compile_graph)
