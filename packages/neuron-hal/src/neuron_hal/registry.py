"""Finding drivers: entry-point group ``neuron_hal.drivers``, chosen by ``NEURON_HAL_DRIVER``."""

from __future__ import annotations

import functools
import os
import warnings
from importlib.metadata import entry_points

from .driver import Driver
from .errors import DriverNotFoundError
from .profiles import Profile, get_profile

GROUP = "neuron_hal.drivers"
# drivers that are planned but absent: asking for one says so rather than only "not installed"
_NOT_BUILT = {"nrt": ". The Trainium hardware driver 'nrt' is not built yet: neuron-nrt holds only the lowering of "
                     "programs to NKI (neuron_nrt.to_nki); use 'sim'"}


@functools.cache
def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def driver_names() -> list[str]:
    """Names of every installed driver (nothing is imported)."""
    return sorted(_entry_points())


@functools.cache
def load_driver_class(name: str) -> type[Driver]:
    eps = _entry_points()
    if name not in eps:
        raise DriverNotFoundError(
            f"no neuron HAL driver {name!r}; installed: {', '.join(sorted(eps)) or 'none'} "
            f"(entry-point group {GROUP!r}){_NOT_BUILT.get(name, '')}"
        )
    return eps[name].load()


def select_driver_class(name: str | None = None) -> type[Driver]:
    """The driver named, else ``$NEURON_HAL_DRIVER``, else the highest-priority one that finds devices."""
    name = name or os.environ.get("NEURON_HAL_DRIVER")
    if name:
        return load_driver_class(name)
    candidates = []
    for n in driver_names():
        try:
            candidates.append(load_driver_class(n))
        except Exception as e:  # one broken driver must not hide the others, but it is reported
            warnings.warn(f"neuron HAL driver {n!r} failed to load: {e!r}", RuntimeWarning, stacklevel=2)
    for cls in sorted(candidates, key=lambda c: -c.priority):
        if cls.priority >= 0 and cls.available():
            return cls
    raise DriverNotFoundError(
        f"no neuron HAL driver finds devices; installed: {', '.join(driver_names()) or 'none'}. "
        "Install neuron-sim for simulated devices, or set NEURON_HAL_DRIVER."
    )


_instances: dict[tuple[str, str], Driver] = {}


def get_driver(name: str | None = None, profile: Profile | str | None = None) -> Driver:
    """The process-wide driver instance for (driver, profile)."""
    cls = select_driver_class(name)
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    key = (cls.name, prof.name)
    if key not in _instances:
        _instances[key] = cls(prof)
    return _instances[key]
