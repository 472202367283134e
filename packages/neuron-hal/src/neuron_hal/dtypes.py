"""Element types of device memory (docs/hardware.md §2.6) and their numpy storage types."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """A device element type: value is (name, bytes, kind). kind: f=float, i=signed, u=unsigned, b=bool."""

    __hash__ = object.__hash__  # members are singletons: identity hash (Enum's hashes the name in Python)

    float32 = ("float32", 4, "f")
    bfloat16 = ("bfloat16", 2, "f")
    float16 = ("float16", 2, "f")
    float8_e4m3 = ("float8_e4m3", 1, "f")
    float8_e4m3fn = ("float8_e4m3fn", 1, "f")
    float8_e5m2 = ("float8_e5m2", 1, "f")
    int8 = ("int8", 1, "i")
    uint8 = ("uint8", 1, "u")
    int16 = ("int16", 2, "i")
    uint16 = ("uint16", 2, "u")
    int32 = ("int32", 4, "i")
    uint32 = ("uint32", 4, "u")
    # 64-bit integers and bool exist in HBM (the runtime knows INT64/UINT64); engines do not compute on
    # 64-bit values, DMA moves them.
    int64 = ("int64", 8, "i")
    uint64 = ("uint64", 8, "u")
    bool_ = ("bool", 1, "b")

    @property
    def itemsize(self) -> int:
        return self.value[1]

    @property
    def kind(self) -> str:
        return self.value[2]

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_fp8(self) -> bool:
        return self.name.startswith("float8")

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    def __repr__(self) -> str:
        return f"dt.{self.name}"

    def __str__(self) -> str:
        return self.value[0]

    @classmethod
    def of(cls, x: DType | str | np.dtype | type) -> DType:
        """Accept a DType, its name, or a numpy dtype (including ml_dtypes' bfloat16/fp8)."""
        if isinstance(x, DType):
            return x
        if isinstance(x, str) and x in _BY_NAME:
            return _BY_NAME[x]
        try:
            return _FROM_NUMPY[np.dtype(x)]
        except (TypeError, KeyError):
            raise TypeError(
                f"unsupported device dtype {x!r}; supported: {', '.join(d.value[0] for d in cls)}"
            ) from None


_NUMPY = {
    DType.float32: np.dtype(np.float32),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float16: np.dtype(np.float16),
    DType.float8_e4m3: np.dtype(ml_dtypes.float8_e4m3),
    DType.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.int8: np.dtype(np.int8),
    DType.uint8: np.dtype(np.uint8),
    DType.int16: np.dtype(np.int16),
    DType.uint16: np.dtype(np.uint16),
    DType.int32: np.dtype(np.int32),
    DType.uint32: np.dtype(np.uint32),
    DType.int64: np.dtype(np.int64),
    DType.uint64: np.dtype(np.uint64),
    DType.bool_: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}
_BY_NAME = {d.value[0]: d for d in DType} | {d.name: d for d in DType}

# Engine compute types (docs/hardware.md §2.6): Vector/Scalar/GpSimd compute on these, 64-bit types only move.
ENGINE_DTYPES = frozenset(d for d in DType if d.itemsize <= 4)
# TensorE inputs (NC-v3: cFP8, FP16, BF16, TF32, FP32).
MATMUL_DTYPES = frozenset(
    {DType.float32, DType.bfloat16, DType.float16, DType.float8_e4m3, DType.float8_e4m3fn, DType.float8_e5m2}
)
