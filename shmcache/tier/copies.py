"""A ``TieredCache``'s near copies in the host's ``SharedCache``: versioned stores, fills, marks and invalidations.
Every function here runs under the cache lock (``SharedCache._locked``), which is what makes each check-and-store
indivisible.

Invariants, for one key of a namespace (``tiered.py`` says why they bound staleness):

- A copy carries its Redis version as its entry version, and is never replaced by an older one.
- A copy is stored only by a fill (a read of Redis, or the host's own write) that registered itself first, with a
  *mark*: an entry of the namespace's mark kind, created at 0 if absent and living a few seconds; its entry version
  is its generation, kept when an invalidation raises it. An invalidation of version V raises a mark below V to V
  and drops copies older than V. A store is refused if its mark is gone or is another generation (a clear, an
  eviction or its expiry may have hidden an invalidation from it, and a later fill may have made a new mark), if
  the mark is above its version, or if its fill took longer than its deadline (after which its mark may expire).
- A clear of the namespace drops its copies and all its marks, so every fill in flight is refused; a copy an open
  view pins cannot be dropped, so it is expired instead: no lookup returns it and it goes once unpinned.
"""

from __future__ import annotations

import time

from .. import kinds
from ..codec import decode_body
from ..errors import ShmCacheError
from ..layout import BLOCK_HEADER_NBYTES, EMPTY
from ..layout.dtypes import (
    E_KEY_NBYTES, E_OFF, E_VAL_NBYTES, ENTRY_WORDS, H_DELETES, H_DIRTY, H_NEXT_EXPIRY, MAX_REMOTE_VERSION,
)


def _mark(cache, m: int) -> int:
    value = decode_body(*cache._body_locked(m))
    return value if type(value) is int else 0


def begin_fill_locked(cache, mkb: bytes, mfp: int, mark_ttl: int) -> int:
    """Register a fill of the key whose mark is at ``mkb``: create its mark at 0, or make it live ``mark_ttl`` ns
    from now if it exists. Returns the mark's generation (its entry version), which the fill's store must find
    again: a mark dropped and made anew (by a later fill) is another mark, which may have missed invalidations."""
    m = cache._find_live(mkb, mfp, True)
    expires = cache._expires_locked(mark_ttl)
    if m == EMPTY:
        cache._store_locked(EMPTY, *cache._encode(None, 0, mkb), expires)
        m = cache._find_live(mkb, mfp)
    elif cache._exp[m] and cache._exp[m] < expires:
        cache._exp[m] = expires  # later, never earlier: the bound next_expiry stays a lower bound
    return int(cache._table.ver[m])


def store_locked(cache, encoded: tuple, mkb: bytes, mfp: int, generation: int, version: int, ttl: int,
                 deadline: float) -> bool:
    """Store the copy ``encoded`` (``SharedCache._encode``) of Redis version ``version`` for ``ttl`` ns, if its fill
    is in time, its mark (of ``generation``) is still there and nothing newer is known; False if refused."""
    if time.monotonic() > deadline or not 1 <= version <= MAX_REMOTE_VERSION:
        return False
    m = cache._find_live(mkb, mfp)
    if m == EMPTY or cache._table.ver[m] != generation or _mark(cache, m) > version:
        return False
    old = cache._find_live(encoded[0], encoded[3], True)
    if old != EMPTY and cache._table.ver[old] > version:
        return False
    cache._store_locked(old, *encoded, cache._expires_locked(ttl), version)
    return True


def invalidate_locked(cache, kb: bytes, fp: int, mkb: bytes, mfp: int, version: int) -> bool:
    """Apply an invalidation of ``version``: raise a lower mark, drop (or expire, if pinned) an older copy; whether
    a copy went. A version out of range (refused from Redis) is never adopted: the copy and the mark go, so the
    fills in flight are refused too, and the next fill reads Redis afresh."""
    m = cache._find_live(mkb, mfp)
    if not 1 <= version <= MAX_REMOTE_VERSION:
        _drop(cache, m)
        e = cache._find_live(kb, fp)
        _drop(cache, e)
        return e != EMPTY
    if m != EMPTY and _mark(cache, m) < version:
        try:  # the same generation: the fills registered on this mark stay registered
            cache._store_locked(m, *cache._encode(None, version, mkb), cache._exp[m],
                                int(cache._table.ver[m]))
        except ShmCacheError:  # no room for the larger int: without its mark, the fill it served is refused
            _drop(cache, cache._find_live(mkb, mfp))
    e = cache._find_live(kb, fp)
    if e == EMPTY or cache._table.ver[e] >= version:
        return False
    _drop(cache, e)
    return True


def drop_locked(cache, kb: bytes, fp: int):
    """Drop this host's copy at ``kb`` (expire it, if pinned), as a Redis-less delete does; its (tag, body), or
    None if there was none."""
    e = cache._find_live(kb, fp)
    if e == EMPTY:
        return None
    found = cache._body_locked(e)
    _drop(cache, e)
    return found


def _drop(cache, e: int) -> None:
    if e == EMPTY:
        return
    h, table = cache._h, cache._table
    if table.pinned(e):
        now = cache._clock()
        if now < h[H_NEXT_EXPIRY]:  # Ordering: the bound is lowered before the entry's expiry, as in touch
            h[H_NEXT_EXPIRY] = now
        cache._exp[e] = now
        return
    h[H_DIRTY] = 1
    table.remove(e)
    h[H_DELETES] += 1
    h[H_DIRTY] = 0


def clear_locked(cache, copies_kind: int, marks_kind: int, prefix: bytes = b"") -> int:
    """Drop the namespace's copies (those whose key bytes start with ``prefix``, if given) and all its marks; how
    many copies."""
    table, ent, mm, base = cache._table, cache._ent, cache._mm, cache._base
    dropped = 0
    for e in kinds.slots_locked(table, copies_kind, marks_kind):
        is_copy = table.kinds[e] == copies_kind
        if prefix and is_copy:
            b = e * ENTRY_WORDS
            k0 = base + ent[b + E_OFF] + BLOCK_HEADER_NBYTES + ent[b + E_VAL_NBYTES]  # a block: [header][value][key]
            if mm[k0 : k0 + min(len(prefix), ent[b + E_KEY_NBYTES])] != prefix:
                continue
        _drop(cache, e)
        dropped += is_copy
    return dropped
