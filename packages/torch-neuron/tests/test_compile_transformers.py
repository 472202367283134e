"""``torch.compile(backend="neuron")`` on Hugging Face causal LMs: tiny zoo architectures (torch_neuron_testing/zoo.py)
compiled on the device give the CPU's eager logits and gradients (torch_neuron_testing/zoo_compile.py; the whole
mapping is ``python bench/zoo_compile.py``, table in docs/zoo_compile.md), and the compiler fixes those runs
needed, each on its own."""

from __future__ import annotations

import os

import pytest
import torch

DEV = "neuron"
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    torch.neuron.reset_metrics()
    yield
    torch._dynamo.reset()


def graphs() -> int:
    counts = torch.neuron.metrics()["compile"]
    return counts.get("inference_graphs", 0) + counts.get("forward_graphs", 0)


def _with_graph_break(x):
    a = (x * 2.0).exp() + 1.0
    if a.sum().item() > 0:  # .item(): a graph break, run eagerly (the op's kernel is our Python)
        a = a * 3.0 - 1.0
    return (a.sigmoid() * 0.5 + a).sum(dim=-1)


def test_backend_code_run_between_graphs_is_not_traced():
    """Eager ops between a model's graphs enter the kernels' Python: Dynamo must run it, not compile it (it did:
    a graph per kernel launch, hundreds for a model with graph breaks)."""
    x = torch.randn(6, 10)
    got = torch.compile(_with_graph_break, backend="neuron")(x.to(DEV))
    torch.testing.assert_close(got.cpu(), _with_graph_break(x), **TOL)
    assert graphs() == 2  # the model's two graphs, none of ours


def test_models_of_the_package_stay_traceable():
    import torch._dynamo.trace_rules as trace_rules

    from torch_neuron.compile import untraced
    from torch_neuron.models.gpt import GPT
    from torch_neuron.ops.core import launch

    assert "torch_neuron.ops" in untraced.skipped_modules() and "neuron_sim" in untraced.skipped_modules()
    assert trace_rules.check(launch.execute)
    assert not trace_rules.check(GPT.forward)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
def test_fused_region_of_empty_tensors_runs_eagerly(shape):
    """A region whose tensors are empty has no device memory to launch on (the launch failed)."""
    def f(x, y):
        return (x.sigmoid() * y + 1.0).exp() * (x > 0)
    x, y = torch.randn(shape), torch.randn(shape)
    got = torch.compile(f, backend="neuron")(x.to(DEV), y.to(DEV))
    assert got.shape == shape and torch.neuron.metrics()["compile"]["fused_regions"] == 1


def _attention_then_unread_in_place_update(q, k, v, idx):
    att = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v
    out = torch.zeros(4, att[0].numel(), device=q.device)
    out.index_add_(0, idx, att.flatten(1))  # an in-place method whose result nobody reads (an MoE's combine)
    return out


def test_attention_rewrite_keeps_in_place_updates_nobody_reads():
    """The attention rewrite ran a dead-code pass over Dynamo's graph, which dropped ``index_add_`` (a method call
    with no user): the MoE's combined output stayed zeros (deepseek_v3 with eager attention)."""
    q, k, v = torch.randn(3, 2, 5, 8), torch.randn(3, 2, 5, 8), torch.randn(3, 2, 5, 8)
    idx = torch.tensor([2, 0, 2])
    got = torch.compile(_attention_then_unread_in_place_update, backend="neuron")(
        *(t.to(DEV) for t in (q, k, v, idx)))
    assert torch.neuron.metrics()["compile"]["attention_fused"] == 1
    torch.testing.assert_close(got.cpu(), _attention_then_unread_in_place_update(q, k, v, idx), **TOL)


# Each a regression of a fix above as the zoo runs it, or of the rewrites' matches on real models: (arch, attention)
ARCHS = [
    ("llama", "eager"),  # hand-written attention and RMSNorm both rewritten to their kernels
    ("deepseek_v3", "eager"),  # attention rewritten next to an MoE's unread index_add_ (the dead-code pass)
    ("dbrx", None),  # graph breaks in its MoE: Dynamo traced the kernels run between graphs (and crashed)
]


@pytest.mark.parametrize("arch, attn", ARCHS)
def test_compiled_zoo_architecture_matches_cpu(arch, attn):
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny configs are built locally: nothing may be downloaded
    from torch_neuron_testing import zoo_compile

    result = zoo_compile.run(arch, control=False, attn=attn)
    assert result.passed, f"{arch}: {result.reason}"
    assert result.compile.get("backward_graphs", 0) > 0
    if attn == "eager":
        assert result.compile.get("attention_fused", 0) > 0
