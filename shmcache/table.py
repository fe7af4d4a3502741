"""The segment's tables as one structure: insert, remove, evict and reset entries, keeping the index, the list,
the free list, the arena and the occupancy counters in step. Knows nothing of keys' meaning or of values' encoding.

Every method assumes the cache lock is held and the ``dirty`` word raised (see cache.py). Slot numbers and block
offsets read from the segment are checked before the first write, so damaged words raise CorruptionError (and the
caller repairs) instead of aiming a write at another entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import block, index, lru, ofd, policies
from .block import PAD
from .arena import Arena
from .errors import CorruptionError, PinnedError
from .lock import TICK_EVERY, progressed
from .readers import slot_pinned
from .records import narrow_pfp
from .seqlock import open_seq, open_stripe
from .layout import BLOCK_ALIGN, BLOCK_HEADER_NBYTES, EMPTY, KIND_PREFIX, MAX_TTL_NS, NEVER, NIL, SENTINEL
from .layout.dtypes import (
    EXTENT_STEP, IDLE_SHARE,
    H_ENTRIES,
    H_EVICTIONS, H_EXPIRED, H_FREE_HEAD, H_INDEX_SLOTS, H_MAX_ENTRIES, H_MAX_RETAINED, H_NEXT_EXPIRY, H_RETAINED,
    H_UNUSED_NEXT, H_VERSION_CLOCK, H_WRITING, K_ENTRIES, K_RETAINED,
    KIND_WORDS, BLOCK_OWNER_SHIFT, H_ADMITTED, H_GHOST_CLOCK, H_NOT_ADMITTED, H_SMALL, H_SMALL_FIRST, MARK_FREQ,
    MARK_SMALL, MARKS_VALID, HELD_SLOT, PACKED_ENTRY_SHIFT, PACKED_TAG_MASK, S_HELD, S_HELD_BYTES, S_HELD_FIRST,
)

if TYPE_CHECKING:
    from .store import Fields

NO_IDLE = (0, 0)  # a store's (time to idle, deadline) without a time to idle (Store.expiry)


def pinned_error(what: str) -> PinnedError:
    """The refusal of an operation (``what``: replaced, deleted, popped) on an entry an open view pins."""
    return PinnedError(f"the entry is pinned by an open view and cannot be {what}", what=what,
                       hint="close the view (leave its with block) first")


class Table:
    """The structures of one mapped segment."""

    def __init__(self, seg, clock) -> None:
        g = seg.geometry
        self.seg = seg
        self.clock = clock  # CLOCK_MONOTONIC ns (see cache.py); expiry compares it with the expires column
        self.h, self.ix, self.rec, self.mm = seg.header_words, seg.index_words, seg.records, seg.mm
        self.index = index.of(g)  # the index's functions for this segment's slots (two words, or one: version 15)
        self.exp, self.kinds, self.pins = seg.expires_words, seg.kinds_bytes, seg.pins_bytes
        self.kw = seg.kind_words
        self.marks = seg.marks_bytes
        self.pol = pol = policies.of(g.policy)  # what a hit, an insert and an eviction do (policies/)
        self.seqlocked = pol.reads_unlocked  # gets and views read without the lock: see seqlock.py
        self.stripes = seg.stripe_words  # (None before version 11: seq alone)
        self.holds = seg.holds  # version 12: a pinned entry its key's put replaces is held aside (``detach``)
        # The steps a policy adds to the list's (None: the base's, skipped): bound once, for the hot paths.
        self._admit, self._unlinked, self._on_hit = pol.step("admit"), pol.step("unlinked"), pol.step("on_hit")
        self.base = g.arena_off
        self.ring = Arena(seg.header_words, seg.records, seg.mm, g.arena_off, g.arena_nbytes, g.entry_slots,
                          self.pins, self.pinned, seg.back, EXTENT_STEP, seg.shown, seg.ring, seg.extent_top)

    @property
    def mask(self) -> int:
        """The index in force's slots less one (a resize changes it: Segment.show_tables)."""
        return self.seg.mask

    @property
    def slots(self) -> int:
        """The entry slots this mapping shows: every slot handed out is below it, and one at or past it (only damage
        names it) is refused as out of range, never read or written as this process's own zero pages. (twin:
        _core.h SLOT_OK)"""
        return self.seg.slots_shown

    @property
    def ver(self) -> memoryview | None:
        """Each entry's version, where this mapping shows the column (version 16: once a caller asked for a
        version, Store.show_versions); None: nobody has, and stores write none."""
        return self.seg.versions_live

    @property
    def ttis(self) -> memoryview | None:
        """Each entry's time to idle (version 14), where this mapping shows the column (version 16: once in use,
        Segment.show_idle); None: no entry has one."""
        return self.seg.ttis_live

    @property
    def deadlines(self) -> memoryview | None:
        """The deadline each idle entry's time to live set, shown as ``ttis`` is."""
        return self.seg.deadlines_live

    @property
    def ghost(self) -> memoryview:
        """The ghost's words in force (s3fifo; as many as the index's slots, GHOST_WAYS at least)."""
        return self.seg.ghost_words

    def close(self) -> None:
        self.ring.close()
        self.ring.pinned = None  # (the ring's reference to self: a cycle would keep the segment to the collector)

    def open_slot(self, s: int) -> None:
        """Open the stripe of index slot ``s`` before it is written (seqlock.open_stripe; not under lru)."""
        if self.seqlocked:
            open_stripe(self.h, self.stripes, s, self.mask)

    def open_entry(self, e: int) -> None:
        """Open the stripe of the index slot that points at resident entry ``e`` before the entry is written or its
        pins asked (not under lru): where a reader found it. A slot word that does not point back (damage) opens
        ``seq``, which every reader validates. (twin: _core_table.c entry_open)"""
        if self.seqlocked:
            s, mask = self.rec.slot[e], self.mask
            if 0 <= s <= mask and self.index.entry(self.ix, s) == e:
                open_stripe(self.h, self.stripes, s, mask)
            else:
                open_seq(self.h)

    def pfp(self, fp: int) -> int:
        """The fingerprint the policy's sketch or ghost takes for key fingerprint ``fp``: ``fp`` in wide records; in
        narrow ones its low 32 bits (all an entry's index slot keeps) spread over 63 (records.narrow_pfp).
        (twin: _core.h pfp)"""
        return narrow_pfp(fp) if self.rec.fp is None else fp

    def entry_pfp(self, e: int) -> int:
        """``pfp`` of resident entry ``e``'s fingerprint: its record's, or (narrow) its index slot's tag, 0 where
        the record names no slot of the index (damage, or a held entry). (twin: _core.h entry_pfp)"""
        rec = self.rec
        if rec.fp is not None:
            return rec.fp[e]
        s = rec.slot[e]
        return narrow_pfp(self.ix[s] if 0 <= s <= self.mask else 0)

    def fingerprint_is(self, e: int, fp: int) -> bool:
        """Whether resident entry ``e``'s fingerprint is ``fp``: its record's (wide), or, a narrow record keeping
        none, the tag of the index slot its record names, which must name it back."""
        return index.keyed(self.index, self.ix, self.rec, self.mask, e, fp)

    def pinned(self, e: int) -> bool:
        """Whether a view (of any process, this one included) still pins entry ``e``. The pins column only says
        that one may: a pin dies with its process without a word written, so the kernel lock is what counts, and
        a flag found without one is cleared. The entry's stripe is opened first (under s3fifo, keep and auto): see
        seqlock.open_stripe. A held entry counts as pinned until ``reclaim_held`` gives it back: its block never
        moves, and nothing but that reclaim frees it."""
        if self.holds and self.rec.slot[e] == HELD_SLOT:
            return True
        self.open_entry(e)
        if self.pinned_now(e):
            return True
        if self.pins[e]:
            self.pins[e] = 0
        return False

    def pinned_now(self, e: int) -> bool:
        """Whether a view pins entry ``e`` as the flag, the pin byte and the reader slots' words say now, without
        opening its stripe or clearing a stale flag: what an eviction's scan decides by (moving an entry in the
        queues writes nothing a reader reads), so that it opens only the stripes it writes; the one it removes is
        asked again by ``pinned``. A held entry counts as pinned, as for ``pinned``. (twin: _core_table.c
        pinned_now)"""
        if self.holds and self.rec.slot[e] == HELD_SLOT:
            return True
        return bool(self.pins[e]) and self._pin_held(e)

    def _pin_held(self, e: int) -> bool:
        """Whether a view holds a pin on entry ``e`` now, whatever its flag says. (twin: _core_table.c pin_held)"""
        # Views lock through descriptions of their own (view.py), so this handle's own pins show up here too; the
        # compiled section's views without the lock pin in their reader slot instead (readers.py). Ordering: the
        # words first, then the byte: a viewer about to fork moves each word pin to the byte (byte locked, then word
        # given back), and asked the other way round a query between the two would find neither.
        return bool(self.seqlocked and slot_pinned(self.seg.reader_words, self.seg.live_fd, e)) or (
            ofd.held_elsewhere(self.seg.live_fd, ofd.PIN_BASE + e))

    # ------------------------------------------------------------------------------------------- held entries

    def held(self) -> tuple[int, int]:
        """How many entries are held aside for views (``detach``) and their keys' and values' bytes, which count
        against the limits as resident ones do; (0, 0) before version 12.

        :raises CorruptionError: if a count is out of range (the caller repairs, which counts them again).
        (twin: _core_table.c held_counts)
        """
        if not self.holds:
            return 0, 0
        st = self.stripes
        n, nbytes = st[S_HELD], st[S_HELD_BYTES]
        if not (0 <= n < self.slots and 0 <= nbytes <= self.ring.nbytes and (n == 0) == (nbytes == 0)):
            raise CorruptionError(f"the held entries' counts are out of range ({n} entries, {nbytes} bytes)",
                                  what="put")
        return n, nbytes

    def detach(self, e: int) -> None:
        """Hold resident entry ``e``, which a view pins, aside (version 12): it leaves the index, the list, the
        queues and the occupancy counts, so that its key is free for a new entry at once, while its slot and
        block stay as they are for the views that read them, until ``reclaim_held`` finds its pins all ended.
        (twin: _core_table.c detach)"""
        h, rec, slots, st = self.h, self.rec, self.slots, self.stripes
        if not 0 < e < slots:
            raise CorruptionError(f"entry slot {e} is out of range", what="remove")
        p, n, off, klen, vlen, s = rec.links(e)
        if not (0 <= s <= self.mask and self.index.entry(self.ix, s) == e and 0 <= p < slots
                and 0 <= n < slots):
            raise CorruptionError(f"entry {e} has links that do not point back at it", what="remove")
        nb = block.nbytes(klen + vlen)
        if not 0 <= off <= self.ring.nbytes - nb or off & 7 or self.ring.words[off >> 3] != block.header(nb, e):
            raise CorruptionError(f"entry {e}'s block at {off} is out of the arena or not its own", what="remove")
        held, held_bytes = self.held()
        self.open_slot(s)
        # Crash window: the slot word first. From here on a repair takes the entry for a held one (kept while a
        # view pins it, else given back), never for a resident one: its key's new entry may be stored beside it.
        rec.slot[e] = HELD_SLOT
        # Then remove's steps (inlined there, on every eviction's path), but for the slot and the block.
        self.index.remove(self.ix, rec, self.mask, s, self.open_slot if self.seqlocked else None)
        rec.next[p] = n  # lru.unlink, inlined
        rec.prev[n] = p
        if self._unlinked is not None:
            self._unlinked(self, e, n)
        self.marks[e] = 0
        rec.next[e] = rec.link(st[S_HELD_FIRST])  # (a header word, damaged or not: as the record keeps it)
        st[S_HELD_FIRST] = e
        st[S_HELD] = held + 1
        st[S_HELD_BYTES] = held_bytes + klen + vlen
        h[H_ENTRIES] -= 1
        h[H_RETAINED] -= klen + vlen
        if self.exp[e]:  # (never 0 over 0: a column not shown here is this mapping's own zero pages, version 18)
            self.exp[e] = 0
        k = self.kinds[e]
        if k:
            self.kw[k * KIND_WORDS + K_ENTRIES] -= 1
            self.kw[k * KIND_WORDS + K_RETAINED] -= klen + vlen

    def reclaim_held(self) -> int:
        """Give back the slot and block of every held entry whose pins have all ended; how many. A walk of the
        held list, a kernel query per entry: the list is as long as the views that outlived their key's value.
        (twin: _core_table.c reclaim_held)"""
        held, held_bytes = self.held()
        if not held:
            return 0
        h, rec, st = self.h, self.rec, self.stripes
        prev, e, freed = NIL, st[S_HELD_FIRST], 0
        for _ in range(held):
            if not 0 < e < self.slots or rec.slot[e] != HELD_SLOT or not rec.check[e]:
                raise CorruptionError(f"the held list names entry slot {e}, which is not held", what="put")
            after = rec.next[e]
            if self._pin_held(e):
                prev = e
            else:
                klen, vlen = rec.klen[e], rec.vlen[e]
                # Crash window: the block first (a repair then finds a held entry whose block is not its own, and
                # gives the slot back), then the slot off the held list and onto the free list.
                self.ring.free(rec.off[e] << rec.osh, block.nbytes(klen + vlen), e)
                if prev == NIL:
                    st[S_HELD_FIRST] = after
                else:
                    rec.next[prev] = after
                rec.check[e] = 0
                rec.slot[e] = 0
                self.pins[e] = 0
                rec.next[e] = rec.link(h[H_FREE_HEAD])
                h[H_FREE_HEAD] = e
                held -= 1
                held_bytes -= klen + vlen
                st[S_HELD], st[S_HELD_BYTES] = held, held_bytes
                freed += 1
            e = after
        if e != NIL or held_bytes < 0 or (held == 0) != (held_bytes == 0):
            raise CorruptionError("the held list disagrees with its counts", what="put")
        return freed

    def refuse_pinned(self, e: int, what: str) -> None:
        """Raise PinnedError if entry ``e`` is pinned: its bytes must stay as they are while a view reads them."""
        if self.pinned(e):
            raise pinned_error(what)

    def touch(self, e: int) -> None:
        """A hit on resident entry ``e``, as the policy takes it: lru moves it to the front (the caller raised the
        dirty word), s3fifo raises its counter, keep does nothing."""
        if self._on_hit is not None:
            self._on_hit(self, e)

    def insert(self, encoded: Fields, expires: int, version: int = 0, idle: tuple[int, int] = NO_IDLE) -> bool:
        """Store ``encoded`` (the key is absent) where the policy puts a new entry, evicting first as the limits
        require: expired entries, then what the policy chooses, pinned ones excepted; and, if pinned blocks split
        the free space so that no run of ``encoded.nb`` bytes is left, more (what is not pinned) until one is.
        ``expires``: its expiry time (0: never); ``version`` the version to give it (0: the clock's next);
        ``idle``: its time to idle and the deadline its time to live set (``Store.expiry``; version 14). False
        (nothing stored, counted in ``not_admitted``) if it is not admitted: under keep, with no room left; under
        every policy, when what is left to evict is all pinned or held by open views, or pinned blocks split the free
        space (the evictions made stand; every structure is consistent). A cache may always miss, so a put that
        cannot make room without taking bytes from a reader stores nothing rather than raising.
        """
        # The one place eviction is decided (with evict_until and evict_one below). Slot allocation, index.insert's
        # first probe, lru.push_front (the entry's own links in the pack below) and block.value_at are inlined:
        # this is every new key's path.
        if len(encoded) == 7:
            kb, tag, body, fp, check, size, nb = encoded
            placed = -1
        else:  # a store.Placed: restored with the marks its entry had (-1: none, or a policy that keeps none)
            kb, tag, body, fp, check, size, nb, placed = encoded
            placed = placed & MARKS_VALID if self.pol.marks_on_hit else -1
        h, rec, ix, mm, pol = self.h, self.rec, self.ix, self.mm, self.pol
        # Asked before evicting (s3fifo's ghost, whose keys may take this one's ghost slot).
        admit = self._admit
        probation = admit is not None and admit(self, fp)
        if placed >= 0:  # (asked all the same: what it counts, as for any new key)
            probation = bool(placed & MARK_SMALL)
        held, held_bytes = self.held() if self.holds else (0, 0)  # (held entries count against the limits)
        if h[H_ENTRIES] + held >= h[H_MAX_ENTRIES] or h[H_RETAINED] + held_bytes + size > h[H_MAX_RETAINED]:
            if pol.evicts_to_admit:
                try:
                    self.evict_until(1, size)
                except PinnedError:  # the rest is pinned or held: not admitted
                    h[H_NOT_ADMITTED] += 1
                    return False
            elif not self.room_without_evicting(size):
                h[H_NOT_ADMITTED] += 1
                return False
        klen, vlen = len(kb), len(body) + 1
        # The slot is chosen first (its number goes in the block header) but taken only once the block is had:
        # an allocation refused because pinned blocks split the free space must leave the slots as they were (an
        # eviction then frees a slot, so the choice is made again). ``writing`` names the slot once it is known to
        # be free (the caller clears it when the store is whole).
        while True:
            e = h[H_FREE_HEAD]
            if e == NIL:
                e = h[H_UNUSED_NEXT]
                if not 0 < e < self.slots:
                    raise CorruptionError(f"no free entry slot (unused_next={e})", what="put")
            elif not 0 < e < self.slots or rec.check[e]:
                raise CorruptionError(f"free list names slot {e}, which is out of range or resident", what="put")
            h[H_WRITING] = e
            try:
                off = self.ring.alloc(nb, e)
                break
            except PinnedError:
                if not pol.evicts_to_admit:  # no room but what evicting would make: not admitted
                    h[H_WRITING] = 0
                    h[H_NOT_ADMITTED] += 1
                    return False
                if not self.evict_one():  # pinned blocks split what is left: not admitted
                    h[H_WRITING] = 0
                    h[H_NOT_ADMITTED] += 1
                    return False
        if e == h[H_FREE_HEAD]:
            h[H_FREE_HEAD] = rec.next[e]
        else:
            h[H_UNUSED_NEXT] = e + 1
        v0 = self.base + off + BLOCK_HEADER_NBYTES  # a block is [header][value][key]
        k0 = v0 + vlen
        mm[v0] = tag
        mm[v0 + 1 : k0] = body
        mm[k0 : k0 + klen] = kb
        xo = self.index
        s = xo.home(fp, self.mask)
        if xo.entry(ix, s) != EMPTY:
            s = xo.free_slot(ix, self.mask, fp)
        self.open_slot(s)  # (the entry and its block are no reader's until the slot names them)
        # Where it is linked: at the front (lru, keep, and main under s3fifo: Policy.link_new, inlined), or where
        # the policy puts a new key on probation (s3fifo: small's front).
        if probation or placed >= 0:
            p, n = pol.link_new(self, e, probation)
            if placed > 0:
                self.marks[e] |= placed & MARK_FREQ
        else:
            p, n = SENTINEL, rec.next[SENTINEL]  # after the sentinel, before the list's most recent entry
            self.marks[e] = 0
        rec.write(e, p, n, fp, off, klen, vlen, s, check)
        xo.put(ix, s, fp, e)
        rec.prev[n] = e
        rec.next[p] = e
        h[H_ENTRIES] += 1
        h[H_ADMITTED] += 1
        h[H_RETAINED] += klen + vlen
        # The columns: a new version, the expiry (lowering the bound if need be), the kind and no pin.
        if version:  # a version given (a Redis tier's copy): the clock never falls behind a version stamped
            v = version
            if v > h[H_VERSION_CLOCK]:
                h[H_VERSION_CLOCK] = v
        else:
            v = h[H_VERSION_CLOCK] + 1
            h[H_VERSION_CLOCK] = v
        ver = self.ver
        if ver is not None:
            ver[e] = v
        if expires != self.exp[e]:  # (never 0 over 0: the column may not be shown here, version 18; a store that
            self.exp[e] = expires   # gives an expiry showed it first, Store.need_expires)
        ttis, deadlines = self.ttis, self.deadlines
        if ttis is not None and deadlines is not None:
            ttis[e], deadlines[e] = idle
        if expires and expires < h[H_NEXT_EXPIRY]:
            h[H_NEXT_EXPIRY] = expires
        self.pins[e] = 0
        if klen > 1 and kb[0] == KIND_PREFIX:
            k = kb[1]
            self.kinds[e] = k
            self.kw[k * KIND_WORDS + K_ENTRIES] += 1
            self.kw[k * KIND_WORDS + K_RETAINED] += klen + vlen
        else:
            self.kinds[e] = 0
        return True

    def room_without_evicting(self, size: int) -> bool:
        """Whether one more entry of ``size`` bytes fits the limits once expired entries are dropped (keep)."""
        h = self.h
        if h[H_NEXT_EXPIRY] != NEVER and h[H_NEXT_EXPIRY] <= self.clock():
            self.reclaim_expired()
        held, held_bytes = self.held()
        return h[H_ENTRIES] + held < h[H_MAX_ENTRIES] and h[H_RETAINED] + held_bytes + size <= h[H_MAX_RETAINED]

    def overwrite(self, e: int, encoded: Fields, expires: int, version: int = 0,
                  idle: tuple[int, int] = NO_IDLE) -> bool:
        """Give resident entry ``e`` (whose key is ``encoded.kb``) the value of ``encoded`` in place, touched as a
        hit is (``touch``), when the new block is as large as the old and the byte limit allows; False (nothing written)
        otherwise. Saves the free, the allocation and the index and list updates of a remove and insert."""
        kb, tag, body, _, check, _, nb = encoded[:7]  # (a store.Placed: its marks are a new entry's only)
        h, rec = self.h, self.rec
        klen, old_vlen, off = rec.klen[e], rec.vlen[e], rec.off[e] << rec.osh
        vlen = len(body) + 1
        # block.nbytes and block.header, inlined: every update's path.
        held_bytes = self.held()[1] if self.holds else 0
        if ((klen + old_vlen + PAD) & -BLOCK_ALIGN != nb
                or h[H_RETAINED] + held_bytes + vlen - old_vlen > h[H_MAX_RETAINED] or not 0 < e < self.slots):
            return False
        # The block must be this entry's own (its header names it) before anything is written into it.
        if (not 0 <= off <= self.ring.nbytes - nb or off & 7
                or self.ring.words[off >> 3] != nb | (e << BLOCK_OWNER_SHIFT)):
            raise CorruptionError(f"entry {e}'s block at {off} is out of the arena or not its own", what="put")
        self.open_entry(e)
        mm = self.mm
        h[H_WRITING] = e  # the caller clears it once the store is whole
        v0 = self.base + off + BLOCK_HEADER_NBYTES  # block.value_at, inlined
        k0 = v0 + vlen
        mm[v0] = tag
        mm[v0 + 1 : k0] = body
        if vlen != old_vlen:
            mm[k0 : k0 + klen] = kb
            rec.vlen[e] = vlen
            h[H_RETAINED] += vlen - old_vlen
            k = self.kinds[e]
            if k:
                self.kw[k * KIND_WORDS + K_RETAINED] += vlen - old_vlen
        rec.check[e] = check
        self.touch(e)
        if version:  # a version given (a Redis tier's copy): the clock never falls behind a version stamped
            v = version
            if v > h[H_VERSION_CLOCK]:
                h[H_VERSION_CLOCK] = v
        else:
            v = h[H_VERSION_CLOCK] + 1
            h[H_VERSION_CLOCK] = v
        ver = self.ver
        if ver is not None:
            ver[e] = v
        if expires != self.exp[e]:  # (never 0 over 0: the column may not be shown here, version 18; a store that
            self.exp[e] = expires   # gives an expiry showed it first, Store.need_expires)
        ttis, deadlines = self.ttis, self.deadlines
        if ttis is not None and deadlines is not None:
            ttis[e], deadlines[e] = idle
        if expires and expires < h[H_NEXT_EXPIRY]:
            h[H_NEXT_EXPIRY] = expires
        return True

    def idle_touch(self, e: int) -> None:
        """A hit on resident entry ``e`` that has a time to idle (version 14): its expiry moved to a tti from now,
        never past its deadline, once that gains ``1/IDLE_SHARE`` of the tti, so that a hot entry's word is written
        a few times a tti, not at every hit. One word: a reader without the lock reads it either side, and both are
        deadlines the entry had; the stripe is opened all the same, as for any write to a resident entry. A time to
        idle or expiry out of range (damage, which verify reports) moves nothing. (twin: _core_sections.c
        idle_touch)"""
        ttis, deadlines = self.ttis, self.deadlines
        if ttis is None or deadlines is None:
            return
        t, x = ttis[e], self.exp[e]
        if not 0 < t <= MAX_TTL_NS or x <= 0:
            return
        fresh = self.clock() + t
        d = deadlines[e]
        if 0 < d < fresh:
            fresh = d
        if fresh - x >= t // IDLE_SHARE:
            self.open_entry(e)
            self.exp[e] = fresh

    def remove(self, e: int) -> None:
        """Drop entry ``e`` from every structure and give its slot and block back."""
        h, rec, slots = self.h, self.rec, self.slots
        if not 0 < e < slots:
            raise CorruptionError(f"entry slot {e} is out of range", what="remove")
        p, n, off, klen, vlen, s = rec.links(e)  # one call, not six reads
        if not (0 <= s <= self.mask and self.index.entry(self.ix, s) == e and 0 <= p < slots
                and 0 <= n < slots):
            raise CorruptionError(f"entry {e} has links that do not point back at it", what="remove")
        self.open_slot(s)
        self.ring.free(off, block.nbytes(klen + vlen), e)
        self.index.remove(self.ix, rec, self.mask, s, self.open_slot if self.seqlocked else None)
        rec.next[p] = n  # lru.unlink, inlined
        rec.prev[n] = p
        if self._unlinked is not None:
            self._unlinked(self, e, n)
        self.marks[e] = 0
        rec.check[e] = 0
        rec.next[e] = rec.link(h[H_FREE_HEAD])  # a free slot's next links the free list, not the LRU list
        h[H_FREE_HEAD] = e
        h[H_ENTRIES] -= 1
        h[H_RETAINED] -= klen + vlen
        if self.exp[e]:  # the column holds resident entries' expiry only, so a scan needs no residency test
            self.exp[e] = 0
        k = self.kinds[e]
        if k:
            self.kw[k * KIND_WORDS + K_ENTRIES] -= 1
            self.kw[k * KIND_WORDS + K_RETAINED] -= klen + vlen

    def evict_until(self, extra_entries: int, extra_bytes: int) -> None:
        """Make room for ``extra_entries`` more entries of ``extra_bytes`` more bytes: expired entries go first,
        then those the policy chooses (lru: the least recently used; keep: the oldest; s3fifo: policies/s3fifo.py),
        pinned entries excepted. Bounded by the table size, so damaged counters raise instead of looping.

        Held entries (``detach``) count against the limits: those whose pins ended are given back first.

        :raises PinnedError: if what is left to evict is all pinned or held (the limits still hold; room is short).
        """
        h, rec = self.h, self.rec
        held, held_bytes = self.held()
        if held:
            self.reclaim_held()
            held, held_bytes = self.held()
        most_entries = h[H_MAX_ENTRIES] - extra_entries - held
        most_bytes = h[H_MAX_RETAINED] - extra_bytes - held_bytes
        if h[H_ENTRIES] <= most_entries and h[H_RETAINED] <= most_bytes:
            return
        if h[H_NEXT_EXPIRY] != NEVER and h[H_NEXT_EXPIRY] <= self.clock():
            self.reclaim_expired()
        if not self.pol.evicts_from_tail:  # the policy's own choice, one at a time
            evict_one = self.pol.evict_one
            for i in range(self.slots):
                if h[H_ENTRIES] <= most_entries and h[H_RETAINED] <= most_bytes:
                    return
                if i and not i & TICK_EVERY:  # a long walk (limits lowered a long way): the waiters wait on
                    progressed(h)
                if not evict_one(self):
                    break
            else:
                raise CorruptionError("evicting never met the limits", what="evict")
            if rec.next[SENTINEL] != SENTINEL or held:
                raise PinnedError("no room: the entries left to evict are pinned by open views", what="put",
                                  hint="close views sooner, or raise the limits")
            raise CorruptionError("the header's counters disagree with the entries on the list", what="evict")
        # lru and keep: from the back of the list (the least recently used; keep's oldest), pinned ones passed over.
        e = rec.prev[SENTINEL]
        pinned = 0
        for i in range(self.slots):
            if h[H_ENTRIES] <= most_entries and h[H_RETAINED] <= most_bytes:
                return
            if e == SENTINEL:
                break
            if i and not i & TICK_EVERY:
                progressed(h)
            p = rec.prev[e]
            if self.pinned(e):
                pinned += 1
            else:
                self.remove(e)
                h[H_EVICTIONS] += 1
            e = p
        if pinned or held:
            raise PinnedError(f"no room: the {pinned + held} entries left to evict are pinned by open views",
                              what="put", hint="close views sooner, or raise the limits")
        raise CorruptionError("the header's counters disagree with the entries on the LRU list", what="evict")

    def hold_excess(self, most_entries: int, most_bytes: int) -> int:
        """Hold aside (``detach``) resident entries that views pin, from the back of the list, until at most
        ``most_entries`` entries of ``most_bytes`` bytes are resident; how many. What lowered limits do once every
        entry they could evict has gone (``Store.set_limits``, ``Store.resize``; version 12): the index keeps within
        the limits at once, and what open views still read is given back as they end. Held entries count against
        the limits, so until then no new entry is admitted (``insert``)."""
        h, rec = self.h, self.rec
        e, held = rec.prev[SENTINEL], 0
        for i in range(self.slots):
            if h[H_ENTRIES] <= most_entries and h[H_RETAINED] <= most_bytes:
                return held
            if e == SENTINEL:
                break
            if i and not i & TICK_EVERY:
                progressed(h)
            p = rec.prev[e]
            if self.pinned(e):
                self.detach(e)
                held += 1
            e = p
        raise CorruptionError("the header's counters disagree with the entries on the list", what="evict")

    def evict_one(self) -> bool:
        """Evict the entry no view pins that the policy chooses; False if there is none."""
        return self.pol.evict_one(self)

    def evict_oldest(self) -> bool:
        """Evict the entry nearest the back of the list that no view pins (lru's least recently used, keep's oldest,
        s3fifo's oldest of small, then of main); False if there is none."""
        rec = self.rec
        e = rec.prev[SENTINEL]
        for _ in range(self.slots):
            if e == SENTINEL:
                return False
            if not self.pinned(e):
                self.pol.leaving(self, e)
                self.remove(e)
                self.h[H_EVICTIONS] += 1
                return True
            e = rec.prev[e]
        raise CorruptionError("the LRU list does not end", what="evict")

    def expired(self, e: int) -> bool:
        """Whether resident entry ``e``'s time to live has run out."""
        x = self.exp[e]
        return bool(x) and x <= self.clock()

    def expired_of_kind(self, kind: int) -> int:
        """How many resident entries of kind ``kind`` (0: of no kind) have expired and are not yet dropped (pinned
        ones included: they read as absent too); nothing is written. None can be while ``next_expiry`` (a lower
        bound of every expiry) is still ahead, so that costs one word; else one vectorised scan of the columns."""
        h = self.h
        now = self.clock()
        if h[H_NEXT_EXPIRY] > now:
            return 0
        handed_out = block.handed_out(h, self.slots)
        x = np.frombuffer(self.exp, dtype=np.int64, count=handed_out)
        k = np.frombuffer(self.kinds, dtype=np.uint8, count=handed_out)
        # A free slot may keep the expiry and kind byte of its last entry: resident ones have a checksum (never 0).
        check = self.rec.column("check", handed_out)
        return int(np.count_nonzero((x != 0) & (x <= now) & (k == kind) & (check != 0)))

    def reclaim_expired(self) -> int:
        """Remove every expired entry that no view pins, count them in ``expired``, and move ``next_expiry`` up to
        the earliest expiry left; how many were removed. One vectorised scan of the expires column (repeated at
        each eviction for as long as an expired entry stays pinned)."""
        h = self.h
        now = self.clock()
        handed_out = block.handed_out(h, self.slots)
        x = np.frombuffer(self.exp, dtype=np.int64, count=handed_out)
        removed = 0
        for e in np.flatnonzero((x != 0) & (x <= now)).tolist():
            if self.rec.check[e] and not self.pinned(e):
                self.remove(e)
                removed += 1
        # The bound covers what stays: entries not yet expired, and expired ones a view pins (the next scan
        # retries them, so that they too go before any live entry once their pins end).
        left = x[x != 0]
        h[H_NEXT_EXPIRY] = int(left.min()) if len(left) else NEVER
        h[H_EXPIRED] += removed
        return removed

    def reindex(self, live: int) -> None:
        """Make the index of ``live`` slots (``index_for``) the one in force, every resident entry in it, and empty
        the ghost if its size changes (version 10: a resize changed the entry limit, already written, to one that
        needs another index).
        Backed and shown first (NoSpaceError before any write); the rest under the caller's dirty bracket and the
        readers' odd seq.

        Crash window: a holder killed part-way leaves the index whole (old or new: it is built aside and copied
        in) or part-copied, and its size word either one; the repair rebuilds the index the checked limit needs
        (verify._settle_index), from the entries.

        The entries are placed as linear probing places them, in one vectorised pass: sorted by home slot, each
        goes to its home or just past the one before it, whichever is later (a running maximum); the few that run
        past the end wrap round."""
        seg, h, g = self.seg, self.h, self.seg.geometry
        old = self.mask + 1
        handed_out = block.handed_out(h, self.slots)
        seg.show_tables(live, h[H_MAX_ENTRIES], handed_out)
        h[H_INDEX_SLOTS] = live
        top = max(old, live)
        slots_all = np.ndarray((top,), g.index_dtype, buffer=seg.mm, offset=g.index_off)
        _, _, entries = seg.arrays()
        resident = np.flatnonzero(entries["check"][:handed_out])
        resident = resident[resident > 0]
        if self.holds:  # a held entry is in no index slot: indexed again, its old value would be found beside the new
            resident = resident[entries["slot"][resident] != HELD_SLOT]
        n = len(resident)
        if n >= live:
            raise CorruptionError(f"{n} resident entries do not fit an index of {live} slots", what="resize")
        packed = g.packed_index  # one word a slot, (entry << 32) | tag: moved whole, as the index holds it
        if g.narrow:  # no fingerprint in the record: the tag of the slot that names it now (all the home needs)
            at = entries["slot"][resident].astype(np.int64)
            if n and (at.min() < 0 or at.max() >= old):
                raise CorruptionError("a resident entry names an index slot out of range", what="resize")
            words = slots_all.view(np.int64)[at]
            if not np.array_equal(words >> PACKED_ENTRY_SHIFT, resident):
                raise CorruptionError("a resident entry names an index slot that does not name it", what="resize")
            fps = words & PACKED_TAG_MASK
        else:
            fps = entries["fp"][resident]
            # (the one-word slot's fp is the fingerprint's low 32 bits, as index.Packed.put writes it)
            words = (resident << PACKED_ENTRY_SHIFT) | (fps & PACKED_TAG_MASK) if packed else None
        # The ghost is emptied where its size in force changes (its slots are the fingerprint's bits under its own
        # size, not the index's): under version 17 most new limits change the index but not the ghost, whose
        # size is a power of two, and keep what it remembers (auto: the climber's state in block 0 too).
        if len(self.ghost) and g.ghost_for(old) != g.ghost_for(live):
            np.frombuffer(self.ghost, dtype=np.int64)[:] = 0  # (advisory: forgetting costs hit ratio, never values)
        progressed(h)
        # Sorted by home, ties in entry order: one sort of home and rank packed into a word (homes are below 2**32,
        # ranks below 2**31), ten times quicker than a stable argsort of a million homes.
        bits = n.bit_length()
        key = np.sort((self.index.homes(fps, live) << bits) | np.arange(n, dtype=np.int64))
        order, homes = key & ((1 << bits) - 1), key >> bits
        steps = np.arange(n, dtype=np.int64)
        place = np.maximum.accumulate(homes - steps) + steps if n else steps
        fits = place < live
        past = n - int(np.count_nonzero(fits))
        inside = place[fits] if past else place
        if packed:
            words = words[order]
            new = np.zeros(top, np.int64)
            new[inside] = words[fits] if past else words
            ent = new
        else:
            resident, fps = resident[order], fps[order]
            wide = np.zeros(top, g.index_dtype)
            wide["entry"][inside] = resident[fits] if past else resident
            ent = wide["entry"]
        # The few past the end round to the start, as a probe goes: into the first empty slots, in order (every slot
        # from such an entry's home to the end is taken: the running maximum leaves no gap). They lie near the
        # start: looked for in a prefix that doubles until it holds enough.
        at = place
        if past:
            span = 64 * past
            while True:
                free = np.flatnonzero(ent[: min(span, live)] == EMPTY)[:past]
                if len(free) == past or span >= live:
                    break
                span *= 2
            at = np.concatenate((inside, free))
            if packed:
                new[free] = words[~fits]
                words = np.concatenate((words[fits], words[~fits]))
            else:
                resident = np.concatenate((resident[fits], resident[~fits]))
                fps = np.concatenate((fps[fits], fps[~fits]))
        if packed:
            resident = words >> PACKED_ENTRY_SHIFT
        else:
            wide["fp"][at] = fps
            wide["entry"][at] = resident
            new = wide.view(np.int64)
        progressed(h)
        # The writes, last and in two copies: the index whole, then each entry's slot. A holder killed between them
        # leaves entries that name their old slots (a wide record's fingerprint rebuilds the index; a narrow one's
        # repair finds its tag wherever the index names it: verify._named_tags).
        slots_all.view(np.int64)[:] = new
        entries["slot"][resident] = at
        del slots_all, entries

    def pack(self, bound: int) -> int:
        """Move every resident entry at or past entry slot ``bound`` that no view pins into a free slot below it,
        and make the free list the slots below the new ``unused_next`` that hold none; that word is returned. What
        a resize to a smaller entry limit does (version 10), so that the pages of the entry table and its columns
        past the slots in use can be given back (Segment.shrink_tables). A pinned entry stays where it is, and the
        slots in use end past it. Under the caller's dirty bracket and the readers' odd seq (a resize).

        Crash window, per entry: the new slot is written whole first, while its block still names the old one (a
        repair drops the copy); the block's header naming the new slot is the commit; then its neighbours, the
        index and the policy's words point at it, and the old slot is cleared. A holder killed after the commit
        leaves the copy the one whose block checks out, kept by the repair whether or not it was linked yet."""
        h, rec, slots = self.h, self.rec, self.slots
        handed_out = block.handed_out(h, slots)
        bound = max(1, bound)
        if handed_out <= bound:
            return handed_out
        check = rec.column("check", handed_out)
        resident = np.flatnonzero(check)
        resident = resident[resident > 0]
        free = np.flatnonzero(check[:bound] == 0)
        free = free[free > 0].tolist()[::-1]  # (popped from the end: the lowest slots are filled first)
        stays = []
        words, mask = self.ring.words, self.mask
        for i, m in enumerate(resident[resident >= bound].tolist()):
            if not (i + 1) & TICK_EVERY:  # a walk over many entries: the lock's waiters wait on (lock.py)
                progressed(h)
            if self.pinned_now(m) or not free:
                stays.append(m)
                continue
            self._move_entry(m, free.pop(), words, mask, slots)
        top = max(stays) + 1 if stays else bound
        top = max(top, int(resident[resident < bound].max()) + 1 if (resident < bound).any() else 1)
        # The free list: the slots below the new top that hold no entry, lowest first.
        cleared = rec.column("check", top)
        link = NIL
        for e in np.flatnonzero(cleared == 0)[::-1].tolist():
            if e:
                rec.next[e] = link
                link = e
        h[H_FREE_HEAD], h[H_UNUSED_NEXT] = link, top
        return top

    def _move_entry(self, m: int, f: int, words, mask: int, slots: int) -> None:
        """Move resident entry ``m`` to free slot ``f`` (``pack``): the record and its columns, then every word
        that names it. Each word is checked before the first write (CorruptionError: the caller repairs)."""
        h, rec, ix = self.h, self.rec, self.ix
        p, n, off, klen, vlen, s = rec.links(m)
        nb = block.nbytes(klen + vlen)
        if not (0 <= s <= mask and self.index.entry(ix, s) == m and 0 <= p < slots and 0 <= n < slots
                and klen >= 0 and vlen >= 1 and 0 <= off and off % BLOCK_ALIGN == 0 and off + nb <= self.ring.nbytes
                and words[off >> 3] == block.header(nb, m)):
            raise CorruptionError(f"entry {m} has words that do not point back at it", what="resize")
        rec.copy(m, f)
        self.kinds[f], self.marks[f], self.pins[f] = self.kinds[m], self.marks[m], 0
        if self.exp[f] != self.exp[m]:  # (never 0 over 0: the column may not be shown here, version 18)
            self.exp[f] = self.exp[m]
        ver, ttis, deadlines = self.ver, self.ttis, self.deadlines
        if ver is not None:
            ver[f] = ver[m]
        if ttis is not None and deadlines is not None:
            ttis[f], deadlines[f] = ttis[m], deadlines[m]
        words[off >> 3] = block.header(nb, f)  # the commit: the block is the new slot's
        rec.next[p] = f
        rec.prev[n] = f
        if h[H_SMALL_FIRST] == m:
            h[H_SMALL_FIRST] = f
        self.index.repoint(ix, s, f)
        rec.check[m] = 0
        if self.exp[m]:
            self.exp[m] = 0
        self.marks[m] = 0

    def reset(self) -> None:
        """Drop every entry (counters other than occupancy are the caller's)."""
        h = self.h
        _, index_arr, entries = self.seg.arrays()
        # Zero the check word of every slot ever handed out first, so none is mistaken for resident by a repair.
        handed_out = block.handed_out(h, self.slots)
        entries["check"][:handed_out] = 0
        index_arr["entry"] = EMPTY
        for column in self.seg.columns():
            if column[:handed_out].any():  # (a lazy column not shown here reads 0: never written, version 16)
                column[:handed_out] = 0
        kinds = self.seg.kind_table()
        kinds["entries"] = kinds["retained_bytes"] = 0
        h[H_NEXT_EXPIRY] = NEVER
        lru.reset(self.rec)
        h[H_SMALL_FIRST] = SENTINEL
        h[H_SMALL] = 0
        if len(self.ghost):  # s3fifo: the ghost forgets too (clear() starts afresh)
            np.frombuffer(self.ghost, dtype=np.int64)[:] = 0
            h[H_GHOST_CLOCK] = 0
        self.ring.reset()
        h[H_ENTRIES] = h[H_RETAINED] = h[H_WRITING] = 0
        h[H_FREE_HEAD] = NIL
        h[H_UNUSED_NEXT] = 1
        if self.holds:
            st = self.stripes
            st[S_HELD_FIRST] = NIL
            st[S_HELD] = st[S_HELD_BYTES] = 0
