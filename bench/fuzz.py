"""The long differential fuzzing profile (`nox -s fuzz`): every op of every family against the CPU, float64
as the arbiter, for a time budget split evenly over the families and their ops; prints the summary and
writes it to docs/fuzz.md (below the hand-written part).

    python bench/fuzz.py --seed 1 --budget 900              # 15 minutes over every family
    python bench/fuzz.py --families unary,binary --budget 120
    python bench/fuzz.py --ops sort,topk --budget 60 --no-write
    python bench/fuzz.py --replay "abs_: Case([T((2, 2), torch.float32, layout='overlapping')])"
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages/torch-neuron/tests"))

import torch  # noqa: E402,F401  (loads torch-neuron)
from torch_neuron_testing.fuzz import families as fam  # noqa: E402
from torch_neuron_testing.fuzz import report, runner  # noqa: E402

DOC = ROOT / "docs/fuzz.md"
CAP = 1 << 16  # elements per tensor: large free dims and > 128 partitions, at simulator speed


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=900, help="seconds for the whole run (default 900)")
    p.add_argument("--families", default=",".join(fam.NAMES), help=f"comma-separated, of {', '.join(fam.NAMES)}")
    p.add_argument("--ops", default="", help="only these ops (comma-separated names)")
    p.add_argument("--cap", type=int, default=CAP, help="elements per tensor at most")
    p.add_argument("--examples", type=int, default=10, help="cases per search (a new seed each)")
    p.add_argument("--replay", metavar="REPRODUCER", help="run one reported case ('op: Case(...)') and print "
                                                           "its verdict")
    p.add_argument("--no-write", action="store_true", help=f"print only; do not rewrite {DOC.relative_to(ROOT)}")
    return p.parse_args(argv)


def replay(text: str) -> int:
    """The verdict of a reproducer line from a summary."""
    import math

    from torch_neuron_testing.fuzz.opdb import Sample
    from torch_neuron_testing.fuzz.spec import Case, T

    name, expr = text.split(": Case(", 1)
    ops = {op.name: op for f in fam.NAMES for op in fam.family(f)} if name.startswith("op_db:") else \
        {op.name: op for f in fam.FAMILIES.values() for op in f}
    case = eval("Case(" + expr, {"Case": Case, "T": T, "Sample": Sample, "torch": torch, "math": math})
    verdict = runner.replay(ops[name], case)
    print(f"{name}: {verdict.status} {verdict.kind} {verdict.detail}")
    return 1 if verdict.failed else 0


def main(argv=None) -> int:
    args = _args(argv)
    warnings.simplefilter("ignore")
    if args.replay:
        return replay(args.replay)
    chosen = [f.strip() for f in args.families.split(",") if f.strip()]
    only = {o.strip() for o in args.ops.split(",") if o.strip()}
    families = {name: [op for op in fam.family(name) if not only or op.name in only] for name in chosen}
    families = {k: v for k, v in families.items() if v}
    stats, t0 = runner.Stats(), time.perf_counter()
    per_family = args.budget / max(len(families), 1)
    for name, ops in families.items():
        start = time.perf_counter()
        for i, op in enumerate(ops):
            left = per_family - (time.perf_counter() - start)
            runner.explore(op, args.cap, left / (len(ops) - i), args.seed, stats, chunk=args.examples,
                           min_examples=args.examples)
        print(f"fuzz {name}: {len(ops)} ops, {time.perf_counter() - start:.0f} s", flush=True)
    header = (f"Last run: seed {args.seed}, budget {args.budget:.0f} s ({time.perf_counter() - t0:.0f} s taken), "
              f"at most {args.cap} elements per tensor, families: {', '.join(families)}.")
    lines = report.summary(families, stats, header)
    print("\n".join(lines))
    if not args.no_write:
        report.write(DOC, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
