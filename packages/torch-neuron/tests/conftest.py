"""torch-neuron tests: the database harness (``torch_neuron_testing``) is importable from the test files,
and runs of the op_db / module_db / optim_db tests end with their summary lines (and, with
``--update-exclusions``, rewrite ``opinfo_exclusions.toml`` from the failures seen).

Run the database tests with pytest-xdist (``-n 2``): besides using both cores, a test that crashes its
process (a segfault in native code) is then reported as a failure (or xfailed when listed) instead of
ending the run.
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# torch (and with it torch_neuron) loaded before pytest-xdist's controller rebuilds a worker's
# NeuronFallbackWarning
import torch  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the autotuner's recorded choices are the user's (~/.cache/neuron-kernels/tune): a kernel traced in a test takes
# its defaults, whatever was tuned on this machine before (a tuned matmul changed which transposes a test saw)
os.environ["NEURON_KERNELS_TUNE_CACHE"] = tempfile.mkdtemp(prefix="neuron-tune-tests-")
atexit.register(shutil.rmtree, os.environ["NEURON_KERNELS_TUNE_CACHE"], True)

from torch_neuron_testing import exclusions  # noqa: E402
from torch_neuron_testing import report as db_report  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--update-exclusions", action="store_true", default=False,
                     help="rewrite opinfo_exclusions.toml from this run's op_db/module_db/optim_db failures "
                          "(entries of tests that did not run are kept); run the full databases for this")
    parser.addoption("--db-report", metavar="PATH", default=None,
                     help="write every database test's outcome (status, reason, CPU fallbacks) as JSON to PATH")


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist: a database test whose worker crashed gets an outcome, and is xfailed when listed."""
    outcome = db_report.crash_outcome(crashitem)
    if outcome is None:
        return
    report.user_properties.append((db_report.PROPERTY, outcome))
    known = exclusions.lookup(outcome["section"], outcome["key"])
    if known is not None:
        report.outcome = "skipped"
        report.wasxfail = f"listed in opinfo_exclusions.toml: {known.reason}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reports = [r for key in ("passed", "failed", "skipped", "xfailed", "xpassed")
               for r in terminalreporter.stats.get(key, [])]
    results = db_report.outcomes(reports)
    if not results:
        return
    terminalreporter.section("neuron: PyTorch test databases")
    for line in db_report.summary(results):
        terminalreporter.write_line(line)
    if config.getoption("--db-report"):
        with open(config.getoption("--db-report"), "w") as f:
            json.dump(sorted(results, key=lambda r: (r["section"], r["key"])), f, indent=1)
    if config.getoption("--update-exclusions"):
        before, after = db_report.update(results)
        terminalreporter.write_line(f"opinfo_exclusions.toml: {before} -> {after} entries")
