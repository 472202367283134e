"""torch-neuron: the PyTorch backend for the `neuron` device.

Not built yet (issue 4). Until then importing it says so instead of pretending to be a device.
"""

__version__ = "0.0.1"


def __getattr__(name):
    raise NotImplementedError(
        f"torch_neuron.{name}: the PyTorch backend is not built yet (tracked in issue 4); "
        "programs can run on simulated NeuronCores through neuron_hal today"
    )
