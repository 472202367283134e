"""Device memory: the profile's HBM through a caching allocator with exact statistics."""

import subprocess
import sys

import pytest
import torch


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
