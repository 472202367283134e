"""Saving and loading neuron tensors and modules: torch.save/torch.load (map_location both ways, weights_only,
shared storages), safetensors, pickle and copy.deepcopy — against the same operations on the CPU."""

import copy
import io
import os
import pickle
import subprocess
import sys

import pytest
import safetensors.torch as safetensors_torch
import torch
from torch import nn

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool,
          torch.float64)  # float64 lives on the device as bytes (ops on it take the CPU path)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.ReLU(), nn.Linear(5, 3))


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def _tensors():
    return {str(d): (torch.arange(-6, 6).reshape(3, 4) * 3).to(d) for d in DTYPES}


@pytest.mark.parametrize("map_location", [None, "neuron", "neuron:0", torch.device("neuron", 0)])
def test_neuron_tensors_load_back_on_neuron(map_location):
    host = _tensors()
    loaded = _roundtrip({k: v.to("neuron") for k, v in host.items()}, map_location=map_location)
    for k, v in host.items():
        assert loaded[k].device == torch.device("neuron", 0) and loaded[k].dtype == v.dtype
        torch.testing.assert_close(loaded[k].cpu(), v, rtol=0, atol=0)


def test_map_location_moves_between_devices():
    host = _tensors()
    on_cpu = _roundtrip({k: v.to("neuron") for k, v in host.items()}, map_location="cpu")
    on_neuron = _roundtrip(host, map_location="neuron")
    on_core1 = _roundtrip({k: v.to("neuron") for k, v in host.items()}, map_location={"neuron:0": "neuron:1"})
    by_function = _roundtrip(host, map_location=lambda storage, loc: storage.neuron(1))
    for k, v in host.items():
        assert on_cpu[k].device.type == "cpu"
        assert on_neuron[k].device == torch.device("neuron", 0)
        assert on_core1[k].device == torch.device("neuron", 1)
        assert by_function[k].device == torch.device("neuron", 1)
        for got in (on_cpu[k], on_neuron[k].cpu(), on_core1[k].cpu(), by_function[k].cpu()):
            torch.testing.assert_close(got, v, rtol=0, atol=0)


def test_views_keep_sharing_storage_after_load():
    base = torch.arange(24.0, device="neuron")
    views = {"base": base, "row": base.view(4, 6)[1], "strided": base.view(4, 6)[:, ::2]}
    loaded = _roundtrip(views)
    assert loaded["row"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["strided"].stride() == views["strided"].stride()
    loaded["base"].copy_(torch.zeros(24))  # one storage: the views see the write
    assert loaded["row"].cpu().abs().sum().item() == 0 and loaded["strided"].cpu().abs().sum().item() == 0


def test_state_dict_save_load_both_ways():
    ref = _model()
    model = copy.deepcopy(ref).to("neuron")
    state = _roundtrip(model.state_dict(), map_location="cpu")  # a neuron checkpoint read on the CPU
    fresh = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.ReLU(), nn.Linear(5, 3))
    fresh.load_state_dict(state)
    into_neuron = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.ReLU(), nn.Linear(5, 3)).to("neuron")
    into_neuron.load_state_dict(_roundtrip(ref.state_dict()))  # a CPU checkpoint copied into neuron params
    for (name, p), q, r in zip(ref.named_parameters(), fresh.parameters(), into_neuron.parameters()):
        assert r.device.type == "neuron", name
        torch.testing.assert_close(q, p, rtol=0, atol=0)
        torch.testing.assert_close(r.cpu(), p, rtol=0, atol=0)


def test_whole_module_and_optimizer_state_round_trip():
    model = _model().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for p in model.parameters():  # optimizer state without running an op: step counts and moments
        opt.state[p] = {"step": torch.tensor(3.0), "exp_avg": torch.ones_like(p), "exp_avg_sq": torch.ones_like(p)}
    saved = _roundtrip({"model": model, "opt": opt.state_dict()}, weights_only=False)
    assert all(p.device.type == "neuron" for p in saved["model"].parameters())
    state = saved["opt"]["state"][0]
    assert state["exp_avg"].device.type == "neuron" and state["step"].device.type == "cpu"
    fresh = torch.optim.AdamW(saved["model"].parameters(), lr=1e-2)
    fresh.load_state_dict(saved["opt"])
    assert next(iter(fresh.state.values()))["exp_avg"].device.type == "neuron"


def test_neuron_checkpoint_loads_without_the_backend(tmp_path):
    path = tmp_path / "ckpt.pt"
    host = _tensors()
    torch.save({k: v.to("neuron") for k, v in host.items()}, path)
    torch.save(host, tmp_path / "ref.pt")
    code = ("import sys, torch; a = torch.load(sys.argv[1], map_location='cpu'); b = torch.load(sys.argv[2]);"
            "assert torch._C._get_privateuse1_backend_name() == 'privateuseone';"
            "assert all(a[k].device.type == 'cpu' and torch.equal(a[k], b[k]) for k in b); print('ok')")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "ref.pt")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_safetensors_files_and_bytes(tmp_path):
    host = {k: v.contiguous() for k, v in _tensors().items()}
    path = str(tmp_path / "t.safetensors")
    safetensors_torch.save_file({k: v.to("neuron") for k, v in host.items()}, path)
    as_cpu = safetensors_torch.load_file(path)
    # safetensors validates device strings against its own list; an index means the current accelerator.
    as_neuron = safetensors_torch.load_file(path, device=torch.neuron.current_device())
    from_bytes = safetensors_torch.load(safetensors_torch.save({k: v.to("neuron") for k, v in host.items()}))
    for k, v in host.items():
        assert as_neuron[k].device == torch.device("neuron", 0)
        for got in (as_cpu[k], as_neuron[k].cpu(), from_bytes[k]):
            torch.testing.assert_close(got, v, rtol=0, atol=0)


def test_safetensors_model_with_tied_weights(tmp_path):
    from torch_neuron.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig()).to("neuron")
    path = str(tmp_path / "gpt.safetensors")
    safetensors_torch.save_model(model, path)  # the tied head is stored once
    torch.manual_seed(1)
    other = GPT(GPTConfig()).to("neuron")
    missing, unexpected = safetensors_torch.load_model(other, path)
    assert not missing and not unexpected
    assert other.lm_head.weight is other.wte.weight
    for p, q in zip(model.parameters(), other.parameters()):
        assert q.device.type == "neuron"
        torch.testing.assert_close(q.cpu(), p.cpu(), rtol=0, atol=0)


def test_pickle_round_trip():
    x = torch.randn(4, 5).to("neuron:1")
    y = pickle.loads(pickle.dumps(x))
    assert y.device == x.device and y.data_ptr() != x.data_ptr()
    torch.testing.assert_close(y.cpu(), x.cpu(), rtol=0, atol=0)
    p = pickle.loads(pickle.dumps(nn.Parameter(x)))
    assert isinstance(p, nn.Parameter) and p.requires_grad and p.device == x.device


def test_deepcopy_copies_storage_and_keeps_ties():
    from torch_neuron.models import GPT, GPTConfig

    model = GPT(GPTConfig()).to("neuron:1")
    clone = copy.deepcopy(model)
    assert clone.lm_head.weight is clone.wte.weight
    for p, q in zip(model.parameters(), clone.parameters()):
        assert q.device == p.device and q.data_ptr() != p.data_ptr()
        torch.testing.assert_close(q.cpu(), p.cpu(), rtol=0, atol=0)
    leaf = torch.ones(3, device="neuron:1", requires_grad=True)
    leaf.grad = torch.full((3,), 2.0, device="neuron:1")
    leaf_copy = copy.deepcopy(leaf)  # a plain tensor's grad is copied too (a Parameter's is not, as on the CPU)
    assert leaf_copy.grad.device == leaf.device and leaf_copy.grad.data_ptr() != leaf.grad.data_ptr()
    torch.testing.assert_close(leaf_copy.grad.cpu(), torch.full((3,), 2.0))
    base = torch.arange(10.0, device="neuron")
    a, b = copy.deepcopy((base, base[2:5]))  # views stay views of the copied storage
    assert b.data_ptr() == a.data_ptr() + 8 and a.data_ptr() != base.data_ptr()


FLAGS = {"layout_hint": True, "checked": False}


def test_tensor_metadata_of_neuron_tensors():
    """torch._utils.set/get_tensor_metadata: a neuron tensor keeps the flags set on it (set replaces them, {} clears
    them); torch's own conj/neg keys still set the tensor's bits; views and results start without flags."""
    t = torch.ones(3, device="neuron")
    assert torch._utils.get_tensor_metadata(t) == {}
    torch._utils.set_tensor_metadata(t, FLAGS)
    assert torch._utils.get_tensor_metadata(t) == FLAGS
    assert torch._utils.get_tensor_metadata(t[1:]) == {} and torch._utils.get_tensor_metadata(t + 1) == {}
    torch._utils.set_tensor_metadata(t, {"other": True})
    assert torch._utils.get_tensor_metadata(t) == {"other": True}
    torch._utils.set_tensor_metadata(t, {})
    assert torch._utils.get_tensor_metadata(t) == {}
    c = torch.ones(2, dtype=torch.complex64, device="neuron")
    torch._utils.set_tensor_metadata(c, {"conj": True, "tag": True})
    assert c.is_conj() and torch._utils.get_tensor_metadata(c) == {"conj": True, "tag": True}


def test_tensor_metadata_travels_with_save_and_load(tmp_path):
    """The flags go where torch 2.13 copies backend metadata: torch.save/torch.load back onto neuron (not onto the
    CPU, whose tensors carry none). (torch 2.13 has no torch._C._copy_backend_meta and its fake tensors copy no
    backend metadata.)"""
    t = torch.arange(4.0, device="neuron:1")
    torch._utils.set_tensor_metadata(t, FLAGS)
    torch.save({"t": t, "plain": t * 1}, tmp_path / "t.pt")
    back = torch.load(tmp_path / "t.pt")
    assert back["t"].device == t.device and torch._utils.get_tensor_metadata(back["t"]) == FLAGS
    assert torch._utils.get_tensor_metadata(back["plain"]) == {}
    torch.testing.assert_close(back["t"].cpu(), torch.arange(4.0))
    assert torch._utils.get_tensor_metadata(torch.load(tmp_path / "t.pt", map_location="cpu")["t"]) == {}
