"""Hand-written ISA programs used by the demo, the benchmarks and the simulator's own tests.

They are written against the HAL directly (no kernel language) so the simulator can be exercised
and measured on its own; the op kernels live in neuron-kernels.
"""

from __future__ import annotations

from neuron_hal import AP, Act, DType, Engine, Profile, Program, Space, TensorArg, isa


def tiled_gemm(profile: Profile, m: int, n: int, k: int, dtype="bfloat16", out_dtype="float32",
               bufs: int = 2) -> Program:
    """C[M, N] = lhsT[K, M].T @ rhs[K, N].

    Tiles: stationary 128x128 (K x M), moving 128x512 (K x N), PSUM accumulation over K. For each
    512-column block of C, the rhs panel (all of K) is loaded once and stays in SBUF; for each
    128-row block, its lhsT panel is loaded in one DMA and the K tiles are accumulated into one PSUM
    bank, copied out (cast) by VectorE or ScalarE in turn, and stored. Panels are ``bufs``-buffered
    and loads and stores use separate DMA queues, so DMA, TensorE and the copy-out overlap.
    """
    dt, odt = DType.of(dtype), DType.of(out_dtype)
    tk, tm, tn = profile.pmax, profile.gemm_stationary_fmax, min(n, profile.gemm_moving_fmax)
    for name, size, tile in (("M", m, tm), ("K", k, tk), ("N", n, tn)):
        if size % tile:
            raise ValueError(f"tiled_gemm needs {name}={size} to be a multiple of its tile {tile}")
    kt = k // tk
    rhs_bytes, lhs_bytes, out_bytes = kt * tn * dt.itemsize, kt * tm * dt.itemsize, tn * odt.itemsize
    need = bufs * (rhs_bytes + lhs_bytes + out_bytes)
    if need > profile.sbuf_partition_bytes:
        raise ValueError(f"tiled_gemm K={k}: {need} bytes per partition of panels exceed SBUF's "
                         f"{profile.sbuf_partition_bytes}")
    rhs_base, lhs_base, out_base = 0, bufs * rhs_bytes, bufs * (rhs_bytes + lhs_bytes)
    banks = profile.psum_banks

    args = [TensorArg("lhsT", (k, m), dt), TensorArg("rhs", (k, n), dt), TensorArg("out", (m, n), odt, "out")]
    ins: list[isa.Instruction] = []
    tile_no = 0
    for nb in range(n // tn):
        rhs = AP.sbuf(dt, tk, (kt, tn), offset=rhs_base + (nb % bufs) * rhs_bytes)
        src = AP(Space.HBM, dt, tk, ((kt, tk * n), (tn, 1)), offset=nb * tn * dt.itemsize,
                 partition_stride=n, tensor=1)
        ins.append(isa.DmaCopy(rhs, src, queue=0))
        for mb in range(m // tm):
            lhs = AP.sbuf(dt, tk, (kt, tm), offset=lhs_base + (tile_no % bufs) * lhs_bytes)
            src = AP(Space.HBM, dt, tk, ((kt, tk * m), (tm, 1)), offset=mb * tm * dt.itemsize,
                     partition_stride=m, tensor=0)
            ins.append(isa.DmaCopy(lhs, src, queue=1 + tile_no % 2))
            acc = AP.psum("float32", tm, (tn,), offset=(tile_no % banks) * profile.psum_bank_bytes)
            for j in range(kt):
                st = AP.sbuf(dt, tk, (tm,), offset=lhs.offset + j * tm * dt.itemsize)
                mv = AP.sbuf(dt, tk, (tn,), offset=rhs.offset + j * tn * dt.itemsize)
                ins.append(isa.Matmul(acc, st, mv, accumulate=j > 0))
            out = AP.sbuf(odt, tm, (tn,), offset=out_base + (tile_no % bufs) * out_bytes)
            if tile_no % 2:
                ins.append(isa.Activation(out, acc, Act.identity, engine=Engine.SCALAR))
            else:
                ins.append(isa.TensorCopy(out, acc, engine=Engine.VECTOR))
            dst = AP.hbm(2, odt, (tm, tn), offset=(mb * tm * n + nb * tn) * odt.itemsize, row_stride=n)
            ins.append(isa.DmaCopy(dst, out, queue=3 + tile_no % 2))
            tile_no += 1
    return Program(f"gemm_{m}x{n}x{k}_{dt}", args, ins,
                   {"flops": 2 * m * n * k, "matmuls": (m // tm) * (n // tn) * kt, "moving": tn})


def ideal_gemm_tensor_cycles(profile: Profile, m: int, n: int, k: int, dtype="bfloat16") -> int:
    """TensorE cycles of the GEMM at one matmul per II (docs/hardware.md §3 cost), nothing else."""
    tm, tn, tk = profile.gemm_stationary_fmax, min(n, profile.gemm_moving_fmax), profile.pmax
    ii = max(min(profile.mm_init_latency, tm), tn)
    factor = profile.matmul_fp32_factor if DType.of(dtype) is DType.float32 else 1
    return (m // tm) * (n // tn) * (k // tk) * ii * factor
