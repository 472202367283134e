"""The autotuner and its on-disk cache: one JSON file per (kernel, version, profile, signature).

``tune(kernel, *args, **constants)`` searches every combination of the kernel's tunables in a
fixed order (the product of the declared choices, first tunable outermost), traces each one and
times it with the driver's cost model (``driver.estimate``: device time without running).
Configurations that fail to trace (a ``KernelError`` such as an SBUF overflow) are skipped and
listed with their error. The fastest configuration (ties: the earliest) is recorded; later calls
of the kernel that do not pass the tunables use it (see :mod:`.jit`).

Files are written whole to a temporary name and renamed into place, so concurrent writers never
leave a torn entry (the last complete write wins) and readers never see one. The directory is
``$NEURON_KERNELS_TUNE_CACHE``, else ``~/.cache/neuron-kernels/tune``: plain JSON, easy to
inspect, copy and share (``neuron-tune list / show / run / clear``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import sys
import time

from neuron_hal.cache import write_atomic

from .errors import KernelError


def cache_dir() -> pathlib.Path:
    env = os.environ.get("NEURON_KERNELS_TUNE_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "neuron-kernels" / "tune"


def entry_path(signature_key: tuple) -> pathlib.Path:
    name, version, profile = signature_key[:3]
    digest = hashlib.sha256(repr(signature_key).encode()).hexdigest()[:20]
    return cache_dir() / f"{name}-v{version}-{profile}-{digest}.json"


def _read(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RuntimeError(f"tuning cache entry {path} is unreadable ({e}); delete it to retune") from None


def best_config(kernel, signature_key: tuple, profile) -> dict | None:
    """The recorded best tunables for this signature, or None when it was never tuned."""
    path = entry_path(signature_key)
    try:
        entry = _read(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RuntimeError(f"tuning cache entry {path} is unreadable ({e}); delete it to retune") from None
    if entry.get("key") != repr(signature_key):
        return None  # a hash collision: treat as untuned
    config = entry["config"]
    unknown = set(config) - set(kernel.tunables)
    if unknown:
        raise RuntimeError(f"tuning cache entry {path} names tunables {sorted(unknown)} that kernel "
                           f"{kernel.name!r} v{kernel.version} does not declare; delete it to retune")
    return config


def describe_signature(signature_key: tuple) -> str:
    """``a: bfloat16[4096, 4096], dim=1`` for a signature key's arguments."""
    parts = []
    for part in signature_key[3]:
        if len(part) == 2:
            name, spec = part
            parts.append(f"{name}: {spec.dtype}[{', '.join(map(str, spec.shape))}]")
        else:
            parts.append(f"{part[0]}={part[2]!r}")
    return ", ".join(parts)


def record(signature_key: tuple, config: dict, device_ns: float, trials: list[dict]) -> pathlib.Path:
    """Write the best configuration atomically."""
    path = entry_path(signature_key)
    entry = {"key": repr(signature_key), "kernel": signature_key[0], "version": signature_key[1],
             "profile": signature_key[2], "signature": describe_signature(signature_key), "config": config,
             "device_ns": device_ns, "trials": trials, "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomic(path, json.dumps(entry, indent=1, sort_keys=True))
    return path


def entries(pattern: str | None = None) -> list[tuple[pathlib.Path, dict]]:
    """Cached entries (path, entry) sorted by file name. ``pattern`` keeps those whose file name
    matches it as a glob or contains it, or whose kernel name or signature contains it."""
    root = cache_dir()
    found = []
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            entry = _read(path)
        except (OSError, RuntimeError) as e:
            entry = {"error": str(e)}
        names = (path.name, str(entry.get("kernel", "")), str(entry.get("signature", "")))
        if pattern is None or path.match(pattern) or any(pattern in n for n in names):
            found.append((path, entry))
    return found


# -- the search ------------------------------------------------------------------------------------
def configurations(kernel) -> list[dict]:
    """Every combination of the kernel's tunables, in the fixed search order."""
    names = list(kernel.tunables)
    return [dict(zip(names, values)) for values in itertools.product(*(kernel.tunables[n] for n in names))]


class _Progress:
    """A one-line progress bar on stderr: configs done/total and the best so far."""

    def __init__(self, label: str, total: int, enabled: bool):
        self.label, self.total, self.enabled = label, total, enabled
        self.done, self.start = 0, time.monotonic()
        self.tty = enabled and sys.stderr.isatty()

    def update(self, best: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 20
        fill = width * self.done // max(self.total, 1)
        line = (f"tune {self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} configs, "
                f"best {best}, {time.monotonic() - self.start:.1f}s")
        if self.tty:
            sys.stderr.write("\r" + line)
            if self.done == self.total:
                sys.stderr.write("\n")
        elif self.done == self.total:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def tune(kernel, *args, profile=None, driver=None, force: bool = False, progress: bool = True, **kwargs) -> dict:
    """The best tunables of ``kernel`` for these arguments (arrays or TensorSpecs, and constants).

    Returns the recorded configuration when this kernel version, profile and signature were tuned
    before (unless ``force``); otherwise searches every configuration exhaustively, records the best
    with its device time and all trials, and returns it. ``driver`` defaults to the simulator for
    ``profile`` (default: the driver's profile, else ``$NEURON_DEVICE_PROFILE``, else trn2); it must
    have a cost model (``estimate``).
    """
    from neuron_hal import Profile, get_driver, get_profile

    passed = sorted(set(kwargs) & set(kernel.tunables))
    if passed:
        raise KernelError(f"tune {kernel.name!r}: {passed} are tunables, chosen by the search; do not pass them")
    if driver is None:
        prof = profile if isinstance(profile, Profile) else get_profile(profile)
        driver = get_driver("sim", prof)
    else:
        prof = driver.profile if profile is None else profile if isinstance(profile, Profile) else get_profile(profile)
        if prof.name != driver.profile.name:
            raise KernelError(f"tune {kernel.name!r}: profile {prof.name} differs from the driver's "
                              f"{driver.profile.name}")
    key = kernel.tuning_key(args, kwargs, prof)  # the key the JIT looks up
    if not force:
        cached = best_config(kernel, key, prof)
        if cached is not None and all(cached.get(k) in v for k, v in kernel.tunables.items()):
            return cached
    configs = configurations(kernel)
    bar = _Progress(kernel.name, len(configs), progress)
    best, best_ns, trials = None, float("inf"), []
    for config in configs:
        try:
            program = kernel.trace(*args, profile=prof, **kwargs, **config)
        except KernelError as e:
            trials.append({"config": config, "error": str(e)})
            bar.update(_fmt(best, best_ns))
            continue
        report = driver.estimate(0, driver.load(0, program))
        if report is None:
            raise KernelError(f"tune {kernel.name!r}: driver {type(driver).__name__} has no cost model (estimate)")
        ns = float(report.device_ns)
        trials.append({"config": config, "device_ns": ns})
        if ns < best_ns:
            best, best_ns = config, ns
        bar.update(_fmt(best, best_ns))
    if best is None:
        errors = "; ".join(t["error"].splitlines()[0] for t in trials[:3])
        raise KernelError(f"tune {kernel.name!r}: every one of {len(configs)} configurations failed to trace "
                          f"({errors})")
    record(key, best, best_ns, trials)
    return best


def _fmt(config, ns) -> str:
    if config is None:
        return "-"
    return f"{ns / 1e3:.2f} us ({', '.join(f'{k}={v}' for k, v in config.items())})"
