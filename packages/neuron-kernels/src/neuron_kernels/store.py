"""A content-addressed on-disk store of traced programs, shared by processes.

A kernel with a store (``kernel.store = ProgramStore(path)``) looks a trace up there before tracing and
writes what it traced. An entry is addressed by the SHA-256 of everything its program depends on: the
kernel's name and version, the profile, the argument shapes, dtypes and constants (its trace key), the
values a kernel factory captured, and a fingerprint of the code that traces it (the sources of neuron_hal,
neuron_kernels and the package defining the kernel), so editing a kernel or upgrading a package never
reads a stale program. Entries are written whole
to a temporary name and renamed into place: concurrent writers never tear an entry, readers never see a
partial one, and an unreadable entry is a miss that the next write replaces. A program is kept as its canonical
JSON (``Program.canonical``), so a load takes its digest from the text read instead of encoding it again; an
entry whose text does not hash to the digest written with it is a miss. Only programs that passed validation
are written (the tracer validates each), so a loaded program is known to pass for the profile of its address.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys

from neuron_hal.cache import sources_digest, write_atomic
from neuron_hal.program import Program


def _code_digest(module: str) -> str | None:
    """The fingerprint of neuron_hal, neuron_kernels and the package defining a kernel (its module alone
    when that package is a namespace package); None when there is no source file to read."""
    for name in (module.split(".")[0], module):
        if getattr(sys.modules.get(name), "__file__", None):
            return sources_digest("neuron_hal", "neuron_kernels", name)
    return None


class ProgramStore:
    """Programs on disk under ``root``, with hit/miss/write counters of this process."""

    def __init__(self, root: str | os.PathLike):
        self.root = pathlib.Path(root)
        self.hits = self.misses = self.writes = 0

    def address(self, kernel, key: tuple) -> str | None:
        """The entry's address, or None when the trace may depend on more than the address can say: a
        kernel made by a factory whose captured values print without their content (``<... at 0x...>``)."""
        captured = repr([c.cell_contents for c in kernel.fn.__closure__ or ()])
        if " at 0x" in captured:
            return None
        code = _code_digest(kernel.fn.__module__)
        if code is None:
            return None
        # the defining function too: kernels of one name in two modules (elementwise.sub, wide_int.sub) differ
        fn = (kernel.fn.__module__, kernel.fn.__qualname__)
        return hashlib.sha256(repr((kernel.name, kernel.version, fn, key, captured, code)).encode()).hexdigest()

    def _path(self, kernel, address: str) -> pathlib.Path:
        return self.root / f"{kernel.name}-{address[:32]}.json"

    def load(self, kernel, key: tuple) -> Program | None:
        address = self.address(kernel, key)
        if address is None:
            return None
        try:
            entry = json.loads(self._path(kernel, address).read_text())
            if entry["address"] != address:
                raise ValueError("address mismatch")
            program = Program.from_canonical(entry["program"], entry["meta"])
            if program.digest != entry["digest"]:  # the text is what was written (validated when traced)
                raise ValueError("digest mismatch")
        except (OSError, ValueError, KeyError, TypeError):  # absent, torn by a crash, or another format
            self.misses += 1
            return None
        self.hits += 1
        return program

    def save(self, kernel, key: tuple, program: Program) -> None:
        address = self.address(kernel, key)
        if address is None:
            return
        try:
            text = json.dumps({"address": address, "kernel": kernel.name, "program": program.canonical(),
                               "digest": program.digest, "meta": program.meta})
            write_atomic(self._path(kernel, address), text)
        except (OSError, TypeError):  # a read-only or full cache directory costs a retrace, nothing else
            return
        self.writes += 1


_default: ProgramStore | None = None


def default_store() -> ProgramStore | None:
    return _default


def set_default_store(store: ProgramStore | None) -> None:
    """Where every kernel without a store of its own (``kernel.store``) looks traces up and keeps them, or
    None: traces live in this process only."""
    global _default
    _default = store
