"""Sessions: test (every package's tests), lint (ruff), bench (performance figures), demo (the main job), calibrate
(the simulator against published Trainium measurements), zoo (the Transformers model zoo), torchtitan (TorchTitan's
debug model on 2 neuron ranks against CPU/gloo), fuzz (the long differential fuzzing profile)."""

import hashlib
import os
from pathlib import Path

import nox

nox.options.sessions = ["test"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"  # a rerun on the same clone reuses its environment (see install)

PYTHON = "3.11"
PACKAGES = ["packages/neuron-hal", "packages/neuron-sim", "packages/neuron-kernels", "packages/neuron-nrt",
            "packages/torch-neuron"]
TESTS = [f"{p}/tests" for p in PACKAGES]


def install(session, *extra):
    """The packages and ``extra`` into the session's environment, skipped when the environment already holds
    exactly these sources and pins (a rerun of `nox -s demo` on the same clone starts in seconds)."""
    stamp = Path(session.virtualenv.location) / ".torch-neuron-installed"
    want = _fingerprint(extra)
    if stamp.exists() and stamp.read_text() == want:
        session.log("packages and pins unchanged since this environment was installed: not reinstalling")
        return
    session.install("-c", "constraints.txt", *PACKAGES, *extra)
    stamp.write_text(want)


def _fingerprint(extra) -> str:
    """A digest of the pins, the extra requirements and every file of the packages' sources and metadata."""
    digest = hashlib.sha256(Path("constraints.txt").read_bytes() + "\0".join(extra).encode())
    for package in PACKAGES:
        for path in sorted(Path(package).rglob("*")):
            if path.is_file() and "tests" not in path.parts and "__pycache__" not in path.parts \
                    and ".egg-info" not in str(path) and "build" not in path.parts:
                digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# PyTorch's own test databases on neuron (op_db / module_db / optim_db against the CPU) are among the tests, every
# sample of every entry (TORCH_NEURON_OPINFO_SAMPLES=N runs the first N per entry); `opinfo` runs them alone and
# can rewrite the exclusions file. Everything runs
# under pytest-xdist on both cores, which also turns a crash in native code into one failed test instead of a
# dead run.
DB_TESTS = [f"packages/torch-neuron/tests/{f}" for f in ("test_ops.py", "test_modules.py", "test_optim.py")]
TEST_DEPS = ("pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "expecttest", "safetensors", "transformers",
             "accelerate", "peft", "trl", "diffusers", "datasets")


@nox.session(python=PYTHON)
def test(session):
    """Install the packages and run every package's tests (the test databases in full), on 2 workers; the 25
    slowest tests are listed at the end (CI keeps the suite well under 30 minutes)."""
    install(session, *TEST_DEPS)
    # programs are traced in each test process (TORCH_NEURON_COMPILE_CACHE=off): tests that define kernels must
    # not read another test's traces; the cache's own tests point it at their own directories
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--durations=25", *TESTS, *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache"), "TORCH_NEURON_COMPILE_CACHE": "off"})


@nox.session(python=PYTHON)
def opinfo(session):
    """The test databases alone (op_db float32/bfloat16, module_db, optim_db) with every sample, and their summary
    (ops passing all samples, % native); `nox -s opinfo -- --update-exclusions` rewrites
    packages/torch-neuron/tests/opinfo_exclusions.toml from the failures of the run."""
    install(session, *TEST_DEPS)
    env = {"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache"), "TORCH_NEURON_OPINFO_SAMPLES": "all",
           "TORCH_NEURON_COMPILE_CACHE": "off"}
    updating = "--update-exclusions" in session.posargs
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--timeout", "3600", *DB_TESTS,
                *session.posargs, env=env, success_codes=[0, 1] if updating else [0])


@nox.session(python=PYTHON)
def fuzz(session):
    """The long differential fuzzing profile: every op family on neuron against the CPU, float64 arbitrating
    disagreements, for a time budget split over the families and their ops (`-- --seed N --budget SECONDS`,
    default seed 1 and 900 s; `--families unary,op_db`, `--ops sort,topk`, `--examples N` cases per search);
    prints the summary and writes it to docs/fuzz.md. The fast profile is tests/test_fuzz.py in `test`."""
    install(session, "hypothesis", "pytest", "expecttest")
    session.run("python", "bench/fuzz.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache"), "TORCH_NEURON_COMPILE_CACHE": "off"})


@nox.session(python=PYTHON)
def zoo(session):
    """The Transformers model zoo: every architecture of transformers' causal-LM mapping, tiny and random, forward /
    backward / greedy generate() on neuron against the CPU, one process per architecture (`-- --jobs N` runs N at
    once; default 1); writes docs/zoo.md (status table, coverage) and docs/zoo.json."""
    install(session, "transformers")
    session.run("python", "bench/zoo.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache"), "HF_HUB_OFFLINE": "1"})


@nox.session(name="zoo_compile", python=PYTHON)
def zoo_compile(session):
    """The model zoo under torch.compile(backend="neuron"): forward and backward of each compiled architecture
    against the CPU's eager run, one process per architecture (`-- --attn eager` for written-out attention,
    `-- --jobs N`); writes docs/zoo_compile.md and docs/zoo_compile.json."""
    install(session, "transformers")
    session.run("python", "bench/zoo_compile.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache"), "HF_HUB_OFFLINE": "1"})


@nox.session(python=PYTHON)
def lint(session):
    session.install("-c", "constraints.txt", "ruff")
    session.run("ruff", "check", ".")


@nox.session(python=PYTHON)
def bench(session):
    """Print `bench <name>: <value> <unit>` lines (SCALE-Sim runs in its own venv under .bench/)."""
    install(session)
    env = {"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")}
    session.run("python", "bench/run.py", *session.posargs, env=env)
    session.run("python", "bench/kernels.py", env=env)
    session.run("python", "bench/torch_ops.py", env=env)
    session.run("python", "bench/compile.py", env=env)
    session.run("python", "bench/compile_wall.py", env=env)
    session.run("python", "bench/distributed.py", env=env)


@nox.session(python=PYTHON)
def calibrate(session):
    """The calibration suite: every published hardware measurement against the simulator (one line per case, the
    families' orders and spreads, the summary), the fit of the model's free parameters with residuals and
    leave-one-family-out errors, and docs/fidelity.md rewritten (`-- --no-fit` skips the fit)."""
    install(session)
    env = {"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")}
    fit = "--no-fit" not in session.posargs
    args = [a for a in session.posargs if a != "--no-fit"]
    session.run("python", "packages/neuron-sim/calibration/run.py", "--write", "docs/fidelity.md", *args, env=env)
    if fit:
        session.run("python", "packages/neuron-sim/calibration/fit.py", *args, env=env)


@nox.session(python=PYTHON)
def demo(session):
    """Train a small GPT with PyTorch on a simulated Trainium2 core: loss, simulated step time, tokens/s, MFU."""
    install(session)
    session.run("python", "demo/gpt.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")})


@nox.session(python=PYTHON)
def torchtitan(session):
    """TorchTitan's llama3 debug model on 2 neuron ranks (FSDP2), losses against the same run on CPU/gloo (issue 6)."""
    install(session, "torchtitan", "triton")
    session.run("python", "demo/run_torchtitan.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")})


@nox.session(name="demo-gemm", python=PYTHON)
def demo_gemm(session):
    """A tiled GEMM on a simulated Trainium2 core: result check, device time, engine utilization."""
    install(session)
    session.run("python", "demo/gemm.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")})
