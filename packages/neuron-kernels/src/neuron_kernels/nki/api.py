"""The one table of NKI's public API names (``nki``, ``nki.language``, ``nki.isa``, as documented for NKI 0.3+ /
Neuron 2.29-2.33) and what this front end does with each. ``docs/nki.md`` is generated from it (``python -c "from
neuron_kernels.nki.api import markdown; print(markdown(), end='')" > docs/nki.md``); a test keeps the two equal.

Every name marked ``missing`` is present in its module and raises ``NotImplementedError`` naming it when called (a
function) or read (a constant): never a silently different result.
"""

from __future__ import annotations


class NkiNotImplemented(NotImplementedError, AttributeError):
    """An NKI API this front end does not implement (also an AttributeError, so ``hasattr`` probes say False)."""


def missing(qualname: str, why: str = ""):
    """A stand-in for an unimplemented NKI function: raises NotImplementedError naming it when called."""

    def stub(*args, **kwargs):
        raise NkiNotImplemented(f"{qualname} is not implemented by neuron-kernels' NKI front end"
                                f"{': ' + why if why else ''} (docs/nki.md lists what is)")

    stub.__name__ = stub.__qualname__ = qualname.rsplit(".", 1)[-1]
    stub.__doc__ = f"{qualname}: not implemented (raises NotImplementedError). {why}"
    stub.__nki_missing__ = True
    return stub


OK, PARTIAL, MISSING = "implemented", "partial", "missing"

# operators NKI documents for nki.isa op= (and as tile functions) that the simulator's tables lack
_OPERATOR_NAMES = ("invert", "gelu_dx", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu_dx", "mish", "erf_dx",
                   "arctan", "mod", "abs_max", "abs_min", "ceil", "floor", "trunc", "tan", "logical_not",
                   "average", "prelu")

# module -> name -> (status, note). Ranked notes on what is missing come first in each module's missing list.
API: dict[str, dict[str, tuple[str, str]]] = {
    "nki": {
        "jit": (PARTIAL, "numpy / torch (CPU, or any device via .cpu()) arguments, outputs in the caller's type; "
                         "`kernel[grid]` / `kernel[lnc]` SPMD launches run the instances one after another on one "
                         "NeuronCore (values exact; device time of one core, not LNC=2's two); debug_kernel/"
                         "show_compiler_tb/experimental_flags are accepted (compiler diagnostics), other options "
                         "raise"),
        "simulate": (OK, "values and the simulated device time (`last_report`); `trace_path=` writes a Perfetto "
                         "trace"),
        "benchmark": (OK, "`benchmark_result.nc_latency.get_latency_percentile(p)` from simulated device time "
                          "(deterministic: every iteration gives the same figure); `save_trace_name` writes a "
                          "Perfetto JSON trace, not an NTFF"),
        "typing": (OK, "nki.typing.tensor annotations (not checked, as in NKI)"),
        "dtype": (OK, "neuron_hal.DType"),
        "baremetal": (MISSING, "legacy entry point"),
        "profile": (MISSING, "use benchmark(save_trace_name=...) or simulate(trace_path=...)"),
        "collectives": (MISSING, "nki.collectives: cross-core collectives"),
    },
    "nki.language": {
        **{d: (OK, "") for d in ("bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16",
                                 "float32", "bfloat16", "float8_e4m3", "float8_e5m2", "float8_e4m3fn")},
        **{d: (MISSING, "dtype not in the simulator (the name exists; a tensor of it raises)") for d in (
            "tfloat32", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4", "float8_e8m0fnu")},
        "NkiTensor": (OK, "the tracer's tensor type (methods: the nki.language.NkiTensor table)"),
        "ndarray": (PARTIAL, "on-chip `address=(start_partition, byte_offset)` places a tile there for the whole "
                             "kernel (other tiles are placed by liveness around it); HBM `address=` is missing"),
        "zeros": (PARTIAL, "on-chip buffers; HBM zeros are missing"),
        "zeros_like": (PARTIAL, "as zeros"),
        "ds": (OK, ""),
        "affine_range": (OK, "unrolled at trace time; the simulator overlaps independent iterations"),
        "sequential_range": (OK, "unrolled at trace time"),
        "static_range": (OK, "unrolled at trace time"),
        "dynamic_range": (MISSING, "on-chip loops with register bounds"),
        "fori_loop": (MISSING, "on-chip loops"),
        "while_loop": (MISSING, "on-chip loops"),
        "sbuf": (OK, ""), "psum": (OK, ""),
        "shared_hbm": (OK, "an HBM tensor: a kernel output when returned, else per-run scratch"),
        "private_hbm": (OK, "as shared_hbm while kernels run on one core"),
        "hbm": (OK, "alias of private_hbm, as in NKI"),
        "program_id": (OK, "the instance's index in a `kernel[grid]` launch (0 without one)"),
        "num_programs": (OK, "programs in the launch grid (all of them with axes=None; 1 without a grid)"),
        "program_ndim": (OK, "dims of the launch grid (0 without one)"),
        "device_print": (MISSING, "printing tile values from the simulator"),
        "tile_size": (OK, "pmax, psum_fmax, gemm_stationary_fmax, gemm_moving_fmax, bn_stats_fmax, "
                          "total_available_sbuf_size (bytes per partition) from the profile; psum_min_align and "
                          "sbuf_min_align are missing"),
        "full": (PARTIAL, "on-chip buffers (one memset); HBM is missing"),
        **{op: (OK, "operator for nisa `op=`; as a tile function `nl.op(x, y, dtype=)`: same shapes, a [P, 1] "
                    "column or a scalar (other broadcasts and type promotion between tiles raise)") for op in (
            "add", "subtract", "multiply", "divide", "maximum", "minimum", "power")},
        **{op: (PARTIAL, "operator for nisa `op=`; the tile-function form is missing") for op in (
            "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
            "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "fmod",
            "bypass")},
        **{op: (OK, "activation for nisa `op=`; as a tile function `nl.op(x, dtype=)` one ScalarE activation "
                    "(nl.copy: a tensor_copy)") for op
           in ("copy", "square", "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "silu", "tanh", "softplus", "erf",
               "exp", "log", "sin", "cos", "sqrt", "rsqrt", "reciprocal", "sign")},
        "abs": (OK, "activation for nisa `op=`; the unary ALU operator of tensor_scalar / tensor_scalar_reduce "
                    "(operand 0 or None); as a tile function one ScalarE activation"),
        **{op: (MISSING, "operator not in the simulator's ALU/activation tables (the name exists; using it raises)")
           for op in _OPERATOR_NAMES},
        "load": (OK, "a new SBUF tile by DMA; `dtype=` casts"),
        "store": (OK, "by DMA"),
        **{op: (OK, "tile function: one VectorE tensor_reduce over the last contiguous free dims (fp32 math; "
                    "`keepdims`, `dtype`)") for op in ("sum", "max", "min")},
        "mean": (OK, "tile function: a VectorE sum in fp32, then a multiply by 1/count"),
        **{op: (MISSING, "tile-function reduction not implemented") for op in ("prod", "var", "all")},
        "broadcast_to": (OK, "size-1 free dims: a VectorE copy of a stride-0 view; a one-partition tile: a GpSimd "
                             "partition broadcast"),
        "ones": (PARTIAL, "as full: on-chip buffers (one memset); HBM is missing"),
        "empty_like": (OK, ""),
        "expand_dims": (OK, "a view, no copy"),
        "negative": (OK, "tile function: a VectorE multiply by -1"),
        "transpose": (OK, "tile function: TensorE transpose into a new PSUM tile"),
        "matmul": (OK, "tile function: TensorE into a new fp32 PSUM tile; without transpose_x, x is first "
                       "transposed on TensorE"),
        "shared_identity_matrix": (OK, "a GpSimd iota and a VectorE compare, once per (n, dtype) in a kernel"),
        "where": (OK, "tile function: a VectorE select (y a tile or a scalar)"),
        **{f: (OK, "") for f in ("is_hbm", "is_sbuf", "is_psum", "is_on_chip")},
        "NKIObject": (OK, "a plain Python base class (kernels are traced in Python)"),
        "MemoryRegion": (OK, "the enum; the buffers themselves are nl.sbuf / nl.psum / nl.*hbm"),
        "DType": (OK, "neuron_hal.DType, the type of every nl dtype (NKI documents it as str; DType.of accepts the "
                      "strings)"),
        **{f: (MISSING, why) for f, why in (
            ("softmax", "tile-function softmax"), ("rms_norm", "tile-function rms_norm"),
            ("dropout", "random numbers"), ("rand", "random numbers"), ("random_seed", "random numbers"),
            ("shared_constant", "constants embedded in the kernel"),
            ("load_transpose2d", "transposing load"), ("gather_flattened", "gather"),
            ("no_reorder", "scheduling directive"))},
    },
    "nki.language.NkiTensor": {
        "shape": (OK, ""), "dtype": (OK, ""), "ndim": (OK, ""), "size": (OK, ""), "strides": (OK, ""),
        "buffer": (OK, ""), "name": (OK, ""),
        "ap": (PARTIAL, "pattern, offset, dtype on a whole tensor; vector_offset (a [P, 1] row-index tile) with "
                        "indirect_dim=0 on a whole HBM tensor for dma_copy gathers/scatters; scalar_offset is "
                        "missing"),
        "reshape": (OK, "without a copy; a tile keeps its partition dim"),
        "view": (PARTIAL, "same-size dtype bitcast; size-changing views are missing"),
        "permute": (OK, "a tile's partition dim stays first"),
        "broadcast": (OK, "(dim, size) of a size-1 free dim, stride 0"),
        "expand_dim": (OK, ""), "squeeze_dim": (OK, ""), "is_contiguous": (OK, ""), "get_pattern": (OK, ""),
        "__getitem__": (OK, "ints, slices with positive steps, nl.ds, ..."),
        **{m: (MISSING, "") for m in ("flatten_dims", "reshape_dim", "slice", "select", "rearrange", "indirect",
                                       "is_indirect", "vector_select", "reinterpret_cast")},
    },
    "nki.isa": {
        "nc_matmul": (PARTIAL, "PSUM accumulation as documented (first write overwrites, later ones add; "
                               "`accumulate=`); is_transpose=True is TensorE's bit-accurate transpose of "
                               "stationary (moving is the identity the docs require: its values are not read); "
                               "tile_position/tile_size validated, values exact, costed as the full array (no "
                               "overlap of side-by-side tiles); perf_mode=double_row is missing"),
        "nc_transpose": (OK, "TensorE or VectorE"),
        "activation": (PARTIAL, "float or [P,1] bias and scale; reduce_res with reduce_cmd=reset_reduce "
                                "(reduce_op=nl.add); register accumulation across instructions (reset/reduce/"
                                "load_reduce) is missing"),
        "activation_reduce": (OK, "activation with reduce_cmd=reset_reduce"),
        "tensor_reduce": (OK, "NKI's argument order (dst, op, data, axis, negate, keepdims)"),
        "tensor_partition_reduce": (OK, "GpSimd reduction over partitions into one partition"),
        "tensor_tensor": (OK, ""),
        "tensor_tensor_scan": (OK, ""),
        "select_reduce": (PARTIAL, "the select (on_false a float or a [P, 1] column); reduce_res (the fused max "
                                  "reduction) and reverse_pred are missing"),
        "scalar_tensor_tensor": (PARTIAL, "reduce_res (fused reduction) is missing"),
        "tensor_scalar": (OK, "the library's instruction; nl.abs as a unary op0/op1 (operand 0 or None)"),
        "tensor_scalar_reduce": (PARTIAL, "reduce_cmd=reset_reduce (the default): the reduction of the fp32 results "
                                          "(add, multiply, max, min; reduce_res_negate); costed as a tensor_scalar "
                                          "and a tensor_reduce; accumulation across instructions is missing"),
        "tensor_copy": (OK, ""),
        "memset": (OK, ""),
        "iota": (OK, "pattern [[step, num], ...], offset, channel_multiplier"),
        "affine_select": (OK, "pattern, offset, channel_multiplier, on_true_tile, on_false_value, cmp_op"),
        "bn_stats": (OK, ""),
        "bn_aggr": (OK, ""),
        "reciprocal": (PARTIAL, "value exact (VectorE divide); costed as a tensor_scalar, not 8N cycles"),
        "dma_copy": (PARTIAL, "static addresses (any dge_mode); gather/scatter through a vector_offset access "
                              "pattern (dst_rmw_op=nl.add: accumulating scatter); other dst_rmw_op and register "
                              "offsets are missing"),
        "dma_transpose": (PARTIAL, "NKI's permutations (2-D [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0]; 3-/4-D as one "
                                   "2-D DMA transpose per middle index); indirect (gather) transposes are missing"),
        "engine": (OK, ""), "reduce_cmd": (OK, ""), "dge_mode": (OK, ""), "oob_mode": (OK, ""),
        "nc_version": (OK, ""), "get_nc_version": (OK, "from the traced profile"),
        **{n: (OK, "documented semantics (fp32 compare, first occurrences, duplicate pairing); composed from VectorE "
                   "reduce/compare/select rounds, so device time is an upper bound (~6 passes per value)")
           for n in ("max8", "nc_find_index8", "nc_match_replace8")},
        "nc_stream_shuffle": (PARTIAL, "float data: documented semantics (per-quadrant mask, 255 keeps, in place); "
                                       "composed from TensorE transposes and VectorE copies, so device time is "
                                       "the composition's; integer data is missing"),
        "matmul_perf_mode": (OK, "the enum; nc_matmul(perf_mode=double_row) is missing"),
        **{e: (OK, "deprecated alias of nisa.engine members") for e in (
            "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine")},
        "dma_engine": (OK, "alias of nisa.engine.dma"),
        "NkiValidationError": (OK, "neuron_kernels.KernelError (trace-time validation errors)"),
        "get_nc_sub_version": (OK, "0 (the profiles model first revisions)"),
        "NkiInstruction": (MISSING, "instruction handles and depends_on"),
        "VirtualRegister": (MISSING, "registers"),
        "topk": (MISSING, "GpSimd top-k"),
        **{name: (MISSING, why) for name, why in (
            ("range_select", "range predicate select"),
            ("tensor_copy_predicated", "predicated copy"),
            ("nonzero_with_count", "stream compaction"),
            ("local_gather", "GpSimd local gather"),
            ("nc_n_gather", "GpSimd gather"),
            ("tensor_copy_dynamic_src", "runtime-offset copy"),
            ("tensor_copy_dynamic_dst", "runtime-offset copy"),
            ("register_alloc", "registers and on-chip control flow"),
            ("register_load", "registers"),
            ("register_store", "registers"),
            ("register_move", "registers"),
            ("scalar_alu", "registers"),
            ("core_barrier", "two-core (LNC=2) kernels"),
            ("sendrecv", "two-core (LNC=2) kernels"),
            ("tensor_scalar_cumulative", "cumulative tensor_scalar"),
            ("exponential", "VectorE exponential"),
            ("activate2", "NeuronCore-v4 activation"),
            ("nc_matmul_mx", "MX quantized matmul (NeuronCore-v4)"),
            ("quantize_mx", "MX quantization (NeuronCore-v4)"),
            ("dma_compute", "DMA compute"),
            ("dropout", "dropout"),
            ("rng", "random numbers"),
            ("rand2", "random numbers"),
            ("rand_set_state", "random numbers"),
            ("rand_get_state", "random numbers"),
            ("set_rng_seed", "random numbers"),
            ("sequence_bounds", "sequence bounds"),
        )},
    },
}


SDK, LIB = ("aws-neuron/aws-neuron-sdk", "81ce03ae261e"), ("aws-neuron/nki-library", "d2ad3a579498")
_TUT, _MM = "nki/examples", "nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py"
_CORE = "src/nkilib_src/nkilib/core"
_OK, _LNC2 = "values match", "values match (also as kernel[2])"
# Public current-API NKI kernels run unmodified on this front end against numpy references written for them
# (2026-12-02; the kernels are not in this repository). before: phase 1's front end; after: this one.
PUBLIC_KERNELS: list[tuple[str, tuple[str, str], str, str, str]] = [
    ("nki_tensor_add", SDK, f"{_TUT}/tensor_addition/tensor_addition_nki_kernels.py", _OK, _OK),
    ("nki_tensor_add_kernel", SDK, f"{_TUT}/getting_started_torch.py", "AttributeError nl.load", _OK),
    ("add_kernel (nki.simulate)", SDK, f"{_TUT}/simulate/nki_simulate_example.py", "AttributeError nl.load", _OK),
    ("tensor_split_kernel_", SDK, f"{_TUT}/index-case-1.py", "AttributeError nl.load", _OK),
    ("tensor_maxpool_kernel_ (.ap)", SDK, f"{_TUT}/index-case-3.py", "AttributeError nl.load", _OK),
    ("tensor_exp_kernel_", SDK, f"{_TUT}/layout-pass.py", "AttributeError nl.load", _OK),
    ("tensor_transpose2D_kernel_", SDK, f"{_TUT}/transpose2d/transpose2d_nki_kernels.py", _OK, _OK),
    ("tensor_avgpool_kernel", SDK, f"{_TUT}/average_pool2d/average_pool2d_nki_kernels.py",
     "NotImplementedError nki.typing", _OK),
    *((name, SDK, _MM, _OK, _OK) for name in (
        "nki_matmul_basic_", "nki_matmul_tiled_", "nki_matmul_hoist_load_", "nki_matmul_block_free_dimension_",
        "nki_matmul_fully_optimized_")),
    *((name, SDK, f"{_TUT}/fused_mamba/mamba_nki_kernels.py", "AttributeError nl.broadcast_to", _OK)
      for name in ("mamba_v1", "mamba_v2", "mamba_v3")),
    ("cumsum", LIB, f"{_CORE}/cumsum/cumsum.py", "NotImplementedError nl.gelu_apprx_sigmoid (read)", _LNC2),
    ("RoPE", LIB, f"{_CORE}/embeddings/rope.py", "NotImplementedError nl.gelu_apprx_sigmoid (read)", _LNC2),
    ("rope_hf", LIB, f"{_CORE}/embeddings/rope_hf.py", "NotImplementedError nl.gelu_apprx_sigmoid (read)", _OK),
    ("cascaded_max", LIB, f"{_CORE}/max/cascaded_max.py", "NotImplementedError nl.gelu_apprx_sigmoid (read)",
     _LNC2),
    ("rotational_topk", LIB, f"{_CORE}/topk/rotational_topk.py", "NotImplementedError nl.gelu_apprx_sigmoid (read)",
     _OK),
    ("output_projection_cte", LIB, f"{_CORE}/output_projection/output_projection_cte/output_projection_cte.py",
     "NotImplementedError nl.gelu_apprx_sigmoid (read)", _LNC2),
    ("attention_cte", LIB, f"{_CORE}/attention/attention_cte.py", "AttributeError nl.NKIObject", _LNC2),
    ("find_nonzero_indices", LIB, f"{_CORE}/subkernels/find_nonzero_indices.py", "ImportError nki.isa.constants",
     "NotImplementedError nisa.nonzero_with_count"),
    ("indexed_flatten (kernel[2])", LIB, f"{_CORE}/subkernels/indexed_flatten.py",
     "NotImplementedError nl.gelu_apprx_sigmoid (read)", "NotImplementedError .ap(scalar_offset=) (runtime offsets)"),
    # held out: first run after the changes above, then the gaps they showed were filled (jit diagnostics options,
    # ordered nc_version, matmul row/column tiling, stride-0 destinations)
    *((f"qkv ({variant}, held out)", LIB, f"{_CORE}/qkv/qkv.py", "AttributeError nl.NKIObject", _OK)
      for variant in ("context encoding", "context encoding + RMSNorm", "token generation",
                      "token generation + RMSNorm")),
    ("attention_bwd (held out)", LIB, f"{_CORE}/attention/attention_bwd.py",
     "NotImplementedError nl.gelu_apprx_sigmoid (read)", _OK),
    # second held-out batch (then: nl.abs as a unary ALU operator)
    ("rmsnorm_quant_kernel (fp8 row quantization, held out)", LIB, f"{_CORE}/rmsnorm/rmsnorm_quant.py",
     "NotImplementedError nl.gelu_apprx_sigmoid (read)", "values match (fp8: within one rounding)"),
    # third held-out batch (then: nc_stream_shuffle)
    ("output_projection_tkg (held out)", LIB, f"{_CORE}/output_projection/output_projection_tkg.py",
     "ModuleNotFoundError nki.isa.constants", _OK),
]
# not counted: nki-library's mlp/mlp.py at that commit does not import (an IndentationError in the file itself);
# router_topk/router_topk.py imports neuronxcc (the legacy API)


def status(module: str, name: str) -> str:
    return API[module][name][0]


def markdown() -> str:
    """docs/nki.md: every name and its status."""
    lines = ["# NKI on the simulator: API status", "",
             "Generated from `packages/neuron-kernels/src/neuron_kernels/nki/api.py` "
             "(`markdown()`; tests/nki/test_api.py checks this file against it). `missing` names exist and raise "
             "`NotImplementedError` naming themselves; `partial` names implement what the note says and raise "
             "`NotImplementedError` for the rest.", ""]
    for module, names in API.items():
        counts = {s: sum(1 for v in names.values() if v[0] == s) for s in (OK, PARTIAL, MISSING)}
        lines += [f"## `{module}`", "", ", ".join(f"{n} {s}" for s, n in counts.items()), "",
                  "| name | status | note |", "| --- | --- | --- |"]
        for name, (st, note) in sorted(names.items(), key=lambda kv: ((OK, PARTIAL, MISSING).index(kv[1][0]), kv[0])):
            lines.append(f"| `{name}` | {st} | {note} |")
        lines.append("")
    matched = sum(1 for k in PUBLIC_KERNELS if k[4].startswith(_OK))
    lines += ["## Public NKI kernels, unmodified", "",
              f"Current-API kernels of AWS's public repositories run unchanged (`import nki` answered by this front "
              f"end) against numpy references: {matched} of {len(PUBLIC_KERNELS)} give matching values, the others "
              f"raise NotImplementedError naming the missing API. *before*: phase 1's front end.", "",
              "| kernel | source (repo@commit: path) | before | after |", "| --- | --- | --- | --- |"]
    for name, (repo, commit), path, before, after in PUBLIC_KERNELS:
        lines.append(f"| `{name}` | {repo}@{commit}: `{path}` | {before} | {after} |")
    lines.append("")
    return "\n".join(lines)
