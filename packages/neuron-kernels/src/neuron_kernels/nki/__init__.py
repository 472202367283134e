"""NKI (the Neuron Kernel Interface, ``import nki``) on neuron-kernels' tracer and the simulator.

Unmodified kernels written against NKI's current API (``nki.jit``, ``nki.language``, ``nki.isa``) trace into the
same ISA programs as the kernel library and run on the selected neuron-hal driver (the simulator by default), with
values and simulated device time::

    import nki, nki.language as nl, nki.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ...
        return out

    add(x, y)                                     # numpy or torch in, the same type out
    nki.simulate(add)(x, y)                       # the same, as NKI spells simulation
    bench = nki.benchmark(warmup=1, iters=3)(add); bench(x, y)
    bench.benchmark_result.nc_latency.get_latency_percentile(50)   # simulated device time, us

``import nki`` resolves here only when AWS's package is absent (see ``_neuron_kernels_nki``); ``install()`` registers
that answer explicitly and ``install(override=True)`` replaces an installed ``nki`` in ``sys.modules`` (for test
harnesses that swap the NKI modules).
"""

from __future__ import annotations

import functools

import _neuron_kernels_nki as _finder
import numpy as np

from neuron_hal import DType, ExecutionReport

from ..errors import KernelError
from ..jit import Kernel, _reshaped
from ..tensors import View
from ..tracer import builder
from . import api, isa, isa_constants, language, spmd, typing
from .api import NkiNotImplemented, missing

__neuron_kernels_nki__ = True  # how a program tells this front end from AWS's nki
__all__ = ["benchmark", "dtype", "install", "isa", "jit", "language", "simulate", "typing"]
isa.constants = isa_constants  # nki.isa.constants
dtype = DType  # nki.dtype: the type of nl's dtypes


def install(override: bool = False) -> None:
    """Answer ``import nki`` with this front end when no other ``nki`` is importable; ``override=True`` puts it in
    ``sys.modules`` in place of any other (an explicit opt-in)."""
    _finder.register()
    if override:
        _finder.alias(override=True)


# -- arguments and results in the caller's types --------------------------------------------------------------------
def _torch():
    import sys

    return sys.modules.get("torch")


def _to_numpy(x):
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(DType.bfloat16.numpy)
        return t.numpy()
    return x


def _from_numpy(out: np.ndarray, like):
    torch = _torch()
    if torch is None or not isinstance(like, torch.Tensor):
        return out
    if out.dtype == DType.bfloat16.numpy:
        t = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(out)
    return t.to(like.device)


def _outputs_only(fn):
    """The kernel function, but HBM tensors it makes and does not return become per-run scratch (NKI: only a
    returned tensor is an output)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        result = fn(*args, **kwargs)
        outs = result if isinstance(result, tuple) else () if result is None else (result,)
        for o in outs:
            if isinstance(o, View) and not o.on_chip and not o.whole and not _reshaped(o):
                raise NkiNotImplemented(f"returning {o!r}, a slice or permuted view of an output tensor, is not "
                                        f"implemented by neuron-kernels' NKI front end (return the tensor or a "
                                        f"reshape of it)")
        returned = {o.owner.index for o in outs if isinstance(o, View) and not o.on_chip}
        for h in builder().handles:
            if h.role == "out" and h.index not in returned:
                h.role = "scratch"
        return result

    return traced


class NkiKernel:
    """``@nki.jit``: a kernel traced by neuron-kernels' tracer and run on the selected driver (the simulator)."""

    def __init__(self, fn, trace_path: str | None = None, grid: tuple[int, ...] | None = None):
        self.fn, self.grid = fn, grid
        body = fn if grid is None else spmd.launch(fn, grid)
        self.kernel = Kernel(_outputs_only(body), name=fn.__name__ if grid is None else
                             f"{fn.__name__}[{','.join(map(str, grid))}]")
        self.trace_path = trace_path  # write each run's Perfetto trace here
        self.last_report: ExecutionReport | None = None
        self._grids: dict[tuple[int, ...], NkiKernel] = {}
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        """``kernel[grid]`` / ``kernel[lnc]``: an SPMD launch, one instance per grid index, on one NeuronCore
        (see :mod:`.spmd`)."""
        if self.grid is not None:
            raise KernelError(f"{self.__name__}[{', '.join(map(str, self.grid))}] is already a launch grid")
        grid = spmd.normalize(grid)
        if grid not in self._grids:
            self._grids[grid] = NkiKernel(self.fn, self.trace_path, grid)
        return self._grids[grid]

    def run(self, args, kwargs, trace: bool = False):
        likes = [*args, *kwargs.values()]
        np_args = [_to_numpy(a) for a in args]
        np_kwargs = {k: _to_numpy(v) for k, v in kwargs.items()}
        out = self.kernel.run(np_args, np_kwargs, trace=trace or self.trace_path is not None)
        self.last_report = self.kernel.last_report
        self._write_back(args, kwargs, np_args, np_kwargs)
        if self.trace_path is not None:
            self.last_report.save_trace(self.trace_path)
        like = next((a for a in likes if _torch() is not None and isinstance(a, _torch().Tensor)), None)
        if isinstance(out, tuple):
            return tuple(_from_numpy(o, like) for o in out)
        return None if out is None else _from_numpy(out, like)

    def _write_back(self, args, kwargs, np_args, np_kwargs) -> None:
        """Torch tensors the kernel wrote (inout arguments) get the result, when their host copy was not a view."""
        torch = _torch()
        if torch is None:
            return
        given = self.kernel.signature.bind(*args, **kwargs).arguments
        host = self.kernel.signature.bind(*np_args, **np_kwargs).arguments
        roles = {a.name: a.role for a in self.kernel.trace(*np_args, **np_kwargs).args}
        for name, value in given.items():
            if isinstance(value, torch.Tensor) and roles.get(name) == "inout":
                written = _from_numpy(np.ascontiguousarray(host[name]), value)
                if written.data_ptr() != value.data_ptr():
                    with torch.no_grad():
                        value.copy_(written)

    def __call__(self, *args, **kwargs):
        return self.run(args, kwargs)

    def program(self, *args, **kwargs):
        """The traced ISA program for these arguments (arrays or TensorSpecs), without running it."""
        return self.kernel.trace(*[_to_numpy(a) for a in args], **{k: _to_numpy(v) for k, v in kwargs.items()})


# compiler diagnostics options: they change what NKI's compiler reports, not what a kernel computes
_DIAGNOSTIC_OPTIONS = {"debug_kernel", "show_compiler_tb", "experimental_flags"}


def jit(func=None, mode: str = "auto", platform_target=None, **kwargs):
    """``@nki.jit`` / ``@nki.jit(...)``: compile (trace) a top-level NKI kernel; calls run it on the simulator.
    The compiler-diagnostics options (``debug_kernel``, ``show_compiler_tb``, ``experimental_flags``) are accepted
    and have nothing to do here; any other option raises NotImplementedError."""
    unknown = sorted(set(kwargs) - _DIAGNOSTIC_OPTIONS)
    if unknown:
        raise NkiNotImplemented(f"nki.jit options {unknown} are not implemented by neuron-kernels' NKI front end")
    if func is None:
        return lambda f: NkiKernel(f)
    return func if isinstance(func, NkiKernel) else NkiKernel(func)


def simulate(kernel, trace_path: str | None = None):
    """NKI's ``nki.simulate(kernel)``: a callable computing the kernel's outputs on the simulator (numpy or torch,
    as given). Unlike NKI's CPU simulator it also times the kernel: ``.last_report`` is the execution report
    (``device_ns``, engine utilization); ``trace_path=`` (an extension) writes each run's Perfetto trace."""
    k = kernel if isinstance(kernel, NkiKernel) else NkiKernel(kernel)
    return NkiKernel(k.fn, trace_path=trace_path) if trace_path is not None else k


class LatencyStats:
    """``nc_latency``: simulated device time of the benchmarked iterations, in microseconds."""

    def __init__(self, samples_us: list[float]):
        self.samples_us = list(samples_us)

    def get_latency_percentile(self, percentile: float) -> float:
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile {percentile} is not in [0, 100]")
        return float(np.percentile(self.samples_us, percentile))


class BenchmarkResult:
    def __init__(self, samples_us: list[float]):
        self.nc_latency = LatencyStats(samples_us)


class Benchmarked:
    """What ``nki.benchmark`` returns: call it like the kernel; ``benchmark_result`` holds the latency statistics."""

    def __init__(self, kernel: NkiKernel, warmup: int, iters: int, save_trace_name: str | None):
        self.kernel, self.warmup, self.iters, self.save_trace_name = kernel, warmup, iters, save_trace_name
        self.benchmark_result: BenchmarkResult | None = None

    def __call__(self, *args, **kwargs):
        for _ in range(self.warmup):
            self.kernel.run(args, kwargs)
        samples, out = [], None
        for i in range(self.iters):
            out = self.kernel.run(args, kwargs, trace=self.save_trace_name is not None and i == self.iters - 1)
            samples.append(self.kernel.last_report.device_ns / 1e3)
        if self.save_trace_name is not None:
            self.kernel.last_report.save_trace(self.save_trace_name)
        self.benchmark_result = BenchmarkResult(samples)
        p50, p99 = (self.benchmark_result.nc_latency.get_latency_percentile(p) for p in (50, 99))
        print(f"nki.benchmark {self.kernel.__name__}: simulated device latency P50 {p50:.3f} us, P99 {p99:.3f} us "
              f"over {self.iters} iterations")
        return out


def benchmark(kernel=None, warmup: int = 5, iters: int = 10, save_neff_name: str | None = None,
              save_trace_name: str | None = None, additional_compile_opt: str | None = None):
    """NKI's ``nki.benchmark``, on simulated device time: ``warmup`` runs, then ``iters`` timed ones;
    ``save_trace_name`` writes the last run's Perfetto (Chrome JSON) trace."""
    if save_neff_name is not None or additional_compile_opt is not None:
        raise NkiNotImplemented("nki.benchmark(save_neff_name=/additional_compile_opt=): there is no NEFF here")
    if iters < 1 or warmup < 0:
        raise ValueError(f"nki.benchmark: iters={iters} must be >= 1 and warmup={warmup} >= 0")

    def wrap(k):
        return Benchmarked(jit(k), warmup, iters, save_trace_name)

    return wrap if kernel is None else wrap(kernel)


for _name, (_status, _why) in api.API["nki"].items():
    if _status == "missing" and _name not in globals():
        globals()[_name] = missing(f"nki.{_name}", _why)
