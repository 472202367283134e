"""Indexing: gather/scatter, advanced indexing, index updates, reducing scatters, put/masked_scatter, nonzero."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .advanced import index, index_out, index_put_impl_
    from .flat import masked_scatter_, put_
    from .gather_scatter import (
        _register_scatter,
        gather,
        gather_out,
        index_select,
        index_select_out,
        masked_select,
        masked_select_out,
        nonzero,
        nonzero_out,
    )
    from .nonzero_static import nonzero_static, nonzero_static_out
    from .scatter_reduce import (
        _register_scatter_with,
        index_reduce_,
        index_reduce_functional,
        index_reduce_out,
        scatter_reduce,
        scatter_reduce_,
        scatter_reduce_out,
    )
    from .update import (
        index_add_out,
        index_copy_out,
        index_fill_scalar_,
        index_fill_tensor_,
        repeat_interleave,
        take,
        take_out,
    )

    # advanced.py
    impl("index.Tensor")(index)
    impl("index.Tensor_out")(index_out)
    impl("_index_put_impl_")(index_put_impl_)

    # flat.py
    impl("put_")(put_)
    impl("masked_scatter_")(masked_scatter_)

    # gather_scatter.py
    impl("index_select")(index_select)
    impl("index_select.out")(index_select_out)
    impl("gather")(gather)
    impl("gather.out")(gather_out)
    _register_scatter("scatter", "src", "src_out", False)
    _register_scatter("scatter", "value", "value_out", False)
    _register_scatter("scatter_add", "default", "out", True)
    impl("nonzero")(nonzero)
    impl("nonzero.out")(nonzero_out)
    impl("masked_select")(masked_select)
    impl("masked_select.out")(masked_select_out)

    # nonzero_static.py
    impl("nonzero_static.out")(nonzero_static_out)
    impl("nonzero_static")(nonzero_static)

    # scatter_reduce.py
    impl("scatter_reduce.two")(scatter_reduce)
    impl("scatter_reduce.two_out")(scatter_reduce_out)
    impl("scatter_reduce_.two")(scatter_reduce_)
    _register_scatter_with("reduce")
    _register_scatter_with("value_reduce")
    impl("index_reduce")(index_reduce_functional)
    impl("index_reduce_")(index_reduce_)
    impl("index_reduce.out")(index_reduce_out)

    # update.py
    impl("index_add.out")(index_add_out)
    impl("index_copy.out")(index_copy_out)
    impl("index_fill_.int_Scalar")(index_fill_scalar_)
    impl("index_fill_.int_Tensor")(index_fill_tensor_)
    impl("take")(take)
    impl("take.out")(take_out)
    impl("repeat_interleave.Tensor")(repeat_interleave)
