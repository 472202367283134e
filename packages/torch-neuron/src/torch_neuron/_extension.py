"""Build (once) and load the C++ core with torch's cpp_extension tooling.

The build directory is keyed by the torch version and a digest of the sources and their location (ninja
records absolute paths, so two checkouts sharing one directory would rebuild each other's objects), under
``$TORCH_NEURON_BUILD_DIR`` (default ``~/.cache/torch-neuron``), so a second run or a CI cache restores it
without rebuilding.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")


def _sources(csrc: Path = CSRC) -> list[Path]:
    return sorted(p for p in csrc.iterdir() if p.suffix in (".cpp", ".h"))


def build_dir(csrc: Path = CSRC, prefix: str = "torch") -> Path:
    digest = hashlib.sha256(str(csrc.resolve()).encode())
    for p in _sources(csrc):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    root = Path(os.environ.get("TORCH_NEURON_BUILD_DIR", Path.home() / ".cache" / "torch-neuron"))
    path = root / f"{prefix}-{torch.__version__}-{digest.hexdigest()[:16]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load(csrc: Path = CSRC, name: str = "torch_neuron_C", prefix: str = "torch"):
    """The extension built from the sources in ``csrc`` (the core's by default; torch_neuron.distributed
    builds its own from its own directory, under a build directory named by ``prefix``)."""
    from torch.utils import cpp_extension

    path = build_dir(csrc, prefix)
    with open(path / "build.flock", "w") as held:
        # cpp_extension's own lock is a file that outlives a killed build and then blocks every later
        # import forever; an flock dies with its holder, and whoever holds it may clear that stale file
        fcntl.flock(held, fcntl.LOCK_EX)
        (path / "lock").unlink(missing_ok=True)
        with _own_ninja_first(), _announced(path, name):
            return cpp_extension.load(
                name=name,
                sources=[str(p) for p in _sources(csrc) if p.suffix == ".cpp"],
                build_directory=str(path),
                extra_cflags=["-O2", "-DTORCH_NEURON", "-DUSE_KINETO"],  # torch's own build defines it: its
                # profiler headers (the PrivateUse1 kineto registry, csrc/Kineto.cpp) are only declared with it
                extra_include_paths=[str(Path(torch.__file__).with_name("include") / "kineto")],
                verbose=bool(os.environ.get("TORCH_NEURON_BUILD_VERBOSE")),
            )


@contextlib.contextmanager
def _announced(path: Path, name: str):
    """Say so on stderr when the extension is compiled rather than loaded (the first ``import torch`` of a checkout,
    or after its C++ sources or torch changed: minutes on a small machine, which would otherwise pass in silence)."""
    if (path / f"{name}.so").exists():
        yield
        return
    start = time.monotonic()
    print(f"torch-neuron: compiling its C++ core {name} (once per checkout and torch version; a few minutes on 2 "
          f"cores) in {path} ...", file=sys.stderr, flush=True)
    yield
    print(f"torch-neuron: {name} built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _own_ninja_first():
    """cpp_extension runs the ``ninja`` it finds on PATH. Another ninja version (a system one, for a process
    started with another PATH) reads the build directory's log as foreign and rebuilds everything, and the next
    process with this environment's ninja rebuilds it back: the ninja installed next to this interpreter goes
    first, whatever PATH the process was given."""
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old
