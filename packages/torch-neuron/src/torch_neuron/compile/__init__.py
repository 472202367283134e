"""``torch.compile(model, backend="neuron")``: see ``dynamo`` (the backend: Dynamo + AOTAutograd), ``graph`` (the graph
compiler), ``fusion`` (which ops fuse), ``lowering`` (aten ops as formulas) and ``region`` (a fused program)."""

from .dynamo import backend

__all__ = ["backend"]
