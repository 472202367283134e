"""neuron-hal: the contract between Trainium devices and the software above them.

Device profiles (:mod:`.profiles`), the instruction set (:mod:`.isa`), programs (:mod:`.program`),
the rules (:mod:`.validate`), the driver interface (:mod:`.driver`) and the driver registry
(:mod:`.registry`). Imports neither torch nor numba.
"""

from . import isa
from .driver import DeviceInfo, Driver, ExecutionReport, MemoryStats
from .dtypes import DType
from .errors import (
                     DeviceOutOfMemoryError,
                     DriverNotFoundError,
                     InvalidAddressError,
                     InvalidDeviceError,
                     NeuronError,
                     ProgramError,
)
from .isa import AP, Act, Alu, Engine, Space
from .profiles import PROFILES, TRN1, TRN2, TRN3, Profile, get_profile
from .program import Program, TensorArg
from .registry import driver_names, get_driver
from .validate import validate

__version__ = "0.1.0"

__all__ = [
    "AP", "Act", "Alu", "DType", "DeviceInfo", "DeviceOutOfMemoryError", "Driver", "DriverNotFoundError",
    "Engine", "ExecutionReport", "InvalidAddressError", "InvalidDeviceError", "MemoryStats", "NeuronError",
    "PROFILES", "Profile", "Program", "ProgramError", "Space", "TRN1", "TRN2", "TRN3", "TensorArg",
    "driver_names", "get_driver", "get_profile", "isa", "validate",
]
