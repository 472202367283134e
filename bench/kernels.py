"""Kernel library benchmarks on a simulated core: device time and fraction of roofline, default and tuned.

One line per case and configuration:
    bench kernel <name> <shape> <dtype>: <us> us, <pct>% of roofline (<us> us device)
The first figure is the kernel's own span, against which the roofline fraction is taken; the device time adds
the runtime's per-launch start-up and tear-down (``roofline.kernel_ns``). Device time comes from the driver's cost
model (``Driver.estimate``), never from constants in a kernel.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import pkgutil
import sys

from neuron_hal import get_driver, get_profile
from neuron_kernels import roofline

HERE = pathlib.Path(__file__).resolve().parent


def cases():
    sys.path.insert(0, str(HERE))
    import kernel_cases

    for mod in pkgutil.iter_modules(kernel_cases.__path__):
        yield from importlib.import_module(f"kernel_cases.{mod.name}").CASES


def measure(driver, case, **overrides) -> float:
    program = case.kernel.trace(*case.args, profile=driver.profile, **case.kwargs, **overrides)
    return driver.estimate(0, driver.load(0, program)).device_ns


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None)
    ap.add_argument("--only", default=None, help="run only families whose name contains this")
    ap.add_argument("--no-tune", action="store_true")
    args = ap.parse_args(argv)
    profile = get_profile(args.profile)
    driver = get_driver("sim", profile)
    for case in cases():
        if args.only and args.only not in case.family:
            continue
        ideal = (roofline.tensor_ns(profile, case.work, case.dtype) if case.roofline == "tensor"
                 else roofline.dma_ns(profile, case.work))
        label = f"bench kernel {case.family} {case.shape} {case.dtype}"
        defaults = {k: case.kernel.signature.parameters[k].default for k in case.kernel.tunables}
        configs = [("", defaults)]  # explicit: a tuned entry in the cache must not leak into this line
        if case.kernel.tunables and not args.no_tune:
            from neuron_kernels.autotune import tune

            best = tune(case.kernel, *case.args, profile=profile, driver=driver, **case.kwargs)
            configs.append((" tuned", best))
        for suffix, config in configs:
            ns = measure(driver, case, **config)
            pct = 100 * roofline.fraction(profile, ideal, ns)
            print(f"{label}{suffix}: {roofline.kernel_ns(profile, ns) / 1e3:.2f} us, {pct:.1f}% of roofline "
                  f"({ns / 1e3:.2f} us device)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
