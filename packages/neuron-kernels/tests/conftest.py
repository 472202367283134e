"""neuron-kernels tests: modules shared by several test files (``attention_contract``) are importable from them
(the suite runs with --import-mode=importlib, which puts no test directory on sys.path)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
