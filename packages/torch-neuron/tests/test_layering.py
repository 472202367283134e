"""The layering, one way: the HAL imports neither torch nor numba, and nothing above the HAL (neuron_kernels,
neuron_nrt, torch_neuron) imports the simulator; drivers reach them through the HAL's registry. Checked on the
sources (every import statement and ``import_module`` of a literal name, function-level ones included) and in a
fresh interpreter (what importing the packages actually loads)."""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ABOVE_THE_HAL = ("neuron_kernels", "neuron_nrt", "torch_neuron")


def _sources(package: str) -> list[pathlib.Path]:
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    return sorted(pathlib.Path(spec.origin).parent.rglob("*.py"))


def _called(call: ast.Call) -> str | None:
    return getattr(call.func, "attr", getattr(call.func, "id", None))


def _imported(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module or "")
        elif (isinstance(node, ast.Call) and _called(node) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def _offenders(package: str, banned: tuple[str, ...]) -> list[str]:
    return [f"{path}: imports {name}" for path in _sources(package) for name in sorted(_imported(path))
            if name.split(".")[0] in banned]


def _loaded(code: str, banned: tuple[str, ...]) -> list[str]:
    """The banned top-level packages in sys.modules after ``code`` runs in a new interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return [m for m in json.loads(out.splitlines()[-1]) if m in banned]


def test_hal_sources_import_neither_torch_nor_numba():
    assert _offenders("neuron_hal", ("torch", "numba", "neuron_sim")) == []


def test_hal_loads_neither_torch_nor_numba():
    every_module = ("import importlib, pkgutil, neuron_hal\n"
                    "for m in pkgutil.walk_packages(neuron_hal.__path__, 'neuron_hal.'):\n"
                    "    importlib.import_module(m.name)")
    assert _loaded(every_module, ("torch", "numba", "neuron_sim")) == []


@pytest.mark.parametrize("package", ABOVE_THE_HAL)
def test_sources_above_the_hal_never_import_the_simulator(package):
    assert _offenders(package, ("neuron_sim",)) == []


def test_kernels_and_lowering_load_no_simulator():
    assert _loaded("import neuron_kernels, neuron_kernels.library, neuron_nrt", ("neuron_sim",)) == []


def test_the_checks_can_fail(tmp_path):
    """The source check sees a function-level import and an import_module of a literal name."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import neuron_sim.driver\n    importlib.import_module('numba')\n")
    assert _imported(bad) == {"neuron_sim.driver", "numba"}
