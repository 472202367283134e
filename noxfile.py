"""Sessions: test (every package's tests), lint (ruff), bench (performance figures), demo (the main job)."""

import os

import nox

nox.options.sessions = ["test"]
nox.options.default_venv_backend = "venv"

PYTHON = "3.11"
PACKAGES = ["packages/neuron-hal", "packages/neuron-sim", "packages/neuron-kernels", "packages/torch-neuron"]
TESTS = [f"{p}/tests" for p in PACKAGES]


def install(session, *extra):
    session.install("-c", "constraints.txt", *PACKAGES, *extra)


@nox.session(python=PYTHON)
def test(session):
    """Install the packages and run every package's tests."""
    install(session, "pytest", "pytest-timeout", "hypothesis")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *TESTS, *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")})


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


@nox.session(python=PYTHON)
def demo(session):
    """A tiled GEMM on a simulated Trainium2 core: result check, device time, engine utilization."""
    install(session)
    session.run("python", "demo/gemm.py", *session.posargs,
                env={"NUMBA_CACHE_DIR": os.path.abspath(".nox/numba-cache")})
