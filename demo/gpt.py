"""Demo: train a small GPT with PyTorch on a simulated Trainium NeuronCore (the `neuron` device).

Plain PyTorch training code (torch_neuron.models.gpt, AdamW, bf16 autocast) with the model moved to
"neuron": every op runs as neuron-kernels programs on the simulator, values and device time. A progress
bar shows the loss and the simulated step time; the summary gives simulated tokens/s, model FLOPs
utilization against the TensorE peak, the ops with the most device time, the ops that fell back to the
CPU, the loss next to the same training on the CPU, and the Perfetto trace of the last step.
``NEURON_DEVICE_PROFILE=trn3`` runs it on a Trainium3 core.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import pathlib
import sys
import time
import warnings

import torch

from torch_neuron.models import GPT, GPTConfig, batches, markov_tokens

DTYPES = {"bf16": torch.bfloat16, "fp32": None}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="training steps")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence (the context length)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks")
    ap.add_argument("--heads", type=int, default=4, help="attention heads")
    ap.add_argument("--embd", type=int, default=128, help="embedding width")
    ap.add_argument("--vocab", type=int, default=128, help="vocabulary size")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="bf16: autocast; fp32: plain float32")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    ap.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True,
                    help="AdamW's fused step (one program per parameter) rather than foreach")
    ap.add_argument("--trace", default="traces/gpt.json", help="where to write the Perfetto trace of the last step")
    ap.add_argument("--no-cpu-check", action="store_true", help="skip the CPU run the losses are compared with")
    return ap.parse_args(argv)


class Progress:
    """A one-line progress bar on a terminal; a line every tenth of the run otherwise (CI logs)."""

    def __init__(self, total: int, width: int = 24):
        self.total, self.width, self.tty = total, width, sys.stdout.isatty()

    def update(self, step: int, text: str) -> None:
        done = self.width * step // self.total
        line = f"step {step:>4}/{self.total} [{'#' * done}{'.' * (self.width - done)}] {text}"
        if self.tty:
            print("\r" + line, end="\n" if step == self.total else "", flush=True)
        elif step == self.total or step % max(1, self.total // 10) == 0 or step == 1:
            print(line, flush=True)


def train_step(model, opt, x, y, autocast):
    with torch.autocast(x.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def train_neuron(model, data, args, autocast, trace_path):
    """Losses, simulated device ms and wall s per step; the last step runs under the profiler."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=args.fused)
    bar, losses, device_ms, wall_s, prof = Progress(args.steps), [], [], [], None
    for step, (x, y) in enumerate(data, 1):
        wall = time.perf_counter()
        start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        last = step == args.steps
        with torch.neuron.profiler.profile() if last else contextlib.nullcontext() as step_prof:
            start.record()
            with torch.neuron.profiler.record_function(f"train step {step}"):
                loss = train_step(model, opt, x.to("neuron"), y.to("neuron"), autocast)
            end.record()
            losses.append(loss.item())
            end.synchronize()
        prof = step_prof if last else prof
        device_ms.append(start.elapsed_time(end))
        wall_s.append(time.perf_counter() - wall)
        bar.update(step, f"loss {losses[-1]:.4f} | simulated {device_ms[-1]:.3f} ms/step | wall {wall_s[-1]:.2f} s")
    path = pathlib.Path(trace_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return losses, device_ms, wall_s, prof.export_chrome_trace(path), prof


def train_cpu(model, data, args, autocast):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=args.fused)
    return [train_step(model, opt, x, y, autocast).item() for x, y in data]


def summary(args, cfg, model, losses, cpu_losses, device_ms, wall_s, trace, prof, fallbacks):
    props = torch.neuron.get_device_properties()
    profile = torch.neuron.runtime().profile
    step_s = sum(device_ms) / len(device_ms) / 1e3
    tokens = args.batch * args.seq
    peak = props.tensor_tflops_bf16 * 1e12 / (1 if args.dtype == "bf16" else profile.matmul_fp32_factor)
    flops = model.flops_per_step(args.batch, args.seq)
    print(f"\nsummary ({props.name}, {args.dtype}):")
    print(f"  loss: {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps (ln(vocab) = "
          f"{torch.log(torch.tensor(float(cfg.vocab_size))).item():.4f})")
    if cpu_losses:
        diff = max(abs(a - b) for a, b in zip(losses, cpu_losses))
        print(f"  same training on the CPU: final loss {cpu_losses[-1]:.4f}; largest per-step difference {diff:.2e}")
    print(f"  simulated device time: {step_s * 1e3:.3f} ms/step -> {tokens / step_s:,.0f} tokens/s "
          f"({tokens} tokens/step)")
    print(f"  model FLOPs utilization: {flops / step_s / peak:.2%} ({flops / 1e6:.1f} MFLOP/step; TensorE "
          f"{args.dtype} peak {peak / 1e12:.1f} TFLOPS)")
    print(f"  wall time: {sum(wall_s):.1f} s for {len(wall_s)} steps (the simulator runs every instruction)")
    print("  top ops by device time (all steps):")
    total = torch.neuron.metrics()["device_ns_total"] or 1.0
    for op, ns, calls in torch.neuron.top_ops(8):
        print(f"    {op:<36} {ns / 1e6:>9.3f} ms {ns / total:>7.1%}  {calls:>5} calls")
    if fallbacks:
        print(f"  ran on the CPU fallback ({len(fallbacks)} ops, counts over the run): "
              + ", ".join(f"{op} x{n}" for op, n in sorted(fallbacks.items(), key=lambda kv: -kv[1])))
    else:
        print("  every op ran natively on the device (no CPU fallback)")
    print(f"  trace of step {len(losses)}: {trace} ({len(prof.events)} programs; open in https://ui.perfetto.dev)")


def main(argv=None) -> int:
    args = parse(argv)
    cfg = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                    n_embd=args.embd)
    autocast = DTYPES[args.dtype]
    torch.manual_seed(0)
    model = GPT(cfg)
    reference = None if args.no_cpu_check else copy.deepcopy(model)
    tokens = markov_tokens(cfg.vocab_size, 16384, seed=0)
    data = list(batches(tokens, args.batch, args.seq, args.steps, seed=1))
    print(f"device: {torch.neuron.get_device_name()} ({torch.neuron.device_count()} cores on the chip)")
    print(f"model: GPT, {cfg.n_layer} layers, {cfg.n_head} heads, d={cfg.n_embd}, vocab {cfg.vocab_size}, "
          f"context {cfg.block_size}: {model.num_params():,} parameters; batch {args.batch}; AdamW; {args.dtype}")
    torch.neuron.reset_metrics()
    with warnings.catch_warnings():  # fallbacks are listed in the summary instead of interleaving the bar
        warnings.simplefilter("ignore", torch.neuron.NeuronFallbackWarning)
        losses, device_ms, wall_s, trace, prof = train_neuron(model.to("neuron"), data, args, autocast, args.trace)
    fallbacks = torch.neuron.metrics()["fallback"]
    cpu_losses = train_cpu(reference, data, args, autocast) if reference is not None else None
    summary(args, cfg, model, losses, cpu_losses, device_ms, wall_s, trace, prof, fallbacks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
