import ast
import pathlib

import neuron_kernels

SRC = pathlib.Path(neuron_kernels.__file__).parent


def test_kernels_never_import_the_simulator_or_torch():
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("neuron_sim", "torch")), f"{path}: imports {name}"
