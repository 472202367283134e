"""TorchTitan's llama3 debug model trained on 2 neuron ranks with FSDP2, against the same run on the CPU (gloo).

Steps (each a torchrun, with a timeout): local assets (``torchtitan_assets.py``: tokenizer and corpus; the
wheel ships neither); a seed checkpoint (torchtitan creates it on the CPU, one rank) so that both runs start
from the same weights (the neuron device and the CPU draw different random numbers); the neuron run
(torchtitan unchanged; it finds the ``neuron`` accelerator and the ``neuron`` c10d backend itself); the CPU
reference (``torchtitan_cpu.py``). Then the per-step losses are compared, and must fall.

``python demo/run_torchtitan.py [--steps 10] [--tp] [--workdir DIR]``; needs ``torchtitan`` (``nox -s torchtitan``
installs the pinned version). ``--tp``: tensor parallel degree 2 instead of FSDP over the 2 ranks. (Not named
``torchtitan.py``: the reference run's script lives in this directory, which would then shadow the package.)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT = 1800
RTOL = 1e-4  # per-step loss, neuron vs CPU (float32 training; only summation orders differ)
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


def run(cmd: list[str], log: Path, cwd: Path, **env: str) -> str:
    print("+", " ".join(cmd), f"> {log.name}", flush=True)
    with open(log, "w") as out:
        done = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    text = log.read_text()
    if done.returncode:
        sys.exit(f"{log} ends:\n" + "\n".join(text.splitlines()[-30:]))
    return text


def losses(text: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in STEP.findall(re.sub(r"\x1b\[[0-9;]*m", "", text))}


def torchrun(ranks: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="training steps on each side")
    parser.add_argument("--tp", action="store_true", help="tensor parallel degree 2 (no FSDP sharding)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the runs write (default: a new temporary directory)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="torchtitan-"))
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(HERE / "torchtitan_assets.py"), str(work)], check=True, timeout=600)
    common = ["--model.name", "llama3", "--model.flavor", "debugmodel", "--model.hf_assets_path",
              "./tests/assets/tokenizer", "--training.dataset", "c4_test", "--training.seq_len", "256",
              "--training.local_batch_size", "2", "--metrics.log_freq", "1", "--debug.seed", "0"]
    if not (work / "seed" / "checkpoint" / "step-0").exists():
        run(torchrun(1, "-m", "torchtitan.train", *common, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
                     "--parallelism.data_parallel_shard_degree", "1", "--job.dump_folder", "./seed"),
            work / "seed.log", work)
    train = [*common, "--training.steps", str(args.steps), "--checkpoint.enable", "--checkpoint.initial_load_path",
             "./seed/checkpoint/step-0", "--checkpoint.interval", "100000"]
    if args.tp:
        train += ["--parallelism.tensor_parallel_degree", "2"]
    tag = "tp" if args.tp else "fsdp"
    neuron = run(torchrun(2, "-m", "torchtitan.train", *train, "--job.dump_folder", f"./out-neuron-{tag}"),
                 work / f"neuron-{tag}.log", work)
    cpu = run(torchrun(2, str(HERE / "torchtitan_cpu.py"), *train, "--job.dump_folder", f"./out-cpu-{tag}"),
              work / f"cpu-{tag}.log", work, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    fallbacks = re.findall(r"(aten::[\w.]+) has (?:no neuron kernel|a neuron kernel, but)", neuron)
    report(losses(neuron), losses(cpu), args.steps, sorted(set(fallbacks)))


def report(neuron: dict[int, float], cpu: dict[int, float], steps: int, fallbacks: list[str]) -> None:
    if sorted(neuron) != list(range(1, steps + 1)) or sorted(cpu) != sorted(neuron):
        sys.exit(f"missing steps: neuron logged {sorted(neuron)}, cpu {sorted(cpu)}")
    worst = 0.0
    for step in sorted(neuron):
        diff = abs(neuron[step] - cpu[step]) / cpu[step]
        worst = max(worst, diff)
        print(f"demo torchtitan step {step}: loss neuron {neuron[step]:.5f} cpu {cpu[step]:.5f} (rel {diff:.1e})")
    print(f"demo torchtitan max relative loss difference: {worst:.2e} (tolerance {RTOL:g})")
    print(f"demo torchtitan CPU fallbacks on neuron: {', '.join(fallbacks) or 'none'}")
    if worst > RTOL:
        sys.exit("neuron losses differ from the CPU run")
    if not neuron[steps] < neuron[1]:
        sys.exit("the loss did not fall")


if __name__ == "__main__":
    main()
