"""Encoding a program for timing (neuron_sim.encode): which fields an instruction reads and writes, the operand
columns the cost formulas see, engines, streams and DMA queues, the accesses the dependency pass walks, and the
errors for what the encoder cannot represent."""

from __future__ import annotations

import numpy as np
import pytest

from neuron_hal import AP, TRN1, TRN2, TRN3, Act, Alu, DType, Engine, Program, Space, TensorArg, isa
from neuron_sim import costs, encode
from neuron_sim.plan import ENGINE_CODES, N_COMPUTE, OPCODE_NAMES


# ---- field roles ------------------------------------------------------------------------------------------
def test_field_roles_match_reads_and_writes():
    x = [AP.sbuf("float32", 128, (4,), offset=o) for o in range(0, 4096, 512)]
    idx = AP.sbuf("int32", 128, (1,), offset=8000)
    table = AP.hbm(0, "float32", (1000, 4))
    samples = [
        isa.Matmul(AP.psum("float32", 4, (4,)), x[0], x[1], accumulate=True), isa.Matmul(x[0], x[1], x[2]),
        isa.Activation(x[0], x[1], Act.exp, scale=x[2], bias=x[3], reduce_dst=x[4]),
        isa.Activation(x[0], x[1], Act.exp), isa.TensorScalar(x[0], x[1], Alu.add, x[2], op1=Alu.max, operand1=x[3]),
        isa.TensorScalar(x[0], x[1], Alu.add, 1.0), isa.Select(x[0], x[1], x[2], x[3]),
        isa.Select(x[0], x[1], x[2], 0.0),
        isa.DmaGather(x[0], table, idx), isa.DmaScatter(table, x[0], idx, accumulate=True),
        isa.DmaScatter(table, x[0], idx), isa.TensorTensor(x[0], x[1], x[2], Alu.add),
        isa.ScalarTensorTensor(x[0], x[1], Alu.subtract, x[2], Alu.multiply, x[3]),
        isa.ScalarTensorTensor(x[0], x[1], Alu.subtract, 1.0, Alu.multiply, x[3]),
        isa.DmaTranspose(x[0], table), isa.DmaTranspose(x[0], x[1]),
        isa.TensorTensorScan(x[0], x[1], x[2], x[3], Alu.multiply, Alu.add),
        isa.TensorTensorScan(x[0], x[1], x[2], 0.0, Alu.multiply, Alu.add), isa.BnStats(x[0], x[1]),
        isa.BnAggr(x[0], x[1]),
    ]
    for ins in samples:
        reads, writes = set(), set()
        for name, role in encode._field_roles(type(ins)):
            v = getattr(ins, name)
            if not isinstance(v, AP):
                continue
            if role == "r" or (role == "wr" and getattr(ins, encode._READS_DST_IF[type(ins)])):
                reads.add(name)
            if role in ("w", "wr"):
                writes.add(name)
        assert {id(getattr(ins, n)) for n in reads} == {id(a) for a in ins.reads()}, ins
        assert {id(getattr(ins, n)) for n in writes} == {id(a) for a in ins.writes()}, ins


def test_every_opcode_has_field_roles_covering_its_operands():
    for cls in isa.OPCODES.values():
        roles = dict(encode._field_roles(cls))
        assert set(cls.operand_fields) <= set(roles), cls.__name__
        assert roles["dst"] in ("w", "wr") and all(r in ("r", "w", "wr") for r in roles.values())


def test_field_roles_refuse_classes_they_cannot_read():
    """An instruction class whose reads() or writes() the encoder does not know would be timed with the wrong
    dependencies: refused, naming the class."""

    class OddReads(isa.TensorCopy):
        def reads(self):
            return ()

    class OddWrites(isa.TensorCopy):
        def writes(self):
            return ()

    with pytest.raises(NotImplementedError, match="OddReads overrides reads"):
        encode._field_roles(OddReads)
    with pytest.raises(NotImplementedError, match="OddWrites overrides writes"):
        encode._field_roles(OddWrites)


def test_unexpected_values_are_refused():
    with pytest.raises(TypeError, match="unexpected value"):
        encode._codes([Engine.TENSOR, "tensor"], tuple(ENGINE_CODES))
    assert list(encode._codes([Engine.SYNC, Engine.TENSOR, Engine.SYNC], tuple(ENGINE_CODES))) == [4, 0, 4]


# ---- operand columns --------------------------------------------------------------------------------------
def test_operand_columns():
    """What the cost formulas see of each AP: space, dtype class, partitions, first partition, elements per
    partition, innermost dimension of size > 1 and its stride, the innermost contiguous run, the row stride."""
    aps = [
        AP.sbuf("bfloat16", 64, (4, 8), offset=128, start=32),  # row-major 2-D: one contiguous run of 32
        AP(Space.SBUF, DType.float32, 128, ((512, 4),)),  # strided: runs of 1
        AP(Space.SBUF, DType.float16, 2, ((3, 8), (2, 1))),  # rows of 2 at stride 8
        AP(Space.SBUF, DType.float32, 2, ((2, 2), (2, 1))),  # (2,2),(2,1) continue each other: one run of 4
        AP(Space.PSUM, DType.float32, 16, ((7, 1), (1, 1))),  # a trailing unit dimension is not the innermost
        AP.hbm(3, "int8", (10, 6), row_stride=20),
        AP(Space.SBUF, DType.float32, 1, ()),  # a scalar per partition
    ]
    cols = encode._APs(aps).opnd(np.arange(len(aps)))
    assert list(cols.present) == [True] * len(aps)
    assert list(cols.space) == [costs.SBUF, costs.SBUF, costs.SBUF, costs.SBUF, costs.PSUM, costs.HBM, costs.SBUF]
    assert list(cols.itemsize) == [2, 4, 2, 4, 4, 1, 4]
    assert list(cols.f16) == [True, False, True, False, False, False, False]
    assert list(cols.bf16) == [True, False, False, False, False, False, False]
    assert list(cols.fp32) == [False, True, False, True, True, False, True]
    assert list(cols.partitions) == [64, 128, 2, 2, 16, 10, 1]
    assert list(cols.start) == [32, 0, 0, 0, 0, 0, 0]
    assert list(cols.n) == [32, 512, 6, 4, 7, 6, 1]
    assert list(cols.inner_size) == [8, 512, 2, 2, 7, 6, 1]
    assert list(cols.inner_stride) == [1, 4, 1, 1, 1, 1, 0]
    assert list(cols.run) == [32, 1, 2, 4, 7, 6, 1]
    assert list(cols.pstride) == [0, 0, 0, 0, 0, 20, 0]
    assert list(cols.contiguous) == [True, False, True, True, True, True, True]
    assert list(cols.on_chip) == [True, True, True, True, True, False, True]
    assert list(cols.num_elements) == [64 * 32, 128 * 512, 12, 8, 112, 60, 1]


def test_absent_operands_and_shared_ap_objects():
    """A field holding an immediate or None is absent (no space, no elements); the same AP object used twice is
    one AP read once and expanded to both rows."""
    shared = AP.sbuf("float32", 8, (16,), offset=64)
    table = encode._APs([shared, AP.sbuf("bfloat16", 4, (2,)), shared])
    cols = table.opnd(np.array([0, -1, 2, 1]))
    assert list(cols.present) == [True, False, True, True]
    assert list(cols.space) == [costs.SBUF, costs.ABSENT, costs.SBUF, costs.SBUF]
    assert list(cols.itemsize) == [4, 0, 4, 2] and list(cols.n) == [16, 0, 16, 2]
    assert list(cols.partitions) == [8, 0, 8, 4]
    assert list(cols.inner_size) == [16, 1, 16, 2] and list(cols.run) == [16, 1, 16, 2]
    assert not cols.f16[1] and not cols.fp32[1] and not cols.strided(TRN2)[1]
    empty = encode._APs([]).opnd(np.array([-1, -1]))
    assert list(empty.present) == [False, False] and list(empty.space) == [costs.ABSENT] * 2


# ---- instructions -----------------------------------------------------------------------------------------
def _sample_program():
    args = [TensorArg("x", (128, 64), "float32"), TensorArg("y", (128, 64), "float32", "out")]
    st1, st2 = AP.sbuf("bfloat16", 128, (128,)), AP.sbuf("bfloat16", 128, (128,), offset=256)
    mv = AP.sbuf("bfloat16", 128, (64,), offset=1024)
    acc = AP.psum("float32", 128, (64,))
    t = AP.sbuf("float32", 128, (64,), offset=4096)
    ins = [
        isa.DmaCopy(t, AP.hbm(0, "float32", (128, 64)), queue=3),  # 0
        isa.Matmul(acc, st1, mv),  # 1
        isa.Matmul(acc, AP.sbuf("bfloat16", 128, (128,)), mv, accumulate=True),  # 2: st1's AP, another object
        isa.Transpose(AP.psum("bfloat16", 1, (1,), offset=2048), AP.sbuf("bfloat16", 1, (1,))),  # 3
        isa.Matmul(acc, st2, mv),  # 4
        isa.Activation(t, t, Act.gelu),  # 5
        isa.TensorScalar(t, t, Alu.add, 1.0, engine=Engine.GPSIMD),  # 6: an immediate operand
        isa.TensorCopy(t, t, engine=Engine.SCALAR),  # 7
        isa.Activation(t, t, Act.identity),  # 8
        isa.DmaCopy(AP.hbm(1, "float32", (128, 64)), t, queue=15),  # 9
    ]
    return Program("sample", args, ins)


@pytest.mark.parametrize("p", [TRN1, TRN2, TRN3], ids=lambda p: p.name)
def test_instruction_columns(p):
    prog = _sample_program()
    enc = encode.encode(prog, p)
    assert enc.n == 10
    assert [OPCODE_NAMES[k] for k in enc.opcode] == [ins.opcode for ins in prog.instructions]
    assert list(enc.engine) == [4, 0, 0, 0, 0, 2, 3, 2, 2, 4]
    # streams: a compute engine is its own stream, DMA queue q is stream N_COMPUTE + q
    assert list(enc.stream) == [N_COMPUTE + 3, 0, 0, 0, 0, 2, 3, 2, 2, N_COMPUTE + 15]
    assert enc.n_streams == N_COMPUTE + p.dma_queues
    act = [-1] * 10
    act[5], act[8] = costs.ACT_CODES[Act.gelu], costs.ACT_CODES[Act.identity]
    assert list(enc.act_func) == act
    # DMA instructions have no compute cycles; only matmuls have LoadStationary cycles
    assert enc.cycles[0] == 0 and enc.cycles[9] == 0 and all(enc.cycles[1:9] > 0)
    assert [bool(c) for c in enc.ls_cycles] == [False, True, True, False, True, False, False, False, False, False]
    # TensorE instructions in order, which are matmuls, and their stationary keys: equal APs give equal keys
    assert list(enc.te) == [1, 2, 3, 4] and list(enc.te_mm) == [True, True, False, True]
    assert np.array_equal(enc.te_key[0], enc.te_key[1]) and not np.array_equal(enc.te_key[1], enc.te_key[3])
    assert list(enc.te_key[2]) == [-1] * 6
    # DMA figures exist only for DMA instructions (costs.dma fills them; test_costs checks the values)
    assert list(enc.dma.nbytes) == [128 * 64 * 4] + [0] * 8 + [128 * 64 * 4]
    assert list(enc.dma.read) == [True] + [False] * 9


def test_accesses():
    """One access per AP-valued field (role r or w); a matmul or scatter with accumulate also reads its
    destination; immediates and None fields are not accesses."""
    prog = _sample_program()
    enc = encode.encode(prog, TRN2)
    per = {i: sorted(int(w) for w in enc.acc_w[enc.acc_i == i]) for i in range(enc.n)}
    assert per[0] == [0, 1]  # dma: src read, dst written
    assert per[1] == [0, 0, 1]  # stationary, moving; dst
    assert per[2] == [0, 0, 0, 1]  # accumulate: dst read too
    assert per[5] == [0, 1]  # activation without scale/bias/reduce APs
    assert per[6] == [0, 1]  # tensor_scalar with an immediate operand
    table = AP.hbm(0, "float32", (100, 4))
    idx = AP.sbuf("int32", 8, (1,), offset=512)
    tile = AP.sbuf("float32", 8, (4,))
    scat = Program("s", [TensorArg("t", (100, 4), "float32", "inout")],
                   [isa.DmaScatter(table, tile, idx, accumulate=True), isa.DmaScatter(table, tile, idx)])
    enc = encode.encode(scat, TRN2)
    assert sorted(enc.acc_w[enc.acc_i == 0].tolist()) == [0, 0, 0, 1]
    assert sorted(enc.acc_w[enc.acc_i == 1].tolist()) == [0, 0, 1]
    # every access row points at the AP of its field
    rows = enc.acc_row[enc.acc_i == 1]
    assert sorted(enc.aps.space[rows].tolist()) == sorted([costs.HBM, costs.SBUF, costs.SBUF])


@pytest.mark.parametrize("queue", [-1, 16, 99])
def test_dma_queue_outside_the_profile_is_refused(queue):
    sb = AP.sbuf("float32", 1, (4,))
    prog = Program("q", [TensorArg("x", (1, 4), "float32")],
                   [isa.TensorCopy(sb, sb), isa.DmaCopy(sb, AP.hbm(0, "float32", (1, 4)), queue=queue)])
    with pytest.raises(ValueError, match=rf"instruction 1: DMA queue {queue} outside 0\.\.{TRN2.dma_queues - 1}"):
        encode.encode(prog, TRN2)
    narrow = TRN2.replace(dma_queues=4)
    ok = Program("q", prog.args, [isa.DmaCopy(sb, AP.hbm(0, "float32", (1, 4)), queue=3)])
    assert encode.encode(ok, narrow).n_streams == N_COMPUTE + 4
    with pytest.raises(ValueError, match=r"DMA queue 4 outside 0\.\.3"):
        encode.encode(Program("q", prog.args, [isa.DmaCopy(sb, AP.hbm(0, "float32", (1, 4)), queue=4)]), narrow)


def test_multi_engine_instructions_take_their_engine_field():
    sb = [AP.sbuf("float32", 4, (4,), offset=64 * k) for k in range(4)]
    prog = Program("e", [], [isa.TensorCopy(sb[0], sb[1], engine=e) for e in
                             (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)]
                   + [isa.Transpose(AP.psum("float32", 4, (4,)), sb[2], engine=Engine.TENSOR),
                      isa.Transpose(sb[3], sb[2], engine=Engine.VECTOR)])
    enc = encode.encode(prog, TRN2)
    assert list(enc.engine) == [1, 2, 3, 0, 1] and list(enc.stream) == [1, 2, 3, 0, 1]


def test_empty_program():
    enc = encode.encode(Program("empty", [], []), TRN2)
    assert enc.n == 0 and enc.opcode.size == enc.stream.size == enc.acc_i.size == enc.te.size == 0
    assert enc.n_streams == N_COMPUTE + TRN2.dma_queues
