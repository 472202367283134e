"""SPMD launches kernel[grid] / kernel[lnc]: each instance sees its nl.program_id, shared_hbm is shared, against
numpy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels.nki as nki
from neuron_kernels import KernelError
from neuron_kernels.nki import isa as nisa
from neuron_kernels.nki import language as nl


@nki.jit
def scaled_rows(x):
    """Instance (i, j) of a 2-D grid writes its block of rows times (1 + i * grid[1] + j)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = nl.num_programs()
    rows = x.shape[0] // n
    me = 0
    for a in range(nl.program_ndim()):  # the row-major index of this instance
        me = me * nl.num_programs(a) + nl.program_id(a)
    t = nl.load(x[me * rows:(me + 1) * rows, :])
    r = nl.ndarray(t.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=float(1 + me))
    nl.store(out[me * rows:(me + 1) * rows, :], r)
    return out


def want(x, n):
    rows = x.shape[0] // n
    return x * np.repeat(np.arange(1, n + 1, dtype=np.float32), rows)[:, None]


@settings(max_examples=6, deadline=None)
@given(grid=st.sampled_from([(1,), (2,), (4,), (2, 3), (3, 1)]), cols=st.integers(1, 64))
def test_instances_see_their_program_id_and_share_outputs(grid, cols):
    n = int(np.prod(grid))
    x = np.random.default_rng(n).standard_normal((n * 8, cols)).astype(np.float32)
    k = scaled_rows[grid if len(grid) > 1 else grid[0]]
    np.testing.assert_array_equal(k(x), want(x, n))
    assert k.last_report.device_ns > 0


def test_no_grid_is_one_program_and_grids_are_cached():
    x = np.ones((8, 4), np.float32)
    np.testing.assert_array_equal(scaled_rows(x), x)
    assert scaled_rows[2] is scaled_rows[2] and scaled_rows[2] is not scaled_rows
    assert [a.role for a in scaled_rows[2].program(np.ones((8, 4), np.float32)).args] == ["in", "out"]


def test_bad_grids_and_diverging_instances_raise():
    with pytest.raises(KernelError, match=r"every grid dim must be >= 1"):
        scaled_rows[0]
    with pytest.raises(KernelError, match=r"already a launch grid"):
        scaled_rows[2][2]

    @nki.jit
    def own_output(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm) if nl.program_id(0) == 0 else \
            nl.ndarray((1, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x[0:out.shape[0], 0:out.shape[1]]))
        return out

    with pytest.raises(KernelError, match=r"shared_hbm tensor 0 is \[1, 1\] float32 here but \[4, 4\]"):
        own_output[2](np.ones((4, 4), np.float32))
