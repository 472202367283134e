"""Pointwise ops: one kernel call per overload (base), formula programs (expr), and the op tables."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules (the op
    tables of arithmetic, bessel, complex, int64, misc, special register when imported)."""
    from neuron_kernels.library.formula import define_recurrence

    from ..core.registry import impl
    from ..core.variants import inplace_variant, out_variant
    from . import arithmetic, bessel, complex, int64, misc, special  # noqa: F401  (importing registers the tables)
    from .bits import _frexp_out, copysign, frexp, ldexp, nextafter, nextafter_
    from .polynomials import _KINDS, _recurrence, _register

    # bits.py
    impl("nextafter")(nextafter)
    impl("nextafter.out")(out_variant(nextafter))
    impl("nextafter_")(nextafter_)
    impl("copysign.Tensor")(copysign)
    impl("copysign.out")(out_variant(copysign))
    impl("copysign_.Tensor")(inplace_variant(copysign))
    impl("frexp.Tensor")(frexp)
    impl("frexp.Tensor_out")(_frexp_out)
    impl("ldexp.Tensor")(ldexp)
    impl("ldexp.out")(out_variant(ldexp))
    impl("ldexp_")(inplace_variant(ldexp))

    # polynomials.py
    for _op in _KINDS:
        define_recurrence(_op, _recurrence(_KINDS[_op]))
        _register(_op)
