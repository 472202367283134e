"""The ``neuron`` c10d backend across processes: every collective against a reference computed on the CPU,
both staging paths (host alias and host copy), async Work, the default backend mapping, a device mesh,
simulated NeuronLink time, and a rank that dies making the others raise within the timeout.

Inputs are small integers so that sums, products and averages are exact in float32 and bfloat16 whatever
order gloo reduces in: results must equal the references exactly.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch_neuron_testing import multiprocess

pytestmark = pytest.mark.timeout(400)

DEV = "neuron"


def _data(rank: int, shape, dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def _all(world, shape, dtype, salt=0):
    return [_data(r, shape, dtype, salt) for r in range(world)]


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.device.type == DEV
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def _allreduce(rank, world, dtype, group):
    xs = _all(world, (3, 5), dtype)
    stacked = torch.stack(xs)
    premul = dist._make_nccl_premul_sum(0.5)
    premul_t = dist._make_nccl_premul_sum(torch.tensor(0.25, dtype=dtype, device=DEV))
    cases = [(dist.ReduceOp.SUM, stacked.sum(0)), (dist.ReduceOp.AVG, stacked.sum(0) / world),
             (dist.ReduceOp.MAX, stacked.amax(0)), (dist.ReduceOp.MIN, stacked.amin(0)),
             (dist.ReduceOp.PRODUCT, stacked.prod(0)), (premul, (stacked * 0.5).sum(0)),
             (premul_t, (stacked * 0.25).sum(0))]
    for op, expected in cases:
        t = xs[rank].to(DEV)
        dist.all_reduce(t, op=op, group=group)
        _same(t, expected.to(dtype))
    base = xs[rank].to(DEV)
    strided = base[:, ::2]  # not contiguous: staged through a host copy, copied back into the view
    dist.all_reduce(strided, group=group)
    _same(base, _strided_expected(xs[rank], stacked))
    ts = [_data(rank, (4,), dtype, 1).to(DEV), _data(rank, (2, 3), dtype, 2).to(DEV)]
    dist.all_reduce_coalesced(ts, group=group)
    _same(ts[0], torch.stack(_all(world, (4,), dtype, 1)).sum(0))
    _same(ts[1], torch.stack(_all(world, (2, 3), dtype, 2)).sum(0))


def _strided_expected(mine, stacked):
    expected = mine.clone()
    expected[:, ::2] = stacked.sum(0)[:, ::2]
    return expected


def _rooted(rank, world, dtype, group):
    xs = _all(world, (6,), dtype)
    t = xs[rank].to(DEV)
    dist.broadcast(t, src=world - 1, group=group)
    _same(t, xs[world - 1])
    t = xs[rank].to(DEV)
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM, group=group)
    if rank == 0:
        _same(t, torch.stack(xs).sum(0))
    gathered = [torch.empty(6, dtype=dtype, device=DEV) for _ in range(world)] if rank == 0 else None
    dist.gather(xs[rank].to(DEV), gathered, dst=0, group=group)
    if rank == 0:
        for g, x in zip(gathered, xs):
            _same(g, x)
    out = torch.empty(6, dtype=dtype, device=DEV)
    dist.scatter(out, [x.to(DEV) for x in xs] if rank == 0 else None, src=0, group=group)
    _same(out, xs[rank])


def _allgather(rank, world, dtype, group):
    xs = _all(world, (2, 3), dtype)
    outs = [torch.empty(2, 3, dtype=dtype, device=DEV) for _ in range(world)]
    dist.all_gather(outs, xs[rank].to(DEV), group=group)
    for o, x in zip(outs, xs):
        _same(o, x)
    flat = torch.empty(2 * world, 3, dtype=dtype, device=DEV)
    dist.all_gather_into_tensor(flat, xs[rank].to(DEV), group=group)
    _same(flat, torch.cat(xs))
    lists = [[torch.empty(2, 3, dtype=dtype, device=DEV), torch.empty(4, dtype=dtype, device=DEV)]
             for _ in range(world)]
    dist.all_gather_coalesced(lists, [xs[rank].to(DEV), _data(rank, (4,), dtype, 1).to(DEV)], group=group)
    for r in range(world):
        _same(lists[r][0], xs[r])
        _same(lists[r][1], _data(r, (4,), dtype, 1))
    a, b = torch.empty(2 * world, 3, dtype=dtype, device=DEV), torch.empty(world * 4, dtype=dtype, device=DEV)
    with dist._coalescing_manager(group=group, device=torch.device(DEV), async_ops=True) as cm:
        dist.all_gather_into_tensor(a, xs[rank].to(DEV), group=group)
        dist.all_gather_into_tensor(b, _data(rank, (4,), dtype, 1).to(DEV), group=group)
    cm.wait()
    _same(a, torch.cat(xs))
    _same(b, torch.cat(_all(world, (4,), dtype, 1)))


def _reduce_scatter(rank, world, dtype, group):
    xs = _all(world, (world * 2, 3), dtype)
    total = torch.stack(xs).sum(0)
    out = torch.empty(2, 3, dtype=dtype, device=DEV)
    dist.reduce_scatter(out, list(xs[rank].to(DEV).chunk(world)), group=group)
    _same(out, total.chunk(world)[rank])
    for op, expected in [(dist.ReduceOp.SUM, total), (dist.ReduceOp.AVG, total / world),
                         (dist._make_nccl_premul_sum(0.5), (torch.stack(xs) * 0.5).sum(0))]:
        inp = xs[rank].to(DEV)
        out = torch.empty(2, 3, dtype=dtype, device=DEV)
        dist.reduce_scatter_tensor(out, inp, op=op, group=group)
        _same(out, expected.to(dtype).chunk(world)[rank])
        _same(inp, xs[rank])  # the input keeps its values (PREMUL_SUM scales a copy)
    ys = _all(world, (world * 4,), dtype, 1)
    a, b = torch.empty(2, 3, dtype=dtype, device=DEV), torch.empty(4, dtype=dtype, device=DEV)
    with dist._coalescing_manager(group=group, device=torch.device(DEV), async_ops=True) as cm:
        dist.reduce_scatter_tensor(a, xs[rank].to(DEV), group=group)
        dist.reduce_scatter_tensor(b, ys[rank].to(DEV), group=group)
    cm.wait()
    _same(a, total.chunk(world)[rank])
    _same(b, torch.stack(ys).sum(0).chunk(world)[rank])


def _alltoall(rank, world, dtype, group):
    xs = _all(world, (world * 2,), dtype)
    out = torch.empty(world * 2, dtype=dtype, device=DEV)
    dist.all_to_all_single(out, xs[rank].to(DEV), group=group)
    _same(out, torch.cat([x.chunk(world)[rank] for x in xs]))
    # uneven: rank r sends r + 1 + j elements to rank j
    sends = [[_data(r, (r + 1 + j,), dtype, 10 + j) for j in range(world)] for r in range(world)]
    in_splits = [rank + 1 + j for j in range(world)]
    out_splits = [r + 1 + rank for r in range(world)]
    out = torch.empty(sum(out_splits), dtype=dtype, device=DEV)
    dist.all_to_all_single(out, torch.cat(sends[rank]).to(DEV), out_splits, in_splits, group=group)
    _same(out, torch.cat([sends[r][rank] for r in range(world)]))
    outs = [torch.empty(r + 1 + rank, dtype=dtype, device=DEV) for r in range(world)]
    dist.all_to_all(outs, [s.to(DEV) for s in sends[rank]], group=group)
    for r in range(world):
        _same(outs[r], sends[r][rank])


def _point_to_point(rank, world, dtype, group):
    xs = _all(world, (5,), dtype)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(5, dtype=dtype, device=DEV)
    ops = [dist.P2POp(dist.isend, xs[rank].to(DEV), dist.get_global_rank(group, nxt) if group else nxt, group),
           dist.P2POp(dist.irecv, got, dist.get_global_rank(group, prv) if group else prv, group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _same(got, xs[prv])


def _async_work(rank, world, dtype, group):
    xs = _all(world, (8,), dtype)
    t = xs[rank].to(DEV)
    work = dist.all_reduce(t, async_op=True, group=group)
    assert work.wait(timeout=datetime.timedelta(seconds=30))
    _same(t, torch.stack(xs).sum(0))
    t = xs[rank].to(DEV)
    fut = dist.all_reduce(t, async_op=True, group=group).get_future()
    result = fut.wait()
    _same(result[0], torch.stack(xs).sum(0))
    _same(t, torch.stack(xs).sum(0))
    out = torch.empty(world * 2, dtype=dtype, device=DEV)
    work = dist.reduce_scatter_tensor(out[:2], xs[rank].to(DEV)[: world * 2], async_op=True, group=group)
    work.get_future().wait()  # gloo's reduce_scatter work has no future of its own
    _same(out[:2], torch.stack(xs)[:, : world * 2].sum(0).chunk(world)[rank])
    dist.barrier(group=group)


SUITE = (_allreduce, _rooted, _allgather, _reduce_scatter, _alltoall, _point_to_point, _async_work)


def _collectives(rank, world):
    torch.neuron.set_device(rank % torch.neuron.device_count())
    assert "neuron:neuron" in str(dist.get_backend_config())
    groups = [None]
    os.environ["TORCH_NEURON_DIST_STAGING"] = "copy"  # a second group stages through host copies
    groups.append(dist.new_group(backend="cpu:gloo,neuron:neuron"))
    for group in groups:
        for dtype in (torch.float32, torch.bfloat16):
            for check in SUITE:
                check(rank, world, dtype, group)
    return True


@pytest.mark.parametrize("world,backend", [(2, "cpu:gloo,neuron:neuron"), (4, None)])
def test_collectives(world, backend):
    """2 ranks name the backend; 4 ranks rely on the default mapping of the neuron device."""
    assert multiprocess.run(_collectives, world, backend=backend) == [True] * world


def _default_group(rank, world):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2).to(DEV))  # its logger asks the default
    model(torch.ones(4, 3, device=DEV)).sum().backward()
    cpu = torch.full((2,), float(rank + 1))
    dist.all_reduce(cpu)  # CPU tensors (samplers, object collectives) in the same group
    return dist.get_backend(), cpu.tolist()


def test_init_process_group_with_no_backend_serves_ddp_and_cpu_tensors():
    """init_process_group() on a neuron machine: DDP builds (torch 2.13 alone marks gloo as the default backend
    though it built only neuron's) and CPU tensors reduce in the same group."""
    for backend, cpu in multiprocess.run(_default_group, 2, backend=None):
        assert backend == "cpu:gloo,neuron:neuron" and cpu == [3.0, 3.0]


def _mesh_and_time(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    from torch_neuron.distributed.cost import collective_ns

    mesh = init_device_mesh(DEV, (world,))
    t = torch.ones(1024, device=DEV)
    torch.neuron.reset_metrics()
    torch.neuron.synchronize()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    dist.all_reduce(t, group=mesh.get_group())
    end.record()
    end.synchronize()
    _same(t, torch.full((1024,), float(world)))
    expected = collective_ns("allreduce", 4096, world, torch.neuron.runtime().profile)
    charged = torch.neuron.metrics()["device_ns"]["c10d.allreduce"]
    dist.barrier(group=mesh.get_group(), device_ids=[torch.neuron.current_device()])
    barrier = torch.neuron.metrics()["device_ns"].get("c10d.barrier")
    assert barrier == collective_ns("barrier", 0, world, torch.neuron.runtime().profile), barrier
    return expected, charged, start.elapsed_time(end) * 1e6


def test_device_mesh_and_simulated_time():
    for expected, charged, elapsed_ns in multiprocess.run(_mesh_and_time, 2):
        assert expected > 0
        assert charged == expected
        assert elapsed_ns >= expected  # the collective sits on the stream between the events


def test_cost_model_formulas():
    from torch_neuron.distributed.cost import collective_ns

    p = torch.neuron.runtime().profile
    chip, h = p.neuronlink_gbps, p.cc_hop_ns
    big = 64 << 20
    assert collective_ns("allreduce", big, 1, p) == 0.0
    assert collective_ns("allgather", big, 4, p) == pytest.approx(3 * (h + big / (4 * chip)))
    assert collective_ns("allreduce", big, 4, p) == pytest.approx(6 * (h + big / (4 * chip)))  # ring
    assert collective_ns("allreduce", 64, 4, p) == pytest.approx(2 * h + 3 * 64 / chip)  # mesh: fewer hops
    assert collective_ns("send", big, 2, p) == pytest.approx(h + big * p.neuronlink_links / chip)
    with pytest.raises(ValueError, match="no NeuronLink cost model"):
        collective_ns("permute", 1, 2, p)


def _dies(rank, world):
    t = torch.ones(4, device=DEV)
    dist.all_reduce(t)  # everyone connected
    if rank == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        dist.all_reduce(t)
    except Exception as e:  # gloo reports the lost peer (or the timeout)
        return time.monotonic() - start, type(e).__name__
    return None


def test_dead_rank_raises_within_timeout():
    results = multiprocess.run(_dies, 2, may_die=(1,), pg_timeout=10.0, timeout=60.0)
    assert results[0] is not None, "the collective did not raise after rank 1 died"
    elapsed, _ = results[0]
    assert elapsed < 10.0 + 5.0


def _stalls(rank, world):
    t = torch.ones(4, device=DEV)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(8.0)  # alive, connected, but never joins the next collective
        os._exit(0)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as e:  # gloo's timeout: the process group's, 3 s
        return time.monotonic() - start, type(e).__name__
    return None


def test_stalled_rank_times_out():
    results = multiprocess.run(_stalls, 2, may_die=(1,), pg_timeout=3.0, timeout=60.0)
    assert results[0] is not None, "the collective did not raise while rank 1 stalled"
    elapsed, _ = results[0]
    assert 2.0 < elapsed < 3.0 + 4.0
