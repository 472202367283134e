"""torch.neuron.metrics() and the profiler charge device time to the op the user called (the outermost aten op
dispatched to neuron), with the inner ops' breakdown kept in ``device_ns_inner``."""

import pytest
import torch
import torch.nn.functional as F


def _run(fn, x):
    torch.neuron.reset_metrics()
    fn(x)
    return torch.neuron.metrics()


def test_decomposed_op_is_charged_to_itself():
    """glu runs as PyTorch's decomposition (sigmoid, mul, copies): its programs are glu's time."""
    x = torch.randn(4, 100).to("neuron")
    m = _run(lambda t: F.glu(t), x)
    inner = m["device_ns_inner"]["glu"]
    assert {"sigmoid", "mul"} <= set(inner)
    assert m["device_ns"]["glu"] == pytest.approx(sum(inner.values()))
    assert not {"sigmoid", "mul"} & set(m["device_ns"]) and not {"sigmoid", "mul"} & set(m["programs"])
    assert m["programs"]["glu"] >= 2
    assert m["native"]["sigmoid"] == 1 and m["native"]["mul"] == 1  # the pieces still ran natively
    torch.testing.assert_close(F.glu(x).cpu(), F.glu(x.cpu()))


def test_aten_call_inside_a_kernel_is_charged_to_the_kernel():
    """max_pool2d pads its input (constant_pad_nd) inside its own kernel: one op in the metrics."""
    x = torch.randn(2, 3, 9, 9).to("neuron")
    m = _run(lambda t: F.max_pool2d(t, 3, 2, 1), x)
    assert set(m["device_ns"]) == {"max_pool2d_with_indices"}
    assert "constant_pad_nd" in m["device_ns_inner"]["max_pool2d_with_indices"]
    assert m["device_ns_total"] == pytest.approx(m["device_ns"]["max_pool2d_with_indices"])


def test_top_level_ops_keep_their_own_names():
    x = torch.randn(64).to("neuron")
    m = _run(lambda t: (t.exp() + 1).tanh(), x)
    assert {"exp", "add", "tanh"} <= set(m["device_ns"]) and m["device_ns_inner"] == {}


def test_profiler_op_track_names_the_user_op():
    x = torch.randn(4, 100).to("neuron")
    F.glu(x)  # prepared launches: the profile sees only the programs
    with torch.neuron.profiler.profile(instructions=False) as prof:
        F.glu(x)
    assert {op for op, _, _ in prof.key_averages()} == {"glu"}
    assert {e["name"] for e in prof.chrome_trace()["traceEvents"] if e.get("cat") == "op"} == {"glu"}
