import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import AP, Act, Alu, DType, Engine, Program, Space, TensorArg, isa


def sample_program() -> Program:
    a = AP.sbuf("bfloat16", 128, (512,))
    s = AP.sbuf("float32", 128, (1,), offset=4096)
    r = AP.sbuf("float32", 128, (1,), offset=4160)
    return Program("sample", [TensorArg("x", (128, 512), "bfloat16"), TensorArg("y", (128, 512), "float32", "out")], [
        isa.DmaCopy(a, AP.hbm(0, "bfloat16", (128, 512)), queue=3),
        isa.Activation(a, a, Act.gelu, scale=0.5, bias=s, reduce_dst=r),
        isa.TensorScalar(a, a, Alu.multiply, 2.0, op1=Alu.add, operand1=s, reverse1=True),
        isa.TensorReduce(s, a, Alu.max, (0,), negate=True),
        isa.Iota(AP.sbuf("int32", 128, (4, 8)), (8, 1), offset=3, channel_multiplier=32),
        isa.DmaCopy(AP.hbm(1, "float32", (128, 512)), a.with_dtype("float32"), queue=1),
    ])


def test_json_round_trip_and_hash():
    p = sample_program()
    q = Program.from_json(p.to_json())
    assert q == p and hash(q) == hash(p) and q.instructions == p.instructions
    assert json.loads(p.to_json())["instructions"][0]["opcode"] == "dma_copy"


def test_canonical_text_round_trips_with_its_digest():
    p = sample_program()
    p.meta["outputs"] = [1]
    text = p.canonical()
    q = Program.from_canonical(text, p.meta)
    assert q.instructions == p.instructions and q.args == p.args and q.meta == {"outputs": [1]}
    fresh = Program(q.name, q.args, q.instructions)  # its digest computed, not read
    assert q.digest == fresh.digest == p.digest and q.canonical() == text
    ins = list(p.instructions)
    ins[2] = isa.TensorScalar(ins[2].dst, ins[2].src, Alu.multiply, 3.0)
    assert Program.from_canonical(Program(p.name, p.args, ins).canonical()).digest != p.digest


def test_digest_changes_with_any_field():
    p = sample_program()
    ins = list(p.instructions)
    ins[2] = isa.TensorScalar(ins[2].dst, ins[2].src, Alu.multiply, 3.0)
    assert Program(p.name, p.args, ins).digest != p.digest


def test_listing_is_readable():
    text = str(sample_program())
    assert "program sample (6 instructions)" in text
    assert "%0 x: in bfloat16[128, 512]" in text
    assert "scalar activation" in text and "func=gelu" in text
    assert "hbm%0+0x0 [128:512]{512:1} bfloat16" in text


def test_reads_and_writes():
    ins = sample_program().instructions[1]
    assert ins.writes() == (ins.dst, ins.reduce_dst)
    assert ins.src in ins.reads() and ins.bias in ins.reads() and ins.reduce_dst not in ins.reads()
    mm = isa.Matmul(AP.psum("float32", 128, (512,)), AP.sbuf("bfloat16", 128, (128,)),
                    AP.sbuf("bfloat16", 128, (512,)), accumulate=True)
    assert mm.dst in mm.reads()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=0, max_size=4), st.sampled_from(list(DType)))
def test_row_major_ap(shape, dtype):
    ap = AP.sbuf(dtype, 7, shape, offset=64)
    assert ap.shape == (7, *shape)
    assert ap.free_size == int(np.prod(shape))
    lo, hi = ap.byte_range()
    assert (lo, hi) == (64, 64 + ap.free_size * dtype.itemsize)


def test_hbm_byte_range_covers_rows():
    ap = AP.hbm(0, "float32", (4, 8), row_stride=100, offset=16)
    assert ap.byte_range() == (16, 16 + (3 * 100 + 8) * 4)
    neg = AP(Space.SBUF, DType.float32, 1, ((4, -1),), offset=64)
    assert neg.byte_range() == (64 - 12, 68)


def test_dtype_lookup():
    assert DType.of("bfloat16") is DType.bfloat16
    assert DType.of(ml_dtypes.float8_e5m2) is DType.float8_e5m2
    assert DType.of(np.int32) is DType.int32
    with pytest.raises(TypeError, match="unsupported device dtype.*float64"):
        DType.of(np.float64)


def test_every_opcode_is_registered_with_engines():
    assert set(isa.OPCODES) >= {"nc_matmul", "nc_transpose", "activation", "tensor_tensor", "tensor_scalar",
                                "tensor_reduce", "tensor_copy", "memset", "iota", "affine_select", "select",
                                "partition_reduce", "partition_broadcast", "dma_copy", "dma_gather", "dma_scatter",
                                "dma_transpose", "scalar_tensor_tensor"}
    for cls in isa.OPCODES.values():
        assert cls.engines and all(isinstance(e, Engine) for e in cls.engines)


def test_new_instructions_round_trip_and_list():
    t = AP.sbuf("bfloat16", 128, (256,))
    col = AP.sbuf("float32", 128, (1,), offset=8192)
    other = AP.sbuf("bfloat16", 128, (256,), offset=4096)
    ins = [
        isa.DmaTranspose(t, AP.hbm(0, "bfloat16", (256, 128)), queue=5),
        isa.DmaTranspose(AP.sbuf("bfloat16", 64, (32,), offset=16384), AP.sbuf("bfloat16", 32, (64,), offset=20480)),
        isa.ScalarTensorTensor(t, t, Alu.subtract, col, Alu.multiply, other, reverse0=True),
        isa.ScalarTensorTensor(t, t, Alu.add, -2.5, Alu.max, other, reverse1=True),
    ]
    p = Program("new", [TensorArg("x", (256, 128), "bfloat16")], ins)
    q = Program.from_json(p.to_json())
    assert q == p and q.instructions == p.instructions
    assert [type(i) for i in q.instructions] == [type(i) for i in ins]
    assert q.instructions[3].operand0 == -2.5 and q.instructions[2].operand0 == col
    ops = [d["opcode"] for d in json.loads(p.to_json())["instructions"]]
    assert ops == ["dma_transpose", "dma_transpose", "scalar_tensor_tensor", "scalar_tensor_tensor"]
    text = str(p)
    assert "sync   dma_transpose" in text and "queue=5" in text and "hbm%0+0x0 [256:128]{128:1} bfloat16" in text
    assert "vector scalar_tensor_tensor" in text and "op0=subtract" in text and "op1=multiply" in text
    assert "reverse0=True" in text
    assert ins[0].reads() == (ins[0].src,) and ins[0].writes() == (t,)
    assert set(map(id, ins[2].reads())) == {id(t), id(col), id(other)}
    assert "dma_transpose" in isa.DMA_OPCODES
