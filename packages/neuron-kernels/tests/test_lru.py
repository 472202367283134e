"""The bounded cache of traced programs and launches: least recently used out first, counted."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_kernels.lru import LRU


def test_the_least_recently_used_entry_goes_first():
    c = LRU(2)
    c["a"], c["b"] = 1, 2
    assert c.get("a") == 1  # "b" is now the oldest
    c["c"] = 3
    assert "b" not in c and c.get("a") == 1 and c.get("c") == 3
    c.touch("a")  # "c" is the oldest
    c["d"] = 4
    assert set(c._entries) == {"a", "d"}
    assert c.stats() == {"entries": 2, "capacity": 2, "hits": 4, "misses": 0, "evictions": 2}
    assert c.get("b", "gone") == "gone" and c.misses == 1


def test_lowering_the_capacity_evicts_and_a_bad_capacity_is_refused():
    c = LRU(4)
    for k in range(4):
        c[k] = k
    c.capacity = 1
    assert list(c._entries) == [3] and c.evictions == 3
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="positive integer"):
            LRU(bad)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5), st.lists(st.tuples(st.booleans(), st.integers(0, 8)), max_size=60))
def test_matches_a_list_model_of_recency(capacity, ops):
    c, model = LRU(capacity), []  # model: keys, least recent first
    for put, k in ops:
        if put:
            c[k] = -k
            model = [x for x in model if x != k] + [k]
            model = model[-capacity:]
        else:
            assert c.get(k) == (-k if k in model else None)
            if k in model:
                model = [x for x in model if x != k] + [k]
        assert list(c._entries) == model
