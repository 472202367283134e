"""Trace-time errors: they name the kernel, the source line, the tile and the limit."""

from neuron_hal.errors import NeuronError


class KernelError(NeuronError, ValueError):
    """A kernel broke a rule while being traced."""
