"""Every NKI name this front end lacks raises NotImplementedError naming it; docs/nki.md is the table's."""

from pathlib import Path

import numpy as np
import pytest

import neuron_kernels
import neuron_kernels.nki as nki
from neuron_hal import DType
from neuron_kernels import KernelError
from neuron_kernels.nki import api
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl
from neuron_kernels.tensors import TensorHandle, hbm_tensor

TENSOR = hbm_tensor(TensorHandle(0, "t", (4, 4), DType.float32, "in"))  # an HBM tensor as kernels receive one
MODULES = {"nki": nki, "nki.language": nl, "nki.isa": nisa, "nki.language.NkiTensor": TENSOR}
MISSING = [(m, n) for m, names in api.API.items() for n, (s, _) in names.items() if s == api.MISSING]
PRESENT = [(m, n) for m, names in api.API.items() for n, (s, _) in names.items() if s != api.MISSING]


@pytest.mark.parametrize("module,name", MISSING)
def test_missing_names_raise_not_implemented_naming_them(module, name):
    with pytest.raises(NotImplementedError, match=rf"{module}\.{name}\b"):
        obj = getattr(MODULES[module], name)  # a constant raises when read
        obj()  # a function (or method) when called


@pytest.mark.parametrize("module,name", PRESENT)
def test_present_names_exist_and_are_not_stubs(module, name):
    obj = getattr(MODULES[module], name)
    assert not getattr(obj, "__nki_missing__", False)


def test_shared_instructions_are_the_library_functions():
    for name in ("tensor_tensor", "tensor_copy", "memset", "nc_transpose", "tensor_tensor_scan",
                 "bn_stats", "bn_aggr"):
        assert getattr(nisa, name) is getattr(neuron_kernels.isa, name)
    assert nl.ds is neuron_kernels.language.ds and nl.affine_range is neuron_kernels.language.affine_range


def test_operators_are_op_arguments_not_tile_functions():
    assert nl.maximum.alu.name == "max" and nl.exp.act.name == "exp" and nl.copy.act.name == "identity"
    with pytest.raises(NotImplementedError, match=r"nl\.equal\(\.\.\.\) as a tile function"):
        nl.equal(TENSOR, TENSOR)
    with pytest.raises(NotImplementedError, match=r"nl\.exp\(\.\.\.\) as a tile function"):
        nl.exp(TENSOR, TENSOR)


def test_activation_is_not_an_alu_op():
    @nki.jit
    def bad(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.exp)
        return a

    with pytest.raises(KernelError, match=r"nl\.exp is not an ALU operator"):
        bad(np.zeros((2, 2), np.float32))


def test_unsupported_modes_of_present_instructions_raise():
    @nki.jit
    def accumulate_registers(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        s = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reduce)
        return a

    with pytest.raises(NotImplementedError, match=r"reduce_cmd=reduce_cmd.reduce"):
        accumulate_registers(np.zeros((2, 2), np.float32))


def test_docs_list_is_generated_from_the_table():
    docs = Path(__file__).resolve().parents[4] / "docs" / "nki.md"
    assert docs.read_text() == api.markdown(), "regenerate docs/nki.md from neuron_kernels.nki.api.markdown()"
