"""Where each region of a segment lies, computed from the creation parameters alone (pure arithmetic, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import (
    ALIGN, BLOCK_ALIGN, BLOCK_OVERHEAD, ENTRY, EXPIRES, EXTENT_STEP, GHOST, GHOST_WAYS, HEADER_NBYTES, INDEX_SLOT,
    KIND, KINDS, MARKS, MAX_KINDS, PAGE, PINS, POLICY_NAMES, POLICY_S3FIFO, READER, READER_SLOTS, VERSIONS,
)

MAX_ENTRIES_LIMIT = 2**31 - 2  # entry slots are stored in the 32 high bits of a block header
# What a cache made without max_capacity_bytes may be resized to: this many times its capacity. The arena is sized
# for it in address space and in a sparse file, and costs memory only where the ring backs it (arena.py).
RESERVE_FACTOR = 16


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def extent_step(ring_nbytes: int, most: int = EXTENT_STEP) -> int:
    """The least growth of the arena's extent in a ring of ``ring_nbytes``, and what a new segment backs of it:
    ``most`` (``EXTENT_STEP``), or a sixteenth of a smaller ring, a page at least. (twin: _core_arena.c
    extent_step)"""
    return max(PAGE, min(most, _round_up(ring_nbytes // 16, PAGE)))


def grown_extent(extent: int, need: int, ring_nbytes: int, step: int = EXTENT_STEP) -> int:
    """The arena's extent after a growth that must reach ``need`` (the end of the block to write): a quarter more
    than ``extent``, the step at least (``extent_step``), a word past ``need`` at least (where the ring's next dead
    block may begin), page aligned, and at most the whole ring. (twin: _core_arena.c grown_extent)"""
    target = max(need + BLOCK_ALIGN, extent + max(extent >> 2, extent_step(ring_nbytes, step)))
    return min(ring_nbytes, _round_up(target, PAGE))


def least_extent(need: int, arena_nbytes: int) -> int:
    """The least extent that reaches ``need`` with a word to spare, page aligned (a growth on a nearly full
    /dev/shm). (twin: _core_arena.c least_extent)"""
    return min(arena_nbytes, _round_up(need + BLOCK_ALIGN, PAGE))


@dataclass(frozen=True)
class Geometry:
    """Region offsets and sizes of a segment created for ``capacity_bytes``, ``max_entries`` and ``policy``."""

    capacity_bytes: int
    entry_slots: int
    index_slots: int
    arena_nbytes: int
    policy: int = 0  # POLICY_* (dtypes.py)

    @classmethod
    def for_capacity(cls, capacity_bytes: int, max_entries: int, policy: int = 0) -> Geometry:
        """The geometry a new cache gets; raises ValueError for sizes that cannot be built."""
        for what, n in (("capacity_bytes", capacity_bytes), ("max_entries", max_entries)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{what} must be an int, got {type(n).__name__}")
            if n <= 0:
                raise ValueError(f"{what} must be positive, got {n}")
        if isinstance(policy, bool) or not isinstance(policy, int) or not 0 <= policy < len(POLICY_NAMES):
            raise ValueError(f"policy must be a number below {len(POLICY_NAMES)}, got {policy!r}")
        if max_entries > MAX_ENTRIES_LIMIT:
            raise ValueError(f"max_entries must be at most {MAX_ENTRIES_LIMIT}, got {max_entries}")
        index_slots = 8
        while index_slots < 2 * (max_entries + 1):
            index_slots *= 2
        # Room for every entry's block header and padding plus 1/16 slack for compaction, so that a put within the
        # limits always fits physically (see layout/__init__.py, "Arena").
        arena = capacity_bytes + capacity_bytes // 16 + BLOCK_OVERHEAD * max_entries
        return cls(capacity_bytes, max_entries + 1, index_slots, _round_up(arena, ALIGN), policy)

    def ring_nbytes(self, capacity: int) -> int:
        """Bytes of the arena the ring uses under ``capacity`` (at most ``capacity_bytes``; 0: that): room for its
        bytes, every entry's block header and padding, and 1/16 slack for compaction, as at creation. (twin:
        _core_arena.c ring_nbytes)"""
        if not 0 < capacity <= self.capacity_bytes:
            capacity = self.capacity_bytes
        arena = capacity + capacity // 16 + BLOCK_OVERHEAD * self.max_entries
        return min(self.arena_nbytes, _round_up(arena, ALIGN))

    def occupied_at_most(self, capacity: int) -> int:
        """The most memory a segment holds under ``capacity``: its tables and the ring's arena."""
        return self.arena_off + _round_up(self.ring_nbytes(capacity), PAGE)

    def initial_extent(self, capacity: int = 0) -> int:
        """Bytes of the arena a new segment of ``capacity`` (0: the whole) backs with memory: the rest is backed as
        blocks need it."""
        ring = self.ring_nbytes(capacity)
        return min(ring, extent_step(ring))

    @property
    def ghost_slots(self) -> int:
        """Slots of the ghost region: as many as the index's under s3fifo (a load of at most 0.45), else none."""
        return max(self.index_slots, GHOST_WAYS) if self.policy == POLICY_S3FIFO else 0

    @property
    def index_off(self) -> int:
        return _round_up(HEADER_NBYTES, ALIGN)

    @property
    def entries_off(self) -> int:
        return _round_up(self.index_off + self.index_slots * INDEX_SLOT.itemsize, ALIGN)

    @property
    def expires_off(self) -> int:
        return _round_up(self.entries_off + self.entry_slots * ENTRY.itemsize, ALIGN)

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
    def arena_off(self) -> int:
        return _round_up(self.readers_off + READER_SLOTS * READER.itemsize, PAGE)

    @property
    def total_nbytes(self) -> int:
        return _round_up(self.arena_off + self.arena_nbytes, PAGE)

    @property
    def max_entries(self) -> int:
        return self.entry_slots - 1
