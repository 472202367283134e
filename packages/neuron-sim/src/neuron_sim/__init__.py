"""neuron-sim: a NeuronCore that runs in software. Values with the hardware's numerics, timing from
the documented cost model. Registered as the neuron-hal driver ``sim``."""

__version__ = "0.1.0"
