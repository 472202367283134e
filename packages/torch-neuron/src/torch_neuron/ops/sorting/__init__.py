"""Sorting and selection: sort/topk/median/mode, unique, scans, searchsorted/bucketize/isin, histc."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import out_variant
    from .hist import histc, histc_out
    from .scan import cummax_helper, cummin_helper, cumprod, cumprod_, cumprod_out, logcumsumexp, logcumsumexp_out
    from .search import (
        _out,
        bucketize,
        bucketize_scalar,
        isin,
        isin_scalar_tensor,
        isin_tensor_scalar,
        searchsorted,
        searchsorted_scalar,
    )
    from .sort import (
        _values_out,
        kthvalue,
        kthvalue_values,
        median_all,
        median_dim,
        mode,
        mode_values,
        nanmedian_all,
        nanmedian_dim,
        sort_default,
        sort_stable,
        sort_values,
        sort_values_stable,
        topk,
        topk_values,
    )
    from .unique import unique, unique2, unique_consecutive, unique_dim

    # hist.py
    impl("histc")(histc)
    impl("histc.out")(histc_out)

    # scan.py
    impl("_cummax_helper")(cummax_helper)
    impl("_cummin_helper")(cummin_helper)
    impl("_logcumsumexp")(logcumsumexp)
    impl("_logcumsumexp.out")(logcumsumexp_out)
    impl("cumprod")(cumprod)
    impl("cumprod.out")(cumprod_out)
    impl("cumprod_")(cumprod_)

    # search.py
    for name, fn in (("searchsorted.Tensor", searchsorted), ("searchsorted.Scalar", searchsorted_scalar),
                     ("bucketize.Tensor", bucketize), ("bucketize.Scalar", bucketize_scalar),
                     ("isin.Tensor_Tensor", isin), ("isin.Tensor_Scalar", isin_tensor_scalar),
                     ("isin.Scalar_Tensor", isin_scalar_tensor)):
        impl(name)(fn)
    for name, fn in (("searchsorted.Tensor_out", searchsorted), ("searchsorted.Scalar_out", searchsorted_scalar),
                     ("bucketize.Tensor_out", bucketize), ("isin.Tensor_Tensor_out", isin),
                     ("isin.Tensor_Scalar_out", isin_tensor_scalar), ("isin.Scalar_Tensor_out", isin_scalar_tensor)):
        impl(name)(_out(fn))

    # sort.py
    impl("sort.stable")(sort_stable)
    impl("sort.values_stable")(sort_values_stable)
    impl("sort")(sort_default)
    impl("sort.values")(sort_values)
    impl("topk")(topk)
    impl("topk.values")(topk_values)
    impl("kthvalue")(kthvalue)
    impl("kthvalue.values")(kthvalue_values)
    impl("median.dim")(median_dim)
    impl("nanmedian.dim")(nanmedian_dim)
    impl("median.dim_values")(_values_out(median_dim))
    impl("nanmedian.dim_values")(_values_out(nanmedian_dim))
    impl("median")(median_all)
    impl("nanmedian")(nanmedian_all)
    impl("median.out")(out_variant(median_all))
    impl("nanmedian.out")(out_variant(nanmedian_all))
    impl("mode")(mode)
    impl("mode.values")(mode_values)

    # unique.py
    impl("unique_dim")(unique_dim)
    impl("_unique2")(unique2)
    impl("_unique")(unique)
    impl("unique_consecutive")(unique_consecutive)
