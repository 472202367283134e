"""The machinery every op family uses: launches (and the prepared-launch cache), the aten library handle and
registration helpers, argument checks and device constants, out=/in-place variants, the CPU fallback path,
host<->device copies, and PyTorch's decompositions for ops without a kernel."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from .copy import copy_from, copy_from_and_resize, copy_from_and_resize_lazy, copy_from_lazy, local_scalar_dense

    # copy.py
    lib.impl("_copy_from", copy_from, "PrivateUse1")
    lib.impl("_copy_from_and_resize", copy_from_and_resize, "PrivateUse1")
    lib.impl("_local_scalar_dense", local_scalar_dense, "PrivateUse1")
    for key in ("Conjugate", "Negative"):
        lib.impl("_copy_from", copy_from_lazy, key)
        lib.impl("_copy_from_and_resize", copy_from_and_resize_lazy, key)
