"""A fused region as one program: its formulas over its inputs, launched once per call.

The program is traced per input signature (shapes, dtypes) at the first call with it, so one compiled graph
serves every shape a dynamic dimension takes; the prepared launch is remembered per signature, so a call
costs one launch. A region the kernel cannot take (an SBUF budget its formulas exceed, ...) runs its ops
eagerly instead, said once in a warning.
"""

from __future__ import annotations

import logging
import warnings
import weakref

import torch
import torch.fx as fx

from neuron_kernels.library.formula import Expr, foreach_formula, graph_formula
from neuron_kernels.lru import LRU

from ..ops.core.launch import CACHE_ENTRIES, execute, prepared, recall
from .lowering import lower

log = logging.getLogger("torch_neuron.compile")


class _Program:
    """What both kinds of region share: a kernel and its constants (``kernel``, ``kwargs``), a program per input
    signature, and the eager path (``run_eager``) when the kernel refuses the trace."""

    kernel = None
    kwargs: dict = {}
    name = ""

    def __init__(self):
        self.launches = LRU(CACHE_ENTRIES)  # by input signature, weakly: the launch cache owns them (launch.recall)
        self.traced = 0
        self.failed: str | None = None

    def __call__(self, *xs):
        # an empty tensor has no device memory to point a program at (and no work): its ops run eagerly
        if self.failed is None and all(x.numel() for x in xs):
            xs = tuple(x if x.is_contiguous() else x.contiguous() for x in xs)
            key = tuple((x.shape, x.dtype) for x in xs)
            launch = recall(self.launches.get(key)) or self._prepare(key, xs)
            if launch is not None:
                return tuple(execute(self.name, launch, xs, self.kwargs))
        return self.run_eager(*xs)

    def _prepare(self, key, xs):
        try:
            launch = prepared(self.kernel, xs, self.kwargs)
        except Exception as e:  # noqa: BLE001 - any trace failure: the region's ops run one by one
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(f"torch.compile(backend='neuron'): {self.name} runs op by op: {self.failed}",
                          stacklevel=3)
            return None
        self.launches[key] = weakref.ref(launch)
        self.traced += 1
        # a new input signature is a new program, not a recompile of the graph (Dynamo logs those with
        # TORCH_LOGS=recompiles): said here so a shape that keeps changing shows up
        log.info("%s: program %d for inputs %s", self.name, self.traced,
                 ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for s, d in key))
        return launch


class FusedRegion(_Program):
    """Callable ``(*inputs) -> tuple(outputs)`` for the region's nodes (fx nodes of the graph being compiled)."""

    kernel = graph_formula

    def __init__(self, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node]):
        super().__init__()
        env = {n: Expr(("x", i)) for i, n in enumerate(inputs)}
        for n in nodes:
            args, kwargs = (fx.node.map_arg(a, env.__getitem__) for a in (n.args, n.kwargs))
            env[n] = lower(n.target, args, kwargs)
        self.kwargs = {"exprs": tuple(env[n].node for n in outputs),
                       "out_dtypes": tuple(n.meta["val"].dtype for n in outputs)}
        self.name = "fused:" + "+".join(_short(n) for n in nodes)
        if len(self.name) > 64:
            self.name = self.name[:61] + "..."
        self.run_eager = _subgraph(nodes, inputs, outputs)
        self.__name__ = self.__qualname__ = "fused_region"  # how the graph's generated code names the call


class ForeachRegion(_Program):
    """Callable ``(*inputs) -> tuple(outputs)``: one formula of one input applied to each of several graph inputs
    (``fusion.horizontal_groups``), one program for all of them."""

    def __init__(self, nodes: list[fx.Node]):
        super().__init__()
        node, x = nodes[0], Expr(("x", 0))
        expr = lower(node.target, fx.node.map_arg(node.args, lambda a: x), fx.node.map_arg(node.kwargs, lambda a: x))
        self.kernel = foreach_formula(len(nodes), 1, False)
        self.kwargs = {"expr": expr.node, "out_dtype": node.meta["val"].dtype, "inplace": False}
        self.name = f"fused:{len(nodes)}x{_short(node)}"
        self.eager = [_subgraph([n], n.all_input_nodes, [n]) for n in nodes]
        self.__name__ = self.__qualname__ = "fused_foreach"

    def run_eager(self, *xs):
        return tuple(g(x)[0] for g, x in zip(self.eager, xs))


def _short(node: fx.Node) -> str:
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0]


def _subgraph(nodes, inputs, outputs):
    """The region's nodes as their own graph, run eagerly when called (the eager path). Its GraphModule (code
    generation and compilation of a Python function) is made at the first call: most regions never need it."""
    g = fx.Graph()
    env = {n: g.placeholder(f"x{i}") for i, n in enumerate(inputs)}
    for n in nodes:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output(tuple(env[n] for n in outputs))
    module = []

    def run(*xs):
        if not module:
            module.append(fx.GraphModule(torch.nn.Module(), g))
        return module[0](*xs)
    return run
