"""Embedding lookups, bags and renorm."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import out_variant
    from .bag import embedding_bag, embedding_bag_forward_only
    from .lookup import embedding, embedding_dense_backward
    from .renorm import embedding_renorm_

    # bag.py
    impl("_embedding_bag_forward_only")(embedding_bag_forward_only)
    impl("_embedding_bag")(embedding_bag)

    # lookup.py
    impl("embedding")(embedding)
    impl("embedding.out")(out_variant(embedding))
    impl("embedding_dense_backward")(embedding_dense_backward)
    impl("embedding_dense_backward.out")(out_variant(embedding_dense_backward))

    # renorm.py
    impl("embedding_renorm_")(embedding_renorm_)
