"""The sim driver end to end through the HAL: registry, values, timing, traces, memory."""

import json

import ml_dtypes
import numpy as np
import pytest

from neuron_hal import (
    AP,
    TRN1,
    TRN2,
    TRN3,
    Act,
    DeviceOutOfMemoryError,
    Program,
    ProgramError,
    TensorArg,
    get_driver,
    isa,
)
from neuron_hal.registry import select_driver_class
from neuron_sim.driver import SimDriver
from neuron_sim.programs import ideal_gemm_tensor_cycles, tiled_gemm


def test_sim_is_the_default_driver(monkeypatch):
    monkeypatch.delenv("NEURON_HAL_DRIVER", raising=False)
    assert select_driver_class() is SimDriver
    assert isinstance(get_driver(), SimDriver)


def run_gemm(profile, m, n, k, trace=False):
    drv = SimDriver(profile)
    rng = np.random.default_rng(m + n + k)
    lhsT = rng.standard_normal((k, m), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((k, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    prog = tiled_gemm(profile, m, n, k)
    addrs = [drv.alloc(0, a.nbytes) for a in prog.args]
    drv.write(0, addrs[0], lhsT)
    drv.write(0, addrs[1], rhs)
    report = drv.execute(0, drv.load(0, prog), addrs, trace=trace)
    out = np.empty((m, n), np.float32)
    drv.read(0, addrs[2], out)
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    return out, ref, report


@pytest.mark.parametrize("profile", [TRN1, TRN2, TRN3], ids=lambda p: p.name)
def test_gemm_values_and_timing(profile):
    out, ref, report = run_gemm(profile, 256, 1024, 384)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    ideal = ideal_gemm_tensor_cycles(profile, 256, 1024, 384)
    busy_cycles = report.engine_busy_ns["tensor"] * profile.tensor_ghz
    assert busy_cycles == pytest.approx(ideal, rel=0.02)
    # Small GEMM: DMA latency dominates, but the device time stays within a few times the ideal.
    assert ideal <= report.cycles("tensor") < 20 * ideal
    assert 0 < report.utilization()["tensor"] <= 1


def test_larger_gemm_approaches_tensor_peak():
    # Launch-free: the check is how well the program's instructions overlap DMA with TensorE; the runtime's
    # start-up and tear-down (launch_pre_ns + launch_post_ns) are outside the program.
    profile = TRN2.replace(launch_pre_ns=0.0, launch_post_ns=0.0)
    out, ref, report = run_gemm(profile, 1024, 1024, 1024)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-3)
    ideal = ideal_gemm_tensor_cycles(profile, 1024, 1024, 1024)
    assert ideal / report.cycles("tensor") > 0.5  # the program overlaps DMA with TensorE


def test_trace_is_chrome_json(tmp_path):
    _, _, report = run_gemm(TRN2, 128, 512, 256, trace=True)
    path = report.save_trace(tmp_path / "t.json")
    trace = json.loads(open(path).read())
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert len(slices) == report.instructions
    assert {e["name"] for e in slices} >= {"dma_copy", "nc_matmul"}


def test_queue_timelines_advance():
    drv = SimDriver(TRN2)
    sb = AP.sbuf("float32", 128, (512,))
    prog = Program("ex", [TensorArg("a", (128, 512), "float32"), TensorArg("b", (128, 512), "float32", "out")], [
        isa.DmaCopy(sb, AP.hbm(0, "float32", (128, 512))), isa.Activation(sb, sb, Act.exp),
        isa.DmaCopy(AP.hbm(1, "float32", (128, 512)), sb)])
    a, b = drv.alloc(1, 2**18), drv.alloc(1, 2**18)
    drv.write(1, a, np.zeros((128, 512), np.float32))
    r1 = drv.execute(1, drv.load(1, prog), [a, b], queue=0)
    r2 = drv.execute(1, drv.load(1, prog), [a, b], queue=3)
    assert r1.device_ns > 0 and r2.start_ns == pytest.approx(r1.end_ns)
    assert drv.timeline(1, 3) == pytest.approx(r2.end_ns) and drv.timeline(0, 0) == 0
    out = np.empty((128, 512), np.float32)
    drv.read(1, b, out)
    np.testing.assert_array_equal(out, 1.0)


def test_uninitialized_sbuf_reads_are_nan():
    drv = SimDriver(TRN2)
    sb = AP.sbuf("float32", 128, (64,), offset=4096)
    prog = Program("uninit", [TensorArg("y", (128, 64), "float32", "out")],
                   [isa.DmaCopy(AP.hbm(0, "float32", (128, 64)), sb)])
    y = drv.alloc(0, 128 * 64 * 4)
    drv.execute(0, drv.load(0, prog), [y])
    out = np.empty((128, 64), np.float32)
    drv.read(0, y, out)
    assert np.isnan(out).all()


def test_hbm_capacity_env_and_oom(monkeypatch):
    monkeypatch.setenv("NEURON_SIM_HBM_BYTES", str(2**20))
    drv = SimDriver(TRN2)
    assert drv.memory_stats(0).capacity == 2**20
    with pytest.raises(DeviceOutOfMemoryError, match="tried to allocate 2.00 MiB"):
        drv.alloc(0, 2**21)


def test_rule_violations_surface_at_load():
    drv = SimDriver(TRN2)
    prog = Program("bad", [], [isa.Matmul(AP.psum("float32", 128, (600,)), AP.sbuf("bfloat16", 128, (128,)),
                                          AP.sbuf("bfloat16", 128, (600,)))])
    with pytest.raises(ProgramError, match="moving free size"):
        drv.load(0, prog)


def test_estimate_gives_timing_without_running():
    drv = SimDriver(TRN2)
    prog = tiled_gemm(TRN2, 256, 512, 256)
    loaded = drv.load(0, prog)
    est = drv.estimate(0, loaded)
    addrs = [drv.alloc(0, a.nbytes) for a in prog.args]
    ran = drv.execute(0, loaded, addrs)
    assert est.device_ns == pytest.approx(ran.device_ns) and est.start_ns == 0
    assert drv.timeline(0, 0) == pytest.approx(ran.end_ns)  # estimate did not advance the queue
