"""``neuron-tune``: inspect, fill and clear the autotuner's cache.

    neuron-tune list [PATTERN]                 cached entries: kernel, version, profile, signature, best, time
    neuron-tune show FILE|PATTERN              one entry (or every match) with all its trials
    neuron-tune run MODULE:KERNEL --arg a=4096x4096:bfloat16 [--arg ...] [--const dim=1 ...]
                    [--profile trn2] [--force] [--no-progress]
    neuron-tune clear [PATTERN]                delete entries (all without a pattern)

The cache is ``$NEURON_KERNELS_TUNE_CACHE``, else ``~/.cache/neuron-kernels/tune``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pathlib
import sys

from . import autotune
from .jit import Kernel, TensorSpec


def _shape(text: str) -> tuple[int, ...]:
    text = text.strip().strip("[]()")
    if text in ("", "scalar"):
        return ()
    return tuple(int(s) for s in text.replace(",", "x").split("x") if s.strip())


def parse_arg(text: str) -> tuple[str, TensorSpec]:
    """``name=4096x4096:bfloat16`` (also ``name=[4096,4096]:bf16``-style shapes; ``name=:float32`` is 0-d)."""
    from neuron_hal import DType

    try:
        name, rest = text.split("=", 1)
        shape, dtype = rest.rsplit(":", 1)
        return name.strip(), TensorSpec(_shape(shape), DType.of(dtype.strip()))
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"--arg {text!r}: expected name=SHAPE:DTYPE, e.g. x=4096x4096:bfloat16 "
                                         f"({e})") from None


def parse_const(text: str) -> tuple[str, object]:
    """``name=value`` with value a Python literal (``1``, ``(0, 2, 1)``, ``None``), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--const {text!r}: expected name=VALUE")
    name, value = text.split("=", 1)
    try:
        return name.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name.strip(), value


def load_kernel(target: str) -> Kernel:
    """``package.module:name`` -> the Kernel object it names."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise SystemExit(f"neuron-tune: expected MODULE:KERNEL, got {target!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Kernel):
        raise SystemExit(f"neuron-tune: {target} is a {type(obj).__name__}, not a kernel made with @nk.kernel")
    return obj


def _time(entry: dict) -> str:
    ns = entry.get("device_ns")
    return "-" if ns is None else f"{ns / 1e3:.2f} us"


def _config(config: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (config or {}).items()) or "-"


def cmd_list(args) -> int:
    found = autotune.entries(args.pattern)
    if not found:
        print(f"no tuning cache entries in {autotune.cache_dir()}" + (f" matching {args.pattern!r}" if args.pattern
                                                                       else ""))
        return 0
    rows = [("KERNEL", "VERSION", "PROFILE", "SIGNATURE", "BEST", "DEVICE TIME", "FILE")]
    for path, e in found:
        if "error" in e and "kernel" not in e:
            rows.append(("?", "?", "?", e["error"], "-", "-", path.name))
            continue
        rows.append((str(e.get("kernel")), f"v{e.get('version')}", str(e.get("profile")), e.get("signature", "?"),
                     _config(e.get("config")), _time(e), path.name))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def cmd_show(args) -> int:
    target = pathlib.Path(args.target)
    found = [(target, None)] if target.is_file() else autotune.entries(args.target)
    if not found:
        print(f"neuron-tune: no entry matches {args.target!r} in {autotune.cache_dir()}", file=sys.stderr)
        return 1
    for i, (path, entry) in enumerate(found):
        if entry is None:
            entry = json.loads(path.read_text())
        if i:
            print()
        print(f"{path}")
        if "error" in entry and "kernel" not in entry:
            print(f"  unreadable: {entry['error']}")
            continue
        print(f"  kernel     {entry.get('kernel')} v{entry.get('version')} on {entry.get('profile')}")
        print(f"  signature  {entry.get('signature', entry.get('key'))}")
        print(f"  best       {_config(entry.get('config'))}: {_time(entry)}")
        if entry.get("recorded"):
            print(f"  recorded   {entry['recorded']}")
        print(f"  trials     {len(entry.get('trials', []))}")
        for t in entry.get("trials", []):
            outcome = _time(t) if "device_ns" in t else "failed: " + t.get("error", "?").splitlines()[0]
            print(f"    {_config(t.get('config')):<40} {outcome}")
    return 0


def cmd_run(args) -> int:
    from neuron_hal import get_profile

    kernel = load_kernel(args.kernel)
    if not kernel.tunables:
        print(f"neuron-tune: kernel {kernel.name!r} declares no tunables; nothing to tune", file=sys.stderr)
        return 1
    kwargs = dict(args.arg or []) | dict(args.const or [])
    profile = get_profile(args.profile)
    best = autotune.tune(kernel, profile=profile, force=args.force, progress=not args.no_progress, **kwargs)
    key = kernel.tuning_key((), kwargs, profile)
    path = autotune.entry_path(key)
    entry = json.loads(path.read_text())
    print(f"{kernel.name} v{kernel.version} {profile.name} ({autotune.describe_signature(key)}): "
          f"{_config(best)}: {_time(entry)}")
    print(f"  {path}")
    return 0


def cmd_clear(args) -> int:
    found = autotune.entries(args.pattern)
    for path, _ in found:
        path.unlink(missing_ok=True)
    what = f" matching {args.pattern!r}" if args.pattern else ""
    noun = "entry" if len(found) == 1 else "entries"
    print(f"removed {len(found)} tuning cache {noun}{what} from {autotune.cache_dir()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="neuron-tune", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list cached entries")
    p.add_argument("pattern", nargs="?", default=None, help="glob or substring of file, kernel or signature")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("show", help="show an entry and its trials")
    p.add_argument("target", help="an entry file, or a pattern as for list")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("run", help="tune one kernel signature")
    p.add_argument("kernel", help="MODULE:KERNEL, e.g. neuron_kernels.library.movement:transpose")
    p.add_argument("--arg", action="append", type=parse_arg, metavar="NAME=SHAPE:DTYPE",
                   help="an array argument, e.g. x=4096x4096:bfloat16 (repeat for each)")
    p.add_argument("--const", action="append", type=parse_const, metavar="NAME=VALUE",
                   help="a constant argument as a Python literal, e.g. dims=(0,2,1)")
    p.add_argument("--profile", default=None, help="device profile (default: $NEURON_DEVICE_PROFILE or trn2)")
    p.add_argument("--force", action="store_true", help="search even when the signature is cached")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("clear", help="delete cached entries")
    p.add_argument("pattern", nargs="?", default=None, help="only entries matching this (as for list)")
    p.set_defaults(fn=cmd_clear)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
