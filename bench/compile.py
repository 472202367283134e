"""torch.compile(backend="neuron") against eager, one `bench compile <name>: <value> <unit>` line each.

For a GPT block and for a small GPT, one training step (gradients set to None, forward + backward, bf16 autocast)
runs eagerly and compiled in the same process: wall time and simulated device time per step (medians), programs
launched (a compiled graph's call is one program),
and the compiled/eager ratios (targets: device <= 0.5x, wall <= 0.3x for the small GPT). Compile time is
measured in fresh processes sharing one program cache: cold (empty cache) and warm (every fused program a
cache hit); each is the first three compiled steps minus three steady ones (so a garbage collection counts
whichever of those steps it lands in), after Dynamo itself was imported and warmed up on an unrelated function
(that is a per-process cost, not a per-model one, printed apart).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

from torch_neuron.models import GPT, GPTConfig
from torch_neuron.models.gpt import Block

CFG = GPTConfig(vocab_size=128, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 8


def emit(name: str, value, unit: str) -> None:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    print(f"bench compile {name}: {text} {unit}", flush=True)


def gpt_step(compiled: bool):
    torch.manual_seed(0)
    model = GPT(CFG).to("neuron")
    run = torch.compile(model, backend="neuron") if compiled else model
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, CFG.vocab_size, (BATCH, CFG.block_size), generator=g).to("neuron")

    def step():
        model.zero_grad()  # a training step's gradients start from None, as after optimizer.zero_grad()
        with torch.autocast("neuron", dtype=torch.bfloat16):
            _, loss = run(x, x)
        loss.backward()
        return loss
    return step


def block_step(compiled: bool):
    torch.manual_seed(0)
    block = Block(CFG).to("neuron")
    run = torch.compile(block, backend="neuron") if compiled else block
    x = torch.randn(BATCH, CFG.block_size, CFG.n_embd).to("neuron").requires_grad_()

    def step():
        block.zero_grad()
        x.grad = None
        with torch.autocast("neuron", dtype=torch.bfloat16):
            y = run(x)
        y.float().square().mean().backward()
        return y
    return step


def measure(make, compiled: bool, steps: int) -> dict:
    step = make(compiled)
    step()  # compiles (compiled) and traces every program
    walls, device, programs = [], [], []
    for _ in range(steps):
        m0 = torch.neuron.metrics()
        t0 = time.perf_counter()
        step()
        torch.neuron.synchronize()
        walls.append(time.perf_counter() - t0)
        m1 = torch.neuron.metrics()
        device.append((m1["device_ns_total"] - m0["device_ns_total"]) / 1e6)
        programs.append(sum(m1["programs"].values()) - sum(m0["programs"].values()))
    return {"wall_ms": statistics.median(walls) * 1e3, "device_ms": statistics.median(device),
            "programs": statistics.median(programs)}


def compare(name: str, make, steps: int) -> None:
    eager, compiled = measure(make, False, steps), measure(make, True, steps)
    for mode, r in (("eager", eager), ("compiled", compiled)):
        emit(f"{name} wall ({mode})", r["wall_ms"], "ms")
        emit(f"{name} simulated device time ({mode})", r["device_ms"], "ms")
        emit(f"{name} programs per step ({mode})", int(r["programs"]), "programs")
    emit(f"{name} device time compiled/eager", compiled["device_ms"] / eager["device_ms"], "x")
    emit(f"{name} wall compiled/eager", compiled["wall_ms"] / eager["wall_ms"], "x")


_CHILD = """
import json, time, torch, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
torch.compile(lambda t: t * 2 + 1, backend="neuron")(torch.ones(2, device="neuron"))  # Dynamo's own warm-up
dynamo_s = time.perf_counter() - t0
import compile as bench
step = bench.gpt_step(True)
times = []
for _ in range(6):
    t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
steady = sorted(times[3:])[1]
# the first three steps over three steady ones: a garbage collection the compile's objects trigger counts wherever
# it lands (in the first step or in one of the next two)
print(json.dumps({"compile_s": sum(times[:3]) - 3 * steady, "dynamo_s": dynamo_s,
                  "counts": torch.neuron.metrics()["compile"]}))
"""


def compile_times() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCH_NEURON_COMPILE_CACHE": cache,
               "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
        for label in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                                  check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            hits, misses = r["counts"].get("cache_hits", 0), r["counts"].get("cache_misses", 0)
            emit(f"gpt compile time {label}", r["compile_s"], f"s (program cache: {hits} hits, {misses} misses)")
        emit("dynamo warm-up per process", r["dynamo_s"], "s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode")
    args = ap.parse_args(argv)
    print(f"bench compile: GPT {CFG.n_layer} layers, d={CFG.n_embd}, {CFG.n_head} heads, context "
          f"{CFG.block_size}, batch {BATCH}, bf16 autocast, forward + backward", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.neuron.NeuronFallbackWarning)
        compare("gpt_block", block_step, args.steps)
        compare("gpt", gpt_step, args.steps)
    compile_times()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
