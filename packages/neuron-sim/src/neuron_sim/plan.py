"""What the timing model knows about a program, as data: the plan encoded once per program and the result
of one timed execution. Streams number the engines and DMA queues the way every timing module does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuron_hal import isa
from neuron_hal.isa import Engine
from neuron_hal.profiles import Profile

ENGINE_NAMES = ("tensor", "vector", "scalar", "gpsimd")
ENGINE_CODES = {Engine.TENSOR: 0, Engine.VECTOR: 1, Engine.SCALAR: 2, Engine.GPSIMD: 3, Engine.SYNC: 4}
N_COMPUTE = 4  # streams 0..3 are the compute engines; DMA queue q is stream N_COMPUTE + q
OPCODE_NAMES = tuple(isa.OPCODES)


def stream_name(stream: int) -> str:
    return ENGINE_NAMES[stream] if stream < N_COMPUTE else f"dma q{stream - N_COMPUTE}"


@dataclass
class TimingPlan:
    """A program encoded for timing (all arrays have one entry per instruction unless noted)."""

    profile: Profile
    n: int
    opcode: np.ndarray  # int16 index into OPCODE_NAMES
    engine: np.ndarray  # int8: 0..3 compute engines, 4 DMA
    stream: np.ndarray  # int16: engine for compute, N_COMPUTE + queue for DMA (the trace track)
    cycles: np.ndarray  # float64 engine cycles of compute instructions (0 for DMA)
    dur_ns: np.ndarray  # float64 duration of compute instructions (0 for DMA)
    producer: np.ndarray  # int32 latest instruction of the same compute engine whose output it reads (-1)
    drain_ns: np.ndarray  # float64 how long after that producer's end it may issue (its pipeline drains)
    dma_bytes: np.ndarray  # int64 bytes moved (0 for compute)
    dma_p0: np.ndarray  # int64 first partition of the on-chip side (which engines serve it); -1: every engine
    dma_parts: np.ndarray  # int64 partitions of the on-chip side (rows, with no on-chip side)
    dma_runs: np.ndarray  # int64 contiguous runs (descriptors) per partition
    dma_bw: np.ndarray  # float64 bytes/ns per DMA engine
    dma_read: np.ndarray  # bool: reads HBM (through the queue's read window)
    pred_count: np.ndarray  # int32 dependencies (other streams; same DMA queue included)
    succ_ptr: np.ndarray  # int64 [n + 1] CSR of dependents
    succ_idx: np.ndarray  # int32
    n_streams: int
    stream_ptr: np.ndarray  # int64 [n_streams + 1] CSR of each stream's instructions in program order
    stream_instr: np.ndarray  # int32
    busy_ns: np.ndarray  # float64 [4] compute busy time per engine
    counts: np.ndarray  # int64 [5] instructions per engine (tensor, vector, scalar, gpsimd, dma)
    total_dma_bytes: int
    hbm_block_bytes: int  # HBM dependency granularity used for this program
    # (duration, busy, counts) of an untraced execution: a program's schedule does not depend on when it
    # starts, so it is computed once (a program runs many times: every call of an eager op)
    untraced: tuple | None = None
    # with prepare_timing(..., exact=True): the full dependency graph as a predecessor CSR (pred_ptr [n + 1],
    # preds), every conflicting pair of accesses in program order with no in-order assumption (an engine's own
    # instructions included): what any reordering of the program must keep (see schedule.py)
    exact: tuple | None = None

    @property
    def edges(self) -> int:
        return int(self.succ_idx.size)


@dataclass
class TimingResult:
    start_ns: float
    end_ns: float
    engine_busy_ns: dict[str, float]
    engine_instructions: dict[str, int]
    dma_bytes: int
    start: np.ndarray | None = None  # per instruction (DMA: issue start), when want_events
    end: np.ndarray | None = None  # per instruction (DMA: completion)
    track: np.ndarray | None = None  # per instruction stream id (see stream_name)

    @property
    def device_ns(self) -> float:
        return self.end_ns - self.start_ns

