"""Performance figures of the simulator, one `bench <name>: <value> <unit>` line each.

Each measurement runs in its own subprocess so its peak RSS is its own. SCALE-Sim runs in its own
virtual environment (it needs numpy < 2.4) on the same 1024^3 GEMM, and the wall-time ratio is
printed. Targets (issue 2): >= 1M simulated TensorE cycles per CPU-second on the 4096^3 GEMM with
values and timing; >= 500x faster than SCALE-Sim on 1024^3; timing only >= 1M instructions/s.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def emit(name: str, value, unit: str) -> None:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    print(f"bench {name}: {text} {unit}", flush=True)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- children ---------------------------------------------------------------------------------
def child_gemm(size: int, values: bool) -> dict:
    import ml_dtypes
    import numpy as np

    from neuron_hal import get_profile
    from neuron_sim.driver import SimDriver
    from neuron_sim.programs import ideal_gemm_tensor_cycles, tiled_gemm

    profile = get_profile("trn2")
    driver = SimDriver(profile, values=values)
    program = tiled_gemm(profile, size, size, size)
    rng = np.random.default_rng(0)
    addrs = [driver.alloc(0, a.nbytes) for a in program.args]
    for i in (0, 1):
        driver.write(0, addrs[i], rng.standard_normal((size, size), dtype=np.float32).astype(ml_dtypes.bfloat16))
    driver.execute(0, driver.load(0, tiled_gemm(profile, 256, 512, 256)), [driver.alloc(0, a.nbytes) for a in
                   tiled_gemm(profile, 256, 512, 256).args])  # warm the JIT so compile time is not counted
    rss_before = peak_rss_mib()
    t0 = time.perf_counter()
    loaded = driver.load(0, program)
    t1 = time.perf_counter()
    report = driver.execute(0, loaded, addrs)
    t2 = time.perf_counter()
    ideal = ideal_gemm_tensor_cycles(profile, size, size, size)
    return {"wall_s": t2 - t0, "load_s": t1 - t0, "exec_s": t2 - t1, "instructions": len(program),
            "tensor_cycles": report.cycles("tensor"), "device_us": report.device_ns / 1e3,
            "peak_fraction": ideal / report.cycles("tensor"), "rss_mib": peak_rss_mib(),
            "rss_before_mib": rss_before}


def synthetic_program(profile, iterations: int):
    """A mixed stream (DMA in, ScalarE, VectorE, TensorE, copy-out, DMA out) of 6 x iterations."""
    from neuron_hal import AP, Act, Alu, Program, TensorArg, isa

    rows = 64
    args = [TensorArg("x", (rows * 128, 512), "bfloat16"), TensorArg("w", (128, 128), "bfloat16"),
            TensorArg("y", (rows * 128, 512), "float32", "out")]
    tile = 512 * 2
    w = AP.sbuf("bfloat16", 128, (128,), offset=0)
    blocks = []
    for r in range(rows):
        s = r % 4
        a = AP.sbuf("bfloat16", 128, (512,), offset=256 + s * tile)
        b = AP.sbuf("bfloat16", 128, (512,), offset=256 + (4 + s) * tile)
        o = AP.sbuf("float32", 128, (512,), offset=256 + 8 * tile + s * 2048)
        acc = AP.psum("float32", 128, (512,), offset=(r % 8) * 2048)
        blocks.append([
            isa.DmaCopy(a, AP.hbm(0, "bfloat16", (128, 512), offset=r * 128 * tile), queue=r % 4),
            isa.Activation(b, a, Act.exp),
            isa.TensorTensor(b, b, a, Alu.add),
            isa.Matmul(acc, w, b),
            isa.TensorCopy(o, acc),
            isa.DmaCopy(AP.hbm(2, "float32", (128, 512), offset=r * 128 * 2048), o, queue=4 + r % 4),
        ])
    ins = [isa.DmaCopy(w, AP.hbm(1, "bfloat16", (128, 128)))]
    for i in range(iterations):
        ins.extend(blocks[i % rows])
    return Program("synthetic_mix", args, ins)


def child_timing(instructions: int) -> dict:
    from neuron_hal import get_profile
    from neuron_sim.driver import SimDriver

    profile = get_profile("trn2")
    driver = SimDriver(profile, values=False)
    warm = synthetic_program(profile, 64)
    warm_args = [driver.alloc(0, a.nbytes) for a in warm.args]
    driver.execute(0, driver.load(0, warm), warm_args)
    program = synthetic_program(profile, instructions // 6 + 1)
    t0 = time.perf_counter()
    loaded = driver.load(0, program)
    t1 = time.perf_counter()
    report = driver.execute(0, loaded, warm_args)
    t2 = time.perf_counter()
    return {"instructions": len(program), "load_s": t1 - t0, "exec_s": t2 - t1,
            "device_ms": report.device_ns / 1e6, "rss_mib": peak_rss_mib()}


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench child {args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- parent -----------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--skip-scalesim", action="store_true")
    ap.add_argument("--timing-instructions", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        result = child_gemm(int(rest[0]), rest[1] == "values") if kind == "gemm" else child_timing(int(rest[0]))
        print(json.dumps(result))
        return 0

    gemm = {}
    for size in (1024, 4096):
        g = gemm[size] = run_child("gemm", str(size), "values")
        name = f"gemm_{size}_bf16"
        emit(f"{name}_wall", g["wall_s"], "s")
        emit(f"{name}_device_time", g["device_us"], "us")
        emit(f"{name}_tensor_peak_fraction", 100 * g["peak_fraction"], "%")
        emit(f"{name}_tensor_cycles_per_cpu_second", g["tensor_cycles"] / g["wall_s"], "cycles/s")
        emit(f"{name}_instructions_per_second", g["instructions"] / g["wall_s"], "instr/s")
        emit(f"{name}_peak_rss", g["rss_mib"], "MiB")
    emit("gemm_rss_growth_4096_vs_1024", gemm[4096]["rss_mib"] / gemm[1024]["rss_mib"],
         f"x (for {gemm[4096]['tensor_cycles'] / gemm[1024]['tensor_cycles']:.0f}x the simulated cycles)")
    t1024 = run_child("gemm", "1024", "timing")
    emit("gemm_1024_bf16_timing_only_wall", t1024["wall_s"], "s")

    t = run_child("timing", str(args.timing_instructions))
    emit("timing_only_instructions", t["instructions"], "instructions")
    emit("timing_only_instructions_per_second", t["instructions"] / t["exec_s"], "instr/s")
    emit("timing_only_load_instructions_per_second", t["instructions"] / t["load_s"], "instr/s")
    emit("timing_only_peak_rss", t["rss_mib"], "MiB")

    if not args.skip_scalesim:
        sys.path.insert(0, str(HERE))
        from scalesim_gemm import run_scalesim

        s = run_scalesim(HERE.parent / ".bench" / "scalesim-venv", 1024, 1024, 1024)
        emit("scalesim_gemm_1024_wall", s["wall_s"], "s")
        emit("scalesim_gemm_1024_cycles", s["cycles"], "cycles")
        emit("speedup_vs_scalesim_gemm_1024_values_and_timing", s["wall_s"] / gemm[1024]["wall_s"], "x")
        emit("speedup_vs_scalesim_gemm_1024_timing_only", s["wall_s"] / t1024["wall_s"], "x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
