"""The locked operations of a SharedCache over its structures: store, remove-and-count, lapse, expire, pin, clear.

Every method of ``Store`` runs with the cache lock held (``Guard.run``), as one hold: what it reads is one state of
the cache. Methods that write the structures are bracketed by the dirty word (``guard.updating``) or are made of
such brackets. This is the named internal API the other modules call (``entries``, ``kinds``, ``tier.copies``), with
the ``Encoded`` entry that ``encode`` prepares before the lock is taken.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import block, config, kinds, lru, ofd, readers
from .codec import (
    MASK63, TAG_ARRAY, TAG_BYTES, TAG_MSGPACK, TAG_TENSOR, body_checksum, copy_array, decode_body, encode_key, xxh3,
)
from .errors import CorruptionError, NoSpaceError, PinnedError, ShmCacheError, TooLargeError
from .block import PAD
from .guard import updating, updating_entries
from .layout import BLOCK_ALIGN, EMPTY, MAX_BLOCK_NBYTES, MAX_TTL_NS, SENTINEL
from .layout.dtypes import (
    H_CLEARS, H_DEFAULT_TTL, H_DELETES,
    H_ENTRIES, H_EXPIRED, H_HITS, H_LAST_PUT, H_MAX_ENTRIES, H_MAX_RETAINED, H_MISSES, H_NEXT_EXPIRY, H_PUTS,
    H_TOO_LARGE, H_UPDATES, H_WRITING, H_ARENA_EXTENT, H_CAPACITY, H_FILL, H_HEAD, H_RESIZES,
    H_RETAINED, H_TAIL, H_UNUSED_NEXT, MAX_COUNTER, D_SWITCH_BUMPS, D_IDLE_ON, D_VERSIONS_ON, D_EXPIRES_ON,
    H_VERSION_CLOCK,
    MAX_VERSION,
)
from .serializers import TAG_PICKLE
from .stats import CacheStats, read_stats, reset_counters
from .table import NO_IDLE, pinned_error
from .verify import count_resize, header_problems

_SECOND_NS = 10**9  # the resolution of the time of the last store (H_LAST_PUT)
_VIEWABLE = (TAG_ARRAY, TAG_BYTES, TAG_TENSOR)  # the value tags view() serves
_WRITTEN = (*_VIEWABLE, TAG_MSGPACK, TAG_PICKLE)  # every value tag an encoder writes: any other byte is damage
UNVIEWABLE = object()  # ``Store.pin``'s answer for a value view() does not serve
_new_encoded = tuple.__new__  # Why: builds an Encoded without NamedTuple's Python-level __new__ (the put path)


class Encoded(NamedTuple):
    """An entry ready to store, computed before the lock is taken (``Store.encode``)."""

    kb: bytes  # the stored key bytes (a kind's prefix included)
    tag: int  # the value's tag byte
    body: bytes  # the value's bytes after the tag
    fp: int  # the key's fingerprint
    check: int  # the value's checksum
    size: int  # key + value bytes: what the entry counts against max_retained_bytes
    nb: int  # its block's size in the arena


class Placed(NamedTuple):
    """An Encoded restored from a snapshot whose record carries the marks its entry had (snapshot.FLAG_MARKED):
    a new entry of a cache whose policy keeps marks (s3fifo, auto) goes to the queue they name, with their counter
    (Table.insert); the other policies, and an update of a key present, take it as its Encoded. (twin: _core.h
    Encoded.marks)"""

    kb: bytes
    tag: int
    body: bytes
    fp: int
    check: int
    size: int
    nb: int
    marks: int  # MARK_* (layout/dtypes.py): the small queue's bit and the counter


# What the put path takes: an Encoded, or its seven fields as a plain tuple (SharedCache.put builds one: a
# NamedTuple costs it ~100 ns more, a tenth of a compiled put).
Fields = tuple[bytes, int, bytes, int, int, int, int]


def too_large(size: int, limit: int, name: str) -> TooLargeError:
    """The refusal of an entry of ``size`` bytes over ``limit``, the limit named ``name``; uncounted (see
    ``Store.refuse`` and ``Store.refuse_locked``)."""
    if name == "capacity_bytes":  # the capacity in force
        hint = "store a smaller value, or resize the cache (SharedCache.resize, up to max_capacity_bytes)"
    elif name == "max_capacity_bytes":  # what the cache was made for: no resize reaches it
        hint = "store a smaller value, or make the cache with a larger max_capacity_bytes"
    else:
        hint = "store a smaller value, or raise max_retained_bytes with set_limits (up to capacity_bytes)"
    return TooLargeError(f"entry of {size} bytes (encoded key + value) can never fit: {name} is {limit}",
                         what="put", hint=hint, size=size, limit=limit, limit_name=name)


class Store:
    """The operations of one mapped segment under its lock. ``repair`` is the guard's (lock held); ``serializer``
    the handle's (serializers.py)."""


    def __init__(self, seg, table, clock, repair, serializer, bump) -> None:
        g = seg.geometry
        self.seg, self.table, self.clock, self.repair = seg, table, clock, repair
        # Adds one to a header counter from outside the lock (Guard.bump): how a refusal before the lock is counted.
        self.bump = bump
        self.serializer = serializer  # encodes every value stored, decodes every value read
        self._encode_value = serializer.encode
        self.h, self.ix, self.rec, self.exp, self.mm = (seg.header_words, seg.index_words, seg.records,
                                                        seg.expires_words, seg.mm)
        self.arena = seg.arena
        self.base = g.arena_off
        self.most_bytes = g.capacity_bytes  # the most a resize reaches
        self.hit = self._hit_relinking if table.pol.relinks_on_hit else self._hit_touching  # type: ignore[method-assign]
        self.seqlocked = table.seqlocked  # guard.updating opens the readers' seq (not under lru)

    @property
    def mask(self) -> int:
        """The index in force's slots less one (a resize changes it: Segment.show_tables)."""
        return self.seg.mask

    def close(self) -> None:
        """Drop ``hit``, a method of this object: the cycle would keep the segment until the cycle collector."""
        self.__dict__.pop("hit", None)

    # ------------------------------------------------------------------------------------------- before the lock

    def encode(self, key, value, kb: bytes | None = None, parts: tuple | None = None) -> Encoded:
        """Everything a store needs that can be computed without the lock; ``kb``: the key already encoded;
        ``parts``: the value already encoded, as (tag, body). Raises TypeError or TooLargeError; nothing has
        changed."""
        if kb is None:
            kb = encode_key(key)
        tag, body = self._encode_value(value) if parts is None else parts
        size = len(kb) + len(body) + 1
        nb = (size + PAD) & -BLOCK_ALIGN  # block.nbytes, inlined: the put path
        if size > self.most_bytes or nb > MAX_BLOCK_NBYTES:
            raise self.refuse(size)
        return _new_encoded(Encoded, (kb, tag, body, xxh3(kb) & MASK63, (xxh3(body, tag) & MASK63) | 1, size, nb))

    def refuse(self, size: int) -> TooLargeError:
        """The refusal of an entry of ``size`` bytes beyond the capacity, found before the lock, counted in
        ``too_large`` by one short hold of it (a refusal is never a hot path)."""
        try:
            self.bump(H_TOO_LARGE)
        except ShmCacheError:
            # Why: the refusal is the answer; a count that cannot be made (the lock timed out, the handle is
            # closed) is lost rather than turned into another error, which the put would not have raised.
            pass
        return too_large(size, self.most_bytes, "max_capacity_bytes")

    def refuse_locked(self, size: int) -> TooLargeError:
        """The refusal of an entry of ``size`` bytes over ``max_retained_bytes``, counted; lock held. Named the
        capacity where the byte limit is the capacity in force (as a resize and creation set it), which only a
        resize raises."""
        h = self.h
        h[H_TOO_LARGE] += 1
        limit = h[H_MAX_RETAINED]
        return too_large(size, limit, "capacity_bytes" if limit == config.capacity(h, self.seg.geometry)
                         else "max_retained_bytes")

    # ------------------------------------------------------------------------------------------- reading one entry

    def find_live(self, kb: bytes, fp: int, to_insert: bool = False) -> int:
        """The entry slot of key bytes ``kb`` (fingerprint ``fp``), or EMPTY, an expired entry being dropped and
        reported absent; ``to_insert``: see ``lapse``."""
        e = self.table.index.find(self.ix, self.rec, self.mm, self.base, self.mask, fp, kb)
        if e != EMPTY and self.exp[e] and self.table.expired(e):
            self.lapse(e, to_insert)
            return EMPTY
        return e

    def body(self, e: int) -> tuple[int, bytes]:
        """Tag and body bytes of resident entry ``e``, copied and checked against its checksum."""
        v0 = block.value_at(self.rec, self.base, e)
        vlen = self.rec.vlen[e]
        tag = self.mm[v0]
        body = self.mm[v0 + 1 : v0 + vlen]
        if body_checksum(tag, body) != self.rec.check[e]:
            raise CorruptionError(f"entry {e} failed its checksum", what="read")
        return tag, body

    def version(self, e: int) -> int:
        """Resident entry ``e``'s version (changed by every store of its key); the first one asked for switches the
        versions column on (version 16: ``show_versions``)."""
        ver = self.table.ver
        if ver is None:
            self.show_versions()
            ver = self.table.ver
        return int(ver[e])

    def expires_at(self, ttl, now: int | None = None) -> int:
        """The expiry time of an entry stored ``now`` (None: the clock's) with ``ttl`` (ns, already checked; None:
        the default), the expires column switched on first where this mapping does not show it and the entry
        expires or the column is in use (``need_expires``)."""
        if ttl is None:
            ttl = self.h[H_DEFAULT_TTL]
            if not 0 <= ttl <= MAX_TTL_NS:
                raise CorruptionError(f"the default time to live is {ttl} ns, out of range", what="put")
        self.need_expires(ttl)
        return (self.clock() if now is None else now) + ttl if ttl else 0

    def need_expires(self, expiring) -> None:
        """Before a store writes an expiry: where this mapping does not show the expires column (version 18), switch
        it on if the entry expires (``expiring`` true), or if D_EXPIRES_ON says it is in use (a switch cut before
        its count left the other mappings without it): a store that wrote no expiry into a column in use would
        leave the slot's last entry's there."""
        seg = self.seg
        if not seg.expires_shown and (expiring or seg.idle_words[D_EXPIRES_ON]):
            self.show_expires()

    def expiry(self, ttl, tti) -> tuple[int, tuple[int, int]]:
        """The expiry time of an entry stored now with ``ttl`` and ``tti`` (ns, already checked; None: the cache's
        defaults), and its (time to idle, deadline) for the idle columns (version 14; the caller refused a ``tti``
        before it). An idle entry expires at the earlier of its deadline and a tti from now."""
        now = self.clock()
        deadline = self.expires_at(ttl, now)
        seg = self.seg
        if tti is None:
            tti = config.default_tti(seg.idle_words)
        # A store where this mapping does not show the idle columns switches them on if it has a time to idle, or if
        # D_IDLE_ON says they are in use (a switch killed before its count left the other mappings without them):
        # a store that wrote no idle words into a column in use would leave the slot's last entry's there.
        if seg.idle_words is not None and not seg.idle_shown and (tti or seg.idle_words[D_IDLE_ON]):
            self.show_idle()
        if tti:
            self.need_expires(tti)  # (an idle entry expires: the idle switch showed the column, or an earlier one)
        if not seg.versions_shown and seg.idle_words[D_VERSIONS_ON]:
            self.show_versions()  # (likewise: a store must write its version into a column in use)
        if not tti or seg.idle_words is None:
            return deadline, NO_IDLE
        soon = now + tti
        return (soon if not deadline or soon < deadline else deadline), (tti, deadline)

    def show_idle(self) -> None:
        """Switch the idle columns on (version 16), under the lock, before the first store with a time to idle that
        this mapping makes: backed and shown here (Segment.show_idle), then D_IDLE_ON set, then a resize counted
        (and in D_SWITCH_BUMPS, which stats() leaves out), so that every process takes the tables again, the columns
        with them, before its next call (refresh_tables; a read without the lock hands over: ``resizes`` moved).
        Crash windows (a SIGKILL, or an exception a signal raises at any bytecode): cut before D_IDLE_ON, the pages
        are backed and unused, and this mapping does not mark them shown, so the next switch does it all again; cut
        before the count, D_IDLE_ON is set and the other mappings show no columns yet, so the next store in a
        mapping without them switches again (``expiry``). Nothing of an entry is written before the count.

        :raises NoSpaceError: /dev/shm cannot back the columns (the store is refused; the cache is as it was).
        """
        seg = self.seg
        if seg.idle_shown:
            return
        self.show_expires(count=False)  # (first: an idle entry has an expiry; counted with the idle columns below)
        seg.map_idle()  # (backed and mapped; marked shown only once D_IDLE_ON says they are in use)
        words = seg.idle_words
        words[D_IDLE_ON] = 1
        seg.show_idle()
        self._count_switch()

    def show_versions(self) -> None:
        """Switch the versions column on (version 16), under the lock, before the first version this mapping reads or
        stores: backed and shown here, and, unless D_VERSIONS_ON says another process did this already (a switch
        killed before its count), every entry in a slot (resident or held) given a version of its own, the clock's
        next ones, since no store wrote any; then D_VERSIONS_ON set and a resize counted, as ``show_idle`` does.
        Crash windows (a SIGKILL, or an exception a signal raises at any bytecode): cut before D_VERSIONS_ON, the
        column is not marked shown here, and the next switch gives the versions again (none was handed out); cut
        before the count, the next store or version asked for in a mapping without the column switches again and
        keeps the versions.

        :raises NoSpaceError: /dev/shm cannot back the column (the call is refused; the cache is as it was).
        """
        seg, h = self.seg, self.h
        if seg.versions_shown:
            return
        seg.map_versions()  # (backed and mapped; marked shown only once every entry has a version, D_VERSIONS_ON)
        words = seg.idle_words
        if not words[D_VERSIONS_ON]:
            handed = block.handed_out(h, seg.slots_shown)  # (slot 0, the sentinel, has no checksum: never given one)
            checks = seg.records.column("check", handed)
            slots = np.flatnonzero(checks)
            slots = slots[slots > 0]
            clock = h[H_VERSION_CLOCK]
            if not 0 <= clock < MAX_VERSION - len(slots) - 1:
                raise CorruptionError(f"the version clock is {clock}, out of range", what="version")
            ver = np.frombuffer(seg.versions_words, dtype=np.int64)
            ver[slots] = np.arange(clock + 1, clock + 1 + len(slots), dtype=np.int64)
            h[H_VERSION_CLOCK] = clock + len(slots)
            words[D_VERSIONS_ON] = 1
        seg.show_versions()
        self._count_switch()

    def show_expires(self, count: bool = True) -> None:
        """Switch the expires column on (version 18), under the lock, before the first expiry this mapping stores:
        backed and shown here, then, unless D_EXPIRES_ON says another process did this already (a switch cut before
        its count, whose column may hold expiries since), every word of it that is not 0 set to 0 (no store wrote
        one: only damage to the file did), then D_EXPIRES_ON set and a resize counted, as ``show_idle`` does (which
        counts the two switches once: ``count`` False). Crash windows (a SIGKILL, or an exception a signal raises at
        any bytecode): cut before D_EXPIRES_ON, the column is not marked shown here and holds no expiry; cut before
        the count, the next store in a mapping without the column switches again (``need_expires``).

        :raises NoSpaceError: /dev/shm cannot back the column (the store is refused; the cache is as it was).
        """
        seg = self.seg
        if seg.expires_shown:
            return
        seg.map_expires()  # (backed and mapped; marked shown only once D_EXPIRES_ON says it is in use)
        words = seg.idle_words
        if not words[D_EXPIRES_ON]:
            x = np.frombuffer(seg.expires_words, dtype=np.int64, count=seg.slots_shown)
            x[x != 0] = 0
            del x
            words[D_EXPIRES_ON] = 1
        seg.show_expires()
        if count:
            self._count_switch()

    def _count_switch(self) -> None:
        """A lazy column switched on: counted as a resize, so that every process takes the tables again (the column
        with them) before its next call, and in D_SWITCH_BUMPS, which stats() leaves out of ``resizes``."""
        words, h = self.seg.idle_words, self.h
        bumps = words[D_SWITCH_BUMPS]
        words[D_SWITCH_BUMPS] = bumps + 1 if 0 <= bumps < MAX_COUNTER else 1
        count_resize(h)
        self.seg.shown[3] = h[H_RESIZES]  # (this mapping has the tables as they are now)

    def set_expiry(self, e: int, expires: int) -> None:
        """Give resident entry ``e`` a new expiry time (0: never)."""
        h = self.h
        # Ordering: next_expiry (a lower bound) is lowered before the entry's expiry is, so that dying between the
        # two writes leaves it a bound still; neither write needs the dirty word.
        self.need_expires(expires)
        if expires and expires < h[H_NEXT_EXPIRY]:
            h[H_NEXT_EXPIRY] = expires
        self.table.open_entry(e)  # (readers without the lock judge expiry: see seqlock.py)
        if expires != self.exp[e]:  # (never 0 over 0: a column not shown here is this mapping's own zero pages)
            self.exp[e] = expires

    # ------------------------------------------------------------------------------------------- writing

    @updating_entries
    def remove(self, e: int, counter: int) -> None:
        """Drop entry ``e`` and count it in header word ``counter`` (deletes, expired)."""
        self.table.remove(e)
        self.h[counter] += 1

    @updating_entries
    def hold(self, e: int, counter: int) -> None:
        """Drop entry ``e``, which a view pins, from the index and hold it aside for that view (``Table.detach``:
        version 12), counted in header word ``counter``."""
        self.table.detach(e)
        self.h[counter] += 1

    def drop(self, e: int, counter: int, what: str) -> None:
        """Drop entry ``e`` for a delete or pop (``what``): removed, or held aside where a view pins it (version
        12; before it, PinnedError)."""
        table = self.table
        if not table.pinned(e):
            self.remove(e, counter)
        elif table.holds:
            self.hold(e, counter)
        else:
            raise pinned_error(what)

    def hit(self, e: int) -> None:
        """Count a hit on entry ``e``, touched as the policy does (``Table.touch``). ``__init__`` binds ``hit`` to
        one of the two below, so that a lookup pays no test of the policy."""
        raise NotImplementedError  # (replaced on each instance)

    @updating
    def _hit_relinking(self, e: int) -> None:
        """lru: the entry becomes the most recent, in a dirty bracket (the move writes links)."""
        lru.move_to_front(self.rec, e)
        self.h[H_HITS] += 1
        ttis = self.table.ttis
        if ttis is not None and ttis[e]:
            self.table.idle_touch(e)

    def _hit_touching(self, e: int) -> None:
        """s3fifo (a counter raised: one byte, any value valid, no bracket) and keep (nothing moves)."""
        table = self.table
        table.touch(e)
        self.h[H_HITS] += 1
        if table.ttis is not None and table.ttis[e]:
            table.idle_touch(e)

    def lapse(self, e: int, to_insert: bool = False) -> None:
        """Resident entry ``e`` has expired: drop it and count it in ``expired``. A view may still pin it: then it
        stays (it reads as absent), unless the caller is about to insert its key (``to_insert``): the key must
        never be in the index twice, so it is held aside (version 12), or PinnedError raised (before it)."""
        table = self.table
        if table.pinned(e):
            if to_insert:
                # Why not refuse_pinned: it would ask the kernel again, and a pin ended in between would let the
                # caller insert the key a second time, beside this entry.
                if not table.holds:
                    raise pinned_error("replaced")
                self.hold(e, H_EXPIRED)
            return
        self.remove(e, H_EXPIRED)

    def write(self, old: int, encoded: Fields, expires: int, version: int = 0, idle: tuple[int, int] = NO_IDLE) -> bool:
        """``store``, inside a dirty bracket the caller holds."""
        h, table = self.h, self.table
        size = encoded[5]
        if size > h[H_MAX_RETAINED]:
            raise self.refuse_locked(size)
        if version and table.ver is None:  # (a version given, a Redis tier's copy: the column first, version 16)
            self.show_versions()
        self.need_expires(expires)  # (likewise the expires column: version 18)
        if table.holds:
            table.reclaim_held()  # (what the views no longer pin: before the limits are judged)
        if old != EMPTY and table.pinned(old):
            if not table.holds:
                raise pinned_error("replaced")
            # A view reads the old value: it is held aside for the view, and the new one stored as a new entry.
            h[H_UPDATES] += 1
            table.detach(old)
            old = EMPTY
        elif old != EMPTY:
            h[H_UPDATES] += 1
            if not table.overwrite(old, encoded, expires, version, idle):
                table.remove(old)
                old = EMPTY
        if old == EMPTY:
            try:
                stored = table.insert(encoded, expires, version, idle)
            except NoSpaceError:
                h[H_WRITING] = 0
                raise
            if not stored:
                h[H_WRITING] = 0
                return False
        h[H_PUTS] += 1
        now = self.clock()
        if not 0 <= now - h[H_LAST_PUT] < _SECOND_NS:  # to the second: the line is written once a second at most
            h[H_LAST_PUT] = now
        h[H_WRITING] = 0
        return True

    store = updating_entries(write)
    store.__doc__ = """Store ``encoded`` as the most recent, expiring at ``expires`` (0: never), with ``version``
        (0: the next of the version clock) and ``idle`` (its time to idle and deadline: ``expiry``); ``old`` is the
        key's resident entry (expired or not), or EMPTY.
        Whether it was stored: False if a new entry was not admitted (keep, full; or the room it needs is all
        pinned or held by open views: ``Table.insert``; an ``old`` replaced is gone then).

        :raises TooLargeError: if ``size`` exceeds the byte limit in force (nothing changes).
        :raises PinnedError: if ``old`` is pinned on a segment of version 11 or before (nothing changes).
        """

    # ------------------------------------------------------------------------------------------- operations

    def delete(self, kb: bytes, fp: int) -> bool:
        e = self.find_live(kb, fp)
        if e == EMPTY:
            return False
        self.drop(e, H_DELETES, "deleted")
        return True

    def store_if(self, present: bool, version: int | None, ttl, encoded: Encoded, tti=None) -> bool:
        """Store only if the key is ``present`` (and, with ``version``, still has that version); whether it was."""
        old = self.find_live(encoded.kb, encoded.fp, not present)
        if (old != EMPTY) != present or (version is not None and self.version(old) != version):
            if encoded.size > self.h[H_MAX_RETAINED]:  # refused as a put would be, whether or not the key is present
                raise self.refuse_locked(encoded.size)
            return False
        expires, idle = self.expiry(ttl, tti)
        return self.store(old, encoded, expires, 0, idle)

    def read(self, kb: bytes, fp: int):
        """get's locked part (the Python path): None on a miss (counted); else the entry becomes the most recent, a
        hit is counted, and (tag, body, checksum, slot, head) is copied out for the caller to check after the
        unlock. An array's body is the array itself, its data copied once straight from the segment, and ``head``
        the bytes its checksum covers besides (``codec.copy_array``); for any other value ``head`` is None."""
        e = self.find_live(kb, fp)
        if e == EMPTY:
            self.h[H_MISSES] += 1
            return None
        self.hit(e)
        v0 = block.value_at(self.rec, 0, e)
        vlen = self.rec.vlen[e]
        tag = self.arena[v0]
        if tag == TAG_ARRAY:
            body, head = copy_array(self.arena[v0 : v0 + vlen])
        else:
            v0 += self.base
            body, head = self.mm[v0 + 1 : v0 + vlen], None
        return tag, body, self.rec.check[e], e, head

    def put(self, ttl, encoded: Fields, tti=None) -> bool:
        """put's locked part (the Python path): ``encoded`` stored where the policy puts it, expiring after ``ttl``
        (ns; None: the default, which, found damaged, is repaired first, then used) or once not read for ``tti``
        (ns; None: the default, likewise); whether it was stored."""
        if ttl is None and not 0 <= self.h[H_DEFAULT_TTL] <= MAX_TTL_NS:
            self.repair()
        if tti is None and config.tti_problems(self.seg.idle_words, self.seg.geometry.lazy):
            self.repair()
        expires, idle = self.expiry(ttl, tti)
        return self.store(self.find_live(encoded[0], encoded[3], True), encoded, expires, 0, idle)

    def get_with_version(self, kb: bytes, fp: int):
        """A lookup as get's (the composed path: find_live, body, hit): (tag, body, version), or None."""
        e = self.find_live(kb, fp)
        if e == EMPTY:
            self.h[H_MISSES] += 1
            return None
        tag, body = self.body(e)
        self.hit(e)
        return tag, body, self.version(e)

    def touch(self, kb: bytes, fp: int, ttl) -> bool:
        e = self.find_live(kb, fp)
        if e == EMPTY:
            return False
        deadline = self.expires_at(ttl)
        ttis = self.table.ttis
        if ttis is not None and 0 < ttis[e] <= MAX_TTL_NS:  # an idle entry: a touch is a read, and a new deadline
            soon = self.clock() + ttis[e]
            # (the expiry first, the deadline after: a read without the lock that sees one and not the other only
            # decides from them whether to take the lock, lapsed_unlocked, and the locked path judges again)
            self.set_expiry(e, soon if not deadline or soon < deadline else deadline)
            self.table.deadlines[e] = deadline
        else:
            self.set_expiry(e, deadline)
        return True

    @updating
    def expire(self) -> int:
        return self.table.reclaim_expired()

    def pop(self, kb: bytes, fp: int) -> tuple[int, bytes] | None:
        e = self.find_live(kb, fp)
        if e == EMPTY:
            self.h[H_MISSES] += 1
            return None
        if not self.table.holds:
            self.table.refuse_pinned(e, "popped")
        found = self.body(e)
        self.drop(e, H_DELETES, "popped")
        self.h[H_HITS] += 1
        return found

    def incr(self, key, kb: bytes, fp: int, delta: int, initial: int | None):
        """The new value, or the exception to raise once the lock is released: raised here, a KeyError or a
        TypeError would be taken for damage (see ``Guard.fault``) and cost a repair."""
        old = self.find_live(kb, fp, initial is not None)
        if old == EMPTY:
            if initial is None:
                return KeyError(key)
            current = initial
            expires, idle = self.expiry(None, None)
        else:
            tag, body = self.body(old)
            # A few bytes, decoded under the lock: never unpickled (a pickle cache stores ints as msgpack).
            decoded = decode_body(tag, body) if tag == TAG_MSGPACK else None
            if type(decoded) is not int:
                what = type(decoded).__name__ if tag == TAG_MSGPACK else "non-int"
                return TypeError(f"incr on a {what} value: only int values can be incremented")
            current = decoded
            self.need_expires(0)  # (the column in use, and not shown here: taken before its word is read)
            expires = self.exp[old]  # a counter keeps its expiry (memcached does the same)
            ttis = self.table.ttis
            idle = NO_IDLE if ttis is None else (ttis[old], self.table.deadlines[old])
            if 0 < idle[0] <= MAX_TTL_NS:  # an idle entry's store restarts its idle time, within its deadline
                soon = self.clock() + idle[0]
                expires = soon if not 0 < idle[1] < soon else idle[1]
        value = current + delta
        self.store(old, self.encode(key, value, kb), expires, 0, idle)
        return value

    @updating
    def delete_prefix(self, prefix: bytes) -> int:
        """Remove every entry whose stored key starts with ``prefix`` (no view pins); how many. Walks the whole LRU
        list (bounded by the table size), like clear(): for rare maintenance, not the hot path."""
        rec, mm, base, table, n = self.rec, self.mm, self.base, self.table, len(prefix)
        doomed = []
        e = rec.next[SENTINEL]
        for _ in range(table.slots):
            if e == SENTINEL:
                break
            if rec.klen[e] >= n:
                k0 = block.key_at(rec, base, e)
                if mm[k0 : k0 + n] == prefix and not table.pinned(e):
                    doomed.append(e)
            e = rec.next[e]
        for e in doomed:
            table.remove(e)
        self.h[H_DELETES] += len(doomed)
        return len(doomed)

    def count(self, deltas) -> None:
        """Add to header counters: ``(word, delta)`` pairs (never below 0: a clear() may have reset one between)."""
        h = self.h
        for word, delta in deltas:
            h[word] = max(0, h[word] + delta)

    def count_stale(self, word: int) -> None:
        """Add one to stale-serving counter ``word`` of the stripes region (``S_STALE_HITS``...; none before
        version 11), clamped to a counter's range (any value there is valid)."""
        st = self.seg.stripe_words
        if st is not None:
            st[word] = min(max(st[word], 0), MAX_COUNTER - 1) + 1

    def time_left(self, kb: bytes, fp: int) -> int | None:
        """The ns the key has left to live (0: it never expires), or None if it is absent or expired (dropped, and
        counted, as find_live drops it); no lookup is counted and nothing moves."""
        e = self.find_live(kb, fp)
        if e == EMPTY:
            return None
        x = self.exp[e]
        return max(x - self.clock(), 1) if x else 0

    def live_entries(self, space: int) -> int:
        """How many entries iterating ``space`` yields (0: the keys of no kind; k: kind k's): the resident ones less
        those expired and not yet dropped, which no lookup or listing shows. Read only: the expired stay for the
        next operation that meets them. A count out of range (damaged) is repaired first, so the number returned
        is always valid."""
        resident = kinds.resident_locked(self.seg, space)
        if resident is None:
            self.repair()  # len() must not raise a raw ValueError on a damaged count
            resident = kinds.resident_locked(self.seg, space) or 0
        return max(0, resident - self.table.expired_of_kind(space))

    @updating
    def clear(self) -> int:
        """Drop every entry of every kind, and reset the counters; how many went. Those open views pin are held
        aside for them (version 12), or stay (before it)."""
        h, table, rec = self.h, self.table, self.rec
        before = h[H_ENTRIES]
        if table.holds:
            table.reclaim_held()
        flagged = np.flatnonzero(np.frombuffer(table.pins, dtype=np.uint8,
                                               count=block.handed_out(h, table.slots))).tolist()
        keep = {e for e in flagged if rec.check[e] and table.pinned(e)}
        if not keep:
            table.reset()
        else:  # entries pinned by open views are held aside (or stay); the rest go one by one
            e = rec.next[SENTINEL]
            for _ in range(table.slots):
                if e == SENTINEL:
                    break
                n = rec.next[e]
                if e not in keep:
                    table.remove(e)
                elif table.holds:
                    table.detach(e)
                e = n
        reset_counters(h, self.seg.reader_words, self.seg.stripe_words)
        config.restore(h, self.seg.geometry)  # clear() starts afresh: a damaged configuration word too
        h[H_CLEARS] += 1
        return before - h[H_ENTRIES]

    def stats(self) -> CacheStats:
        if header_problems(self.seg):  # a counter or limit out of range is never reported: repaired first
            self.repair()
        try:
            held = self.table.held()
        except CorruptionError:
            self.repair()
            held = self.table.held()
        seg = self.seg
        return read_stats(self.h, kinds.stats_locked(seg), seg.reader_words, self.table.ghost, held, seg.stripe_words,
                          seg.idle_words if seg.geometry.lazy_columns else None)

    def pin(self, kb: bytes, fp: int, fd: int) -> Any:
        """Pin the key's entry through description ``fd`` for a view, counted as a lookup: (slot, value offset in
        the arena, value length, checksum, version); None on a miss; UNVIEWABLE for a value view() does not serve.

        :raises CorruptionError: for a value tag no encoder writes (counted as a miss; the guard repairs).
        """
        e = self.find_live(kb, fp)
        if e == EMPTY:
            self.h[H_MISSES] += 1
            return None
        voff = block.value_at(self.rec, 0, e)
        tag = self.arena[voff]
        if tag not in _VIEWABLE:
            if tag not in _WRITTEN:
                # Damage (the checksum covers the tag): a miss, and raised so, the guard's deep repair drops it.
                self.h[H_MISSES] += 1
                raise CorruptionError(f"entry {e}: value tag {tag} is none an encoder writes", what="view",
                                      hint="the entry was dropped; the operation can be retried")
            return UNVIEWABLE  # refused before anything is counted or pinned
        # Ordering: the flag before the kernel lock, so a holder dying between the two leaves a stale flag (cleared
        # by the next who tests it), never a pin nobody can see.
        self.table.pins[e] = 1
        ofd.lock(fd, ofd.PIN_BASE + e, ofd.READ, wait=False)  # never refused: pin bytes are only ever read-locked
        self.hit(e)
        return e, voff, self.rec.vlen[e], self.rec.check[e], self.version(e)

    @updating
    def resize(self, capacity: int, max_entries: int | None, max_retained: int | None = None) -> bool:
        """Give the cache ``capacity`` bytes (at most the geometry's ``capacity_bytes``) and the entry limit
        ``max_entries`` (None: as it is), while every process serves: the byte limit becomes the capacity, as at
        creation (``max_retained``: that one instead, at most the capacity), and is met at once by evicting as the
        policy does. The ring takes the arena the capacity and the index need (``Geometry.ring_nbytes``): where it
        wraps, its live blocks are first slid down to the arena's start (``Arena.compact``). A smaller ring lowers
        the extent, and the memory past it is given back where no other process reads without the lock
        (``release``). Under version 10 an entry limit that needs another index gets it (``Table.reindex``, the
        tables backed first). Whether anything changed (then ``resizes`` counts it: every process takes the new
        tables before its next call, Segment.refresh_tables).

        Entries that open views pin and that the new limits leave no room for are held aside (``Table.hold_excess``;
        version 12): out of the index at once, their bytes given back as the views end.

        Crash windows: everything is written inside the dirty bracket, so a holder killed part-way leaves a repair
        that keeps the entries whose checksums hold, under whichever capacity the configuration's checksums name
        (the old before its words are written, the new after: config.py).

        :raises PinnedError: a block that an open view reads lies past the end of the ring a smaller capacity (before
            version 13, a lower entry limit too) makes (or, before version 12, entries pinned by open views exceed
            the new limits): the old capacity and limits stay; the evictions made stay made.
        """
        seg, h, g = self.seg, self.h, self.seg.geometry
        old = config.capacity(h, g)
        entries = h[H_MAX_ENTRIES] if max_entries is None else max_entries
        retained = capacity if max_retained is None else min(max_retained, capacity)
        if (capacity, entries) == (old, h[H_MAX_ENTRIES]) and h[H_MAX_RETAINED] == retained:
            return False
        live = seg.geometry.index_for(entries) if seg.version >= 10 else self.mask + 1
        old_live = self.mask + 1
        if seg.version >= 10:  # the larger tables backed before anything is written (NoSpaceError)
            seg.show_tables(max(live, self.mask + 1), entries, h[H_UNUSED_NEXT], adopt=False)
        before = h[H_MAX_ENTRIES], h[H_MAX_RETAINED], h[H_CAPACITY]
        size, was = g.ring_nbytes(capacity, entries), seg.ring()
        top, top_was = g.extent_top(capacity, entries), seg.extent_top()  # (version 13: the limit's, below the ring)
        # Counted first: a holder killed from here on leaves ``resizes`` moved, so that every process takes the
        # tables again (Segment.refresh_tables) once the repair has settled them, whichever limit that keeps.
        counted = h[H_RESIZES]
        count_resize(h)
        try:
            # First the byte limit, under the capacity in force, and evictions to the new entry limit (written last:
            # the ring's size follows it, so it moves only once the blocks are where the new ring has them): what no
            # longer fits goes, as the policy chooses.
            config.set_limits(h, h[H_MAX_ENTRIES], min(retained, old))
            self.meet(entries, min(retained, old))
            tail, fill = h[H_TAIL], h[H_FILL]
            if size == was and top >= top_was:
                pass  # the ring keeps its size (version 13: a higher entry limit): every block stays put
            elif fill == 0:
                h[H_HEAD] = h[H_TAIL] = 0
            elif tail + fill <= min(size, was, top):  # unwrapped, within both rings and the top: the blocks stay
                h[H_HEAD] = 0 if tail + fill == size else tail + fill
            else:
                self.table.ring.compact(min(size, was), h[H_UNUSED_NEXT])
                # The ring is [0, fill) now; its head as the new size places it (a ring that ends at the old, smaller
                # size's very end does not end at the new one's).
                h[H_HEAD] = 0 if h[H_FILL] == size else h[H_FILL]
        except PinnedError:
            config.set_limits(h, *before)
            h[H_RESIZES] = counted  # (nothing changed: the tables as every process has them)
            raise
        config.set_limits(h, entries, retained, capacity)
        # The entries past the slots the new limit hands out move below them, so that the pages past those can be
        # given back (version 10; the evictions above left at most the limit resident).
        shown = seg.slots_shown
        unused = self.table.pack(g.slots_for(entries, 0)) if seg.version >= 10 else 0
        if live != self.mask + 1:
            self.table.reindex(live)
        elif seg.version >= 10:
            seg.show_tables(live, entries, h[H_UNUSED_NEXT], backed=True)  # (the limit in force: the ring's)
        seg.shown[3] = h[H_RESIZES]  # (this mapping has the new tables)
        # Memory is given back only once no handle is still in a read without the lock begun before now
        # (Segment.release says why; readers.quiesce how): under lru, reads take the lock. Asked once, if needed.
        safe: list[bool] = []

        def give_back() -> bool:
            if not safe:
                safe.append(not self.table.pol.reads_unlocked or readers.quiesce(seg))
            return safe[0]

        ext, lower = seg.extent(), size < was or top < top_was
        if lower:  # the ring is unwrapped here: [tail, tail + fill), pinned blocks included
            ext = min(ext, g.ring_extent_after(h[H_TAIL] + h[H_FILL], capacity, entries))
        if lower and h[H_ARENA_EXTENT] != ext:  # the extent past the blocks and the top: lowered
            h[H_ARENA_EXTENT] = ext
            seg.release(ext, give_back())
        if seg.version >= 10 and (live < old_live or g.slots_for(entries, unused) < shown):
            seg.shrink_tables(live, entries, unused, give_back())
        return True

    @updating_entries  # (as a put's evictions: each removal opens the stripes it writes)
    def evict_toward(self, most_entries: int, most_bytes: int, entries_step: int, bytes_step: int) -> bool:
        """One short hold's share of the evictions that lower limits will need: evict as the policy chooses until
        at most ``most_entries`` entries of ``most_bytes`` bytes are resident, or ``entries_step`` entries or
        ``bytes_step`` bytes fewer than now, whichever comes first. The limits stay as they are. Whether the cache
        is within the two already (or nothing more can go: the rest is pinned, which the new limits will report).
        ``SharedCache.resize`` and ``set_limits`` call it before they lower the limits, so that the hold that
        lowers them has little left to evict. (twin: _core_sections.c evict_toward_locked)"""
        h = self.h
        entries, nbytes = h[H_ENTRIES], h[H_RETAINED]
        if entries <= most_entries and nbytes <= most_bytes:
            return True
        target_entries = max(most_entries, entries - entries_step, 0)
        target_bytes = max(most_bytes, nbytes - bytes_step, 0)
        try:
            self.table.evict_until(max(h[H_MAX_ENTRIES] - target_entries, 0),
                                   max(h[H_MAX_RETAINED] - target_bytes, 0))
        except PinnedError:
            return True
        return h[H_ENTRIES] <= most_entries and h[H_RETAINED] <= most_bytes

    @updating
    def set_limits(self, max_entries: int | None, max_retained_bytes: int | None) -> None:
        """New limits (None: keep that one), met at once by evicting.

        A byte limit above the capacity in force (read here, under the lock: another process may have resized
        since the caller looked) grows the capacity to it (``resize``).

        Entries that open views pin and that the new limits leave no room for are held aside (version 12:
        ``meet``).

        :raises PinnedError: only on a segment of an older layout: before version 13, if a ring made smaller by a
            lower entry limit would end before a block that an open view reads (``resize``); before version 12, if
            entries pinned by open views alone exceed the new limits (the old limits stay).
        """
        h = self.h
        if max_retained_bytes is not None and max_retained_bytes > config.capacity(h, self.seg.geometry):
            self.resize(max_retained_bytes, max_entries)
            return
        if (self.seg.version >= 10 and max_entries is not None
                and max_entries != h[H_MAX_ENTRIES]):  # other tables and ring: a resize of the entries
            self.resize(config.capacity(h, self.seg.geometry), max_entries,
                        h[H_MAX_RETAINED] if max_retained_bytes is None else max_retained_bytes)
            return
        before = h[H_MAX_ENTRIES], h[H_MAX_RETAINED]
        config.set_limits(h, before[0] if max_entries is None else max_entries,
                          before[1] if max_retained_bytes is None else max_retained_bytes)
        try:
            self.meet(h[H_MAX_ENTRIES], h[H_MAX_RETAINED])
        except PinnedError:
            # (before version 12) Pinned entries alone exceed the new limits: the old ones stay (the evictions
            # made still meet them).
            config.set_limits(h, *before)
            raise

    def meet(self, most_entries: int, most_bytes: int) -> None:
        """Evict as the policy chooses until the resident entries, with the held ones, are at most ``most_entries``
        of ``most_bytes`` bytes; where what is left is pinned by open views, hold aside those that views pin until
        the resident ones alone are (``Table.hold_excess``, version 12). Lowered limits' evictions: the held ones
        go as their views end, and no new entry is admitted until the resident and held ones are within the limits.
        Under the caller's dirty bracket.

        :raises PinnedError: before version 12, if what is left to evict is pinned (the evictions made stand).
        """
        h, table = self.h, self.table
        try:
            table.evict_until(max(h[H_MAX_ENTRIES] - most_entries, 0), max(h[H_MAX_RETAINED] - most_bytes, 0))
        except PinnedError:
            if not table.holds:
                raise
            table.hold_excess(most_entries, most_bytes)
