"""``torch.compile(model, backend="neuron")``: see ``dynamo`` (the backend: Dynamo + AOTAutograd),
``attention`` (hand-written attention to the flash kernel), ``graph`` (the graph compiler), ``fusion`` (which ops
fuse), ``lowering`` (aten ops as formulas), ``region`` (a fused program) and ``device_graph`` (a graph's call as one
device program)."""

from .dynamo import backend

__all__ = ["backend"]
