"""PyTorch on the `neuron` device: per-op wall overhead and a GPT training step, one
`bench torch <name>: <value> <unit>` line each.

Tiny ops (16x16 float32: add, mul, matmul, sum, view, copy) are timed call by call on neuron and on the
CPU in the same process; the median is the figure (target: <= 30 us per tiny neuron op). A neuron op's
wall time includes the simulator running its program, so it is the whole cost a user sees per call.
The GPT step is the demo's model (torch_neuron.models.gpt, bf16 autocast, fused AdamW): wall time per
step on neuron and on the CPU, and the simulated device time per step. Sort: ``torch.sort`` (stable, last dim) of
float32 rows of 4097 (8 and 1000 rows: rows spread across partitions and one per partition), warm wall time
around the ``.cpu()`` of both results on neuron and on the CPU, and the simulated device time.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from torch_neuron.models import GPT, GPTConfig, batches, markov_tokens


def emit(name: str, value, unit: str) -> None:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    print(f"bench torch {name}: {text} {unit}", flush=True)


def median_us(fn, repeat: int, warmup: int = 20) -> float:
    for _ in range(warmup):  # first calls trace and load the programs
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def tiny_ops(device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=g).to(device) for _ in range(2))
    dst = torch.empty(16, 16, device=device)
    return {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "matmul_16x16": lambda: a @ b,
        "sum": lambda: a.sum(),
        "view": lambda: a.view(256),
        "copy": lambda: dst.copy_(a),
    }


def bench_tiny_ops(repeat: int) -> None:
    worst = 0.0
    for device in ("cpu", "neuron"):
        for name, fn in tiny_ops(device).items():
            us = median_us(fn, repeat)
            emit(f"op {name} median ({device})", us, "us")
            if device == "neuron":
                worst = max(worst, us)
    emit("op slowest tiny op median (neuron)", worst, "us")


def gpt_step_setup(device: str, cfg: GPTConfig, batch: int):
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True)
    x, y = next(batches(markov_tokens(cfg.vocab_size, 8192), batch, cfg.block_size, 1))
    x, y = x.to(device), y.to(device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def bench_gpt_step(steps: int) -> None:
    cfg = GPTConfig(vocab_size=128, block_size=64, n_layer=4, n_head=4, n_embd=128)
    batch = 8
    print(f"torch gpt_step: GPT {cfg.n_layer} layers, d={cfg.n_embd}, {cfg.n_head} heads, context {cfg.block_size}, "
          f"vocab {cfg.vocab_size}, batch {batch}, bf16 autocast, fused AdamW", flush=True)
    walls = {}
    for device in ("cpu", "neuron"):
        step = gpt_step_setup(device, cfg, batch)
        step().item()  # warm-up: traces and loads every program
        times, device_ms = [], []
        for _ in range(steps):
            before = torch.neuron.metrics()["device_ns_total"]
            t0 = time.perf_counter()
            step().item()
            times.append(time.perf_counter() - t0)
            device_ms.append((torch.neuron.metrics()["device_ns_total"] - before) / 1e6)
        walls[device] = statistics.median(times) * 1e3
        emit(f"gpt_step wall ({device})", walls[device], "ms")
        if device == "neuron":
            emit("gpt_step simulated device time (neuron)", statistics.median(device_ms), "ms")
    emit("gpt_step wall neuron/cpu", walls["neuron"] / walls["cpu"], "x")


SORT_SHAPES = ((8, 4097), (1000, 4097))


def bench_sort(repeat: int) -> None:
    g = torch.Generator().manual_seed(0)
    for rows, n in SORT_SHAPES:
        x = torch.randn(rows, n, generator=g)
        for device in ("cpu", "neuron"):
            d = x.to(device)

            def call(d=d):
                v, i = torch.sort(d, stable=True)
                return v.cpu(), i.cpu()

            call()  # traces and loads the program
            times, device_ms = [], []
            for _ in range(repeat):
                before = torch.neuron.metrics()["device_ns_total"]
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
                device_ms.append((torch.neuron.metrics()["device_ns_total"] - before) / 1e6)
            emit(f"sort {rows}x{n} float32 wall ({device})", statistics.median(times) * 1e3, "ms")
            if device == "neuron":
                emit(f"sort {rows}x{n} float32 simulated device time (neuron)", statistics.median(device_ms), "ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=300, help="timed calls per tiny op")
    ap.add_argument("--steps", type=int, default=5, help="timed GPT steps")
    ap.add_argument("--sort-repeat", type=int, default=3, help="timed calls per sort shape")
    ap.add_argument("--only", choices=("tiny", "gpt", "sort"), help="run one section")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():  # a fallback is counted below instead of warned per op
        warnings.simplefilter("ignore", torch.neuron.NeuronFallbackWarning)
        torch.neuron.reset_metrics()
        if args.only in (None, "tiny"):
            bench_tiny_ops(args.repeat)
        if args.only in (None, "gpt"):
            bench_gpt_step(args.steps)
        if args.only in (None, "sort"):
            bench_sort(args.sort_repeat)
    fallback = torch.neuron.metrics()["fallback"]
    emit("fallback ops", len(fallback), "ops" + (f" ({', '.join(sorted(fallback))})" if fallback else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
