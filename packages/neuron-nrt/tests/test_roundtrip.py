"""The round trip across the kernel library: each kernel traced to a Program, lowered to NKI source, traced again
by the project's NKI front end, and both programs run on the simulator with the same random inputs: the outputs
must be bit-identical and the instructions the same (up to what NKI leaves to its compiler: roundtrip.normalized).
Kernels holding an instruction the lowering cannot express must raise LoweringError naming it."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_nrt import LOWERING, LoweringError
from roundtrip import execute, inputs_for, normalized, retrace

from neuron_hal import DType, get_driver
from neuron_kernels.library import (
    attention,
    attention_short,
    elementwise,
    embedding,
    loss,
    matmul,
    movement,
    nll,
    norms,
    reduce,
    softmax,
    sort,
)
from neuron_kernels.library import random as rnd

F32, BF16 = np.float32, DType.bfloat16.numpy
_rng = np.random.default_rng(0)
X = _rng.standard_normal((256, 384)).astype(F32)
Q = _rng.standard_normal((1, 130, 32)).astype(F32)
QS = _rng.standard_normal((2, 64, 32)).astype(F32)
ONES, ZEROS = np.ones(384, F32), np.zeros(384, F32)
IDX = _rng.integers(0, 100, 64).astype(np.int32)

CASES = {
    "add": (elementwise.add, (X, X)),
    "gelu": (elementwise.gelu, (X,)),
    "fmod": (elementwise.fmod, (X, X + 3)),
    "abs": (elementwise.abs, (X,)),
    "softmax": (softmax.softmax, (X, 1)),
    "rms_norm": (norms.rms_norm, (X, ONES, 1e-6)),
    "layer_norm": (norms.layer_norm, (X, ONES, ZEROS)),
    "group_norm": (norms.group_norm, (X[:16].reshape(2, 8, 384), None, None, 2)),
    "sum": (reduce.sum, (X, 1)),
    "amax_dim0": (reduce.amax, (X, 0)),
    "var": (reduce.var, (X, 1)),
    "cumsum": (reduce.cumsum, (X, 1)),
    "matmul": (matmul.matmul, (X[:, :256].copy(), X[:256, :128].copy())),
    "matmul_bf16": (matmul.matmul, (X[:, :256].astype(BF16), X[:256, :128].astype(BF16))),
    "transpose": (movement.transpose, (X,)),
    "permute": (movement.permute, (X.reshape(16, 16, 384), (2, 0, 1))),
    "rand": (rnd.rand, ((130, 77), np.array([7, 1000], np.int32))),
    "flash_attention": (attention.flash_attention_fwd, (Q, Q, Q)),
    "flash_attention_causal": (attention.flash_attention_fwd, (Q, Q, Q, None, True)),
    "short_attention": (attention_short.short_attention_fwd, (QS, QS, QS)),
    "embedding": (embedding.embedding, (X[:100].copy(), IDX)),
    "embedding_backward": (embedding.embedding_backward, (X[:64].copy(), IDX, 100)),
    "cross_entropy": (loss.cross_entropy, (X[:64, :10].copy(), IDX % 10)),
    "nll_loss": (nll.nll_loss, (X[:64, :10].copy(), IDX % 10)),
    "short_attention_masked": (attention_short.short_attention_fwd, (QS, QS, QS, None, False,
                                                                      _rng.standard_normal((64, 64)).astype(F32))),
}

# kernels the lowering refuses, and the instruction or operand it names
NOT_LOWERED = {
    "where": ((elementwise.where, (X > 0, X, -X)), "is a tile of values"),
    "floor": ((elementwise.floor, (X,)), "abs_max"),
    "argmax": ((reduce.argmax, (X, 1)), "int64"),
    "sort": ((sort.sort, (X[:4, :64].copy(),)), "negative free stride"),
}


@pytest.fixture(scope="module")
def sim():
    return get_driver("sim")


def _round_trip(fn, args, sim):
    program = fn.trace(*args, profile=sim.profile)
    source, again = retrace(program, sim.profile)
    return program, source, again


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_is_bit_identical(name, sim):
    fn, args = CASES[name]
    program, source, again = _round_trip(fn, args, sim)
    assert [a.name for a in again.args] == [a.name for a in program.args]  # in/inout first, then out/scratch
    assert [a.role for a in again.args] == [a.role for a in program.args]
    assert len(again) == len(program)
    assert [i.opcode for i in again.instructions] == [i.opcode for i in program.instructions]
    assert normalized(again, program) == normalized(program, program)
    inputs = inputs_for(program, seed=len(name), given=fn.signature.bind(*args).arguments)
    want, got = execute(program, inputs, sim), execute(again, inputs, sim)
    assert sorted(got) == sorted(want) and want
    for tensor in want:
        assert np.array_equal(got[tensor], want[tensor], equal_nan=True), f"{name}: {tensor} differs"


@pytest.mark.parametrize("name", sorted(NOT_LOWERED))
def test_kernels_the_lowering_cannot_express_raise(name, sim):
    (fn, args), names = NOT_LOWERED[name]
    program = fn.trace(*args, profile=sim.profile)
    with pytest.raises(LoweringError, match=names) as e:
        retrace(program, sim.profile)
    assert "instruction" in str(e.value) and program.name in str(e.value)


def test_every_lowered_instruction_the_library_emits_is_round_tripped(sim):
    """The opcodes of the round-trip kernels cover every lowered opcode but those listed (with why)."""
    seen = collections.Counter()
    for fn, args in CASES.values():
        seen.update(i.opcode for i in fn.trace(*args, profile=sim.profile).instructions)
    lowered = {op for op, (status, _) in LOWERING.items() if status == "lowered"}
    uncovered = {
        "bn_stats": "no library kernel emits it (the norms sum on TensorE and ScalarE): unit-tested only",
        "bn_aggr": "as bn_stats",
    }
    assert lowered - set(seen) == set(uncovered), sorted(lowered - set(seen))


_KERNELS = {"add": lambda x: (elementwise.add, (x, x[::-1].copy())), "softmax": lambda x: (softmax.softmax, (x, -1)),
            "rms_norm": lambda x: (norms.rms_norm, (x, np.ones(x.shape[-1], x.dtype), 1e-6)),
            "sum": lambda x: (reduce.sum, (x, 0)), "transpose": lambda x: (movement.transpose, (x,))}


@settings(max_examples=12, deadline=None)
@given(kernel=st.sampled_from(sorted(_KERNELS)), rows=st.integers(1, 300), cols=st.integers(1, 700),
       dtype=st.sampled_from([F32, BF16, np.float16]))
def test_round_trip_over_shapes_and_dtypes(kernel, rows, cols, dtype):
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(dtype)
    fn, args = _KERNELS[kernel](x)
    sim = get_driver("sim")
    program, _, again = _round_trip(fn, args, sim)
    assert normalized(again, program) == normalized(program, program)
    inputs = inputs_for(program, seed=rows)
    want, got = execute(program, inputs, sim), execute(again, inputs, sim)
    for tensor in want:
        assert np.array_equal(got[tensor], want[tensor], equal_nan=True), f"{kernel}: {tensor} differs"
