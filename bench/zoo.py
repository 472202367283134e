"""The Transformers model zoo on `neuron`: every architecture of transformers' causal-LM mapping, tiny and random,
forward / backward / greedy generate() against the CPU (packages/torch-neuron/tests/torch_neuron_testing/zoo.py),
each in its own process with a time and memory limit; writes docs/zoo.md (the status table and coverage) and a
JSON of the raw results.

    python bench/zoo.py                     # the whole mapping, one architecture at a time
    python bench/zoo.py --jobs 2 llama gpt2 # some architectures, two processes at once
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "packages" / "torch-neuron" / "tests"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TORCH_NEURON_COMPILE_CACHE": "off",
       "NUMBA_CACHE_DIR": str(ROOT / ".nox" / "numba-cache")}
MARK = "ZOO-RESULT "


def one(arch: str) -> None:
    """In the child: run one architecture and print its result as one marked JSON line."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(TESTS))
    import transformers.utils.logging

    transformers.utils.logging.set_verbosity_error()
    from torch_neuron_testing.zoo import run

    print(MARK + json.dumps(run(arch).as_dict()), flush=True)


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def supervise(arch: str, timeout: float, max_gb: float, script: str = __file__) -> dict:
    """Run one architecture in a child process (``script --one arch``, which prints its result as one marked JSON
    line); kill it past the time or memory limit and say which."""
    cmd = [sys.executable, script, "--one", arch]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV})
    killed = ""
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _rss_bytes(proc.pid))
        if time.time() - start > timeout:
            killed = f"killed: over the time limit ({timeout:.0f} s)"
        elif peak > max_gb * 2**30:
            killed = f"killed: over the memory limit ({max_gb} GB)"
        if killed:
            proc.kill()
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    tail = (err.strip().splitlines() or ["no output"])[-1][:200]
    marked = [line[len(MARK):] for line in out.splitlines() if line.startswith(MARK)]
    if marked:  # the last: a child may print a result before optional work that can still fail (zoo_compile's timing)
        result = json.loads(marked[-1])
        result["peak_gb"] = round(peak / 2**30, 2)
        if killed or proc.returncode:  # after its last result: that result stands, the end is noted
            result["ended"] = killed or f"process died (exit {proc.returncode}): {tail}"
        return result
    return {"arch": arch, "forward": "fail", "backward": "fail", "generate": "fail", "fallback": [],
            "reason": killed or f"process died (exit {proc.returncode}): {tail}", "params": 0,
            "seconds": round(time.time() - start, 1), "peak_gb": round(peak / 2**30, 2)}


def _passed(result: dict | None) -> bool:
    return result is not None and all(result[s] == "pass" for s in ("forward", "backward", "generate"))


def all_architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def coverage(results: list[dict]) -> dict:
    """pass counts per stage and for all three, over the architectures run (n/a counts as not passing)."""
    figures = {s: sum(r[s] == "pass" for r in results) for s in ("forward", "backward", "generate")}
    figures["all three"] = sum(all(r[s] == "pass" for s in ("forward", "backward", "generate")) for r in results)
    figures["n/a"] = sum(r["forward"] == "n/a" for r in results)
    return figures


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: list[dict], total: int) -> str:
    import torch
    import transformers

    figures = coverage(results)
    lines = [
        "# Transformers model zoo on `neuron`", "",
        f"Every architecture of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (transformers {transformers.__version__}, "
        f"torch {torch.__version__}; {total} entries), built from a tiny random config offline "
        "(`packages/torch-neuron/tests/torch_neuron_testing/zoo_config.py`), float32, run on `neuron` against the "
        "CPU with the same weights: forward logits, the gradients of every parameter for a cross-entropy on the "
        "logits, and greedy `generate()` of 4 tokens (tolerance rtol 1e-4, atol 1e-5; a generated token may "
        "differ only where the CPU's scores tie within it). Ops that fell back to the CPU are listed; a fallback "
        "is correct (loud, counted) and counts as a pass. Generated by `nox -s zoo` (`python bench/zoo.py`).", "",
        "## Coverage", "",
        "| stage | pass | of | % |", "|---|---|---|---|",
    ]
    for stage in ("forward", "backward", "generate", "all three"):
        lines.append(f"| {stage} | {figures[stage]} | {total} | {100 * figures[stage] / total:.1f} |")
    lines += ["", f"Not applicable here (not counted as passing): {figures['n/a']}.", ""]
    reasons = collections.Counter(_reason_kind(r["reason"]) for r in results if r["reason"])
    if reasons:
        lines += ["## Reasons for failures and n/a (most frequent first)", ""]
        lines += [f"- {n} x {kind}" for kind, n in reasons.most_common(15)] + [""]
    lines += ["## Architectures", "", "| arch | forward | backward | generate | fallback ops | reason |",
              "|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r["arch"]):
        lines.append(f"| {r['arch']} | {r['forward']} | {r['backward']} | {r['generate']} | "
                     f"{_cell(', '.join(r['fallback']))} | {_cell(r['reason'])} |")
    return "\n".join(lines) + "\n"


def _reason_kind(reason: str) -> str:
    """A reason without its numbers and names of the first stage: groups alike failures."""
    first = reason.split("; ")[0]
    return first.split(" at ")[0][:120]


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a zoo run shared by this script and bench/zoo_compile.py: which architectures, how many at
    once, and each one's limits (see ``supervise``)."""
    parser.add_argument("archs", nargs="*", help="architectures (default: the whole mapping)")
    parser.add_argument("--jobs", type=int, default=1, help="architectures run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per architecture")
    parser.add_argument("--max-gb", type=float, default=4.0, help="resident memory limit per architecture")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_arguments(parser)
    parser.add_argument("--out", default=str(ROOT / "docs" / "zoo.md"), help="the markdown table to write")
    parser.add_argument("--json", default=str(ROOT / "docs" / "zoo.json"), help="the raw results to write")
    parser.add_argument("--update", action="store_true",
                        help="merge into the existing JSON (rerun the named architectures, or with --failed those "
                             "that did not pass) and rewrite the table from all results")
    parser.add_argument("--failed", action="store_true", help="with --update: rerun every architecture not passing")
    parser.add_argument("--render", action="store_true", help="only rewrite the table from the existing JSON")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one)
    known = {r["arch"]: r for r in json.loads(Path(args.json).read_text())} if args.update else {}
    everything = all_architectures()
    archs = args.archs or ([a for a in everything if not _passed(known.get(a))] if args.failed else everything)
    if args.render:
        known, archs, args.update = {r["arch"]: r for r in json.loads(Path(args.json).read_text())}, [], True
    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda a: supervise(a, args.timeout, args.max_gb), archs):
            known[r["arch"]] = r
            stages = " ".join(f"{s[0]}={r[s]}" for s in ("forward", "backward", "generate"))
            print(f"zoo {r['arch']}: {stages} {r['seconds']}s {r['reason'][:160]}", flush=True)
    results = [known[a] for a in (everything if args.update else archs) if a in known]
    archs = everything if args.update else archs
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    Path(args.out).write_text(markdown(results, len(archs)))
    figures = coverage(results)
    for stage in ("forward", "backward", "generate", "all three"):
        print(f"bench zoo {stage}: {figures[stage]}/{len(archs)} ({100 * figures[stage] / len(archs):.1f} %)")


if __name__ == "__main__":
    main()
