"""A small in-process LRU model with the same limits and counters as SharedCache: the oracle of the behaviour tests
and of the state machine in test_properties.py."""

from __future__ import annotations

from collections import OrderedDict

from shmcache.codec import encode_key, encode_value


class ReferenceLRU:
    def __init__(self, max_entries: int, max_retained_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_retained_bytes = max_retained_bytes
        self.data: OrderedDict[bytes, tuple[object, int]] = OrderedDict()  # key bytes -> (value, size); last = MRU
        self.counters = dict(hits=0, misses=0, puts=0, updates=0, deletes=0, evictions=0, clears=0)
        self.retained = 0

    def get(self, key, default=None):
        kb = encode_key(key)
        if kb in self.data:
            self.data.move_to_end(kb)
            self.counters["hits"] += 1
            return self.data[kb][0]
        self.counters["misses"] += 1
        return default

    def put(self, key, value) -> None:
        kb = encode_key(key)
        size = len(kb) + len(encode_value(value))
        if size > self.max_retained_bytes:
            raise ValueError("too large")
        if kb in self.data:
            self.retained -= self.data.pop(kb)[1]
            self.counters["updates"] += 1
        self._evict(extra_entries=1, extra_bytes=size)
        self.data[kb] = (value, size)
        self.retained += size
        self.counters["puts"] += 1

    def delete(self, key) -> bool:
        kb = encode_key(key)
        if kb not in self.data:
            return False
        self.retained -= self.data.pop(kb)[1]
        self.counters["deletes"] += 1
        return True

    def add(self, key, value) -> bool:
        if encode_key(key) in self.data:
            self._check_size(key, value)
            return False
        self.put(key, value)
        return True

    def replace(self, key, value) -> bool:
        if encode_key(key) not in self.data:
            self._check_size(key, value)
            return False
        self.put(key, value)
        return True

    def pop(self, key, default=None):
        kb = encode_key(key)
        if kb not in self.data:
            self.counters["misses"] += 1
            return default
        value, size = self.data.pop(kb)
        self.retained -= size
        self.counters["hits"] += 1
        self.counters["deletes"] += 1
        return value

    def incr(self, key, delta: int):
        """The new value, or the exception SharedCache.incr raises (nothing changes then)."""
        kb = encode_key(key)
        current = self.data[kb][0] if kb in self.data else 0
        if type(current) is not int:
            return TypeError
        try:
            self.put(key, current + delta)
        except ValueError:
            return ValueError
        return current + delta

    def _check_size(self, key, value) -> None:
        if len(encode_key(key)) + len(encode_value(value)) > self.max_retained_bytes:
            raise ValueError("too large")

    def set_limits(self, max_entries: int, max_retained_bytes: int) -> None:
        self.max_entries, self.max_retained_bytes = max_entries, max_retained_bytes
        self._evict(0, 0)

    def clear(self) -> None:
        clears = self.counters["clears"] + 1
        self.data.clear()
        self.retained = 0
        self.counters = dict.fromkeys(self.counters, 0)
        self.counters["clears"] = clears

    def _evict(self, extra_entries: int, extra_bytes: int) -> None:
        while self.data and (
            len(self.data) + extra_entries > self.max_entries or self.retained + extra_bytes > self.max_retained_bytes
        ):
            _, (_, size) = self.data.popitem(last=False)
            self.retained -= size
            self.counters["evictions"] += 1

    def keys_lru_order(self) -> list[bytes]:
        """Encoded keys, least recently used first."""
        return list(self.data)
