"""PyTorch's parallelism tools, unchanged, on the ``neuron`` c10d backend (2 ranks): DDP and FSDP2 training
of a small GPT equal to single-device training on the neuron device, FSDP2 with a bf16 mixed-precision
policy, activation checkpointing, DTensor tensor parallelism of an MLP and an attention block, and a
distributed checkpoint (DCP) save / load round trip.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch_neuron_testing import multiprocess

from torch_neuron.models.gpt import GPT, GPTConfig, batches, markov_tokens

pytestmark = pytest.mark.timeout(600)

DEV = "neuron"
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
BATCH, SEQ, STEPS = 4, 8, 3


def _data():
    """One batch, STEPS times: the loss then falls every step, whatever the batch."""
    return list(batches(markov_tokens(CFG.vocab_size, 2048), BATCH, SEQ, 1)) * STEPS


def _train(model, data, rank, world, reduce_loss):
    """Losses of STEPS SGD steps; each rank trains on its slice of every batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for x, y in data:
        x, y = x.chunk(world)[rank].to(DEV), y.chunk(world)[rank].to(DEV)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if reduce_loss:
            loss = loss.detach().clone()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses


def _reference():
    """Single-device training on the neuron device: losses and final parameters (on the CPU)."""
    torch.manual_seed(0)
    model = GPT(CFG).to(DEV)
    losses = _train(model, _data(), 0, 1, False)
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _model():
    torch.manual_seed(0)
    return GPT(CFG).to(DEV)


def _ddp(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model())
    losses = _train(model, _data(), rank, world, True)
    return losses, {k.removeprefix("module."): v.detach().cpu() for k, v in model.state_dict().items()}


def _full_state(model):
    """The FSDP2 model's parameters gathered in full, on the CPU (every rank)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
            for k, v in model.state_dict().items()}


def _fsdp(rank, world, mixed, reshard, checkpointed):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(DEV, (world,))
    model = _model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard, **({"mp_policy": policy} if mixed else {})}
    for i, block in enumerate(model.blocks):
        if checkpointed:
            block = model.blocks[i] = checkpoint_wrapper(block)
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    losses = _train(model, _data(), rank, world, True)
    state = _full_state(model)
    return losses, {k.replace("._checkpoint_wrapped_module", ""): v for k, v in state.items()}


@pytest.fixture(scope="module")
def reference():
    return _reference()


def _assert_matches(results, reference, rtol, atol):
    ref_losses, ref_state = reference
    for losses, state in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=rtol, atol=atol)
        assert state.keys() == ref_state.keys()
        for k in ref_state:
            torch.testing.assert_close(state[k], ref_state[k], rtol=rtol, atol=atol, msg=k)


def test_ddp_matches_single_device(reference):
    _assert_matches(multiprocess.run(_ddp, 2), reference, rtol=1e-4, atol=1e-5)


def test_fsdp2_with_activation_checkpointing_matches_single_device(reference):
    _assert_matches(multiprocess.run(_fsdp, 2, False, True, True), reference, rtol=1e-4, atol=1e-5)


def test_fsdp2_bf16_mixed_precision(reference):
    """bf16 parameters in compute, float32 reductions, parameters kept after forward: close to float32
    training (bf16's 8 mantissa bits bound the difference), and the loss falls."""
    results = multiprocess.run(_fsdp, 2, True, False, False)
    ref_losses, _ = reference
    for losses, _ in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=3e-2, atol=0)
        assert losses[2] < losses[1] < losses[0]


class Attention(nn.Module):
    """Multi-head causal self-attention with separate q / k / v projections (the usual TP layout): heads
    are split between ranks, so the head count comes from the local projection width."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim) for _ in range(3))
        self.wo = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


def _tensor_parallel(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from torch_neuron.models.gpt import MLP

    mesh = init_device_mesh(DEV, (world,))
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32)
    out = {}
    for name, module, plan in [
        ("mlp", MLP(CFG), {"fc": ColwiseParallel(), "proj": RowwiseParallel()}),
        ("attention", Attention(32, 4), {"wq": ColwiseParallel(), "wk": ColwiseParallel(),
                                         "wv": ColwiseParallel(), "wo": RowwiseParallel()}),
    ]:
        reference = copy.deepcopy(module).to(DEV)
        ref_y = reference(x.to(DEV))
        ref_y.square().sum().backward()
        tp = parallelize_module(module.to(DEV), mesh, plan)
        y = tp(x.to(DEV))
        y.square().sum().backward()
        torch.testing.assert_close(y.cpu(), ref_y.cpu(), rtol=1e-4, atol=1e-5)
        for (n, p), (_, q) in zip(tp.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.grad.full_tensor().cpu(), q.grad.cpu(), rtol=1e-4, atol=1e-5, msg=n)
        out[name] = type(tp.state_dict()[next(iter(plan)) + ".weight"]).__name__
    return out


def test_tensor_parallel_mlp_and_attention():
    for kinds in multiprocess.run(_tensor_parallel, 2):
        assert kinds == {"mlp": "DTensor", "attention": "DTensor"}


def _dcp_round_trip(rank, world, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEV, (world,))
    model = _model()
    fully_shard(model, mesh=mesh)
    _train(model, _data()[:1], rank, world, False)
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    torch.manual_seed(1)  # different weights: the load must overwrite all of them
    fresh = GPT(CFG).to(DEV)
    fully_shard(fresh, mesh=mesh)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=path)
    fresh.load_state_dict(state["model"])
    saved, loaded = _full_state(model), _full_state(fresh)
    for k in saved:
        torch.testing.assert_close(loaded[k], saved[k], rtol=0, atol=0, msg=k)
    return sorted({p.to_local().device.type for p in fresh.parameters()})


def test_dcp_save_load_round_trip(tmp_path):
    assert multiprocess.run(_dcp_round_trip, 2, str(tmp_path / "ckpt")) == [["neuron"]] * 2
