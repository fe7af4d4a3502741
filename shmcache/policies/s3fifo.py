"""``s3fifo``: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023), and its ghost.

The list holds two FIFO queues, main then small: ``sentinel -> main, newest first -> small, newest first (from
small_first) -> sentinel``. A new key enters small, or main if the ghost remembers it; a hit only raises its
entry's 2-bit counter (a byte written, nothing moved), so gets and views read without the lock. Eviction takes
small's oldest while small holds its tenth of the entries (main otherwise): hit at least twice, it moves to main,
else it goes and its fingerprint enters the ghost; main's oldest with hits left is reinserted at main's front with
one hit fewer, else it goes.

The ghost is a region of ``ghost_slots`` words, in groups of GHOST_WAYS (two cache lines): a key's group is chosen by
its fingerprint's low bits, and a slot holds 31 other bits of it and the ghost clock when the key left small. A slot
is live while fewer than 0.9 x max_entries keys have entered the ghost since (libCacheSim's ghost of main's size); a
full group replaces its oldest. Any word is valid: a damaged one only makes a key enter small instead of main, or the
reverse, so the ghost is outside the crash protocol. Every function assumes the lock is held (and the dirty word
raised, for those that move entries).
"""

from __future__ import annotations

from .. import lru
from ..errors import CorruptionError
from ..layout import SENTINEL
from ..layout.dtypes import (
    GHOST_STAMP_BITS, GHOST_STAMP_MASK, GHOST_WAYS, H_ENTRIES, H_EVICTIONS,
    H_GHOST_CLOCK, H_GHOST_HITS, H_MAX_ENTRIES, H_PROMOTED, H_SMALL, H_SMALL_FIRST, MARK_FREQ, MARK_SMALL, MARKS_VALID,
    POLICY_S3FIFO,
)
from .base import Policy

_TAG_BIT = 1 << 30  # set in every tag, so that a used ghost slot is never 0
PROMOTE_AT = 2  # hits in small that earn an entry its place in main (S3-FIFO's threshold)


def small_share(max_entries: int) -> int:
    """The entries small holds before eviction takes from it: a tenth, at least one."""
    return max(1, max_entries // 10)


def ghost_size(max_entries: int) -> int:
    """How many keys the ghost remembers: as many as main holds, 0.9 of the entries."""
    return max(0, max_entries * 9 // 10)


def bump(marks, e: int) -> None:
    """A hit on entry ``e`` under s3fifo: its counter raised, saturating at 3 (the byte written only when it
    changes)."""
    m = marks[e]
    if m & MARK_FREQ != MARK_FREQ:
        marks[e] = m + 1


def small_end(h, rec, slots: int) -> tuple[int, int]:
    """Where a new entry of small is linked: between (prev, next), the newest of main (or the sentinel) and the
    newest of small (or the sentinel)."""
    n = h[H_SMALL_FIRST]
    p = rec.prev[n] if 0 <= n < slots else -1
    if not 0 <= p < slots:
        raise CorruptionError(f"small queue's links ({p}, {n}) are out of range", what="put")
    return p, n


def main_tail(h, rec, slots: int) -> int:
    """Main's oldest entry, or SENTINEL if main is empty."""
    first = h[H_SMALL_FIRST]
    if not 0 <= first < slots:
        raise CorruptionError(f"small_first={first} is out of range", what="evict")
    return rec.prev[first] if first != SENTINEL else rec.prev[SENTINEL]


# ------------------------------------------------------------------------------------------------- the ghost


def _tag(fp: int) -> int:
    return (fp >> 33) | _TAG_BIT


def ghost_add(h, ghost, fp: int) -> None:
    """Remember fingerprint ``fp`` (its entry leaves small unhit): a free or lapsed slot of its group, else the
    oldest one."""
    size = ghost_size(h[H_MAX_ENTRIES])
    if not size:
        return
    clock = (h[H_GHOST_CLOCK] + 1) & GHOST_STAMP_MASK
    h[H_GHOST_CLOCK] = clock
    base = fp & (len(ghost) - 1) & -GHOST_WAYS
    victim, oldest = base, -1
    for i in range(base, base + GHOST_WAYS):
        w = ghost[i]
        age = (clock - w) & GHOST_STAMP_MASK
        if w == 0 or age >= size:
            victim = i
            break
        if age > oldest:
            victim, oldest = i, age
    ghost[victim] = (_tag(fp) << GHOST_STAMP_BITS) | clock


def ghost_take(h, ghost, fp: int) -> bool:
    """Whether the ghost remembers ``fp``; a slot found is freed (the key is back)."""
    size = ghost_size(h[H_MAX_ENTRIES])
    if not size:
        return False
    clock = h[H_GHOST_CLOCK]
    tag = _tag(fp)
    base = fp & (len(ghost) - 1) & -GHOST_WAYS
    for i in range(base, base + GHOST_WAYS):
        w = ghost[i]
        if w >> GHOST_STAMP_BITS == tag and (clock - w) & GHOST_STAMP_MASK < size:
            ghost[i] = 0
            return True
    return False


def admit_to_main(h, ghost, fp: int) -> bool:
    """Whether a new key goes to main (the ghost remembered it, counted) rather than small."""
    if ghost_take(h, ghost, fp):
        h[H_GHOST_HITS] += 1
        return True
    return False


# ------------------------------------------------------------------------------------------------- eviction


def to_main(table, t: int) -> None:
    """Move small's oldest entry ``t`` to main's front, its counter reset."""
    h, rec = table.h, table.rec
    p, n = rec.prev[t], rec.next[t]
    rec.next[p] = n  # lru.unlink, inlined
    rec.prev[n] = p
    if h[H_SMALL_FIRST] == t:
        h[H_SMALL_FIRST] = n
    lru.push_front(rec, t)
    table.marks[t] = 0
    h[H_SMALL] -= 1


def small_oldest(table) -> int:
    """Small's oldest entry (the sentinel's prev), checked to be one of small."""
    t = table.rec.prev[SENTINEL]
    if not 0 < t < table.slots or not table.marks[t] & MARK_SMALL:
        raise CorruptionError(f"small queue's oldest is slot {t}, not an entry of small", what="evict")
    return t


def main_victim(table, main: int) -> int:
    """Main's next victim, as its CLOCK chooses: its oldest entry no view pins with its counter at 0, those before
    it reinserted at main's front with one hit fewer (pinned ones count as used, and are passed over); SENTINEL if
    every one of the ``main`` entries of main is pinned. Nothing is removed."""
    h, rec, marks = table.h, table.rec, table.marks
    slots = table.slots
    passed = 0  # pinned entries of main passed over since the last change: past main's size, no unpinned one is left
    for _ in range(4 * slots + 4):
        t = main_tail(h, rec, slots)
        if not 0 < t < slots or marks[t] & MARK_SMALL:
            raise CorruptionError(f"main queue's oldest is slot {t}, not an entry of main", what="evict")
        m = marks[t]
        pinned = table.pinned_now(t)
        if not pinned and not m & MARK_FREQ:
            pinned = table.pinned(t)  # the victim: its stripe opened, asked again (Table.pinned_now)
        if pinned:
            passed += 1
            if passed > main:
                return SENTINEL
            lru.move_to_front(rec, t)
            continue
        if m & MARK_FREQ:
            marks[t] = m - 1
            passed = 0
            lru.move_to_front(rec, t)
            continue
        return t
    raise CorruptionError("main's queue does not hold the entries the header counts", what="evict")


def evict_main(table, main: int) -> bool:
    """Main's victim evicted (``main_victim``); if every entry of main is pinned, the list's oldest unpinned one
    instead, if any (False: none). (twin: _core_policy.c evict_main)"""
    t = main_victim(table, main)
    if t == SENTINEL:
        return table.evict_oldest()  # main is all pinned: small's oldest unpinned goes, if any
    table.remove(t)
    table.h[H_EVICTIONS] += 1
    return True


def s3fifo_evict_one(table) -> bool:
    """Evict one entry no view pins as S3-FIFO chooses it; False if every entry is pinned (or there is none). An
    entry a view pins counts as used: in small it moves to main, in main it is passed over."""
    h, marks = table.h, table.marks
    if not 0 < h[H_MAX_ENTRIES] < table.slots:
        raise CorruptionError(f"max_entries={h[H_MAX_ENTRIES]} is out of range", what="evict")
    for _ in range(4 * table.slots + 4):
        small = h[H_SMALL]
        main = h[H_ENTRIES] - small
        if small > 0 and main <= h[H_MAX_ENTRIES] - small_share(h[H_MAX_ENTRIES]):
            t = small_oldest(table)
            pinned = table.pinned_now(t)
            if not pinned and marks[t] & MARK_FREQ < PROMOTE_AT:
                pinned = table.pinned(t)  # the victim: its stripe opened, asked again (Table.pinned_now)
            if pinned or marks[t] & MARK_FREQ >= PROMOTE_AT:
                to_main(table, t)
                if not pinned:
                    h[H_PROMOTED] += 1
                continue
            ghost_add(h, table.ghost, table.entry_pfp(t))
            table.remove(t)
            h[H_EVICTIONS] += 1
            return True
        return main > 0 and evict_main(table, main)
    raise CorruptionError("the queues do not hold the entries the header counts", what="evict")


class S3fifo(Policy):
    number = POLICY_S3FIFO
    name = "s3fifo"
    marks_on_hit = True
    evicts_from_tail = False
    snapshot_ranks = 8  # (small, counter): main's before small's, each by its counter, highest first

    def on_hit(self, table, e: int) -> None:
        bump(table.marks, e)

    def admit(self, table, fp: int) -> bool:
        return not admit_to_main(table.h, table.ghost, table.pfp(fp))

    def link_new(self, table, e: int, probation: bool) -> tuple[int, int]:
        if not probation:
            return super().link_new(table, e, probation)
        h = table.h
        p, n = small_end(h, table.rec, table.slots)
        h[H_SMALL_FIRST] = e
        h[H_SMALL] += 1
        table.marks[e] = MARK_SMALL
        return p, n

    def unlinked(self, table, e: int, n: int) -> None:
        if table.marks[e] & MARK_SMALL:
            h = table.h
            h[H_SMALL] -= 1
            if h[H_SMALL_FIRST] == e:
                h[H_SMALL_FIRST] = n  # the next of small, or the sentinel: small is empty

    def leaving(self, table, e: int) -> None:
        if table.marks[e] & MARK_SMALL:  # it leaves small unhit: the ghost remembers it
            ghost_add(table.h, table.ghost, table.entry_pfp(e))

    evict_one = staticmethod(s3fifo_evict_one)  # (the function itself: one call fewer an eviction)

    def check(self, seg, order: list[int], problems) -> None:
        """The list is main's entries then small's (from ``small_first``), ``small`` counts the latter, and each
        entry's mark says which queue it is in."""
        h, marks = seg.header_words, seg.marks_bytes
        odd = [e for e in order if marks[e] & ~MARKS_VALID]
        start = next((i for i, e in enumerate(order) if marks[e] & MARK_SMALL), len(order))
        small = order[start:]
        strays = [e for e in small if not marks[e] & MARK_SMALL]
        if strays:
            problems.add(f"entry {strays[0]} of main is linked among small's entries")
        first = small[0] if small else SENTINEL
        if (h[H_SMALL_FIRST], h[H_SMALL]) != (first, len(small)):
            problems.add(f"small queue: the list has {len(small)} entries from slot {first}, the header says "
                         f"{h[H_SMALL]} from slot {h[H_SMALL_FIRST]}")
        if odd:
            problems.add(f"entry {odd[0]} has marks {marks[odd[0]]:#x}, which its policy never sets")

    def repair_order(self, seg, kept: list[int]) -> list[int]:
        """Main's entries, then small's, each queue in its order (a mark says which)."""
        marks = seg.marks_bytes
        return [e for e in kept if not marks[e] & MARK_SMALL] + [e for e in kept if marks[e] & MARK_SMALL]

    def rebuild(self, seg, kept: list[int]) -> None:
        h, marks = seg.header_words, seg.marks_bytes
        for e in kept:
            marks[e] &= MARKS_VALID
        small = [e for e in kept if marks[e] & MARK_SMALL]
        h[H_SMALL_FIRST], h[H_SMALL] = (small[0] if small else SENTINEL), len(small)

    def snapshot_rank(self, mark: int) -> int:
        return (4 if mark & MARK_SMALL else 0) + MARK_FREQ - (mark & MARK_FREQ)
