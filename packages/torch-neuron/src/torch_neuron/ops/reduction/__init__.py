"""Reductions: sums and extremes, index reductions, moments and norms, int64 sums, segment_reduce."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import out_variant
    from .arg import _named_out, argmax, argmin, max_dim, min_dim
    from .segment import segment_reduce
    from .stats import _pair_out, linalg_vector_norm, logsumexp, std, std_mean, var, var_mean
    from .sums import (
        _aminmax_out,
        _one_dim,
        _whole,
        all_dims,
        amax,
        amin,
        aminmax,
        any_dims,
        count_nonzero,
        count_nonzero_one,
        cumsum,
        cumsum_,
        max_all,
        mean_all,
        mean_dim,
        min_all,
        nansum,
        prod_all,
        prod_dim,
        sum_all,
        sum_dim,
    )

    # arg.py
    impl("max.dim")(max_dim)
    impl("min.dim")(min_dim)
    impl("max.dim_max")(_named_out(max_dim, "max", "max_values"))
    impl("min.dim_min")(_named_out(min_dim, "min", "min_indices"))
    for fn, name in ((argmax, "argmax"), (argmin, "argmin")):
        impl(name)(fn)
        impl(f"{name}.out")(out_variant(fn))

    # segment.py
    impl("segment_reduce")(segment_reduce)

    # stats.py
    for fn, name in ((var, "var.correction"), (std, "std.correction")):
        impl(name)(fn)
        impl(f"{name}_out")(out_variant(fn))
    for fn, name in ((var_mean, "var_mean.correction"), (std_mean, "std_mean.correction")):
        impl(name)(fn)
        impl(f"{name}_out")(_pair_out(fn))
    for fn, name in ((logsumexp, "logsumexp"), (linalg_vector_norm, "linalg_vector_norm")):
        impl(name)(fn)
        impl(f"{name}.out")(out_variant(fn))

    # sums.py
    table = {
        sum_dim: ("sum.dim_IntList", "sum.IntList_out"), sum_all: ("sum", "sum.out"),
        mean_dim: ("mean.dim", "mean.out"), mean_all: ("mean", "mean.dtype_out"),
        prod_dim: ("prod.dim_int", "prod.int_out"), prod_all: ("prod", "prod.out"),
        nansum: ("nansum", "nansum.out"), count_nonzero: ("count_nonzero.dim_IntList", "count_nonzero.dim_IntList_out"),
        count_nonzero_one: ("count_nonzero", "count_nonzero.out"), cumsum: ("cumsum", "cumsum.out"),
        amax: ("amax", "amax.out"), amin: ("amin", "amin.out"),
        max_all: ("max", "max.unary_out"), min_all: ("min", "min.unary_out"),
        all_dims: ("all.dims", "all.dims_out"), any_dims: ("any.dims", "any.dims_out"),
        _whole(all_dims): ("all", "all.all_out"), _whole(any_dims): ("any", "any.all_out"),
        _one_dim(all_dims): ("all.dim", "all.out"), _one_dim(any_dims): ("any.dim", "any.out"),
    }
    for fn, (functional, out) in table.items():
        impl(functional)(fn)
        impl(out)(out_variant(fn))
    impl("cumsum_")(cumsum_)
    impl("aminmax")(aminmax)
    impl("aminmax.out")(_aminmax_out)
