"""Module plumbing on neuron, as on CUDA: Module.to / .neuron() and back keep the Parameter objects (tied
weights stay tied, an optimizer built before the move still holds the model's parameters), buffers and
grads move along, state_dict, and printing."""

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("move", [lambda m: m.to("neuron"), lambda m: m.neuron(), lambda m: m.to(device="neuron:1"),
                                  lambda m: m.to(torch.device("neuron"))])
def test_to_neuron_and_back_keeps_parameter_objects(move):
    ref = _net()
    model = copy.deepcopy(ref)
    params = list(model.parameters())
    assert move(model) is model
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert all(p.device.type == "neuron" and isinstance(p, nn.Parameter) and p.requires_grad for p in params)
    assert all(b.device.type == "neuron" for b in model.buffers())
    model.cpu()
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    for a, b in zip(ref.state_dict().values(), model.state_dict().values()):
        assert b.device.type == "cpu"
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_tied_weights_stay_tied():
    from torch_neuron.models import GPT, GPTConfig

    model = GPT(GPTConfig())
    count = len(list(model.parameters()))
    model.to("neuron")
    assert model.lm_head.weight is model.wte.weight and len(list(model.parameters())) == count
    model.to("cpu")
    assert model.lm_head.weight is model.wte.weight


def test_grads_move_with_their_parameters():
    model = _net()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    model.to("neuron")
    for p in model.parameters():
        assert p.grad.device == p.device
        torch.testing.assert_close(p.grad.cpu(), torch.full(p.shape, 0.5), rtol=0, atol=0)


def test_dtype_and_device_together():
    model = _net().to("neuron", torch.bfloat16)
    assert all(p.device.type == "neuron" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert model[1].num_batches_tracked.dtype == torch.int64  # integer buffers keep their dtype
    torch.testing.assert_close(model[0].weight.cpu(), _net()[0].weight.to(torch.bfloat16), rtol=0, atol=0)


def test_optimizer_built_before_the_move_sees_the_device_params():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("neuron")
    assert all(p.device.type == "neuron" for group in opt.param_groups for p in group["params"])


def test_state_dict_holds_device_tensors_and_loads_across_devices():
    model = _net().to("neuron")
    state = model.state_dict()
    assert all(v.device.type == "neuron" for v in state.values())
    assert state["1.num_batches_tracked"].dtype == torch.int64
    cpu_model = _net()
    with torch.no_grad():
        for p in cpu_model.parameters():
            p.mul_(-1)
    cpu_model.load_state_dict(state)  # neuron tensors copied into CPU parameters
    for a, b in zip(cpu_model.state_dict().values(), state.values()):
        torch.testing.assert_close(a, b.cpu(), rtol=0, atol=0)
    model.load_state_dict(_net().state_dict(), assign=True)  # assign: the module takes the CPU tensors as they are
    assert next(model.parameters()).device.type == "cpu"


def test_module_printing_matches_cpu():
    cpu, dev = _net(), _net().to("neuron")
    assert repr(dev) == repr(cpu)
    text = repr(dev[0].weight)
    assert text.startswith("Parameter containing:\ntensor(") and "device='neuron:0'" in text
    assert "requires_grad=True" in text


def test_process_exits_cleanly_right_after_a_backward():
    # The autograd thread of the device frees its last graph task (it holds a Python object) after the
    # caller resumed; exiting at once must not kill it mid-destructor. Without the exit hook of
    # torch_neuron.compat about one run in three aborted ("terminate called without an active exception").
    code = ("import torch; w = torch.ones(3, device='neuron', requires_grad=True); "
            "(w * w).sum().backward(); print(w.grad.cpu().tolist())")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "[2.0, 2.0, 2.0]"
