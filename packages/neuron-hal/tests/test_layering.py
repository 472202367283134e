"""The HAL (its CLIs included) imports neither torch, numba nor the simulator: drivers come through the registry."""

import ast
import pathlib

import neuron_hal

SRC = pathlib.Path(neuron_hal.__file__).parent


def test_hal_never_imports_torch_numba_or_the_simulator():
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("neuron_sim", "torch", "numba")), f"{path}: imports {name}"
