"""NKI front-end tests: the kernels they share (``nki_kernels``) are importable from them. The directory itself is
never importable as ``nki`` from the test run: tests import the front end as ``neuron_kernels.nki``, and the ``import
nki`` answer is tested in subprocesses with a clean sys.path (test_import_finder.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
