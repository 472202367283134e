"""torch.compile(backend="neuron"): compiled equals eager (forward and backward, float32 and bf16 autocast),
elementwise chains fuse into one program, dynamic shapes compile once, graph breaks and fullgraph work, and
the on-disk program and graph caches are shared by processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

from torch_neuron.models import GPT, GPTConfig
from torch_neuron.models.gpt import Block

DEV = "neuron"
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    from torch_neuron import program_cache

    monkeypatch.setenv("TORCH_NEURON_COMPILE_CACHE", str(tmp_path / "programs"))
    torch._dynamo.reset()
    torch.neuron.reset_metrics()
    yield
    torch._dynamo.reset()
    monkeypatch.undo()
    program_cache.enable()  # back to the session's cache setting for the tests that follow


def compile_counts() -> dict:
    return torch.neuron.metrics()["compile"]


def regions(prefix: str = "fused:") -> int:
    """Fused regions run (each one program of the graph's; the graph runs as one device program)."""
    return sum(n for op, n in torch.neuron.metrics()["native"].items() if op.startswith(prefix))


def test_backend_is_registered():
    assert "neuron" in torch._dynamo.list_backends()


def chain(x, y):
    return (torch.sigmoid(x) * y + x.exp() - 1.0).relu() * 0.5 + torch.where(x > y, x, (y * x).tanh())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_chain_is_one_program(dtype):
    x, y = torch.randn(33, 70, dtype=dtype), torch.randn(70, dtype=dtype)
    compiled = torch.compile(chain, backend="neuron")
    got = compiled(x.to(DEV), y.to(DEV))
    assert regions() == 1 and sum(torch.neuron.metrics()["programs"].values()) == 1
    # one rounding at the end (eager rounds every op): compare with the float32 computation rounded once
    torch.testing.assert_close(got.cpu(), chain(x.float(), y.float()).to(dtype), **TOL[dtype])


def test_region_values_used_outside_are_outputs():
    def f(x):
        a = x * 2.0 + 1.0
        b = a.exp()
        return a.sum(), (b * a).sum(dim=0), b
    x = torch.randn(8, 16)
    got = torch.compile(f, backend="neuron")(x.to(DEV))
    for g, e in zip(got, f(x)):
        torch.testing.assert_close(g.cpu(), e, **TOL[torch.float32])


def _train_grads(model, inputs, compiled: bool, dtype):
    model = model.to(DEV)
    run = torch.compile(model, backend="neuron") if compiled else model
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
        out = run(*[i.to(DEV) for i in inputs])
        out = out[0] if isinstance(out, tuple) else out
        loss = out.float().pow(2).mean()
    loss.backward()
    return out.detach().cpu(), [p.grad.cpu() for p in model.parameters()]


def _mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.SiLU(), nn.LayerNorm(64), nn.Linear(64, 8))


def _cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3), nn.Tanh(), nn.Flatten(), nn.Linear(8 * 2 * 2, 10))


CASES = {
    "mlp": (_mlp, lambda: (torch.randn(16, 32),)),
    "cnn": (_cnn, lambda: (torch.randn(4, 3, 8, 8),)),
    "gpt_block": (lambda: Block(GPTConfig(n_embd=32, n_head=4)), lambda: (torch.randn(2, 16, 32),)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_equals_eager_forward_and_backward(case, dtype):
    make, inputs = CASES[case]
    torch.manual_seed(0)
    eager_model = make()
    compiled_model = make()
    compiled_model.load_state_dict(eager_model.state_dict())
    x = inputs()
    out_e, grads_e = _train_grads(eager_model, x, False, dtype)
    out_c, grads_c = _train_grads(compiled_model, x, True, dtype)
    assert compile_counts().get("backward_graphs", 0) >= 1
    torch.testing.assert_close(out_c, out_e, **TOL[dtype])
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge, **TOL[dtype])


def test_hugging_face_causal_lm_matches_eager():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 16))
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).to(DEV)
        run = torch.compile(model, backend="neuron") if compiled else model
        out = run(ids.to(DEV), labels=ids.to(DEV))
        out.loss.backward()
        results.append((out.logits.detach().cpu(), out.loss.item(), model.model.embed_tokens.weight.grad.cpu()))
    (le, loss_e, ge), (lc, loss_c, gc) = results
    torch.testing.assert_close(lc, le, **TOL[torch.float32])
    assert abs(loss_c - loss_e) < 1e-5
    torch.testing.assert_close(gc, ge, **TOL[torch.float32])
    assert regions() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_loop_matches_eager(dtype):
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg).to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
        run = torch.compile(model, backend="neuron", fullgraph=True) if compiled else model
        losses[compiled] = []
        for _ in range(4):
            with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
                _, loss = run(x.to(DEV), y.to(DEV))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[compiled].append(loss.item())
    assert losses[True][-1] < losses[True][0]
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), **TOL[dtype])


def test_each_graph_runs_as_one_device_program_overlapping_independent_kernels():
    def f(a, b, w1, w2):  # two independent matmul branches, then a join
        return (a @ w1).relu() + (b @ w2).sigmoid()
    args = [torch.randn(128, 256).to(DEV) for _ in range(2)] + [torch.randn(256, 128).to(DEV) for _ in range(2)]
    compiled = torch.compile(f, backend="neuron")
    compiled(*args)
    torch.neuron.reset_metrics()
    got = compiled(*args)
    m = torch.neuron.metrics()
    assert m["programs"] == {"compiled inference graph": 1}  # its kernels ran, as one program
    # two matmuls (one computing its sigmoid too: an activation epilogue), one region for relu and the add
    assert m["native"]["mm"] == 1 and m["native"]["mm+act"] == 1 and regions() == 1
    graph_ns = m["device_ns_total"]
    torch.neuron.reset_metrics()
    want = f(*args)
    eager_ns = torch.neuron.metrics()["device_ns_total"]
    assert graph_ns < eager_ns  # the two branches overlap on the engines and DMA queues
    torch.testing.assert_close(got.cpu(), want.cpu(), **TOL[torch.float32])
    with torch.neuron.profiler.profile(instructions=False) as prof:
        compiled(*args)
    assert [e.op for e in prof.events] == ["compiled inference graph"]
    assert prof.events[0].end_ns - prof.events[0].start_ns == pytest.approx(graph_ns)


class HandWrittenAttention(nn.Module):
    def __init__(self, d=32, heads=4, divide=False, dropout=0.0):
        super().__init__()
        self.qkv, self.heads, self.divide, self.dropout = nn.Linear(d, 3 * d), heads, divide, dropout

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.qkv(x).split(d, dim=-1))
        scores = q @ k.transpose(-2, -1)
        scores = scores / math.sqrt(q.shape[-1]) if self.divide else scores * q.shape[-1] ** -0.5
        if mask is not None:
            scores = scores + mask
        probs = nn.functional.dropout(scores.softmax(dim=-1), self.dropout, self.training)
        return (probs @ v).transpose(1, 2).reshape(b, t, d)


def attention_kernels() -> tuple[int, int]:
    native = torch.neuron.metrics()["native"]
    return native.get("scaled_dot_product_attention", 0), native.get("bmm", 0) + native.get("_softmax", 0)


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_hand_written_attention_runs_the_flash_kernel(divide, with_mask):
    torch.manual_seed(0)
    model = HandWrittenAttention(divide=divide).eval().to(DEV)
    x = torch.randn(2, 8, 32).to(DEV)
    mask = torch.randn(8, 8).to(DEV) if with_mask else None
    want = model(x, mask)
    want.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.neuron.reset_metrics()
    got = torch.compile(model, backend="neuron")(x, mask)
    got.square().sum().backward()
    assert compile_counts()["attention_fused"] == 1 and attention_kernels() == (1, 0)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, **TOL[torch.float32])


def test_attention_whose_probabilities_are_used_elsewhere_or_dropped_out_stays_as_written():
    class Returns(HandWrittenAttention):
        def forward(self, x):
            q = k = v = self.qkv(x)[..., :32]
            probs = (q @ k.transpose(-2, -1)).softmax(-1)
            return probs @ v, probs
    class LearnedBias(HandWrittenAttention):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(4, 8, 8))

        def forward(self, x):
            return super().forward(x, self.bias)
    x = torch.randn(2, 8, 32).to(DEV)
    for model in (Returns().to(DEV), HandWrittenAttention(dropout=0.5).train().to(DEV), LearnedBias().to(DEV)):
        torch.neuron.reset_metrics()
        out = torch.compile(model, backend="neuron")(x)
        assert "attention_fused" not in compile_counts() and attention_kernels()[0] == 0
    out.sum().backward()
    assert model.bias.grad is not None and model.bias.grad.abs().sum() > 0


def test_hugging_face_eager_attention_runs_the_flash_kernel():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(DEV)
    ids = torch.randint(0, 64, (2, 8)).to(DEV)
    want = model(ids, labels=ids)
    want.loss.backward()
    grad = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    torch.neuron.reset_metrics()
    got = torch.compile(model, backend="neuron")(ids, labels=ids)
    got.loss.backward()
    assert compile_counts()["attention_fused"] == 2 and attention_kernels() == (2, 0)
    assert compile_counts()["rms_norms_fused"] == 5  # two per layer and the final one
    torch.testing.assert_close(got.logits, want.logits, **TOL[torch.float32])
    torch.testing.assert_close(model.model.embed_tokens.weight.grad, grad, **TOL[torch.float32])


class HandWrittenRMSNorm(nn.Module):
    def __init__(self, d=48, eps=1e-6, square=lambda h: h.pow(2)):
        super().__init__()
        self.weight, self.eps, self.square = nn.Parameter(torch.rand(d) + 0.5), eps, square

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(self.square(h).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("square", [lambda h: h.pow(2), lambda h: h * h, lambda h: h ** 2], ids=["pow", "mul", "op"])
def test_hand_written_rms_norm_runs_the_norm_kernels(square):
    torch.manual_seed(0)
    model = HandWrittenRMSNorm(square=square).to(DEV)
    x = (torch.randn(3, 5, 48) * 4).to(DEV).requires_grad_()
    want = model(x)
    want.sin().sum().backward()
    grads = [x.grad.clone(), model.weight.grad.clone()]
    x.grad = model.weight.grad = None
    torch.neuron.reset_metrics()
    got = torch.compile(model, backend="neuron")(x)
    got.sin().sum().backward()
    native = torch.neuron.metrics()["native"]
    assert compile_counts()["rms_norms_fused"] == 1
    assert native["_fused_rms_norm"] == native["_fused_rms_norm_backward"] == 1 and "mean" not in native
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    for g, w in zip((x.grad, model.weight.grad), grads):
        torch.testing.assert_close(g, w, **TOL[torch.float32])


def test_rms_norm_of_16_bit_values_or_with_shared_intermediates_stays_as_written():
    class NoUpcast(HandWrittenRMSNorm):
        def forward(self, x):  # eager rounds each step to bfloat16: the norm kernel would not
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    class Shared(HandWrittenRMSNorm):
        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(var + self.eps), var
    x = torch.randn(4, 48)
    for model, inp in ((NoUpcast().to(DEV), x.to(torch.bfloat16)), (Shared().to(DEV), x)):
        want = model(inp.to(DEV))
        torch.neuron.reset_metrics()
        got = torch.compile(model, backend="neuron")(inp.to(DEV))
        assert "rms_norms_fused" not in compile_counts()
        torch.testing.assert_close(got, want, **TOL[inp.dtype])


def test_dynamic_shapes_compile_once():
    compiled = torch.compile(chain, backend="neuron", dynamic=True)
    for n in (3, 8, 17, 64):
        x, y = torch.randn(n, 5), torch.randn(5)
        torch.testing.assert_close(compiled(x.to(DEV), y.to(DEV)).cpu(), chain(x, y), **TOL[torch.float32])
    assert compile_counts()["inference_graphs"] == 1


def test_mark_dynamic_compiles_once_after_the_marked_call():
    compiled = torch.compile(chain, backend="neuron")
    for n in (4, 9, 31):
        x = torch.randn(n, 6).to(DEV)
        torch._dynamo.mark_dynamic(x, 0)
        y = torch.randn(6).to(DEV)
        torch.testing.assert_close(compiled(x, y).cpu(), chain(x.cpu(), y.cpu()), **TOL[torch.float32])
    assert compile_counts()["inference_graphs"] == 1


def test_graph_breaks_run_between_compiled_graphs():
    def f(x):
        a = (x * 2.0).exp() + 1.0
        if a.sum().item() > 0:  # data-dependent: a graph break
            a = a * 3.0 - 1.0
        print("", end="")  # another break
        return (a.sigmoid() * 0.5 + a).sum(dim=-1)
    x = torch.randn(6, 10)
    got = torch.compile(f, backend="neuron")(x.to(DEV))
    torch.testing.assert_close(got.cpu(), f(x), **TOL[torch.float32])
    assert compile_counts()["inference_graphs"] >= 2


def test_a_region_the_kernel_cannot_take_runs_op_by_op(monkeypatch):
    from torch_neuron.compile import region

    def refuse(*args, **kwargs):
        raise RuntimeError("SBUF budget exceeded (test)")
    monkeypatch.setattr(region, "prepared", refuse)
    x, y = torch.randn(5, 7), torch.randn(7)
    with pytest.warns(UserWarning, match="runs op by op"):
        got = torch.compile(chain, backend="neuron")(x.to(DEV), y.to(DEV))
    torch.testing.assert_close(got.cpu(), chain(x, y), **TOL[torch.float32])


_CHILD = textwrap.dedent("""
    import json, torch
    def f(x, y):
        return (torch.sigmoid(x) * y + x.exp() - 1.0).relu() * 0.5
    x = torch.arange(12.0).reshape(3, 4).to("neuron")
    out = torch.compile(f, backend="neuron")(x, x + 1)
    print(json.dumps({"counts": torch.neuron.metrics()["compile"], "sum": out.sum().item()}))
""")


def _child(env) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_program_cache_is_shared_across_processes_and_survives_corruption(tmp_path):
    env = {**os.environ, "TORCH_NEURON_COMPILE_CACHE": str(tmp_path / "shared")}
    cold = _child(env)
    traced = cold["counts"]["cache_misses"]  # the fused region and the eager ops around it
    assert traced >= 2 and cold["counts"].get("cache_writes") == traced
    warm = _child(env)
    assert warm["counts"].get("cache_hits") == traced and "cache_misses" not in warm["counts"]
    assert warm["sum"] == cold["sum"]
    (entry,) = (tmp_path / "shared").glob("pointwise_graph-*.json")
    entry.write_text(entry.read_text()[:100])  # a torn entry (a crash mid-write elsewhere) is a miss
    again = _child(env)
    assert again["counts"].get("cache_misses") == 1 and again["sum"] == cold["sum"]


def test_concurrent_processes_share_the_cache(tmp_path):
    env = {**os.environ, "TORCH_NEURON_COMPILE_CACHE": str(tmp_path / "shared")}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    sums = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        sums.append(json.loads(out.strip().splitlines()[-1])["sum"])
    assert sums[0] == sums[1]
    shared = tmp_path / "shared"
    assert {p.suffix for p in shared.iterdir() if p.is_file()} == {".json"}  # programs; graphs in graphs/
    assert [p.name for p in shared.rglob("*") if p.suffix == ".tmp"] == []  # no temporary files left
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counts = _child(env)["counts"]
    assert "cache_misses" not in counts and "graph_cache_misses" not in counts
    assert counts.get("graph_cache_hits") == 1


def test_graphs_and_new_input_shapes_are_logged(caplog):
    compiled = torch.compile(chain, backend="neuron", dynamic=True)
    with caplog.at_level("INFO", logger="torch_neuron.compile"):
        for n in (3, 8):
            compiled(torch.randn(n, 5).to(DEV), torch.randn(5).to(DEV))
    text = caplog.text
    assert "inference graph: 1 fused regions" in text
    assert "program 1 for inputs float32[3, 5], float32[5]" in text
    assert "program 2 for inputs float32[8, 5], float32[5]" in text


def test_casts_fuse_and_device_transfers_do_not():
    def f(x):
        y = (x.to(torch.bfloat16) * 2).to(torch.float32) + 1  # a rounding inside the region
        return y.exp(), (y * 3).to("neuron:1") + 1, (y - 1).cpu()
    x = torch.randn(4, 6)
    got = torch.compile(f, backend="neuron")(x.to(DEV))
    y = (x.to(torch.bfloat16) * 2).to(torch.float32) + 1
    assert [g.device for g in got] == [torch.device("neuron", 0), torch.device("neuron", 1), torch.device("cpu")]
    for g, e in zip(got, (y.exp(), y * 3 + 1, y - 1)):
        torch.testing.assert_close(g.cpu(), e, **TOL[torch.float32])


def run_with_and_without_epilogues(f, make_inputs, params, monkeypatch, fold: str = "") -> list[list[torch.Tensor]]:
    """[eager, compiled without epilogue folding, compiled] results of f(*inputs) and the gradients of its inputs
    and ``params`` for a sum of squares: the folding must not change a bit of what the graph computes. ``fold``:
    the name of the one fold (a function of compile.epilogues) turned off for "without", else all of them."""
    from torch_neuron.compile import epilogues
    from torch_neuron.compile import graph as compile_graph

    results = []
    for mode in ("eager", "unfolded", "folded"):
        with monkeypatch.context() as m:
            if mode == "unfolded" and fold:
                m.setattr(epilogues, fold, lambda graph: 0)
            elif mode == "unfolded":
                m.setattr(compile_graph, "fold_epilogues", lambda graph: {})
            torch._dynamo.reset()
            run = f if mode == "eager" else torch.compile(f, backend="neuron")
            inputs = [t.to(DEV).requires_grad_() for t in make_inputs()]
            out = run(*inputs)
            out.float().square().sum().backward()
        results.append([out, *(t.grad for t in inputs), *(q.grad for q in params)])
        for q in params:
            q.grad = None
    return results


def assert_epilogues_exact(results, tol):
    eager, unfolded, folded = results
    for e, u, c in zip(eager, unfolded, folded):
        assert c.dtype == u.dtype == e.dtype
        torch.testing.assert_close(c.cpu(), u.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(c.cpu(), e.cpu(), **tol)


@pytest.mark.parametrize("bias", [True, False])
def test_autocast_casts_around_a_linear_layer_are_written_by_its_kernels(bias, monkeypatch):
    """The norm's float32 output cast to bfloat16 and the bfloat16 gradients cast back to float32 are written by the
    norm and matmul kernels (casts folded): bit-identical to the unfolded graph and to eager."""
    torch.manual_seed(0)
    norm, proj = nn.LayerNorm(64).to(DEV), nn.Linear(64, 48, bias=bias).to(DEV)

    def f(x):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            return proj(norm(x)).float()

    x = torch.randn(4, 16, 64)
    results = run_with_and_without_epilogues(f, lambda: [x], [*norm.parameters(), *proj.parameters()], monkeypatch)
    assert_epilogues_exact(results, dict(rtol=0, atol=0))
    # forward: the norm's output to bfloat16, the projection's to float32; backward: input and weight gradients
    assert compile_counts()["casts_folded"] == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_adds_after_a_projection_are_written_by_the_matmul(dtype, monkeypatch):
    """``x + proj(h)`` (through a reshape and a dropout of probability 0) is one matmul kernel adding x to its
    output tiles, in the forward and where the backward sums two gradient products: bit-identical to the unfolded
    graph. (Under autocast AOTAutograd casts h once and sums its two bf16 gradients before the cast back, eager
    casts twice and sums in float32: compiled and eager differ there by a bf16 rounding.)"""
    torch.manual_seed(0)
    proj, drop = nn.Linear(32, 24).to(DEV), nn.Dropout(0.0)

    def f(x, h):
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            y = x + drop(proj(h))
            return y + proj(h) @ torch.ones(24, 24, device=DEV)[:, :1].expand(24, 24)  # a second, plain mm

    x, h = torch.randn(3, 5, 24), torch.randn(3, 5, 32)
    results = run_with_and_without_epilogues(f, lambda: [x, h], list(proj.parameters()), monkeypatch)
    assert_epilogues_exact(results, TOL[dtype])
    assert compile_counts()["residual_adds_folded"] >= 2


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                    (torch.float16, torch.float32)])
@pytest.mark.parametrize("shape", [(5, 7, 3), (0, 4, 3), (4, 0, 3), (6, 5, 0)])
def test_matmul_and_norm_with_a_cast_equal_the_op_then_the_cast(dtypes, shape):
    from torch_neuron.ops.linalg import matmul as linalg
    from torch_neuron.ops.normalization import norms as normalization

    src, dst = dtypes
    m, k, n = shape
    a, b, bias = torch.randn(m, k, dtype=src), torch.randn(k, n, dtype=src), torch.randn(n, dtype=src)
    dev = [t.to(DEV) for t in (a, b, bias)]
    expect = [torch.mm(*dev[:2]).to(dst), torch.addmm(dev[2], *dev[:2], beta=0.5, alpha=2).to(dst)]
    got = [linalg.mm_to(*dev[:2], dst), linalg.addmm_to(dev[2], *dev[:2], dst, beta=0.5, alpha=2)]
    x = torch.randn(m, k + 1, dtype=src).to(DEV)
    w, nb = torch.randn(k + 1, dtype=src).to(DEV), torch.randn(k + 1, dtype=src).to(DEV)
    expect.append(torch.native_layer_norm(x, [k + 1], w, nb, 1e-5)[0].to(dst))
    got.append(normalization.layer_norm(x, [k + 1], w, nb, 1e-5, out_dtype=dst)[0])
    for g, e in zip(got, expect):
        assert g.dtype == dst
        torch.testing.assert_close(g.cpu(), e.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_gradients_are_written_where_a_fused_qkv_projection_stacks_them(dtype, monkeypatch):
    """Heads split out of one qkv projection get their gradient as clone(permute(stack([dq, dk, dv]))): the
    attention backward writes into that result instead of a copy. Bit-identical to the unfolded graph."""
    torch.manual_seed(0)
    qkv = nn.Linear(32, 96).to(DEV)

    def f(x):
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            q, k, v = qkv(x).view(2, 7, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    x = torch.randn(2, 7, 32)
    results = run_with_and_without_epilogues(f, lambda: [x], list(qkv.parameters()), monkeypatch)
    assert_epilogues_exact(results, TOL[dtype])
    assert compile_counts()["attention_grad_stacks_folded"] == 1


def test_stacked_attention_gradients_whose_rows_are_not_contiguous_are_stacked_after():
    """A stack whose permutation moves the head dim off the last place cannot be written row by row: the
    gradients are computed as usual and stacked, the same values."""
    from torch_neuron.compile.epilogues import StackedAttentionGrads
    from torch_neuron.ops.attention import sdpa as attention

    torch.manual_seed(0)
    q, k, v, go = (torch.randn(2, 3, 5, 8, device=DEV) for _ in range(4))
    out, lse = attention.sdpa_forward(q, k, v, is_causal=True)[:2]
    args = (go, q, k, v, None, [True, True, True, False], out, lse, None, None, 5, 5, 0.0, True, None, None)
    grads = attention.sdpa_backward(*args)[:3]
    for dim, perm in ((0, (1, 2, 3, 4, 0)), (0, (1, 3, 0, 2, 4)), (-1, (0, 1, 2, 4, 3))):
        got = StackedAttentionGrads(dim, perm)(*args)
        torch.testing.assert_close(got.cpu(), torch.stack(grads, dim).permute(perm).contiguous().cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU("tanh"), nn.SiLU(), nn.Sigmoid(), nn.Tanh()],
                         ids=["gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activations_after_a_projection_are_computed_by_the_matmul(act, dtype, monkeypatch):
    """``act(proj(x))`` is one matmul kernel storing the product (the activation's backward reads it) and its
    activation from the same tile: bit-identical to the unfolded graph and to eager, forward and backward."""
    torch.manual_seed(0)
    up, down = nn.Linear(16, 40).to(DEV), nn.Linear(40, 16, bias=False).to(DEV)

    def f(x):
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            return down(act(up(x)))

    x = torch.randn(3, 6, 16)
    results = run_with_and_without_epilogues(f, lambda: [x], [*up.parameters(), *down.parameters()], monkeypatch)
    assert_epilogues_exact(results, dict(rtol=0, atol=0))
    assert compile_counts()["activations_folded"] == 1


class PreNormMLP(nn.Module):
    """Two pre-norm residual MLP blocks and a final norm: each norm's input gradient is added to the residual
    stream's."""

    def __init__(self, d: int, norm=nn.LayerNorm):
        super().__init__()
        self.norms = nn.ModuleList(norm(d) for _ in range(3))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(2))

    def forward(self, x):
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.norms[-1](x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("model", ["prenorm_mlp", "prenorm_rms_mlp", "gpt_block"])
def test_norm_gradient_adds_and_casts_are_written_by_the_norm_backward(model, dtype, monkeypatch):
    """The residual stream's gradient plus each norm's input gradient (layer norm; RMSNorm: its fused backward),
    and the cast of the sum (autocast), are written by the norm backward's kernel: bit-identical to the graph with
    the add and cast as written, and to eager within tolerance (compiled and eager differ where autocast's casts
    are placed, see the residual test)."""
    torch.manual_seed(0)
    nets = {"prenorm_mlp": lambda: PreNormMLP(32), "prenorm_rms_mlp": lambda: PreNormMLP(32, nn.RMSNorm),
            "gpt_block": lambda: Block(GPTConfig(n_embd=32, n_head=4))}
    net = nets[model]().to(DEV)

    def f(x):
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            return net(x)

    x = torch.randn(3, 8, 32)
    results = run_with_and_without_epilogues(f, lambda: [x], list(net.parameters()), monkeypatch,
                                             fold="fold_norm_grad_adds")
    assert_epilogues_exact(results, TOL[dtype])
    # two adds (one per block); under autocast the final norm's gradient is cast too (prenorm_*)
    expect = 3 if model.startswith("prenorm") and dtype is torch.bfloat16 else 2
    assert compile_counts()["norm_grad_adds_folded"] == expect


def test_norm_gradient_adds_of_symbolic_shapes_are_folded():
    """The add has the norm's shape, no reshape to spell out: with a dynamic batch it still goes into the backward."""
    torch.manual_seed(0)
    net = PreNormMLP(16).to(DEV)
    f = torch.compile(net, backend="neuron", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4, 16, device=DEV)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        f(xc).square().sum().backward()
        grads_c = [xc.grad, *(p.grad.clone() for p in net.parameters())]
        net.zero_grad()
        net(xe).square().sum().backward()
        for gc, ge in zip(grads_c, [xe.grad, *(p.grad for p in net.parameters())]):
            torch.testing.assert_close(gc.cpu(), ge.cpu(), **TOL[torch.float32])
        net.zero_grad()
    assert compile_counts()["norm_grad_adds_folded"] == 2


def _llama_losses_and_grads(model, ids, dtype, compiled: bool) -> list[torch.Tensor]:
    """Loss, logits and every parameter's gradient of one step of ``model`` (its gradients cleared after)."""
    run = torch.compile(model, backend="neuron") if compiled else model
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
        out = run(ids, labels=ids)
    out.loss.backward()
    got = [out.loss.detach(), out.logits.detach(), *(p.grad for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_rms_norm_gradient_adds_and_casts_are_written_by_the_norm_backward(dtype, monkeypatch):
    """A tiny Hugging Face Llama: its hand-written RMSNorms become the fused op, and each one's input gradient
    added to the residual stream's (and autocast's cast of the sum) is written by the rms-norm backward's kernel:
    loss, logits and all gradients bit-identical to the graph with the adds and casts as written."""
    transformers = pytest.importorskip("transformers")
    from torch_neuron.compile import epilogues

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(DEV)
    ids = torch.randint(0, 64, (2, 8)).to(DEV)
    eager = _llama_losses_and_grads(model, ids, dtype, compiled=False)
    with monkeypatch.context() as m:
        m.setattr(epilogues, "fold_norm_grad_adds", lambda graph: 0)
        unfolded = _llama_losses_and_grads(model, ids, dtype, compiled=True)
    assert "norm_grad_adds_folded" not in compile_counts()
    torch._dynamo.reset()
    folded = _llama_losses_and_grads(model, ids, dtype, compiled=True)
    assert_epilogues_exact([eager, unfolded, folded], TOL[dtype])
    # the adds after the four block norms' backwards (not the final norm's: its gradient is read twice); under
    # autocast the final norm's gradient cast too
    assert compile_counts()["norm_grad_adds_folded"] == (5 if dtype is torch.bfloat16 else 4)


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _norm_backward_args(norm: str, x, go):
    """(the backward's aten op, its implementation, its arguments) for ``norm`` of ``x`` (layer_norm, rms_norm,
    rms_norm without a weight) and output gradient ``go``."""
    from torch_neuron.ops.normalization import norms as normalization

    d = x.shape[-1]
    w = None if norm == "rms_norm_no_weight" else torch.randn(d, dtype=x.dtype).to(DEV)
    if norm == "layer_norm":
        b = torch.randn(d, dtype=x.dtype).to(DEV)
        _, mean, rstd = torch.native_layer_norm(x, [d], w, b, 1e-5)
        args = (go, x, [d], mean, rstd, w, b, [True, True, True])
        return torch.ops.aten.native_layer_norm_backward, normalization.layer_norm_backward, args
    _, rstd = torch.ops.aten._fused_rms_norm(x, [d], w, 1e-5)
    args = (go, x, [d], rstd, w, [True, w is not None])
    return torch.ops.aten._fused_rms_norm_backward, normalization.rms_norm_backward, args


# (grad_input's dtype, the residual's or None, the cast's or None)
@pytest.mark.parametrize("dtypes", [(F32, F32, BF16), (BF16, BF16, None), (F16, F32, F32), (F32, None, F16)])
@pytest.mark.parametrize("shape", [(2, 5, 7), (0, 3, 4), (3, 1, 1)])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "rms_norm_no_weight"])
def test_norm_backward_with_a_residual_and_a_cast_equals_the_op_then_the_add_then_the_cast(norm, dtypes, shape):
    """The kernel's epilogue, and the op's own add and cast where the kernel cannot take them (another residual
    dtype: type promotion; no rows)."""
    dtype, res_dtype, cast = dtypes
    x, go = (torch.randn(shape, dtype=dtype).to(DEV) for _ in range(2))
    residual = None if res_dtype is None else torch.randn(shape, dtype=res_dtype).to(DEV)
    op, backward, args = _norm_backward_args(norm, x, go)
    dx, *param_grads = op(*args)
    total = dx if residual is None else residual + dx
    expect = [total, None if cast is None else total.to(cast), *param_grads]
    got = backward(*args, residual=residual, cast_dtype=cast)
    for g, e in zip(got, expect, strict=True):
        assert (g is None) == (e is None)
        if g is not None:
            assert g.dtype == e.dtype
            torch.testing.assert_close(g.cpu(), e.cpu(), rtol=0, atol=0)


def test_residual_adds_of_symbolic_shapes_stay_as_written():
    """With a dynamic batch the residual's reshape would need the graph's size symbols: the add stays an add."""
    torch.manual_seed(0)
    proj = nn.Linear(8, 8).to(DEV)
    f = torch.compile(lambda x: x + proj(x), backend="neuron", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 2, 8, device=DEV, requires_grad=True)
        got = f(x)
        got.sum().backward()
        torch.testing.assert_close(got.cpu(), (x + proj(x)).detach().cpu(), **TOL[torch.float32])
    assert compile_counts().get("residual_adds_folded", 0) == 0


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.float32)])
@pytest.mark.parametrize("shape", [(5, 7, 3), (6, 4, 1), (1, 3, 9), (0, 4, 3), (6, 0, 5)])
def test_matmul_with_a_residual_equals_the_matmul_then_the_add(dtypes, shape):
    from torch_neuron.ops.linalg import matmul as linalg

    res_dtype, dtype = dtypes
    m, k, n = shape
    a, b, bias = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype), torch.randn(n, dtype=dtype)
    residual = torch.randn(n, m, dtype=res_dtype).t()  # not contiguous
    a, b, bias, residual = (t.to(DEV) for t in (a, b, bias, residual))
    for got, expect in ((linalg.gemm_add(residual, a, b), residual + torch.mm(a, b)),
                        (linalg.gemm_add(residual, a, b, bias, beta=0.5, alpha=2),
                         residual + torch.addmm(bias, a, b, beta=0.5, alpha=2))):
        assert got.dtype == expect.dtype
        torch.testing.assert_close(got.cpu(), expect.cpu(), rtol=0, atol=0)


def test_same_formula_on_several_graph_inputs_is_one_program():
    """autocast casts every weight at the top of a forward: one program for all of them."""
    def f(a, b, c):
        return a.to(torch.bfloat16), b.to(torch.bfloat16), c.to(torch.bfloat16)
    xs = [torch.randn(3, 5), torch.randn(7), torch.randn(())]
    got = torch.compile(f, backend="neuron")(*[x.to(DEV) for x in xs])
    assert sum(torch.neuron.metrics()["programs"].values()) == 1 and regions() == 1
    for g, x in zip(got, xs):
        torch.testing.assert_close(g.cpu(), x.to(torch.bfloat16), rtol=0, atol=0)


_TRAIN_CHILD = textwrap.dedent("""
    import json, torch
    from torch_neuron.models import GPTConfig
    from torch_neuron.models.gpt import Block
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=32, n_head=4)).to("neuron")
    x = torch.randn(2, 16, 32).to("neuron").requires_grad_()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = torch.compile(block, backend="neuron")(x)
    y.float().square().mean().backward()
    grads = [x.grad] + [p.grad for p in block.parameters()]
    print(json.dumps({"counts": torch.neuron.metrics()["compile"], "out": y.float().cpu().flatten().tolist(),
                      "grads": [g.float().cpu().flatten().tolist() for g in grads]}))
""")


def test_a_warm_process_takes_forward_and_backward_graphs_from_the_graph_cache(tmp_path):
    env = {**os.environ, "TORCH_NEURON_COMPILE_CACHE": str(tmp_path / "shared")}
    run = lambda: subprocess.run([sys.executable, "-c", _TRAIN_CHILD], env=env, capture_output=True,  # noqa: E731
                                 text=True, timeout=600)
    cold = run()
    assert cold.returncode == 0, cold.stderr[-3000:]
    cold = json.loads(cold.stdout.strip().splitlines()[-1])
    assert cold["counts"].get("graph_cache_misses") == 1 and "graph_cache_hits" not in cold["counts"]
    warm = run()
    assert warm.returncode == 0, warm.stderr[-3000:]
    warm = json.loads(warm.stdout.strip().splitlines()[-1])
    assert warm["counts"].get("graph_cache_hits") == 1 and "graph_cache_misses" not in warm["counts"]
    # the graphs went through the graph compiler again: the same regions, the same programs, the same values
    for key in ("forward_graphs", "backward_graphs", "fused_regions", "attention_fused"):
        assert warm["counts"].get(key) == cold["counts"].get(key), key
    assert warm["out"] == cold["out"] and warm["grads"] == cold["grads"]
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=32, n_head=4))
    x = torch.randn(2, 16, 32).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x)
    y.float().square().mean().backward()
    torch.testing.assert_close(torch.tensor(warm["out"]), y.float().flatten(), **TOL[torch.bfloat16])
    for got, p in zip(warm["grads"], [x] + list(block.parameters())):
        torch.testing.assert_close(torch.tensor(got), p.grad.flatten(), **TOL[torch.bfloat16])


def _graph_cache_counts(fn, *args) -> dict:
    """The graph cache's counters for compiling ``fn`` afresh (Dynamo forgets what it compiled)."""
    torch._dynamo.reset()
    torch.neuron.reset_metrics()
    torch.compile(fn, backend="neuron")(*args)
    return {k: v for k, v in compile_counts().items() if k.startswith("graph_cache")}


def test_graph_cache_misses_on_another_graph_shape_or_dtype():
    x = torch.randn(6, 5, device=DEV)
    assert _graph_cache_counts(chain, x, x) == {"graph_cache_misses": 1}
    assert _graph_cache_counts(chain, x, x) == {"graph_cache_hits": 1}
    assert _graph_cache_counts(chain, x[:4], x[:4]) == {"graph_cache_misses": 1}
    assert _graph_cache_counts(chain, x.bfloat16(), x.bfloat16()) == {"graph_cache_misses": 1}
    assert _graph_cache_counts(lambda a, b: chain(a, b) + 1, x, x) == {"graph_cache_misses": 1}
    assert _graph_cache_counts(chain, x, x) == {"graph_cache_hits": 1}
    got = torch.compile(chain, backend="neuron")(x, x)  # the cached graph computes what it did
    torch.testing.assert_close(got.cpu(), chain(x.cpu(), x.cpu()), **TOL[torch.float32])


def test_graphs_of_symbolic_shapes_bypass_the_graph_cache_and_off_turns_it_off(monkeypatch):
    from torch_neuron.compile import aot_cache

    compiled = torch.compile(chain, backend="neuron", dynamic=True)
    compiled(torch.randn(3, 5, device=DEV), torch.randn(5, device=DEV))
    counts = compile_counts()
    assert counts.get("graph_cache_bypasses") == 1 and "graph_cache_hits" not in counts
    monkeypatch.setenv("TORCH_NEURON_COMPILE_CACHE", "off")
    assert aot_cache.directory() is None
    x = torch.randn(6, 5, device=DEV)
    assert _graph_cache_counts(chain, x, x) == {}


def test_a_graph_from_the_cache_updates_buffers_and_matches_eager():
    """The cached graph comes with AOTAutograd's wrappers: BatchNorm's running statistics (input mutations)
    are updated as by the graph compiled first, and outputs and gradients equal eager's."""
    torch.manual_seed(0)
    base, x = _cnn(), torch.randn(4, 3, 8, 8)
    results = []
    for compiled in (True, True, False):
        torch._dynamo.reset()
        torch.neuron.reset_metrics()
        model = _cnn()
        model.load_state_dict(base.state_dict())
        out, grads = _train_grads(model, (x,), compiled, torch.float32)
        results.append((out, grads, model[1].running_mean.cpu(), model[1].num_batches_tracked.item()))
        if compiled:
            counts = compile_counts()
            assert counts.get("graph_cache_hits" if results[1:] else "graph_cache_misses") == 1
    *cached, eager = results
    for out, grads, mean, batches in cached:
        torch.testing.assert_close(out, eager[0], **TOL[torch.float32])
        for g, e in zip(grads, eager[1]):
            torch.testing.assert_close(g, e, **TOL[torch.float32])
        torch.testing.assert_close(mean, eager[2], **TOL[torch.float32])
        assert batches == eager[3] == 1


class _Scaled(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = torch.tensor(scale, device=DEV)  # a plain tensor attribute: the graph reads its value

    def forward(self, x):
        return x * self.scale + torch.tensor([1.0, 2.0, 3.0], device=x.device)  # and a constant of the graph


def test_cached_graphs_keep_their_constants_and_read_tensor_attributes_anew():
    x = torch.randn(2, 3)
    for scale, expected in (([1.0, 2.0, 3.0], "graph_cache_misses"), ([4.0, 5.0, 6.0], "graph_cache_hits")):
        torch._dynamo.reset()
        torch.neuron.reset_metrics()
        model = _Scaled(scale)
        got = torch.compile(model, backend="neuron")(x.to(DEV))
        assert compile_counts().get(expected) == 1
        torch.testing.assert_close(got.cpu(), x * torch.tensor(scale) + torch.tensor([1.0, 2.0, 3.0]),
                                   **TOL[torch.float32])


def test_tensor_attributes_of_dynamos_graph_key_the_graph_cache_by_value():
    """Torch's key holds a graph's tensor attributes by metadata: the graph cache adds their values."""
    from torch_neuron.compile.aot_cache import _constants_key

    def graph_reading(value):
        root = nn.Module()
        root.weight = nn.Parameter(torch.ones(3))  # parameters and buffers are inputs of AOTAutograd: not keyed
        root.table = torch.zeros(2, device=DEV)
        g = torch.fx.Graph()
        x = g.placeholder("x")
        g.output(g.call_function(torch.add, (g.call_function(torch.mul, (x, g.get_attr("table"))),
                                             g.get_attr("weight"))))
        gm = torch.fx.GraphModule(root, g)
        del gm.table  # a buffer of the graph module: made a plain attribute, which AOTAutograd bakes in
        gm.table = value
        return gm

    one, two = (_constants_key(graph_reading(torch.tensor(v, device=DEV))) for v in ([1.0, 2.0], [1.0, 3.0]))
    assert one and two and one != two
    assert _constants_key(graph_reading(torch.tensor([1.0, 2.0], device=DEV))) == one
    big = torch.zeros((1 << 20) // 4 + 1, device=DEV)
    assert _constants_key(graph_reading(big)) is None  # too large to read for a key: not cached
    plain = torch.fx.symbolic_trace(lambda x: x * 2)
    assert _constants_key(plain) == ""
