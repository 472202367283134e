"""Data movement: cat / stack (promotion, empty operands), transpose / permute / expand made contiguous,
flip, roll, repeat, repeat_interleave, tile, pad (constant, reflect, replicate, circular), narrow, split,
tril / triu, diagonal, diag_embed, unfold, rot90, clone of any view."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from .op import Op
from .pointwise import EVERY, FLOATS
from .spec import Case
from .strategies import dim, shapes, tensors


@st.composite
def _one(draw, cap, dtypes=EVERY, min_dims=0, params=None):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(cap, min_dims=min_dims))
    p = params(shape) if params is not None else st.just({})
    return Case((draw(tensors(shape, dtype)),), draw(p))


def moving(name, fn, dtypes=EVERY, min_dims=0, params=None, limit=None, **kw) -> Op:
    """``limit`` caps the input size of ops whose output is many times their input (diag_embed, repeat)."""
    return Op(name, fn, lambda cap: _one(min(cap, limit or cap), dtypes, min_dims, params), **kw)


@st.composite
def _joined(draw, cap):
    """2-4 tensors equal but along ``dim`` (cat) or equal (stack), dtypes possibly mixed; 1-D empty ones are
    legal cat operands anywhere."""
    shape = draw(shapes(cap, min_dims=1))
    d = draw(dim(len(shape))) % len(shape)
    same = draw(st.booleans())
    dtype = draw(st.sampled_from(EVERY))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        size = shape[d] if same else draw(st.sampled_from((shape[d], 1, 0, 3)))
        part_shape = shape[:d] + (size,) + shape[d + 1:]
        part_dtype = dtype if draw(st.booleans()) else draw(st.sampled_from(EVERY))
        parts.append(draw(tensors(part_shape, part_dtype)))
    if not same and draw(st.booleans()):
        parts.append(draw(tensors((0,), dtype)))
    return Case(tuple(parts), {"dim": d, "stack": same and draw(st.booleans())})


def _join(*ts, dim, stack):
    return torch.stack(ts, dim) if stack else torch.cat(ts, dim)


def _dims_perm(shape):
    return st.permutations(range(len(shape))).map(lambda p: {"dims": tuple(p)})


def _flip_dims(shape):
    return st.lists(st.integers(0, max(len(shape) - 1, 0)), unique=True, max_size=len(shape)).map(
        lambda ds: {"dims": tuple(ds)})


def _roll(shape):
    if not shape:
        return st.fixed_dictionaries({"shifts": st.sampled_from((1, -3, 0)), "dims": st.none()})
    return st.fixed_dictionaries({"shifts": st.sampled_from((1, -1, 3, 130, -7, 0)),
                                  "dims": st.one_of(st.none(), dim(len(shape)))})


def _reps(shape):
    return st.lists(st.sampled_from((1, 2, 3)), min_size=len(shape), max_size=len(shape) + 1).map(
        lambda r: {"repeats": tuple(r)})


def _pad(shape):
    k = min(len(shape), 3)
    return st.fixed_dictionaries({"pad": st.lists(st.sampled_from((0, 1, 2, 3)), min_size=2, max_size=2 * k).filter(
        lambda p: len(p) % 2 == 0).map(tuple), "mode": st.sampled_from(("constant", "reflect", "replicate",
                                                                            "circular")),
        "value": st.sampled_from((0.0, -1.5, 2.0))})


def _pad_fn(x, pad, mode, value):
    return F.pad(x, pad, mode, value if mode == "constant" else None)


def _narrow(shape):
    return dim(len(shape)).flatmap(lambda d: st.integers(0, shape[d]).flatmap(
        lambda start: st.integers(0, shape[d] - start).map(lambda n: {"dim": d, "start": start, "length": n})))


def _diag(shape):
    return st.fixed_dictionaries({"diagonal": st.sampled_from((0, 1, -1, 5, -130))})


def _unfold(shape):
    return dim(len(shape)).flatmap(lambda d: st.fixed_dictionaries(
        {"dimension": st.just(d), "size": st.integers(0, max(shape[d] if shape else 1, 0)),
         "step": st.sampled_from((1, 2, 3, 7))}))


def _interleave(shape):
    return st.fixed_dictionaries({"repeats": st.sampled_from((1, 2, 3)), "dim": st.one_of(
        st.none(), dim(len(shape)))})


def _split(shape):
    return st.fixed_dictionaries({"split_size": st.sampled_from((1, 2, 3, 128)), "dim": dim(len(shape))})


MOVEMENT = [
    Op("cat_stack", _join, _joined),
    moving("permute_contiguous", lambda x, dims: x.permute(dims).contiguous(), params=_dims_perm),
    moving("transpose_contiguous", lambda x: x.transpose(0, -1).contiguous(), min_dims=1),
    moving("clone", torch.clone),
    moving("contiguous_channels_last", lambda x: x.contiguous(memory_format=torch.channels_last), min_dims=4),
    moving("reshape_flat", lambda x: x.reshape(-1)),
    moving("flip", lambda x, dims: torch.flip(x, dims), params=_flip_dims),
    moving("roll", lambda x, shifts, dims: torch.roll(x, shifts, dims), params=_roll),
    moving("repeat", lambda x, repeats: x.repeat(repeats), params=_reps, limit=2048),
    moving("tile", lambda x, repeats: x.tile(repeats), params=_reps, limit=2048),
    moving("repeat_interleave", lambda x, repeats, dim: torch.repeat_interleave(x, repeats, dim), params=_interleave),
    moving("pad", _pad_fn, FLOATS, min_dims=1, params=_pad),
    moving("narrow_contiguous", lambda x, **p: x.narrow(**p).contiguous(), min_dims=1, params=_narrow),
    moving("split", lambda x, split_size, dim: tuple(s.contiguous() for s in torch.split(x, split_size, dim)),
           min_dims=1, params=_split),
    moving("tril", lambda x, diagonal: torch.tril(x, diagonal), min_dims=2, params=_diag),
    moving("triu", lambda x, diagonal: torch.triu(x, diagonal), min_dims=2, params=_diag),
    moving("diagonal_contiguous", lambda x, diagonal: torch.diagonal(x, diagonal).contiguous(), min_dims=2,
           params=_diag),
    moving("diag_embed", lambda x: torch.diag_embed(x), min_dims=1, limit=300),
    moving("unfold_contiguous", lambda x, **p: x.unfold(**p).contiguous(), min_dims=1, params=_unfold),
    moving("rot90", lambda x: torch.rot90(x, 1, (0, 1)), min_dims=2),
]
