"""Random numbers: the distributions' in-place samplers and multinomial."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import out_variant
    from .distributions import (
        _dropout_out,
        bernoulli,
        bernoulli_float,
        bernoulli_tensor,
        native_dropout,
        native_dropout_backward,
        normal_,
        normal_float_tensor,
        normal_tensor_float,
        normal_tensor_tensor,
        random_all,
        random_from,
        random_to,
        uniform_,
    )
    from .multinomial import multinomial

    # distributions.py
    impl("uniform_")(uniform_)
    impl("normal_")(normal_)
    for fn, name in ((normal_tensor_float, "normal.Tensor_float"), (normal_float_tensor, "normal.float_Tensor"),
                     (normal_tensor_tensor, "normal.Tensor_Tensor")):
        impl(name)(fn)
        impl(f"{name}_out")(out_variant(fn))
    impl("bernoulli_.float")(bernoulli_float)
    impl("bernoulli_.Tensor")(bernoulli_tensor)
    impl("bernoulli")(bernoulli)
    impl("random_.from")(random_from)
    impl("random_.to")(random_to)
    impl("random_")(random_all)
    impl("native_dropout")(native_dropout)
    impl("native_dropout.out")(_dropout_out)
    impl("native_dropout_backward")(native_dropout_backward)
    impl("native_dropout_backward.out")(out_variant(native_dropout_backward))
    impl("bernoulli.out")(out_variant(bernoulli))

    # multinomial.py
    impl("multinomial")(multinomial)
    impl("multinomial.out")(out_variant(multinomial))
