"""Device memory: the profile's HBM through a caching allocator with exact statistics."""

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_hal import TRN2
from neuron_hal.drivers.null import NullDriver
from torch_neuron.allocator import CachingAllocator, round_size


def test_allocation_statistics_are_exact():
    torch.neuron.empty_cache()
    base = torch.neuron.memory_allocated()
    x = torch.empty(1000, device="neuron")  # 4000 B -> one 4096 B block (512 B rounding)
    assert torch.neuron.memory_allocated() - base == 4096
    assert torch.neuron.memory_stats()["requested_bytes.all.current"] >= 4000
    torch.neuron.reset_peak_memory_stats()
    y = torch.empty(2**20, device="neuron")  # 4 MiB: 2 MiB rounding keeps it 4 MiB
    assert torch.neuron.max_memory_allocated() - base == 4096 + 4 * 2**20
    del y
    assert torch.neuron.memory_allocated() - base == 4096
    assert torch.neuron.max_memory_allocated() - base == 4096 + 4 * 2**20
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated() + 4 * 2**20  # cached
    del x


def test_memory_stats_have_cudas_keys_and_empty_cache_leaves_what_tensors_use():
    keep = torch.empty(3 * 2**20, dtype=torch.uint8, device="neuron")  # carved from a 20 MiB segment
    tmp = [torch.empty(n * 2**20 + 512 * n, dtype=torch.uint8, device="neuron") for n in (2, 5, 11, 1)]
    del tmp  # cached: whole free segments, and free pieces beside live tensors
    stats = torch.neuron.memory_stats()
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
                 "allocation", "segment", "active", "inactive_split"):
        for kind in ("current", "peak", "allocated", "freed"):
            assert f"{name}.all.{kind}" in stats
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    torch.neuron.empty_cache()
    stats = torch.neuron.memory_stats()
    # every segment left holds a tensor: what is cached is the free rest of those segments
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"] + \
        stats["inactive_split_bytes.all.current"]
    del keep


def test_freed_blocks_are_reused():
    a = torch.empty(5000, device="neuron")
    address = a.data_ptr()
    del a
    b = torch.empty(5000, device="neuron")
    assert b.data_ptr() == address


def test_empty_cache_returns_memory_to_the_device():
    x = torch.empty(2**22, device="neuron")
    del x
    reserved = torch.neuron.memory_reserved()
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() < reserved
    free, total = torch.neuron.mem_get_info()
    assert 0 < free <= total


def test_exhausting_hbm_raises_out_of_memory_with_the_figures():
    code = (
        "import torch\n"
        "keep = [torch.empty(2**28, dtype=torch.uint8, device='neuron') for _ in range(3)]\n"
        "try:\n"
        "    torch.empty(2**29, dtype=torch.uint8, device='neuron')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', e)\n"
    )
    env = {"NEURON_SIM_HBM_BYTES": str(2**30), "PATH": "/usr/bin:/bin"}
    import os
    env = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "OOM" in out.stdout, out.stderr
    assert "tried to allocate 512.00 MiB" in out.stdout
    assert "256.00 MiB free of 1.00 GiB" in out.stdout


def test_out_of_memory_is_torch_out_of_memory_error():
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate"):
        torch.empty(2**50, dtype=torch.uint8, device="neuron")


# -- the caching allocator: segments, best fit, splits and merges (as torch.cuda's) ---------------------------
MiB = 2**20


@pytest.fixture
def allocator(monkeypatch):
    """A CachingAllocator over its own 256 MiB null driver: exact figures, whatever the process did before."""
    monkeypatch.setenv("NEURON_SIM_HBM_BYTES", str(256 * MiB))
    return CachingAllocator(NullDriver(TRN2))


def _current(a, key):
    return a.stats[0].as_dict()[f"{key}.all.current"]


def test_large_request_splits_the_best_fitting_cached_block(allocator):
    a = allocator
    big, mid = a.alloc(0, 30 * MiB), a.alloc(0, 24 * MiB)
    a.free(0, big)
    a.free(0, mid)
    assert _current(a, "reserved_bytes") == 54 * MiB and _current(a, "segment") == 2
    x = a.alloc(0, 12 * MiB)  # best fit: the 24 MiB block, split; the 30 MiB one stays whole
    assert x == mid
    assert _current(a, "reserved_bytes") == 54 * MiB and a.stats[0].device_allocs == 2
    assert _current(a, "allocated_bytes") == 12 * MiB and _current(a, "inactive_split_bytes") == 12 * MiB
    y = a.alloc(0, 5 * MiB)  # the 12 MiB remainder is the best fit now
    assert y == mid + 12 * MiB and _current(a, "inactive_split_bytes") == 7 * MiB
    a.free(0, x)
    a.free(0, y)  # merges with both free neighbours: one free 24 MiB block again
    assert _current(a, "inactive_split_bytes") == 0 and _current(a, "inactive_split") == 0
    assert a.alloc(0, 24 * MiB) == mid


def test_large_request_does_not_split_off_a_remainder_of_1_mib_or_less(allocator):
    a = allocator
    a.free(0, a.alloc(0, 12 * MiB))
    x = a.alloc(0, 11 * MiB + 512)  # 1 MiB - 512 B left over: the whole block is handed out, as CUDA does
    assert _current(a, "allocated_bytes") == 12 * MiB and _current(a, "requested_bytes") == 11 * MiB + 512
    a.free(0, x)
    y = a.alloc(0, 4 * MiB)  # 8 MiB left over: split
    assert y == x and _current(a, "allocated_bytes") == 4 * MiB and _current(a, "inactive_split_bytes") == 8 * MiB


def test_small_requests_share_2_mib_segments_in_512_byte_blocks(allocator):
    a = allocator
    x, y, z = a.alloc(0, 4000), a.alloc(0, 1), a.alloc(0, 1 << 20)
    assert y == x + 4096 and z == y + 512  # carved one after the other from one segment
    assert _current(a, "segment") == 1 and _current(a, "reserved_bytes") == 2 * MiB
    assert _current(a, "allocated_bytes") == 4096 + 512 + MiB
    w = a.alloc(0, 1 << 20)  # no room left in the first segment: a second one
    assert _current(a, "segment") == 2 and _current(a, "reserved_bytes") == 4 * MiB
    for p in (x, y, z, w):
        a.free(0, p)
    assert _current(a, "allocated_bytes") == 0 and _current(a, "inactive_split_bytes") == 0
    a.empty_cache()
    assert _current(a, "reserved_bytes") == 0 and a.driver.memory_stats(0).allocated == 0


def test_small_requests_never_take_large_pool_blocks(allocator):
    a = allocator
    a.free(0, a.alloc(0, 30 * MiB))
    a.alloc(0, 4096)
    assert _current(a, "segment") == 2 and _current(a, "reserved_bytes") == 32 * MiB


def test_empty_cache_returns_every_unused_segment_and_keeps_the_used_ones(allocator):
    a = allocator
    keep = a.alloc(0, 3 * MiB)  # in a 20 MiB segment, with a free 17 MiB remainder
    for p in [a.alloc(0, n * MiB) for n in (11, 40, 2)] + [a.alloc(0, 700)]:
        a.free(0, p)
    a.empty_cache()
    assert _current(a, "segment") == 1 and _current(a, "reserved_bytes") == 20 * MiB
    assert _current(a, "inactive_split_bytes") == 17 * MiB and a.driver.memory_stats(0).allocated == 20 * MiB
    a.free(0, keep)
    a.empty_cache()
    assert _current(a, "reserved_bytes") == 0 and a.driver.memory_stats(0).allocations == 0


def test_out_of_memory_returns_cached_segments_and_retries(allocator):
    a = allocator
    a.free(0, a.alloc(0, 150 * MiB))
    x = a.alloc(0, 200 * MiB)  # does not fit beside the cached 150 MiB: that goes back to the driver first
    assert a.stats[0].retries == 1 and _current(a, "reserved_bytes") == 200 * MiB
    a.free(0, x)
    y = a.alloc(0, 3 * MiB)  # reuses the cached 200 MiB (split), no new segment
    assert y == x and a.stats[0].device_allocs == 2
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate 300.00 MiB"):
        a.alloc(0, 300 * MiB)
    assert a.stats[0].ooms == 1


def test_a_rounded_up_segment_that_does_not_fit_falls_back_to_the_block_size(allocator):
    a = allocator
    hold = a.alloc(0, 246 * MiB)  # 10 MiB left: a 2 MiB request's 20 MiB segment cannot be had
    x = a.alloc(0, 2 * MiB)
    assert _current(a, "reserved_bytes") == 248 * MiB
    a.free(0, x)
    a.free(0, hold)


def test_a_free_arriving_inside_an_allocation_runs_after_it(allocator, monkeypatch):
    """A garbage collection inside the allocator (at any object it creates) can finalize tensors, whose frees then
    arrive mid-operation: they wait for it, so a block being split is never merged with a freed neighbour."""
    from torch_neuron import allocator as module

    a = allocator
    first, victim, last = a.alloc(0, 4096), a.alloc(0, 4096), a.alloc(0, 4096)
    a.free(0, last)  # one free block after the victim: the next small request splits it
    pending, make = [victim], module.Block

    def block_collecting_garbage(*args):  # the split's new block: a collection frees the victim right then
        while pending:
            a.free(0, pending.pop())
        return make(*args)

    monkeypatch.setattr(module, "Block", block_collecting_garbage)
    x = a.alloc(0, 512)
    monkeypatch.undo()
    assert x == last
    _check_allocator(a, {first: 4096, x: 512})
    assert a.alloc(0, 4096) == victim  # the victim's block is free, and the rest of the segment after x


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 24 * MiB), st.integers(0, 2**16)), min_size=1, max_size=60))
def test_random_alloc_free_sequences_keep_segments_tiled_and_statistics_exact(ops):
    a, live = CachingAllocator(NullDriver(TRN2)), {}
    for is_alloc, nbytes, pick in ops:
        if is_alloc or not live:
            address = a.alloc(0, nbytes)
            assert address not in live
            live[address] = nbytes
        else:
            a.free(0, address := sorted(live)[pick % len(live)])
            del live[address]
        _check_allocator(a, live)
    for address in list(live):
        a.free(0, address)
    a.empty_cache()
    assert _current(a, "reserved_bytes") == 0 and a.driver.memory_stats(0).allocated == 0


def _check_allocator(a, live: dict) -> None:
    """Every segment is tiled by its blocks, live blocks hold their request, and the statistics are the sums."""
    allocated = inactive = 0
    for start, size, _ in a.segments:
        block, end = a.blocks[start], start
        assert block.prev is None
        while block is not None:
            assert block.address == end
            end += block.size
            if block.allocated:
                assert round_size(live[block.address]) <= block.size
                allocated += block.size
            elif block.is_split:
                inactive += block.size
            assert block.next is None or not (not block.allocated and not block.next.allocated)  # merged
            block = block.next
        assert end == start + size
    assert {b.address for b in a.blocks.values() if b.allocated} == set(live)
    assert _current(a, "allocated_bytes") == allocated and _current(a, "inactive_split_bytes") == inactive
    assert _current(a, "reserved_bytes") == sum(s for _, s, _ in a.segments) == a.driver.memory_stats(0).allocated
    assert _current(a, "requested_bytes") == sum(live.values())


def test_accelerator_memory_apis_reach_the_caching_allocator():
    """torch.accelerator's device-generic memory functions (Accelerate, Transformers and TorchTitan call them)
    answer from the caching allocator, as torch.neuron's do."""
    dev = torch.device("neuron", 0)
    torch.neuron.synchronize()
    torch.accelerator.reset_peak_memory_stats(dev)
    base = torch.accelerator.memory_allocated(dev)
    x = torch.empty(1 << 20, device=dev)
    assert torch.accelerator.memory_allocated(dev) == torch.neuron.memory_allocated() == base + x.nbytes
    assert torch.accelerator.max_memory_allocated(dev) >= base + x.nbytes
    assert torch.accelerator.memory_reserved(dev) == torch.neuron.memory_reserved() >= base + x.nbytes
    stats = torch.accelerator.memory_stats(dev)
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_stats()["allocated_bytes.all.current"]
    torch.accelerator.reset_accumulated_memory_stats(dev)
    assert torch.accelerator.memory_stats(dev)["allocated_bytes.all.allocated"] == 0
    del x
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved(dev) == torch.neuron.memory_reserved()
    free, total = torch.accelerator.get_memory_info(dev)
    assert (free, total) == torch.neuron.mem_get_info() and 0 < free <= total
    dtypes = torch.accelerator.get_device_capability(dev)["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.bool} <= dtypes
    assert torch.qint8 not in dtypes


def _summary_values(summary: str) -> list[list[str]]:
    """The four value columns of each statistic row of a memory_summary table."""
    rows = [line.split("|")[2:6] for line in summary.splitlines() if line.count("|") == 6]
    return [[v.strip() for v in row] for row in rows if "Cur Usage" not in row[0]]


def test_memory_summary(monkeypatch):
    """Every row holds memory_stats' figures, formatted as torch.cuda.memory_summary formats the same stats
    (torch's own function as the reference, fed this allocator's statistics)."""
    keep = [torch.empty(n, dtype=torch.uint8, device="neuron") for n in (100, 3 * 2**20, 700 * 2**10)]
    stats = torch.neuron.memory_stats()
    oversize = {f"oversize_{k}.{c}": 0 for k in ("allocations", "segments")
                for c in ("current", "peak", "allocated", "freed")}
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats | oversize)
    reference = _summary_values(torch.cuda.memory_summary(0, abbreviated=True))[:-2]  # less the oversize rows
    summary = torch.neuron.memory_summary()
    assert _summary_values(summary) == reference and len(reference) == 9
    assert "device ID 0" in summary and f"{stats['num_ooms']}" in summary
    del keep


def test_memory_snapshot():
    torch.neuron.empty_cache()
    x = torch.empty(3 * 2**20, dtype=torch.uint8, device="neuron")
    y = torch.empty(1000, dtype=torch.uint8, device="neuron")
    segments = [s for s in torch.neuron.memory_snapshot() if s["device"] == 0]
    assert sum(s["total_size"] for s in segments) == torch.neuron.memory_reserved()
    assert sum(s["allocated_size"] for s in segments) == torch.neuron.memory_allocated()
    assert sum(s["requested_size"] for s in segments) == torch.neuron.memory_stats()["requested_bytes.all.current"]
    for s in segments:  # the blocks tile their segment, in address order
        blocks = s["blocks"]
        assert blocks[0]["address"] == s["address"] and sum(b["size"] for b in blocks) == s["total_size"]
        assert all(a["address"] + a["size"] == b["address"] for a, b in zip(blocks, blocks[1:]))
    active = {b["address"]: (b, s) for s in segments for b in s["blocks"] if b["state"] == "active_allocated"}
    (bx, sx), (by, sy) = active[x.data_ptr()], active[y.data_ptr()]
    assert (bx["requested_size"], bx["size"], sx["segment_type"]) == (x.nbytes, 3 * 2**20, "large")
    assert (by["requested_size"], by["size"], sy["segment_type"]) == (1000, 1024, "small")
    del x, y
