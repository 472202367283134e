"""Placing a traced kernel's tiles in SBUF and PSUM.

Every tile lives from the instruction that first touches it to the one that last does. Space is
handed out in order of first use; freed space is reused oldest-freed first, so tiles made in a
loop rotate through as many buffers as fit (double or deeper buffering for free, and the longest
distance between a buffer's reuses). A tile created with ``bufs=k`` rotates through exactly k
buffers shared by every tile made at the same source line. PSUM is handed out in whole banks so an
accumulation never straddles two.
"""

from __future__ import annotations

import heapq

from neuron_hal import Profile, Space

from .errors import KernelError
from .tensors import Buffer

SBUF_ALIGN = 64  # bytes; keeps every tile's rows on DMA-friendly boundaries


class _Region:
    """Free intervals of one partition's bytes, each with the time it was freed."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free: list[list[int]] = [[0, capacity, -1]]  # [start, end, freed_at], sorted by start

    def take(self, size: int) -> int | None:
        fits = [f for f in self.free if f[1] - f[0] >= size]
        if not fits:
            self._coalesce()  # neighbours keep their own free times until space runs short
            fits = [f for f in self.free if f[1] - f[0] >= size]
            if not fits:
                return None
        best = min(fits, key=lambda f: (f[2], f[0]))
        start = best[0]
        best[0] += size
        if best[0] == best[1]:
            self.free.remove(best)
        return start

    def reserve(self, start: int, size: int) -> None:
        """Take [start, start + size) out of the free space for good (a tile the kernel placed itself)."""
        end, kept = start + size, []
        for f in self.free:
            if f[1] <= start or f[0] >= end:
                kept.append(f)
                continue
            kept += [[f[0], start, f[2]]] if f[0] < start else []
            kept += [[end, f[1], f[2]]] if f[1] > end else []
        self.free = kept

    def give(self, start: int, size: int, now: int) -> None:
        self.free.append([start, start + size, now])
        self.free.sort()

    def _coalesce(self) -> None:
        if not self.free:
            return
        merged = [self.free[0]]
        for f in self.free[1:]:
            last = merged[-1]
            if f[0] == last[1]:
                last[1], last[2] = f[1], max(last[2], f[2])
            else:
                merged.append(f)
        self.free = merged

    def in_use(self) -> int:
        return self.capacity - sum(f[1] - f[0] for f in self.free)


def _unit(space: Space, profile: Profile) -> int:
    return profile.psum_bank_bytes if space is Space.PSUM else SBUF_ALIGN


def _rounded(buf: Buffer, profile: Profile) -> int:
    unit = _unit(buf.space, profile)
    return -(-buf.nbytes // unit) * unit


def allocate(kernel: str, buffers: list[Buffer], uses: list[list[int]], profile: Profile) -> dict[str, int]:
    """Set ``buffer.base`` for every buffer; ``uses[i]`` lists the buffer ids instruction i touches.

    Returns the peak bytes per partition used in each space.
    """
    first, last = {}, {}
    for i, ids in enumerate(uses):
        for b in ids:
            first.setdefault(b, i)
            last[b] = i
    regions = {Space.SBUF: _Region(profile.sbuf_partition_bytes), Space.PSUM: _Region(profile.psum_partition_bytes)}
    peak = {Space.SBUF: 0, Space.PSUM: 0}
    rings: dict[tuple, list[Buffer]] = {}
    turns: dict[tuple, int] = {}
    live: list[tuple[int, int, Buffer]] = []  # heap of (last use, id, buffer)
    for buf in buffers:
        if buf.pinned:
            regions[buf.space].reserve(buf.base, _rounded(buf, profile))
            peak[buf.space] = max(peak[buf.space], regions[buf.space].in_use())
    for buf in sorted((b for b in buffers if b.id in first and not b.pinned), key=lambda b: first[b.id]):
        size = _rounded(buf, profile)
        ring = rings.setdefault(buf.pool, []) if buf.pool is not None else None
        if ring is not None and len(ring) == buf.pool[1]:
            other = ring[turns.get(buf.pool, 0) % len(ring)]
            turns[buf.pool] = turns.get(buf.pool, 0) + 1
            if size > _rounded(other, profile):
                raise KernelError(f"kernel {kernel!r}: tile {buf.name} ({buf.where}) is larger than the "
                                  f"{len(ring)} rotating buffers made at that line")
            buf.base = other.base
            continue
        while live and live[0][0] < first[buf.id]:
            t, _, done = heapq.heappop(live)
            regions[done.space].give(done.base, _rounded(done, profile), t)
        region = regions[buf.space]
        start = region.take(size)
        if start is None:
            held = sorted((b for _, _, b in live if b.space is buf.space), key=lambda b: -b.nbytes)
            held += [b for r in rings.values() for b in r if b.space is buf.space]
            top = ", ".join(f"{b.name} {b.nbytes} B ({b.where})" for b in held[:4])
            raise KernelError(
                f"kernel {kernel!r}: {buf.space.value.upper()} overflow at {buf.where}: tile {buf.name} needs "
                f"{size} bytes per partition, {region.capacity - region.in_use()} of {region.capacity} are free "
                f"(largest live tiles: {top}); use smaller tiles or fewer buffers"
            )
        buf.base = start
        peak[buf.space] = max(peak[buf.space], region.in_use())
        if ring is not None:
            ring.append(buf)  # ring members stay allocated for the whole kernel
        else:
            heapq.heappush(live, (last[buf.id], buf.id, buf))
    return {s.value: v for s, v in peak.items()}
