"""The wall-time floor of a compiled training step of the small GPT on the simulator (bench/compile.py's step).

Both steps compute the same values instruction by instruction, so a compiled step can save at most the rest:
per-op dispatch, launches, bookkeeping. This prints, for eager and compiled, the step's wall time (median of
``--steps``), the values time, and the time of the matmul instructions alone (their FP32 products by BLAS:
work no exact simulation can skip), and the ratio a compiled step would reach if everything but its matmul
instructions cost nothing, against eager as it is:

    NUMBA_CACHE_DIR=.nox/numba-cache TORCH_NEURON_COMPILE_CACHE=off python bench/compile_wall.py
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
import warnings

import torch

import neuron_sim.values as V
from neuron_hal import isa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile as bench_compile  # noqa: E402  (bench/compile.py: the model and its step)
from values_profile import timed_run  # noqa: E402  (times chosen instructions, as ValuesPlan.run runs them)


def _total_run(acc: list):
    """ValuesPlan.run adding its time to ``acc[0]`` (one clock pair per program run)."""
    def run(self, hbm, addresses, core):
        t0 = time.perf_counter()
        try:
            return _RUN(self, hbm, addresses, core)
        finally:
            acc[0] += time.perf_counter() - t0
    return run


_RUN = V.ValuesPlan.run


def _timed(step, run=None) -> float:
    V.ValuesPlan.run = run or _RUN
    try:
        t0 = time.perf_counter()
        step()
        torch.neuron.synchronize()
        return time.perf_counter() - t0
    finally:
        V.ValuesPlan.run = _RUN


def measure(compiled: bool, steps: int) -> tuple[float, float, float, int]:
    """(wall, values, matmul instructions) in ms, medians over ``steps``, and the matmul count per step."""
    step = bench_compile.gpt_step(compiled)
    for _ in range(2):
        step()
    torch.neuron.synchronize()
    walls, values, matmuls = [], [], []
    for _ in range(steps):
        walls.append(_timed(step))
        total, mm = [0.0], collections.defaultdict(lambda: [0, 0.0])
        _timed(step, _total_run(total))
        values.append(total[0])
        _timed(step, timed_run(mm, key=lambda ins: "matmul" if isinstance(ins, isa.Matmul) else None))
        matmuls.append(mm["matmul"][1])
    return (statistics.median(walls) * 1e3, statistics.median(values) * 1e3, statistics.median(matmuls) * 1e3,
            mm["matmul"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    res = {}
    for mode in ("eager", "compiled"):
        res[mode] = wall, values, mm, n = measure(mode == "compiled", args.steps)
        print(f"bench compile_wall {mode}: wall {wall:.1f} ms, values {values:.1f} ms, other {wall - values:.1f} ms, "
              f"matmul instructions {mm:.1f} ms ({n} per step)", flush=True)
    (ew, ev, emm, _), (cw, _, cmm, _) = res["eager"], res["compiled"]
    print(f"bench compile_wall compiled/eager: {cw / ew:.2f} x; floor (compiled = its matmul instructions alone): "
          f"{cmm / ew:.2f} x; floor with eager's values as fast (eager = dispatch + matmuls): "
          f"{cmm / (ew - ev + emm):.2f} x")


if __name__ == "__main__":
    main()
