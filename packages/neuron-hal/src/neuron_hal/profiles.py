"""Device profiles: every hardware number the simulator and the kernels use, each with its source.

Source tags are defined in the project's hardware reference, ``docs/hardware.md`` (section 0: each tag's public
document, release and path). ``[INFERRED]`` marks a value derived by arithmetic or judgement, not stated by AWS;
``[CONFLICT]`` marks a value AWS pages disagree on (the alternative is named); "fitted" marks a value the
calibration suite fits to published measurements (``docs/fidelity.md``: the cases, the fit and its residuals).
``profile.source(name)`` returns the source.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from dataclasses import dataclass, field

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def _f(source: str):
    """A required profile field carrying its source tag."""
    return field(metadata={"source": source})


@dataclass(frozen=True)
class Profile:
    name: str = _f("product name")
    nc_version: int = _f("[NKI-ARCH-V2/V3/V4] NeuronCore generation")
    cores_per_chip: int = _f("[ARCH-TRN1/2/3]")

    # Engine clocks (GHz) and data paths (elements per cycle across all 128 partitions).
    tensor_ghz: float = _f("[NKI-ARCH-V2/V3/V4] §2.1")
    vector_ghz: float = _f("[NKI-ARCH-V2/V3/V4] §2.1")
    scalar_ghz: float = _f("[NKI-ARCH-V2/V3/V4] §2.1")
    gpsimd_ghz: float = _f("[NKI-ARCH-V2/V3/V4] §2.1")
    vector_lanes_16bit: int = _f("[NKI-ARCH-V2/V3/V4] §2.1 VectorE width for BF16/FP16")
    vector_lanes: int = _f("[NKI-ARCH-V2/V3/V4] §2.1 VectorE width for other dtypes")
    scalar_lanes_16bit: int = _f("[NKI-ARCH-V2/V3/V4] §2.1 ScalarE width for BF16/FP16/FP8")
    scalar_lanes: int = _f("[NKI-ARCH-V2/V3/V4] §2.1")
    gpsimd_lanes: int = _f("[NKI-ARCH-V2][NKI-ARCH-V4] §2.1; NC-v3 [INFERRED] (its guide leaves the width blank)")

    # PE array and tile limits.
    pe_rows: int = _f("[NKI-ARCH-V2] 128x128 systolic array")
    pe_cols: int = _f("[NKI-ARCH-V2] 128x128 systolic array")
    pmax: int = _f("[NL-2.26] nl.tile_size.pmax")
    gemm_stationary_fmax: int = _f("[NL-2.26] nl.tile_size.gemm_stationary_fmax")
    gemm_moving_fmax: int = _f("[NL-2.26] nl.tile_size.gemm_moving_fmax")
    psum_bank_fmax: int = _f("[NL-2.26] psum_fmax: one 2 KiB bank of FP32")
    bn_stats_fmax: int = _f("[NL-2.26] nl.tile_size.bn_stats_fmax")
    scalar_tensor_copy: bool = _f(
        "[NKI-ARCH-V3] bit-exact ScalarE tensor_copy from NC-v3; NC-v2's ScalarE copies through FP32 ([ISA-2.26]), "
        "which the project issues as an identity activation (same cost)")
    scalar_tensor_scalar: bool = _f("[NKI-ARCH-V4] native ScalarE tensor_scalar from NC-v4")
    psum_bf16_output: bool = _f("[NKI-ARCH-V4] BF16 PSUM output only on NC-v4")
    free_size_max: int = _f("[NKI-ARCH-V2] F access pattern sizes are uint16")
    free_stride_max: int = _f("[NKI-ARCH-V2] F access pattern strides are int16")
    free_dims_max: int = _f("[NKI-ARCH-V2] F access pattern up to 4-D")
    vector_fmax_psum: int = _f("[NKI-ARCH-V2] VectorE free-dim limit reading PSUM: 4K elements")

    # On-chip memories.
    sbuf_partitions: int = _f("[NKI-ARCH-V2/V3/V4] §2.2")
    sbuf_partition_bytes: int = _f("[NKI-ARCH-V2/V3/V4] §2.2")
    psum_partition_bytes: int = _f("[NKI-ARCH-V2/V3/V4] §2.2 16 KiB per partition")
    psum_banks: int = _f("[NKI-ARCH-V2] 8 banks per partition")

    # Instruction cost constants (engine cycles).
    min_ii: int = _f("[ISA-2.26] MIN_II; NC-v3/v4 [INFERRED] same as NC-v2")
    min_ii_dynamic: int = _f("[ISA-2.26] MIN_II_DYNAMIC")
    gpsimd_start: int = _f("[ISA-2.26] GPSIMD_START")
    mm_init_latency: int = _f("[NKI-ARCH-V2] MM_INIT_LATENCY; NC-v3/v4 [INFERRED] same")
    matmul_fp32_factor: float = _f(
        "[ISA-2.26] an FP32 matmul costs 4x (NC-v3: the NKI kernel-optimization tutorial's PE-bound fp32 kernels run "
        "at 4.0x, docs/fidelity.md; NC-v4 [INFERRED] same); NC-v2 fitted: 4.7x over the four TensorE-bound fp32 "
        "kernels of the calibration suite (AccelOpt's NKIBench on trn1), docs/fidelity.md")
    fast_load_stationary_factor: int = _f("[NKI-ARCH-V2][PERF] LoadStationary up to 4x faster than MM")
    scalar_dependent_cycles: int = _f(
        "[PERF] measured: dependent 1-element ScalarE instructions start every 189 ns = 264 cycles (NC-v2); "
        "NC-v3/v4 [INFERRED] same cycles")
    vector_dependent_cycles: int = _f(
        "VectorE floor of an instruction that reads what the previous one wrote: [NKI-ARCH-V2] ~100 cycles of "
        "static overhead for dependent back-to-back instructions, on top of MIN_II; see docs/fidelity.md")
    gpsimd_dependent_cycles: int = _f(
        "GpSimd floor of a dependent instruction: [NKI-ARCH-V2] as VectorE (~100 cycles static overhead); "
        "see docs/fidelity.md")
    act_table_load_ns: float = _f(
        "ScalarE loads a function's table when an activation uses another function than the previous one: "
        "measured ACT_TABLE_LOAD 368 ns on NC-v2 (NKI profiler tutorial, Neuron 2.20 docs); NC-v3/v4 [INFERRED] "
        "the same ScalarE cycles")
    act_read_accumulator_cycles: int = _f("[NKI-ARCH-V2] ActReadAccumulator ~64 ScalarE cycles")
    stride_penalty_bytes: int = _f("[NKI-ARCH-V2] innermost stride >= 16 B halves SBUF bandwidth")
    vector_reciprocal_factor: int = _f("[ISA-NOW] Vector reciprocal costs 8N")
    vector_perf_copy_factor: int = _f(
        "[NKI-ARCH-V3] VectorE perf mode: 4x copy/tensor_scalar BF16 SBUF contiguous (1 = none)")
    vector_perf_copy_partial_factor: int = _f(
        "[NKI-ARCH-V3] 2x when not contiguous or one side PSUM (1 = none); NC-v4 [INFERRED] same (its guide does not "
        "restate the mode)")
    scalar_perf_factor: int = _f("[NKI-ARCH-V4] ScalarE 2x BF16 tensor_scalar/copy (1 = none)")

    # DMA.
    dma_engines: int = _f("[NKI-ARCH-V2/V3][DMA-BW] 16 DMA engines per NeuronCore")
    dma_queues: int = _f("[DMA-OV] 16 queues per DMA engine")
    dma_engine_bytes_per_ns: float = _f(
        "[DMA-BW][DMA-OV] bandwidth per DMA engine 17 / 23 / 33 B/ns; [CONFLICT] [DMA-OV] also gives 27.2 / 38.4 "
        "GB/s per engine as 'theoretical' ([NKI-ARCH-V2]: 27 GiB/s): the profiles take the former as what an engine "
        "sustains (a trn2 engine measured 23.1 B/ns, [DMA-OV])")
    dma_engine_peak_bytes_per_ns: float = _f(
        "[DMA-OV][NKI-ARCH-V2] the other 'theoretical' per-engine figure (27.2 / 38.4 GB/s); not used by the model")
    dma_fixed_ns: float = _f(
        "latency from a DMA's trigger to its first data on the engines: [DMA-BW] ~1,300 ns semaphore-to-start "
        "(NC-v2); NC-v3 measured ~740 ns trigger to first data (NKI DMA overview profile); NC-v4 [INFERRED] NC-v3")
    dma_issue_ns: float = _f(
        "time a DMA instruction occupies its queue's descriptor generation: [NKI-ARCH-V3][DGE] ~600 ns per "
        "hardware-DGE instruction (NC-v3; NC-v4 [INFERRED] same); NC-v2 has no DGE (descriptors are prepared by "
        "the compiler): fitted, see docs/fidelity.md")
    dma_issue_desc_ns: float = _f(
        "descriptor generation time per descriptor (one per contiguous run) on top of dma_issue_ns: fitted to "
        "the NKI DMA overview's throughput-versus-bytes-per-partition curve (NC-v3); 0 on NC-v2 (no DGE)")
    dma_dge_units: int = _f(
        "[NKI-ARCH-V3] 2 hardware DGEs per NeuronCore generate descriptors for all queues (NC-v4 [INFERRED] "
        "same); 0 = none (NC-v2): each queue issues on its own")
    dma_run_min_ns: float = _f(
        "engine time of the shortest contiguous run (descriptor element): a 4 B transfer occupies an engine "
        "7 ns (NKI performance guide figure 29, NC-v2); longer runs move at the engine bandwidth; NC-v3/v4 "
        "[INFERRED] same")
    dma_read_window_bytes: int = _f(
        "HBM read bytes one queue keeps in flight per DMA engine: a queue's HBM reads move at most "
        "window / dma_fixed_ns per engine (Little's law); fitted, see docs/fidelity.md")
    dma_partitions_per_engine: int = _f("[NKI-ARCH-V2][DMA-OV] 16 engines x 8 partitions cover 128")
    dma_partition_affinity: bool = _f(
        "whether a transfer's SBUF partitions choose its engines (partition p on engine p // "
        "dma_partitions_per_engine): NC-v3 measured ([DMA-OV]: a 4-partition load uses one engine, trn2); NC-v4 "
        "[INFERRED] same (hardware DGE). NC-v2 False: its descriptors are prepared by the compiler, which spreads "
        "every transfer over all engines; inferred from trn1 measurements (the 2024 resize-nearest kernel moved "
        "10-partition transfers at >= 66 GB/s, more than the two engines of 10 partitions can; see "
        "docs/fidelity.md)")
    dma_transpose: bool = _f(
        "[NKI-ARCH-V3] DMA transpose (HBM->SBUF, SBUF->SBUF; 2- and 4-byte dtypes) from NC-v3; NC-v2 has none; "
        "NC-v4 [INFERRED] keeps it (the trn3 guide is silent)")
    dma_transpose_hbm_fraction: float = _f(
        "[NKI-ARCH-V3] a DMA transpose HBM->SBUF runs at up to 90% of copy throughput; NC-v4 [INFERRED] same; "
        "0 where there is no DMA transpose")
    dma_transpose_sbuf_fraction: float = _f(
        "[NKI-ARCH-V3] a DMA transpose SBUF->SBUF runs at up to 50% of copy throughput; NC-v4 [INFERRED] same; "
        "0 where there is no DMA transpose")

    # Runtime.
    launch_pre_ns: float = _f(
        "device time of each program execution before its first instruction (the runtime's start-up in the "
        "NEFF): NC-v2 profiles show ~13 us before the first DMA (fused-Mamba and profiler tutorials, Neuron 2.20 "
        "docs); the total with launch_post_ns is fitted, see docs/fidelity.md")
    launch_post_ns: float = _f(
        "device time of each program execution after its last instruction (tear-down): NC-v2 profiles show "
        "~5 us; fitted with launch_pre_ns, see docs/fidelity.md")

    # HBM.
    hbm_bytes: int = _f("[ARCH-TRN1/2/3] HBM per chip")
    hbm_gbps: float = _f(
        "[ARCH-TRN1/2/3] HBM bandwidth per chip, GB/s; [CONFLICT] trn1: [ARCH-TRN1] 820 GiB/s vs [NKI-ARCH-V2] "
        "820 GB/s (GB/s taken; the NC-v2 profiler's 100% DMA throughput is ~410 GB/s per core, [PERF] figure 27); "
        "trn2, trn3 as the profile definitions note")

    # Throughput claims used as roofline references.
    tensor_bf16_tflops: float = _f("[NKI-ARCH-V2/V3/V4] per-NC claim; model = 128x128x2xclock")

    # Chip-to-chip.
    neuronlink_links: int = _f("[NKI-ARCH-V2/V3] 4 links per chip")
    neuronlink_gbps: float = _f("[ARCH-TRN2][ARCH-TRN3] NeuronLink bandwidth per chip, GB/s")
    cc_cores: int = _f("[ARCH-TRN2][ARCH-TRN3] CC-Cores per chip; [CONFLICT] 20 in [NKI-ARCH-V3] and [NKI-ARCH-V4]")
    cc_hop_ns: float = _f("[CC] per-hop latency 1-2 us")

    # ---- derived figures ------------------------------------------------------------------
    @property
    def hbm_gbps_per_core(self) -> float:
        """[INFERRED] chip HBM bandwidth split evenly over its cores."""
        return self.hbm_gbps / self.cores_per_chip

    @property
    def dma_bytes_per_ns(self) -> float:
        """Sustained DMA bandwidth of one core: its engines, capped by its share of HBM."""
        return min(self.dma_engines * self.dma_engine_bytes_per_ns, self.hbm_gbps_per_core)

    @property
    def dma_engine_hbm_bytes_per_ns(self) -> float:
        """One DMA engine's bandwidth when HBM is one side: its own, capped by its share of the core's HBM."""
        return min(self.dma_engine_bytes_per_ns, self.hbm_gbps_per_core / self.dma_engines)

    @property
    def launch_ns(self) -> float:
        """Runtime start-up plus tear-down of one program execution (device time)."""
        return self.launch_pre_ns + self.launch_post_ns

    @property
    def dma_issuers(self) -> int:
        """How many DMA instructions can have their descriptors generated at once: the DGE units, else every
        queue on its own."""
        return self.dma_dge_units or self.dma_queues

    def dma_issue_time_ns(self, descriptors: int = 1) -> float:
        """Time one DMA instruction holds its queue (and DGE) while its descriptors are generated."""
        return self.dma_issue_ns + self.dma_issue_desc_ns * descriptors

    def dma_transfer_ns(self, nbytes: float, run_bytes: float, hbm: bool = True) -> float:
        """Engine time of ``nbytes`` moved in contiguous runs of ``run_bytes``, spread over every DMA engine: each
        run takes max(dma_run_min_ns, its bytes at the engine's bandwidth)."""
        bw = self.dma_engine_hbm_bytes_per_ns if hbm else self.dma_engine_bytes_per_ns
        run_bytes = max(float(run_bytes), 1.0)
        return nbytes / run_bytes * max(self.dma_run_min_ns, run_bytes / bw) / self.dma_engines

    @property
    def sbuf_bytes(self) -> int:
        return self.sbuf_partitions * self.sbuf_partition_bytes

    @property
    def psum_bank_bytes(self) -> int:
        return self.psum_partition_bytes // self.psum_banks

    @property
    def tensor_peak_flops(self) -> float:
        """BF16 FLOP/s of one core's PE array: rows x cols x 2 FLOP x clock (§1.1 consistency check)."""
        return self.pe_rows * self.pe_cols * 2 * self.tensor_ghz * 1e9

    def clock_ghz(self, engine: str) -> float:
        return getattr(self, f"{engine}_ghz")

    def source(self, name: str) -> str:
        for f in dataclasses.fields(self):
            if f.name == name:
                return f.metadata["source"]
        raise KeyError(f"profile has no parameter {name!r}")

    def replace(self, **changes) -> Profile:
        return dataclasses.replace(self, **changes)

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of every parameter's value: tells apart profiles that share a name (``replace`` keeps it)."""
        values = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]
        return hashlib.sha256(repr(values).encode()).hexdigest()

    def describe(self) -> list[tuple[str, object, str]]:
        """(name, value, source) for every parameter."""
        return [(f.name, getattr(self, f.name), f.metadata["source"]) for f in dataclasses.fields(self)]


_COMMON = dict(
    pe_rows=128, pe_cols=128, pmax=128, gemm_stationary_fmax=128, gemm_moving_fmax=512,
    psum_bank_fmax=512, bn_stats_fmax=512, free_size_max=65535, free_stride_max=32767, free_dims_max=4,
    vector_fmax_psum=4096, sbuf_partitions=128, psum_partition_bytes=16 * KiB, psum_banks=8,
    min_ii=64, min_ii_dynamic=600, gpsimd_start=150, mm_init_latency=64,
    fast_load_stationary_factor=4, scalar_dependent_cycles=264, vector_dependent_cycles=164,
    gpsimd_dependent_cycles=164, act_read_accumulator_cycles=64, stride_penalty_bytes=16, vector_reciprocal_factor=8,
    dma_engines=16, dma_queues=16, dma_partitions_per_engine=8,
    neuronlink_links=4, cc_hop_ns=1500.0,
)

TRN1 = Profile(
    name="trn1", nc_version=2, cores_per_chip=2,
    tensor_ghz=2.8, vector_ghz=1.12, scalar_ghz=1.4, gpsimd_ghz=1.4,
    vector_lanes_16bit=128, vector_lanes=128, scalar_lanes_16bit=128, scalar_lanes=128, gpsimd_lanes=128,
    psum_bf16_output=False, scalar_tensor_copy=False, scalar_tensor_scalar=False, sbuf_partition_bytes=192 * KiB,
    dma_transpose=False, dma_transpose_hbm_fraction=0.0, dma_transpose_sbuf_fraction=0.0,
    vector_perf_copy_factor=1, vector_perf_copy_partial_factor=1, scalar_perf_factor=1,
    dma_engine_bytes_per_ns=17.0, dma_engine_peak_bytes_per_ns=27.2,
    matmul_fp32_factor=4.7,
    dma_fixed_ns=1300.0, dma_issue_ns=10.0, dma_issue_desc_ns=0.0, dma_dge_units=0, dma_read_window_bytes=8192,
    dma_run_min_ns=7.0, dma_partition_affinity=False,
    act_table_load_ns=368.0, launch_pre_ns=13000.0, launch_post_ns=5000.0,
    hbm_bytes=32 * GiB, hbm_gbps=820.0, tensor_bf16_tflops=92.0,
    neuronlink_gbps=384.0, cc_cores=6, **_COMMON,
)

TRN2 = Profile(
    name="trn2", nc_version=3, cores_per_chip=8,
    tensor_ghz=2.4, vector_ghz=0.96, scalar_ghz=1.2, gpsimd_ghz=1.2,
    vector_lanes_16bit=512, vector_lanes=256, scalar_lanes_16bit=128, scalar_lanes=128, gpsimd_lanes=128,
    psum_bf16_output=False, scalar_tensor_copy=True, scalar_tensor_scalar=False, sbuf_partition_bytes=224 * KiB,
    dma_transpose=True, dma_transpose_hbm_fraction=0.9, dma_transpose_sbuf_fraction=0.5,
    vector_perf_copy_factor=4, vector_perf_copy_partial_factor=2, scalar_perf_factor=1,
    dma_engine_bytes_per_ns=23.0, dma_engine_peak_bytes_per_ns=27.2,
    matmul_fp32_factor=4.0,
    dma_fixed_ns=740.0, dma_issue_ns=845.0, dma_issue_desc_ns=1.8, dma_dge_units=2, dma_read_window_bytes=65536,
    dma_run_min_ns=18.0, dma_partition_affinity=True,
    act_table_load_ns=429.0, launch_pre_ns=9100.0, launch_post_ns=3500.0,
    # [CONFLICT] 2.9 TB/s [ARCH-TRN2] vs 3 TB/s in the NKI trn2 guide; the architecture page is used.
    hbm_bytes=96 * GiB, hbm_gbps=2900.0, tensor_bf16_tflops=79.0,
    # [CONFLICT] CC-Cores: 16 [ARCH-TRN2] vs 20 [NKI-ARCH-V3].
    neuronlink_gbps=1280.0, cc_cores=16, **_COMMON,
)

TRN3 = Profile(
    name="trn3", nc_version=4, cores_per_chip=8,
    tensor_ghz=2.4, vector_ghz=1.2, scalar_ghz=1.2, gpsimd_ghz=1.2,
    vector_lanes_16bit=512, vector_lanes=256, scalar_lanes_16bit=256, scalar_lanes=128, gpsimd_lanes=128,
    psum_bf16_output=True, scalar_tensor_copy=True, scalar_tensor_scalar=True, sbuf_partition_bytes=256 * KiB,
    # [INFERRED] the trn3 guide does not mention DMA transpose; NC-v3's support and fractions are carried over.
    dma_transpose=True, dma_transpose_hbm_fraction=0.9, dma_transpose_sbuf_fraction=0.5,
    vector_perf_copy_factor=4, vector_perf_copy_partial_factor=2, scalar_perf_factor=2,
    dma_engine_bytes_per_ns=33.0, dma_engine_peak_bytes_per_ns=38.4,
    matmul_fp32_factor=4.0,
    dma_fixed_ns=740.0, dma_issue_ns=845.0, dma_issue_desc_ns=1.8, dma_dge_units=2, dma_read_window_bytes=65536,
    dma_run_min_ns=18.0, dma_partition_affinity=True,
    act_table_load_ns=429.0, launch_pre_ns=9100.0, launch_post_ns=3500.0,
    # [CONFLICT] 4.9 TB/s [ARCH-TRN3] vs 4.7 TB/s [NKI-ARCH-V4]; the architecture page is used.
    hbm_bytes=144 * GiB, hbm_gbps=4900.0, tensor_bf16_tflops=79.0,
    neuronlink_gbps=2560.0, cc_cores=16, **_COMMON,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (TRN1, TRN2, TRN3)}
DEFAULT_PROFILE = "trn2"


def get_profile(name: str | None = None) -> Profile:
    """The profile named, else ``$NEURON_DEVICE_PROFILE``, else trn2."""
    name = name or os.environ.get("NEURON_DEVICE_PROFILE") or DEFAULT_PROFILE
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown device profile {name!r}; known profiles: {', '.join(sorted(PROFILES))} "
            "(set NEURON_DEVICE_PROFILE to one of them)"
        ) from None
