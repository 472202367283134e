"""Matching ops on Dynamo's graph, where one op appears as a function (``torch.matmul``, ``operator.mul``) or as
a method call (``x.softmax(...)``): what the rewrites (``attention``, ``norms``) share."""

from __future__ import annotations

import torch
import torch.fx as fx


def is_call(node: fx.Node, functions: tuple, methods) -> bool:
    """Whether ``node`` calls one of ``functions`` or a method named in ``methods`` (a name or a tuple)."""
    methods = (methods,) if isinstance(methods, str) else methods
    return (node.op == "call_function" and node.target in functions) or (
        node.op == "call_method" and node.target in methods)


def only_user(node: fx.Node) -> fx.Node | None:
    """The one node using ``node``'s value; None when it has none or several (then it cannot be fused away)."""
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def value_of(node) -> torch.Tensor | None:
    """The (fake) tensor Dynamo traced for ``node``: its shape, dtype, device and requires_grad."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    return value if isinstance(value, torch.Tensor) else None
