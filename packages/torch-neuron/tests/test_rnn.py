"""nn.LSTM / nn.GRU and their cells on neuron against PyTorch CPU, forward and backward.

Off the CPU, aten's RNN cells call the fused cell ops ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell`` and
their backward ops (no CPU kernel exists, so they must be native: ops/rnn.py). The CPU runs the composite
cells, so the comparison checks the fused formulas and their workspace against torch's own math."""

import pytest
import torch
import torch.nn.utils.rnn as rnn_utils

DEV = "neuron"
TOL = dict(rtol=1e-5, atol=1e-5)
aten = torch.ops.aten


def fallbacks():
    return sum(torch.neuron.metrics()["fallback"].values())


def _flat(out):
    if isinstance(out, rnn_utils.PackedSequence):
        return [out.data]
    if isinstance(out, tuple | list):
        return [t for o in out for t in _flat(o)]
    return [out]


def _to(x, dev):
    if x is None:
        return None
    if isinstance(x, rnn_utils.PackedSequence):
        return x.to(dev)
    if isinstance(x, tuple):
        return tuple(_to(t, dev) for t in x)
    return x.to(dev)


def run_both(make, x, state=None):
    """The module on CPU and on neuron (same weights): outputs, input gradient and parameter gradients for a
    fixed, non-uniform output gradient."""
    torch.manual_seed(0)
    cpu = make()
    dev = make().to(DEV)
    dev.load_state_dict(cpu.state_dict())
    results = []
    for m, d in ((cpu, "cpu"), (dev, DEV)):
        xi = _to(x, d)
        if isinstance(xi, torch.Tensor):
            xi = xi.detach().requires_grad_()
        out = m(xi) if state is None else m(xi, _to(state, d))
        flat = _flat(out)
        loss = sum((t * torch.linspace(-1, 1, t.numel()).view(t.shape).to(d)).sum() for t in flat)
        loss.backward()
        grads = [p.grad for p in m.parameters()] + ([xi.grad] if isinstance(xi, torch.Tensor) else [])
        results.append((flat, grads))
    return results


def check(make, x, state=None):
    before = fallbacks()
    (co, cg), (do, dg) = run_both(make, x, state)
    assert fallbacks() == before, "a float32 RNN must not take the CPU fallback"
    for got, want in zip(do + dg, co + cg):
        torch.testing.assert_close(got.cpu(), want, **TOL)


LSTMS = {
    "one_layer": (dict(input_size=5, hidden_size=7), (6, 3, 5)),
    "two_layers_bidirectional": (dict(input_size=5, hidden_size=6, num_layers=2, bidirectional=True), (4, 2, 5)),
    "batch_first_no_bias": (dict(input_size=3, hidden_size=4, batch_first=True, bias=False), (2, 5, 3)),
    "proj_size": (dict(input_size=5, hidden_size=8, proj_size=3, num_layers=2), (4, 3, 5)),
    "unbatched": (dict(input_size=4, hidden_size=5), (6, 4)),
}


@pytest.mark.parametrize("case", list(LSTMS))
def test_lstm_matches_cpu(case):
    kw, shape = LSTMS[case]
    check(lambda: torch.nn.LSTM(**kw), torch.randn(shape))


GRUS = {
    "one_layer": (dict(input_size=5, hidden_size=7), (6, 3, 5)),
    "two_layers_bidirectional_batch_first": (dict(input_size=5, hidden_size=6, num_layers=2, bidirectional=True,
                                                  batch_first=True), (2, 4, 5)),
    "no_bias": (dict(input_size=3, hidden_size=4, bias=False), (5, 2, 3)),
    "unbatched": (dict(input_size=4, hidden_size=5), (6, 4)),
}


@pytest.mark.parametrize("case", list(GRUS))
def test_gru_matches_cpu(case):
    kw, shape = GRUS[case]
    check(lambda: torch.nn.GRU(**kw), torch.randn(shape))


def test_initial_states_are_used_and_get_gradients():
    torch.manual_seed(1)
    h0, c0 = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    check(lambda: torch.nn.LSTM(4, 6, num_layers=2), torch.randn(5, 3, 4), (h0, c0))
    check(lambda: torch.nn.GRU(4, 6, bidirectional=True), torch.randn(5, 3, 4), torch.randn(2, 3, 6))


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
def test_packed_sequences(cls):
    torch.manual_seed(2)
    x = torch.randn(5, 3, 4)
    packed = rnn_utils.pack_padded_sequence(x, torch.tensor([5, 3, 2]), enforce_sorted=True)
    check(lambda: cls(4, 6, bidirectional=True), packed)


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_cpu(cls, bias):
    torch.manual_seed(3)
    check(lambda: cls(5, 7, bias=bias), torch.randn(4, 5))
    check(lambda: cls(5, 7, bias=bias), torch.randn(5))  # unbatched
    h = torch.randn(4, 7)
    check(lambda: cls(5, 7, bias=bias), torch.randn(4, 5), (h, torch.randn(4, 7)) if cls is torch.nn.LSTMCell else h)


def _lstm_reference(ig, hg, cx, bi, bh):
    """aten's fused LSTM cell in float64 (i, f, g, o gate order; workspace = the activated gates)."""
    pre = ig.double() + hg.double() + (0 if bi is None else bi.double() + bh.double())
    i, f, g, o = pre.chunk(4, dim=-1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx.double() + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], dim=-1)


def _gru_reference(ig, hg, hx, bi, bh):
    """aten's fused GRU cell in float64 (r, z, n gates; workspace = r, z, n, hx, hidden n + its bias)."""
    ig, hg = ig.double(), hg.double()
    if bi is not None:
        ig, hg = ig + bi.double(), hg + bh.double()
    ir, iz, in_ = ig.chunk(3, dim=-1)
    hr, hz, hn = hg.chunk(3, dim=-1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx.double() - n), torch.cat([r, z, n, hx.double(), hn], dim=-1)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_cell_ops_and_their_workspaces(bias):
    torch.manual_seed(4)
    b, h = 3, 5
    ig, hg, cx = torch.randn(b, 4 * h), torch.randn(b, 4 * h), torch.randn(b, h)
    bi, bh = (torch.randn(4 * h), torch.randn(4 * h)) if bias else (None, None)
    got = aten._thnn_fused_lstm_cell(*_to((ig, hg, cx, bi, bh), DEV))
    for g, w in zip(got, _lstm_reference(ig, hg, cx, bi, bh)):
        torch.testing.assert_close(g.cpu().double(), w, **TOL)
    ig3, hg3 = ig[:, :3 * h], hg[:, :3 * h]
    bi3, bh3 = (bi[:3 * h], bh[:3 * h]) if bias else (None, None)
    got = aten._thnn_fused_gru_cell(*_to((ig3, hg3, cx, bi3, bh3), DEV))
    for g, w in zip(got, _gru_reference(ig3, hg3, cx, bi3, bh3)):
        torch.testing.assert_close(g.cpu().double(), w, **TOL)


@pytest.mark.parametrize("which", ["hy", "cy", "both"])
def test_lstm_backward_with_one_gradient_missing(which):
    """aten passes an undefined grad_hy or grad_cy when only the other output is used."""
    torch.manual_seed(5)
    ig, hg, cx = torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 2)
    grads = []
    for dev in ("cpu", DEV):
        leaves = [t.detach().to(dev).requires_grad_() for t in (ig, hg, cx)]
        if dev == "cpu":
            hy, cy, _ = (t.float() for t in _lstm_reference(*leaves, None, None))
        else:
            hy, cy, _ = aten._thnn_fused_lstm_cell(*leaves)
        out = {"hy": hy, "cy": cy, "both": hy * cy}[which]
        (out * torch.linspace(-1, 2, out.numel()).view(out.shape).to(dev)).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*reversed(grads)):
        torch.testing.assert_close(got.cpu(), want, **TOL)


def test_double_backward_through_a_cell():
    """create_graph: autograd then uses the composite _thnn_differentiable_* backward on the device."""
    torch.manual_seed(6)
    res = []
    for dev in ("cpu", DEV):
        torch.manual_seed(6)
        cell = torch.nn.GRUCell(3, 4).to(dev)
        x = torch.randn(2, 3).to(dev).requires_grad_()
        (gx,) = torch.autograd.grad(cell(x).pow(2).sum(), x, create_graph=True)
        gx.sum().backward()
        res.append([gx] + [p.grad for p in cell.parameters()])
    for got, want in zip(res[1], res[0]):
        torch.testing.assert_close(got.cpu(), want, **TOL)


def test_bfloat16_cell_follows_float32_math():
    torch.manual_seed(7)
    ig, hg, cx = (torch.randn(4, 4 * 6).bfloat16(), torch.randn(4, 4 * 6).bfloat16(), torch.randn(4, 6).bfloat16())
    got = aten._thnn_fused_lstm_cell(*_to((ig, hg, cx), DEV))
    assert all(t.dtype == torch.bfloat16 for t in got)
    for g, w in zip(got, _lstm_reference(ig, hg, cx, None, None)):
        torch.testing.assert_close(g.cpu().double(), w, rtol=1e-2, atol=1e-2)


def test_float64_runs_each_step_on_the_cpu_fallback():
    """The kernels compute in FP32: float64 cells compose torch ops (each a loud, exact CPU fallback)."""
    torch.manual_seed(8)
    x = torch.randn(3, 4, dtype=torch.float64)
    cell = torch.nn.LSTMCell(4, 5).double()
    want = cell(x)
    got = cell.to(DEV)(x.to(DEV))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-12, atol=1e-12)
