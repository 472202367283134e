"""Run the calibration suite: every published Trainium measurement against the simulator's device time.

    python packages/neuron-sim/calibration/run.py [--only TEXT] [--jobs N] [--write docs/fidelity.md]

One line per case (published, simulated, ratio, the simulator's bound: busiest engine and DMA GB/s), then per
family the order of variants and the slowest/fastest ratio against the published ones, then the summary
(cases within +-15%, median absolute error). ``--write`` also writes the fidelity table (Markdown).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("NEURON_SIM_TIMING_ONLY", "1")  # device time only: the values are not compared here
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from calibration import report  # noqa: E402
from calibration.cases import all_cases  # noqa: E402
from calibration.suite import simulate, use_cache  # noqa: E402

TOLERANCE = 0.15  # the target: every case within +-15% of its published figure


def _run(case_id: str):
    """In a worker process: the case's result without the case (kernels do not pickle)."""
    use_cache()
    case = next(c for c in all_cases() if c.id == case_id)
    return dataclasses.replace(simulate(case), case=None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run only cases whose id contains this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--write", default=None, help="write the fidelity table (Markdown) to this path")
    args, _ = ap.parse_known_args(argv)  # the calibrate session passes fit.py's options too
    cases = [c for c in all_cases() if c.expressible and (args.only is None or args.only in c.id)]
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"duplicate case ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    results = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for case, result in zip(cases, pool.map(_run, ids)):
            result = dataclasses.replace(result, case=case)
            print(report.line(result), flush=True)
            results.append(result)
    skipped = [c for c in all_cases() if not c.expressible and (args.only is None or args.only in c.id)]
    for line in report.summary(results, skipped, TOLERANCE):
        print(line)
    if args.write:
        report.write(pathlib.Path(args.write), report.markdown(results, skipped, TOLERANCE))
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
