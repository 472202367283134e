"""Stanford CS149 (fall 2025) assignment 4 on a trn2.3xlarge: the part-1 vector adds and tiled transpose and a
student's fused conv2d + maxpool, as measured in one student's write-up.

Measurements: xaviergonzalez/asst4-trainium2 ``writeup.md`` at d1552616 (Nov 2025, Neuron SDK 2.26 venv
``aws_neuronx_venv_pytorch_2_8``): ``nki.benchmark`` tables pasted in full (NCL = device latency, used here) and
two ``neuron-profile`` ``total_time`` figures. Kernels: the assignment's starter kernels (stanford-cs149/
asst4-trainium2 @67a1f8b ``part1/kernels.py``, every kernel under ``@nki.compiler.skip_middle_end_transformations``,
explicit ``nisa.dma_copy``) with the write-up's ROW_CHUNK / FREE_DIM values, the student's transpose and conv2d
(``part1/kernels.py`` from c8ba7c8 on and ``part2/conv2d.py`` at 8f7564e = d1552616, the versions that produced
the figures). Harnesses: ``part1/run_benchmark.py`` (``nki.benchmark(warmup=1, iters=10)``; with
``--profile_name`` it also passes ``--disable-dge`` and saves the trace) and ``part2/test_harness.py``
(``nki.benchmark(warmup=5, iters=20)``, batch 1, Cin = Cout = 256, 224 x 224, 3 x 3, random inputs of the tested
dtype, p99 of NCL).

Engines the source leaves to the compiler (``nisa.tensor_copy`` / ``tensor_scalar`` without ``engine=``): VectorE,
the obvious choice; no published profile shows them.
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import CURRENT, spec

TOOLCHAIN = CURRENT  # Neuron 2.26 (Nov 2025); the kernels issue explicit nisa.dma_copy: the default queues
P = 128
WRITEUP = "xaviergonzalez/asst4-trainium2 d1552616 writeup.md"
PUBLISHED = "2025-11"


@nk.kernel
def vector_add_tiled(a_vec, b_vec, row_chunk=1):
    """Starter ``vector_add_tiled``: per chunk of ``row_chunk`` elements, one element per partition: two loads
    into [row_chunk, 1] tiles, a VectorE tensor_scalar adding b as a per-partition operand, one store."""
    M = a_vec.shape[0]
    out = nl.ndarray(a_vec.shape, a_vec.dtype, buffer=nl.hbm)
    for m in nl.affine_range(M // row_chunk):
        rows = nl.ds(m * row_chunk, row_chunk)
        a_tile = nl.ndarray((row_chunk, 1), a_vec.dtype)
        b_tile = nl.ndarray((row_chunk, 1), b_vec.dtype)
        nisa.dma_copy(a_tile, a_vec[rows].reshape((row_chunk, 1)))
        nisa.dma_copy(b_tile, b_vec[rows].reshape((row_chunk, 1)))
        res = nl.ndarray((row_chunk, 1), a_vec.dtype)
        nisa.tensor_scalar(res, a_tile, nl.add, b_tile)
        nisa.dma_copy(out[rows].reshape((row_chunk, 1)), res)
    return out


@nk.kernel
def vector_add_stream(a_vec, b_vec, free_dim=2):
    """Starter ``vector_add_stream``: the vectors seen as [128, M/128]; per block of ``free_dim`` columns two
    [128, free_dim] loads, one VectorE tensor_tensor add, one store."""
    M = a_vec.shape[0]
    a_re = a_vec.reshape((P, M // P))
    b_re = b_vec.reshape((P, M // P))
    out = nl.ndarray(a_vec.shape, a_vec.dtype, buffer=nl.hbm)
    out_re = out.reshape((P, M // P))
    for m in nl.affine_range(M // (P * free_dim)):
        cols = nl.ds(m * free_dim, free_dim)
        a_tile = nl.ndarray((P, free_dim), a_vec.dtype)
        b_tile = nl.ndarray((P, free_dim), b_vec.dtype)
        nisa.dma_copy(a_tile, a_re[:, cols])
        nisa.dma_copy(b_tile, b_re[:, cols])
        res = nl.ndarray((P, free_dim), a_vec.dtype)
        nisa.tensor_tensor(res, a_tile, b_tile, nl.add)
        nisa.dma_copy(out_re[:, cols], res)
    return out


@nk.kernel
def matrix_transpose(a_tensor):
    """The student's transpose: per 128 x 128 block (m, n), load it, transpose on TensorE into PSUM, copy the
    PSUM tile to SBUF, store it at block (n, m). Nothing is reused across blocks."""
    M, N = a_tensor.shape
    out = nl.ndarray((N, M), a_tensor.dtype, buffer=nl.hbm)
    for m in nl.affine_range(M // P):
        for n in nl.affine_range(N // P):
            a_tile = nl.ndarray((P, P), a_tensor.dtype)
            nisa.dma_copy(a_tile, a_tensor[m * P:(m + 1) * P, n * P:(n + 1) * P])
            a_t = nl.ndarray((P, P), a_tensor.dtype, buffer=nl.psum)
            nisa.nc_transpose(a_t, a_tile)
            a_t_sb = nl.ndarray((P, P), a_tensor.dtype)
            nisa.tensor_copy(a_t_sb, a_t)
            nisa.dma_copy(out[n * P:(n + 1) * P, m * P:(m + 1) * P], a_t_sb)
    return out


@nk.kernel
def fused_conv2d_maxpool(X, W, bias, pool_size=1, x_bufs=None):
    """The student's fused conv2d + maxpool (valid 3 x 3 convolution, stride 1).

    Prologue: all weights in one SBUF tensor [cout 128, cin 128, cout tiles, cin tiles, fh, fw], one DMA per
    (cout tile, cin tile); each of its 128 x 128 tap slices transposed on TensorE (PSUM), copied back into its
    own slice (now [cin, cout]). Main loop, per cout tile and output row: a PSUM row [128, out_w], then per cin
    tile and filter row one input-row load [128 cin, in_w] and per filter column a matmul of the tap's
    weights against the input row shifted by the column, accumulating in PSUM; the row copied to SBUF (into a
    [128, pool, out_w] buffer made once). Per pooled row: a VectorE max over the pool window, a bias load
    [128, 1], a VectorE add of the bias, one store of [128, out_w / pool].

    ``x_bufs``: the source declares the input-row buffer once, outside every loop; None places a new tile per
    load (rotating through free SBUF, what the measured times require, see the cases), 1 keeps one buffer.
    """
    _, c_in, in_h, in_w = X.shape
    c_out, _, fh, fw = W.shape
    out_h, out_w = in_h - fh + 1, in_w - fw + 1
    out_ph, out_pw = out_h // pool_size, out_w // pool_size
    n_in, n_out = c_in // P, c_out // P
    X_out = nl.ndarray((X.shape[0], c_out, out_ph, out_pw), X.dtype, buffer=nl.hbm)

    W_sbuf = nl.ndarray((P, P, n_out, n_in, fh, fw), W.dtype)
    tile_sbuf = nl.ndarray((P, pool_size, out_w), X.dtype)
    for to in nl.affine_range(n_out):
        for ti in nl.affine_range(n_in):
            nisa.dma_copy(W_sbuf[:, :, to, ti, :, :], W[to * P:(to + 1) * P, ti * P:(ti + 1) * P, :, :])
            for i in nl.sequential_range(fh):
                for j in nl.sequential_range(fw):
                    w_t = nl.transpose(W_sbuf[:, :, to, ti, i, j])  # TensorE, into PSUM
                    # the copy's result is assigned to the tap's slice: written there directly, no second
                    # SBUF -> SBUF copy (the same Python as `tile_sbuf[:, p, :] = nisa.tensor_copy(...)`)
                    nisa.tensor_copy(W_sbuf[:, :, to, ti, i, j], w_t)

    for b in nl.sequential_range(X.shape[0]):
        for to in nl.sequential_range(n_out):
            for ph in nl.sequential_range(out_ph):
                for p in nl.sequential_range(pool_size):
                    h = ph * pool_size + p
                    # nl.zeros + `+=` of matmuls: one accumulation group whose first matmul overwrites the
                    # bank (the arch guide's PSUM-accumulation pattern), so no memset is issued
                    res_psum = nl.ndarray((P, out_w), nl.float32, buffer=nl.psum)
                    for ti in nl.sequential_range(n_in):
                        for i in nl.sequential_range(fh):
                            x_sbuf = nl.ndarray((P, in_w), X.dtype, name="x_sbuf", bufs=x_bufs)
                            nisa.dma_copy(x_sbuf, X[b, ti * P:(ti + 1) * P, i + h, :])
                            for j in nl.sequential_range(fw):
                                nisa.nc_matmul(res_psum, W_sbuf[:, :, to, ti, i, j], x_sbuf[:, j:j + out_w])
                    nisa.tensor_copy(tile_sbuf[:, p, :], res_psum)
                pooled = nl.ndarray((P, out_pw), X.dtype)
                nisa.tensor_reduce(pooled, tile_sbuf.reshape((P, pool_size, out_pw, pool_size)), nl.maximum,
                                   axis=(1, 3))
                bias_sbuf = nl.ndarray((P, 1), bias.dtype)
                nisa.dma_copy(bias_sbuf, bias[to * P:(to + 1) * P].reshape((P, 1)))
                biased = nl.ndarray((P, out_pw), X.dtype)
                # tensor_tensor with a [128, 1] operand: NKI broadcasts it along the free dim (stride 0)
                nisa.tensor_tensor(biased, pooled, bias_sbuf.broadcast_to((P, out_pw)), nl.add)
                nisa.dma_copy(X_out[b, to * P:(to + 1) * P, ph], biased)
    return X_out


# ---- cases --------------------------------------------------------------------------------------------------
def _m(value_us, where, statistic="p99", kind="measured", note=""):
    return Measurement(value_us, statistic, "trn2", f"{WRITEUP}, {where}", PUBLISHED, includes_launch=True,
                       kind=kind, note=note)


_BENCH1 = "run_benchmark.py: nki.benchmark(warmup=1, iters=10), NCL(99) of the pasted table"
_VEC = (spec((25600,), "float32"), spec((25600,), "float32"))
_VEC_BIG = (spec((256000,), "float32"), spec((256000,), "float32"))

_TILED_NOTE = f"{_BENCH1}; n = 25600 fp32 (np.random.rand)"
_TILED = [
    Case("cs149-vector-add-tiled", "row_chunk_1", vector_add_tiled, _VEC,
         _m(37318, "Part 1 Step 1 q1", note=f"{_TILED_NOTE}: 25600 iterations of one element"),
         kwargs={"row_chunk": 1},
         differs="DMA queues: the project's default assignment (no profile shows neuronxcc's); tiles placed by "
                 "the project's allocator (the source skips neuronxcc's middle-end transformations)"),
    Case("cs149-vector-add-tiled", "row_chunk_128", vector_add_tiled, _VEC,
         _m(378, "Part 1 Step 1 q2", note=f"{_TILED_NOTE}: 200 iterations of [128, 1]"),
         kwargs={"row_chunk": 128},
         differs="DMA queues: the project's default assignment; tiles placed by the project's allocator"),
]

_STREAM = [
    Case("cs149-vector-add-stream", "free_dim_2", vector_add_stream, _VEC,
         _m(186, "Part 1 Step 2a q1", note=f"{_BENCH1}; n = 25600 fp32: 100 iterations"), kwargs={"free_dim": 2},
         differs="DMA queues: the project's default assignment; tiles placed by the project's allocator"),
    Case("cs149-vector-add-stream", "free_dim_200", vector_add_stream, _VEC,
         _m(15, "Part 1 Step 2a q2",
            note="p99 NCL of run_benchmark.py (warmup 1, iters 10), given in the text only ('This ran in 15 us'), "
                 "no table: whether it is NCL(99) is assumed from q1; n = 25600 fp32: one iteration"),
         kwargs={"free_dim": 200},
         differs="DMA queues: the project's default assignment"),
]

_PROFILE_NOTE = ("neuron-profile view --output-format summary-text 'total_time' (s) of the trace saved by "
                 "run_benchmark.py --profile_name (compiled with --disable-dge); the student quotes {v}; "
                 "dma_transfer_count {d} (one per nisa.dma_copy)")
_STREAM_PROFILE = [
    Case("cs149-vector-add-stream-profile", "n256000_free_dim_2000", vector_add_stream, _VEC_BIG,
         _m(28, "Part 1 Step 2b q2", statistic="profile",
            note=_PROFILE_NOTE.format(v="2.8e-5 s", d=3) + "; one iteration of [128, 2000] fp32"),
         kwargs={"free_dim": 2000},
         differs="the trace was compiled with --disable-dge (descriptors generated ahead, not by the hardware "
                 "DGE); the simulator always charges its DGE issue cost; DMA queues: the default assignment"),
    Case("cs149-vector-add-stream-profile", "n256000_free_dim_1000", vector_add_stream, _VEC_BIG,
         _m(26, "Part 1 Step 2b q2", statistic="profile",
            note=_PROFILE_NOTE.format(v="2.6e-5 s", d=6) + "; two iterations of [128, 1000] fp32, the second "
                 "iteration's loads overlapping the first add (Step 2b q4)"),
         kwargs={"free_dim": 1000},
         differs="compiled with --disable-dge (see n256000_free_dim_2000); DMA queues: the default assignment"),
]

_TRANSPOSE = [
    Case("cs149-transpose", "n1024_fp32", matrix_transpose, (spec((1024, 1024), "float32"),),
         _m(86, "Part 1 Step 3 q1",
            note="'Execution Time: 86 us' (text only, no table): p99 NCL printed by run_benchmark.py --kernel "
                 "transpose -n 1024 (warmup 1, iters 10); 1024 x 1024 fp32 (np.random.rand), 64 blocks"),
         differs="tensor_copy PSUM -> SBUF placed on VectorE (the source leaves the engine to the compiler; the "
                 "student's profile names only DMA and TensorE rows); DMA queues: the default assignment"),
]

_CONV_DIFFERS = (
    "the input-row buffer is declared once outside the loops in the source; here each row load gets a new "
    "tile placed by liveness (x_bufs=None). The measured times require it: fp16 runs 2664 row loads in 824 us "
    "(309 ns per load, 3 matmuls of 222 columns = 277 ns at 2.4 GHz) and no DMA completes in 309 ns, so "
    "neuronxcc must have kept several loads in flight, i.e. renamed the buffer (x_bufs=1 is the literal "
    "single buffer); nl.zeros of the PSUM row + `res_psum += nc_matmul(...)` is one matmul accumulation group "
    "whose first matmul overwrites the bank, no memset (the NKI arch guide's PSUM-accumulation pattern, "
    "nki/guides/architecture/trainium_inferentia2_arch.rst; a VectorE memset per row, behind the previous row's "
    "epilogue in VectorE order, would idle TensorE ~1.2 us per row: 1371 us simulated for fp16), unfused "
    "VectorE adds of the 18 matmul results per row would cost more than the measured total; tensor_copy "
    "results assigned to slices (W_sbuf taps, tile_sbuf rows) are written there directly, no extra "
    "SBUF->SBUF copy; tensor_copy / tensor_reduce / tensor_tensor on VectorE; nl.transpose of a 2-byte tap "
    "gives an fp32 PSUM tile in this language (NKI may keep fp16), 36 of them in the prologue; DMA queues: "
    "the default assignment")
_CONV_ARGS = {dt: (spec((1, 256, 224, 224), dt), spec((256, 256, 3, 3), dt), spec((256,), dt))
              for dt in ("float32", "float16")}
_BENCH2 = ("test_harness.py: nki.benchmark(warmup=5, iters=20), NCL(99) of the pasted table; batch 1, Cin = Cout "
           "= 256, 224 x 224 input (valid 3 x 3 conv: 222 x 222 out), random X, W, bias of the tested dtype")

_CONV = [
    Case("cs149-conv2d", name, fused_conv2d_maxpool, _CONV_ARGS[dt],
         _m(v, f"Part 2 Outputs ({label})", note=f"{_BENCH2}; pool_size {pool}"),
         kwargs={"pool_size": pool}, differs=_CONV_DIFFERS)
    for name, dt, pool, v, label in (
        ("fp32", "float32", 1, 3832, "no maxpool, float32"),
        ("fp16", "float16", 1, 824, "no maxpool, float16"),
        ("maxpool_fp32", "float32", 2, 3830, "with maxpool, float32"),
        ("maxpool_fp16", "float16", 2, 825, "with maxpool, float16"),
    )
]

# The course harness's full-credit bounds for 224 x 224 (stanford-cs149/asst4-trainium2 @67a1f8b part2/
# test_harness.py lines 111-116, set 2025-11-03 in 62738e5, applied to pool_size 1 and 2 alike); the write-up
# shows the student's kernel meeting them ("Performance test passed" for all four).
_THRESH_NOTE = ("the harness's full-credit bound for (dtype, 224): p99 NCL must not exceed it; per the README "
                "it is 120% of the course's optimized reference kernel, so that kernel measured about {ref} us "
                "(X*1.2 with X likely its p99); the student's kernel met it on hardware (measured {meas} us, "
                "this case's kernel). The relaxed bound ({relaxed} us = 1.2 x an unoptimized reference) is "
                "implied and not added; the 32 x 16 bounds (110 / 84 us) are not added: the student disabled "
                "those tests, so no kernel shown meeting them is at hand")
_THRESHOLDS = [
    Case("cs149-conv2d", f"threshold_{name}", fused_conv2d_maxpool, _CONV_ARGS[dt],
         Measurement(bound, "p99", "trn2", "stanford-cs149/asst4-trainium2 67a1f8b part2/test_harness.py lines "
                     "111-116 (performance_requirements_by_dtype_size)", "2025-11", includes_launch=True,
                     kind="threshold", note=_THRESH_NOTE.format(ref=round(bound / 1.2, 1), meas=meas,
                                                                relaxed=relaxed)),
         kwargs={"pool_size": pool}, differs=_CONV_DIFFERS)
    for name, dt, pool, bound, relaxed, meas in (
        ("fp32", "float32", 1, 4596, 4964, 3832),
        ("fp16", "float16", 1, 1002, 1365, 824),
        ("maxpool_fp32", "float32", 2, 4596, 4964, 3830),
        ("maxpool_fp16", "float16", 2, 1002, 1365, 825),
    )
]

CASES = [*_TILED, *_STREAM, *_STREAM_PROFILE, *_TRANSPOSE, *_CONV, *_THRESHOLDS]
