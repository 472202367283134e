"""neuron-kernels: the tile kernel language, kernel library and autotuner.

Not built yet (issue 3): this package only reserves its place in the layering. It reaches devices
through neuron_hal alone, never by importing the simulator.
"""

__version__ = "0.0.1"
