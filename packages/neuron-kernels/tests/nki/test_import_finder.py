"""``import nki``: answered by neuron-kernels only when no other ``nki`` is importable, never shadowing AWS's."""

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def run(code: str, extra_path=(), **env) -> str:
    path = os.pathsep.join([*map(str, extra_path), os.environ.get("PYTHONPATH", ""), str(SRC)])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, "PYTHONPATH": path, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_import_nki_after_neuron_kernels_is_the_front_end():
    out = run("import neuron_kernels, nki, nki.language as nl, nki.isa as nisa, neuron_kernels.nki as m;"
              "print(nki is m, nl is m.language, nisa is m.isa, nki.__spec__.name)")
    assert out == "True True True neuron_kernels.nki"


def test_registered_finder_alone_answers_import_nki():
    # what the installed neuron_kernels_nki.pth does at interpreter start
    line = (SRC / "neuron_kernels_nki.pth").read_text().strip()
    assert run(f"{line}\nimport nki; print(nki.__neuron_kernels_nki__)") == "True"


def test_never_shadows_an_installed_nki(tmp_path):
    fake = tmp_path / "nki"
    fake.mkdir()
    (fake / "__init__.py").write_text("AWS = True\n")
    (fake / "language.py").write_text("AWS_LANGUAGE = True\n")
    code = "import neuron_kernels, nki, nki.language; print(nki.AWS, nki.language.AWS_LANGUAGE)"
    assert run(code, extra_path=[tmp_path]) == "True True"
    # the explicit opt-in replaces it in sys.modules (test harnesses that swap the NKI modules)
    code = ("import nki; import neuron_kernels.nki as m; m.install(override=True); import sys;"
            "print(sys.modules['nki'] is m, sys.modules['nki.isa'] is m.isa)")
    assert run(code, extra_path=[tmp_path]) == "True True"


def test_switched_off_by_environment():
    out = run("import neuron_kernels\ntry:\n import nki\nexcept ModuleNotFoundError: print('absent')",
              NEURON_KERNELS_NKI="0")
    assert out == "absent"


def test_unimplemented_submodule_raises_not_implemented():
    code = ("import neuron_kernels, nki\ntry:\n import nki.collectives\n"
            "except NotImplementedError as e: print(isinstance(e, ImportError), e)")
    out = run(code)
    assert out.startswith("True nki.collectives is not implemented")


