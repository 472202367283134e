"""The op_db family: PyTorch's OpInfo samples (their argument structure: targets, indices, options) with
edge values written into their floating tensors, for breadth over every op_db entry.

A case names the entry, the sample (by index in the seeded generation the op_db harness uses) and the edge
values; samples are generated once per (entry, dtype) and cloned per case."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch.utils import _pytree as pytree

from .. import opinfo
from .. import transfer as tr
from ..exclusions import load
from .op import Op
from .spec import Case, literal
from .values import edges

DTYPES = (torch.float32, torch.bfloat16)
MAX_SAMPLES = 64  # the first samples of an entry: the generators' later ones repeat their structure


@functools.cache
def entries(dtype: torch.dtype) -> dict:
    """op_db entries comparable on the CPU for ``dtype``: not skipped by PyTorch's test_compare_cpu (random
    or uninitialized outputs), not already listed as failing in opinfo_exclusions.toml."""
    listed = load().get(f"op_db.{str(dtype).removeprefix('torch.')}", {})
    out = {}
    for op in opinfo.ops_for(dtype):
        key = opinfo.op_key(op)
        if key in listed or opinfo.op_policy(op, dtype).skip:
            continue
        out[key] = op
    return out


@functools.cache
def _samples(key: str, dtype: torch.dtype) -> tuple:
    op = entries(dtype)[key]
    try:
        return tuple(s for _, s, _ in opinfo.samples(op, dtype, MAX_SAMPLES))
    except Exception:  # a generator that needs something this machine lacks
        return ()


@functools.cache
def _placements(key: str, dtype: torch.dtype) -> list:
    count = len(_samples(key, dtype))
    return opinfo._placements(entries(dtype)[key], dtype, count - 1, count) if count else []


def _float_leaves(tree) -> list:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]


@dataclass(frozen=True)
class Sample:
    """Sample ``index`` of entry ``key`` for ``dtype``, with ``marks`` ((floating leaf, storage position,
    value)) written into its floating tensors' storages. Builds (input, args, kwargs, output processing)."""

    key: str
    dtype: torch.dtype
    index: int
    marks: tuple = ()

    def build(self):
        s = _samples(self.key, self.dtype)[self.index]
        tree = tr.clone_cpu((s.input, tuple(s.args), dict(s.kwargs)))
        leaves = _float_leaves(tree)
        for leaf, pos, value in self.marks if leaves else ():
            t = leaves[leaf % len(leaves)]
            n = t.untyped_storage().nbytes() // t.element_size()
            if n:
                with torch.no_grad():
                    torch.as_strided(t, (n,), (1,), 0)[pos % n] = value
        return tree + (s.output_process_fn_grad,)

    def placement(self):
        """The sample built for the meta device (where a tensor stays on the CPU, the op wants it there)."""
        metas = _placements(self.key, self.dtype)
        if metas[self.index] is None:
            return None
        m = metas[self.index]
        return (m.input, tuple(m.args), dict(m.kwargs), None)

    def __repr__(self) -> str:
        marks = f", marks={literal(self.marks)}" if self.marks else ""
        return f"Sample({self.key!r}, {self.dtype}, {self.index}{marks})"


@st.composite
def _case(draw, key, dtypes):
    dtype = draw(st.sampled_from([d for d in dtypes if key in entries(d)]))
    count = len(_samples(key, dtype))
    if not count:
        return Case(())
    index = draw(st.integers(0, count - 1))
    mark = st.tuples(st.integers(0, 7), st.integers(0, 4096), st.sampled_from(edges(dtype)))
    return Case((Sample(key, dtype, index, tuple(draw(st.lists(mark, max_size=3)))),))


def _run(entry):
    def fn(*tree):
        if not tree:  # the entry has no samples here
            return None
        inp, args, kwargs, process = tree[0]
        return process(entry(inp, *args, **kwargs))
    return fn


def _mean_of_pair(spread):
    """The float64 arbiter of var_mean / std_mean entries: the spread, and torch.mean over the same dims (the
    CPU's Welford mean of [inf, 1] is NaN; the mean is inf)."""
    def fn(*tree):
        inp, args, kwargs, process = tree[0]
        dim, keepdim = kwargs.get("dim"), kwargs.get("keepdim", False)
        return process((spread(inp, *args, **kwargs), torch.mean(inp, dim, keepdim=keepdim)))
    return fn


def _norm_mean(op, mean):
    """The float64 arbiter of native_layer_norm / native_group_norm: the op's (out, mean, rstd) with the mean as
    torch.mean of the normalized elements (its Welford update makes the mean of a group holding inf NaN, in float64
    too; torch.mean gives inf). ``mean(input, *args)``: that mean in the op's shape."""
    def fn(*tree):
        inp, args, kwargs, process = tree[0]
        out, _, rstd = op(inp, *args, **kwargs)
        return process((out, mean(inp, *args), rstd))
    return fn


def _layer_mean(x, normalized_shape, *_):
    return x.mean(tuple(range(x.ndim - len(normalized_shape), x.ndim)), keepdim=True)


def _group_mean(x, weight, bias, n, c, hw, group, *_):
    return x.reshape(n, group, c // group * hw).mean(-1)


REFERENCES = {"var_mean": _mean_of_pair(torch.var), "var_mean.unbiased": _mean_of_pair(torch.var),
              "std_mean": _mean_of_pair(torch.std), "std_mean.unbiased": _mean_of_pair(torch.std),
              "native_layer_norm": _norm_mean(torch.native_layer_norm, _layer_mean),
              "native_group_norm": _norm_mean(torch.native_group_norm, _group_mean)}


def ops() -> list[Op]:
    """One Op per op_db entry comparable in any of :data:`DTYPES`."""
    keys = sorted(set().union(*(entries(d) for d in DTYPES)))
    first = {k: next(entries(d)[k] for d in DTYPES if k in entries(d)) for k in keys}
    return [Op(f"op_db:{k}", _run(first[k]), lambda cap, k=k: _case(k, DTYPES), random=True,
               reseed=lambda e=first[k]: opinfo._other_seed(e), reference=REFERENCES.get(k)) for k in keys]
