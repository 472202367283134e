"""The neuron graph compiler: an AOTAutograd graph in, a GraphModule calling fused regions and eager ops out.

Casts and residual adds go into the matmul or norm producing their input (``epilogues``). Each fused region
(``fusion.partition``) becomes one call of a ``FusedRegion`` at the place of its last node;
its values read elsewhere come out of the call's result tuple. Everything else stays an aten call on neuron
tensors, which runs the op's own kernel (matmuls, softmax, norms and attention are single fused library
kernels already).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..metrics import record_compile
from .epilogues import fold_epilogues
from .fusion import external_inputs, horizontal_groups, outputs, partition
from .region import ForeachRegion, FusedRegion


def fuse(graph: fx.Graph) -> list[FusedRegion | ForeachRegion]:
    """Rewrite ``graph`` in place; returns its fused regions. The caller generates the graph's code once, after."""
    _reshape_views(graph)
    for name, folded in fold_epilogues(graph).items():
        if folded:
            record_compile(name, folded)
    fused = []
    for region in partition(graph):
        outs = outputs(region)
        inputs = external_inputs(region)  # taken now: earlier regions' outputs are getitem nodes by this point
        kernel = FusedRegion(region.nodes, inputs, outs)
        fused.append(kernel)
        last = region.nodes[-1]
        with graph.inserting_after(last):
            call = graph.call_function(kernel, tuple(inputs))
        inside = set(region.nodes)
        with graph.inserting_after(call):
            for i, n in enumerate(outs):
                item = graph.call_function(operator.getitem, (call, i))
                item.meta["val"] = n.meta.get("val")
                n.replace_all_uses_with(item, delete_user_cb=lambda u, inside=inside: u not in inside)
        for n in reversed(region.nodes):
            graph.erase_node(n)
    for nodes in horizontal_groups(graph):
        fused.append(_replace_group(graph, nodes))
    graph.lint()
    return fused


def _replace_group(graph: fx.Graph, nodes: list[fx.Node]) -> ForeachRegion:
    kernel = ForeachRegion(nodes)
    with graph.inserting_before(nodes[0]):  # the group's inputs are graph inputs: defined before it
        call = graph.call_function(kernel, tuple(n.all_input_nodes[0] for n in nodes))
        items = [graph.call_function(operator.getitem, (call, i)) for i in range(len(nodes))]
    for n, item in zip(nodes, items):
        item.meta["val"] = n.meta.get("val")
        n.replace_all_uses_with(item)
        graph.erase_node(n)
    return kernel


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _reshape_views(graph: fx.Graph) -> None:
    """``view`` nodes become ``reshape``: the graph was traced with meta strides, and an eager kernel may give
    another (dense) layout, which reshape copies where view would fail. The graph is functional, so nothing
    depends on the aliasing."""
    for n in graph.nodes:
        if n.op == "call_function" and n.target in _VIEWS:
            n.target = torch.ops.aten.reshape.default
