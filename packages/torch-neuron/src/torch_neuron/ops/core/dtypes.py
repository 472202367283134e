"""torch dtypes on the device: the torch -> HAL dtype map and the float dtypes the engines compute in."""

from __future__ import annotations

import torch

from neuron_hal import DType

TORCH_TO_DTYPE = {
    torch.float32: DType.float32, torch.bfloat16: DType.bfloat16, torch.float16: DType.float16,
    torch.float8_e4m3fn: DType.float8_e4m3fn, torch.float8_e5m2: DType.float8_e5m2,
    torch.int8: DType.int8, torch.uint8: DType.uint8, torch.int16: DType.int16, torch.uint16: DType.uint16,
    torch.int32: DType.int32, torch.uint32: DType.uint32, torch.int64: DType.int64, torch.uint64: DType.uint64,
    torch.bool: DType.bool_,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_TO_DTYPE.items()}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # the engines' float compute dtypes


def device_dtype(dtype: torch.dtype) -> DType | None:
    """The device dtype of a torch dtype; None where the engines cannot compute (float64, complex)."""
    return TORCH_TO_DTYPE.get(dtype)
