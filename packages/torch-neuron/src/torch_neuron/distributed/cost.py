"""Simulated NeuronLink time of a collective (the device-time model; data really moves through gloo).

Each rank is one device on its own chip; the chips are joined by NeuronLink (docs/hardware.md §5: ring
algorithms, AllReduce = ReduceScatter + AllGather; mesh for small messages). With ``N`` ranks, ``S``
the bytes a rank's tensors hold (the full, unsharded size for allgather / reduce_scatter), ``h`` the
per-hop latency ``profile.cc_hop_ns``, ``C`` the chip's NeuronLink bandwidth ``profile.neuronlink_gbps``
(GB/s = bytes/ns) and ``L = C / profile.neuronlink_links`` one link's:

- allreduce:         min(ring 2(N-1)(h + S/(N C)),  mesh 2h + (N-1) S / C)
                     (ring: one ring per link, each carrying 1/links of the data, so a step moves S/N at
                     C; mesh: every rank sends its whole tensor to the N-1 others, then reduces locally:
                     fewer hops, more bytes, so it wins for small messages, as §5 says)
- allgather, reduce_scatter: (N-1)(h + S/(N C))
- broadcast, reduce, scatter, gather: pipelined ring (N-1) h + S / C
- alltoall:          h + (N-1)/N * S / C   (mesh: each peer's slice on a direct route)
- send, recv:        h + S / L              (one link between two chips)
- barrier:           2 (N-1) h              (an allreduce of nothing)

One rank's time is charged to its own queue from when that queue's earlier work ends; ranks are not
re-synchronised in simulated time (the model assumes they reach a collective together, as the steps of
data-parallel training do).
"""

from __future__ import annotations

_RING = ("allgather", "reduce_scatter")
_ROOTED = ("broadcast", "reduce", "scatter", "gather")


def collective_ns(op: str, nbytes: int, ranks: int, profile) -> float:
    """Simulated nanoseconds of collective ``op`` moving ``nbytes`` per rank among ``ranks`` devices."""
    if ranks <= 1:
        return 0.0
    h = profile.cc_hop_ns
    chip = profile.neuronlink_gbps  # bytes per ns
    n, s = ranks, float(nbytes)
    if op == "allreduce":
        return min(2 * (n - 1) * (h + s / (n * chip)), 2 * h + (n - 1) * s / chip)
    if op in _RING:
        return (n - 1) * (h + s / (n * chip))
    if op in _ROOTED:
        return (n - 1) * h + s / chip
    if op == "alltoall":
        return h + (n - 1) / n * s / chip
    if op in ("send", "recv"):
        return h + s / (chip / profile.neuronlink_links)
    if op == "barrier":
        return 2 * (n - 1) * h
    raise ValueError(f"no NeuronLink cost model for collective {op!r}")
