"""neuron-kernels tests: modules shared by several test files (``attention_contract``) are importable from them
(the suite runs with --import-mode=importlib, which puts no test directory on sys.path)."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the autotuner's recorded choices are the user's (~/.cache/neuron-kernels/tune): a kernel traced in a test takes
# its defaults, whatever was tuned on this machine before (a tuned matmul changed which transposes a test saw)
os.environ["NEURON_KERNELS_TUNE_CACHE"] = tempfile.mkdtemp(prefix="neuron-tune-tests-")
atexit.register(shutil.rmtree, os.environ["NEURON_KERNELS_TUNE_CACHE"], True)
