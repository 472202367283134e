"""The Transformers model zoo under ``torch.compile(backend="neuron")``: forward logits and backward gradients of
each tiny architecture compiled on `neuron` against the CPU eager reference
(packages/torch-neuron/tests/torch_neuron_testing/zoo_compile.py), and the simulated device time and programs of
one steady-state training step eager and compiled, each in its own process with bench/zoo.py's time and memory
limits; writes docs/zoo_compile.md (the table, the failures grouped by cause, the compiled/eager time ratio) and
its JSON.

    python bench/zoo_compile.py                      # the whole mapping
    python bench/zoo_compile.py --jobs 2 llama gpt2  # some architectures
    python bench/zoo_compile.py --update --failed    # rerun what did not pass, merged into the JSON
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402 - bench/zoo.py: the child process set-up and its supervisor

STAGES = ("forward", "backward")
PROVISIONAL = "not measured: the process ended"  # the checked result's timing (zoo_compile.UNTIMED) until timed


def one(arch: str, attn: str | None) -> None:
    """In the child: run one architecture compiled and print its result as one marked JSON line."""
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(zoo.TESTS))
    import transformers.utils.logging

    transformers.utils.logging.set_verbosity_error()
    from torch_neuron_testing.zoo_compile import run

    def report(result) -> None:
        print(zoo.MARK + json.dumps(result.as_dict()), flush=True)

    report(run(arch, attn=attn, timing=True, checked=report))  # the checked result first: kept if timing dies


def _supervised(arch: str, args) -> dict:
    """One architecture in its own process (zoo.supervise); a process that ends after printing its checked result
    (killed or dead while timing) keeps that result, with the end as the reason its steps are not timed."""
    r = zoo.supervise(arch, args.timeout, args.max_gb, __file__)
    ended = r.pop("ended", "")
    if ended and r.get("timing", "").startswith(PROVISIONAL):  # the last result printed was the checked one
        r["timing"] = f"not measured: {ended} while the steps were timed"
    return r


def _passed(r: dict | None) -> bool:
    return r is not None and all(r[s] == "pass" for s in STAGES)


def _failed(r: dict) -> set[str]:
    return {s for s in STAGES if r[s] == "fail"}


def _eager_failures() -> dict[str, list[str]]:
    """The stages each architecture fails without compile (docs/zoo.json, the eager zoo's last run)."""
    path = zoo.ROOT / "docs" / "zoo.json"
    eager = json.loads(path.read_text()) if path.exists() else []
    return {r["arch"]: [s for s in STAGES if r[s] == "fail"] for r in eager}


def _ratio(r: dict) -> float | None:
    """compiled / eager simulated device time of the training step, None where either is not measured."""
    eager, compiled = r.get("eager_step_ns"), r.get("compiled_step_ns")
    return compiled / eager if eager and compiled is not None else None


def _us(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e3:.1f}"


def _programs(r: dict) -> str:
    eager, compiled = r.get("eager_programs"), r.get("compiled_programs")
    if eager is None and compiled is None:
        return ""
    return f"{'?' if eager is None else eager} -> {'?' if compiled is None else compiled}"


def timing_summary(results: list[dict]) -> str:
    """The median compiled/eager device-time ratio (and quartiles) over the architectures passing both stages."""
    ratios = sorted(x for r in results if _passed(r) and (x := _ratio(r)) is not None)
    passing = sum(_passed(r) for r in results)
    if not ratios:
        return f"Training step, compiled / eager simulated device time: no measurement (of {passing} passing both)."
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return (f"Training step, compiled / eager simulated device time: median **{median:.3f}x** (quartiles "
            f"{q1:.3f}x - {q3:.3f}x, range {ratios[0]:.3f}x - {ratios[-1]:.3f}x) over the {len(ratios)} "
            f"architectures passing both stages with both steps measured (of {passing} passing both).")


def markdown(results: list[dict], total: int, attn: str | None = None) -> str:
    import torch
    import transformers

    eager = _eager_failures()

    counts = {s: sum(r[s] == "pass" for r in results) for s in STAGES}
    counts["both"] = sum(_passed(r) for r in results)
    lines = [
        "# Transformers model zoo under `torch.compile(backend=\"neuron\")`", "",
        f"{len(results)} of the {total} architectures of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (transformers "
        f"{transformers.__version__}, torch {torch.__version__}), tiny and random as in [zoo.md](zoo.md), compiled "
        "with the default options (`dynamic=False`, graph breaks allowed): forward logits and the gradients of "
        "every parameter against the CPU's eager run (rtol 1e-4, atol 1e-5); attention: "
        f"{f'`{attn}` where the model can switch' if attn else 'the model default'}. A failing stage is rerun with "
        "the CPU model under `backend=\"aot_eager\"`: `torch too` marks failures torch's own compile stack has "
        "without any neuron code; `eager too` those the device has without compile (docs/zoo.json). Generated by "
        f"`python bench/zoo_compile.py{f' --attn {attn}' if attn else ''}`.", "",
        "Device time: one training step, the backward stage's (forward, cross-entropy of the logits, backward; no "
        "optimizer), in simulated device microseconds from `torch.neuron.metrics()` (`device_ns_total`, checked "
        "against a `torch.neuron.Event` pair), in steady state (the step run once to warm up, then an identical one "
        "measured), compiled and on a separate eager device copy (same weights, same inputs); programs: device "
        "programs launched in that step (a compiled graph's call is one). Measured for the architectures passing "
        "both stages; a step that cannot be measured is left blank with the reason under Timing notes and changes "
        "no status.", "",
        "| stage | pass | of run |", "|---|---|---|",
        *[f"| {s} | {counts[s]} | {len(results)} |" for s in (*STAGES, "both")], "",
        f"Not applicable (not built here): {sum(r['forward'] == 'n/a' for r in results)}; failures torch's "
        f"aot_eager has too: {sum(bool(r.get('torch_too')) for r in results)}; failures the eager device run has "
        f"too: {sum(bool(set(eager.get(r['arch'], [])) & _failed(r)) for r in results)}.", "",
        timing_summary(results), "",
    ]
    kinds = collections.Counter(zoo._reason_kind(r["reason"]) for r in results if r["reason"])
    if kinds:
        lines += ["## Failures by cause", "", *[f"- {n} x {k}" for k, n in kinds.most_common(25)], ""]
    lines += ["## Architectures", "", "| arch | forward | backward | torch too | eager too | graph breaks | "
              "graphs (inference/fw/bw) | eager us | compiled us | compiled/eager | programs eager -> compiled | "
              "fallback ops | reason |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r["arch"]):
        c = r.get("compile", {})
        graphs = "/".join(str(c.get(f"{kind}_graphs", 0)) for kind in ("inference", "forward", "backward"))
        too = ", ".join(s for s in eager.get(r["arch"], []) if s in _failed(r))
        lines.append(f"| {r['arch']} | {r['forward']} | {r['backward']} | {', '.join(r.get('torch_too', []))} | "
                     f"{too} | {r.get('graph_breaks', '')} | {graphs} | {_us(r.get('eager_step_ns'))} | "
                     f"{_us(r.get('compiled_step_ns'))} | {'' if (x := _ratio(r)) is None else f'{x:.3f}'} | "
                     f"{_programs(r)} | {zoo._cell(', '.join(r['fallback']))} | {zoo._cell(r['reason'])} |")
    notes = [r for r in sorted(results, key=lambda r: r["arch"]) if r.get("timing") and _passed(r)]
    if notes:
        lines += ["", "## Timing notes", "", *[f"- {r['arch']}: {zoo._cell(r['timing'])}" for r in notes]]
    return "\n".join(lines) + "\n"


def _write(known: dict, everything: list[str], args) -> list[dict]:
    results = [known[a] for a in everything if a in known]
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    Path(args.out).write_text(markdown(results, len(everything), args.attn))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo.run_arguments(parser)
    parser.add_argument("--out", default=str(zoo.ROOT / "docs" / "zoo_compile.md"), help="the table to write")
    parser.add_argument("--json", default=str(zoo.ROOT / "docs" / "zoo_compile.json"), help="the raw results")
    parser.add_argument("--update", action="store_true", help="merge into the existing JSON")
    parser.add_argument("--failed", action="store_true", help="with --update: rerun every architecture not passing")
    parser.add_argument("--attn", help="an attention implementation for every model that can switch (eager: the "
                        "written-out attention the compiler rewrites; default: the model's own)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one, os.environ.get("ZOO_ATTN") or None)
    if args.attn:
        os.environ["ZOO_ATTN"] = args.attn  # the children read it (supervise passes the environment on)
    known = {r["arch"]: r for r in json.loads(Path(args.json).read_text())} if args.update else {}
    everything = zoo.all_architectures()
    archs = args.archs or ([a for a in everything if not _passed(known.get(a))] if args.failed else everything)
    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda a: _supervised(a, args), archs):
            known[r["arch"]] = r
            step = (f" step eager {_us(r.get('eager_step_ns')) or '-'} us compiled "
                    f"{_us(r.get('compiled_step_ns')) or '-'} us programs {_programs(r) or '-'}")
            print(f"zoo-compile {r['arch']}: f={r['forward']} b={r['backward']}{step} {r['seconds']}s "
                  f"{r['reason'][:200]}{' timing: ' + r['timing'][:200] if r.get('timing') else ''}", flush=True)
            results = _write(known, everything, args)  # after each: a long run stopped early keeps its results
    results = _write(known, everything, args)
    for s in (*STAGES, "both"):
        n = sum(_passed(r) for r in results) if s == "both" else sum(r[s] == "pass" for r in results)
        print(f"bench zoo-compile {s}: {n}/{len(results)}")
    print(f"bench zoo-compile step: {timing_summary(results)}")


if __name__ == "__main__":
    main()
