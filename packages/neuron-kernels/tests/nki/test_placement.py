"""nl.ndarray(address=(start_partition, byte_offset)): an on-chip tile placed by the kernel, for the whole kernel;
tiles placed by liveness go around it; its .ap() views start at its partition and byte offset."""

import numpy as np
import pytest

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl


@nki.jit
def placed_scale(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    pinned = nl.ndarray((64, 128), nl.float32, buffer=nl.sbuf, address=(64, 0))
    free = nl.ndarray((64, 128), nl.float32, buffer=nl.sbuf)  # placed by liveness
    nisa.dma_copy(dst=pinned, src=x)
    nisa.tensor_scalar(dst=free, data=pinned, op0=nl.multiply, operand0=3.0)
    nisa.tensor_tensor(dst=pinned.ap(pattern=[[128, 64], [1, 128]], offset=0), data1=free, data2=pinned,
                       op=nl.add)
    nisa.dma_copy(dst=out, src=pinned)
    return out


def test_placed_tile_keeps_its_address_and_values():
    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    np.testing.assert_array_equal(placed_scale(x), x * np.float32(3) + x)
    program = placed_scale.program(x)
    load = program.instructions[0].dst
    assert (load.start_partition, load.offset) == (64, 0)
    assert program.instructions[2].dst == load  # .ap() on the placed tile starts at its address
    free = program.instructions[1].dst
    assert free.offset >= 512  # the placed bytes are reserved in every partition for the whole kernel


@pytest.mark.parametrize("address, match", [((100, 0), "does not fit"), ((0, 10 ** 7), "does not fit"),
                                            ((0,), "must be")])
def test_bad_addresses_raise(address, match):
    @nki.jit
    def k(x):
        t = nl.ndarray((64, 128), nl.float32, buffer=nl.sbuf, address=address)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(KernelError, match=match):
        k.program(np.zeros((64, 128), np.float32))
