"""A ``TieredCache``'s near copies in the host's ``SharedCache``: versioned stores, fills, marks and invalidations.
Every function here runs under the cache lock (``guard.run(fn, store, ...)``), which is what makes each check-and-store
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

from .. import block, kinds
from ..codec import decode_body
from ..errors import ShmCacheError
from ..layout import EMPTY
from ..layout.dtypes import H_DELETES, MAX_REMOTE_VERSION
from ..store import Encoded


def _mark(store, m: int) -> int:
    value = decode_body(*store.body(m))
    return value if type(value) is int else 0


def begin_fill_locked(store, mkb: bytes, mfp: int, mark_ttl: int) -> int:
    """Register a fill of the key whose mark is at ``mkb``: create its mark at 0, or make it live ``mark_ttl`` ns
    from now if it exists. Returns the mark's generation (its entry version), which the fill's store must find
    again: a mark dropped and made anew (by a later fill) is another mark, which may have missed invalidations."""
    m = store.find_live(mkb, mfp, True)
    expires = store.expires_at(mark_ttl)
    if m == EMPTY:
        if not store.store(EMPTY, store.encode(None, 0, mkb), expires):
            return 0  # not admitted (keep, full): no generation is 0, so the fill's store is refused
        m = store.find_live(mkb, mfp)
    elif store.exp[m] and store.exp[m] < expires:
        store.set_expiry(m, expires)  # later, never earlier
    return store.version(m)


def store_locked(store, encoded: Encoded, mkb: bytes, mfp: int, generation: int, version: int, ttl: int,
                 deadline: float) -> bool:
    """Store the copy ``encoded`` of Redis version ``version`` for ``ttl`` ns, if its fill
    is in time, its mark (of ``generation``) is still there and nothing newer is known; False if refused."""
    if time.monotonic() > deadline or not 1 <= version <= MAX_REMOTE_VERSION:
        return False
    m = store.find_live(mkb, mfp)
    if m == EMPTY or store.version(m) != generation or _mark(store, m) > version:
        return False
    old = store.find_live(encoded.kb, encoded.fp, True)
    if old != EMPTY and store.version(old) > version:
        return False
    return store.store(old, encoded, store.expires_at(ttl), version)  # False: the policy did not admit it


def invalidate_locked(store, kb: bytes, fp: int, mkb: bytes, mfp: int, version: int) -> bool:
    """Apply an invalidation of ``version``: raise a lower mark, drop (or expire, if pinned) an older copy; whether
    a copy went. A version out of range (refused from Redis) is never adopted: the copy and the mark go, so the
    fills in flight are refused too, and the next fill reads Redis afresh."""
    m = store.find_live(mkb, mfp)
    if not 1 <= version <= MAX_REMOTE_VERSION:
        _drop(store, m)
        e = store.find_live(kb, fp)
        _drop(store, e)
        return e != EMPTY
    if m != EMPTY and _mark(store, m) < version:
        try:  # the same generation: the fills registered on this mark stay registered
            store.store(m, store.encode(None, version, mkb), store.exp[m], store.version(m))
        except ShmCacheError:  # no room for the larger int: without its mark, the fill it served is refused
            _drop(store, store.find_live(mkb, mfp))
    e = store.find_live(kb, fp)
    if e == EMPTY or store.version(e) >= version:
        return False
    _drop(store, e)
    return True


def drop_locked(store, kb: bytes, fp: int):
    """Drop this host's copy at ``kb`` (expire it, if pinned), as a Redis-less delete does; its (tag, body), or
    None if there was none."""
    e = store.find_live(kb, fp)
    if e == EMPTY:
        return None
    found = store.body(e)
    _drop(store, e)
    return found


def _drop(store, e: int) -> None:
    if e == EMPTY:
        return
    if store.table.pinned(e):
        store.set_expiry(e, store.clock())  # expired at once: no lookup returns it, and it goes once unpinned
        return
    store.remove(e, H_DELETES)


def clear_locked(store, copies_kind: int, marks_kind: int, prefix: bytes = b"") -> int:
    """Drop the namespace's copies (those whose key bytes start with ``prefix``, if given) and all its marks; how
    many copies."""
    table = store.table
    dropped = 0
    for e in kinds.slots_locked(table, copies_kind, marks_kind):
        is_copy = table.kinds[e] == copies_kind
        if prefix and is_copy and not block.key_of(store.mm, store.rec, store.base, e).startswith(prefix):
            continue
        _drop(store, e)
        dropped += is_copy
    return dropped
