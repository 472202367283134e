"""neuron-nrt: running neuron-hal programs on Trainium hardware.

Built: :mod:`.lower`, a HAL ``Program`` lowered to the source of one ``@nki.jit`` kernel in NKI's current API.
Not built yet: compiling that source to a NEFF, the Neuron runtime binding (``nrt.h``), its test double and the
``nrt`` driver; :func:`driver` raises saying so.
"""

from .lower import LOWERING, LoweringError, to_nki

__version__ = "0.1.0"
__all__ = ["LOWERING", "LoweringError", "driver", "to_nki"]


def driver(*args, **kwargs):
    """The ``nrt`` hardware driver: not built yet."""
    raise NotImplementedError("the neuron-hal 'nrt' hardware driver is not built yet: neuron-nrt has only the "
                              "lowering of programs to NKI (neuron_nrt.to_nki); use the 'sim' driver")
