"""``neuron-profile``: capture a device timeline, summarize it per engine, and compare device profiles.

    neuron-profile capture [-o trace.json] script.py [args...]   run a script under torch.neuron.profiler
    neuron-profile capture [-o trace.json] program.json          run a saved neuron_hal Program (random inputs)
    neuron-profile view trace.json                               the summary of a saved capture
    neuron-profile compare [--profiles trn1,trn2,trn3] script.py [args...]   (also: --compare P,Q script.py)

A capture writes the Perfetto trace (``-o``, default ``neuron-profile.json``; open in ui.perfetto.dev) and a
self-contained HTML report beside it (same name, ``.html``), and prints per NeuronCore the device time, each
engine's and DMA queue's busy time and utilization (from the driver's per-instruction traces) and the ops with the
most device time. ``compare`` runs the script once per profile, each in its own process with
``NEURON_DEVICE_PROFILE`` set, and prints the device times side by side with their ratio to the first profile.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import runpy
import subprocess
import sys
import tempfile
import traceback

from . import summary
from .report import html_report


def _capture_script(script: str, argv: list[str], instructions: bool) -> tuple[dict, int]:
    """Run ``script`` as ``__main__`` with ``argv`` under the profiler: (trace, exit status)."""
    import torch  # noqa: F401  (loads the neuron device)

    from ..profiler import profile

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    sys.path.insert(0, str(pathlib.Path(script).resolve().parent))
    status = 0
    try:
        with profile(instructions=instructions) as prof:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:
                traceback.print_exc()
                status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return prof.chrome_trace(), status


def _capture_program(path: str, seed: int) -> tuple[dict, int]:
    """Run a saved Program (``Program.to_json``) once on device 0 with random inputs, traced."""
    import numpy as np

    from neuron_hal import Program, get_driver

    try:
        program = Program.from_json(pathlib.Path(path).read_text())
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a saved neuron_hal Program (Program.to_json): {e}") from None
    driver = get_driver()
    driver.open(0)
    rng = np.random.default_rng(seed)
    addresses = []
    for arg in program.args:
        if arg.role == "scratch":
            continue
        dtype = arg.dtype.numpy
        if arg.dtype.is_float:
            data = rng.standard_normal(arg.shape, dtype=np.float32).astype(dtype)
        else:  # small values: a program indexing with them stays in bounds for small tables
            data = rng.integers(0, 2, arg.shape).astype(dtype)
        addresses.append(driver.alloc(0, max(data.nbytes, 1)))
        driver.write(0, addresses[-1], data)
    report = driver.execute(0, driver.load(0, program), addresses, trace=True)
    op = {"ph": "X", "name": program.name, "cat": "op", "pid": 0, "tid": 1000, "ts": report.start_ns / 1e3,
          "dur": report.device_ns / 1e3, "args": {"program": program.name, "queue": 0}}
    meta = {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1000, "args": {"name": "program"}}
    return {"traceEvents": [meta, op, *report.trace["traceEvents"]], "displayTimeUnit": "ns"}, 0


def capture(target: str, argv: list[str], out: str, instructions: bool = True, seed: int = 0,
            quiet: bool = False) -> tuple[dict, int]:
    """Capture ``target`` (a .py script, or a saved program .json), write the trace and HTML report; the
    summary as a dict and the target's exit status."""
    if not pathlib.Path(target).is_file():
        raise FileNotFoundError(f"no such script or program: {target}")
    if target.endswith(".py"):
        trace, status = _capture_script(target, argv, instructions)
    elif target.endswith(".json"):
        if argv:
            raise ValueError(f"a saved program takes no arguments, got {argv}")
        trace, status = _capture_program(target, seed)
    else:
        raise ValueError(f"{target}: neuron-profile captures a Python script (.py) or a saved program (.json)")
    summaries = summary.summarize(trace)
    trace_path = pathlib.Path(out)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path.write_text(json.dumps(trace))
    html_path = trace_path.with_suffix(".html")
    html_path.write_text(html_report(trace, summaries, f"neuron-profile: {target}"))
    if not quiet:
        print(summary.render(summaries))
        print(f"trace: {trace_path} (open in https://ui.perfetto.dev)\nreport: {html_path}")
    return summary.as_dict(summaries), status


def view(path: str) -> str:
    try:
        trace = json.loads(pathlib.Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    return summary.render(summary.summarize(trace))


def compare(profiles: list[str], script: str, argv: list[str], top: int = 8) -> str:
    """The script's device time under each profile (one subprocess each), side by side."""
    from neuron_hal import PROFILES

    unknown = [p for p in profiles if p not in PROFILES]
    if unknown or not profiles:
        raise ValueError(f"--profiles {','.join(profiles)!r}: known profiles are {', '.join(PROFILES)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="neuron-profile-") as tmp:
        for p in profiles:
            out = pathlib.Path(tmp) / f"{p}.json"
            cmd = [sys.executable, "-m", "torch_neuron.tools.profile_cli", "capture", "--no-instructions",
                   "--summary-json", str(out.with_suffix(".summary")), "-o", str(out), script, *argv]
            done = subprocess.run(cmd, env={**os.environ, "NEURON_DEVICE_PROFILE": p}, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{script} under {p} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            results[p] = json.loads(out.with_suffix(".summary").read_text())
    return _side_by_side(profiles, results, top)


def _side_by_side(profiles: list[str], results: dict, top: int) -> str:
    def op_ns(p):
        ns = {}
        for d in results[p]["devices"]:
            for op, v in d["ops"].items():
                ns[op] = ns.get(op, 0.0) + v["device_ns"]
        return ns

    ops = {p: op_ns(p) for p in profiles}
    first = profiles[0]
    ranked = sorted(ops[first], key=lambda o: -ops[first][o])[:top]
    width = max([len("total device time")] + [len(o) for o in ranked]) + 2
    head = f"{'':<{width}}" + "".join(f"{p + ' us':>14}{'x ' + first:>10}" for p in profiles)
    lines = [head]

    def row(name, values):
        base = values[0] or float("nan")
        return f"{name:<{width}}" + "".join(f"{v / 1e3:>14.2f}{v / base:>10.3f}" for v in values)

    lines.append(row("total device time", [results[p]["device_ns"] for p in profiles]))
    for op in ranked:
        lines.append(row(op, [ops[p].get(op, 0.0) for p in profiles]))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-profile", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:7]))
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="run a script or a saved program under the profiler")
    cap.add_argument("-o", "--output", default="neuron-profile.json", help="trace path (the report: .html beside it)")
    cap.add_argument("--no-instructions", action="store_true", help="only op slices (faster; no engine tracks)")
    cap.add_argument("--summary-json", help=argparse.SUPPRESS)  # compare's channel back from each subprocess
    cap.add_argument("--seed", type=int, default=0, help="seed of a saved program's random inputs")
    cap.add_argument("target", help="script.py or program.json")
    cap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    vw = sub.add_parser("view", help="print the summary of a saved trace")
    vw.add_argument("trace")
    cmp_ = sub.add_parser("compare", help="run a script once per device profile and compare device time")
    cmp_.add_argument("--profiles", default="trn1,trn2,trn3", help="comma-separated (default trn1,trn2,trn3)")
    cmp_.add_argument("--top", type=int, default=8, help="ops shown (default 8)")
    cmp_.add_argument("target")
    cmp_.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--compare"] and len(argv) >= 2:  # AWS-style spelling: --compare trn1,trn2 script.py ...
        argv = ["compare", "--profiles", argv[1], *argv[2:]]
    args = _parser().parse_args(argv)
    try:
        if args.command == "capture":
            result, status = capture(args.target, args.args, args.output, not args.no_instructions, args.seed,
                                     quiet=bool(args.summary_json))
            if args.summary_json:
                pathlib.Path(args.summary_json).write_text(json.dumps(result))
            return status
        if args.command == "view":
            print(view(args.trace))
            return 0
        print(compare([p.strip() for p in args.profiles.split(",") if p.strip()], args.target, args.args, args.top))
        return 0
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"neuron-profile: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
