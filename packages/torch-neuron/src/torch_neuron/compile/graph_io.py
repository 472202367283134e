"""An AOTAutograd graph as plain picklable data, and back: what the graph cache (``aot_cache``) keeps of a graph.

The graph compiler (``graph.fuse``) reads each node's traced value (``meta["val"]``: shape, strides, dtype,
device), so a node keeps its value's metadata next to its op, and loading makes fake tensors of it again.
Only what a cached graph can hold exactly is written: aten ops (by qualified name), ``operator`` functions,
placeholders and the output, with constants and nodes as arguments, tensor constants the graph reads (``get_attr``,
up to ``MAX_CONSTANT_BYTES`` each, by value) and static shapes. Anything else (symbolic sizes, higher-order ops
with subgraphs, modules) raises ``Unserializable``: that graph is compiled each time.
"""

from __future__ import annotations

import operator
import pickle
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
MAX_CONSTANT_BYTES = 1 << 20


class Unserializable(Exception):
    """A graph the cache cannot hold exactly; the message says what."""


@dataclass(frozen=True)
class _Ref:
    name: str  # a node of the graph, by name


@dataclass(frozen=True)
class _Tensor:
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    offset: int


@dataclass(frozen=True)
class _Constant:
    value: torch.Tensor  # on the host
    device: torch.device


@dataclass(frozen=True)
class GraphData:
    """The nodes pickled: (op, name, target, args, kwargs, value) per node, in graph order; a get_attr's target a
    _Constant. Kept as bytes (one object, untraced by the garbage collector) by the compiled graph that holds it,
    rather than as thousands of small objects every full collection walks."""

    blob: bytes

    @property
    def nodes(self) -> tuple:
        return pickle.loads(self.blob)


def dump(gm: fx.GraphModule) -> GraphData:
    """``gm``'s graph as data; raises ``Unserializable``."""
    nodes = tuple((n.op, n.name, _target(n, gm), _arg(n.args), _arg(n.kwargs), _value(n.meta.get("val")))
                  for n in gm.graph.nodes)
    try:
        return GraphData(pickle.dumps(nodes, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as e:  # noqa: BLE001 - a constant pickle refuses
        raise Unserializable(f"{type(e).__name__}: {e}") from None


def load(data: GraphData) -> tuple[torch.nn.Module, fx.Graph]:
    """The graph ``dump`` wrote, its values fake tensors again, and the module holding its constants (a
    GraphModule of them is the caller's to make: its code is generated once, after the graph compiler)."""
    with unset_fake_temporarily():
        return _load(data)


def _load(data: GraphData) -> tuple[torch.nn.Module, fx.Graph]:
    graph, env, mode, root = fx.Graph(), {}, FakeTensorMode(), torch.nn.Module()
    for op, name, target, args, kwargs, value in data.nodes:
        args, kwargs = _resolve(args, env), _resolve(kwargs, env)
        if op == "placeholder":
            node = graph.placeholder(name)
        elif op == "output":
            node = graph.output(args[0])
        elif op == "get_attr":
            setattr(root, name, target.value.to(target.device))
            node = graph.get_attr(name)
        else:
            node = graph.create_node(op, _function(target), args, kwargs, name)
        node.meta["val"] = _fake(value, mode)
        env[name] = node
    return root, graph


def _target(n: fx.Node, gm: fx.GraphModule):
    if n.op in ("placeholder", "output"):
        return None
    if n.op == "get_attr":
        return _constant(n, getattr(gm, n.target, None))
    if n.op == "call_function":
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            return ("op", t.namespace, t._opname, t._overloadname)
        if getattr(operator, getattr(t, "__name__", ""), None) is t:
            return ("operator", t.__name__)
    raise Unserializable(f"node {n.name}: {n.op} {n.target!r}")


def _constant(n: fx.Node, t) -> _Constant:
    if n.target != n.name or type(t) is not torch.Tensor or t.is_sparse or t.nbytes > MAX_CONSTANT_BYTES:
        raise Unserializable(f"node {n.name}: get_attr {n.target!r} of {type(t).__name__}")
    with unset_fake_temporarily():  # the compiler runs under AOTAutograd's fake mode
        return _Constant(t.detach().to("cpu", copy=True), t.device)


def _function(target):
    if target[0] == "op":
        _, namespace, name, overload = target
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    return getattr(operator, target[1])


def _arg(a):
    if isinstance(a, fx.Node):
        return _Ref(a.name)
    if isinstance(a, list | tuple):
        return type(a)(_arg(x) for x in a)
    if isinstance(a, dict):
        return {k: _arg(v) for k, v in a.items()}
    if type(a) in _CONSTANTS:
        return a
    raise Unserializable(f"argument {a!r} of type {type(a).__name__}")


def _resolve(a, env):
    if isinstance(a, _Ref):
        return env[a.name]
    if isinstance(a, list | tuple):
        return type(a)(_resolve(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _resolve(v, env) for k, v in a.items()}
    return a


def _value(v):
    if isinstance(v, torch.Tensor):
        if any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset())):
            raise Unserializable(f"a value of symbolic shape {list(v.shape)}")
        return _Tensor(tuple(v.shape), tuple(v.stride()), v.dtype, v.device, v.storage_offset())
    if isinstance(v, list | tuple):
        return tuple(_value(x) for x in v)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise Unserializable(f"a symbolic value {v}")
    return v if type(v) in _CONSTANTS else None


def fake_tensor(mode: FakeTensorMode, shape, stride, dtype: torch.dtype, device: torch.device,
                offset: int = 0) -> FakeTensor:
    """A fake tensor of this metadata: a meta tensor wrapped as one on ``device`` (what the mode itself does for a
    factory call, without dispatching one)."""
    meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if offset:
        extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
        meta = torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)
    return FakeTensor(mode, meta, device)


def _fake(v, mode: FakeTensorMode):
    if isinstance(v, _Tensor):
        return fake_tensor(mode, v.shape, v.stride, v.dtype, v.device, v.offset)
    if isinstance(v, tuple):
        return tuple(_fake(x, mode) for x in v)
    return v
