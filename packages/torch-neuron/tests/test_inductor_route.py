"""Plain ``torch.compile(model)`` (the default Inductor backend) on a neuron model compiles with the neuron backend
and equals eager, forward and backward; a CPU model still gets Inductor."""

import torch

DEV = "neuron"


def model_and_input():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    return model, torch.randn(3, 8)


def test_default_backend_compiles_neuron_graphs_with_the_neuron_backend():
    torch._dynamo.reset()
    model, x = model_and_input()
    want = model(x)
    want.square().sum().backward()
    want_grad = model[0].weight.grad.clone()
    model.zero_grad()
    model.to(DEV)
    torch.neuron.reset_metrics()
    got = torch.compile(model)(x.to(DEV))  # no backend: Inductor's default, which has no neuron code generation
    got.square().sum().backward()
    compiled = torch.neuron.metrics()["compile"]
    assert compiled.get("forward_graphs", 0) == 1 and compiled.get("backward_graphs", 0) == 1
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model[0].weight.grad.cpu(), want_grad, rtol=1e-4, atol=1e-5)


def test_default_backend_still_inductor_on_cpu():
    torch._dynamo.reset()
    model, x = model_and_input()
    torch.neuron.reset_metrics()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(x), model(x))
    assert not torch.neuron.metrics()["compile"].get("forward_graphs", 0)
    assert not torch.neuron.metrics()["compile"].get("inference_graphs", 0)
