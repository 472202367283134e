"""Partitioning a graph's elementwise ops into fused regions.

Walking the nodes in order, an elementwise node (one ``lowering`` can express, on float or bool values)
joins the open region that produced one of its inputs when its result has that region's shape; regions it
joins together are merged. A region stays open until a node outside it reads one of its values: it then
runs at the place of its last node, so everything it reads is computed and everything reading it comes
after. A node that would take a region past the kernel's input limit starts a new one. Regions of a
single node stay eager ops (the library kernel is as good); a region's values read outside it are its
outputs, each rounded once to its node's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from neuron_kernels.library.formula import MAX_GRAPH_INPUTS, Expr

from .lowering import VALUE_DTYPES, lower


@dataclass(eq=False)
class Region:
    shape: tuple
    nodes: list = field(default_factory=list)
    open: bool = True


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _shape_key(t: torch.Tensor) -> tuple:
    """A shape with symbolic sizes compared by their expressions (no guards are added)."""
    return tuple(s.node.expr if isinstance(s, torch.SymInt) else int(s) for s in t.shape)


def _tensor_value(node) -> bool:
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.dtype in VALUE_DTYPES and v.device.type == "neuron"


def _trial_expr(node: fx.Node):
    """The node's formula over placeholder inputs, or None when it is not fusable."""
    if node.op != "call_function" or not _tensor_value(node):
        return None
    names = {}

    def stand_in(a):
        if isinstance(a, fx.Node):
            if not _tensor_value(a):
                raise ValueError
            return names.setdefault(a, Expr(("x", len(names))))
        if isinstance(a, list | tuple | dict):
            raise ValueError
        return a

    try:
        args = [stand_in(a) for a in node.args]
        kwargs = {k: stand_in(v) for k, v in node.kwargs.items()}
    except ValueError:
        return None
    if not names or len({_val(a).device for a in names} | {_val(node).device}) != 1:
        return None  # no tensor operand, or a transfer between devices
    return lower(node.target, args, kwargs)


def partition(graph: fx.Graph) -> list[Region]:
    """The fused regions (two nodes or more) of ``graph``, each listing its nodes in graph order."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    region_of: dict[fx.Node, Region] = {}
    regions: list[Region] = []
    for node in graph.nodes:
        if _trial_expr(node) is None:
            _close_inputs(node, region_of, None)
            continue
        shape = _shape_key(_val(node))
        producers = {region_of[a] for a in node.all_input_nodes if a in region_of}
        joinable = sorted((r for r in producers if r.open and r.shape == shape), key=lambda r: order[r.nodes[0]])
        region = _merge(joinable, regions, region_of, order) if joinable else None
        if region is None or len(external_inputs(region, node)) > MAX_GRAPH_INPUTS:
            region = Region(shape)
            regions.append(region)
        _close_inputs(node, region_of, region)
        region.nodes.append(node)
        region_of[node] = region
    return [r for r in regions if len(r.nodes) > 1]


def _close_inputs(node: fx.Node, region_of, joining: Region | None) -> None:
    for a in node.all_input_nodes:
        r = region_of.get(a)
        if r is not None and r is not joining:
            r.open = False


def _merge(rs: list[Region], regions: list[Region], region_of, order) -> Region:
    """One region of several open ones (their values are read only inside them so far)."""
    first = rs[0]
    for r in rs[1:]:
        first.nodes = sorted(first.nodes + r.nodes, key=order.__getitem__)
        for n in r.nodes:
            region_of[n] = first
        regions.remove(r)
    return first


def external_inputs(region: Region, extra: fx.Node | None = None) -> list[fx.Node]:
    """The nodes outside ``region`` (and ``extra``) its nodes read, in first-use order."""
    inside = set(region.nodes) | ({extra} if extra is not None else set())
    seen: dict[fx.Node, None] = {}
    for n in [*region.nodes, *([extra] if extra is not None else [])]:
        for a in n.all_input_nodes:
            if a not in inside:
                seen.setdefault(a, None)
    return list(seen)


def outputs(region: Region) -> list[fx.Node]:
    """The region's nodes read outside it (or by the graph's output), in graph order."""
    inside = set(region.nodes)
    return [n for n in region.nodes if any(u not in inside for u in n.users)]


def horizontal_groups(graph: fx.Graph) -> list[list[fx.Node]]:
    """Elementwise nodes left unfused that read one graph input each and compute the same formula to the same
    dtype (autocast's casts of every weight at the top of a forward): each group runs as one program over all
    its tensors, at the place of its first node (graph inputs exist from the start)."""
    groups: dict = {}
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if len(inputs) != 1 or inputs[0].op != "placeholder":
            continue
        expr = _trial_expr(node)
        if expr is not None:
            groups.setdefault((expr.node, _val(node).dtype), []).append(node)
    return [nodes for nodes in groups.values() if len(nodes) > 1]
