"""The ``neuron`` c10d backend under torchrun, one ``bench distributed <name>: <value> <unit>`` line each.

- allreduce of 1 KiB .. 64 MiB float32 on 2 and 4 ranks: wall time and simulated NeuronLink time per call
  and the bandwidths they give (algorithm bandwidth: bytes / time; wall goes through gloo on this host,
  simulated is the device-time model of torch_neuron/distributed/cost.py);
- one FSDP2 training step (bf16 mixed precision) of a small GPT (8 sequences of 64 tokens per rank) on 2
  and 4 ranks: wall time, simulated device time of the step (compute and communication on the device's
  stream) and the communication part.

Each configuration runs in ``torchrun --standalone`` (rendezvous through its TCPStore, as across hosts),
started from here with a timeout. ``python bench/distributed.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
TIMEOUT = 900


def emit(name: str, value, unit: str) -> None:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    print(f"bench distributed {name}: {text} {unit}", flush=True)


def _comm_ns() -> float:
    import torch

    return sum(v for k, v in torch.neuron.metrics()["device_ns"].items() if k.startswith("c10d."))


def allreduce_worker(sizes: list[int]) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,neuron:neuron")
    world, rank = dist.get_world_size(), dist.get_rank()
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, device="neuron")
        dist.all_reduce(t)  # warm up this size
        iters = max(2, min(20, (4 << 20) // nbytes))
        walls, before = [], _comm_ns()
        for _ in range(iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            walls.append(time.perf_counter() - start)
        sim = (_comm_ns() - before) / iters * 1e-9
        wall = statistics.median(walls)
        if rank == 0:
            label = f"allreduce_{_size(nbytes)}_{world}r"
            emit(f"{label}_wall", wall * 1e6, "us")
            emit(f"{label}_wall_bw", nbytes / wall / 1e9, "GB/s")
            emit(f"{label}_sim", sim * 1e6, "us")
            emit(f"{label}_sim_bw", nbytes / sim / 1e9, "GB/s")
    dist.destroy_process_group()


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20}MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KiB"


def fsdp_worker(steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torch_neuron.models.gpt import GPT, GPTConfig, batches, markov_tokens

    cfg = GPTConfig(vocab_size=128, block_size=64, n_layer=4, n_head=4, n_embd=128)
    mesh = init_device_mesh("neuron", (int(os.environ["WORLD_SIZE"]),))
    world, rank = mesh.size(), dist.get_rank()
    torch.manual_seed(0)
    model = GPT(cfg).to("neuron")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(markov_tokens(cfg.vocab_size, 8192), 8 * world, 64, steps)
    for step, (x, y) in enumerate(data):
        x, y = x.chunk(world)[rank].to("neuron"), y.chunk(world)[rank].to("neuron")
        start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        dist.barrier()
        comm0, wall0 = _comm_ns(), time.perf_counter()
        start.record()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        wall = time.perf_counter() - wall0
        if rank == 0 and step == steps - 1:  # the first steps build programs
            emit(f"fsdp2_step_wall_{world}r", wall * 1e3, "ms")
            emit(f"fsdp2_step_device_{world}r", start.elapsed_time(end), "ms")
            emit(f"fsdp2_step_comm_{world}r", (_comm_ns() - comm0) / 1e6, "ms")
            emit(f"fsdp2_step_loss_{world}r", loss.item(), "nats")
    dist.destroy_process_group()


def torchrun(world: int, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           __file__, "--worker", *args]
    subprocess.run(cmd, check=True, timeout=TIMEOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="sizes up to 1 MiB, 2 ranks only, 2 FSDP steps")
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "allreduce":
            allreduce_worker([int(s) for s in rest])
        else:
            fsdp_worker(int(rest[0]))
        return
    sizes = [s for s in SIZES if not args.quick or s <= 1 << 20]
    worlds = (2,) if args.quick else (2, 4)
    for world in worlds:
        torchrun(world, "allreduce", *map(str, sizes))
    for world in worlds:
        torchrun(world, "fsdp", "2" if args.quick else "3")


if __name__ == "__main__":
    main()
