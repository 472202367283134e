"""The graph cache: AOTAutograd's own cache (``AOTAutogradCache``), kept for the neuron backend in our cache
directory, so a warm process skips AOTAutograd's tracing and partitioning of a graph it compiled before.

Torch looks a Dynamo graph up by the hash of the graph, its inputs' metadata (shapes, strides, dtypes, devices),
the autocast and grad state, AOTAutograd's and Inductor's configuration and torch's version, and keeps the
forward and backward graphs (``output_code.NeuronOutputCode``) with the wrappers that run them. It does not know
our backend: the entries live under ``<program cache>/graphs/<ours>``, where ``<ours>`` digests what else
changes our graphs: torch-neuron's Python sources (the rewrites, the decompositions its ops register), its C++
core's build (the autocast policy), the neuron-hal / neuron-kernels sources and the device profile. Torch writes
an entry whole to a temporary name renamed into place, named by the digest of its content, and readers try
every entry of a key: concurrent processes never see a torn one. Torch keys tensor constants of Dynamo's graph by
their metadata: graphs reading some go to a directory named by the digest of their values.

Everything is scoped to our backend's calls: the configuration (bundled entries, local cache only, the backward
compiled with the forward so its entry is written inside the call) is patched around them, and the directory is
ours only in the thread running one (``AOTAutogradCache._get_tmp_dir`` answers torch's own directory to
everyone else). ``TORCH_NEURON_COMPILE_CACHE=off`` turns it off with the program cache (as do torch's own switches:
``torch._functorch.config.enable_autograd_cache``, ``torch.compiler.config.force_disable_caches``). Hits, misses and
bypasses (graphs the cache cannot hold: ``graph_io``) are counted in ``torch.neuron.metrics()["compile"]``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import pathlib
import threading

import torch
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

from neuron_hal.cache import sources_digest

from .. import program_cache
from ..metrics import record_compile
from . import graph_io

_scope = threading.local()
_torch_dir = AOTAutogradCache._get_tmp_dir.__func__


def _tmp_dir(cls) -> str:
    root = getattr(_scope, "root", None)
    return root if root is not None else _torch_dir(cls)


AOTAutogradCache._get_tmp_dir = classmethod(_tmp_dir)


@functools.cache
def _our_key(profile: str) -> str:
    from .. import _C

    core = pathlib.Path(_C.__file__).parent.name  # the build directory: torch version + source digest
    code = sources_digest("neuron_hal", "neuron_kernels", "torch_neuron")  # the program store computes it too
    return hashlib.sha256(repr((profile, core, code, torch.__version__)).encode()).hexdigest()[:32]


def directory() -> pathlib.Path | None:
    """Where this process's graph entries live, or None when the cache is off."""
    root = program_cache.cache_dir()
    if root is None:
        return None
    from ..runtime import runtime

    return root / "graphs" / _our_key(runtime().profile.fingerprint)


def _constants_key(gm: torch.fx.GraphModule) -> str | None:
    """The digest of the tensor values Dynamo's graph reads as attributes (``get_attr`` of tensors that are
    neither parameters nor buffers: those are AOTAutograd's inputs): torch's key holds their metadata only. "" when
    there are none; None when they are not plain tensors or too large to read for a key."""
    try:
        return _constants_digest(gm)
    except Exception:  # noqa: BLE001 - a value we cannot read for a key: that graph is not cached
        return None


def _constants_digest(gm: torch.fx.GraphModule) -> str | None:
    owned = {id(t) for t in (*gm.parameters(), *gm.buffers())}
    h, total = hashlib.sha256(), 0
    for n in gm.graph.find_nodes(op="get_attr"):
        t = gm
        for part in n.target.split("."):
            t = getattr(t, part, None)
        if not isinstance(t, torch.Tensor) or id(t) in owned:
            continue
        total += t.nbytes
        if type(t) is not torch.Tensor or t.is_sparse or total > graph_io.MAX_CONSTANT_BYTES:
            return None
        h.update(repr((n.target, t.dtype, tuple(t.shape), t.stride())).encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32] if total else ""


@contextlib.contextmanager
def scope(gm: torch.fx.GraphModule):
    """AOTAutograd's cache, configured for and pointed at ours, around our backend's compiling of ``gm``."""
    root, constants = directory(), _constants_key(gm)
    if constants is None:
        root = None  # off for this graph
        record_compile("graph_cache_bypasses")
    elif root is not None and constants:
        root = root / f"constants-{constants}"
    before = dict(counters["aot_autograd"])
    config = torch._functorch.config
    on = root is not None and config.enable_autograd_cache  # a user's switching it off holds for us too
    patch = config.patch(enable_autograd_cache=on, enable_remote_autograd_cache=False, bundled_autograd_cache=True,
                         force_non_lazy_backward_lowering=True)
    outer, _scope.root = getattr(_scope, "root", None), None if root is None else str(root)
    try:
        with patch:
            yield
    finally:
        _scope.root = outer
        after = counters["aot_autograd"]
        for theirs, ours in (("autograd_cache_hit", "graph_cache_hits"), ("autograd_cache_miss", "graph_cache_misses"),
                             ("autograd_cache_bypass", "graph_cache_bypasses")):
            if after[theirs] > before.get(theirs, 0):
                record_compile(ours, after[theirs] - before.get(theirs, 0))
