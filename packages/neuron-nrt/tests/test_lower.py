"""neuron_nrt.lower: one tiny program per instruction kind lowers to valid Python naming the matching nisa call,
the same program always gives the same text, the source traces back to the same instructions and values on the
simulator, and what cannot be lowered raises naming the instruction."""

import ast

import neuron_nrt
import numpy as np
import pytest
from neuron_nrt import LOWERING, LoweringError, to_nki
from roundtrip import execute, inputs_for, normalized, retrace

from neuron_hal import AP, Act, Alu, DType, Engine, Program, TensorArg, get_driver, get_profile, isa

F32 = DType.float32
P, N = 32, 16
X = AP.hbm(0, F32, (P, N))
OUT = AP.hbm(1, F32, (P, N))
A, B, C = (AP.sbuf(F32, P, (N,), offset=o) for o in (0, 64, 128))
COL = AP.sbuf(F32, P, (1,), offset=192)
SQ = AP.sbuf(F32, N, (N,), offset=256)  # a square tile for transposes
PS = AP.psum(F32, P, (N,))


def _program(*body, out=OUT, shape=(P, N)) -> Program:
    """x -> SBUF A, ``body``, A -> out."""
    args = (TensorArg("x", (P, N), F32, "in"), TensorArg("out", shape, F32, "out"))
    return Program("tiny", args, (isa.DmaCopy(A, X), *body, isa.DmaCopy(out, A)))


KINDS = {
    "nc_matmul": (_program(isa.DmaCopy(SQ, AP.hbm(0, F32, (N, N))), isa.Matmul(AP.psum(F32, N, (N,)), SQ, SQ),
                           isa.Matmul(AP.psum(F32, N, (N,)), SQ, SQ, accumulate=True),
                           isa.TensorCopy(AP.sbuf(F32, N, (N,)), AP.psum(F32, N, (N,)))), "nc_matmul"),
    "nc_transpose": (_program(isa.Transpose(AP.psum(F32, N, (P,)), A), isa.TensorCopy(
        AP.sbuf(F32, N, (P,), offset=512), AP.psum(F32, N, (P,))), isa.Transpose(A, AP.sbuf(F32, N, (P,), offset=512),
                                                                               engine=Engine.VECTOR)), "nc_transpose"),
    "activation": (_program(isa.Memset(COL, 0.5), isa.Activation(B, A, Act.gelu_tanh, scale=2.0, bias=COL,
                                                                   reduce_dst=COL), isa.Activation(A, B, Act.exp,
                                                                                                   scale=COL)),
                   "activation"),
    "tensor_tensor": (_program(isa.TensorTensor(A, A, A, Alu.mod, engine=Engine.GPSIMD)), "tensor_tensor"),
    "tensor_scalar": (_program(isa.TensorScalar(A, A, Alu.subtract, 3.0, True, Alu.max, float("-inf"),
                                                engine=Engine.GPSIMD)), "tensor_scalar"),
    "scalar_tensor_tensor": (_program(isa.Memset(COL, -1.5), isa.ScalarTensorTensor(B, A, Alu.multiply, COL, Alu.add,
                                                                                     A, reverse1=True),
                                      isa.TensorCopy(A, B)), "scalar_tensor_tensor"),
    "tensor_tensor_scan": (_program(isa.TensorTensorScan(B, A, A, 0.0, Alu.add, Alu.bypass), isa.TensorCopy(A, B)),
                           "tensor_tensor_scan"),
    "tensor_reduce": (_program(isa.TensorReduce(COL, A, Alu.max, (0,), negate=True, engine=Engine.VECTOR),
                               isa.TensorScalar(A, A, Alu.add, COL)), "tensor_reduce"),
    "bn_stats": (_program(isa.BnStats(AP.sbuf(F32, P, (6,), offset=128), A), isa.BnAggr(
        AP.sbuf(F32, P, (2,), offset=192), AP.sbuf(F32, P, (6,), offset=128)), isa.Memset(A, 0.0),
        isa.TensorCopy(AP.sbuf(F32, P, (2,)), AP.sbuf(F32, P, (2,), offset=192))), "bn_stats"),
    "tensor_copy": (_program(isa.TensorCopy(B, A, engine=Engine.GPSIMD), isa.TensorCopy(A, B)), "tensor_copy"),
    "memset": (_program(isa.Memset(A, float("-inf"), engine=Engine.GPSIMD)), "memset"),
    "iota": (_program(isa.Iota(AP.sbuf(F32, P, (4, 4)), (1, 4), offset=-3, channel_multiplier=16)), "iota"),
    "affine_select": (_program(isa.AffineSelect(AP.sbuf(F32, P, (4, 4)), AP.sbuf(F32, P, (4, 4)), (-1, -4), Alu.
                                                greater_equal, -9.0, offset=2, channel_multiplier=1)),
                      "affine_select"),
    "partition_reduce": (_program(isa.PartitionReduce(AP.sbuf(F32, 1, (N,), offset=64), A, Alu.add),
                                  isa.TensorCopy(AP.sbuf(F32, 1, (N,)), AP.sbuf(F32, 1, (N,), offset=64))),
                         "tensor_partition_reduce"),
    "select": (_program(isa.TensorScalar(B, A, Alu.greater, 0.0), isa.Memset(COL, 7.0),
                        isa.Select(C, B, A, AP(COL.space, F32, P, ((N, 0),), offset=COL.offset)),
                        isa.Select(A, B, C, -1.0)), "select_reduce"),
    "dma_copy": (_program(isa.DmaCopy(AP.sbuf(F32, P, (4, 4), offset=64), AP(X.space, F32, P, ((4, 1), (4, 4)),
                                                                             partition_stride=N, tensor=0)),
                          isa.DmaCopy(A, AP.sbuf(F32, P, (N,), offset=64))), "dma_copy"),
}
IDX = AP.sbuf(DType.int32, P, (1,), offset=320)
REVERSED = isa.Iota(IDX, (0,), offset=P - 1, channel_multiplier=-1)  # idx[p] = P - 1 - p: every row once
KINDS["dma_gather"] = (_program(REVERSED, isa.DmaGather(B, X, IDX), isa.TensorCopy(A, B)), "dma_copy")
KINDS["dma_scatter"] = (Program("tiny", (TensorArg("x", (P, N), F32, "in"), TensorArg("out", (P, N), F32, "out")), (
    isa.DmaCopy(A, X), REVERSED, isa.DmaScatter(OUT, A, IDX), isa.DmaScatter(OUT, A, IDX, accumulate=True))),
    "dma_copy")
_TRN3 = get_profile("trn3")


def _transpose_program() -> Program:
    args = (TensorArg("x", (P, N), F32, "in"), TensorArg("out", (N, P), F32, "out"))
    t = AP.sbuf(F32, N, (P,))
    return Program("dma_t", args, (isa.DmaTranspose(t, X), isa.DmaCopy(AP.hbm(1, F32, (N, P)), t)))


def test_every_opcode_has_a_status_and_every_lowered_kind_a_unit_case():
    assert set(LOWERING) == set(isa.OPCODES)
    lowered = {op for op, (s, _) in LOWERING.items() if s == "lowered"}
    covered = {i.opcode for p, _ in KINDS.values() for i in p.instructions} | {"dma_transpose"}
    assert lowered <= covered, sorted(lowered - covered)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_source_is_python_naming_the_nisa_call_and_deterministic(kind):
    program, call = KINDS[kind]
    source = to_nki(program)
    tree = ast.parse(source)
    calls = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "nisa"]
    assert len(calls) == len(program.instructions) and call in calls
    assert to_nki(Program.from_json(program.to_json())) == source  # same program, same text


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_tiny_program_round_trips(kind):
    program, _ = KINDS[kind]
    sim = get_driver("sim")
    _, again = retrace(program, sim.profile)
    assert normalized(again, program) == normalized(program, program)
    inputs = inputs_for(program, seed=3)
    want, got = execute(program, inputs, sim), execute(again, inputs, sim)
    assert np.array_equal(got["out"], want["out"], equal_nan=True)


def test_dma_transpose_round_trips_on_trn3():
    program = _transpose_program()
    source, again = retrace(program, _TRN3)
    assert "nisa.dma_transpose(" in source and normalized(again, program) == normalized(program, program)
    x = inputs_for(program)
    np.testing.assert_array_equal(execute(again, x, get_driver("sim", profile="trn3"))["out"], x["x"].T)


def test_header_roles_and_allocations():
    args = (TensorArg("a", (P, N), F32, "in"), TensorArg("o", (P, N), F32, "out"),
            TensorArg("w", (P, N), F32, "inout"), TensorArg("tmp", (P, N), F32, "scratch"))
    program = Program("k", args, (isa.DmaCopy(A, AP.hbm(0, F32, (P, N))), isa.DmaCopy(AP.hbm(3, F32, (P, N)), A),
                                  isa.DmaCopy(PS, AP.hbm(3, F32, (P, N))), isa.DmaCopy(AP.hbm(2, F32, (P, N)), PS),
                                  isa.DmaCopy(AP.hbm(1, F32, (P, N)), A)))
    source = to_nki(program)
    assert "def k(a, w):" in source and source.rstrip().endswith("return o")
    assert "o = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm, name='o')" in source
    assert "buffer=nl.private_hbm, name='tmp'" in source
    assert "sbuf = nl.ndarray((32, 64), dtype=nl.uint8, buffer=nl.sbuf, name='sbuf', address=(0, 0))" in source
    assert "psum = nl.ndarray((32, 64), dtype=nl.uint8, buffer=nl.psum, name='psum', address=(0, 0))" in source
    _, again = retrace(program, get_profile())
    assert [(a.name, a.role) for a in again.args] == [("a", "in"), ("w", "inout"), ("o", "out"), ("tmp", "scratch")]


def _one(ins, *extra_args) -> Program:
    return Program("bad", (TensorArg("x", (P, N), F32, "in"), TensorArg("out", (P, N), F32, "out"), *extra_args),
                   (isa.DmaCopy(A, X), ins, isa.DmaCopy(OUT, A)))


@pytest.mark.parametrize("program, names", [
    (_one(isa.PartitionBroadcast(A, AP.sbuf(F32, 1, (N,), offset=64))), "partition_broadcast"),
    (_one(isa.DmaGather(A, AP.hbm(2, F32, (P // 2, N)), AP.sbuf(DType.int32, P, (1,), offset=64)),
          TensorArg("table", (P, N), F32, "in")), "NKI bounds an indirect access by its tensor"),
    (_one(isa.TensorScalar(A, A, Alu.abs_max, 0.0)), "abs_max"),
    (_one(isa.Select(A, B, A, C)), "tile of values"),
    (_one(isa.TensorCopy(A, AP(A.space, F32, P, ((N, -1),), offset=60))), "negative free stride"),
    (_one(isa.DmaCopy(AP.sbuf(DType.int64, P, (2,), offset=64), AP.hbm(2, DType.int64, (P, 2))),
          TensorArg("big", (P, 2), DType.int64, "in")), "int64"),
])
def test_what_cannot_be_lowered_raises_naming_it(program, names):
    with pytest.raises(LoweringError, match=names) as e:
        to_nki(program)
    assert "program 'bad' instruction 1" in str(e.value)


def test_the_hardware_driver_is_not_built():
    with pytest.raises(NotImplementedError, match="'nrt' hardware driver is not built yet"):
        neuron_nrt.driver()
    from neuron_hal import DriverNotFoundError, driver_names
    assert "nrt" not in driver_names()  # no entry point: nothing selects a driver that cannot run
    with pytest.raises(DriverNotFoundError, match="'nrt' is not built yet"):
        get_driver("nrt")


def test_readme_table_is_the_lowering_table():
    from pathlib import Path

    from neuron_nrt.lower import markdown
    assert markdown() in (Path(__file__).resolve().parents[1] / "README.md").read_text()
