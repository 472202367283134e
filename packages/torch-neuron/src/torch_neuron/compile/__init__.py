"""``torch.compile(model, backend="neuron")``: see ``dynamo`` (the backend: Dynamo + AOTAutograd),
``attention`` (hand-written attention to the flash kernel), ``graph`` (the graph compiler), ``fusion`` (which ops
fuse), ``lowering`` (aten ops as formulas), ``region`` (a fused program) and ``device_graph`` (a graph's call as one
device program); ``untraced`` keeps Dynamo out of the backend's own code."""

from . import untraced
from .dynamo import backend

untraced.register()  # before Dynamo sees a frame of ours (the backend is imported when torch.compile names it)

__all__ = ["backend"]
