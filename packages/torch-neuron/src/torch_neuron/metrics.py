"""What ran where: ops run natively, CPU fallbacks per op, and device time per op."""

from __future__ import annotations

from collections import Counter, defaultdict

native_calls: Counter[str] = Counter()
fallback_calls: Counter[str] = Counter()
device_ns: defaultdict[str, float] = defaultdict(float)
launches: Counter[str] = Counter()
compile_counts: Counter[str] = Counter()  # graphs and fused regions compiled, program cache hits and misses
observers: list = []  # callables (op, ns) told of every native op, e.g. an active profiler
report_observers: list = []  # callables (op, ExecutionReport) told of every program launched, e.g. telemetry
caches: dict = {}  # name -> bounded cache (neuron_kernels.lru.LRU) reported in metrics()["caches"]


def record_native(op: str, ns: float, programs: int = 1, report=None) -> None:
    native_calls[op] += 1
    device_ns[op] += ns
    if programs:  # an op inside a compiled graph launches none of its own (the graph is the program)
        launches[op] += programs
    for observe in observers:
        observe(op, ns)
    if report is not None and not report.in_graph:  # a graph's launches are reported as its one program
        for observe in report_observers:
            observe(op, report)


def record_compile(event: str, n: int = 1) -> None:
    compile_counts[event] += n


def register_cache(name: str, cache) -> None:
    caches[name] = cache


def metrics() -> dict:
    """A snapshot: ``native`` / ``fallback`` call counts per op, ``device_ns`` per op, and totals; ``caches``: the
    entries, capacity, hits, misses and evictions of each bounded cache (``launch``: prepared launches)."""
    return {
        "native": dict(native_calls),
        "fallback": dict(fallback_calls),
        "device_ns": dict(device_ns),
        "programs": dict(launches),
        "device_ns_total": sum(device_ns.values()),
        "native_ops": len(native_calls),
        "fallback_ops": len(fallback_calls),
        "compile": dict(compile_counts),
        "caches": {name: cache.stats() for name, cache in caches.items()},
    }


def reset_metrics() -> None:
    for counter in (native_calls, fallback_calls, device_ns, launches, compile_counts):
        counter.clear()
    for cache in caches.values():
        cache.reset_stats()


def top_ops(n: int = 10) -> list[tuple[str, float, int]]:
    """The ``n`` ops with the most device time: (op, device ns, calls)."""
    ranked = sorted(device_ns.items(), key=lambda kv: -kv[1])[:n]
    return [(op, ns, native_calls[op]) for op, ns in ranked]
