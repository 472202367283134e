"""Copying shape ops (cat, flip, roll, tril/triu, pad, ...) and complex views."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .complex_views import conj_physical, conj_physical_, conj_physical_out, view_as_complex, view_as_real
    from .shape import _register_tri, _register_tri_indices, cat, cat_out, constant_pad_nd, flip, roll

    # complex_views.py
    impl("view_as_real")(view_as_real)
    impl("view_as_complex")(view_as_complex)
    impl("conj_physical_")(conj_physical_)
    impl("conj_physical")(conj_physical)
    impl("conj_physical.out")(conj_physical_out)

    # shape.py
    impl("cat")(cat)
    impl("cat.out")(cat_out)
    impl("flip")(flip)
    impl("roll")(roll)
    _register_tri("tril", True)
    _register_tri("triu", False)
    _register_tri_indices("tril_indices")
    _register_tri_indices("triu_indices")
    impl("constant_pad_nd")(constant_pad_nd)
