"""A bounded cache: the least recently used entry goes when a new one would exceed the capacity.

The caches keyed by argument shapes (a kernel's traced programs, torch-neuron's prepared launches) use it, so a job
whose shapes change every step holds a bounded number of programs instead of one per shape it ever saw. Hits,
misses and evictions are counted for the metrics.
"""

from __future__ import annotations

from collections import OrderedDict


class LRU:
    def __init__(self, capacity: int):
        self._entries: OrderedDict = OrderedDict()
        self._capacity = _positive(capacity)
        self.hits = self.misses = self.evictions = 0

    def get(self, key, default=None):
        """The entry of ``key`` (now the most recently used), else ``default``; counted as a hit or a miss."""
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        self._recent(key)
        return value

    def touch(self, key) -> None:
        """Make ``key``'s entry the most recently used (a hit), if there is one: for users that found the value
        without looking it up here."""
        if key in self._entries:
            self.hits += 1
            self._recent(key)

    def _recent(self, key) -> None:
        try:
            self._entries.move_to_end(key)
        except KeyError:  # another thread evicted it meanwhile: nothing to keep
            pass

    def __setitem__(self, key, value) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        self._shrink()

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def values(self):
        return self._entries.values()

    def clear(self) -> None:
        self._entries.clear()

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, n: int) -> None:
        self._capacity = _positive(n)
        self._shrink()

    def _shrink(self) -> None:
        while len(self._entries) > self._capacity:
            try:
                self._entries.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
            self.evictions += 1

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "capacity": self._capacity, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}

    def reset_stats(self) -> None:
        self.hits = self.misses = self.evictions = 0


_MISSING = object()


def _positive(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"an LRU cache's capacity must be a positive integer, got {n!r}")
    return n
