"""Every static rule raises ProgramError naming the instruction, the rule and the values."""

import pytest

from neuron_hal import AP, TRN2, TRN3, Act, Alu, DType, Engine, Program, ProgramError, Space, TensorArg, isa, validate

ARGS = [TensorArg("x", (256, 512), "float32"), TensorArg("ids", (128,), "int32")]
SB = AP.sbuf("float32", 128, (512,))
SB16 = AP.sbuf("bfloat16", 128, (512,))
PS = AP.psum("float32", 128, (512,))


def check(*instructions, profile=TRN2):
    validate(Program("p", ARGS, instructions), profile)


def broken(rule, *instructions, match=None, profile=TRN2):
    with pytest.raises(ProgramError) as info:
        check(*instructions, profile=profile)
    err = info.value
    assert err.rule == rule, str(err)
    assert f"instruction {len(instructions) - 1}" in str(err) and "program 'p'" in str(err)
    if match:
        assert match in str(err), str(err)
    return err


def test_a_valid_program_passes():
    check(
        isa.DmaCopy(SB, AP.hbm(0, "float32", (128, 512))),
        isa.Matmul(PS, AP.sbuf("bfloat16", 128, (128,)), SB16),
        isa.Activation(SB, PS, Act.exp),
        isa.DmaCopy(AP.hbm(0, "float32", (128, 512), offset=128 * 512 * 4), SB, queue=15),
    )


def test_partition_limit():
    err = broken("partition limit", isa.TensorCopy(AP.sbuf("float32", 129, (4,)), AP.sbuf("float32", 129, (4,))))
    assert "129 partitions, limit 128" in str(err)


@pytest.mark.parametrize("parts,start,ok", [(128, 0, True), (65, 32, False), (64, 64, True), (64, 32, False),
                                            (32, 96, True), (32, 16, False), (1, 3, False)])
def test_start_partition_rule(parts, start, ok):
    ins = isa.Memset(AP.sbuf("float32", parts, (4,), start=start), 0.0)
    if ok:
        check(ins)
    else:
        broken("start partition", ins, match="must start at one of")


def test_dma_may_start_anywhere():
    check(isa.DmaCopy(AP.sbuf("float32", 1, (4,), start=3), AP.hbm(0, "float32", (1, 4))))


def test_partition_range():
    broken("partition range", isa.DmaCopy(AP.sbuf("float32", 8, (4,), start=124), AP.hbm(0, "float32", (8, 4))))


def test_moving_and_stationary_limits():
    broken("moving free size", isa.Matmul(AP.psum("float32", 128, (513,)), AP.sbuf("bfloat16", 128, (128,)),
                                          AP.sbuf("bfloat16", 128, (513,))), match="513 columns > 512")
    broken("stationary free size", isa.Matmul(AP.psum("float32", 128, (512,)), AP.sbuf("bfloat16", 128, (129,)),
                                              SB16), match="129 columns > 128")


def test_psum_bank_overflow():
    dst = AP.psum("float32", 128, (256,), offset=1024)  # bytes 1024..2048: fits bank 0
    check(isa.Matmul(dst, AP.sbuf("bfloat16", 128, (128,)), AP.sbuf("bfloat16", 128, (256,))))
    dst = AP.psum("float32", 128, (256,), offset=1536)
    broken("psum bank", isa.Matmul(dst, AP.sbuf("bfloat16", 128, (128,)), AP.sbuf("bfloat16", 128, (256,))),
           match="cross a 2048-byte PSUM bank")


def test_matmul_operand_rules():
    st16 = AP.sbuf("bfloat16", 128, (128,))
    broken("tensor engine writes PSUM", isa.Matmul(AP.sbuf("float32", 128, (512,)), st16, SB16))
    broken("matmul dtype", isa.Matmul(PS, AP.sbuf("int8", 128, (128,)), SB16))
    broken("matmul dtype", isa.Matmul(PS, AP.sbuf("float32", 128, (128,)), SB16), match="both be fp32")
    broken("contraction", isa.Matmul(PS, AP.sbuf("bfloat16", 64, (128,)), SB16))
    broken("matmul output dtype", isa.Matmul(AP.psum("bfloat16", 128, (512,)), st16, SB16))
    check(isa.Matmul(AP.psum("bfloat16", 128, (512,)), st16, SB16), profile=TRN3)  # NC-v4 writes BF16 PSUM


def test_sbuf_and_psum_capacity():
    over = AP.sbuf("float32", 128, (1024,), offset=TRN2.sbuf_partition_bytes - 1024)
    broken("sbuf capacity", isa.Memset(over, 0.0), match=f"outside the {TRN2.sbuf_partition_bytes} bytes of sbuf")
    broken("psum capacity", isa.Memset(AP.psum("float32", 128, (4097,)), 0.0))


def test_hbm_bounds_and_tensor_index():
    broken("hbm bounds", isa.DmaCopy(SB, AP.hbm(0, "float32", (128, 512), offset=200 * 512 * 4)),
           match="outside tensor 'x'")
    broken("hbm tensor", isa.DmaCopy(SB, AP.hbm(5, "float32", (128, 512))), match="tensor %5")


def test_engine_rules():
    broken("engine", isa.Matmul(PS, AP.sbuf("bfloat16", 128, (128,)), SB16, engine=Engine.VECTOR))
    broken("engine memory access", isa.TensorCopy(SB, AP.hbm(0, "float32", (128, 512))), match="use DMA")
    broken("engine memory access", isa.TensorCopy(SB, PS, engine=Engine.GPSIMD), match="GpSimd cannot access PSUM")
    broken("engine dtype", isa.TensorCopy(AP.sbuf("int64", 128, (4,)), AP.sbuf("int64", 128, (4,), offset=64)))
    wide = AP.psum("bfloat16", 128, (4097,))
    broken("vector psum free size", isa.TensorCopy(AP.sbuf("bfloat16", 128, (4097,)), wide))


def test_shape_rules():
    broken("shape", isa.TensorTensor(SB, SB, AP.sbuf("float32", 128, (511,)), Alu.add))
    broken("per-partition operand", isa.TensorScalar(SB, SB, Alu.add, AP.sbuf("float32", 128, (2,))))
    broken("reduce axes", isa.TensorReduce(AP.sbuf("float32", 128, (1,)), SB, Alu.add, (1,)))
    broken("reduce op", isa.TensorReduce(AP.sbuf("float32", 128, (1,)), SB, Alu.divide, (0,)))
    broken("shape", isa.TensorReduce(AP.sbuf("float32", 128, (2,)), SB, Alu.add, (0,)))
    broken("pattern rank", isa.Iota(AP.sbuf("int32", 128, (4, 4)), (1,)))
    broken("bitwise dtype", isa.TensorTensor(SB, SB, SB, Alu.bitwise_and))
    broken("transpose size", isa.Transpose(AP.sbuf("float32", 64, (64,)), AP.sbuf("float32", 64, (64,), offset=512),
                                           engine=Engine.VECTOR))
    broken("dma queue", isa.DmaCopy(SB, AP.hbm(0, "float32", (128, 512)), queue=16))
    broken("access pattern rank", isa.Memset(AP(Space.SBUF, DType.float32, 1, ((1, 1),) * 5), 0.0))


def test_indirect_dma_rules():
    idx = AP.sbuf("int32", 128, (1,), offset=8192)
    table = AP.hbm(0, "float32", (256, 512))
    check(isa.DmaGather(SB, table, idx))
    broken("index dtype", isa.DmaGather(SB, table, idx.with_dtype("float32")))
    broken("indirect dma", isa.DmaGather(SB, SB, idx), match="table must be in HBM")


def test_destination_writes_each_element_once():
    bcast = AP(Space.SBUF, DType.float32, 128, ((4, 0),))
    broken("destination overlap", isa.Memset(bcast, 1.0))
    check(isa.TensorCopy(SB, AP(Space.SBUF, DType.float32, 128, ((512, 0),), offset=4096)))  # reading is fine
    rows = AP(Space.HBM, DType.float32, 4, ((8, 1),), partition_stride=4, tensor=0)
    broken("destination overlap", isa.DmaCopy(rows, AP.sbuf("float32", 4, (8,))))


def test_affine_select_needs_a_comparison():
    t = AP.sbuf("float32", 128, (8,))
    check(isa.AffineSelect(t, t, (1,), Alu.greater_equal, 0.0))
    broken("affine_select comparison", isa.AffineSelect(t, t, (1,), Alu.add, 0.0))


def test_scalar_engine_copies_by_generation():
    from neuron_hal import TRN1

    copy = isa.TensorCopy(SB, SB16.with_dtype("float32"), engine=Engine.SCALAR)
    broken("engine", copy, profile=TRN1, match="use activation identity")
    check(copy)
    ts = isa.TensorScalar(SB, SB, Alu.add, 1.0, engine=Engine.SCALAR)
    broken("engine", ts, match="only from NC-v4")
    check(ts, profile=TRN3)


def test_bitwise_immediate():
    t = AP.sbuf("int32", 128, (8,))
    check(isa.TensorScalar(t, t, Alu.left_shift, 3.0))
    broken("bitwise immediate", isa.TensorScalar(t, t, Alu.bitwise_and, 1.5))


def test_interleaved_destination_dims_that_do_not_overlap_are_allowed():
    # rows 8 elements apart, an outer free dim 64 apart: [4 rows] x [2 blocks] x [8] fills 64 distinct slots
    ap = AP(Space.HBM, DType.float32, 4, ((2, 32), (8, 1)), partition_stride=8, tensor=0)
    check(isa.DmaCopy(ap, AP.sbuf("float32", 4, (2, 8))))
    clash = AP(Space.HBM, DType.float32, 4, ((2, 16), (8, 1)), partition_stride=8, tensor=0)
    broken("destination overlap", isa.DmaCopy(clash, AP.sbuf("float32", 4, (2, 8))))
    # strides that interleave without colliding: rows 3 apart over a free dim of stride 2 (0 2 4 3 5 7)
    woven = AP(Space.HBM, DType.float32, 2, ((3, 2),), partition_stride=3, tensor=0)
    check(isa.DmaCopy(woven, AP.sbuf("float32", 2, (3,))))
    tangled = AP(Space.HBM, DType.float32, 2, ((3, 2),), partition_stride=4, tensor=0)  # 0 2 4 | 4 6 8
    broken("destination overlap", isa.DmaCopy(tangled, AP.sbuf("float32", 2, (3,))))


def test_stride_limit_ignores_dims_that_never_step():
    check(isa.Memset(AP(Space.SBUF, DType.bfloat16, 128, ((1, 40000), (8, 1))), 0.0))
    broken("free stride", isa.Memset(AP(Space.SBUF, DType.bfloat16, 128, ((2, 40000), (8, 1))), 0.0))


def test_dma_transpose_rules():
    from neuron_hal import TRN1

    rows = AP.hbm(0, "float32", (256, 128))  # x as 256 rows of 128 (its byte size)
    tile = AP.sbuf("float32", 128, (256,))
    check(isa.DmaTranspose(tile, rows))
    check(isa.DmaTranspose(AP.sbuf("float32", 100, (60,)), AP.sbuf("float32", 60, (100,), offset=4096)))
    broken("dma transpose", isa.DmaTranspose(tile, rows), profile=TRN1, match="trn1 (NC-v2) has no DMA transpose")
    broken("dma transpose", isa.DmaTranspose(AP.psum("float32", 128, (256,)), rows), match="dst must be in SBUF")
    broken("dma transpose", isa.DmaTranspose(tile, AP.psum("float32", 64, (128,))), match="src must be in HBM or SBUF")
    broken("dma transpose dtype", isa.DmaTranspose(tile.with_dtype("bfloat16"), rows), match="does not cast")
    for dt in ("float8_e4m3", "int8", "uint8"):
        src = AP.hbm(0, dt, (256, 128))
        broken("dma transpose dtype", isa.DmaTranspose(AP.sbuf(dt, 128, (256,)), src), match="1-byte elements")
    broken("shape", isa.DmaTranspose(AP.sbuf("float32", 128, (255,)), rows), match="must be [128, 256]")
    broken("partition limit", isa.DmaTranspose(AP.sbuf("float32", 256, (128,)), AP.hbm(0, "float32", (128, 256))))
    broken("dma queue", isa.DmaTranspose(tile, rows, queue=16))


def test_scalar_tensor_tensor_rules():
    col = AP.sbuf("float32", 128, (1,), offset=8192)
    other = AP.sbuf("float32", 128, (512,), offset=16384)
    check(isa.ScalarTensorTensor(SB, SB16, Alu.subtract, 1.0, Alu.multiply, other))
    check(isa.ScalarTensorTensor(SB, PS, Alu.add, col, Alu.max, other, reverse0=True))
    broken("shape", isa.ScalarTensorTensor(SB, SB16, Alu.add, 1.0, Alu.add, AP.sbuf("float32", 128, (511,))))
    broken("per-partition operand", isa.ScalarTensorTensor(SB, SB16, Alu.add, other, Alu.add, other))
    broken("engine", isa.ScalarTensorTensor(SB, SB16, Alu.add, 1.0, Alu.add, other, engine=Engine.SCALAR))
    broken("bitwise dtype", isa.ScalarTensorTensor(SB, SB, Alu.add, 1.0, Alu.bitwise_or, other))
    i32 = [AP.sbuf("int32", 128, (8,), offset=o) for o in (0, 64, 128)]
    check(isa.ScalarTensorTensor(i32[0], i32[1], Alu.left_shift, 2.0, Alu.bitwise_or, i32[2]))
    broken("bitwise immediate", isa.ScalarTensorTensor(i32[0], i32[1], Alu.left_shift, 2.5, Alu.add, i32[2]))


def test_tensor_tensor_scan_rules():
    col = AP.sbuf("float32", 128, (1,), offset=8192)
    d1 = AP.sbuf("float32", 128, (512,), offset=16384)
    ps1 = AP.psum("float32", 128, (512,), offset=4096)
    check(isa.TensorTensorScan(SB, SB16, d1, 0.0, Alu.multiply, Alu.add))
    check(isa.TensorTensorScan(SB, PS, d1, col, Alu.max, Alu.subtract, reverse0=True, reverse1=True))
    check(isa.TensorTensorScan(SB, SB16, ps1, col, Alu.divide, Alu.greater))  # one input in PSUM: fine
    check(isa.TensorTensorScan(AP.sbuf("bfloat16", 128, (4, 128)), SB16, d1, -1.5, Alu.add, Alu.add))  # 512 each
    broken("scan operands", isa.TensorTensorScan(SB, PS, ps1, 0.0, Alu.multiply, Alu.add), match="both in PSUM")
    broken("shape", isa.TensorTensorScan(SB, SB16, AP.sbuf("float32", 128, (511,), offset=16384), 0.0,
                                         Alu.multiply, Alu.add), match="operand (128, 511) does not match")
    broken("shape", isa.TensorTensorScan(SB, AP.sbuf("bfloat16", 64, (512,)), d1, 0.0, Alu.multiply, Alu.add),
           match="operand (64, 512)")
    two, short = AP.sbuf("float32", 128, (2,), offset=8192), AP.sbuf("float32", 64, (1,), offset=8192)
    broken("per-partition operand", isa.TensorTensorScan(SB, SB16, d1, two, Alu.multiply, Alu.add),
           match="initial must be [128, 1], got [128, 2]")
    broken("per-partition operand", isa.TensorTensorScan(SB, SB16, d1, short, Alu.multiply, Alu.add),
           match="got [64, 1]")
    broken("scan op", isa.TensorTensorScan(SB, SB16, d1, 0.0, Alu.bitwise_and, Alu.add), match="op0 is bitwise_and")
    broken("scan op", isa.TensorTensorScan(SB, SB16, d1, 0.0, Alu.add, Alu.left_shift), match="op1 is left_shift")
    broken("engine", isa.TensorTensorScan(SB, SB16, d1, 0.0, Alu.multiply, Alu.add, engine=Engine.GPSIMD),
           match="tensor_tensor_scan runs on vector, not gpsimd")
    broken("engine memory access", isa.TensorTensorScan(SB, AP.hbm(0, "float32", (128, 512)), d1, 0.0,
                                                        Alu.multiply, Alu.add), match="use DMA")
    wide = AP.psum("bfloat16", 128, (4097,))
    broken("vector psum free size", isa.TensorTensorScan(AP.sbuf("float32", 128, (4097,)), wide,
                                                         AP.sbuf("float32", 128, (4097,), offset=32768), 0.0,
                                                         Alu.multiply, Alu.add), match="4097 elements per partition")


def test_bn_stats_rules():
    rec = AP.sbuf("float32", 128, (6,), offset=8192)
    check(isa.BnStats(rec, SB))  # 512 elements: exactly bn_stats_fmax
    check(isa.BnStats(AP.sbuf("bfloat16", 128, (2, 3), offset=8192), AP.sbuf("bfloat16", 128, (4, 128))))
    check(isa.BnStats(AP.psum("float32", 1, (6,), offset=4096), AP.psum("float32", 1, (1,))))
    assert TRN2.bn_stats_fmax == 512
    broken("bn_stats free size", isa.BnStats(rec, AP.sbuf("float32", 128, (513,))),
           match="513 elements per partition > bn_stats_fmax 512")
    broken("bn_stats free size", isa.BnStats(rec, AP.sbuf("float32", 128, (2, 300))), match="600 elements")
    broken("shape", isa.BnStats(AP.sbuf("float32", 128, (5,), offset=8192), SB), match="must be [128, 6]")
    broken("shape", isa.BnStats(AP.sbuf("float32", 64, (6,), offset=8192), SB), match="dst [64, 6] must be [128, 6]")
    broken("statistics dtype", isa.BnStats(rec.with_dtype("int32"), SB), match="dst is int32, use a float dtype")
    broken("engine", isa.BnStats(rec, SB, engine=Engine.GPSIMD), match="bn_stats runs on vector, not gpsimd")
    broken("engine memory access", isa.BnStats(rec, AP.hbm(0, "float32", (128, 512))), match="use DMA")


def test_bn_aggr_rules():
    mv = AP.sbuf("float32", 128, (2,), offset=8192)
    check(isa.BnAggr(mv, AP.sbuf("float32", 128, (12,))))
    check(isa.BnAggr(mv, AP.sbuf("float32", 128, (3,))))  # triples, not whole records
    check(isa.BnAggr(AP.sbuf("bfloat16", 128, (2,), offset=8192), AP.psum("bfloat16", 128, (4, 6))))
    broken("bn_aggr input", isa.BnAggr(mv, AP.sbuf("float32", 128, (7,))),
           match="src has 7 elements per partition; bn_aggr takes whole (count, mean, variance*count) triples")
    broken("bn_aggr input", isa.BnAggr(mv, AP.sbuf("float32", 128, (0,))), match="src has 0 elements")
    broken("shape", isa.BnAggr(AP.sbuf("float32", 128, (3,), offset=8192), AP.sbuf("float32", 128, (6,))),
           match="dst [128, 3] must be [128, 2]")
    broken("shape", isa.BnAggr(AP.sbuf("float32", 32, (2,), offset=8192), AP.sbuf("float32", 128, (6,))),
           match="must be [128, 2]")
    broken("statistics dtype", isa.BnAggr(mv.with_dtype("int16"), AP.sbuf("float32", 128, (6,))), match="int16")
    broken("engine", isa.BnAggr(mv, AP.sbuf("float32", 128, (6,)), engine=Engine.SCALAR),
           match="bn_aggr runs on vector, not scalar")
