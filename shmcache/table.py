"""The segment's tables as one structure: insert, remove, evict and reset entries, keeping the index, the LRU list,
the free list, the arena and the occupancy counters in step. Knows nothing of keys' meaning or of values' encoding.

Every method assumes the cache lock is held and the ``dirty`` word raised (see cache.py). Slot numbers and block
offsets read from the segment are checked before the first write, so damaged words raise CorruptionError (and the
caller repairs) instead of aiming a write at another entry.
"""

from __future__ import annotations

from . import index, lru
from .arena import Arena, block_nbytes
from .errors import CorruptionError
from .layout import BLOCK_HEADER_NBYTES, EMPTY, NIL, SENTINEL
from .layout.dtypes import (
    E_CHECK, E_KEY_NBYTES, E_NEXT, E_OFF, E_PREV, E_VAL_NBYTES, ENTRY_STRUCT, ENTRY_WORDS, H_ENTRIES, H_EVICTIONS,
    H_FREE_HEAD, H_MAX_ENTRIES, H_MAX_RETAINED, H_RETAINED, H_UNUSED_NEXT, I_ENTRY, INDEX_WORDS,
)

_W = ENTRY_WORDS
_ENTRY_NBYTES = ENTRY_STRUCT.size
_pack_entry = ENTRY_STRUCT.pack_into
_unpack_entry = ENTRY_STRUCT.unpack_from  # (prev, next, fp, off, key_nbytes, val_nbytes, slot, check)


class Table:
    """The structures of one mapped segment."""

    def __init__(self, seg) -> None:
        g = seg.geometry
        self.seg = seg
        self.h, self.ix, self.ent, self.mm = seg.header_words, seg.index_words, seg.entry_words, seg.mm
        self.entb = seg.entry_words.cast("B")  # the same memory as bytes, for struct
        self.base = g.arena_off
        self.mask = g.index_slots - 1
        self.slots = g.entry_slots
        self.ring = Arena(seg.header_words, seg.entry_words, seg.mm, g.arena_off, g.arena_nbytes, g.entry_slots)

    def close(self) -> None:
        self.entb.release()
        self.ring.close()

    def insert(self, kb: bytes, tag: int, body: bytes, fp: int, check: int, nb: int) -> None:
        """Store a new entry (the key is absent and the limits leave room) as the most recently used. The value is
        ``tag`` then ``body``; ``nb`` is the block size (``block_nbytes`` of key + value)."""
        # take_slot, index.insert's first probe and lru.push_front are inlined: this is every new key's path.
        h, ent, ix, mm = self.h, self.ent, self.ix, self.mm
        klen, vlen = len(kb), len(body) + 1
        e = h[H_FREE_HEAD]
        if e == NIL:
            e = self.take_slot()
        else:
            if not 0 < e < self.slots or ent[e * _W + E_CHECK]:
                raise CorruptionError(f"free list names slot {e}, which is out of range or resident", what="put")
            h[H_FREE_HEAD] = ent[e * _W + E_NEXT]
        off = self.ring.alloc(nb, e)
        v0 = self.base + off + BLOCK_HEADER_NBYTES  # a block is [header][value][key]
        k0 = v0 + vlen
        mm[v0] = tag
        mm[v0 + 1 : k0] = body
        mm[k0 : k0 + klen] = kb
        s = fp & self.mask
        if ix[(s << 1) + 1] != EMPTY:
            s = index.free_slot(ix, self.mask, fp)
        first = ent[E_NEXT]  # the list's most recent entry (sentinel.next)
        _pack_entry(self.entb, e * _ENTRY_NBYTES, SENTINEL, first, fp, off, klen, vlen, s, check)
        ix[s << 1] = fp
        ix[(s << 1) + 1] = e
        ent[first * _W + E_PREV] = e
        ent[E_NEXT] = e
        h[H_ENTRIES] += 1
        h[H_RETAINED] += klen + vlen

    def overwrite(self, e: int, kb: bytes, tag: int, body: bytes, check: int, nb: int) -> bool:
        """Give resident entry ``e`` (whose key is ``kb``) a new value in place, as the most recently used, when
        the new block is as large as the old and the byte limit allows; False (nothing written) otherwise. Saves
        the free, the allocation and the index and list updates of a remove and insert."""
        h, ent = self.h, self.ent
        b = e * _W
        klen, old_vlen, off = ent[b + E_KEY_NBYTES], ent[b + E_VAL_NBYTES], ent[b + E_OFF]
        vlen = len(body) + 1
        if (block_nbytes(klen + old_vlen) != nb or h[H_RETAINED] + vlen - old_vlen > h[H_MAX_RETAINED]
                or not 0 < e < self.slots):
            return False
        # The block must be this entry's own (its header names it) before anything is written into it.
        if not 0 <= off <= self.ring.nbytes - nb or off & 7 or self.ring.words[off >> 3] != nb | (e << 32):
            raise CorruptionError(f"entry {e}'s block at {off} is out of the arena or not its own", what="put")
        mm = self.mm
        v0 = self.base + off + BLOCK_HEADER_NBYTES
        k0 = v0 + vlen
        mm[v0] = tag
        mm[v0 + 1 : k0] = body
        if vlen != old_vlen:
            mm[k0 : k0 + klen] = kb
            ent[b + E_VAL_NBYTES] = vlen
            h[H_RETAINED] += vlen - old_vlen
        ent[b + E_CHECK] = check
        lru.move_to_front(ent, e)
        return True

    def remove(self, e: int) -> None:
        """Drop entry ``e`` from every structure and give its slot and block back."""
        h, ent, slots = self.h, self.ent, self.slots
        if not 0 < e < slots:
            raise CorruptionError(f"entry slot {e} is out of range", what="remove")
        p, n, _, off, klen, vlen, s, _ = _unpack_entry(self.entb, e * _ENTRY_NBYTES)  # one call, not six reads
        if not (0 <= s <= self.mask and self.ix[s * INDEX_WORDS + I_ENTRY] == e and 0 <= p < slots
                and 0 <= n < slots):
            raise CorruptionError(f"entry {e} has links that do not point back at it", what="remove")
        self.ring.free(off, block_nbytes(klen + vlen), e)
        index.remove(self.ix, ent, self.mask, s)
        ent[p * _W + E_NEXT] = n  # lru.unlink, inlined
        ent[n * _W + E_PREV] = p
        b = e * _W
        ent[b + E_CHECK] = 0
        ent[b + E_NEXT] = h[H_FREE_HEAD]
        h[H_FREE_HEAD] = e
        h[H_ENTRIES] -= 1
        h[H_RETAINED] -= klen + vlen

    def evict_until(self, extra_entries: int, extra_bytes: int) -> None:
        """Evict least recently used entries until ``extra_entries`` more entries of ``extra_bytes`` more bytes fit
        the limits. Bounded by the table size, so damaged counters raise instead of looping."""
        h, ent = self.h, self.ent
        most_entries = h[H_MAX_ENTRIES] - extra_entries
        most_bytes = h[H_MAX_RETAINED] - extra_bytes
        for _ in range(self.slots):
            if h[H_ENTRIES] <= most_entries and h[H_RETAINED] <= most_bytes:
                return
            e = ent[E_PREV]  # lru.tail: the sentinel's prev, the least recently used entry
            if e == SENTINEL:
                break
            self.remove(e)
            h[H_EVICTIONS] += 1
        raise CorruptionError("the header's counters disagree with the entries on the LRU list", what="evict")

    def take_slot(self) -> int:
        """A free entry slot: the head of the free list, else the first never used."""
        h, ent = self.h, self.ent
        e = h[H_FREE_HEAD]
        if e != NIL:
            if not 0 < e < self.slots or ent[e * _W + E_CHECK]:
                raise CorruptionError(f"free list names slot {e}, which is out of range or resident", what="put")
            h[H_FREE_HEAD] = ent[e * _W + E_NEXT]
            return e
        e = h[H_UNUSED_NEXT]
        if not 0 < e < self.slots:
            raise CorruptionError(f"no free entry slot (unused_next={e})", what="put")
        h[H_UNUSED_NEXT] = e + 1
        return e

    def reset(self) -> None:
        """Drop every entry (counters other than occupancy are the caller's)."""
        h = self.h
        _, index_arr, entries = self.seg.arrays()
        # Zero the check word of every slot ever handed out first, so none is mistaken for resident by a repair.
        handed_out = h[H_UNUSED_NEXT] if 0 < h[H_UNUSED_NEXT] <= len(entries) else len(entries)
        entries["check"][:handed_out] = 0
        index_arr["entry"] = EMPTY
        lru.reset(self.ent)
        self.ring.reset()
        h[H_ENTRIES] = h[H_RETAINED] = 0
        h[H_FREE_HEAD] = NIL
        h[H_UNUSED_NEXT] = 1
