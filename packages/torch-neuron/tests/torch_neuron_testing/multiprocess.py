"""Run a function on N ranks of a process group, one spawned process per rank, for the distributed tests.

``run(fn, world, *args)`` returns every rank's result (rank order) or raises with the first failing
rank's traceback. It never hangs and leaves no process behind: the whole run has a deadline, and on
failure or timeout every process still alive is terminated, then killed, and joined.
"""

from __future__ import annotations

import datetime
import importlib.util
import multiprocessing
import os
import pickle
import queue
import tempfile
import time
import traceback
from pathlib import Path

START_TIMEOUT = 120.0  # seconds for a rank to import torch and build the backend on busy cores


def _child(target, rank, world, store_path, backend, pg_timeout, env, args, results):
    os.environ.update(env)
    import torch.distributed as dist

    try:
        fn = _load(*target)
        store = dist.FileStore(store_path, world)
        kwargs = {} if backend is None else {"backend": backend}
        dist.init_process_group(store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout), **kwargs)
        # plain pickle: the queue's own pickler would pass tensors as shared memory, gone when the rank exits
        results.put((rank, "ok", pickle.dumps(fn(rank, world, *args))))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        _exit(results, 1)
    try:
        dist.destroy_process_group()
    finally:
        _exit(results, 0)


def _where(fn) -> tuple[str, str]:
    """A function as (its file, its name): pytest imports test modules under names a spawned process cannot
    import (``--import-mode=importlib``), so the rank loads the file itself."""
    return fn.__code__.co_filename, fn.__qualname__


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"_rank_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _exit(results, code: int) -> None:
    results.close()
    results.join_thread()  # the result is written before the process goes
    os._exit(code)  # no interpreter teardown: gloo threads of a peer that already left must not block it


def run(fn, world: int, *args, timeout: float = 180.0, backend: str | None = "cpu:gloo,neuron:neuron",
        pg_timeout: float = 60.0, env: dict | None = None, may_die: tuple[int, ...] = ()) -> list:
    """``fn(rank, world, *args)`` on ``world`` ranks; ranks in ``may_die`` may exit without a result
    (their entry in the returned list is None)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_child, daemon=True,
                             args=(_where(fn), r, world, store_path, backend, pg_timeout, env or {}, args, results))
                 for r in range(world)]
        ok = False
        try:
            for p in procs:
                p.start()
            out = _collect(procs, results, world, timeout + START_TIMEOUT, set(may_die))
            ok = True
            return out
        finally:
            _reap(procs, 10.0 if ok else 0.0)


def _collect(procs, results, world, timeout, may_die) -> list:
    out, pending = [None] * world, set(range(world))
    deadline = time.monotonic() + timeout
    while pending - may_die:
        try:
            rank, status, value = results.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(pending)} gave no result within {timeout:.0f} s") from None
            dead = [r for r in pending - may_die if procs[r].exitcode not in (None, 0)]
            if dead and results.empty():
                code = procs[dead[0]].exitcode
                raise AssertionError(f"rank {dead[0]} exited with code {code} and no result") from None
            continue
        if status == "error" and rank not in may_die:
            raise AssertionError(f"rank {rank} failed:\n{value}")
        out[rank] = pickle.loads(value) if status == "ok" else None
        pending.discard(rank)
    return out


def _reap(procs, grace: float) -> None:
    for p in procs:
        p.join(timeout=grace)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join()
