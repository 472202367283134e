"""nonzero_static: the first ``size`` rows of ``nonzero`` (the device kernel in :mod:`.indexing`), padded with
``fill_value`` rows up to ``size``: a fill of the int64 result (a bit-pattern write) and one device copy of the
rows found. Dtypes the device does not hold values of run on the CPU.
"""

from __future__ import annotations

import torch

from ..core.dtypes import device_dtype
from ..core.fallback import on_cpu
from ..core.variants import write_out

aten = torch.ops.aten


def nonzero_static(self, *, size, fill_value=-1):
    size = int(size)
    if size < 0:
        raise RuntimeError("nonzero_static: 'size' must be an non-negative integer")
    if device_dtype(self.dtype) is None or self.numel() >= 2**31:
        return on_cpu(aten.nonzero_static.default, self, size=size, fill_value=fill_value)
    result = torch.full((size, self.dim()), fill_value, dtype=torch.int64, device=self.device)
    if size == 0 or self.dim() == 0 or self.numel() == 0:
        return result  # nothing found can be stored (0-d: rows of no coordinates)
    found = torch.nonzero(self)
    k = min(size, found.shape[0])
    if k:
        result[:k].copy_(found[:k])
    return result


def nonzero_static_out(self, *, size, fill_value=-1, out):
    if out.dtype != torch.int64:
        return on_cpu(aten.nonzero_static.out, self, size=size, fill_value=fill_value, out=out)  # torch's error
    return write_out(out, nonzero_static(self, size=size, fill_value=fill_value))
