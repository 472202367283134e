"""nki-library's selective scan (Mamba SSM: discretization, recurrence and output projection in one kernel) on
one trn1 NeuronCore, before and after hoisting the A block out of the state loop.

Source: github.com/aws-neuron/nki-library, ``src/nkilib_src/nkilib/experimental/scan/selective_scan.py``. The
kernel was added in 1660ab0 (2026-03-31, "Implements two scan primitives for Trainium (trn1) ... Hardware-
validated on trn1"); ebe57b2 (same day) loads A [channels, state] once per (batch, channel tile) instead of one
[128, 1] column per state, and its message gives the profile of batch 1, 128 channels, L 256, 16 states:
DMA transfers 100 -> 85, average transfer 4593 -> 5403 B, latency 129.5 -> 127.8 us. Those counts and sizes
match this kernel exactly with fp32 x / dt / B / C, D given and no initial state (459,264 B in 100 or 85 DMAs),
which fixes the configuration.

Structure: 16 zeroed carries stored to final_state; then per (batch, 128-channel tile, 512-column tile) dt and x
loads, dt*x, a zeroed y accumulator, and 16 states in order, each: the carry load from final_state, exp(dt*A_n)
on ScalarE, the B row (1 x L) and its broadcast to 128 partitions, dt*x*B, the scan with the carry as initial
value, the last column back to final_state, the C row and its broadcast, C*state and the add into y; then
y += D*x and the store.
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import spec

P, F_TILE, QUADRANT = 128, 512, 32


def _broadcast_row(ones, row, parts, size):
    """``nc_stream_shuffle`` with an all-zero mask, once per 32-partition quadrant: VectorE copies partition 0 of
    the row into each quadrant. The ISA has no stream shuffle; a TensorE ones-matmul puts the row on every
    partition in PSUM and four VectorE copies of [32, size] (the shuffles' engine, partitions, free size and
    bytes) move it to the SBUF tile the kernel consumes."""
    spread = nl.ndarray((P, F_TILE), nl.float32, buffer=nl.psum, name="row_bcast")
    nisa.nc_matmul(spread[0:parts, 0:size], ones[0:1, 0:parts], row[0:1, 0:size], accumulate=False)
    full = nl.ndarray((P, F_TILE), nl.float32, name="row_full")
    for q in nl.static_range(nl.cdiv(parts, QUADRANT)):
        lanes = nl.ds(q * QUADRANT, min(QUADRANT, parts - q * QUADRANT))
        nisa.tensor_copy(full[lanes, 0:size], spread[lanes, 0:size])
    return full


@nk.kernel
def selective_scan(x, dt, A, B, C, D, hoist_a=True):
    """x, dt [batch, channels, L]; A [channels, N]; B, C [batch, N, L]; D [channels]. Returns y and the final
    state [batch, channels, N] (fp32), which also carries the scan state between 512-column tiles.
    ``hoist_a``: ebe57b2's single A block load; False is 1660ab0's memset + DMA of an A column per state."""
    batch, channels, L = x.shape
    n_state = A.shape[1]
    y = nl.ndarray((batch, channels, L), x.dtype, buffer=nl.hbm)
    final_state = nl.ndarray((batch, channels, n_state), nl.float32, buffer=nl.hbm)
    d_col = D.reshape(channels, 1)
    b_rows = B.reshape(batch * n_state, L)
    c_rows = C.reshape(batch * n_state, L)
    ones = nl.ndarray((1, P), nl.float32, name="ones")  # for the stream-shuffle stand-in only
    nisa.memset(ones, 1.0)
    tiles = [(p0, min(P, channels - p0)) for p0 in range(0, channels, P)]

    for b in nl.affine_range(batch):
        for p0, ps in tiles:
            for n in nl.affine_range(n_state):
                carry_init = nl.ndarray((P, 1), nl.float32, name="carry_init")
                nisa.memset(carry_init, 0.0)
                nisa.dma_copy(final_state[b, p0:p0 + ps, n:n + 1], carry_init[0:ps, 0:1])

    for b in nl.affine_range(batch):
        for p0, ps in tiles:
            if hoist_a:
                a_block = nl.ndarray((P, n_state), nl.float32, name="A_block")
                nisa.memset(a_block, 0.0)
                nisa.dma_copy(a_block[0:ps, :], A[p0:p0 + ps, :])
            for f in nl.sequential_range(nl.cdiv(L, F_TILE)):
                f0 = f * F_TILE
                fs = min(F_TILE, L - f0)
                cols = nl.ds(f0, fs)
                dt_sb = nl.ndarray((P, F_TILE), dt.dtype, name="dt")
                nisa.memset(dt_sb, 0.0)
                nisa.dma_copy(dt_sb[0:ps, 0:fs], dt[b, p0:p0 + ps, cols])
                x_sb = nl.ndarray((P, F_TILE), x.dtype, name="x")
                nisa.memset(x_sb, 0.0)
                nisa.dma_copy(x_sb[0:ps, 0:fs], x[b, p0:p0 + ps, cols])
                dtx = nl.ndarray((P, F_TILE), nl.float32, name="dtx")
                nisa.tensor_tensor(dtx[0:ps, 0:fs], dt_sb[0:ps, 0:fs], x_sb[0:ps, 0:fs], nl.multiply)
                y_acc = nl.ndarray((P, F_TILE), nl.float32, name="y_acc")
                nisa.memset(y_acc, 0.0)
                for n in nl.sequential_range(n_state):
                    if hoist_a:
                        a_n = a_block[0:ps, n:n + 1]
                    else:
                        a_col = nl.ndarray((P, 1), nl.float32, name="A_col")
                        nisa.memset(a_col, 0.0)
                        nisa.dma_copy(a_col[0:ps, 0:1], A[p0:p0 + ps, n:n + 1])
                        a_n = a_col[0:ps, 0:1]
                    carry = nl.ndarray((P, 1), nl.float32, name="carry")
                    nisa.dma_copy(carry[0:ps, 0:1], final_state[b, p0:p0 + ps, n:n + 1])
                    decay = nl.ndarray((P, F_TILE), nl.float32, name="deltaA")
                    nisa.activation(decay[0:ps, 0:fs], nl.exp, dt_sb[0:ps, 0:fs], scale=a_n)
                    row = b * n_state + n
                    b_row = nl.ndarray((1, F_TILE), B.dtype, name="B_row")
                    nisa.dma_copy(b_row[0:1, 0:fs], b_rows[row:row + 1, cols])
                    b_full = _broadcast_row(ones, b_row, ps, fs)
                    inp = nl.ndarray((P, F_TILE), nl.float32, name="deltaBx")
                    nisa.tensor_tensor(inp[0:ps, 0:fs], dtx[0:ps, 0:fs], b_full[0:ps, 0:fs], nl.multiply)
                    state = nl.ndarray((P, F_TILE), nl.float32, name="state")
                    nisa.tensor_tensor_scan(state[0:ps, 0:fs], decay[0:ps, 0:fs], inp[0:ps, 0:fs],
                                            carry[0:ps, 0:1], nl.multiply, nl.add)
                    carry_new = nl.ndarray((P, 1), nl.float32, name="carry_new")
                    nisa.tensor_copy(carry_new[0:ps, 0:1], state[0:ps, fs - 1:fs])
                    nisa.dma_copy(final_state[b, p0:p0 + ps, n:n + 1], carry_new[0:ps, 0:1])
                    c_row = nl.ndarray((1, F_TILE), C.dtype, name="C_row")
                    nisa.dma_copy(c_row[0:1, 0:fs], c_rows[row:row + 1, cols])
                    c_full = _broadcast_row(ones, c_row, ps, fs)
                    cs = nl.ndarray((P, F_TILE), nl.float32, name="Cs")
                    nisa.tensor_tensor(cs[0:ps, 0:fs], c_full[0:ps, 0:fs], state[0:ps, 0:fs], nl.multiply)
                    nisa.tensor_tensor(y_acc[0:ps, 0:fs], y_acc[0:ps, 0:fs], cs[0:ps, 0:fs], nl.add)
                d_sb = nl.ndarray((P, 1), nl.float32, name="D")
                nisa.memset(d_sb, 0.0)
                nisa.dma_copy(d_sb[0:ps, 0:1], d_col[p0:p0 + ps, 0:1])
                dx = nl.ndarray((P, F_TILE), nl.float32, name="Dx")
                nisa.tensor_scalar(dx[0:ps, 0:fs], x_sb[0:ps, 0:fs], nl.multiply, d_sb[0:ps, 0:1])
                nisa.tensor_tensor(y_acc[0:ps, 0:fs], y_acc[0:ps, 0:fs], dx[0:ps, 0:fs], nl.add)
                nisa.dma_copy(y[b, p0:p0 + ps, cols], y_acc[0:ps, 0:fs])
    return y, final_state


ARGS = (spec((1, 128, 256), "float32"), spec((1, 128, 256), "float32"), spec((128, 16), "float32"),
        spec((1, 16, 256), "float32"), spec((1, 16, 256), "float32"), spec((128,), "float32"))
SOURCE = ("aws-neuron/nki-library ebe57b2 (2026-03-31) commit message 'Optimize selective_scan: preload A block "
          "outside state loop'; kernel src/nkilib_src/nkilib/experimental/scan/selective_scan.py at 1660ab0 "
          "(before) and ebe57b2 (after)")
NOTE = ("profile latency of batch 1, 128 channels, L 256, 16 states, as quoted in the commit message (one "
        "profiled run; the tool and statistic are not named). fp32, D given and no initial state are inferred "
        "from the quoted DMA count and average size, which this kernel reproduces exactly. trn1 from the parent "
        "commit's 'Hardware-validated on trn1'.")
DIFFERS = ("nc_stream_shuffle (VectorE, all-zero mask: partition 0 broadcast to each 32-partition quadrant) is "
           "not in the ISA. Of the two stand-ins, GpSimd partition_broadcast is priced as a log2(P)-pass tree "
           "(gpsimd_start + 5N cycles per 32-partition quadrant, ~4x a shuffle's N), a TensorE ones-matmul as one "
           "N-cycle pass like the shuffle: so each broadcast is an fp32 ones-matmul [1 x 128] x [1 x L] into PSUM "
           "(+1 TensorE op, ~1024 PE cycles, and its PE->DVE wait before the copies) followed by four VectorE "
           "copies of [32, L] from PSUM, which keep the four shuffles' engine, partitions, free size and bytes. "
           "memset and tensor_copy run on VectorE (their default; the kernel names no engine)")


def _case(name, hoist_a, value_us):
    return Case(
        family="nki-library-selective-scan", name=name, kernel=selective_scan, args=ARGS,
        kwargs={"hoist_a": hoist_a},
        measurement=Measurement(value_us, "profile", "trn1", SOURCE, "2026-03", includes_launch=True, note=NOTE),
        differs=DIFFERS,
    )


CASES = [
    _case("a_column_per_state", False, 129.5),
    _case("a_block_hoisted", True, 127.8),
]
