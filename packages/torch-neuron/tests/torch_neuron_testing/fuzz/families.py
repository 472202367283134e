"""The fuzzed op families, by name (the op_db family is built on first use: it generates PyTorch's samples)."""

from __future__ import annotations

from .casts import CASTS
from .conv import ATTENTION, CONV
from .indexing import INDEXING
from .matmul import MATMUL
from .movement import MOVEMENT
from .nn import LOSSES, NORMS, SOFTMAX
from .pointwise import BINARY, TERNARY, UNARY
from .reductions import REDUCTIONS
from .sorting import SORTING

FAMILIES = {
    "unary": UNARY,
    "binary": BINARY,
    "ternary": TERNARY,
    "reductions": REDUCTIONS,
    "softmax": SOFTMAX,
    "matmul": MATMUL,
    "norms": NORMS,
    "losses": LOSSES,
    "indexing": INDEXING,
    "movement": MOVEMENT,
    "sorting": SORTING,
    "conv_pool": CONV,
    "attention": ATTENTION,
    "casts": CASTS,
}
OPDB = "op_db"
NAMES = tuple(FAMILIES) + (OPDB,)


def family(name: str) -> list:
    if name == OPDB:
        from .opdb import ops

        return ops()
    return FAMILIES[name]
