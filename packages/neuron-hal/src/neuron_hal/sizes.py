"""Byte sizes as people write them in environment variables: ``65536``, ``1e9``, ``64M``, ``64MiB``, ``1.5 GB``.

Suffixes are binary multiples whichever spelling is used (K/KB/KiB = 1024, M = 1024**2, G, T), as the
memory sizes they set are; a value that does not parse is an error naming the variable and what it accepts.
"""

from __future__ import annotations

import math
import os
import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")


def parse_bytes(text: str, name: str) -> int:
    """``text`` as a whole number of bytes (rounded down); ``name`` is what the error calls it."""
    m = _SIZE.match(text)
    value = float(m.group(1)) * _UNITS[m.group(2).lower()] if m else math.nan
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{name}={text!r} is not a positive byte size: write bytes (65536, 1e9) or a size with a "
                         f"K, M, G or T suffix (64M, 1.5GiB)")
    return int(value)


def env_bytes(name: str) -> int | None:
    """The byte size environment variable ``name`` sets, or None when it is unset or empty."""
    text = os.environ.get(name)
    return parse_bytes(text, name) if text and text.strip() else None
