"""What ran where: ops run natively, CPU fallbacks per op, and device time per op."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

native_calls: Counter[str] = Counter()
fallback_calls: Counter[str] = Counter()
device_ns: defaultdict[str, float] = defaultdict(float)
launches: Counter[str] = Counter()
compile_counts: Counter[str] = Counter()  # graphs and fused regions compiled, program cache hits and misses
observers: list = []  # callables (op, ns) told of every native op, e.g. an active profiler
report_observers: list = []  # callables (op, ExecutionReport) told of every program launched, e.g. telemetry
caches: dict = {}  # name -> bounded cache (neuron_kernels.lru.LRU) reported in metrics()["caches"]
inner_ns: defaultdict[str, Counter] = defaultdict(Counter)  # user op -> the ops that ran inside it -> ns
_scope = threading.local()  # .ops: the neuron aten ops on this thread's stack, outermost first


class attributed:
    """``with attributed(op):`` around an op's neuron kernel: device time of programs launched by the ops it
    dispatches in turn (a decomposition's pieces, an aten call inside a kernel) is charged to the outermost
    op, the one the user called; their own names stay in ``metrics()["device_ns_inner"]`` and ``native``."""

    __slots__ = ("op",)

    def __init__(self, op: str):
        self.op = op

    def __enter__(self):
        _scope.__dict__.setdefault("ops", []).append(self.op)

    def __exit__(self, *exc):
        _scope.ops.pop()
        return False


def user_op(op: str) -> str:
    """The op charged for a launch recorded as ``op``: the outermost neuron op running on this thread (the
    aten op the user called), else ``op`` itself (launches outside any op: copies, optimizers, c10d)."""
    stack = getattr(_scope, "ops", None)
    return stack[0] if stack else op


def record_native(op: str, ns: float, programs: int = 1, report=None) -> None:
    native_calls[op] += 1  # ran natively: counted under its own name
    user = user_op(op)
    device_ns[user] += ns
    if user != op:
        inner_ns[user][op] += ns
    if programs:  # an op inside a compiled graph launches none of its own (the graph is the program)
        launches[user] += programs
    for observe in observers:
        observe(user, ns)
    if report is not None and not report.in_graph:  # a graph's launches are reported as its one program
        for observe in report_observers:
            observe(user, report)


def record_compile(event: str, n: int = 1) -> None:
    compile_counts[event] += n


def register_cache(name: str, cache) -> None:
    caches[name] = cache


def metrics() -> dict:
    """A snapshot: ``native`` / ``fallback`` call counts per op, ``device_ns`` and ``programs`` per user-facing op
    (the outermost op dispatched to neuron; ``device_ns_inner``: op -> its inner ops' share of it), and totals;
    ``caches``: the entries, capacity, hits, misses and evictions of each bounded cache (``launch``: prepared
    launches)."""
    return {
        "native": dict(native_calls),
        "fallback": dict(fallback_calls),
        "device_ns": dict(device_ns),
        "device_ns_inner": {op: dict(inner) for op, inner in inner_ns.items()},
        "programs": dict(launches),
        "device_ns_total": sum(device_ns.values()),
        "native_ops": len(native_calls),
        "fallback_ops": len(fallback_calls),
        "compile": dict(compile_counts),
        "caches": {name: cache.stats() for name, cache in caches.items()},
    }


def reset_metrics() -> None:
    for counter in (native_calls, fallback_calls, device_ns, launches, compile_counts, inner_ns):
        counter.clear()
    for cache in caches.values():
        cache.reset_stats()


def top_ops(n: int = 10) -> list[tuple[str, float, int]]:
    """The ``n`` ops with the most device time: (op, device ns, calls)."""
    ranked = sorted(device_ns.items(), key=lambda kv: -kv[1])[:n]
    return [(op, ns, native_calls[op]) for op, ns in ranked]
