"""Side-by-side reference benchmark: SCALE-Sim 3.0.0 on one GEMM.

SCALE-Sim (PyPI ``scalesim``) is a cycle-level *timing* model of a systolic array: it generates the
address/demand streams of the operands and counts cycles; no values are multiplied. It needs
numpy < 2.4 (with numpy 2.4 its memory model crashes in ``int(max(...))`` on 1-element arrays), so it
lives in its own virtual environment, never in the project's environment.

Run as a script::

    python bench/scalesim_gemm.py [--venv PATH]

It creates (or reuses) the venv (default ``.bench/scalesim-venv`` under the repo root), simulates
C[M,N] = A[M,K] @ B[K,N] with M = N = K = 1024 on a 128x128 weight-stationary array, and prints::

    bench scalesim_version: 3.0.0
    bench scalesim_gemm_1024_wall: <seconds> s
    bench scalesim_gemm_1024_cycles: <cycles> cycles

Progress and extra detail go to stderr. From the project's environment, ``run_scalesim(venv)`` does the
same and returns a dict. This module imports only the standard library; SCALE-Sim runs in a subprocess
with the venv's interpreter.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = REPO_ROOT / ".bench" / "scalesim-venv"

SCALESIM_VERSION = "3.0.0"
# Newest numpy below 2.4 on PyPI; scalesim 3.0.0 and its numba dependency resolve with it.
NUMPY_VERSION = "2.3.5"
# Only the packages installed directly are pinned; pip resolves their dependencies (numba, pandas, tqdm, ...).
REQUIREMENTS = (f"scalesim=={SCALESIM_VERSION}", f"numpy=={NUMPY_VERSION}")

ARRAY_ROWS = 128
ARRAY_COLS = 128
DATAFLOW = "ws"

PIP_TIMEOUT_S = 1800
SIM_TIMEOUT_S = 3600
RESULT_MARKER = "SCALESIM_BENCH_RESULT "


class ScaleSimBenchError(RuntimeError):
    """The SCALE-Sim venv could not be set up or the simulation failed; the message gives the cause."""


# SCALE-Sim configuration. Options chosen, and why:
# - Dataflow = ws: weight stationary. Trainium's PE array keeps one operand stationary in the array; in
#   SCALE-Sim's ws the filter B[K,N] is stationary (K on the array rows, N on the columns) and A[M,K]
#   streams through, M rows one after another.
# - ArrayHeight x ArrayWidth = 128 x 128, like Trainium's PE array.
# - SRAM sizes: ifmap 12 MiB + filter 12 MiB (a 24 MiB SBUF split between the two inputs) and ofmap 2 MiB
#   (PSUM-sized). SCALE-Sim counts one byte per word, so each 1024x1024 operand (1 MiB) fits whole and SRAM
#   capacity does not shape the result.
# - InterfaceBandwidth = CALC: "estimate bandwidth" mode, where SCALE-Sim works out the DRAM bandwidth a
#   stall-free run needs instead of stalling on a made-up DRAM bandwidth, so its compute cycles are the
#   array's own (stall cycles come out 0). In this mode the Bandwidth key is not read, so it is left out.
# - UseRamulatorTrace = False (no external DRAM timing traces), SparsitySupport = false (dense GEMM).
# - IfmapCustomLayout / FilterCustomLayout = False: default SRAM layouts (bank keys are then unused).
# - No [network_presets] section: the topology file is passed to the API directly.
CONFIG_TEMPLATE = """\
[general]
run_name = {run_name}

[architecture_presets]
ArrayHeight = {rows}
ArrayWidth = {cols}
IfmapSramSzkB = 12288
FilterSramSzkB = 12288
OfmapSramSzkB = 2048
IfmapOffset = 0
FilterOffset = 10000000
OfmapOffset = 20000000
Dataflow = {dataflow}
ReadRequestBuffer = 32
WriteRequestBuffer = 32

[layout]
IfmapCustomLayout = False
IfmapSRAMBankBandwidth = 10
IfmapSRAMBankNum = 10
IfmapSRAMBankPort = 2
FilterCustomLayout = False
FilterSRAMBankBandwidth = 10
FilterSRAMBankNum = 10
FilterSRAMBankPort = 2

[sparsity]
SparsitySupport = false
SparseRep = ellpack_block
OptimizedMapping = false
BlockSize = 8
RandomNumberGeneratorSeed = 40

[run_presets]
InterfaceBandwidth = CALC
UseRamulatorTrace = False
"""

# GEMM topology for input_type_gemm=True (scalesim.topology_utils.load_arrays_gemm): the first line is a
# header and is skipped; each row is "name, M, N, K," and the parser drops the field after the last comma,
# so the trailing comma is required. It maps the row to ifmap A[M,K] and filter B[K,N] (ofmap C[M,N]).
TOPOLOGY_TEMPLATE = "Layer, M, N, K,\n{name}, {m}, {n}, {k},\n"

# scalesim.scale_sim.scalesim always opens a layout file, even with custom layouts off. A header-only file
# parses to no entries, and its contents are unused when IfmapCustomLayout/FilterCustomLayout are False.
LAYOUT_TEXT = "Layer name,\n"

# Runs inside the venv. It uses the Python API rather than ``python -m scalesim.scale``, because that CLI
# ignores its "-s N" (save trace) flag and always writes the per-cycle trace files. Here:
# - save_disk_space=True: the per-cycle SRAM/DRAM trace CSVs (IFMAP/FILTER/OFMAP_{SRAM,DRAM}_TRACE.csv)
#   are not written; only the three small report CSVs are.
# - verbose=False: no banner, per-layer printout or tqdm progress bar.
# The timed span is the simulation call: building the simulator (config and topology parsing) plus
# run_scale() (compute model, memory model, report files). Interpreter start-up and imports are outside it.
DRIVER = """\
import importlib.metadata
import json
import sys
import time

config, topology, layout, out_dir = sys.argv[1:5]
from scalesim.scale_sim import scalesim

t0 = time.perf_counter()
try:
    sim = scalesim(save_disk_space=True, verbose=False, config=config, topology=topology, layout=layout,
                   input_type_gemm=True)
    sim.run_scale(top_path=out_dir)
except SystemExit as exc:  # scalesim calls exit() after printing its own error message
    raise SystemExit(f"scalesim exited early (code {exc.code!r}); see its printed message")
wall_s = time.perf_counter() - t0
print("__RESULT_MARKER__" + json.dumps({
    "wall_s": wall_s,
    "scalesim_version": importlib.metadata.version("scalesim"),
    "numpy_version": importlib.metadata.version("numpy"),
}))
""".replace("__RESULT_MARKER__", RESULT_MARKER)

CHECK_SNIPPET = """\
import importlib.metadata, json
import scalesim.scale_sim
print(json.dumps({name: importlib.metadata.version(name) for name in ("scalesim", "numpy")}))
"""


def _log(verbose: bool, message: str) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


def _venv_python(venv: Path) -> Path:
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def _child_env() -> dict[str, str]:
    """Environment for the venv's processes: nothing from the project's environment leaks onto sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _installed_versions(python: Path) -> tuple[dict[str, str] | None, str]:
    """Versions of scalesim and numpy in the venv, or None and the reason if scalesim does not import."""
    if not python.exists():
        return None, f"{python} does not exist"
    try:
        proc = subprocess.run(
            [str(python), "-c", CHECK_SNIPPET], capture_output=True, text=True, env=_child_env(), timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run {python}: {exc}"
    if proc.returncode != 0:
        return None, _tail(proc.stderr or proc.stdout, 5)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, f"unexpected output from {python}: {proc.stdout!r}"


def _runs(python: Path) -> bool:
    try:
        return subprocess.run([str(python), "-c", "pass"], capture_output=True, env=_child_env()).returncode == 0
    except OSError:
        return False


def _pinned(versions: dict[str, str] | None) -> bool:
    return versions == {"scalesim": SCALESIM_VERSION, "numpy": NUMPY_VERSION}


def ensure_venv(venv: Path, verbose: bool = False) -> Path:
    """Create, repair or reuse the SCALE-Sim venv at ``venv``; return its python.

    An existing venv is reused as is when scalesim imports in it at the pinned versions. Otherwise the pinned
    packages are (re)installed, and the venv is recreated if its interpreter does not run. A directory that
    is not a venv is never cleared. Raises ScaleSimBenchError with the cause on failure.
    """
    venv = Path(venv).absolute()
    python = _venv_python(venv)

    versions, why = _installed_versions(python)
    if _pinned(versions):
        _log(verbose, f"reusing SCALE-Sim venv {venv} (scalesim {versions['scalesim']}, numpy {versions['numpy']})")
        return python

    if python.exists() and _runs(python):
        _log(verbose, f"SCALE-Sim venv {venv} is not at the pinned versions ({versions or why}); reinstalling")
    else:
        if venv.exists() and not (venv.is_dir() and (not any(venv.iterdir()) or (venv / "pyvenv.cfg").exists())):
            raise ScaleSimBenchError(f"{venv} exists and is neither empty nor a virtual environment; not touching it")
        _log(verbose, f"creating SCALE-Sim venv {venv} with {sys.executable} ...")
        try:
            venv.parent.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run(
                [sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True, env=_child_env()
            )
        except OSError as exc:
            raise ScaleSimBenchError(f"could not create the venv {venv}: {exc}") from exc
        if proc.returncode != 0 or not python.exists():
            raise ScaleSimBenchError(
                f"could not create the venv {venv} with {sys.executable} -m venv:\n{_tail(proc.stderr + proc.stdout)}"
            )

    _log(verbose, f"installing {' '.join(REQUIREMENTS)} into {venv} (may take a few minutes) ...")
    try:
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", *REQUIREMENTS],
            capture_output=True,
            text=True,
            env=_child_env(),
            timeout=PIP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise ScaleSimBenchError(f"pip install {' '.join(REQUIREMENTS)} timed out after {exc.timeout} s") from exc
    except OSError as exc:
        raise ScaleSimBenchError(f"cannot run pip in {venv}: {exc}") from exc
    if proc.returncode != 0:
        raise ScaleSimBenchError(
            f"pip install {' '.join(REQUIREMENTS)} failed in {venv} (exit {proc.returncode}):\n"
            f"{_tail(proc.stderr + proc.stdout)}"
        )

    versions, why = _installed_versions(python)
    if not _pinned(versions):
        raise ScaleSimBenchError(
            f"after installing, {venv} has {versions or 'no importable scalesim'} "
            f"instead of scalesim {SCALESIM_VERSION} / numpy {NUMPY_VERSION}: {why}"
        )
    _log(verbose, f"SCALE-Sim venv ready: scalesim {versions['scalesim']}, numpy {versions['numpy']}")
    return python


def _read_compute_report(path: Path) -> dict[str, str]:
    """The single layer row of SCALE-Sim's COMPUTE_REPORT.csv, keyed by its (stripped) column names."""
    if not path.exists():
        raise ScaleSimBenchError(f"SCALE-Sim finished without writing {path.name}")
    with path.open(newline="") as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f) if row]
    if len(rows) != 2:
        raise ScaleSimBenchError(f"expected a header and one layer row in {path.name}, got {rows!r}")
    return dict(zip(rows[0], rows[1]))


def _simulate(python: Path, m: int, n: int, k: int) -> dict:
    for name, value in (("m", m), ("n", n), ("k", k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    run_name = "scalesim_gemm"
    with tempfile.TemporaryDirectory(prefix="scalesim-bench-") as tmp:
        work = Path(tmp)
        config = work / "scale.cfg"
        topology = work / "gemm.csv"
        layout = work / "layout.csv"
        driver = work / "driver.py"
        out_dir = work / "out"
        config.write_text(
            CONFIG_TEMPLATE.format(run_name=run_name, rows=ARRAY_ROWS, cols=ARRAY_COLS, dataflow=DATAFLOW)
        )
        topology.write_text(TOPOLOGY_TEMPLATE.format(name=f"gemm_{m}x{n}x{k}", m=m, n=n, k=k))
        layout.write_text(LAYOUT_TEXT)
        driver.write_text(DRIVER)

        cmd = [str(python), str(driver), str(config), str(topology), str(layout), str(out_dir)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=work, capture_output=True, text=True, env=_child_env(), timeout=SIM_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise ScaleSimBenchError(f"SCALE-Sim did not finish within {exc.timeout} s") from exc
        except OSError as exc:
            raise ScaleSimBenchError(f"cannot run {python}: {exc}") from exc
        process_wall_s = time.perf_counter() - t0

        result_lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
        if proc.returncode != 0 or not result_lines:
            raise ScaleSimBenchError(
                f"SCALE-Sim failed (exit {proc.returncode}) on GEMM M={m} N={n} K={k}:\n"
                f"{_tail(proc.stderr + proc.stdout)}"
            )
        info = json.loads(result_lines[-1][len(RESULT_MARKER) :])
        report = _read_compute_report(out_dir / run_name / "COMPUTE_REPORT.csv")

    try:
        cycles = int(report["Total Cycles"])
        return {
            "wall_s": float(info["wall_s"]),
            # "Total Cycles" in COMPUTE_REPORT.csv (printed as "Compute cycles" in SCALE-Sim's verbose mode):
            # cycles from the first operand entering the array to the last output leaving it, stalls included.
            "cycles": cycles,
            "stall_cycles": int(report["Stall Cycles"]),
            # Also counts the initial DRAM->SRAM prefetch at CALC mode's assumed bandwidth; not the headline.
            "cycles_incl_prefetch": int(report["Total Cycles (incl. prefetch)"]),
            "overall_util_pct": float(report["Overall Util %"]),
            "mapping_efficiency_pct": float(report["Mapping Efficiency %"]),
            # Subprocess wall time: interpreter start-up, imports and the simulation call.
            "process_wall_s": process_wall_s,
            "scalesim_version": info["scalesim_version"],
            "numpy_version": info["numpy_version"],
            "array": f"{ARRAY_ROWS}x{ARRAY_COLS}",
            "dataflow": DATAFLOW,
        }
    except (KeyError, ValueError) as exc:
        raise ScaleSimBenchError(f"unexpected COMPUTE_REPORT.csv contents {report!r}: {exc!r}") from exc


def run_scalesim(venv: Path, m: int = 1024, n: int = 1024, k: int = 1024) -> dict:
    """Simulate C[M,N] = A[M,K] @ B[K,N] with SCALE-Sim on a 128x128 weight-stationary array.

    Creates or reuses the venv first (not timed). Returns a dict with ``wall_s`` (seconds of the
    simulation call inside the venv) and ``cycles`` (SCALE-Sim's compute cycles), plus detail keys.
    Raises ScaleSimBenchError with the cause if the venv cannot be set up or SCALE-Sim fails.
    """
    return _simulate(ensure_venv(Path(venv)), m, n, k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--venv", type=Path, default=DEFAULT_VENV, help=f"SCALE-Sim virtual environment (default: {DEFAULT_VENV})"
    )
    args = parser.parse_args(argv)
    m = n = k = 1024
    try:
        python = ensure_venv(args.venv, verbose=True)
        _log(True, f"running SCALE-Sim: GEMM M={m} N={n} K={k}, {ARRAY_ROWS}x{ARRAY_COLS} array, dataflow {DATAFLOW}")
        result = _simulate(python, m, n, k)
    except ScaleSimBenchError as exc:
        print(f"error: SCALE-Sim benchmark failed: {exc}", file=sys.stderr)
        return 1
    _log(
        True,
        f"note: stall cycles {result['stall_cycles']}, cycles incl. prefetch {result['cycles_incl_prefetch']}, "
        f"utilization {result['overall_util_pct']:.2f}%, subprocess wall {result['process_wall_s']:.3f} s",
    )
    print(f"bench scalesim_version: {result['scalesim_version']}")
    print(f"bench scalesim_gemm_1024_wall: {result['wall_s']:.3f} s")
    print(f"bench scalesim_gemm_1024_cycles: {result['cycles']} cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
