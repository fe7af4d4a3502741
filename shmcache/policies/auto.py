"""``auto``: the adaptive policy. Caffeine's adaptive W-TinyLFU (a window, a frequency filter, a main queue and a
climber for the window's share) on S3-FIFO's FIFO queues, so that a hit moves nothing and gets and views read
without the lock.

The list holds the two queues as s3fifo's does: ``sentinel -> main, newest first -> window, newest first (from
small_first) -> sentinel`` (the window is s3fifo's small queue, MARK_SMALL on its entries). Every new key enters the
window. Each lookup of a key, hit or miss, adds one to the key's 4 counters in a count-min sketch (4-bit counters,
halved once a period): what the filter compares. A hit raises its entry's 2-bit counter, as under s3fifo.

Room is made from the window while it holds its target or more (or main is empty): its oldest entry moves to main if
it was hit in the window (or a view pins it, or the window is over its target: the climber lowered it); else the
sketch compares its key's frequency with that of main's next victim (main's CLOCK: the oldest with its counter at 0,
those before it reinserted with one less), and the candidate replaces the victim only if it is more than
ADMIT_MARGIN more frequent; otherwise the candidate goes. Below its target, the window keeps what it has and main's
victim goes. A new key that finds the window at its target with no eviction to make (the cache is filling) pushes
the window's oldest into main.

So a loop or a scan, where every key is as frequent as the next, leaves main as it is (what ``keep`` does), popular
keys win their place over cold ones (what S3-FIFO's ghost approximates), and a window climbed large behaves as a
CLOCK, near LRU. The climber (Caffeine's BoundedLocalCache.climb, in integers): once a period of PERIOD_PER_ENTRY x
max_entries lookups (at most PERIOD_MAX, so that a large cache climbs as often as a small one) has passed (checked
every CHECK_EVERY admissions), the period's hit ratio against the last one's (the first period only measures, from a
cold start any change would look like a gain): better, the target moves on by the step, worse, it moves back by it;
the step shrinks by 2 % a period and restarts at 6.25 % of the entries when the ratio moves by 5 points. Two guards
read the period's promotions (window entries that left it for main with a hit there: ``promoted``): a jump turns
the window larger when they were at least 1/JUMP_SHARE of the period's lookups (what changed is recency's: a new
working set), and the window never grows in a period whose promotions were under 1/GROW_SHARE of its hits (recency
paid nothing: a loop, a scan or a frequency-only workload, where a larger window only costs main its keys). The
sketch is halved about every PERIOD_PER_ENTRY x max_entries lookups: at the end of every k-th period, k the periods
that take.

Where it lives: the ghost region (as many words as the index's slots) holds the sketch, in blocks of 8 words (one
cache line) that hold a key's 4 counters; its first block holds the policy's state (``A_*``, layout/dtypes.py). All
zero is the first state. Any word is valid: each is clamped where it is read, a damaged counter costs hit ratio and
nothing else, and the region is outside the crash protocol, as the ghost is. A hit read without the lock adds to the
sketch with plain stores (a raise lost to a race is a lookup not counted); the state words are written under the
lock only. A resize or clear() empties the region: the climber starts again. The word A_LAST_PPM holds two values:
the last period's hit ratio in its low PPM_BITS and ``promoted`` (modulo 2**PROMOTED_BITS) when the period began
above them, so that the state stays one cache line.
"""

from __future__ import annotations

import numpy as np

from .. import readers
from ..errors import CorruptionError
from ..layout import SENTINEL
from ..layout.dtypes import (
    A_HITS, A_LAST_PPM, A_PERIODS, A_PREFERRED, A_REFUSED, A_REQUESTS, A_STEP, A_TARGET, H_ADMITTED,
    H_ENTRIES, H_EVICTIONS, H_HITS, H_MAX_ENTRIES, H_MISSES, H_PROMOTED, H_SMALL, MARK_FREQ, MAX_COUNTER, POLICY_AUTO,
    SKETCH_BLOCK_WORDS,
)
from .base import Policy
from .s3fifo import S3fifo, bump, evict_main, main_victim, small_oldest, to_main

WINDOW_PERCENT = 1  # the window's first target: 1 % of the entries (Caffeine's), one at least
ADMIT_MARGIN = 1  # how much more frequent than main's victim a candidate must be to replace it
PERIOD_PER_ENTRY = 10  # a period: this many lookups per entry of the limit (Caffeine's sample)
CHECK_EVERY = 64  # admissions between two looks at whether the period is over (each sums the reader slots)
STEP_PER_10000 = 625  # the restarting step: 6.25 % of the entries
RESTART_PPM = 50_000  # a change of the period's hit ratio that restarts the step: 5 points
DECAY_PERCENT = 98  # what is left of the step after a period that did not restart it
STEP_UNIT = 1024  # the step's unit: 1/1024 entry
PERIOD_MAX = 65_536  # a period's most lookups
JUMP_SHARE = 8  # a jump grows the window when the period's promotions were 1/8 of its lookups or more
GROW_SHARE = 2048  # the window never grows in a period whose promotions were under 1/2048 of its hits
PPM_BITS = 20  # A_LAST_PPM: the last hit ratio (PPM < 2**20) in these low bits ...
PROMOTED_BITS = 40  # ... and ``promoted`` when the period began, modulo 2**40, above them
_PPM_MASK = (1 << PPM_BITS) - 1
_PROMOTED_MASK = (1 << PROMOTED_BITS) - 1
PPM = 1_000_000
_HALVE = 0x7777777777777777  # each counter halved: shifted right, and the bit from its neighbour dropped
_WORD = 1 << 64


def _counters(blocks: int, fp: int):
    """The (word, shift) of each of ``fp``'s 4 counters: 2 words of its block each, a nibble chosen by 4 bits."""
    b = (fp & (blocks - 1) or 1) * SKETCH_BLOCK_WORDS  # block 0 is the state's
    return [(b + 2 * i + ((fp >> (32 + i)) & 1), ((fp >> (36 + 4 * i)) & 15) << 2) for i in range(4)]


def sketch_add(sketch, fp: int) -> None:
    """One more lookup of ``fp``: each of its counters raised, saturating at 15. (twin: _core_policy.c
    sketch_add)"""
    for w, shift in _counters(len(sketch) // SKETCH_BLOCK_WORDS, fp):
        v = sketch[w]
        if (v >> shift) & 15 != 15:
            v += 1 << shift
            sketch[w] = v - _WORD if v >= 1 << 63 else v  # (the word is signed: a carry into bit 63 is a nibble's)


def frequency(sketch, fp: int) -> int:
    """How often ``fp`` was looked up lately: the least of its counters. (twin: _core_policy.c frequency)"""
    return min((sketch[w] >> shift) & 15 for w, shift in _counters(len(sketch) // SKETCH_BLOCK_WORDS, fp))


def window_target(max_entries: int, sketch) -> int:
    """The window's target: the state's, or 1 % of the entries, within [1, max_entries - 1]. (twin: _core_policy.c
    window_target)"""
    t = sketch[A_TARGET]
    if t <= 0:
        t = max_entries * WINDOW_PERCENT // 100 if max_entries > 0 else 0
    return min(max(1, t), max(1, max_entries - 1))


def lookups(table) -> tuple[int, int]:
    """(lookups, hits) every process has counted: the header's and the reader slots' since the segment was made
    (each count clipped into range, and each sum too). (twin: _core_policy.c lookups)"""
    h = table.h
    slot_hits, slot_misses, _, _ = readers.sums(table.seg.reader_words)
    hits = min(min(max(h[H_HITS], 0), MAX_COUNTER) + slot_hits, MAX_COUNTER)
    misses = min(min(max(h[H_MISSES], 0), MAX_COUNTER) + slot_misses, MAX_COUNTER)
    return min(hits + misses, MAX_COUNTER), hits


def climb(table) -> None:
    """Close the period if it is over: the window's target moved as the hit ratio and the promotions say, the sketch
    halved every k-th period. Every state word is taken as any value: out of range, it starts a period or the step
    again. (twin: _core_policy.c climb)"""
    h, s = table.h, table.ghost
    c = h[H_MAX_ENTRIES]
    if not 0 < c < table.slots:
        return  # damaged: the eviction that follows says so
    requests, hits = lookups(table)
    r0, h0 = s[A_REQUESTS], s[A_HITS]
    if not (0 <= r0 <= requests and 0 <= h0 <= hits and hits - h0 <= requests - r0):
        s[A_REQUESTS], s[A_HITS] = requests, hits  # the counters were reset (clear()) or the words damaged
        return
    dr, dh = requests - r0, hits - h0
    period = min(PERIOD_PER_ENTRY * c, PERIOD_MAX)
    if dr < period:
        return
    ppm = dh * PPM // dr
    promoted = min(max(h[H_PROMOTED], 0), MAX_COUNTER)
    if 0 < s[A_PERIODS] <= MAX_COUNTER:  # (else the first period since creation, a clear or a resize: the baseline)
        dp = min((promoted - (s[A_LAST_PPM] >> PPM_BITS)) & _PROMOTED_MASK, dr)  # (more than dr: damage)
        _move(s, c, ppm, dr, dh, dp)
    s[A_LAST_PPM] = ppm | (promoted & _PROMOTED_MASK) << PPM_BITS
    s[A_REQUESTS], s[A_HITS] = requests, hits
    _count(s, A_PERIODS)
    if not s[A_PERIODS] % -(-PERIOD_PER_ENTRY * c // period):
        words = np.frombuffer(s, dtype=np.int64)[SKETCH_BLOCK_WORDS:]
        words >>= 1
        words &= _HALVE


def _move(s, c: int, ppm: int, dr: int, dh: int, dp: int) -> None:
    """The climber's step: the window's target moved by the hit ratio ``ppm`` of the period (``dr`` lookups, ``dh``
    hits, ``dp`` promotions) against the last one's, the step made for the next period. (twin: _core_policy.c
    move)"""
    change = ppm - min(s[A_LAST_PPM] & _PPM_MASK, PPM)
    restart = max(STEP_UNIT, c * STEP_PER_10000 // 10000 * STEP_UNIT)
    step = s[A_STEP]
    if not (step and -restart <= step <= restart):
        step = restart  # 0 or out of range: the restarting step
    jump = abs(change) >= RESTART_PPM
    size = abs(step)
    up = (jump and dp * JUMP_SHARE >= dr) or (step > 0) == (change >= 0)
    nxt = restart if jump else size * DECAY_PERCENT // 100
    s[A_STEP] = nxt if up else -nxt
    if up and dp * GROW_SHARE < dh:
        return  # recency paid nothing this period: the window stays
    moved = size // STEP_UNIT
    t = window_target(c, s) + (moved if up else -moved)
    s[A_TARGET] = min(max(1, t), max(1, c - 1))


def _count(s, word: int) -> None:
    s[word] = s[word] + 1 if 0 <= s[word] < MAX_COUNTER else 1


def auto_evict_one(table) -> bool:
    """Evict one entry no view pins as auto chooses it; False if every entry is pinned (or there is none).
    (twin: _core_policy.c auto_evict_one)"""
    h, marks, s = table.h, table.marks, table.ghost
    c = h[H_MAX_ENTRIES]
    if not 0 < c < table.slots:
        raise CorruptionError(f"max_entries={c} is out of range", what="evict")
    target = window_target(c, s)
    for _ in range(table.slots + 1):
        small = h[H_SMALL]
        main = h[H_ENTRIES] - small
        if small > 0 and (small >= target or main <= 0):
            t = small_oldest(table)
            hit = marks[t] & MARK_FREQ
            pinned = table.pinned_now(t)
            if not pinned and not hit and small <= target:
                pinned = table.pinned(t)  # a victim (t, or main's beside it): its stripe opened, asked again
            if pinned or hit or small > target:
                to_main(table, t)  # hit in the window (or in use, or the window over its target): main's; again
                if hit and not pinned:
                    h[H_PROMOTED] += 1
                continue
            if main > 0:
                v = main_victim(table, main)
                if v != SENTINEL:
                    if frequency(s, table.entry_pfp(t)) > frequency(s, table.entry_pfp(v)) + ADMIT_MARGIN:
                        table.remove(v)
                        to_main(table, t)
                        _count(s, A_PREFERRED)
                        h[H_EVICTIONS] += 1
                        return True
                    _count(s, A_REFUSED)
            table.remove(t)
            h[H_EVICTIONS] += 1
            return True
        return main > 0 and evict_main(table, main)
    raise CorruptionError("the queues do not hold the entries the header counts", what="evict")


class Auto(S3fifo):
    number = POLICY_AUTO
    name = "auto"

    def on_hit(self, table, e: int) -> None:
        bump(table.marks, e)
        sketch_add(table.ghost, table.entry_pfp(e))

    def admit(self, table, fp: int) -> bool:
        sketch_add(table.ghost, table.pfp(fp))
        if not table.h[H_ADMITTED] % CHECK_EVERY:
            climb(table)
        return True

    def link_new(self, table, e: int, probation: bool) -> tuple[int, int]:
        h = table.h
        if h[H_SMALL] > 0 and h[H_SMALL] >= window_target(h[H_MAX_ENTRIES], table.ghost):
            t = small_oldest(table)  # nothing was evicted: the cache is filling, main takes the window's oldest
            hit = table.marks[t] & MARK_FREQ
            to_main(table, t)
            if hit:
                h[H_PROMOTED] += 1
        return super().link_new(table, e, probation)

    leaving = Policy.leaving  # no ghost to tell: the sketch remembers (and the hot path skips the call)

    evict_one = staticmethod(auto_evict_one)
