"""The machinery every op family uses: launches (and the prepared-launch cache), the aten library handle and
registration helpers, argument checks and device constants, out=/in-place variants, the CPU fallback path,
host<->device copies, and PyTorch's decompositions for ops without a kernel."""

from __future__ import annotations


def register(lib) -> None:
    """Register this family's ops: its modules register when imported, or through their ``register``."""
    from . import copy
    copy.register(lib)
