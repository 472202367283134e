"""Installs ``neuron_kernels_nki.pth`` next to the packages (regular and editable installs), so that ``import nki``
finds neuron-kernels' NKI front end when AWS's package is absent (see src/_neuron_kernels_nki.py)."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "neuron_kernels_nki.pth"
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", PTH)


class BuildPy(build_py):
    def run(self):
        super().run()
        self.copy_file(SRC, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class EditableWheel(editable_wheel):
    # the editable wheel holds only setuptools' own path .pth and what is put in its unpacked directory here
    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copy(SRC, os.path.join(installation_dir, PTH))


setup(cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
