"""Memory-facing NKI semantics public kernels rely on: nl.ndarray(address=) placement, returning an argument the
kernel wrote, NKIObject keyword dataclasses."""

from dataclasses import dataclass

import numpy as np
import pytest

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl


def test_addressed_tiles_with_disjoint_lifetimes_give_the_kernels_values():
    @nki.jit
    def stack(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.static_range(x.shape[0] // 32):  # every tile at the same address, one after another
            t = nl.ndarray((32, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf, address=(0, 0))
            nisa.dma_copy(dst=t, src=x[i * 32:(i + 1) * 32, :])
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(i))
            nisa.dma_copy(dst=out[i * 32:(i + 1) * 32, :], src=t)
        return out

    x = np.random.default_rng(0).standard_normal((128, 16)).astype(np.float32)
    np.testing.assert_array_equal(stack(x), x + np.repeat(np.arange(4, dtype=np.float32), 32)[:, None])


def test_tiles_at_one_address_share_its_memory_and_bad_addresses_raise():
    """address= is the tile's place for the whole kernel: two tiles given the same address are the same bytes (a
    kernel reading one tensor through another sees the other's writes), as on the chip."""
    @nki.jit
    def alias(x, y):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf, address=(0, 64))
        b = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf, address=(0, 64))
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=y)
        nisa.dma_copy(dst=out, src=a)
        return out

    x, y = np.zeros((32, 16), np.float32), np.arange(512, dtype=np.float32).reshape(32, 16)
    np.testing.assert_array_equal(alias(x, y), y)

    @nki.jit
    def outside(x):
        nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf, address=(8, 0))
        return x

    with pytest.raises(KernelError, match=r"at address \(8, 0\) does not fit SBUF \(128 partitions"):
        outside(np.zeros((2, 2), np.float32))


def test_returning_an_argument_the_kernel_wrote():
    @nki.jit
    def scale_in_place(x, out):
        t = nl.load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nl.store(out, t)
        return out

    x, out = np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((3, 4), np.float32)
    got = scale_in_place(x, out)
    np.testing.assert_array_equal(got, 3 * x)
    np.testing.assert_array_equal(out, 3 * x)  # the caller's array is written too


def test_nkiobject_dataclasses_take_keywords_for_plain_class_attributes():
    @dataclass
    class Params(nl.NKIObject):
        offset = None
        size = 4

    @dataclass(frozen=True)
    class Config(nl.NKIObject):
        k: int
        sorted: bool = True

    p = Params(offset=3)
    assert (p.offset, p.size) == (3, 4)
    with pytest.raises(TypeError, match=r"Params has no attribute 'bogus'"):
        Params(bogus=1)
    assert Config(8) == Config(k=8, sorted=True) and hash(Config(8)) == hash(Config(8))
