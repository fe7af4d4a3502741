"""Key kinds: namespaces within one cache (``SharedCache.kind(name)``), after the transform caches whose keys carry
a kind tag. A kind's keys cannot meet another kind's, each kind can be cleared on its own and has its own entry and
byte counts, while the LRU order and the limits stay those of the whole cache.

A kind is a record of the segment's kind table (``layout.KIND``), numbered 1 to ``MAX_KINDS`` and never given back:
kinds are a small, fixed vocabulary of an application ("jvp", "thumbnail"...), not data. A key of kind ``k`` is
encoded as ``KIND_PREFIX``, ``k``, then the key's own encoding (``codec.KindKey``); its entry also carries ``k`` in the
kinds column, so that per-kind counts are kept on every store and removal, and a kind is cleared by one vectorised
scan. Functions ending in ``_locked`` need the cache lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import numpy as np

from . import block, memo
from .codec import KindKey
from .errors import CorruptionError
from .layout import MAX_KINDS
from .layout.dtypes import (
    H_DELETES, H_ENTRIES, H_KINDS_USED, HELD_SLOT, K_ENTRIES, K_NAME_NBYTES,
    K_NAME_OFF, K_RETAINED, KIND, KIND_NAME_NBYTES, KIND_WORDS,
)
from .aio import AsyncMethods
from .mapping import LocalMapping, memo_family

if TYPE_CHECKING:
    from .cache import Parts, SharedCache
    from .memo import Memoized
    from .stats import CacheLimits
    from .view import View

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class KindStats:
    """Resident entries of one kind (expired ones not yet dropped included, unlike the KindView's ``len()``) and
    the bytes of their encoded keys and values."""

    entries: int
    retained_bytes: int


def check_name(name) -> bytes:
    """The UTF-8 bytes of a kind name; raises TypeError or ValueError for an unusable one."""
    if not isinstance(name, str):
        raise TypeError(f"a kind name is a str, got {type(name).__name__}")
    nb = name.encode("utf-8", "strict") if name else b""
    if not 0 < len(nb) <= KIND_NAME_NBYTES:
        raise ValueError(f"a kind name is 1 to {KIND_NAME_NBYTES} bytes of UTF-8, got {len(nb)}: {name!r}")
    return nb


def _name(seg, k: int) -> bytes:
    off = seg.geometry.kind_table_off + k * KIND.itemsize + K_NAME_OFF
    n = seg.kind_words[k * KIND_WORDS + K_NAME_NBYTES]
    return bytes(seg.mm[off : off + min(max(n, 0), KIND_NAME_NBYTES)])


def name_of(seg, k: int) -> str:
    """Kind ``k``'s name, read without the lock: a display figure (a record's name is written once, when the kind
    is made)."""
    return _name(seg, k).decode("utf-8", "replace") or f"#{k}"


def _used(seg) -> int:
    n = seg.header_words[H_KINDS_USED]
    return n if 0 <= n <= MAX_KINDS else MAX_KINDS


def register_locked(seg, name: bytes) -> int:
    """The number of the kind called ``name``, a new one if there is none yet; 0 if the table is full."""
    kw, h = seg.kind_words, seg.header_words
    used = h[H_KINDS_USED]
    # Damaged (out of range, or beyond the records that have names): the caller repairs and may ask again; never
    # "the table is full" because of a count.
    if not 0 <= used <= MAX_KINDS or (used and not 0 < kw[used * KIND_WORDS + K_NAME_NBYTES] <= KIND_NAME_NBYTES):
        raise CorruptionError(f"kinds_used={used} is out of range or beyond the kinds made", what="kind",
                              hint="the operation can be retried")
    for k in range(1, used + 1):
        if _name(seg, k) == name:
            return k
    if used == MAX_KINDS:
        return 0
    k = used + 1
    off = seg.geometry.kind_table_off + k * KIND.itemsize
    seg.mm[off + K_NAME_OFF : off + K_NAME_OFF + KIND_NAME_NBYTES] = name.ljust(KIND_NAME_NBYTES, b"\0")
    kw[k * KIND_WORDS + K_NAME_NBYTES] = len(name)
    kw[k * KIND_WORDS + K_ENTRIES] = kw[k * KIND_WORDS + K_RETAINED] = 0
    # Ordering: the count goes last, so a holder dying before it leaves the record unused, to be written again.
    h[H_KINDS_USED] = k
    return k


def names_locked(seg) -> dict[int, bytes]:
    """Every kind's name (its UTF-8 bytes), by number."""
    return {k: _name(seg, k) for k in range(1, _used(seg) + 1)}


def stats_locked(seg) -> dict[str, KindStats]:
    """Every kind's counts, by name."""
    kw = seg.kind_words
    return {
        _name(seg, k).decode("utf-8", "replace"): KindStats(kw[k * KIND_WORDS + K_ENTRIES],
                                                           kw[k * KIND_WORDS + K_RETAINED])
        for k in range(1, _used(seg) + 1)
    }


def plain_entries_locked(seg) -> int:
    """Resident entries of no kind: the whole cache's, less every kind's."""
    kw = seg.kind_words
    of_kinds = sum(kw[k * KIND_WORDS + K_ENTRIES] for k in range(1, _used(seg) + 1))
    return max(0, seg.header_words[H_ENTRIES] - of_kinds)


def resident_locked(seg, k: int) -> int | None:
    """Resident entries of kind ``k`` (0: of no kind), expired ones not yet dropped included; None if a count it
    reads is out of range (damaged: the caller repairs and asks again)."""
    slots = seg.geometry.entry_slots
    if not 0 <= seg.header_words[H_ENTRIES] < slots:
        return None
    if k == 0:
        return plain_entries_locked(seg)
    n = seg.kind_words[k * KIND_WORDS + K_ENTRIES]
    return n if 0 <= n < slots else None


def slots_locked(table, *numbers: int) -> list[int]:
    """The resident entry slots of the kinds ``numbers``: one vectorised scan of the kinds column."""
    handed_out = block.handed_out(table.h, table.slots)
    kinds = np.frombuffer(table.kinds, dtype=np.uint8, count=handed_out)
    rec = table.rec
    # A free slot may keep the kind byte of its last entry: resident ones have a checksum (never 0), and a held
    # one (version 12) is in no index slot.
    return [e for e in np.flatnonzero(np.isin(kinds, numbers)).tolist()
            if rec.check[e] and rec.slot[e] != HELD_SLOT]


def clear_locked(store, k: int) -> int:
    """Remove every entry of kind ``k``; how many (counted as deletes). One a view pins is held aside for it
    (version 12), or stays (before it)."""
    removed = 0
    table = store.table
    for e in slots_locked(table, k):
        if not table.pinned(e):
            store.remove(e, H_DELETES)
            removed += 1
        elif table.holds:
            store.hold(e, H_DELETES)
            removed += 1
    return removed


class KindView(LocalMapping, AsyncMethods):
    """The keys of one kind of a cache: the cache's API, in a namespace of its own (``SharedCache.kind``).

    ``clear()`` and ``len()`` cover this kind only and ``stats()`` gives its counts; eviction, the limits and the
    global stats stay the whole cache's. The view shares its cache's handle: closing the cache closes it.
    """

    def __init__(self, cache: SharedCache, parts: Parts, number: int, name: str) -> None:
        self.cache = cache
        self.name = name
        self._parts = parts
        self._n = number
        self._lockw = parts.guard.lockw  # (the asyncio methods look at the lock through it)

    @property
    def number(self) -> int:
        """The kind's number in its cache (1 to 255): its keys are stored with the bytes ``KIND_PREFIX, number``
        in front."""
        return self._n

    def get(self, key: Any, default: Any = None) -> Any:
        return self.cache.get(KindKey(self._n, key), default)

    def put(self, key: Any, value: Any, ttl: float | None = None, tti: float | None = None) -> bool:
        return self.cache.put(KindKey(self._n, key), value, ttl, tti=tti)

    def add(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        return self.cache.add(KindKey(self._n, key), value, ttl)

    def replace(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        return self.cache.replace(KindKey(self._n, key), value, ttl)

    def delete(self, key: Any) -> bool:
        return self.cache.delete(KindKey(self._n, key))

    def pop(self, key: Any, *default: Any) -> Any:
        try:
            return self.cache.pop(KindKey(self._n, key), *default)
        except KeyError:
            raise KeyError(key) from None

    def incr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        try:
            return self.cache.incr(KindKey(self._n, key), delta, initial)
        except KeyError:
            raise KeyError(key) from None

    def decr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        try:
            return self.cache.decr(KindKey(self._n, key), delta, initial)
        except KeyError:
            raise KeyError(key) from None

    def touch(self, key: Any, ttl: float | None = None) -> bool:
        return self.cache.touch(KindKey(self._n, key), ttl)

    def get_with_version(self, key: Any, default: Any = None) -> tuple[Any, int | None]:
        return self.cache.get_with_version(KindKey(self._n, key), default)

    def cas(self, key: Any, value: Any, version: int, ttl: float | None = None) -> bool:
        return self.cache.cas(KindKey(self._n, key), value, version, ttl)

    def get_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                       ttl: float | None = None, stale_ttl: float | None = None) -> R:
        return self.cache.get_or_compute(KindKey(self._n, key), fn, timeout=timeout, ttl=ttl, stale_ttl=stale_ttl)

    @overload
    async def aget_or_compute(self, key: Any, fn: Callable[[], Awaitable[R]], *,  # type: ignore[overload-overlap]
                              timeout: float | None = None, ttl: float | None = None,
                              stale_ttl: float | None = None) -> R: ...

    @overload
    async def aget_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> R: ...

    async def aget_or_compute(self, key: Any, fn: Callable[[], Any], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> Any:
        return await self.cache.aget_or_compute(KindKey(self._n, key), fn, timeout=timeout, ttl=ttl,
                                                stale_ttl=stale_ttl)

    @overload
    def memoize(self, fn: Callable[P, R], *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (), stale_ttl: float | None = None) -> Memoized[P, R]: ...

    @overload
    def memoize(self, fn: None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (),
                stale_ttl: float | None = None) -> Callable[[Callable[P, R]], Memoized[P, R]]: ...

    def memoize(self, fn: Callable[P, R] | None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (),
                stale_ttl: float | None = None) -> Memoized[P, R] | Callable[[Callable[P, R]], Memoized[P, R]]:
        """``SharedCache.memoize``, with the function's entries in this kind (``cache_clear`` included)."""
        def decorate(f: Callable[P, R]) -> Memoized[P, R]:
            return memo.memoized(self, memo_family(self), f, name, timeout, ttl, key, ignore, stale_ttl)

        return decorate if fn is None else decorate(fn)

    def view(self, key: Any) -> View:
        try:
            return self.cache.view(KindKey(self._n, key))
        except KeyError:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        return KindKey(self._n, key) in self.cache

    def __len__(self) -> int:
        """This kind's live entries: what iterating it yields (``stats().entries`` also counts the expired ones not
        yet dropped)."""
        return self._parts.guard.run(self._parts.store.live_entries, self._n)

    def clear(self) -> int:  # type: ignore[override]  # (returns how many it removed; dict.clear returns None)
        """Remove every entry of this kind (those an open view pins excepted); how many were removed."""
        return self._parts.guard.run(clear_locked, self._parts.store, self._n)

    def stats(self) -> KindStats:
        """This kind's resident entries and their bytes."""
        return self._parts.guard.run(self._stats_locked)

    def _stats_locked(self) -> KindStats:
        seg = self._parts.seg
        kw, n = seg.kind_words, self._n * KIND_WORDS
        if not (0 <= kw[n + K_ENTRIES] < seg.geometry.entry_slots
                and 0 <= kw[n + K_RETAINED] <= seg.geometry.capacity_bytes):
            self._parts.store.repair()  # damaged counts are never reported (len() must not raise ValueError)
        return KindStats(kw[n + K_ENTRIES], kw[n + K_RETAINED])

    def limits(self) -> CacheLimits:
        """The cache's limits (a kind has none of its own)."""
        return self.cache.limits()

    def set_limits(self, limits: CacheLimits | None = None, **kwargs: int | None) -> None:
        """The cache's ``set_limits``: limits are the whole cache's."""
        self.cache.set_limits(limits, **kwargs)

    def _space(self) -> tuple[Parts, int]:
        return self._parts, self._n

    def _hot(self) -> tuple:
        return self.cache._hot()  # the cache's handle: what its hot calls go to, and its clock

    def __repr__(self) -> str:
        if self.cache.closed:
            return f"{type(self).__name__}({self.name!r}, cache={self.cache.name!r}, closed)"
        entries = self._parts.seg.kind_words[self._n * KIND_WORDS + K_ENTRIES]  # without the lock, as the cache's
        return f"{type(self).__name__}({self.name!r}, cache={self.cache.name!r}, entries={entries})"
