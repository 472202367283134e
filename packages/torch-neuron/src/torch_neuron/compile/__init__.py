"""``torch.compile(model, backend="neuron")``: see ``backend`` (Dynamo + AOTAutograd), ``graph`` (the graph
compiler), ``fusion`` (which ops fuse), ``lowering`` (aten ops as formulas) and ``region`` (a fused program)."""

from .backend import backend

__all__ = ["backend"]
