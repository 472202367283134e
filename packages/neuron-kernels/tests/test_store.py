"""The on-disk program store: a trace is written once and loaded by later kernels (processes), keyed by
shapes, dtypes, constants and the tracing code; torn entries are misses; no temporary files remain."""

import importlib
import json

import pytest

import neuron_kernels as nk
from neuron_hal import DType, get_profile, validate
from neuron_kernels import TensorSpec, store
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

F32 = DType.float32
validate_module = importlib.import_module("neuron_hal.validate")  # the package exports the function


def make_kernel():
    """A fresh Kernel object each call (an in-memory cache of its own, as in a new process)."""

    @nk.kernel(name="store_scale")
    def store_scale(x, factor=2.0):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(t, x)
        nisa.tensor_scalar(t, t, nisa.Alu.multiply, factor)
        nisa.dma_copy(out, t)
        return out

    return store_scale


@pytest.fixture
def program_store(tmp_path):
    s = store.ProgramStore(tmp_path / "programs")
    previous = store.default_store()
    store.set_default_store(s)
    yield s
    store.set_default_store(previous)


def test_a_trace_is_written_once_and_loaded_by_a_new_kernel(program_store):
    spec = TensorSpec((4, 8), F32)
    first = make_kernel().trace(spec, profile="trn2")
    assert (program_store.misses, program_store.writes, program_store.hits) == (1, 1, 0)
    again = make_kernel().trace(spec, profile="trn2")
    assert program_store.hits == 1 and again == first and again.meta == first.meta
    assert [p.suffix for p in program_store.root.iterdir()] == [".json"]


@pytest.mark.parametrize("change", ["shape", "dtype", "constant", "profile"])
def test_every_input_of_the_trace_is_in_the_address(program_store, change):
    make_kernel().trace(TensorSpec((4, 8), F32), profile="trn2")
    args = {"shape": ((TensorSpec((4, 9), F32),), {}, "trn2"),
            "dtype": ((TensorSpec((4, 8), DType.bfloat16),), {}, "trn2"),
            "constant": ((TensorSpec((4, 8), F32),), {"factor": 3.0}, "trn2"),
            "profile": ((TensorSpec((4, 8), F32),), {}, "trn3")}[change]
    make_kernel().trace(*args[0], profile=args[2], **args[1])
    assert program_store.hits == 0 and program_store.misses == 2


def test_the_tracing_code_is_in_the_address(program_store, monkeypatch):
    kernel, spec = make_kernel(), TensorSpec((4, 8), F32)
    key = ("trn2", ("x", spec))
    before = program_store.address(kernel, key)
    monkeypatch.setattr(store, "sources_digest", lambda *modules: "edited")
    assert program_store.address(kernel, key) != before


def test_a_torn_entry_is_a_miss_and_is_replaced(program_store):
    spec = TensorSpec((4, 8), F32)
    make_kernel().trace(spec, profile="trn2")
    (entry,) = program_store.root.iterdir()
    entry.write_text(entry.read_text()[:50])
    make_kernel().trace(spec, profile="trn2")
    assert program_store.misses == 2 and program_store.writes == 2
    make_kernel().trace(spec, profile="trn2")
    assert program_store.hits == 1


def test_an_edited_entry_is_a_miss_not_an_unvalidated_program(program_store):
    """Loaded programs skip validation (they passed when traced), so an entry whose program text changed after it
    was written (here: an SBUF offset past the partition) must not load."""
    spec = TensorSpec((4, 8), F32)
    make_kernel().trace(spec, profile="trn2")
    (entry,) = program_store.root.iterdir()
    edited = json.loads(entry.read_text())
    assert '"offset": 0' not in edited["program"] and ',0,0,-1]' in edited["program"]
    edited["program"] = edited["program"].replace(",0,0,-1]", ",999999,0,-1]", 1)
    entry.write_text(json.dumps(edited))
    program = make_kernel().trace(spec, profile="trn2")
    assert program_store.misses == 2 and program_store.hits == 0
    validate(program, get_profile("trn2"))


def test_a_loaded_program_is_known_to_pass_validation(program_store, monkeypatch):
    spec = TensorSpec((4, 8), F32)
    make_kernel().trace(spec, profile="trn2")
    checked = []
    monkeypatch.setattr(validate_module, "_check", lambda *a: checked.append(a))
    monkeypatch.setattr(validate_module, "_PASSED", {})
    loaded = make_kernel().trace(spec, profile="trn2")
    assert program_store.hits == 1
    validate(loaded, get_profile("trn2"))
    assert not checked  # a driver's load of it checks nothing again
    validate(loaded, get_profile("trn3"))
    assert checked  # another profile is checked


def test_a_replaced_profile_of_the_same_name_has_its_own_programs(program_store):
    spec = TensorSpec((4, 8), F32)
    trn2 = get_profile("trn2")
    make_kernel().trace(spec, profile=trn2)
    make_kernel().trace(spec, profile=trn2.replace(sbuf_partition_bytes=trn2.sbuf_partition_bytes // 2))
    assert program_store.hits == 0 and program_store.misses == 2


def test_an_unwritable_store_only_costs_a_retrace(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    s = store.ProgramStore(blocker / "programs")
    kernel = make_kernel()
    kernel.store = s
    assert kernel.trace(TensorSpec((4, 8), F32), profile="trn2") is not None
    assert s.writes == 0


def test_kernels_capturing_unprintable_values_are_not_stored(program_store):
    marker = object()

    @nk.kernel(name="store_captures")
    def captures(x):
        assert marker is not None
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.dma_copy(out, x)
        return out

    captures.trace(TensorSpec((4, 8), F32), profile="trn2")
    assert (program_store.hits, program_store.misses, program_store.writes) == (0, 0, 0)


def test_kernels_of_one_name_from_different_functions_do_not_share_entries(program_store):
    """elementwise.sub and wide_int.sub: same name, same argument signature, different programs."""

    @nk.kernel(name="store_twin")
    def scale_by_two(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(t, x)
        nisa.tensor_scalar(t, t, nisa.Alu.multiply, 2.0)
        nisa.dma_copy(out, t)
        return out

    @nk.kernel(name="store_twin")
    def copy_only(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.dma_copy(out, x)
        return out

    spec = TensorSpec((4, 8), F32)
    first = scale_by_two.trace(spec, profile="trn2")
    second = copy_only.trace(spec, profile="trn2")
    assert program_store.hits == 0 and first != second
