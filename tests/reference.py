"""A small in-process model of SharedCache with the same limits, counters, expiry, versions, kinds and pins: the
oracle of the state machine in test_properties.py.

Time comes from ``clock`` (ns), as for SharedCache, so a test drives both with one fake clock. Errors the cache
raises are raised here as ``TooLarge`` (TooLargeError), KeyError, TypeError or ValueError, after the same side
effects the cache has made by then (an expired entry dropped, evictions done)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from shmcache import KindStats
from shmcache.cache import ttl_ns
from shmcache.codec import encode_key, encode_value

KIND_PREFIX = 0xF5
COUNTERS = ("hits", "misses", "puts", "updates", "deletes", "evictions", "expired", "clears", "computations",
            "waits", "takeovers", "too_large", "not_admitted")
MISSING = object()


class TooLarge(ValueError):
    """The entry exceeds the capacity or the byte limit: SharedCache raises TooLargeError."""


class Pinned(Exception):
    """Only pinned (or held) entries are left to evict (raised by ``_make_room``, and caught: SharedCache raises
    nothing, it leaves the entry unstored, or holds pinned entries aside under lowered limits)."""


@dataclass
class Entry:
    value: object
    size: int  # encoded key + value bytes
    expires: int  # clock ns; 0: never
    version: int
    kind: int


def key_bytes(key, kind: int = 0) -> bytes:
    """The encoded key: a key of kind ``kind`` is 0xF5, the kind number, then the key's own encoding."""
    kb = encode_key(key)
    return bytes((KIND_PREFIX, kind)) + kb if kind else kb


class ReferenceLRU:
    def __init__(self, max_entries: int, max_retained_bytes: int, *, capacity_bytes: int | None = None,
                 default_ttl: float | None = None, clock=lambda: 0) -> None:
        self.capacity_bytes = max_retained_bytes if capacity_bytes is None else capacity_bytes
        self.max_entries = max_entries
        self.max_retained_bytes = max_retained_bytes
        self.default_ttl_ns = 0 if default_ttl is None else ttl_ns(default_ttl)
        self.clock = clock
        self.data: OrderedDict[bytes, Entry] = OrderedDict()  # last = most recently used
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.retained = 0
        self.version_clock = 0  # the last version handed out; clear() keeps it
        self.kinds: dict[str, int] = {}  # name -> number, in registration order; clear() keeps them
        self.pinned: set[bytes] = set()  # keys of entries an open view pins, maintained by the caller
        # Entries a put, delete, pop or clear took out while a view pinned them: held aside for the view, counted
        # against the limits until it ends (``release``, the caller's; SharedCache gives them back at the next store,
        # before any limit is judged).
        self.held_n = 0
        self.held_bytes = 0
        self.expired_for_room = 0  # expired entries dropped because a store needed room (for test statistics)

    # ------------------------------------------------------------------------------------------- internals

    def _expired(self, e: Entry) -> bool:
        return bool(e.expires) and e.expires <= self.clock()

    def _drop(self, kb: bytes) -> Entry:
        e = self.data.pop(kb)
        self.retained -= e.size
        return e

    def _hold(self, kb: bytes) -> Entry:
        """Take the key's pinned entry out, held aside for its view."""
        e = self._drop(kb)
        self.held_n += 1
        self.held_bytes += e.size
        return e

    def release(self) -> None:
        """The views have ended: what they held goes back."""
        self.held_n = self.held_bytes = 0

    def _live(self, kb: bytes, to_insert: bool = False) -> Entry | None:
        """The key's entry; an expired one is dropped (counted) and reported absent. A pinned expired entry stays,
        but is held aside (counted) before an insert of its key."""
        e = self.data.get(kb)
        if e is None or not self._expired(e):
            return e
        if kb in self.pinned:
            if to_insert:
                self._hold(kb)
                self.counters["expired"] += 1
            return None
        self._drop(kb)
        self.counters["expired"] += 1
        return None

    def _size(self, kb: bytes, value) -> int:
        size = len(kb) + len(encode_value(value))
        if size > self.capacity_bytes:
            raise self._too_large(size)
        return size

    def _too_large(self, size: int) -> TooLarge:
        """The refusal of an entry of ``size`` bytes, counted (``too_large``) as SharedCache counts each one."""
        self.counters["too_large"] += 1
        return TooLarge(size)

    def _ttl(self, ttl) -> int:
        """Time to live in ns (None: the default); ValueError or TypeError for an invalid ``ttl``."""
        return self.default_ttl_ns if ttl is None else ttl_ns(ttl)

    def _at(self, ns: int) -> int:
        """Expiry of an entry stored now to live ``ns`` (0: never expires)."""
        return self.clock() + ns if ns else 0

    def _make_room(self, extra_entries: int, extra_bytes: int) -> None:
        """Every expired entry first, then the least recently used, pinned ones excepted; held entries count
        against the limits. Running out of entries to evict raises Pinned with the evictions done kept."""
        def fits() -> bool:
            return (len(self.data) + self.held_n + extra_entries <= self.max_entries
                    and self.retained + self.held_bytes + extra_bytes <= self.max_retained_bytes)

        if fits():
            return
        self.expired_for_room += self.expire()
        for kb in list(self.data):
            if fits():
                return
            if kb not in self.pinned:
                self._drop(kb)
                self.counters["evictions"] += 1
        if not fits():
            raise Pinned("no room")

    def _store(self, kb: bytes, value, size: int, expires: int) -> bool:
        """Store over the key's live entry, if any (held aside if a view pins it); whether it was stored. Should
        making room fail (Pinned), nothing is stored and it is counted in ``not_admitted``, the old entry staying
        removed and counted as an update, as in SharedCache."""
        if size > self.max_retained_bytes:
            raise self._too_large(size)
        if kb in self.data:
            self.counters["updates"] += 1
            if kb in self.pinned:
                self._hold(kb)
            else:
                self._drop(kb)
        try:
            self._make_room(1, size)
        except Pinned:
            self.counters["not_admitted"] += 1
            return False
        self.version_clock += 1
        self.data[kb] = Entry(value, size, expires, self.version_clock, kb[1] if kb and kb[0] == KIND_PREFIX else 0)
        self.retained += size
        self.counters["puts"] += 1
        return True

    def _store_if(self, kb: bytes, value, ttl, present: bool, version: int = 0) -> bool:
        size = self._size(kb, value)
        ns = self._ttl(ttl)
        e = self._live(kb, to_insert=not present)
        if size > self.max_retained_bytes:
            raise self._too_large(size)
        if (e is not None) != present or (version and e.version != version):
            return False
        return self._store(kb, value, size, self._at(ns))

    # ------------------------------------------------------------------------------------------- the cache's API

    def get(self, key, default=None, kind: int = 0):
        kb = key_bytes(key, kind)
        e = self._live(kb)
        if e is None:
            self.counters["misses"] += 1
            return default
        self.data.move_to_end(kb)
        self.counters["hits"] += 1
        return e.value

    def contains(self, key, kind: int = 0) -> bool:
        return self._live(key_bytes(key, kind)) is not None

    def put(self, key, value, ttl=None, kind: int = 0) -> bool:
        kb = key_bytes(key, kind)
        size = self._size(kb, value)
        ns = self._ttl(ttl)
        self._live(kb, to_insert=True)
        return self._store(kb, value, size, self._at(ns))

    def add(self, key, value, ttl=None, kind: int = 0) -> bool:
        return self._store_if(key_bytes(key, kind), value, ttl, present=False)

    def replace(self, key, value, ttl=None, kind: int = 0) -> bool:
        return self._store_if(key_bytes(key, kind), value, ttl, present=True)

    def cas(self, key, value, version: int, ttl=None, kind: int = 0) -> bool:
        return self._store_if(key_bytes(key, kind), value, ttl, present=True, version=version)

    def get_with_version(self, key, default=None, kind: int = 0) -> tuple:
        kb = key_bytes(key, kind)
        e = self._live(kb)
        if e is None:
            self.counters["misses"] += 1
            return default, None
        self.data.move_to_end(kb)
        self.counters["hits"] += 1
        return e.value, e.version

    def delete(self, key, kind: int = 0) -> bool:
        kb = key_bytes(key, kind)
        if self._live(kb) is None:
            return False
        if kb in self.pinned:
            self._hold(kb)
        else:
            self._drop(kb)
        self.counters["deletes"] += 1
        return True

    def pop(self, key, default=None, kind: int = 0):
        kb = key_bytes(key, kind)
        if self._live(kb) is None:
            self.counters["misses"] += 1
            return default
        self.counters["hits"] += 1
        self.counters["deletes"] += 1
        return (self._hold(kb) if kb in self.pinned else self._drop(kb)).value

    def incr(self, key, delta: int, initial: int | None = 0, kind: int = 0) -> int:
        """A counter keeps its expiry; a new one gets the default time to live."""
        kb = key_bytes(key, kind)
        e = self._live(kb, to_insert=initial is not None)
        if e is None:
            if initial is None:
                raise KeyError(key)
            current, expires = initial, self._at(self.default_ttl_ns)
        elif type(e.value) is not int:
            raise TypeError(type(e.value).__name__)
        else:
            current, expires = e.value, e.expires
        value = current + delta
        self._store(kb, value, self._size(kb, value), expires)
        return value

    def touch(self, key, ttl=None, kind: int = 0) -> bool:
        ns = self._ttl(ttl)
        e = self._live(key_bytes(key, kind))
        if e is None:
            return False
        e.expires = self._at(ns)
        return True

    def get_or_compute(self, key, fn, ttl=None, kind: int = 0):
        """The value, and whether ``fn`` was called (one process: no waits, no takeovers). An invalid ttl raises
        before anything is looked up."""
        if ttl is not None:
            ttl_ns(ttl)
        value = self.get(key, MISSING, kind)
        if value is not MISSING:
            return value, False
        self.counters["computations"] += 1
        value = fn()
        try:
            self.put(key, value, ttl, kind)
        except TooLarge:
            pass
        return value, True

    def view(self, key, kind: int = 0):
        """The value a view shows; counted as a lookup. A value neither bytes nor an array raises TypeError with
        nothing counted (an expired entry found is dropped first, as by any lookup)."""
        kb = key_bytes(key, kind)
        e = self._live(kb)
        if e is None:
            self.counters["misses"] += 1
            raise KeyError(key)
        if type(e.value) is not bytes and not isinstance(e.value, np.ndarray):
            raise TypeError(type(e.value).__name__)
        self.data.move_to_end(kb)
        self.counters["hits"] += 1
        return e.value

    def expire(self) -> int:
        doomed = [kb for kb, e in self.data.items() if self._expired(e) and kb not in self.pinned]
        for kb in doomed:
            self._drop(kb)
        self.counters["expired"] += len(doomed)
        return len(doomed)

    def set_limits(self, max_entries: int, max_retained_bytes: int) -> None:
        """Evict to meet the new limits; should pinned entries alone exceed them, those over the limits are held
        aside, least recently used first, until the resident ones are within them."""
        self.max_entries, self.max_retained_bytes = max_entries, max_retained_bytes
        try:
            self._make_room(0, 0)
        except Pinned:
            for kb in list(self.data):
                if len(self.data) <= max_entries and self.retained <= max_retained_bytes:
                    break
                if kb in self.pinned:
                    self._hold(kb)

    def clear(self) -> None:
        """Every entry goes (pinned ones held aside); the counters but ``clears`` restart from zero."""
        for kb in list(self.data):
            if kb in self.pinned:
                self._hold(kb)
            else:
                self._drop(kb)
        clears = self.counters["clears"] + 1
        self.counters = dict.fromkeys(self.counters, 0)
        self.counters["clears"] = clears

    # ------------------------------------------------------------------------------------------- kinds

    def register(self, name: str) -> int:
        """The kind's number: 1 for the first name registered, 2 for the next..."""
        return self.kinds.setdefault(name, len(self.kinds) + 1)

    def clear_kind(self, kind: int) -> int:
        doomed = [kb for kb, e in self.data.items() if e.kind == kind]
        for kb in doomed:
            if kb in self.pinned:
                self._hold(kb)
            else:
                self._drop(kb)
        self.counters["deletes"] += len(doomed)
        return len(doomed)

    def kind_stats(self) -> dict[str, KindStats]:
        """Every registered kind's resident entries (expired ones not yet dropped included) and their bytes."""
        return {
            name: KindStats(sum(1 for e in self.data.values() if e.kind == k),
                            sum(e.size for e in self.data.values() if e.kind == k))
            for name, k in self.kinds.items()
        }

    # ------------------------------------------------------------------------------------------- inspection

    def state(self, key, kind: int = 0) -> str:
        """"live", "expired" (resident, not yet dropped) or "absent", with no side effect."""
        e = self.data.get(key_bytes(key, kind))
        return "absent" if e is None else "expired" if self._expired(e) else "live"

    def keys_lru_order(self) -> list[bytes]:
        """Encoded keys, least recently used first."""
        return list(self.data)
