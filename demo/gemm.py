"""Demo: a tiled bf16 GEMM on one simulated NeuronCore.

Runs the program through the HAL on the `sim` driver (values and timing), checks the result
against numpy, and prints the device time, the achieved fraction of TensorE peak, each engine's
utilization and where the Perfetto trace was written.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import ml_dtypes
import numpy as np

from neuron_hal import get_driver, get_profile
from neuron_sim.programs import ideal_gemm_tensor_cycles, tiled_gemm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--profile", default=None, help="trn1 | trn2 | trn3 (default: $NEURON_DEVICE_PROFILE or trn2)")
    ap.add_argument("--size", type=int, default=1024, help="M = N = K (multiple of 512)")
    ap.add_argument("--trace", default="traces/gemm.json", help="where to write the Perfetto trace")
    args = ap.parse_args(argv)

    profile = get_profile(args.profile)
    driver = get_driver("sim", profile)
    n = args.size
    print(f"device: {driver.devices()[0].name}; GEMM {n}x{n}x{n} bf16 -> fp32")

    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    program = tiled_gemm(profile, n, n, n)
    addrs = [driver.alloc(0, a.nbytes) for a in program.args]
    driver.write(0, addrs[0], lhsT)
    driver.write(0, addrs[1], rhs)

    warm = tiled_gemm(profile, 128, 512, 128)  # compiles the simulator's Numba kernels (cached on disk)
    driver.execute(0, driver.load(0, warm), [driver.alloc(0, a.nbytes) for a in warm.args])
    wall = time.perf_counter()
    report = driver.execute(0, driver.load(0, program), addrs, trace=True)
    wall = time.perf_counter() - wall
    out = np.empty((n, n), np.float32)
    driver.read(0, addrs[2], out)

    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    ok = err < 1e-5  # fp32 accumulation of exact bf16 products: only summation-order rounding differs
    print(f"result check: max |out - numpy| / max |numpy| = {err:.2e} -> {'PASS' if ok else 'FAIL'}")

    ideal_ns = ideal_gemm_tensor_cycles(profile, n, n, n) / profile.tensor_ghz
    flops = 2 * n**3
    print(f"device time: {report.device_ns / 1e3:.2f} us ({report.cycles('tensor'):.0f} TensorE cycles); "
          f"{flops / report.device_ns / 1e3:.1f} TFLOPS = {ideal_ns / report.device_ns:.1%} of TensorE peak")
    print("engine utilization: " + ", ".join(f"{e} {u:.1%}" for e, u in report.utilization().items()))
    print(f"DMA: {report.dma_bytes / 2**20:.1f} MiB moved; {report.instructions} instructions simulated "
          f"in {wall:.2f} s wall")
    path = pathlib.Path(args.trace)
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"trace: {report.save_trace(path)} (open in https://ui.perfetto.dev)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
