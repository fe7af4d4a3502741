"""Where each region of a segment lies, computed from the creation parameters alone (pure arithmetic, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import (
    ALIGN, BLOCK_ALIGN, BLOCK_OVERHEAD, DEADLINES, ENTRY, ENTRY_NARROW, EXPIRES, EXTENT_STEP, GHOST, GHOST_WAYS,
    HEADER_NBYTES, IDLE_HEAD_NBYTES, INDEX_SLOT, INDEX_SLOT_PACKED, KIND, KINDS, LAYOUT_VERSION, MARKS, MAX_KINDS,
    NARROW_ARENA_NBYTES, NARROW_INDEX_SLOTS, PAGE, PINS, POLICY_AUTO, POLICY_NAMES, POLICY_S3FIFO, READER,
    READER_SLOTS, SHOWN_ALL, SHOWN_EXPIRES, SHOWN_IDLE, SHOWN_VERSIONS, SKETCH_MIN_WORDS, STRIPES_NBYTES, TTIS,
    VERSIONS,
)

MAX_ENTRIES_LIMIT = 2**31 - 2  # entry slots are stored in the 32 high bits of a block header
# What a cache made without max_capacity_bytes may be resized to: this many times its capacity. The arena is sized
# for it in address space and in a sparse file, and costs memory only where the ring backs it (arena.py).
RESERVE_FACTOR = 16


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def index_for(max_entries: int, version: int = LAYOUT_VERSION) -> int:
    """The index slots for an entry limit of ``max_entries``, with every entry slot of the limit and the sentinel
    counted, 8 at least: from layout version 17, the fewest that keep the load at or below 0.7 (any number of slots:
    index.py Ranged); before it, the least power of two that keeps it at or below one half (so 0.25 to 0.5: twice
    to four times the bytes a slot costs at 0.7). (The compiled section takes the index in force from the mapping's
    cell: Segment.show_tables.)"""
    if version >= 17:
        return max(8, -(-(max_entries + 1) * 10 // 7))
    n = 8
    while n < 2 * (max_entries + 1):
        n *= 2
    return n


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def extent_step(ring_nbytes: int, most: int = EXTENT_STEP) -> int:
    """The least growth of the arena's extent in a ring of ``ring_nbytes``, and what a new segment backs of it:
    ``most`` (``EXTENT_STEP``), or a sixteenth of a smaller ring, a page at least. (twin: _core_arena.c
    extent_step)"""
    return max(PAGE, min(most, _round_up(ring_nbytes // 16, PAGE)))


def grown_extent(extent: int, need: int, ring_nbytes: int, step: int = EXTENT_STEP, top: int | None = None) -> int:
    """The arena's extent after a growth that must reach ``need`` (the end of the block to write): an eighth
    more than ``extent`` (a quarter before: the free space it leaves a cache that stops growing is now half), the
    step at least (``extent_step`` of ``top``), but not past ``top`` (the most the growth rule backs,
    ``Geometry.extent_top``; None: the ring), and a word past ``need`` at least (where the ring's next dead block
    may begin), page aligned, and at most the whole ring. (twin: _core_arena.c grown_extent)"""
    top = ring_nbytes if top is None else top
    target = min(top, _round_up(extent + max(extent >> 3, extent_step(top, step)), PAGE))
    return min(ring_nbytes, max(_round_up(need + BLOCK_ALIGN, PAGE), target))


def least_extent(need: int, arena_nbytes: int) -> int:
    """The least extent that reaches ``need`` with a word to spare, page aligned (a growth on a nearly full
    /dev/shm). (twin: _core_arena.c least_extent)"""
    return min(arena_nbytes, _round_up(need + BLOCK_ALIGN, PAGE))


@dataclass(frozen=True)
class Geometry:
    """Region offsets and sizes of a segment created for ``capacity_bytes``, ``max_entries`` and ``policy``."""

    capacity_bytes: int
    entry_slots: int  # (version 10: reserved for the most entries a resize reaches; in use up to the limit's)
    index_slots: int  # (version 10: reserved likewise; the index in force is the header's index_slots word)
    arena_nbytes: int
    policy: int = 0  # POLICY_* (dtypes.py)
    version: int = LAYOUT_VERSION  # the segment's layout version: 10 grows its tables, 9 and before do not; 11 has
    #                                the stripes' words; 12 holds aside a pinned entry its key's put replaces;
    #                                13's ring does not follow the entry limit (ring_entries); 14 has the idle
    #                                region (idle_off); 15's index slots are one word (packed_index); 16's sketch
    #                                is half the index (ghost_for) and its idle columns are backed lazily
    #                                (lazy_columns); 17's index has any number of slots (ranged_index); 18
    #                                backs its expires column lazily too (lazy)

    @classmethod
    def for_capacity(cls, capacity_bytes: int, max_entries: int, policy: int = 0,
                     version: int = LAYOUT_VERSION) -> Geometry:
        """The geometry of a segment whose arena is sized for ``capacity_bytes`` and whose tables for
        ``max_entries`` (the most a resize reaches); raises ValueError for sizes that cannot be built."""
        for what, n in (("capacity_bytes", capacity_bytes), ("max_entries", max_entries)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{what} must be an int, got {type(n).__name__}")
            if n <= 0:
                raise ValueError(f"{what} must be positive, got {n}")
        if isinstance(policy, bool) or not isinstance(policy, int) or not 0 <= policy < len(POLICY_NAMES):
            raise ValueError(f"policy must be a number below {len(POLICY_NAMES)}, got {policy!r}")
        if max_entries > MAX_ENTRIES_LIMIT:
            raise ValueError(f"max_entries must be at most {MAX_ENTRIES_LIMIT}, got {max_entries}")
        index_slots = index_for(max_entries, version)
        # Room for every entry's block header and padding plus 1/16 slack for compaction, so that a put within the
        # limits always fits physically (see layout/__init__.py, "Arena").
        arena = capacity_bytes + capacity_bytes // 16 + BLOCK_OVERHEAD * max_entries
        return cls(capacity_bytes, max_entries + 1, index_slots, _round_up(arena, ALIGN), policy, version)

    def ring_entries(self, limit: int) -> int:
        """The entries the ring has room for beside its bytes: the entry limit in force (``limit``) under versions
        10 to 12, whose tables a resize moves; every entry slot otherwise (and for a limit out of range). Version 13
        gives the ring the room of every slot the tables reach, so that a new entry limit leaves the ring, and every
        block, where it is: set_limits never moves a block a view reads."""
        if 10 <= self.version < 13 and 0 < limit <= self.max_entries:
            return limit
        return self.max_entries

    def ring_nbytes(self, capacity: int, limit: int = 0) -> int:
        """Bytes of the arena the ring uses under ``capacity`` (at most ``capacity_bytes``; 0: that) and the entry
        limit ``limit`` (0: the most): room for its bytes, a block header and padding for each entry
        (``ring_entries``), and 1/16 slack for compaction, as at creation. (twin: _core_arena.c ring_for)"""
        return self._ring_for(capacity, self.ring_entries(limit))

    def _ring_for(self, capacity: int, entries: int) -> int:
        if not 0 < capacity <= self.capacity_bytes:
            capacity = self.capacity_bytes
        arena = capacity + capacity // 16 + BLOCK_OVERHEAD * entries
        return min(self.arena_nbytes, _round_up(arena, ALIGN))

    def extent_top(self, capacity: int, limit: int = 0) -> int:
        """The most of the ring the growth rule backs with memory under ``capacity`` and the entry limit ``limit``
        (arena.py): what they need, as ``ring_nbytes`` reckons it for the limit. Version 13's ring has room for every
        slot the tables reach, so that a new limit moves no block, but its extent grows only this far (a store
        that finds it there wraps instead); before 13, the ring. (twin: _core_arena.c extent_top)"""
        if self.version < 13:
            return self.ring_nbytes(capacity, limit)
        return self._ring_for(capacity, limit if 0 < limit <= self.max_entries else self.max_entries)

    def ring_extent_after(self, end: int, capacity: int, limit: int) -> int:
        """The extent a resize that lowered the ring or its top leaves, the blocks ending at ``end`` (``Store.resize``):
        a word past them, where the next dead block may go, and a growth's step beyond, within the top, page
        aligned, within the ring."""
        top, least = self.extent_top(capacity, limit), _round_up(end + BLOCK_ALIGN, PAGE)
        return min(self.ring_nbytes(capacity, limit), max(least, min(top, least + extent_step(top))))

    def tables(self, index_live: int, slots: int, shown: int = SHOWN_ALL) -> list[tuple[int, int, int]]:
        """The regions that grow with the entry limit, as ``(offset, shown bytes, reserved bytes)``: the index's
        first ``index_live`` slots, the ghost's in force, and the first ``slots`` of the entry table and each
        column, a lazy column's (``lazy``: version 16's idle and versions columns, 18's expires column, each once in
        use) only where its bit is in ``shown`` (SHOWN_*). The rest of each region is neither backed nor shown until
        a resize needs it (segment.py, ``Segment.show_tables``). Before version 10 every region is shown whole."""
        if self.version < 10:
            index_live, slots = self.index_slots, self.entry_slots
        ghost = self.ghost_for(index_live)
        on = shown | (SHOWN_ALL & ~self.lazy)
        idle = slots if on & SHOWN_IDLE else 0
        versioned = slots if on & SHOWN_VERSIONS else 0
        expiring = slots if on & SHOWN_EXPIRES else 0
        idle_columns = [] if self.version < 14 else [
            (self.ttis_off, idle * TTIS.itemsize, self.entry_slots * TTIS.itemsize),
            (self.deadlines_off, idle * DEADLINES.itemsize, self.entry_slots * DEADLINES.itemsize),
        ]
        return idle_columns + [
            (self.index_off, index_live * self.index_slot_nbytes, self.index_slots * self.index_slot_nbytes),
            (self.entries_off, slots * self.entry_nbytes, self.entry_slots * self.entry_nbytes),
            (self.expires_off, expiring * EXPIRES.itemsize, self.entry_slots * EXPIRES.itemsize),
            (self.versions_off, versioned * VERSIONS.itemsize, self.entry_slots * VERSIONS.itemsize),
            (self.kinds_off, slots * KINDS.itemsize, self.entry_slots * KINDS.itemsize),
            (self.pins_off, slots * PINS.itemsize, self.entry_slots * PINS.itemsize),
            (self.marks_off, slots * MARKS.itemsize, self.entry_slots * MARKS.itemsize),
            (self.ghost_off, min(ghost, self.ghost_slots) * GHOST.itemsize, self.ghost_slots * GHOST.itemsize),
        ]

    def backed(self, index_live: int, slots: int, extent: int, shown: int = SHOWN_ALL) -> list[tuple[int, int]]:
        """The byte ranges of the file a segment backs with memory when its index in force has ``index_live`` slots,
        ``slots`` entry slots are shown and the arena's extent is ``extent``: the header, the kind table, the reader
        slots and the stripes whole, the tables' shown parts (``tables``; a lazy column's where its bit is in
        ``shown``), the arena's first ``extent`` bytes. Ranges are page aligned outwards (a page holding any of a
        range is backed whole) and merged."""
        parts = [(0, self.index_off), (self.kind_table_off, self.ghost_off), (self.readers_off, self.ttis_off)]
        parts += [(off, off + n) for off, n, _ in self.tables(index_live, slots, shown) if n]
        parts.append((self.arena_off, self.arena_off + extent))
        out: list[tuple[int, int]] = []
        for start, stop in sorted((start // PAGE * PAGE, _round_up(stop, PAGE)) for start, stop in parts):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], stop))
            else:
                out.append((start, stop))
        return [(start, min(stop, self.total_nbytes)) for start, stop in out]

    def slots_for(self, limit: int, unused_next: int) -> int:
        """The entry slots a segment shows under an entry limit of ``limit``: every slot the limit may hand out
        (and the sentinel), and every slot handed out before (``unused_next``, under a larger limit), within the
        table. Before version 10: all."""
        if self.version < 10:
            return self.entry_slots
        return max(1, min(self.entry_slots, max(limit + 1, unused_next)))

    def occupied_at_most(self, capacity: int, limit: int | None = None) -> int:
        """The most memory a segment holds under ``capacity`` and an entry limit of ``limit`` (None: the most):
        its tables' shown parts and the ring's arena."""
        limit = self.max_entries if limit is None or self.version < 10 else min(limit, self.max_entries)
        live = min(index_for(limit, self.version), self.index_slots)
        ring = _round_up(self.extent_top(capacity, limit), PAGE)
        return sum(stop - start for start, stop in self.backed(live, self.slots_for(limit, 0), ring))

    def initial_extent(self, capacity: int = 0, limit: int = 0) -> int:
        """Bytes of the arena a new segment of ``capacity`` (0: the whole) and entry limit ``limit`` (0: the most)
        backs with memory: the rest is backed as blocks need it."""
        top = self.extent_top(capacity, limit)
        return min(top, extent_step(top))

    @property
    def lazy(self) -> int:
        """The SHOWN_* bits of the columns this layout backs only once in use, rather than with the tables: version
        16's idle columns (D_IDLE_ON) and versions column (D_VERSIONS_ON), and from 18 the expires column
        (D_EXPIRES_ON); none before 16."""
        if self.version < 16:
            return 0
        return SHOWN_ALL if self.version >= 18 else SHOWN_IDLE | SHOWN_VERSIONS

    @property
    def lazy_columns(self) -> bool:
        """Whether the idle columns are backed only once an entry has a time to idle (version 16: D_IDLE_ON), and
        the versions column once a caller asks for a version (D_VERSIONS_ON), rather than with the tables."""
        return self.version >= 16

    @property
    def ghost_slots(self) -> int:
        """Words of the ghost region: those of the ghost in force with the whole index (``ghost_for``)."""
        return self.ghost_for(self.index_slots)

    @property
    def ghost_shift(self) -> int:
        """How far the ghost's words in force are shifted down from the index's slots: 1 for auto's sketch from
        version 16 (half as many words as index slots), else 0."""
        return 1 if self.policy == POLICY_AUTO and self.version >= 16 else 0

    def ghost_for(self, index_live: int) -> int:
        """The ghost's words in force with an index of ``index_live`` slots, ``GHOST_WAYS`` at least: as many as the
        slots under s3fifo (its ghost remembers at most 0.45 keys a slot), half as many under auto from version 16
        (its sketch: one word, 16 counters, an entry of the limit at least, as Caffeine sizes its sketch; before 16,
        as many as the slots), none under lru and keep; ``ghost_floor`` at least. The ghost is a power of two of
        words: from version 17, whose index is not, the slots counted are those of the power-of-two index version 16
        has for the same limit: the least power of two at or above twice the entries the slots hold at 0.7 (the
        limit and the sentinel), 8 at least.
        (twin: _core.h ghost_live)"""
        if self.policy not in (POLICY_S3FIFO, POLICY_AUTO):
            return 0
        if self.ranged_index:  # (the limit the slots hold, and the sentinel: index_for's inverse)
            index_live = _pow2_at_least(max(8, 2 * (index_live * 7 // 10)))
        return max(index_live >> self.ghost_shift, self.ghost_floor)

    def index_for(self, limit: int) -> int:
        """The index slots for an entry limit of ``limit`` under this segment's layout (``index_for``)."""
        return index_for(limit, self.version)

    def limit_for(self, index_live: int) -> int:
        """The largest entry limit whose index (``index_for``) has at most ``index_live`` slots (8 at least; a power
        of two before version 17): a repair that can back no more than it shows lowers the limit to it."""
        if self.ranged_index:
            return max(1, index_live * 7 // 10 - 1)
        return max(1, index_live // 2 - 1)

    @property
    def ghost_floor(self) -> int:
        """The fewest words of the ghost in force: ``SKETCH_MIN_WORDS`` under auto from version 16 (a small cache's
        sketch stays a page, where its keys' counters seldom share a word), else ``GHOST_WAYS`` (a group)."""
        return SKETCH_MIN_WORDS if self.ghost_shift else GHOST_WAYS

    @property
    def index_off(self) -> int:
        return _round_up(HEADER_NBYTES, ALIGN)

    @property
    def packed_index(self) -> bool:
        """Whether an index slot is one word (version 15: INDEX_SLOT_PACKED) rather than two (INDEX_SLOT)."""
        return self.version >= 15

    @property
    def ranged_index(self) -> bool:
        """Whether the index has any number of slots, a key's home slot its tag scaled to them (version 17: index.py
        Ranged), rather than a power of two, the home the fingerprint's low bits."""
        return self.version >= 17

    @property
    def narrow(self) -> bool:
        """Whether the entry records are narrow (32 bytes: ENTRY_NARROW; records.py) rather than wide (64: ENTRY):
        from version 19, where the arena is below NARROW_ARENA_NBYTES (32 GiB) and the index has fewer than
        NARROW_INDEX_SLOTS slots (both reserves, so that no resize leaves the format's reach)."""
        return (self.version >= 19 and self.arena_nbytes <= NARROW_ARENA_NBYTES
                and self.index_slots < NARROW_INDEX_SLOTS)

    @property
    def entry_dtype(self):
        """The dtype of an entry record of this segment."""
        return ENTRY_NARROW if self.narrow else ENTRY

    @property
    def entry_nbytes(self) -> int:
        return self.entry_dtype.itemsize

    @property
    def index_dtype(self):
        """The dtype of an index slot of this segment."""
        return INDEX_SLOT_PACKED if self.packed_index else INDEX_SLOT

    @property
    def index_slot_nbytes(self) -> int:
        return self.index_dtype.itemsize

    @property
    def entries_off(self) -> int:
        return _round_up(self.index_off + self.index_slots * self.index_slot_nbytes, ALIGN)

    @property
    def expires_off(self) -> int:
        return _round_up(self.entries_off + self.entry_slots * self.entry_nbytes, ALIGN)

    @property
    def versions_off(self) -> int:
        return _round_up(self.expires_off + self.entry_slots * EXPIRES.itemsize, ALIGN)

    @property
    def kinds_off(self) -> int:
        return _round_up(self.versions_off + self.entry_slots * VERSIONS.itemsize, ALIGN)

    @property
    def pins_off(self) -> int:
        return _round_up(self.kinds_off + self.entry_slots * KINDS.itemsize, ALIGN)

    @property
    def marks_off(self) -> int:
        return _round_up(self.pins_off + self.entry_slots * PINS.itemsize, ALIGN)

    @property
    def kind_table_off(self) -> int:
        return _round_up(self.marks_off + self.entry_slots * MARKS.itemsize, ALIGN)

    @property
    def ghost_off(self) -> int:
        return _round_up(self.kind_table_off + (MAX_KINDS + 1) * KIND.itemsize, ALIGN)

    @property
    def readers_off(self) -> int:
        return _round_up(self.ghost_off + self.ghost_slots * GHOST.itemsize, ALIGN)

    @property
    def stripes_off(self) -> int:
        """Where the stripes' words begin (version 11; before it the region is empty)."""
        return _round_up(self.readers_off + READER_SLOTS * READER.itemsize, ALIGN)

    @property
    def stripes_nbytes(self) -> int:
        return STRIPES_NBYTES if self.version >= 11 else 0

    @property
    def idle_off(self) -> int:
        """Where the idle region begins (version 14; before it the region is empty): its line of words, then the
        ttis and deadlines columns."""
        return _round_up(self.stripes_off + self.stripes_nbytes, ALIGN)

    @property
    def ttis_off(self) -> int:
        return self.idle_off + (IDLE_HEAD_NBYTES if self.version >= 14 else 0)

    @property
    def deadlines_off(self) -> int:
        return _round_up(self.ttis_off + (self.entry_slots * TTIS.itemsize if self.version >= 14 else 0), ALIGN)

    @property
    def idle_end(self) -> int:
        return _round_up(self.deadlines_off + (self.entry_slots * DEADLINES.itemsize if self.version >= 14 else 0),
                         ALIGN)

    @property
    def arena_off(self) -> int:
        return _round_up(self.idle_end, PAGE)

    @property
    def total_nbytes(self) -> int:
        return _round_up(self.arena_off + self.arena_nbytes, PAGE)

    @property
    def max_entries(self) -> int:
        return self.entry_slots - 1


def narrow_reserve(capacity: int, reserve: int, entries: int, policy: int) -> int:
    """The arena's default reserve, ``reserve``, lowered as far as ``capacity`` allows so that the segment's entry
    records are narrow (32 bytes, not 64: Geometry.narrow, an arena below 32 GiB): a cache whose capacity fits gives
    up growth past about 30 GiB without max_capacity_bytes, and keeps half its per-entry tables."""
    if (Geometry.for_capacity(reserve, entries, policy).narrow
            or not Geometry.for_capacity(capacity, entries, policy).narrow):
        return reserve
    # arena = reserve + reserve // 16 + BLOCK_OVERHEAD * entries, aligned (Geometry.for_capacity): solved for the
    # largest reserve within NARROW_ARENA_NBYTES, then stepped down past the rounding.
    most = max(capacity, (NARROW_ARENA_NBYTES - BLOCK_OVERHEAD * entries - ALIGN) * 16 // 17)
    while not Geometry.for_capacity(most, entries, policy).narrow:  # (a step or two: capacity itself is narrow)
        most = max(capacity, most - ALIGN)
    return most
