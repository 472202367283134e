"""Where the simulator's values engine spends one small-GPT training step, by instruction kind.

Runs bench/compile.py's training step (eager or compiled) and times every values step (neuron_sim.values): one
line per instruction kind (activation function and dtypes, matmul shape, transpose shape, dma size), with the
count, the total and the time per instruction; each kind's figure is its minimum over ``--repeats`` steps (the
machine may be shared), and so is the total.

    NUMBA_CACHE_DIR=.nox/numba-cache TORCH_NEURON_COMPILE_CACHE=off python bench/values_profile.py compiled
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings

import numpy as np
import torch

import neuron_sim.values as V
from neuron_hal import isa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile as bench_compile  # noqa: E402  (bench/compile.py: the model and its step)


def kind(ins) -> str:
    name = type(ins).__name__
    if isinstance(ins, isa.Activation):
        red = " red" if ins.reduce_dst is not None else ""
        return f"{name}.{ins.func.value} {ins.src.dtype.name}->{ins.dst.dtype.name} n={ins.src.num_elements}{red}"
    if isinstance(ins, isa.Matmul):
        st, mv = ins.stationary, ins.moving
        return (f"{name} K={st.partitions} M={st.free_size} N={mv.free_size} {st.dtype.name}->{ins.dst.dtype.name}"
                f" acc={ins.accumulate}")
    if isinstance(ins, isa.Transpose):
        return f"{name} {ins.src.partitions}x{ins.src.free_size} {ins.src.dtype.name}->{ins.dst.dtype.name}"
    if isinstance(ins, isa.DmaCopy):
        return f"{name} n={ins.src.num_elements} {ins.src.dtype.name}->{ins.dst.dtype.name}"
    return name


def timed_run(stats, key=kind):
    """A ValuesPlan.run that times each step into ``stats`` (``key(instruction)`` -> [count, seconds]); steps
    whose key is None run untimed."""
    def run(self, hbm, addresses, core):
        steps = self.bind(core)
        core.note_written(self.sbuf_hi, self.psum_hi)
        prev = V.set_blas_threads_local(V._blas_threads_wanted()) if self.has_matmul else None  # as run does
        try:
            with np.errstate(all="ignore"):
                for ins, step in zip(self.instructions, steps):
                    if step is None:
                        continue
                    k = key(ins)
                    if k is None:
                        step(hbm, addresses)
                        continue
                    t0 = time.perf_counter()
                    step(hbm, addresses)
                    entry = stats[k]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - t0
        finally:
            if prev is not None:
                V.set_blas_threads_local(prev)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["eager", "compiled"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    step = bench_compile.gpt_step(args.mode == "compiled")
    for _ in range(2):  # warm: compiled programs, Numba caches, plans
        step()
    torch.neuron.synchronize()
    best: dict = {}
    totals = []
    original = V.ValuesPlan.run
    try:
        for _ in range(args.repeats):
            stats = collections.defaultdict(lambda: [0, 0.0])
            V.ValuesPlan.run = timed_run(stats)
            step()
            torch.neuron.synchronize()
            V.ValuesPlan.run = original
            totals.append(sum(t for _, t in stats.values()))
            for k, (n, t) in stats.items():
                best[k] = (n, min(t, best.get(k, (n, t))[1]))
    finally:
        V.ValuesPlan.run = original
    count = sum(n for n, _ in best.values())
    print(f"values: {min(totals) * 1e3:.1f} ms (min of {args.repeats} steps), {count} instructions")
    for k, (n, t) in sorted(best.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{k:58s} {n:6d} {t * 1e3:8.2f} ms {t / n * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
