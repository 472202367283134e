"""Calibration cases, one module per source family; each module lists its cases in ``CASES``."""

from __future__ import annotations

import importlib
import pkgutil


def all_cases():
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            yield from importlib.import_module(f"{__name__}.{mod.name}").CASES
