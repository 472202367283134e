"""The emulated-memory contract (shared by null and sim): memory, copies, stats, errors, queues."""

import numpy as np
import pytest

from neuron_hal import (
    AP,
    TRN1,
    DeviceOutOfMemoryError,
    InvalidAddressError,
    InvalidDeviceError,
    Program,
    ProgramError,
    TensorArg,
    isa,
)
from neuron_hal.drivers.null import NullDriver

MiB = 2**20


@pytest.fixture
def driver(monkeypatch):
    monkeypatch.setenv("NEURON_SIM_HBM_BYTES", str(64 * MiB))
    return NullDriver(TRN1)


def test_devices_are_the_chip_cores(driver):
    devs = driver.devices()
    assert [d.index for d in devs] == [0, 1]
    assert devs[1].name == "trn1 NeuronCore-v2 #1 (null)" and devs[0].hbm_bytes == 64 * MiB


def test_unknown_device_index(driver):
    with pytest.raises(InvalidDeviceError, match="neuron device 2 does not exist.*2 cores.*0..1"):
        driver.open(2)
    with pytest.raises(InvalidDeviceError):
        driver.alloc(-1, 16)


def test_write_read_copy_round_trip(driver):
    data = np.random.default_rng(0).integers(0, 255, 10_000, dtype=np.uint8)
    a, b = driver.alloc(0, data.nbytes), driver.alloc(1, data.nbytes)
    assert a != 0 and b != 0 and a != b
    driver.write(0, a, data)
    driver.copy(0, b, a, data.nbytes)
    out = np.empty_like(data)
    driver.read(1, b, out)
    np.testing.assert_array_equal(out, data)
    view = np.frombuffer(driver.map(0, a, 16), np.uint8)
    np.testing.assert_array_equal(view, data[:16])


def test_out_of_bounds_access_is_an_error(driver):
    a = driver.alloc(0, 1000)
    with pytest.raises(InvalidAddressError, match="not inside a live allocation"):
        driver.write(0, a + 600, np.zeros(1000, np.uint8))
    driver.free(0, a)
    with pytest.raises(InvalidAddressError):
        driver.read(0, a, bytearray(8))
    with pytest.raises(InvalidAddressError, match="not the start of a live device allocation"):
        driver.free(0, a)


def test_memory_stats_are_exact(driver):
    a = driver.alloc(0, 1000)  # rounded up to the 512-byte allocation unit
    b = driver.alloc(1, 4096)
    s0, s1 = driver.memory_stats(0), driver.memory_stats(1)
    assert (s0.allocated, s0.allocations, s1.allocated) == (1024, 1, 4096)
    assert s0.chip_allocated == 5120 and s0.free == 64 * MiB - 5120
    driver.free(0, a)
    s0 = driver.memory_stats(0)
    assert (s0.allocated, s0.peak_allocated, s0.allocations) == (0, 1024, 0)
    driver.free(1, b)
    assert driver.memory_stats(1).largest_free == 64 * MiB


def test_freeing_beside_free_memory_subtracts_the_allocation_not_the_coalesced_range(driver):
    a, b = driver.alloc(0, MiB), driver.alloc(1, 2 * MiB)
    driver.free(1, b)  # coalesces with the free rest of HBM
    driver.free(0, a)  # coalesces with b's range and the rest
    for device in (0, 1):
        s = driver.memory_stats(device)
        assert (s.allocated, s.allocations, s.chip_allocated) == (0, 0, 0)
    assert driver.memory_stats(1).peak_allocated == 2 * MiB


def test_out_of_memory_names_requested_free_and_capacity(driver):
    keep = driver.alloc(0, 48 * MiB)
    with pytest.raises(DeviceOutOfMemoryError) as info:
        driver.alloc(0, 32 * MiB)
    err = info.value
    assert (err.requested, err.free, err.capacity) == (32 * MiB, 16 * MiB, 64 * MiB)
    assert "tried to allocate 32.00 MiB" in str(err) and "64.00 MiB" in str(err)
    assert isinstance(err, MemoryError)
    driver.free(0, keep)
    driver.free(0, driver.alloc(0, 60 * MiB))  # coalesced back into one block


def test_freed_blocks_coalesce(driver):
    blocks = [driver.alloc(0, MiB) for _ in range(8)]
    for b in blocks[::2] + blocks[1::2]:
        driver.free(0, b)
    assert driver.memory_stats(0).largest_free == 64 * MiB


def test_full_capacity_is_reserved_lazily():
    d = NullDriver(TRN1)  # 32 GiB of simulated HBM on any host: pages are touched only when used
    a = d.alloc(0, 20 * 2**30)
    d.write(0, a + 19 * 2**30, b"hello")
    out = bytearray(5)
    d.read(0, a + 19 * 2**30, out)
    assert bytes(out) == b"hello"


def program():
    sb = AP.sbuf("float32", 128, (64,))
    return Program("copy", [TensorArg("x", (128, 64), "float32"), TensorArg("y", (128, 64), "float32", "out"),
                            TensorArg("tmp", (128, 64), "float32", "scratch")],
                   [isa.DmaCopy(sb, AP.hbm(0, "float32", (128, 64))),
                    isa.DmaCopy(AP.hbm(2, "float32", (128, 64)), sb),
                    isa.DmaCopy(AP.hbm(1, "float32", (128, 64)), sb)])


def test_unload_drops_a_program_after_its_last_load(driver):
    first = driver.load(0, program())
    assert driver.load(0, program()) is first  # two loads of one digest
    driver.unload(0, first)
    assert driver.load(0, program()) is first  # one load left (and one more now)
    driver.unload(0, first)
    driver.unload(0, first)
    fresh = driver.load(0, program())  # every load unloaded: prepared again
    assert fresh is not first and fresh.program.digest == first.program.digest


def test_load_validates_and_execute_binds(driver):
    x, y = driver.alloc(0, 128 * 64 * 4), driver.alloc(0, 128 * 64 * 4)
    loaded = driver.load(0, program())
    assert driver.load(0, program()) is loaded  # cached by digest
    report = driver.execute(0, loaded, [x, y], queue=2)
    assert report.instructions == 3 and report.queue == 2 and report.device_ns == 0
    assert driver.memory_stats(0).allocations == 2  # the scratch tensor was freed
    with pytest.raises(ValueError, match="takes 2 tensors \\(x, y\\), got 1"):
        driver.execute(0, loaded, [x])
    small = driver.alloc(0, 100)
    with pytest.raises(InvalidAddressError, match="tensor 'y'"):
        driver.execute(0, loaded, [x, small])
    bad = Program("bad", [], [isa.Memset(AP.sbuf("float32", 200, (4,)), 0.0)])
    with pytest.raises(ProgramError, match="partition limit"):
        driver.load(0, bad)


def test_an_empty_tensor_binds_at_any_address(driver):
    """A 0-byte tensor (a batch of N = 0, an expert with no tokens) touches no memory: torch hands it a null
    data pointer, which binds like any address instead of failing the range check."""
    sb = AP.sbuf("float32", 128, (64,))
    prog = Program("with_empty", [TensorArg("x", (128, 64), "float32"), TensorArg("e", (0, 64), "float32"),
                                  TensorArg("y", (128, 64), "float32", "out")],
                   [isa.DmaCopy(sb, AP.hbm(0, "float32", (128, 64))), isa.DmaCopy(AP.hbm(2, "float32", (128, 64)), sb)])
    x, y = driver.alloc(0, 128 * 64 * 4), driver.alloc(0, 128 * 64 * 4)
    assert driver.execute(0, driver.load(0, prog), [x, 0, y]).instructions == 2
    with pytest.raises(InvalidAddressError, match="tensor 'x'"):  # a tensor with bytes is still checked
        driver.execute(0, driver.load(0, prog), [0, 0, y])
