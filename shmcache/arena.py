"""Byte allocator over the arena: a ring of blocks with incremental, in-place compaction. Knows nothing of keys.

Blocks are written at ``head``. When the free space at ``head`` is too small, the ring is cleaned from ``tail``:
a dead block there is absorbed into the gap, a live one is slid down to ``head`` (its owner's ``off`` updated), so
the gap travels forward and grows by every dead byte it passes. One full lap coalesces all free space, so an
allocation always succeeds when ``arena_used + nbytes <= arena_nbytes`` -- the caller guarantees that by evicting,
and the geometry guarantees it for any put within the limits.

Invariants: every block of the ring lies in ``[tail, tail + fill)`` taken circularly, blocks tile that span exactly,
and each live entry's block is one of them. A block is live iff its header names an entry whose ``off`` points back
at it and whose ``check`` is non-zero. All methods assume the cache lock is held.
"""

from __future__ import annotations

from . import block
from .errors import CorruptionError, PinnedError
from .layout import BLOCK_ALIGN, BLOCK_HEADER_NBYTES, MAX_BLOCK_NBYTES
from .layout.dtypes import BLOCK_OWNER_SHIFT, E_CHECK, E_OFF, ENTRY_WORDS, H_ARENA_USED, H_FILL, H_HEAD, H_TAIL

block_nbytes = block.nbytes  # the allocator's unit, named where the ring's callers look for it


def write_dead(words, off: int, nbytes: int) -> None:
    """Cover ``[off, off + nbytes)`` with dead blocks, each short enough for the 32-bit length of a block header."""
    while nbytes:
        n = min(nbytes, MAX_BLOCK_NBYTES)
        words[off >> 3] = n
        off += n
        nbytes -= n


class Arena:
    """The ring's operations over one mapping: header words ``h``, entry words ``ent``, the mmap and its base."""

    def __init__(self, h, ent, mm, base: int, nbytes: int, entry_slots: int, pins=None, pinned=None) -> None:
        self.h = h
        self.ent = ent
        # The pins column, and the test of whether a flagged entry is still pinned (none is, without them).
        self.pins = bytes(entry_slots) if pins is None else pins
        self.pinned = pinned
        self.words = memoryview(mm)[base : base + nbytes].cast("q")
        self.move = mm.move
        self.base = base
        self.nbytes = nbytes
        self.entry_slots = entry_slots

    def close(self) -> None:
        self.words.release()

    def alloc(self, nb: int, e: int) -> int:
        """Offset of a new block of ``nb`` bytes owned by entry ``e`` (the caller made room for it)."""
        h = self.h
        size = self.nbytes
        head, tail, fill = h[H_HEAD], h[H_TAIL], h[H_FILL]
        # Every write below lands at head or tail: damaged ring words must never aim it outside the arena.
        if not (0 <= head < size and 0 <= tail < size and 0 <= fill <= size and not (head | tail) & 7
                and (head - tail) % size == fill % size and 0 <= h[H_ARENA_USED] <= size - nb):
            raise CorruptionError(f"arena ring out of range: head={head} tail={tail} fill={fill} "
                                  f"used={h[H_ARENA_USED]} for a block of {nb}", what="arena alloc")
        cleaned = 0  # bytes the tail has passed: one lap coalesces all free space, so two mean damage
        self.stuck = 0  # pinned blocks the cleaner had to step over
        while True:
            if fill == 0:
                head = tail = 0
            if head >= tail and fill < size:  # free space is [head, size) then [0, tail)
                room = size - head
                if room >= nb:
                    break
                if room:
                    self._dead(head, room)  # pad up to the end of the arena
                    fill += room
                head = 0
                continue
            if fill < size and tail - head >= nb:  # free space is the gap [head, tail)
                break
            before = tail
            head, tail, fill = self._clean_one(head, tail, fill)
            cleaned += (tail - before) % size or size
            if cleaned > 2 * size:
                if self.stuck:
                    # Not damage: pinned blocks split the free space into pieces all smaller than nb. The ring
                    # as it now stands is consistent; record it and refuse.
                    h[H_HEAD], h[H_TAIL], h[H_FILL] = head, tail, fill
                    raise PinnedError(f"no contiguous {nb} bytes between the blocks pinned by open views",
                                      what="put", hint="close views sooner, or raise the capacity")
                raise CorruptionError("the arena ring could not be compacted", what="arena alloc")
        self.words[head >> 3] = nb | (e << BLOCK_OWNER_SHIFT)  # block.header, inlined: every new entry's path
        off = head
        head += nb
        # Ordering: head, tail and fill are written together after the block; a fault before this point leaves the
        # old ring, whose moved blocks verify() still finds through their entries' updated offsets.
        h[H_HEAD] = 0 if head == size else head
        h[H_TAIL] = tail
        h[H_FILL] = fill + nb
        h[H_ARENA_USED] += nb
        return off

    def _clean_one(self, head: int, tail: int, fill: int) -> tuple[int, int, int]:
        nb, e = block.split_header(self.words[tail >> 3])
        if nb < BLOCK_HEADER_NBYTES or nb % BLOCK_ALIGN or nb > self.nbytes - tail or nb > fill:
            raise CorruptionError(f"arena block at {tail} has an impossible length {nb}", what="arena alloc")
        if 0 < e < self.entry_slots:
            b = e * ENTRY_WORDS
            if self.ent[b + E_OFF] == tail and self.ent[b + E_CHECK]:
                if self.pins[e] and self.pinned(e):
                    # A pinned block must not move: the gap before it becomes a dead block and the ring continues
                    # after it, as if it had been slid to where it already is. The whole arena is then ring.
                    if head != tail:
                        self._dead(head, tail - head)
                    self.stuck += 1
                    tail += nb
                    if tail == self.nbytes:
                        tail = 0
                    return tail, tail, self.nbytes
                if head != tail:
                    self.move(self.base + head, self.base + tail, nb)  # memmove: the ranges may overlap
                    self.ent[b + E_OFF] = head
                head += nb
                fill += nb  # the block stays in the ring; the fill loses it below
        fill -= nb
        tail += nb
        if tail == self.nbytes:
            tail = 0
        if head == self.nbytes:
            head = 0
        return head, tail, fill

    def free(self, off: int, nb: int, e: int) -> None:
        """Mark entry ``e``'s block of ``nb`` bytes at ``off`` dead; its bytes are reclaimed when the cleaner passes."""
        if not 0 <= off < self.nbytes or off & 7 or self.words[off >> 3] != block.header(nb, e):
            raise CorruptionError(f"entry {e}'s block at {off} is out of the arena or not its own", what="arena free")
        self.words[off >> 3] = nb
        self.h[H_ARENA_USED] -= nb

    def _dead(self, off: int, nbytes: int) -> None:
        write_dead(self.words, off, nbytes)

    def reset(self) -> None:
        h = self.h
        h[H_HEAD] = h[H_TAIL] = h[H_FILL] = h[H_ARENA_USED] = 0
