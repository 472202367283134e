"""Random numbers on the device: ``uniform_``, ``normal_``, ``bernoulli_``/``bernoulli``, ``random_``,
``native_dropout`` and its backward, on the counter-based ``random`` kernels.

Each call reserves ``count`` counters of its generator (``torch.neuron.manual_seed`` / a
``torch.Generator("neuron")``: a 64-bit seed and offset) and hands the kernel a 2-word state
(key, counter) made from them: the key folds the seed and the offset's high word, the counter is the
offset's low word, and a call never runs its counters across a 2**32 boundary (it moves to the next
block instead), so no two calls of one generator share a (key, counter) pair. Streams are
reproducible for a seed but differ from CPU's (as CUDA's do).

Values are made ``TILE`` elements at a time and written into the tensor piece by piece (``_fill``), so a call
needs its output and a few pieces of scratch (a randn: six float32 pieces, 24 MiB) rather than several
output-sized temporaries; each element's counters are those of one kernel over the whole tensor, so the values
do not depend on the piece size. Float results are made in fp32 and rounded once into the tensor's dtype.
normal_ is Box-Muller, ``sqrt(-2 log(1 - u1)) * cos(2 pi u2 - pi)`` with u1 the call's first ``numel`` values
and u2 the next (1 - u1 is in (0, 1]; the cosine argument stays in [-pi, pi)). random_ draws a 32-bit word per
element and reduces it mod the range (as torch's CPU generator does for ranges below 2**32), exactly in the
engines' integer mode. Calls the kernels cannot serve (float64, ranges of 2**32 or more, ...) run on the CPU
with a CPU generator seeded from the same reservation, so they stay reproducible too.
"""

from __future__ import annotations

import math

import torch

from neuron_kernels.library import elementwise, movement, reduce
from neuron_kernels.library import random as rk

from ...random import reserve
from ..core.checks import same_device
from ..core.compose import ew, write_outs
from ..core.copy import to_host, write_contiguous
from ..core.dtypes import FLOATS
from ..core.fallback import on_cpu
from ..core.launch import run, run_into
from ..core.variants import contig

aten = torch.ops.aten
BLOCK = 1 << 32
GOLDEN = 0x9E3779B9
DIGITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}
INTS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


# -- generator state --------------------------------------------------------------------------------
def _check_generator(generator, device: torch.device) -> None:
    if generator is not None and generator.device.type != "neuron":
        raise RuntimeError(f"Expected a 'neuron' device type for generator but found '{generator.device.type}'")


def _reserve(generator, count: int, device: torch.device) -> tuple[int, int]:
    seed, offset = reserve(generator, count, device.index)
    start = offset % BLOCK
    if start + count > BLOCK:  # the 32-bit counter would wrap under one key: use the next block's start
        pad = BLOCK - start
        reserve(generator, pad, device.index)  # [offset, offset + count + pad) is ours, so is offset + pad..
        offset += pad
    return seed, offset


def _key(seed: int, offset: int) -> int:
    return (seed ^ (seed >> 32) ^ ((offset // BLOCK) * GOLDEN)) % BLOCK


def _draws(generator, count: int, device: torch.device) -> tuple[int, int]:
    """(key, first counter) of ``count`` fresh values of ``generator``: counters first .. first + count - 1."""
    _check_generator(generator, device)
    seed, offset = _reserve(generator, count, device)
    return _key(seed, offset), offset % BLOCK


def _state(key: int, counter: int, device: torch.device) -> torch.Tensor:
    """int32[2] (key, counter) on the device: the kernels' state for the values from ``counter`` on."""
    words = torch.tensor([key, counter], dtype=torch.int64).to(torch.uint32).view(torch.int32)
    out = torch.empty(2, dtype=torch.int32, device=device)
    write_contiguous(out, words)
    return out


def state(generator, count: int, device: torch.device) -> torch.Tensor:
    """int32[2] (key, counter) on the device for ``count`` fresh values of ``generator``."""
    return _state(*_draws(generator, count, device), device)


def host_generator(generator, count: int, device: torch.device) -> torch.Generator:
    """A CPU generator for a CPU-path call, seeded from this generator's reservation (reproducible)."""
    _check_generator(generator, device)
    seed, offset = reserve(generator, count, device.index)
    return torch.Generator().manual_seed((seed * 0x9E3779B97F4A7C15 + offset) % (1 << 63))


# -- generation in pieces ---------------------------------------------------------------------------
TILE = 1 << 20  # elements made per piece: the scratch of a call is a few pieces' worth, whatever its size


def _fill(op: str, self: torch.Tensor, generator, draws: int, piece) -> torch.Tensor:
    """Fill ``self`` with random values ``TILE`` elements at a time (its row-major order), so a call needs the
    output and a few pieces of scratch, not several output-sized temporaries. ``piece(dst, start, state)`` writes
    the values of the elements ``start ..`` into ``dst`` (a contiguous 1-d slice of the output); ``state(r)`` is the
    kernels' state for them in the call's ``r``-th stream of draws (each element takes ``draws`` values: element
    ``i`` has counter ``first + r * numel + i`` in stream ``r``, as one kernel over ``(draws, numel)`` gives, so
    the values do not depend on ``TILE``). A non-contiguous ``self`` is filled through a contiguous copy."""
    n, device = self.numel(), self.device
    key, first = _draws(generator, draws * n, device)
    target = self if self.is_contiguous() else torch.empty(self.shape, dtype=self.dtype, device=device)
    flat = target.view(-1)
    for a in range(0, n, TILE):
        size = min(TILE, n - a)
        piece(flat[a:a + size], a, lambda r=0, a=a: _state(key, first + r * n + a, device))
    if target is not self:
        self.copy_(target)
    return self


def _store(op: str, dst: torch.Tensor, t: torch.Tensor) -> None:
    """A piece's values ``t`` (computed in fp32, int32 or bool) rounded once into ``dst``'s dtype, in place."""
    run_into([dst], op, movement.copy, t, dst.dtype)


def _cast(op: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else run(op, movement.copy, t, dtype)[0]


def _rand(op: str, size: int, state: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return run(op, rk.rand, (size,), state, dtype)[0]


# -- uniform / normal / bernoulli ---------------------------------------------------------------------
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    if self.dtype not in FLOATS or not _native(self) or not from_ <= to:
        return on_cpu(aten.uniform_.default, self, from_, to,
                      generator=host_generator(generator, self.numel(), self.device))
    if self.numel() == 0:
        return self
    op, span = "uniform_", float(to) - float(from_)

    def piece(dst, start, state):
        if (from_, to) == (0.0, 1.0):  # the kernel's own dtype grid: exact, never 1
            run_into([dst], op, rk.rand, (dst.numel(),), state(), dst.dtype)
        else:
            _store(op, dst, ew(op, elementwise.add, float(from_), _rand(op, dst.numel(), state()), alpha=span))

    return _fill(op, self, generator, 1, piece)


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    if self.dtype not in FLOATS or not _native(self, 2 * self.numel()) or std < 0:
        return on_cpu(aten.normal_.default, self, mean, std,
                      generator=host_generator(generator, self.numel(), self.device))
    if self.numel() == 0:
        return self
    op = "normal_"

    def piece(dst, start, state):
        n = dst.numel()
        if n == self.numel():  # both streams in one launch: u[r] has counters first + r * n + i
            u1, u2 = run(op, rk.rand, (2, n), state(0), torch.float32)[0]
        else:
            u1, u2 = _rand(op, n, state(0)), _rand(op, n, state(1))
        radius = ew(op, elementwise.sqrt, ew(op, elementwise.mul, ew(op, elementwise.log,
                                                                     ew(op, elementwise.sub, 1.0, u1)), -2.0))
        angle = ew(op, elementwise.add, -math.pi, u2, alpha=2 * math.pi)
        z = ew(op, elementwise.mul, radius, ew(op, elementwise.cos, angle))
        _store(op, dst, ew(op, elementwise.add, float(mean), z, alpha=float(std)))

    return _fill(op, self, generator, 2, piece)


def _normal_of(op, mean, std, generator):
    """normal(mean, std) with a tensor mean and/or std (broadcast): mean + std * z, z from ``normal_``."""
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    same_device(*tensors)
    if any(t.dtype not in FLOATS for t in tensors):
        return None
    if isinstance(std, torch.Tensor) and std.numel():
        low = run(op, reduce.amin, contig(std), (), False)[0]
        if not to_host(low).item() >= 0:
            raise RuntimeError("normal expects all elements of std >= 0.0")
    elif not isinstance(std, torch.Tensor) and std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    z = normal_(torch.empty(shape, device=tensors[0].device), generator=generator)
    args = [contig(t) if isinstance(t, torch.Tensor) else float(t) for t in (mean, std)]
    scaled = ew(op, elementwise.mul, z, args[1])
    return _cast(op, ew(op, elementwise.add, args[0], scaled), tensors[0].dtype)


def normal_tensor_float(mean, std=1.0, *, generator=None):
    out = _normal_of("normal", mean, std, generator)
    return out if out is not None else on_cpu(aten.normal.Tensor_float, mean, std, generator=host_generator(
        generator, mean.numel(), mean.device))


def normal_float_tensor(mean, std, *, generator=None):
    out = _normal_of("normal", mean, std, generator)
    return out if out is not None else on_cpu(aten.normal.float_Tensor, mean, std, generator=host_generator(
        generator, std.numel(), std.device))


def normal_tensor_tensor(mean, std, *, generator=None):
    out = _normal_of("normal", mean, std, generator)
    return out if out is not None else on_cpu(aten.normal.Tensor_Tensor, mean, std, generator=host_generator(
        generator, mean.numel(), mean.device))


def _check_probabilities(op: str, p: torch.Tensor) -> None:
    """torch's CPU refuses probabilities outside [0, 1] (NaN included) rather than drawing from them."""
    lo, hi = (to_host(run(op, k, p, (), False)[0]).item() for k in (reduce.amin, reduce.amax))  # NaN propagates
    if not (lo >= 0 and hi <= 1):
        raise RuntimeError(f"{op} expects all elements of p to be in [0, 1], but found p={lo if not lo >= 0 else hi}")


def _bernoulli_into(op: str, self, p, generator):
    if self.numel() == 0:
        return self
    if isinstance(p, torch.Tensor):
        if p.numel():
            _check_probabilities(op, p)
        p = contig(p.expand(self.shape)).view(-1)  # the probability of each element (a copy if p broadcasts)

    def piece(dst, start, state):
        pk = p[start:start + dst.numel()] if isinstance(p, torch.Tensor) else p
        _store(op, dst, ew(op, elementwise.lt, _rand(op, dst.numel(), state()), pk))

    return _fill(op, self, generator, 1, piece)


def _native(t: torch.Tensor, draws: int | None = None) -> bool:
    """A dtype the device holds and counters that fit one 32-bit block."""
    return t.dtype in (*FLOATS, *INTS) and (t.numel() if draws is None else draws) <= BLOCK


def bernoulli_float(self, p=0.5, *, generator=None):
    if not _native(self) or not 0 <= p <= 1:
        return on_cpu(aten.bernoulli_.float, self, p, generator=host_generator(generator, self.numel(), self.device))
    return _bernoulli_into("bernoulli_", self, float(p), generator)


def bernoulli_tensor(self, p, *, generator=None):
    if not _native(self) or p.dtype not in FLOATS or p.device != self.device:
        return on_cpu(aten.bernoulli_.Tensor, self, p, generator=host_generator(generator, self.numel(), self.device))
    return _bernoulli_into("bernoulli_", self, contig(p), generator)


def bernoulli(self, *, generator=None):
    """0/1 draws with probabilities ``self`` (a float tensor), in self's dtype."""
    if self.dtype not in FLOATS or not _native(self):
        return on_cpu(aten.bernoulli.default, self, generator=host_generator(generator, self.numel(), self.device))
    out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    return _bernoulli_into("bernoulli", out, contig(self), generator)


# -- random_ ------------------------------------------------------------------------------------------
def _default_to(dtype: torch.dtype) -> int | None:
    """torch's upper bound (exclusive) of random_() without ``to``; None where it needs 64-bit draws."""
    if dtype in DIGITS:
        return (1 << DIGITS[dtype]) + 1
    if dtype == torch.bool:
        return 2
    return torch.iinfo(dtype).max + 1 if dtype in INTS[1:-1] else None


def _random_native(t: torch.Tensor, lo: int, hi: int) -> bool:
    """[lo, hi) drawn exactly from 32-bit words: a range of at most 2**32 whose values fit int32 and the
    dtype (torch raises for the others, on the CPU path)."""
    if not _native(t) or not 0 < hi - lo <= BLOCK or lo < -(2**31) or hi - 1 >= 2**31:
        return False
    if t.dtype in DIGITS:
        return -(1 << DIGITS[t.dtype]) <= lo and hi - 1 <= 1 << DIGITS[t.dtype]
    if t.dtype == torch.bool:
        return 0 <= lo and hi <= 2
    info = torch.iinfo(t.dtype)
    return info.min <= lo and hi - 1 <= info.max


def random_from(self, from_, to=None, *, generator=None):
    hi = _default_to(self.dtype) if to is None and self.dtype in (*FLOATS, *INTS) else to
    if hi is None or not _random_native(self, int(from_), int(hi)):
        return on_cpu(getattr(aten.random_, "from"), self, from_, to,
                      generator=host_generator(generator, self.numel(), self.device))
    if self.numel() == 0:
        return self
    op, span = "random_", int(hi) - int(from_)

    def piece(dst, start, state):
        bits = run(op, rk.random_bits, (dst.numel(),), state())[0]
        if span < BLOCK:
            bits = ew(op, elementwise.remainder, bits, span)
        if from_ % BLOCK:
            bits = ew(op, elementwise.add, bits, int(from_) % BLOCK)  # uint32 wraps: the int32 bits of the value
        _store(op, dst, bits.view(torch.int32))

    return _fill(op, self, generator, 1, piece)


def random_to(self, to, *, generator=None):
    return random_from(self, 0, to, generator=generator)


def random_all(self, *, generator=None):
    return random_from(self, 0, None, generator=generator)


# -- dropout --------------------------------------------------------------------------------------------
def native_dropout(input, p, train=None):  # noqa: A002
    if input.dtype not in FLOATS or not _native(input) or not 0 <= p <= 1:
        return on_cpu(aten.native_dropout.default, input, p, train)
    if input.numel() == 0:
        return torch.empty_like(input), torch.empty(input.shape, dtype=torch.bool, device=input.device)
    training = train is None or bool(train)
    seed = state(None, input.numel() if training else 0, input.device)
    return tuple(run("native_dropout", rk.dropout, contig(input), float(p), seed, training))


def native_dropout_backward(grad_output, mask, scale):
    same_device(grad_output, mask)
    if grad_output.dtype not in FLOATS or mask.dtype != torch.bool or grad_output.shape != mask.shape:
        return on_cpu(aten.native_dropout_backward.default, grad_output, mask, scale)
    if grad_output.numel() == 0:
        return torch.empty_like(grad_output)
    return run("native_dropout_backward", rk.dropout_backward, contig(grad_output), contig(mask), float(scale))[0]


def _dropout_out(input, p, train, *, out0, out1):  # noqa: A002
    return write_outs((out0, out1), native_dropout(input, p, train))
