"""Moving sample trees to ``neuron`` (keeping every tensor's exact layout), comparing device results with
CPU results, and counting the CPU fallbacks an op call takes."""

from __future__ import annotations

import math

import torch
from torch.utils import _pytree as pytree

NEURON = torch.device("neuron")


def copy_tensor(t: torch.Tensor, device: torch.device, storages: dict | None = None) -> torch.Tensor:
    """A copy of a CPU tensor on ``device`` that is the same view of a copy of its whole storage: same
    sizes, strides, storage offset and requires_grad, and the storage around the view is there too
    (``Tensor.to`` would make non-dense views contiguous and drop what ``as_strided`` may reach).
    Tensors sharing a storage (given the same ``storages`` dict) share the copy, so aliasing is kept."""
    if t.device.type != "cpu" or t.layout != torch.strided:
        return t.to(device)
    src = t.detach().resolve_conj().resolve_neg()
    storages = {} if storages is None else storages
    key = (src.untyped_storage().data_ptr(), src.dtype, device)
    if key not in storages:
        n = src.untyped_storage().nbytes() // src.element_size()
        storages[key] = (src, torch.as_strided(src, (n,), (1,), 0).to(device, copy=True))  # src keeps ptr alive
    out = storages[key][1].as_strided(src.shape, src.stride(), src.storage_offset())
    if t.requires_grad:
        out.requires_grad_()
    return out


def _device_name(v) -> bool:
    return isinstance(v, str) and (v == "cpu" or v.startswith("cpu:"))


def to_neuron(tree, placement=None, key=None, memo: dict | None = None):
    """Tensors, ``torch.device`` objects and "cpu" device strings of a sample tree, moved to neuron.

    ``placement`` is the same sample built for the meta device, when available: a tensor that is still on
    the CPU there is one the op wants on the CPU (``tensor_split``'s indices), so it stays there. Tensors
    sharing a storage share it on the device too (``memo``).
    """
    memo = {} if memo is None else memo
    if isinstance(tree, torch.Tensor):
        keep = isinstance(placement, torch.Tensor) and placement.device.type == "cpu"
        return copy_tensor(tree, torch.device("cpu") if keep else NEURON, memo)
    if isinstance(tree, torch.device):
        return NEURON if tree.type == "cpu" else tree
    if _device_name(tree):
        return "neuron"
    if isinstance(tree, list | tuple) and not hasattr(tree, "_fields"):
        aligned = isinstance(placement, list | tuple) and len(placement) == len(tree)
        places = placement if aligned else [None] * len(tree)
        return type(tree)(to_neuron(x, p, memo=memo) for x, p in zip(tree, places))
    if isinstance(tree, dict):
        places = placement if isinstance(placement, dict) else {}
        return {k: to_neuron(v, places.get(k), k, memo) for k, v in tree.items()}
    return tree


def mentions_neuron(tree) -> bool:
    """Does a (moved) sample name the neuron device: a neuron tensor, device object or device string?"""
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            leaf = leaf.device
        if isinstance(leaf, torch.device) and leaf.type == "neuron" or isinstance(leaf, str) and leaf == "neuron":
            return True
    return False


def clone_cpu(tree, memo: dict | None = None):
    """An independent CPU copy of a sample tree (same layouts, aliasing kept)."""
    memo = {} if memo is None else memo
    if isinstance(tree, torch.Tensor):
        return copy_tensor(tree, torch.device("cpu"), memo)
    if isinstance(tree, list | tuple) and not hasattr(tree, "_fields"):
        return type(tree)(clone_cpu(x, memo) for x in tree)
    if isinstance(tree, dict):
        return {k: clone_cpu(v, memo) for k, v in tree.items()}
    return tree


def identical(a, b) -> bool:
    """Bitwise-equal results (NaN equal to NaN): is a CPU op deterministic across seeds?"""
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    except Exception:  # results assert_close does not take (a string, a device): plain equality
        try:
            return bool(a == b)
        except Exception:
            return False
    return True


def fallback_counts() -> dict[str, int]:
    return dict(torch.neuron.metrics()["fallback"])


def fallback_delta(before: dict[str, int]) -> set[str]:
    """The ops that took the CPU fallback since ``before``."""
    return {op for op, n in torch.neuron.metrics()["fallback"].items() if n != before.get(op, 0)}


def _is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def _leaf_close(actual, expected, rtol: float, atol: float, where: str, on_device: bool = True) -> None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{where}: expected a tensor, neuron returned {type(actual).__name__}")
        if on_device and expected.device.type == "cpu" and actual.device.type != "neuron":
            raise AssertionError(f"{where}: the result is on {actual.device}, not on the neuron device")
        tol = (rtol, atol) if _is_float(expected) else (0.0, 0.0)  # integer/bool results are exact
        torch.testing.assert_close(actual.detach().cpu(), expected.detach(), rtol=tol[0], atol=tol[1],
                                   equal_nan=True, check_stride=False, msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, float) and isinstance(actual, float):
        if not (math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol)
                or (math.isnan(actual) and math.isnan(expected)) or actual == expected):
            raise AssertionError(f"{where}: {actual!r} != {expected!r} (rtol={rtol}, atol={atol})")
    elif type(actual) is not type(expected) or actual != expected:
        raise AssertionError(f"{where}: neuron gave {actual!r}, the CPU {expected!r}")


def assert_matches(actual, expected, rtol: float, atol: float, what: str = "output", inputs=False) -> None:
    """``actual`` (neuron) equals ``expected`` (CPU): same tree structure, tensors on neuron and close
    within ``rtol``/``atol`` (floating) or equal (integer, bool and non-tensor leaves). For ``inputs``
    (after the call) only tensors count, wherever they are: device arguments differ on purpose."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if inputs:
        keep = [i for i, e in enumerate(e_leaves) if isinstance(e, torch.Tensor)]
        a_leaves, e_leaves = [a_leaves[i] for i in keep], [e_leaves[i] for i in keep]
    if a_spec != e_spec:
        raise AssertionError(f"{what}: neuron returned structure {a_spec}, the CPU {e_spec}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        _leaf_close(a, e, rtol, atol, what if len(e_leaves) == 1 else f"{what}[{i}]", on_device=not inputs)


def assert_same_metadata(actual, expected, what: str = "output") -> None:
    """For outputs whose values are not comparable (random, uninitialized): structure, shapes, dtypes."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        raise AssertionError(f"{what}: neuron returned structure {a_spec}, the CPU {e_spec}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor) or (a.shape, a.dtype) != (e.shape, e.dtype):
                got = (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
                raise AssertionError(f"{what}[{i}]: neuron gave {got}, the CPU {(tuple(e.shape), e.dtype)}")
            if e.device.type == "cpu" and a.device.type != "neuron":
                raise AssertionError(f"{what}[{i}]: the result is on {a.device}, not on the neuron device")
