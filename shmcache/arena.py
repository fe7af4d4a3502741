"""Byte allocator over the arena: a ring of blocks with incremental, in-place compaction. Knows nothing of keys.

Blocks are written at ``head``. When the free space at ``head`` is too small, the ring is cleaned from ``tail``:
a dead block there is absorbed into the gap, a live one is slid down to ``head`` (its owner's ``off`` updated), so
the gap travels forward and grows by every dead byte it passes. One full lap coalesces all free space, so an
allocation always succeeds when ``arena_used + nbytes <= arena_nbytes`` -- the caller guarantees that by evicting,
and the geometry guarantees it for any put within the limits.

The ring lives below the header's ``arena_extent``: the part of the arena backed with memory. A new segment backs
its first ``extent_step`` bytes (256 KiB, or a sixteenth of a smaller ring); when the free space at
``head`` reaches the extent, the ring wraps early (one dead block over the rest of the arena, of which only its
first word is written) while the live blocks would fit in seven eighths of the extent, and the extent grows
otherwise (``posix_fallocate`` first: a full /dev/shm is a
``NoSpaceError``, never a SIGBUS). So a cache occupies what its entries need plus an eighth, not its capacity.

Invariants: every block of the ring lies in ``[tail, tail + fill)`` taken circularly, blocks tile that span exactly,
and each live entry's block is one of them. A block is live iff its header names an entry whose ``off`` points back
at it and whose ``check`` is non-zero. All methods assume the cache lock is held.
"""

from __future__ import annotations

import numpy as np

from . import block
from .errors import CorruptionError, NoSpaceError, PinnedError
from .lock import TICK_EVERY, progressed
from .layout import BLOCK_ALIGN, BLOCK_HEADER_NBYTES, MAX_BLOCK_NBYTES, PAGE
from .layout.dtypes import (
    BLOCK_OWNER_SHIFT, H_ARENA_EXTENT, H_ARENA_USED,
    H_FILL, H_HEAD, H_TAIL, HELD_SLOT,
)
from .layout.geometry import grown_extent, least_extent

block_nbytes = block.nbytes  # the allocator's unit, named where the ring's callers look for it


def write_dead(words, off: int, nbytes: int) -> None:
    """Cover ``[off, off + nbytes)`` with dead blocks, each short enough for the 32-bit length of a block header."""
    while nbytes:
        n = min(nbytes, MAX_BLOCK_NBYTES)
        words[off >> 3] = n
        off += n
        nbytes -= n


class Arena:
    """The ring's operations over one mapping: header words ``h``, the records ``rec`` (records.Records), the mmap
    and its base.

    ``back(stop)`` backs the arena up to ``stop`` with memory and shows it in this mapping (segment.py
    ``Segment.back``: ``posix_fallocate``, ``NoSpaceError`` when /dev/shm is full); ``shown`` is the mapping's cell
    saying how far it shows the file (``Segment.shown``). None: the arena is memory already (a test's).
    """

    def __init__(self, h, rec, mm, base: int, nbytes: int, entry_slots: int, pins=None, pinned=None,
                 back=None, step: int = PAGE, shown=None, ring=None, top=None) -> None:
        self.h = h
        self.rec = rec
        # The pins column, and the test of whether a flagged entry is still pinned (none is, without them).
        self.pins = bytes(entry_slots) if pins is None else pins
        self.pinned = pinned
        self.words = memoryview(mm)[base : base + nbytes].cast("q")
        self.move = mm.move
        self.base = base
        self.nbytes = nbytes
        self.entry_slots = entry_slots
        self.back = back
        self.step = step  # the most of a growth's least step (EXTENT_STEP; layout/geometry.py extent_step)
        # How much of the arena this mapping shows of the file, backed: nothing is written at or past it without a
        # back() first, whatever the header's extent says. (twin: _core_arena.c's c->shown)
        self.shown = [nbytes] if shown is None else shown
        # The bytes the ring uses under the capacity in force (Segment.ring; None: the whole arena). Read at each
        # allocation: a resize by another process changes it. (twin: _core_arena.c ring_nbytes)
        self.ring_nbytes = (lambda: nbytes) if ring is None else ring
        # The most of the ring the growth rule backs (Segment.extent_top; None: the ring): a store that finds the
        # extent there wraps instead of growing it. (twin: _core_arena.c extent_top)
        self.top_nbytes = self.ring_nbytes if top is None else top

    def close(self) -> None:
        self.words.release()

    def extent(self, size: int) -> int:
        """The header's extent as a number the ring can trust: 0 or past the ring (``size`` bytes) is all of it."""
        ext = self.h[H_ARENA_EXTENT]
        return ext if 0 < ext <= size else size

    def reach(self, stop: int) -> None:
        """Make sure ``[0, stop)`` is backed and shown before this process writes there (NoSpaceError: nothing
        changed)."""
        if stop > self.shown[0]:
            self.back(stop)

    def alloc(self, nb: int, e: int) -> int:
        """Offset of a new block of ``nb`` bytes owned by entry ``e`` (the caller made room for it).

        The ring keeps below the header's extent, the part of the arena backed with memory: when the free space
        at ``head`` ends there, the ring wraps early (a dead block over the rest of the arena, one word written)
        while the live blocks would fit in seven eighths of the extent, and grows the extent otherwise, or once
        the cleaner has passed the whole ring. So a cache occupies what its entries need, not its capacity.

        :raises NoSpaceError: the extent had to grow and /dev/shm is full (the ring as cleaned so far is recorded:
            every structure is consistent).
        """
        h = self.h
        size, top = self.ring_nbytes(), self.top_nbytes()
        ext = self.extent(size)
        self.reach(ext)  # what other processes backed, backed here too: writes below ext never fault
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
                if head + nb < ext or (ext == size and room >= nb):
                    break
                # (a block that would end past the top wraps the ring rather than grow it, but for a dead block too
                # long for one header: its words past the extent would be written where this mapping shows no file)
                if room >= nb and (head + nb < top or top == size or room > MAX_BLOCK_NBYTES) and (
                        cleaned >= size or h[H_ARENA_USED] + nb > ext - (ext >> 3) or head >= ext
                        or room > MAX_BLOCK_NBYTES):
                    ext = self._grow(ext, head + nb, head, tail, fill, size)
                    break
                if room:
                    if head >= ext:  # (a repaired ring may end at the extent: the dead block's word is past it)
                        ext = self._grow(ext, head, head, tail, fill, size)
                    self._dead(head, room)  # pad up to the end of the arena (its first word: the rest unwritten)
                    fill += room
                head = 0
                continue
            if fill < size and tail - head >= nb:  # free space is the gap [head, tail)
                break
            before = tail
            head, tail, fill = self._clean_one(head, tail, fill, size)
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

    def _grow(self, ext: int, need: int, head: int, tail: int, fill: int, size: int) -> int:
        """The extent grown to reach ``need``, backed here and published in the header. On NoSpaceError the ring
        ``head, tail, fill`` (consistent, as cleaned so far) is recorded first."""
        new = grown_extent(ext, need, size, self.step, self.top_nbytes())  # (a sixteenth of the top at most)
        try:
            try:
                self.reach(new)
            except NoSpaceError:
                # /dev/shm is nearly full: the least growth that serves this store, before giving up.
                least = least_extent(need, size)
                if least >= new:
                    raise
                self.reach(least)
                new = least
        except NoSpaceError:
            h = self.h
            h[H_HEAD], h[H_TAIL], h[H_FILL] = head, tail, fill
            raise
        self.h[H_ARENA_EXTENT] = new
        return new

    def _clean_one(self, head: int, tail: int, fill: int, size: int) -> tuple[int, int, int]:
        nb, e = block.split_header(self.words[tail >> 3])
        if nb < BLOCK_HEADER_NBYTES or nb % BLOCK_ALIGN or nb > size - tail or nb > fill:
            raise CorruptionError(f"arena block at {tail} has an impossible length {nb}", what="arena alloc")
        if 0 < e < self.entry_slots:
            rec = self.rec
            if rec.off[e] << rec.osh == tail and rec.check[e]:
                # (Table.pinned opens the entry's stripe before its flag is read, and before the block moves)
                if self.pinned is not None and self.pinned(e):
                    # A pinned block must not move: the gap before it becomes a dead block and the ring continues
                    # after it, as if it had been slid to where it already is. The whole arena is then ring.
                    if head != tail:
                        self._dead(head, tail - head)
                    self.stuck += 1
                    tail += nb
                    if tail == size:
                        tail = 0
                    return tail, tail, size
                if head != tail:
                    self.move(self.base + head, self.base + tail, nb)  # memmove: the ranges may overlap
                    rec.off[e] = head >> rec.osh
                head += nb
                fill += nb  # the block stays in the ring; the fill loses it below
        fill -= nb
        tail += nb
        if tail == size:
            tail = 0
        if head == size:
            head = 0
        return head, tail, fill

    def compact(self, size: int, unused: int) -> int:
        """Slide every live block down to the arena's start in address order, so that the ring becomes ``[0, L)``,
        unwrapped, and nothing lies at or past ``L`` (returned): a resize's, before the ring takes another size
        (``size``, at most the arena). A pinned block stays where it is, the gap before it a dead block.
        ``unused``: the first entry slot never handed out (``header.unused_next``).

        Moving down in address order never overwrites a block not yet moved (each lands at or below where it was).
        A fault part-way leaves entries pointing at moved blocks or at bytes another block now covers: the repair
        keeps those whose checksums hold (the dirty bracket is the caller's).

        :raises PinnedError: a pinned block ends past ``size`` (nothing was moved).
        :raises CorruptionError: a live entry's block is out of the arena, not its own, or overlaps another.
        """
        top = max(1, min(unused, self.entry_slots))
        rec = self.rec
        rows = rec.rows(top)[1:]
        live = np.flatnonzero(rows["check"] != 0)
        e = live + 1
        ent_slot = dict(zip(e.tolist(), rows["slot"][live].tolist()))
        off = rows["off"][live].astype(np.int64) << rec.osh
        payload = rows["key_nbytes"][live].astype(np.int64) + rows["val_nbytes"][live].astype(np.int64)
        nb = (BLOCK_HEADER_NBYTES + payload + BLOCK_ALIGN - 1) & -BLOCK_ALIGN  # block.nbytes, vectorised
        order = np.argsort(off, kind="stable")
        e, off, nb = e[order], off[order], nb[order]
        words = np.frombuffer(self.words, dtype=np.int64)
        ok = (off >= 0) & (off % BLOCK_ALIGN == 0) & (nb >= BLOCK_HEADER_NBYTES) & (off <= self.nbytes - nb)
        if len(off) and (not ok.all() or (off[1:] < off[:-1] + nb[:-1]).any()
                         or (words[off >> 3] != nb | (e << BLOCK_OWNER_SHIFT)).any()):
            raise CorruptionError("a live entry's block is out of the arena, not its own, or overlaps another",
                                  what="arena compact")
        # (a held entry, version 12, stays too: Table.pinned says so whatever its flag)
        stays = [bool((self.pins[x] or ent_slot[x] == HELD_SLOT) and self.pinned(x)) for x in e.tolist()]
        pos = 0  # where the blocks will end: pinned ones stay put, and what follows one is packed after it
        for o, n, pinned in zip(off.tolist(), nb.tolist(), stays):
            pos = o + n if pinned else pos + n
        if pos > size:
            raise PinnedError(f"blocks pinned by open views keep the arena's live blocks from fitting in {size} "
                              "bytes", what="resize", hint="close the views first, then resize")
        h, base, offs = self.h, self.base, rows["off"]
        # Blocks that lie end to end move by the same distance: each such run is one memmove (the ranges may
        # overlap), then its entries' offsets are written, before anything past it is written.
        pos = start = at = to = 0  # where the next block lands; the pending run: its first block, source, target
        for i, (o, n, pinned) in enumerate(zip(off.tolist(), nb.tolist(), stays)):
            if not (i + 1) & TICK_EVERY:  # a walk over every live block: the lock's waiters wait on (lock.py)
                progressed(h)
            if not pinned and i > start and o == at + pos - to:
                pos += n  # (the run goes on: this block follows the last one in the source)
                continue
            if at != to:  # the pending run [start, i), moved down by at - to
                self.move(base + to, base + at, pos - to)
                offs[e[start:i] - 1] = (off[start:i] - (at - to)) >> rec.osh
            if pinned:
                if o > pos:
                    self._dead(pos, o - pos)
                pos = at = to = o + n  # (an empty run, from past the pinned block)
                start = i + 1
                continue
            start, at, to = i, o, pos
            pos += n
        if at != to:
            self.move(base + to, base + at, pos - to)
            offs[e[start:] - 1] = (off[start:] - (at - to)) >> rec.osh
        # Ordering: the ring's words after every block is in place (see alloc).
        h[H_TAIL] = 0
        h[H_HEAD] = 0 if pos == size else pos
        h[H_FILL] = pos
        h[H_ARENA_USED] = int(nb.sum())
        return pos

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
