"""Memory under changing shapes: a job whose shapes change every step holds bounded device memory (the caching
allocator reuses and splits its cached blocks), a bounded number of prepared launches (the launch cache is an
LRU) and bounded host memory; with fixed shapes, nothing is prepared or reserved after the first step."""

import gc
import os

import pytest
import torch
import torch.nn.functional as F

from torch_neuron.ops.core import launch

MiB = 2**20
# Host memory a soak may gain after its warm-up: the kernels' own program caches (16 signatures each), the
# pointwise plans and the simulator's work buffers reaching their bounds, and allocator noise. Unbounded caches
# grow by ~2.5 MiB per new shape here (a launch per op and shape: its program and the simulator's plans).
RSS_SLACK = 24 * MiB
# Device memory a soak may reserve after its warm-up (whose first step is its largest): small-pool segments that
# device constants cached by shape (ops/checks.py) keep in use. Without reuse across sizes, ~2 MiB per new shape.
RESERVED_SLACK = 6 * MiB


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def launch_stats() -> dict:
    return torch.neuron.metrics()["caches"]["launch"]


@pytest.fixture
def small_launch_cache():
    """A launch cache a few steps fill (the default holds ~1000 launches: too many for a quick soak)."""
    before = launch._cache.capacity
    launch._cache.capacity = 64
    yield 64
    launch._cache.capacity = before


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 16)).to("neuron")
    return model, torch.optim.SGD(model.parameters(), lr=1e-2)


def _step(model, opt, rows: int) -> None:
    x = torch.randn(rows, 16, device="neuron")
    loss = F.mse_loss(model(x), x)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _sample() -> tuple[int, int, dict]:
    gc.collect()
    return torch.neuron.memory_reserved(), rss(), launch_stats()


def test_training_with_a_new_shape_every_step_keeps_memory_and_launches_bounded(small_launch_cache):
    # other tests of this process keep tensors and cached segments: measure from an emptied cache
    gc.collect()
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    base_reserved, base_allocated = torch.neuron.memory_reserved(), torch.neuron.memory_allocated()
    model, opt = _mlp()
    # 20 sequence lengths, then again: hidden activations of 0.84-0.98 MiB (the small pool, a block size each) and
    # of 1.03-1.17 MiB (the large pool), alternating, the longest of each first
    lengths = [n for pair in zip(range(300, 260, -4), range(252, 212, -4)) for n in pair]
    for rows in lengths[:6]:  # warm-up: the launch cache fills
        _step(model, opt, rows)
    reserved0, rss0, stats0 = _sample()
    samples = []
    for i in range(6, 30):
        _step(model, opt, lengths[i % len(lengths)])
        samples.append(launch_stats()["entries"])
    reserved, grown, stats = _sample()
    peak = torch.neuron.max_memory_allocated()
    assert reserved - reserved0 <= RESERVED_SLACK, (reserved0 / MiB, reserved / MiB)
    # what one step needs, not one block per size seen
    assert reserved - base_reserved <= 2 * (peak - base_allocated) + 20 * MiB
    assert stats0["entries"] == small_launch_cache and set(samples) == {small_launch_cache}  # flat once full
    assert stats["evictions"] > stats0["evictions"]
    assert grown - rss0 <= RSS_SLACK, (rss0 / MiB, grown / MiB)


def test_training_with_fixed_shapes_prepares_and_reserves_nothing_after_the_first_step():
    model, opt = _mlp()
    for _ in range(2):
        _step(model, opt, 300)
    reserved0, rss0, stats0 = _sample()
    for _ in range(6):
        _step(model, opt, 300)
    reserved, grown, stats = _sample()
    assert reserved == reserved0 and stats["misses"] == stats0["misses"] and stats["hits"] > stats0["hits"]
    assert grown - rss0 <= 4 * MiB


def test_evicted_launches_unload_their_programs_from_the_driver(small_launch_cache):
    driver = torch.neuron.runtime().driver
    x = torch.randn(7, 77, device="neuron")
    torch.neg(x)
    key = next(k for k in reversed(launch._cache._entries) if k[0].name == "neg")
    digest = launch._cache.get(key).loaded.program.digest
    assert digest in driver._loaded
    for n in range(small_launch_cache + 1):  # other launches push it out
        torch.neg(torch.empty(n + 1, 3, device="neuron"))
    gc.collect()
    assert key not in launch._cache and digest not in driver._loaded


def test_a_launch_used_through_an_ops_own_cache_is_not_the_one_evicted(small_launch_cache):
    a, b = torch.randn(5, 6, device="neuron"), torch.randn(5, 6, device="neuron")
    others = [torch.empty(n + 1, 9, device="neuron") for n in range(2 * small_launch_cache)]
    torch.add(a, b)
    misses = launch_stats()["misses"]
    for t in others:  # a new launch each, and the hot add (found in the pointwise plan's own cache) each time
        torch.neg(t)
        torch.add(a, b)
    assert launch_stats()["misses"] - misses == len(others)  # the add was never prepared again


def test_launch_cache_size_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("TORCH_NEURON_LAUNCH_CACHE_ENTRIES", raising=False)
    assert launch.cache_entries() == launch.CACHE_ENTRIES
    monkeypatch.setenv("TORCH_NEURON_LAUNCH_CACHE_ENTRIES", "300")
    assert launch.cache_entries() == 300
    for bad in ("0", "-5", "lots", "1e3"):
        monkeypatch.setenv("TORCH_NEURON_LAUNCH_CACHE_ENTRIES", bad)
        with pytest.raises(ValueError, match=f"TORCH_NEURON_LAUNCH_CACHE_ENTRIES={bad!r} must be a positive"):
            launch.cache_entries()


def test_metrics_report_the_launch_cache():
    torch.neg(torch.ones(3, device="neuron"))
    stats = launch_stats()
    assert set(stats) == {"entries", "capacity", "hits", "misses", "evictions"}
    assert 0 < stats["entries"] <= stats["capacity"] == launch._cache.capacity
