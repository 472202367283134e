"""The on-disk cache directory shared by the layers above the HAL, and how entries are written to it.

Drivers keep there what they derive from programs and would otherwise derive again in every process (the sim's
schedule of a compiled graph's merged program); the kernel program store and torch-neuron's graph cache use the
same helpers. ``set_cache_dir(None)`` (the default) keeps everything in the process. Entries are content
addressed, so processes share them without locks: each is written whole under a temporary name and renamed into
place, and an unreadable entry is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import pathlib
import sys
import tempfile

_root: pathlib.Path | None = None


def set_cache_dir(path: str | os.PathLike | None) -> None:
    global _root
    _root = None if path is None else pathlib.Path(path)


def cache_dir() -> pathlib.Path | None:
    return _root


def write_atomic(path: pathlib.Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@functools.cache
def sources_digest(*modules: str) -> str:
    """SHA-256 over the source files of the given packages/modules (sorted by path): a cache entry derived by
    their code is addressed by it, so editing or upgrading them never reads a stale entry."""
    h = hashlib.sha256()
    for name in modules:
        module = sys.modules.get(name) or __import__(name)
        root = pathlib.Path(inspect.getfile(module))
        files = sorted(root.parent.rglob("*.py")) if root.name == "__init__.py" else [root]
        for f in files:
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()
