"""The locked operations behind the mapping API of a SharedCache and its KindViews: snapshots of keys and items,
popitem, setdefault, batches, a key's time to live and a key family's count.

Every function ending in ``_locked`` runs under the cache lock (``guard.run(fn, store, ...)``, with the cache's
``store.Store``), as one hold: what it reads is one state of the cache. They copy bytes out and leave decoding to the
caller, after the unlock. A *space* selects the entries an operation sees: 0 for the keys of no kind (a SharedCache's
own), ``k`` for kind ``k`` (a KindView's); a key of kind ``k`` is stored with the two bytes ``KIND_PREFIX, k`` in front,
which the copies drop. None of these count a lookup or move an entry in the LRU order, except the batch get and
setdefault, which are lookups like get. Walks are bounded by the table's size, so a damaged list cannot make them loop.
The batches have compiled twins (``Core.get_many`` and ``put_many`` in _core.c, called by mapping.py): these two stay
their reference, and finish a batch the C section hands over part-way.
"""

from __future__ import annotations

import numpy as np

from . import block, lru
from .codec import fingerprint
from .errors import CorruptionError
from .layout import BLOCK_HEADER_NBYTES, EMPTY, KIND_PREFIX, SENTINEL
from .layout.dtypes import (
    H_DELETES, H_DIRTY,
    H_HITS, H_MAX_RETAINED, H_MISSES,
)



def _key_start(mm, k0: int, klen: int, space: int) -> int:
    """Where the key of the entry whose key bytes start at ``k0`` begins within them if it lies in ``space``: 0 for
    a key of no kind, 2 for one of kind ``space``; -1 if it lies elsewhere."""
    of_kind = klen >= 2 and mm[k0] == KIND_PREFIX
    if space == 0:
        return -1 if of_kind else 0
    return 2 if of_kind and mm[k0 + 1] == space else -1


def snapshot_locked(store, space: int, with_values: bool) -> tuple[list, int]:
    """The live (unexpired) entries of ``space``, in the list's order (lru: most recently used first): their key
    bytes (kind prefix dropped), or with ``with_values`` (key bytes, tag, body, checksum, slot), the checksum for the
    caller to check; and how many entries were passed over as damaged (their key bytes do not hash to their
    fingerprint: a damaged length, offset or key, whose bytes are no key that was stored). The caller repairs when
    that is not 0."""
    rec, mm, base, exp = store.rec, store.mm, store.base, store.exp
    now = store.clock()
    out = []
    damaged = 0
    e = rec.next[SENTINEL]
    for _ in range(store.table.slots):
        if e == SENTINEL:
            break
        v0 = base + (rec.off[e] << rec.osh) + BLOCK_HEADER_NBYTES  # block.value_at, inlined (a walk of every entry)
        vlen, klen = rec.vlen[e], rec.klen[e]
        k0 = v0 + vlen
        skip = _key_start(mm, k0, klen, space)
        x = exp[e]
        if skip >= 0 and not (x and x <= now):
            stored = mm[k0 : k0 + klen]
            # Invariant: a key handed out hashes to its entry's fingerprint, as a lookup's probe compares it.
            if not store.table.fingerprint_is(e, fingerprint(stored)):
                damaged += 1
            else:
                kb = stored[skip:]
                out.append((kb, mm[v0], mm[v0 + 1 : k0], rec.check[e], e) if with_values else kb)
        e = rec.next[e]
    return out, damaged


def order_locked(store) -> tuple:
    """The list's links and what orders it, copied whole in one short hold (numpy copies of four columns: no walk,
    so the hold lasts a copy of a few bytes an entry, whatever the entries): (next, fp, expires, marks, the clock's
    reading). ``hottest_first`` walks them after the unlock. A narrow record keeps no fingerprint: the tag of the
    index slot it names stands for it (0 for one out of the index: it names no live entry)."""
    _, index_arr, ents = store.seg.arrays()
    expires, _, _, _, marks = store.seg.columns()
    if store.rec.fp is not None:
        fps = ents["fp"].copy()
    else:
        at = ents["slot"].astype(np.int64)
        inside = (at >= 0) & (at < len(index_arr))
        fps = np.zeros(len(at), dtype=np.int64)
        fps[inside] = index_arr["fp"][at[inside]]
    return ents["next"].copy(), fps, expires.copy(), marks.copy(), store.clock()


def hottest_first(copied: tuple, pol) -> tuple[list, list]:
    """The live entries of ``order_locked``'s copy, hottest first as the policy ``pol`` keeps them: (their slots,
    their fingerprints), which name them for ``copy_locked``. lru: the list's order, most recently used first; keep:
    the list's order, newest first; s3fifo: main's entries before small's, each queue by its hit counter (highest
    first), then newest first: the order the queues' evictions spare them in (``Policy.snapshot_rank``). No lock:
    the copy is this call's."""
    nxt, fps, exp, marks, now = copied
    nxt, fps, exp, marks = nxt.tolist(), fps.tolist(), exp.tolist(), marks.tolist()
    slots = len(nxt)
    # The policy's groups (s3fifo's eight: (small, counter)) -> slots, in the list's order within each.
    ranked = pol.snapshot_ranks > 1
    rank = pol.snapshot_rank
    groups: list[list] = [[] for _ in range(pol.snapshot_ranks)]
    e = nxt[SENTINEL]
    for _ in range(slots):  # Invariant: bounded, so a damaged list cannot make the walk loop
        if not 0 < e < slots:
            break
        x = exp[e]
        if not (x and x <= now):
            groups[rank(marks[e]) if ranked else 0].append(e)
        e = nxt[e]
    order = [e for group in groups for e in group]
    return order, [fps[e] for e in order]


def copy_locked(store, slots: list, fps: list, start: int, end: int, budget: int) -> tuple[list, int, int, int]:
    """Copy the entries ``slots[start:end]`` (named with their fingerprints ``fps`` by ``hottest_first``) until
    ``budget`` bytes are copied: for each still live and still the same key, (stored key bytes, tag, body,
    checksum, expiry: the clock's ns or 0, fingerprint, the policy's marks). Returns (the copies, where the next
    hold starts, the clock's reading, how many were passed over as damaged: an offset or length out of the arena).
    An entry gone or replaced by another key since is passed over; its key stored again elsewhere was not in
    ``slots``. The caller checks each copy's key against its fingerprint and its body against its checksum, after
    the unlock."""
    ix, rec, mm, base, exp, mask = store.ix, store.rec, store.mm, store.base, store.exp, store.mask
    marks, names = store.table.marks, store.table.index.names
    arena_nbytes = len(store.arena)
    now = store.clock()
    out = []
    damaged = copied = 0
    i, n = start, min(end, len(slots))
    while i < n and copied < budget:
        e, fp = slots[i], fps[i]
        i += 1
        s = rec.slot[e]
        # Invariant: an entry is live while the index slot it names names it back with its fingerprint.
        if (rec.fp is not None and rec.fp[e] != fp) or not 0 <= s <= mask or not names(ix, s, e, fp):
            continue
        x = exp[e]
        if x and x <= now:
            continue
        off, vlen, klen = rec.off[e] << rec.osh, rec.vlen[e], rec.klen[e]
        if off < 0 or vlen < 1 or klen < 0 or off + BLOCK_HEADER_NBYTES + vlen + klen > arena_nbytes:
            damaged += 1
            continue
        v0 = base + off + BLOCK_HEADER_NBYTES  # block.value_at, inlined
        k0 = v0 + vlen
        out.append((mm[k0 : k0 + klen], mm[v0], mm[v0 + 1 : k0], rec.check[e], x, fp, marks[e]))
        copied += vlen + klen
    return out, i, now, damaged


def popitem_locked(store, space: int):
    """Remove the live entry of ``space`` at the back of the list (lru: the least recently used) that no view pins,
    counted as a delete; its (key bytes, tag, body), or None if there is none. Expired entries met on the way are
    dropped (counted as expired)."""
    rec, mm, base, table = store.rec, store.mm, store.base, store.table
    e = rec.prev[SENTINEL]
    for _ in range(table.slots):
        if e == SENTINEL:
            return None
        before = rec.prev[e]
        k0 = block.key_at(rec, base, e)
        klen = rec.klen[e]
        skip = _key_start(mm, k0, klen, space)
        if skip >= 0:
            if store.exp[e] and table.expired(e):
                store.lapse(e)
            elif not table.pinned(e):
                stored = mm[k0 : k0 + klen]
                if not table.fingerprint_is(e, fingerprint(stored)):  # see snapshot_locked; raised: the guard repairs
                    raise CorruptionError(f"entry {e}: its key does not hash to its fingerprint", what="popitem")
                kb = stored[skip:]
                tag, body = store.body(e)
                store.remove(e, H_DELETES)
                return kb, tag, body
        e = before
    return None


def setdefault_locked(store, ttl, encoded):
    """``dict.setdefault`` as one hold: the resident value's (tag, body) if the key is live (a hit, made the most
    recent), else None once ``encoded`` (the default's ``store.Encoded``) is stored (a miss). ``ttl``: ns, or None
    for the default."""
    e = store.find_live(encoded.kb, encoded.fp, True)
    if e == EMPTY:
        expires, idle = store.expiry(ttl, None)
        store.store(EMPTY, encoded, expires, 0, idle)
        store.h[H_MISSES] += 1
        return None
    found = store.body(e)
    store.hit(e)
    return found


def get_many_locked(store, kbs: list, fps: list) -> list:
    """A lookup of each key (bytes ``kbs[i]``, fingerprint ``fps[i]``), as get does: a hit becomes the most recent.
    For each, None or (tag, body, checksum, slot), the checksum for the caller to check after the unlock."""
    # The batch's reason to be is its cost per key: the move to the front is inlined, as in SharedCache.get
    # (block.value_at, inlined), and everything the loop reads is bound once.
    ix, rec, mm, base, mask, exp, h = store.ix, store.rec, store.mm, store.base, store.mask, store.exp, store.h
    now = store.clock()
    pol, table = store.table.pol, store.table
    relinks, counts, ttis = pol.relinks_on_hit, pol.marks_on_hit, table.ttis
    out: list[tuple | None] = []
    append = out.append
    hits = misses = 0
    find = table.index.find
    for kb, fp in zip(kbs, fps):
        e = find(ix, rec, mm, base, mask, fp, kb)
        if e != EMPTY:
            v0 = base + (rec.off[e] << rec.osh) + BLOCK_HEADER_NBYTES
            vlen = rec.vlen[e]
        if e != EMPTY:
            x = exp[e]
            if x and x <= now:
                store.lapse(e)
                e = EMPTY
        if e == EMPTY:
            misses += 1
            append(None)
            continue
        if relinks:  # Store.hit, inlined (its count below)
            if rec.prev[e] != SENTINEL:  # not already the most recent
                h[H_DIRTY] = 1  # Crash window: a half-moved entry is relinked by the repair (guard.updating, inlined)
                lru.move_to_front(rec, e)
                h[H_DIRTY] = 0
        elif counts:
            pol.on_hit(table, e)
        if ttis is not None and ttis[e]:
            table.idle_touch(e)
        hits += 1
        append((mm[v0], mm[v0 + 1 : v0 + vlen], rec.check[e], e))
    h[H_HITS] += hits
    h[H_MISSES] += misses
    return out


def put_many_locked(store, ttl, encoded: list) -> int:
    """Store each entry of ``encoded`` (``store.Encoded``) in order, as put does, all expiring after ``ttl`` (ns;
    None: the default); how many were not admitted (passed: the batch goes on). Every size is checked against the
    byte limit first, so an entry that can never fit refuses the whole batch before anything is stored.
    (twin: _core_sections.c put_many_locked)"""
    limit = store.h[H_MAX_RETAINED]
    for item in encoded:
        if item.size > limit:
            raise store.refuse_locked(item.size)
    expires, idle = store.expiry(ttl, None)
    refused = 0
    for item in encoded:
        refused += not store.store(store.find_live(item.kb, item.fp, True), item, expires, 0, idle)
    return refused


def count_prefix_locked(store, prefix: bytes) -> int:
    """How many live entries have a key whose stored bytes start with ``prefix`` (kind bytes included)."""
    rec, mm, base, exp, n = store.rec, store.mm, store.base, store.exp, len(prefix)
    now = store.clock()
    count = 0
    e = rec.next[SENTINEL]
    for _ in range(store.table.slots):
        if e == SENTINEL:
            break
        if rec.klen[e] >= n:
            k0 = block.key_at(rec, base, e)
            x = exp[e]
            if mm[k0 : k0 + n] == prefix and not (x and x <= now):
                count += 1
        e = rec.next[e]
    return count
