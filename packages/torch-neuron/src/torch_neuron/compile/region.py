"""A fused region as one program: its formulas over its inputs, launched once per call.

The program is traced per input signature (shapes, dtypes) at the first call with it, so one compiled graph
serves every shape a dynamic dimension takes; the prepared launch is remembered per signature, so a call
costs one launch. A region the kernel cannot take (an SBUF budget its formulas exceed, ...) runs its ops
eagerly instead, said once in a warning.
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.fx as fx

from ..ops.launch import execute, prepared
from ..ops.pointwise_expr import Expr, foreach_formula, graph_formula
from .lowering import lower

log = logging.getLogger("torch_neuron.compile")


class FusedRegion:
    """Callable ``(*inputs) -> tuple(outputs)`` for the region's nodes (fx nodes of the graph being compiled)."""

    def __init__(self, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node]):
        env = {n: Expr(("x", i)) for i, n in enumerate(inputs)}
        for n in nodes:
            args = fx.node.map_arg(n.args, env.__getitem__)
            kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
            env[n] = lower(n.target, args, kwargs)
        self.exprs = tuple(env[n].node for n in outputs)
        self.out_dtypes = tuple(n.meta["val"].dtype for n in outputs)
        self.name = "fused:" + "+".join(_short(n) for n in nodes)
        if len(self.name) > 64:
            self.name = self.name[:61] + "..."
        self.eager = _subgraph(nodes, inputs, outputs)
        self.launches: dict = {}
        self.failed: str | None = None
        self.__name__ = self.__qualname__ = "fused_region"  # how the graph's generated code names the call

    def __call__(self, *xs):
        if self.failed is not None:
            return self.eager(*xs)
        xs = tuple(x if x.is_contiguous() else x.contiguous() for x in xs)
        key = tuple((x.shape, x.dtype) for x in xs)
        launch = self.launches.get(key)
        if launch is None:
            launch = self._prepare(xs)
            if launch is None:
                return self.eager(*xs)
        return tuple(execute(self.name, launch, xs, self.kwargs))

    @property
    def kwargs(self) -> dict:
        return {"exprs": self.exprs, "out_dtypes": self.out_dtypes}

    def _prepare(self, xs):
        try:
            launch = prepared(graph_formula, xs, self.kwargs)
        except Exception as e:  # noqa: BLE001 - any trace failure: the region's ops run one by one
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(f"torch.compile(backend='neuron'): region {self.name} runs op by op: {self.failed}",
                          stacklevel=3)
            return None
        key = tuple((x.shape, x.dtype) for x in xs)
        self.launches[key] = launch
        # a new input signature is a new program, not a recompile of the graph (Dynamo logs those with
        # TORCH_LOGS=recompiles): said here so a shape that keeps changing shows up
        log.info("%s: program %d for inputs %s", self.name, len(self.launches),
                 ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for s, d in key))
        return launch


def _short(node: fx.Node) -> str:
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0]


def _subgraph(nodes, inputs, outputs):
    """The region's nodes as their own GraphModule (the eager path)."""
    g = fx.Graph()
    env = {n: g.placeholder(f"x{i}") for i, n in enumerate(inputs)}
    for n in nodes:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output(tuple(env[n] for n in outputs))
    return fx.GraphModule(torch.nn.Module(), g)


class ForeachRegion:
    """Callable ``(*inputs) -> tuple(outputs)``: one formula of one input applied to each of several graph inputs
    (``fusion.horizontal_groups``), one program for all of them."""

    def __init__(self, nodes: list[fx.Node]):
        node = nodes[0]
        x = Expr(("x", 0))
        self.expr = lower(node.target, fx.node.map_arg(node.args, lambda a: x),
                          fx.node.map_arg(node.kwargs, lambda a: x)).node
        self.dtype = node.meta["val"].dtype
        self.kernel = foreach_formula(len(nodes), 1, False)
        self.name = f"fused:{len(nodes)}x{_short(node)}"
        self.eager = [_subgraph([n], n.all_input_nodes, [n]) for n in nodes]
        self.launches: dict = {}
        self.failed: str | None = None
        self.__name__ = self.__qualname__ = "fused_foreach"

    def __call__(self, *xs):
        if self.failed is None:
            xs = tuple(x if x.is_contiguous() else x.contiguous() for x in xs)
            key = tuple((x.shape, x.dtype) for x in xs)
            kwargs = {"expr": self.expr, "out_dtype": self.dtype, "inplace": False}
            launch = self.launches.get(key)
            if launch is None:
                try:
                    launch = self.launches[key] = prepared(self.kernel, xs, kwargs)
                except Exception as e:  # noqa: BLE001 - the nodes then run one by one
                    self.failed = f"{type(e).__name__}: {e}"
                    warnings.warn(f"torch.compile(backend='neuron'): {self.name} runs op by op: {self.failed}",
                                  stacklevel=2)
            if launch is not None:
                return tuple(execute(self.name, launch, xs, kwargs))
        return tuple(g(x)[0] for g, x in zip(self.eager, xs))
