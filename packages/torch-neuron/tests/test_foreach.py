"""``torch._foreach_*`` on neuron against the CPU: every tensor of a list in one program per dtype (0-d, empty and
odd shapes, mixed float dtypes), in place and functional, with scalars, scalar lists, lists and alpha."""

import pytest
import torch

DEV = "neuron"
SHAPES = [(), (3, 5), (0,), (700,), (130, 33), (1,)]


def tensors(dtypes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(d) for s, d in zip(SHAPES, dtypes)]


def close(got, expected, exact=False):
    """torch's default tolerances against the CPU (its kernels fuse multiply-adds and round bf16 scalars
    first; the engines round each product): an ulp or so; ``exact`` for neuron against neuron."""
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        tol = dict(rtol=0, atol=0) if exact else {}
        torch.testing.assert_close(g.cpu(), e.cpu(), equal_nan=True, **tol)


def programs() -> int:
    return sum(n for op, n in torch.neuron.metrics()["programs"].items() if op.startswith("_foreach"))


CALLS = {
    "add_scalar": lambda ts, us: torch._foreach_add(ts, 0.3),
    "add_list_alpha": lambda ts, us: torch._foreach_add(ts, us, alpha=-0.7),
    "sub_list": lambda ts, us: torch._foreach_sub(ts, us),
    "mul_scalarlist": lambda ts, us: torch._foreach_mul(ts, [0.5 + i for i in range(len(ts))]),
    "div_list": lambda ts, us: torch._foreach_div(ts, [u.abs() + 1 for u in us]),
    "addcmul": lambda ts, us: torch._foreach_addcmul(ts, us, us, value=0.25),
    "addcdiv": lambda ts, us: torch._foreach_addcdiv(ts, us, [u.abs() + 1 for u in us], value=-0.5),
    "lerp": lambda ts, us: torch._foreach_lerp(ts, us, 0.3),
    "sqrt": lambda ts, us: torch._foreach_sqrt([t.abs() for t in ts]),
    "neg": lambda ts, us: torch._foreach_neg(ts),
}


@pytest.mark.parametrize("dtypes", [[torch.float32] * 6, [torch.bfloat16] * 6,
                                    [torch.float32, torch.bfloat16, torch.float32, torch.float16, torch.bfloat16,
                                     torch.float32]], ids=["fp32", "bf16", "mixed"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_functional_matches_cpu(call, dtypes):
    ts, us = tensors(dtypes), tensors(dtypes, seed=1)
    got = CALLS[call]([t.to(DEV) for t in ts], [u.to(DEV) for u in us])
    assert all(g.device.type == DEV for g in got)
    try:
        close(got, CALLS[call](ts, us))
    except AssertionError:
        # the CPU rounds some 16-bit steps per element differently for small tensors (its scalar loop) than
        # for large ones (its vector loop); the engines compute in float32 and round once, as the latter
        once = [r.to(t.dtype) for r, t in zip(CALLS[call]([t.float() for t in ts], [u.float() for u in us]), ts)]
        close(got, once)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_one_program_equals_the_per_tensor_kernels_exactly(call, monkeypatch):
    from torch_neuron.ops.foreach import foreach

    # float32: the per-tensor kernels round a bf16 list's intermediates (lerp's end - self) where one program
    # does not (torch's opmath); on float32 both compute the same operations
    ts, us = ([t.to(DEV) for t in tensors([torch.float32] * 6, seed)] for seed in (0, 1))
    fused = CALLS[call](ts, us)
    monkeypatch.setattr(foreach, "_apply_fused", lambda *args: None)
    close(fused, CALLS[call](ts, us), exact=True)


@pytest.mark.parametrize("dtypes", [[torch.float32] * 6, [torch.bfloat16, torch.float32] * 3], ids=["fp32", "mixed"])
def test_in_place_updates_every_tensor_in_one_program_per_dtype(dtypes):
    ts, us = tensors(dtypes), tensors(dtypes, seed=1)
    dev_ts, dev_us = [t.to(DEV) for t in ts], [u.to(DEV) for u in us]
    torch.neuron.reset_metrics()
    torch._foreach_add_(dev_ts, dev_us, alpha=2.0)
    torch._foreach_add_(ts, us, alpha=2.0)
    close(dev_ts, ts)
    assert programs() == len(set(dtypes))


def test_adamw_step_counters_are_one_program():
    steps = [torch.tensor(float(i)).to(DEV) for i in range(52)]
    torch.neuron.reset_metrics()
    torch._foreach_add_(steps, 1)
    assert programs() == 1
    assert [s.item() for s in steps] == [float(i + 1) for i in range(52)]


def test_non_contiguous_tensors_take_the_per_tensor_path():
    base = torch.randn(6, 8)
    ts = [base[:, ::2], torch.randn(3)]
    dev = [base.to(DEV)[:, ::2], ts[1].to(DEV)]
    torch._foreach_mul_(dev, 3.0)
    torch._foreach_mul_(ts, 3.0)
    close(dev, ts)
