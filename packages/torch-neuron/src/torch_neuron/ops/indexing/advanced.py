"""Advanced indexing: ``x[indices]`` (index.Tensor) and ``x[indices] = values`` (``_index_put_impl_``, which
index_put / index_put_ reach), with integer index tensors, boolean/uint8 masks and full slices (None).

Every index tensor (a k-dim mask counts once: its flat true positions index its k dims merged) becomes an
exact int32 index over its dims (``index32``, negatives wrapped); together they form one linear index over
the indexed dims merged (``sum idx * stride`` on GpSimd, exact below 2**31). The indexed dims are moved in
front (a permute, a no-op when they already lead), merged into one, and rows are gathered with
index_select, or written with scatter / scatter_add. The result layout is torch's: the broadcast index dims
replace adjacent indexed dims in place, and lead when the indexed dims are separated by a slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.library import elementwise as ew
from neuron_kernels.library import movement

from ..core.checks import meta_result, same_device
from ..core.fallback import on_cpu
from ..core.launch import run
from ..core.variants import contig, write_out
from ..tensor.shape import copy_into, movable
from .gather_scatter import _positions, addable, index32

aten = torch.ops.aten


@dataclass
class _Plan:
    dims: list[int]  # the indexed dims of x, in order
    shape: tuple  # broadcast shape of the index tensors
    linear: torch.Tensor  # int32, ``shape``: the flat index over the indexed dims merged (row-major)
    adjacent: bool  # the indexed dims are one run of dims (the index dims then replace them in place)


def _groups(x: torch.Tensor, indices) -> list[tuple[int, int, torch.Tensor | None]]:
    """(first dim, dims covered, index tensor) per non-None index, masks checked against x's shape."""
    groups, d = [], 0
    for idx in indices:
        if idx is None:
            d += 1
            continue
        k = idx.dim() if idx.dtype in (torch.bool, torch.uint8) else 1
        if idx.dtype in (torch.bool, torch.uint8):
            for j, n in enumerate(idx.shape):
                if d + j >= x.dim() or x.shape[d + j] != n:
                    raise IndexError(f"The shape of the mask {list(idx.shape)} at index {j} does not match the "
                                     f"shape of the indexed tensor {list(x.shape)} at index {d + j}")
        groups.append((d, k, idx))
        d += k
    if d > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()} (got {d})")
    return groups


def _meta_indices(x, indices, groups, counts):
    """Long meta placeholders torch's meta function can check: a k-dim mask becomes k index vectors."""
    out, gi = [], 0
    for idx in indices:
        if idx is None:
            out.append(None)
            continue
        _, k, _ = groups[gi]
        if counts[gi] is None:
            out.append(idx)
        else:
            out.extend([torch.empty(counts[gi], dtype=torch.int64)] * k)
        gi += 1
    return out


def _plan(op: str, x: torch.Tensor, indices) -> _Plan:
    indices = [None if i is None else i.to(x.device) for i in indices]  # CPU index tensors are allowed
    groups = _groups(x, indices)
    parts, counts = [], []
    for _, _, idx in groups:
        if idx.dtype in (torch.bool, torch.uint8):
            mask = contig(idx) if idx.dtype == torch.bool else run(op, ew.ne, contig(idx), 0)[0]
            pos = _positions(op, mask) if mask.numel() else torch.empty(0, dtype=torch.int32, device=x.device)
            parts.append(pos)
            counts.append(pos.numel())
        else:
            parts.append(idx)
            counts.append(None)
    meta = meta_result(aten.index.Tensor, x, _meta_indices(x, indices, groups, counts))  # torch's errors
    dims = [d + j for d, k, _ in groups for j in range(k)]
    shape = torch.broadcast_shapes(*[p.shape for p in parts])
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    if meta.numel() == 0:
        return _Plan(dims, shape, None, adjacent)
    stride, linear = 1, None
    for (d, k, idx), part in reversed(list(zip(groups, parts))):
        if idx.dtype not in (torch.bool, torch.uint8):
            part = index32(op, part, x.shape[d], d, wrap=True)
        term = part if stride == 1 else run(op, ew.mul, part, stride)[0]
        linear = term if linear is None else run(op, ew.add, term, linear)[0]
        stride *= math.prod(x.shape[d:d + k])
    if tuple(linear.shape) != tuple(shape):
        linear = contig(linear.expand(shape))
    return _Plan(dims, shape, linear, adjacent)


def _rows(x: torch.Tensor, dims) -> torch.Tensor:
    """x with ``dims`` moved in front (a view)."""
    return x.permute(list(dims) + [d for d in range(x.dim()) if d not in dims])


def _native(x: torch.Tensor, indices) -> bool:
    """Kernels take it: a dtype they move, flat offsets below 2**31, some index tensor (all-None keys are
    views) and no 0-d boolean index (it adds a dim instead of selecting)."""
    tensors = [i for i in indices if i is not None]
    return (movable(x.dtype) is not None and x.numel() < 2**31 and bool(tensors)
            and not any(i.dim() == 0 and i.dtype == torch.bool for i in tensors))


def _result_shape(x, plan: _Plan) -> list[int]:
    rest = [x.shape[d] for d in range(x.dim()) if d not in plan.dims]
    if plan.adjacent:
        a = plan.dims[0]
        return [*x.shape[:a], *plan.shape, *x.shape[plan.dims[-1] + 1:]]
    return [*plan.shape, *rest]


def index(x, indices):
    if not _native(x, indices):
        return on_cpu(aten.index.Tensor, x, indices)
    plan = _plan("index", x, indices)
    shape = _result_shape(x, plan)
    if plan.linear is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    carrier = movable(x.dtype)
    if plan.adjacent:  # [pre, S, post] -> gather along the merged dims in place
        a, b = plan.dims[0], plan.dims[-1] + 1
        pre, post = math.prod(x.shape[:a]), math.prod(x.shape[b:])
        src = contig(x).view(carrier).view(pre, -1, post)
        got = run("index", movement.index_select, src, 1, plan.linear.reshape(-1))[0]
    else:
        moved = _rows(x, plan.dims)
        src = contig(moved).view(carrier).view(math.prod(x.shape[d] for d in plan.dims), -1)
        got = run("index", movement.index_select, src, 0, plan.linear.reshape(-1))[0]
    return got.view(x.dtype).view(shape)


def index_out(x, indices, *, out):
    return write_out(out, index(x, indices))


def _values_rows(values: torch.Tensor, x, plan: _Plan, shape) -> torch.Tensor:
    """values broadcast to the indexing result, laid out [index elements, rest dims] (rest in x's order)."""
    v = values.expand(shape)
    if plan.adjacent:  # [pre..., B..., post...] -> [B..., pre..., post...]
        a, nb = plan.dims[0], len(plan.shape)
        v = v.permute(list(range(a, a + nb)) + list(range(a)) + list(range(a + nb, v.dim())))
    return contig(v).view(math.prod(plan.shape), -1)


def index_put_impl_(x, indices, values, accumulate=False, unsafe=False):
    if values.device.type == "cpu" and values.dim() == 0:
        values = values.to(x.device)  # a CPU scalar tensor is accepted, as on other devices
    args = (x, indices, values, accumulate, unsafe)
    if values.dtype != x.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got {x.dtype} for the "
                           f"destination and {values.dtype} for the source.")
    carrier = addable(x.dtype) if accumulate else movable(x.dtype)
    if carrier is None or not _native(x, indices):
        return on_cpu(aten._index_put_impl_.default, *args)
    same_device(x, values)
    if accumulate and x.dtype in (torch.bfloat16, torch.float16):
        # the scatter rounds into a 16-bit table once per 128 values: accumulate in fp32, round once
        wide = run("index_put_", movement.copy, contig(x), torch.float32)[0]
        index_put_impl_(wide, indices, run("index_put_", movement.copy, contig(values), torch.float32)[0], True)
        return x.copy_(wide)
    plan = _plan("index_put_", x, indices)
    shape = _result_shape(x, plan)
    if values.dim() > len(shape) or any(v not in (1, n) for v, n in zip(reversed(values.shape), reversed(shape))):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {shape}")
    if plan.linear is None:
        return x
    moved = _rows(x, plan.dims)
    rows = math.prod(x.shape[d] for d in plan.dims)
    table = contig(moved).view(carrier).view(rows, -1)
    v = _values_rows(values, x, plan, shape).view(carrier)
    where = contig(plan.linear.reshape(-1, 1).expand(v.shape))  # row index of every value element
    kernel = movement.scatter_add if accumulate else movement.scatter
    got = run("index_put_", kernel, table, 0, where, v)[0]
    copy_into("index_put_", moved, got.view(x.dtype).view(moved.shape))
    return x
