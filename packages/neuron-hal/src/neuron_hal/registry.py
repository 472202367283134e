"""Finding drivers: entry-point group ``neuron_hal.drivers``, chosen by ``NEURON_HAL_DRIVER``."""

from __future__ import annotations

import functools
import os
from importlib.metadata import entry_points

from .driver import Driver
from .errors import DriverNotFoundError
from .profiles import Profile, get_profile

GROUP = "neuron_hal.drivers"


@functools.cache
def driver_classes() -> dict[str, type[Driver]]:
    """Every installed driver class by name."""
    found = {}
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep.load()
    return found


def driver_names() -> list[str]:
    return sorted(driver_classes())


def select_driver_class(name: str | None = None) -> type[Driver]:
    """The driver named, else ``$NEURON_HAL_DRIVER``, else the highest-priority one that finds devices."""
    classes = driver_classes()
    name = name or os.environ.get("NEURON_HAL_DRIVER")
    if name:
        if name not in classes:
            raise DriverNotFoundError(
                f"no neuron HAL driver {name!r}; installed: {', '.join(sorted(classes)) or 'none'} "
                f"(entry-point group {GROUP!r})"
            )
        return classes[name]
    for cls in sorted(classes.values(), key=lambda c: -c.priority):
        if cls.priority >= 0 and cls.available():
            return cls
    raise DriverNotFoundError(
        f"no neuron HAL driver finds devices; installed: {', '.join(sorted(classes)) or 'none'}. "
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
