"""Tuned kernel configurations: an on-disk cache, one JSON file per (kernel, version, profile, signature).

Files are written whole to a temporary name and renamed into place, so concurrent writers never
leave a torn entry (the last complete write wins) and readers never see one. The directory is
``$NEURON_KERNELS_TUNE_CACHE``, else ``~/.cache/neuron-kernels/tune``: plain JSON, easy to
inspect, copy and share.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile


def cache_dir() -> pathlib.Path:
    env = os.environ.get("NEURON_KERNELS_TUNE_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "neuron-kernels" / "tune"


def entry_path(signature_key: tuple) -> pathlib.Path:
    name, version, profile = signature_key[:3]
    digest = hashlib.sha256(repr(signature_key).encode()).hexdigest()[:20]
    return cache_dir() / f"{name}-v{version}-{profile}-{digest}.json"


def best_config(kernel, signature_key: tuple, profile) -> dict | None:
    """The recorded best tunables for this signature, or None when it was never tuned."""
    path = entry_path(signature_key)
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise RuntimeError(f"tuning cache entry {path} is unreadable ({e}); delete it to retune") from None
    if entry.get("key") != repr(signature_key):
        return None  # a hash collision: treat as untuned
    config = entry["config"]
    unknown = set(config) - set(kernel.tunables)
    if unknown:
        raise RuntimeError(f"tuning cache entry {path} names tunables {sorted(unknown)} that kernel "
                           f"{kernel.name!r} v{kernel.version} does not declare; delete it to retune")
    return config


def record(signature_key: tuple, config: dict, device_ns: float, trials: list[dict]) -> pathlib.Path:
    """Write the best configuration atomically."""
    path = entry_path(signature_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"key": repr(signature_key), "kernel": signature_key[0], "version": signature_key[1],
             "profile": signature_key[2], "config": config, "device_ns": device_ns, "trials": trials}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
