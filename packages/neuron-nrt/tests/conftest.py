"""neuron-nrt tests: the round-trip helpers (``roundtrip``) are importable from them (the suite runs with
--import-mode=importlib, which puts no test directory on sys.path)."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# kernels traced here take their defaults, not the choices the autotuner recorded on this machine
os.environ["NEURON_KERNELS_TUNE_CACHE"] = tempfile.mkdtemp(prefix="neuron-nrt-tune-tests-")
atexit.register(shutil.rmtree, os.environ["NEURON_KERNELS_TUNE_CACHE"], True)
