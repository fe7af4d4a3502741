"""``python -m benchmarks.hitratio``: the hit ratio of the real cache's eviction beside reference simulations.

Each workload is a sequence of keys. It is replayed through a real ``SharedCache`` (a fresh segment of
``max_entries`` = the cache size, bytes never the binding limit, 8-byte values; a lookup is a ``get``, and a miss is
followed by a ``put``, as ``get_or_compute`` does) and through exact pure-Python models of eviction policies, all
sized in entries (every value the same size). The table gives each policy's hit ratio (hits / lookups, cold misses
included) and marks the real cache's columns ``(shm)``. A hit ratio depends only on the sequence of keys and the
policy, never on the machine or its load: the figures of one seed are the same everywhere.

Below the table, for each workload and each policy the real cache runs that has a model here, one line says whether
the real cache hit and missed on exactly the lookups its model did ("hit for hit") or where they first differed;
the real cache's own ``stats()`` hits and misses are checked against the counts of the replay too. Under "lru" the
two must agree on every lookup: a difference is a bug in the cache, and the exit status is then 1.

Run: ``python -m benchmarks.hitratio`` (about two minutes on one core), ``--quick`` (seconds: a smoke test, not
figures), ``--only zipf,epochs`` (workloads by name or by the part before the first '-'), ``--json FILE`` (every
figure), ``--seed N``, ``--models lru,sieve`` (the models to run). The command line and the seed are printed first,
so that a table can be reproduced.

Workloads (``--only`` names), and why each:
  zipf-A     independent requests for N keys with Zipf popularity, key k requested with probability proportional
             to 1/k^A, A in 0.6, 0.8, 1.0, 1.2, at cache sizes of 1 %, 10 % and 25 % of N: the standard model of
             web, CDN and key-value caches (web proxies measured 0.64 to 0.83: Breslau et al., "Web caching and
             Zipf-like distributions", INFOCOM 1999; in-memory key-value caches are often more skewed).
  epochs     a dataset of N samples read in shuffled epochs, each epoch a new permutation (a DataLoader's
             sampler), cache at 25 % and 50 % of N; epoch 1 (cold) is reported apart from epochs 2+. Recency says
             nothing here: every sample is read once an epoch, at a random place, so LRU keeps the samples read
             last, which the next epoch reads at random times too. A cache that keeps any fixed subset ("keep-first")
             hits on the cache's share of every later epoch.
  loop       a cyclic scan of a key range 10 % larger than the cache (a batch job, an unshuffled epoch): LRU's worst
             case, it evicts every key just before its next use and hits never.
  zipf-scan  Zipf (A = 1.0) traffic interrupted by bursts of keys read once and never again (a crawler, a report,
             a cold scan: one-hit wonders), cache at 10 % and 25 % of N: can a burst flush the popular keys?
  trace      ``--trace FILE`` replays a recorded trace in a format that published cache simulators read:
             ``--format text``, one key per line (blank lines, and the '*' that ends the LIRS traces, are skipped:
             Caffeine's simulator reads those traces so); ``--format u32be`` / ``u64be``, keys as big-endian
             unsigned 32- or 64-bit integers back to back (the cache2k benchmark traces, 32-bit, and the Scarab
             Research traces, 64-bit, as Caffeine's simulator reads them: Java's DataInputStream.readInt and
             readLong). gzip, bzip2 and xz files are read as such. ``--cache-size`` takes entries (``1000``) or
             fractions of the trace's distinct keys (``0.1``), comma-separated (default 0.01,0.1,0.25). Only the
             trace runs unless ``--only`` names others too.

Reference models (exact, in this file, written from the papers' descriptions; one entry per key):
  lru         exact LRU: an OrderedDict in recency order.
  s3fifo      S3-FIFO: Yang, Zhang, Qiu, Yue and Vinayak, "FIFO queues are all you need for cache eviction",
              SOSP 2023. A small FIFO (10 % of the entries) that every new key enters, a main FIFO (90 %) with a
              2-bit frequency counter per entry (CLOCK-like reinsertion, the counter decremented), and a ghost FIFO
              of the keys evicted from small (90 % of the entries: main's size). A key leaving the small FIFO
              moves to main if it was hit at least twice there, else its key goes to the ghost; a missed key found
              in the ghost enters main directly. Parameters and order of operations as in the reference
              implementation (libCacheSim's S3FIFOv0.c, the original design: small-size-ratio=0.10,
              ghost-size-ratio=0.90, move-to-main-threshold=2).
  s3fifo-libcachesim
              S3-FIFO as libCacheSim's S3FIFO.c (its "s3fifo" since December 2024): until the cache first evicts,
              a new key that finds the small FIFO at its share enters main instead.
  sieve       SIEVE: Zhang, Yang, Yue, Vigfusson and Vinayak, "SIEVE is Simpler than LRU: an Efficient Turn-Key
              Eviction Algorithm for Web Caches", NSDI 2024. One FIFO queue, new keys at the head, a visited bit
              set by a hit, and a hand that moves from the tail towards the head, clearing visited bits, and
              evicts the first unvisited entry; it stays where it stopped, and survivors never move.
  clock       CLOCK (second chance; Corbato, "A paging experiment with the Multics system", 1968): a ring of
              slots, a reference bit set by a hit; the hand clears set bits until it finds a clear one and
              replaces that entry. New entries start unreferenced.
  2q          full 2Q: Johnson and Shasha, "2Q: A Low Overhead High Performance Buffer Management Replacement
              Algorithm", VLDB 1994: a FIFO A1in (Kin = 25 % of the entries) that new keys enter, a ghost FIFO
              A1out of keys evicted from it (Kout = 50 %), and an LRU Am for keys missed again while in A1out.
  keep-first  the dataset policy: admit keys until the cache is full, then admit nothing and evict nothing.

The real cache is replayed with each policy it has (``shmcache.POLICIES``: lru, s3fifo, keep; found by trying each
name above and the spellings ``s3-fifo``, ``keep``, ``dataset`` on a small segment), or the ``--shm-policy`` names,
and compared with its model: lru and keep must hit exactly where theirs do (a difference makes the exit status 1);
s3fifo, whose ghost is a table of fingerprints aged by a clock rather than the published FIFO of keys
(shmcache/policies/s3fifo.py), within S3FIFO_TOLERANCE points of the published one's hit ratio. Every segment made is
unlinked, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import itertools
import json
import lzma
import os
import platform
import random
import shlex
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

import shmcache
from shmcache import SharedCache
from shmcache.cache import DEFAULT_POLICY
from shmcache.core import PATH as CORE_PATH

DEFAULT_SEED = 1
VALUE = b"01234567"  # every value stored: 8 bytes
SHM_LABEL = "{} (shm)"

# -------------------------------------------------------------------------------------------------- reference models


class LRU:
    """Exact LRU: the resident keys in an OrderedDict, least recently used first."""

    name = "lru"

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: OrderedDict = OrderedDict()

    def access(self, key) -> bool:
        """Look ``key`` up (a miss stores it); whether it was a hit."""
        entries = self.entries
        if key in entries:
            entries.move_to_end(key)
            return True
        entries[key] = None
        if len(entries) > self.size:
            entries.popitem(last=False)
        return False


class S3FIFO:
    """S3-FIFO (SOSP 2023) as libCacheSim's S3FIFOv0.c runs it: small, main and ghost FIFOs (OrderedDicts, oldest
    first) of key -> frequency. The small FIFO gets a tenth of the entries (at least one), main the rest, the ghost
    as many keys as ``ghost_ratio`` of the entries. A new key enters small even past small's share while the cache
    is not full; eviction starts only when it is, from main when main is over its share or small is empty, else from
    small."""

    name = "s3fifo"
    fill_main = False  # S3FIFOLibCacheSim: while nothing was evicted, new keys past small's share go to main

    def __init__(self, size: int, small_ratio: float = 0.10, ghost_ratio: float = 0.90,
                 move_to_main: int = 2) -> None:
        self.size = size
        self.evicted = False  # whether the cache has evicted anything yet
        # In integer arithmetic, as SharedCache's policy="s3fifo" computes them (shmcache/policies/s3fifo.py).
        self.small_size = max(1, size * round(small_ratio * 100) // 100)
        self.main_size = size - self.small_size
        self.ghost_size = size * round(ghost_ratio * 100) // 100
        self.move_to_main = move_to_main  # hits in small that earn a key its place in main
        self.small: OrderedDict = OrderedDict()
        self.main: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()

    def access(self, key) -> bool:
        small, main = self.small, self.main
        freq = small.get(key)
        if freq is not None:
            small[key] = freq + 1 if freq < 3 else 3  # 2-bit counter
            return True
        freq = main.get(key)
        if freq is not None:
            main[key] = freq + 1 if freq < 3 else 3
            return True
        in_ghost = key in self.ghost
        if in_ghost:
            del self.ghost[key]
        while len(small) + len(main) >= self.size:
            self.evicted = True
            if len(main) > self.main_size or not small:
                self._evict_main()
            else:
                self._evict_small()
        if in_ghost or (self.fill_main and not self.evicted and len(small) >= self.small_size):
            main[key] = 0
        else:
            small[key] = 0
        return False

    def _evict_small(self) -> None:
        """Move the oldest keys of small that were hit often enough to main, until one leaves for the ghost."""
        small, ghost = self.small, self.ghost
        while small:
            key, freq = small.popitem(last=False)
            if freq >= self.move_to_main:
                self.main[key] = 0  # main may exceed its share for now; the next eviction takes from it
                continue
            if self.ghost_size:
                ghost[key] = None
                if len(ghost) > self.ghost_size:
                    ghost.popitem(last=False)
            return

    def _evict_main(self) -> None:
        """Reinsert the oldest keys of main with their counter decremented until one at 0 is evicted."""
        main = self.main
        while main:
            key, freq = main.popitem(last=False)
            if not freq:
                return
            main[key] = freq - 1


class S3FIFOLibCacheSim(S3FIFO):
    """S3-FIFO as libCacheSim's S3FIFO.c runs it since December 2024 (its default "s3fifo" now): the same, except
    that until the cache first evicts, a new key finds small at its share enters main instead. Its authors find it
    better in general: the keys of the first fill that small would have demoted stay longer, and those admitted
    after are filtered sooner."""

    name = "s3fifo-libcachesim"
    fill_main = True


class Auto:
    """The adaptive policy (SharedCache's ``policy="auto"``), as its integer rules run in the segment: a small
    window FIFO that every new key enters, a main CLOCK queue (2-bit counters, as S3-FIFO's main), and a frequency
    filter between them, with the window's share climbed to the hit ratio. This is Caffeine's adaptive W-TinyLFU
    (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM ToS 2017; the climber
    of Caffeine's BoundedLocalCache) on FIFO queues, so that a hit only raises a counter and a sketch: nothing moves.

    - Every lookup of a key, hit or miss, adds to a count-min sketch of 4-bit counters (4 of them per key, in one
      64-byte block chosen by the key's fingerprint; the first block of the sketch holds the policy's state words,
      and a key whose block is 0 uses block 1). Every counter is halved about every PERIOD_PER_ENTRY x entries
      lookups: at the end of every k-th period, k the periods that take (one, unless PERIOD_MAX cuts them short).
    - A hit raises the entry's 2-bit counter. A miss puts the key at the window's front.
    - Room is made from the window while it holds its target or more (or main is empty): its oldest entry goes to
      main if it was hit there (or is pinned), or if the window is over its target (the climber lowered it, and
      Caffeine's window gives main what it no longer holds); else the frequency of its key is compared with that of
      main's next victim (main's oldest with its counter at 0, the others reinserted with one less, as S3-FIFO's
      main does): the candidate replaces the victim only if its frequency is more than ADMIT_MARGIN above the
      victim's (a loop or a scan, where every key is as frequent as the next, keeps main as it is: "keep"'s
      behaviour), and goes otherwise. With the window below its target, main's victim goes.
    - A new key that finds the window at its target and no eviction to make (the cache is filling) pushes the
      window's oldest into main.
    - The climber, checked every CHECK_EVERY admissions once a period of PERIOD_PER_ENTRY x entries lookups (at
      most PERIOD_MAX) has passed: the hit ratio of the period against the last one's (the first period only
      measures: from a cold start any change looks like a gain); better, the window's target moves on by the step,
      worse, it moves back; the step shrinks by 2 % a period, and restarts at 6.25 % of the entries when the ratio
      moves by 5 points. Two guards, on the period's promotions (window entries that leave it for main with a hit
      there): a jump of 5 points turns the window larger if promotions were at least 1/JUMP_SHARE of the period's
      lookups (recency is what changed), and the window never grows in a period whose promotions were under
      1/GROW_SHARE of its hits (recency paid nothing: a loop, a scan, a frequency-only workload).
    """

    name = "auto"
    WINDOW_PERCENT = 1  # the window's first target: 1 % of the entries (at least one)
    ADMIT_MARGIN = 1
    PERIOD_PER_ENTRY = 10
    CHECK_EVERY = 64
    STEP_PER_10000 = 625  # the climber's restarting step: 6.25 % of the entries
    RESTART_PPM = 50_000  # a change of hit ratio that restarts the step: 5 points
    DECAY_PERCENT = 98
    UNIT = 1024  # the step is kept in 1/1024 entries
    PERIOD_MAX = 65_536  # a period's most lookups: a large cache climbs as often as a small one
    JUMP_SHARE = 8  # a jump grows the window if promotions were 1/8 of the period's lookups or more
    GROW_SHARE = 2048  # the window never grows in a period whose promotions were under 1/2048 of its hits

    def __init__(self, size: int) -> None:
        from shmcache.codec import encode_key, fingerprint
        from shmcache.layout import Geometry
        from shmcache.layout.dtypes import POLICY_AUTO
        from shmcache.records import narrow_pfp

        self.size = size
        g = Geometry.for_capacity(1 << 20, size, POLICY_AUTO)  # (the sketch in force for the limit: ghost_for)
        # (a narrow segment's policy knows a key by its fingerprint's low 32 bits, spread: records.narrow_pfp)
        spread = narrow_pfp if g.narrow else int
        self._fp = lambda key: spread(fingerprint(encode_key(str(key))))
        self.fps: dict = {}
        self.blocks = g.ghost_for(g.index_for(size)) // 8
        self.sketch = [0] * (self.blocks * 8)
        self.window: OrderedDict = OrderedDict()  # key -> counter, oldest first
        self.main: OrderedDict = OrderedDict()
        self.target = 0  # the window's target as stored: 0 is the first one (WINDOW_PERCENT)
        self.step = 0  # 0: the restarting step, towards a larger window
        self.last_ppm = 0
        self.requests = self.hits = self.requests0 = self.hits0 = 0
        self.promoted = self.promoted0 = 0  # window entries that went to main with a hit there
        self.admitted = 0
        self.periods = self.preferred = self.refused = 0  # as the cache counts them (stats().filter_*)

    def fingerprint(self, key) -> int:
        fp = self.fps.get(key)
        if fp is None:
            fp = self.fps[key] = self._fp(key)
        return fp

    def counters(self, fp: int) -> Iterator[tuple[int, int]]:
        """The (word, shift) of each of the key's 4 counters."""
        b = fp & (self.blocks - 1) or 1
        for i in range(4):
            yield b * 8 + 2 * i + ((fp >> (32 + i)) & 1), ((fp >> (36 + 4 * i)) & 15) * 4

    def add(self, fp: int) -> None:
        sketch = self.sketch
        for w, shift in self.counters(fp):
            if (sketch[w] >> shift) & 15 < 15:
                sketch[w] += 1 << shift

    def frequency(self, fp: int) -> int:
        sketch = self.sketch
        return min((sketch[w] >> shift) & 15 for w, shift in self.counters(fp))

    def window_target(self) -> int:
        c = self.size
        t = self.target or c * self.WINDOW_PERCENT // 100
        return min(max(1, t), max(1, c - 1))

    def access(self, key) -> bool:
        fp = self.fingerprint(key)
        self.requests += 1
        for queue in (self.window, self.main):
            m = queue.get(key)
            if m is not None:
                queue[key] = min(m + 1, 3)
                self.add(fp)
                self.hits += 1
                return True
        self.add(fp)
        if self.admitted % self.CHECK_EVERY == 0:
            self.climb()
        self.admitted += 1
        if len(self.window) + len(self.main) >= self.size:
            self.evict_one()
        if len(self.window) >= self.window_target():
            k, m = self.window.popitem(last=False)  # the cache is filling: the window's oldest to main
            self.main[k] = 0
            self.promoted += m > 0
        self.window[key] = 0
        return False

    def climb(self) -> None:
        dr, dh = self.requests - self.requests0, self.hits - self.hits0
        period = min(self.PERIOD_PER_ENTRY * self.size, self.PERIOD_MAX)
        if dr < period:
            return
        ppm = dh * 1_000_000 // dr
        if self.periods:  # the first period has nothing to be compared with: it is the baseline
            self.move(ppm, dr, dh, self.promoted - self.promoted0)
        self.last_ppm = ppm
        self.requests0, self.hits0, self.promoted0 = self.requests, self.hits, self.promoted
        self.periods += 1
        if not self.periods % -(-self.PERIOD_PER_ENTRY * self.size // period):
            self.sketch = [(w >> 1) & 0x7777777777777777 for w in self.sketch]

    def move(self, ppm: int, dr: int, dh: int, dp: int) -> None:
        change = ppm - self.last_ppm
        restart = max(self.UNIT, self.size * self.STEP_PER_10000 // 10000 * self.UNIT)
        jump = abs(change) >= self.RESTART_PPM
        size = abs(self.step) or restart
        up = (jump and dp * self.JUMP_SHARE >= dr) or (self.step >= 0) == (change >= 0)
        nxt = restart if jump else size * self.DECAY_PERCENT // 100
        self.step = nxt if up else -nxt  # decayed to 0 (hundreds of periods): the next period restarts
        if up and dp * self.GROW_SHARE < dh:
            return  # recency paid nothing this period: the window stays
        moved = size // self.UNIT
        self.target = min(max(1, self.window_target() + (moved if up else -moved)), max(1, self.size - 1))

    def victim(self):
        main = self.main
        while True:
            k, m = next(iter(main.items()))
            if not m:
                return k
            main.move_to_end(k)
            main[k] = m - 1

    def evict_one(self) -> None:
        window, main = self.window, self.main
        while window and (len(window) >= self.window_target() or not main):
            k, m = window.popitem(last=False)
            if m or len(window) >= self.window_target():
                main[k] = 0  # hit in the window, or the window over its target: to main, and look again
                self.promoted += m > 0
                continue
            if main:
                v = self.victim()
                if self.frequency(self.fingerprint(k)) > self.frequency(self.fingerprint(v)) + self.ADMIT_MARGIN:
                    del main[v]
                    main[k] = 0
                    self.preferred += 1
                else:
                    self.refused += 1
            return
        del main[self.victim()]


class Sieve:
    """SIEVE (NSDI 2024): a queue as a doubly linked list over dicts (head: newest), a visited bit per key, and the
    hand. Keys must not be None (None ends the list)."""

    name = "sieve"

    def __init__(self, size: int) -> None:
        self.size = size
        self.visited: dict = {}  # resident key -> its visited bit
        self.newer: dict = {}  # key -> the key next to it towards the head (None at the head)
        self.older: dict = {}  # key -> the key next to it towards the tail (None at the tail)
        self.head = self.tail = self.hand = None

    def access(self, key) -> bool:
        visited = self.visited
        if key in visited:
            visited[key] = True
            return True
        if len(visited) >= self.size:
            self._evict()
        head = self.head
        self.older[key], self.newer[key] = head, None
        if head is None:
            self.tail = key
        else:
            self.newer[head] = key
        self.head = key
        visited[key] = False
        return False

    def _evict(self) -> None:
        visited, newer = self.visited, self.newer
        key = self.tail if self.hand is None else self.hand
        while visited[key]:
            visited[key] = False
            key = newer[key]
            if key is None:
                key = self.tail
        self.hand = newer[key]  # None: the next eviction starts at the tail again
        del visited[key]
        nxt, prev = newer.pop(key), self.older.pop(key)
        if nxt is None:
            self.head = prev
        else:
            self.older[nxt] = prev
        if prev is None:
            self.tail = nxt
        else:
            newer[prev] = nxt


class Clock:
    """CLOCK (second chance): keys in a ring of ``size`` slots with a reference bit each, and the hand."""

    name = "clock"

    def __init__(self, size: int) -> None:
        self.size = size
        self.slot_of: dict = {}  # resident key -> its slot
        self.keys: list = []  # slot -> key
        self.referenced: list[bool] = []  # slot -> reference bit
        self.hand = 0

    def access(self, key) -> bool:
        slot = self.slot_of.get(key)
        if slot is not None:
            self.referenced[slot] = True
            return True
        keys, referenced = self.keys, self.referenced
        if len(keys) < self.size:  # filling: the ring in arrival order, the hand at its start
            self.slot_of[key] = len(keys)
            keys.append(key)
            referenced.append(False)
            return False
        hand = self.hand
        while referenced[hand]:
            referenced[hand] = False
            hand = hand + 1 if hand + 1 < self.size else 0
        del self.slot_of[keys[hand]]
        keys[hand] = key  # its bit is clear already
        self.slot_of[key] = hand
        self.hand = hand + 1 if hand + 1 < self.size else 0
        return False


class TwoQ:
    """Full 2Q (VLDB 1994) with the paper's suggested Kin = 25 % and Kout = 50 % of the entries: A1in and A1out
    FIFOs and the Am LRU, each an OrderedDict, oldest first."""

    name = "2q"

    def __init__(self, size: int, kin: float = 0.25, kout: float = 0.50) -> None:
        self.size = size
        self.kin = max(1, int(size * kin))
        self.kout = max(1, int(size * kout))
        self.a1in: OrderedDict = OrderedDict()
        self.a1out: OrderedDict = OrderedDict()
        self.am: OrderedDict = OrderedDict()

    def access(self, key) -> bool:
        am = self.am
        if key in am:
            am.move_to_end(key)
            return True
        if key in self.a1in:  # a correlated reference: nothing moves
            return True
        if key in self.a1out:
            del self.a1out[key]
            self._reclaim()
            am[key] = None
        else:
            self._reclaim()
            self.a1in[key] = None
        return False

    def _reclaim(self) -> None:
        """Make room for one key (the paper's reclaimfor)."""
        a1in, am = self.a1in, self.am
        if len(a1in) + len(am) < self.size:
            return
        if len(a1in) > self.kin or not am:
            key, _ = a1in.popitem(last=False)
            self.a1out[key] = None
            if len(self.a1out) > self.kout:
                self.a1out.popitem(last=False)
        else:
            am.popitem(last=False)


class KeepFirst:
    """The dataset policy: the first ``size`` distinct keys are kept for good; nothing else is ever admitted."""

    name = "keep-first"

    def __init__(self, size: int) -> None:
        self.size = size
        self.kept: set = set()

    def access(self, key) -> bool:
        kept = self.kept
        if key in kept:
            return True
        if len(kept) < self.size:
            kept.add(key)
        return False


MODELS: dict[str, Callable[[int], object]] = {
    m.name: m for m in (LRU, S3FIFO, S3FIFOLibCacheSim, Auto, Sieve, Clock, TwoQ, KeepFirst)
}
# Names the real cache may give its policies -> the model each is compared with.
SHM_POLICY_NAMES = {"lru": "lru", "s3fifo": "s3fifo", "s3-fifo": "s3fifo", "sieve": "sieve", "clock": "clock",
                    "2q": "2q", "keep": "keep-first", "keep-first": "keep-first", "dataset": "keep-first",
                    "auto": "auto"}
# Models the real cache must match lookup for lookup under the policy compared with them (a mismatch is a failure).
# SharedCache's s3fifo approximates the published ghost (a FIFO of keys) with a fixed table of fingerprints aged by a
# clock (shmcache/policies/s3fifo.py): its hits are compared with the model's as a difference in points.
EXACT_MODELS = ("lru", "keep-first", "auto")
S3FIFO_TOLERANCE = 1.0  # points of hit ratio the real s3fifo may differ from the published one's model


def simulate(model, keys: Sequence) -> bytearray:
    """Replay ``keys`` through ``model``: 1 for each lookup that hit, 0 for each miss."""
    return bytearray(map(model.access, keys))


# -------------------------------------------------------------------------------------------------- the real cache


def shm_capacity_bytes(size: int, max_key_nbytes: int) -> int:
    """Bytes enough for ``size`` entries of the longest key and VALUE: only the entry limit ever binds."""
    return size * (max_key_nbytes + len(VALUE) + 64) + 4096


def replay_shm(keys: Sequence[str], size: int, name: str, policy: str | None = None,
               max_key_nbytes: int | None = None) -> tuple[bytearray, shmcache.CacheStats]:
    """Replay ``keys`` (str) through a new SharedCache named ``name`` (created, then unlinked however this ends) of
    ``max_entries=size``, with ``policy=`` if one is given: a ``get``, and a ``put`` after each miss. Returns the
    hit of each lookup (1 or 0) and the cache's stats at the end."""
    if max_key_nbytes is None:
        max_key_nbytes = max((len(k.encode()) for k in keys), default=1)
    extra = {} if policy is None else {"policy": policy}
    cache = SharedCache(name, capacity_bytes=shm_capacity_bytes(size, max_key_nbytes), max_entries=size,
                        create=True, **extra)  # unlinks what it made if it raises
    try:
        hits = bytearray(len(keys))
        get, put = cache.get, cache.put
        for i, key in enumerate(keys):
            if get(key) is None:
                put(key, VALUE)
            else:
                hits[i] = 1
        return hits, cache.stats()
    finally:
        try:
            cache.close()
        finally:
            SharedCache.unlink_name(name)


def segment_name(tag: str) -> str:
    return f"bench-hitratio-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def shm_policies(wanted: Sequence[str] | None = None) -> list[str | None]:
    """The ``policy=`` values to replay the real cache with: ``wanted``, or the first name of SHM_POLICY_NAMES for
    each model that a small cache accepts."""
    if wanted:
        return list(wanted)
    accepted: list[str | None] = []
    for policy, model in SHM_POLICY_NAMES.items():
        if model in map(shm_model, accepted):
            continue  # another spelling of a policy found already
        name = segment_name("probe")
        try:
            SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, policy=policy).close()
        except (TypeError, ValueError):
            continue  # not a policy of this cache (nothing was left behind: the constructor cleans up)
        finally:
            try:
                SharedCache.unlink_name(name)
            except FileNotFoundError:
                pass
        accepted.append(policy)
    return accepted


def shm_label(policy: str | None) -> str:
    return SHM_LABEL.format(policy or DEFAULT_POLICY)


def shm_model(policy: str | None) -> str | None:
    """The reference model the real cache's ``policy`` is compared with, if there is one (None: the default's)."""
    return SHM_POLICY_NAMES.get(DEFAULT_POLICY if policy is None else policy)


def first_mismatch(a: bytes | bytearray, b: bytes | bytearray) -> int | None:
    """The index of the first lookup where two hit sequences differ; None if they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# -------------------------------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    """A sequence of lookups and the cache sizes (entries) to replay it at. ``phases`` are (label, start, stop)
    ranges of lookups reported on their own rows (default: one row for all of them); ``key_space`` is what the
    sizes are a share of (the keys that can be drawn, or a trace's distinct keys)."""

    name: str
    description: str
    keys: list
    sizes: tuple[int, ...]
    key_space: int
    phases: tuple[tuple[str, int, int], ...] = ()
    seed: str | None = None

    def rows(self) -> tuple[tuple[str, int, int], ...]:
        return self.phases or (("all", 0, len(self.keys)),)

    @property
    def lookups(self) -> int:
        return max(stop for _, _, stop in self.rows())

    def without_keys(self) -> Workload:
        """The workload as its results describe it: everything but its keys (which may take hundreds of MB)."""
        return replace(self, keys=[], phases=self.rows())


@dataclass(frozen=True)
class Scale:
    zipf_keys: int
    zipf_lookups: int
    epoch_samples: int
    epochs: int
    loop_cache: int
    loop_passes: int
    scan_burst: int  # one-hit wonders in a burst
    scan_every: int  # Zipf lookups between two bursts
    zipf_alphas: tuple[float, ...] = (0.6, 0.8, 1.0, 1.2)
    zipf_fractions: tuple[float, ...] = (0.01, 0.10, 0.25)
    epoch_fractions: tuple[float, ...] = (0.25, 0.50)
    scan_alpha: float = 1.0
    scan_fractions: tuple[float, ...] = (0.10, 0.25)


FULL = Scale(zipf_keys=100_000, zipf_lookups=2_000_000, epoch_samples=100_000, epochs=5, loop_cache=10_000,
             loop_passes=20, scan_burst=10_000, scan_every=100_000)
QUICK = Scale(zipf_keys=2_000, zipf_lookups=12_000, epoch_samples=1_000, epochs=3, loop_cache=200, loop_passes=10,
              scan_burst=200, scan_every=1_000)


def rng_for(seed: int, workload: str) -> tuple[random.Random, str]:
    """The random stream of one workload (a Random seeded with a str draws the same numbers on every platform)."""
    label = f"{seed}/{workload}"
    return random.Random(label), label


def sizes_of(n: int, fractions: Sequence[float]) -> tuple[int, ...]:
    return tuple(max(1, round(n * f)) for f in fractions)


def zipf_keys(n: int, alpha: float, count: int, rng: random.Random) -> list[int]:
    """``count`` independent draws of keys 0..n-1, key k with probability proportional to 1/(k+1)^alpha."""
    cum = list(itertools.accumulate(1.0 / (k ** alpha) for k in range(1, n + 1)))
    return rng.choices(range(n), cum_weights=cum, k=count)


def zipf_workload(n: int, lookups: int, alpha: float, fractions: Sequence[float], seed: int) -> Workload:
    name = f"zipf-{alpha:.1f}"
    rng, label = rng_for(seed, name)
    return Workload(name, f"Zipf alpha={alpha:g} over {n:,} keys, {lookups:,} independent lookups",
                    zipf_keys(n, alpha, lookups, rng), sizes_of(n, fractions), n, seed=label)


def epochs_workload(n: int, epochs: int, fractions: Sequence[float], seed: int) -> Workload:
    rng, label = rng_for(seed, "epochs")
    order, keys = list(range(n)), []
    for _ in range(epochs):
        rng.shuffle(order)
        keys.extend(order)
    phases = (("epoch 1", 0, n), (f"epochs 2-{epochs}", n, n * epochs)) if epochs > 1 else ()
    return Workload("epochs", f"{epochs} epochs over {n:,} samples, each a new permutation", keys,
                    sizes_of(n, fractions), n, phases, label)


def loop_workload(cache: int, passes: int, over: float = 0.10) -> Workload:
    length = cache + max(1, round(cache * over))
    return Workload("loop", f"{passes} passes over {length:,} keys in order ({over:.0%} more than the cache)",
                    [i % length for i in range(length * passes)], (cache,), length)


def scan_workload(n: int, alpha: float, zipf_lookups: int, every: int, burst: int, fractions: Sequence[float],
                  seed: int) -> Workload:
    """Zipf lookups over keys 0..n-1 with a burst of ``burst`` keys never seen before nor after (n, n+1, ...) after
    each ``every`` of them."""
    rng, label = rng_for(seed, "zipf-scan")
    zipf = zipf_keys(n, alpha, zipf_lookups, rng)
    keys: list[int] = []
    fresh = itertools.count(n)
    for start in range(0, zipf_lookups, every):
        keys.extend(zipf[start:start + every])
        if start + every < zipf_lookups:
            keys.extend(itertools.islice(fresh, burst))
    bursts = (zipf_lookups - 1) // every
    return Workload("zipf-scan", f"Zipf alpha={alpha:g} over {n:,} keys, {zipf_lookups:,} lookups, a burst of "
                    f"{burst:,} one-hit wonders after every {every:,} ({bursts} bursts)", keys,
                    sizes_of(n, fractions), n, seed=label)


def synthetic_workloads(scale: Scale, seed: int, selected: Callable[[str], bool]) -> Iterator[Workload]:
    """The synthetic workloads that ``selected`` accepts, in table order, each generated when it is reached."""
    makers: list[tuple[str, Callable[[], Workload]]] = [
        (f"zipf-{a:.1f}", lambda a=a: zipf_workload(scale.zipf_keys, scale.zipf_lookups, a, scale.zipf_fractions,
                                                    seed))
        for a in scale.zipf_alphas
    ]
    makers += [
        ("epochs", lambda: epochs_workload(scale.epoch_samples, scale.epochs, scale.epoch_fractions, seed)),
        ("loop", lambda: loop_workload(scale.loop_cache, scale.loop_passes)),
        ("zipf-scan", lambda: scan_workload(scale.zipf_keys, scale.scan_alpha, scale.zipf_lookups, scale.scan_every,
                                            scale.scan_burst, scale.scan_fractions, seed)),
    ]
    return (make() for name, make in makers if selected(name))


def synthetic_names(scale: Scale) -> list[str]:
    return [f"zipf-{a:.1f}" for a in scale.zipf_alphas] + ["epochs", "loop", "zipf-scan"]


# -------------------------------------------------------------------------------------------------- trace files

TRACE_FORMATS = ("text", "u32be", "u64be")
_COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))


def _open_trace(path: str):
    """``path`` opened for binary reading, decompressed if it is gzip, bzip2 or xz (told by its first bytes)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    for prefix, opener in _COMPRESSED:
        if magic.startswith(prefix):
            return opener(path, "rb")
    return open(path, "rb")


def read_trace(path: str, fmt: str) -> list:
    """The keys of a trace file: str for ``text`` (one per line, stripped; blank lines and LIRS's '*' end marker
    skipped), int for ``u32be`` / ``u64be`` (big-endian unsigned integers back to back)."""
    if fmt not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; one of {', '.join(TRACE_FORMATS)}")
    with _open_trace(path) as f:
        data = f.read()
    if fmt == "text":
        lines = (line.strip() for line in data.decode("utf-8", "surrogateescape").splitlines())
        return [line for line in lines if line and line != "*"]
    width = 4 if fmt == "u32be" else 8
    if len(data) % width:
        raise ValueError(f"{path}: {len(data):,} bytes is not a whole number of {width}-byte keys ({fmt})")
    return np.frombuffer(data, dtype=f">u{width}").tolist()


def parse_cache_sizes(text: str, distinct: int) -> tuple[int, ...]:
    """``--cache-size``: comma-separated entries (``1000``) or fractions of the distinct keys (``0.1``: a number
    written with a '.' or an exponent), each at least 1 entry."""
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if any(c in part for c in ".eE"):
            fraction = float(part)
            if not 0 < fraction <= 1:
                raise ValueError(f"cache size {part}: a fraction must be in (0, 1]")
            sizes.append(max(1, round(distinct * fraction)))
        else:
            entries = int(part)
            if entries < 1:
                raise ValueError(f"cache size {part}: at least 1 entry")
            sizes.append(entries)
    if not sizes:
        raise ValueError("no cache size given")
    return tuple(sizes)


def trace_workload(path: str, fmt: str, cache_sizes: str) -> Workload:
    keys = read_trace(path, fmt)
    if not keys:
        raise ValueError(f"{path}: no keys")
    distinct = len(set(keys))
    return Workload("trace", f"{os.path.basename(path)} ({fmt}): {len(keys):,} lookups, {distinct:,} distinct keys",
                    keys, parse_cache_sizes(cache_sizes, distinct), distinct)


# The traces of Caffeine's simulator this benchmark knows, by name: (its folder under Caffeine's
# simulator/src/main/resources/com/github/benmanes/caffeine/cache/simulator/parser/, the format). The files are
# Caffeine's to distribute, not this repository's: --traces DIR looks for "<name>.trace*" anywhere under DIR (a clone
# of https://github.com/ben-manes/caffeine, or a folder the files were copied to).
CAFFEINE_TRACES = {
    **{name: ("lirs", "text") for name in ("2_pools", "backf", "cpp", "cs", "gli", "loop", "multi1", "multi2",
                                           "multi3", "ps", "scan", "sprite", "zigzag")},
    **{name: ("cache2k", "u32be") for name in ("orm-busy", "orm-night", "web07", "web12")},
    "scarab-recs": ("scarab", "u64be"),
}


def find_traces(folder: str) -> list[tuple[str, str, str]]:
    """(name, path, format) of each trace of CAFFEINE_TRACES found under ``folder``, in the table's order."""
    found: dict[str, str] = {}
    for root, _, files in os.walk(folder):
        for f in sorted(files):
            name = f.split(".trace")[0] if ".trace" in f else None
            if name in CAFFEINE_TRACES and name not in found:
                found[name] = os.path.join(root, f)
    return [(n, found[n], CAFFEINE_TRACES[n][1]) for n in CAFFEINE_TRACES if n in found]


def adaptive_lines(results: Sequence[Result], fixed: Sequence[str], column: str, within: float = 2.0) -> list[str]:
    """How ``column`` (the adaptive policy) compares, row by row, with the best of the ``fixed`` columns: the mean
    and the worst difference in points, and the rows more than ``within`` points below the best."""
    gaps = []
    for r in results:
        for row, (phase, _, _) in enumerate(r.workload.rows()):
            best = max(100 * r.ratio(c, row) for c in fixed)
            label = f"{r.workload.name}{'' if phase == 'all' else ', ' + phase} at {r.size:,}"
            gaps.append((100 * r.ratio(column, row) - best, label))
    if not gaps:
        return []
    worst = min(gaps)
    below = [f"{label} ({g:+.1f})" for g, label in gaps if g < -within]
    mean = sum(g for g, _ in gaps) / len(gaps)
    return [f"{column} against the best of {', '.join(fixed)} on each row: mean {mean:+.2f} points, worst "
            f"{worst[0]:+.1f} ({worst[1]}); {len(gaps) - len(below)} of {len(gaps)} rows within {within:g} points"
            + (f"; below: {', '.join(below)}" if below else "")]


# -------------------------------------------------------------------------------------------------- running


@dataclass
class Check:
    """The real cache under one policy against its model, at one cache size."""

    workload: str
    size: int
    shm: str
    model: str | None
    mismatch: int | None = None  # first lookup that differs
    detail: str = ""
    stats_problem: str = ""
    points: float = 0.0  # the real cache's hit ratio less the model's, in points

    @property
    def failed(self) -> bool:
        """A difference the model does not allow: any, for an exact model; past the tolerance, for s3fifo."""
        if self.model in EXACT_MODELS:
            return self.mismatch is not None
        return self.model == "s3fifo" and abs(self.points) > S3FIFO_TOLERANCE


@dataclass
class Result:
    """One workload at one cache size: the hits of each column (a real-cache policy or a model) in each of the
    workload's rows (phases), and the real cache's checks."""

    workload: Workload
    size: int
    hits: dict[str, tuple[int, ...]] = field(default_factory=dict)  # column -> hits in each of workload.rows()
    checks: list[Check] = field(default_factory=list)

    def ratio(self, column: str, row: int) -> float:
        _, start, stop = self.workload.rows()[row]
        return self.hits[column][row] / (stop - start) if stop > start else 0.0


def run_workload(w: Workload, models: Sequence[str], policies: Sequence[str | None],
                 name: str | None = None) -> list[Result]:
    """Replay ``w`` at each of its sizes through each model and the real cache under each policy, one segment at a
    time, each named ``name`` (default: a new unique name each). The hit sequences are compared, then only their
    counts kept."""
    shm_keys = w.keys if isinstance(w.keys[0], str) else [str(k) for k in w.keys]  # a workload's keys: one type
    max_key_nbytes = max(len(k.encode()) for k in set(shm_keys))
    results = []
    for size in w.sizes:
        r = Result(w.without_keys(), size)
        sequences: dict[str, bytearray] = {}
        for policy in policies:
            label = shm_label(policy)
            hits, stats = replay_shm(shm_keys, size, name or segment_name(w.name), policy, max_key_nbytes)
            sequences[label] = hits
            r.checks.append(Check(w.name, size, label, shm_model(policy),
                                  stats_problem=stats_disagreement(hits, stats)))
        for model in models:
            sequences[model] = simulate(MODELS[model](size), w.keys)
        for c in r.checks:
            if c.model is None:
                continue
            if c.model not in sequences:  # not asked for as a column, but the real cache is compared with it
                sequences[c.model] = simulate(MODELS[c.model](size), w.keys)
            shm, model_hits = sequences[c.shm], sequences[c.model]
            c.mismatch = first_mismatch(shm, model_hits)
            c.points = 100 * (shm.count(1) - model_hits.count(1)) / len(shm) if shm else 0.0
            if c.mismatch is not None:
                i = c.mismatch
                c.detail = (f"first mismatch at lookup {i:,} of {len(w.keys):,} (key {w.keys[i]!r}): shm "
                            f"{'hit' if shm[i] else 'miss'}, model {'hit' if model_hits[i] else 'miss'}; "
                            f"{sum(a != b for a, b in zip(shm, model_hits)):,} lookups differ")
        r.hits = {col: tuple(seq.count(1, start, stop) for _, start, stop in w.rows())
                  for col, seq in sequences.items()}
        results.append(r)
    return results


def stats_disagreement(hits: bytearray, stats) -> str:
    """What the cache's own counters say against the replay's counts ('' when they agree)."""
    n_hits = hits.count(1)
    n_misses = len(hits) - n_hits
    # Every miss is a put: stored (admitted), or refused by the policy (not_admitted, under keep).
    if (stats.hits, stats.misses, stats.puts + stats.not_admitted, stats.admitted) == (
            n_hits, n_misses, n_misses, stats.puts):
        return ""
    return (f"stats() says {stats.hits:,} hits, {stats.misses:,} misses, {stats.puts:,} puts ({stats.admitted:,} "
            f"admitted, {stats.not_admitted:,} not); the replay counted {n_hits:,} hits and {n_misses:,} misses "
            "(puts)")


# -------------------------------------------------------------------------------------------------- output


def table(results: Sequence[Result], columns: Sequence[str]) -> list[str]:
    """A Markdown table: a row per workload, cache size and phase; hit ratios in %, one decimal."""
    head = ["workload", "cache size", *columns]
    rows = []
    for r in results:
        w = r.workload
        size = f"{r.size:,} ({100 * r.size / w.key_space:.3g} %)"
        for row, (phase, _, _) in enumerate(w.rows()):
            label = w.name if phase == "all" else f"{w.name}, {phase}"
            rows.append([label, size, *(f"{100 * r.ratio(c, row):.1f}" for c in columns)])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    text = 2  # the first two columns are text, left-aligned; the hit ratios are right-aligned

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(wd) if i < text else c.rjust(wd)
                                 for i, (c, wd) in enumerate(zip(cells, widths))) + " |"

    rule = line(["-" * wd if i < text else "-" * (wd - 1) + ":" for i, wd in enumerate(widths)])
    return [line(head), rule] + [line(row) for row in rows]


def check_lines(results: Sequence[Result]) -> list[str]:
    """One line per workload and real-cache policy with a model: hit for hit, or where it first differed."""
    out = []
    by_workload: dict[tuple[str, str], list[Check]] = {}
    for r in results:
        for c in r.checks:
            by_workload.setdefault((c.workload, c.shm), []).append(c)
    for (workload, shm), checks in by_workload.items():
        policy = shm.removesuffix(" (shm)")
        model = checks[0].model
        sizes = ", ".join(f"{c.size:,}" for c in checks)
        if model is None:
            out.append(f"{workload}: shm {policy}: no model here to compare with")
            continue
        bad = [c for c in checks if c.mismatch is not None]
        if not bad:
            out.append(f"{workload}: shm {policy} == model {model}: hit for hit (cache sizes {sizes})")
        elif model not in EXACT_MODELS:
            worst = max(bad, key=lambda c: abs(c.points))
            verdict = "FAILS" if any(c.failed for c in bad) else "within"
            out.append(f"{workload}: shm {policy} vs model {model}: hit ratio {verdict} {S3FIFO_TOLERANCE:g} point "
                       f"of the model's (largest difference {worst.points:+.2f} points, at {worst.size:,} entries)")
            bad = [c for c in bad if c.failed]
        for c in bad:
            out.append(f"{workload} at {c.size:,} entries: shm {policy} != model {model}: {c.detail}")
        for c in checks:
            if c.stats_problem:
                out.append(f"{workload} at {c.size:,} entries: shm {policy}: {c.stats_problem}")
    return out


def to_json(results: Sequence[Result], columns: Sequence[str], meta: dict) -> dict:
    runs, checks = [], []
    for r in results:
        w = r.workload
        for row, (phase, start, stop) in enumerate(w.rows()):
            runs.append({"workload": w.name, "description": w.description, "seed": w.seed, "key_space": w.key_space,
                         "lookups": w.lookups, "cache_entries": r.size, "phase": phase,
                         "phase_lookups": stop - start, "hits": {c: r.hits[c][row] for c in columns},
                         "hit_ratio": {c: r.ratio(c, row) for c in columns}})
        for c in r.checks:
            checks.append({"workload": c.workload, "cache_entries": c.size, "shm": c.shm, "model": c.model,
                           "hit_for_hit": c.model is not None and c.mismatch is None, "first_mismatch": c.mismatch,
                           "points": c.points, "failed": c.failed,
                           "detail": c.detail, "stats_problem": c.stats_problem})
    return {**meta, "columns": list(columns), "runs": runs, "checks": checks}


# -------------------------------------------------------------------------------------------------- command line


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.hitratio", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small workloads, seconds (a smoke test, not figures)")
    p.add_argument("--only", help="comma-separated workloads: a name (zipf-0.6, epochs, loop, zipf-scan) or the part "
                                  "before its first '-' (zipf: every Zipf workload)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of every workload (default %(default)s)")
    p.add_argument("--models", default=",".join(MODELS), help="reference models to run (default: all)")
    p.add_argument("--shm-policy", help="policy= values to replay the real cache with (default: every one of the "
                                        "known names that it accepts)")
    p.add_argument("--trace", metavar="FILE", help="replay a trace file too (then only it, unless --only)")
    p.add_argument("--format", choices=TRACE_FORMATS, default="text", help="the trace's format (default text)")
    p.add_argument("--traces", metavar="DIR",
                   help="replay every trace of Caffeine's simulator found under DIR (a clone of its repository: "
                        "see CAFFEINE_TRACES), each at --cache-size")
    p.add_argument("--cache-size", default="0.01,0.1,0.25",
                   help="the trace's cache sizes: entries or fractions of its distinct keys (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    args = p.parse_args(argv)
    args.models = [m for m in (x.strip() for x in args.models.split(",")) if m]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    return args


def selector(only: str | None, names: Sequence[str], default: bool) -> Callable[[str], bool]:
    """Whether a workload name is selected by ``--only``; raises ValueError for a name that selects nothing."""
    if not only:
        return lambda name: default
    wanted = [x.strip() for x in only.split(",") if x.strip()]
    for x in wanted:
        if not any(n == x or n.split("-")[0] == x for n in names):
            raise ValueError(f"--only {x}: no such workload; there are {', '.join(names)}")
    return lambda name: any(name == x or name.split("-")[0] == x for x in wanted)


def main(argv=None) -> int:
    args = parse_args(argv)
    scale = QUICK if args.quick else FULL
    traces = find_traces(args.traces) if args.traces else []
    if args.traces and not traces:
        print(f"--traces {args.traces}: none of {', '.join(CAFFEINE_TRACES)} is there", file=sys.stderr)
        return 2
    names = synthetic_names(scale) + (["trace"] if args.trace else []) + [f"trace-{n}" for n, _, _ in traces]
    try:
        selected = selector(args.only, names, default=not (args.trace or traces))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    policies = shm_policies([x.strip() for x in args.shm_policy.split(",")] if args.shm_policy else None)
    columns = [shm_label(p) for p in policies] + args.models

    command = f"python -m benchmarks.hitratio {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    print(f"command: {command}")
    print(f"seed: {args.seed} (each workload draws from random.Random('{args.seed}/<workload>'))")
    print(f"shmcache {shmcache.__version__} ({CORE_PATH}), Python {platform.python_version()}; the real cache "
          f"replays: {', '.join(p or 'lru' for p in policies)}", flush=True)

    workloads = synthetic_workloads(scale, args.seed, selected)
    if args.trace:  # a trace given is always replayed
        workloads = itertools.chain(workloads, [trace_workload(args.trace, args.format, args.cache_size)])
    if traces:  # (read one at a time: the largest holds millions of keys)
        workloads = itertools.chain(workloads, (replace(trace_workload(path, fmt, args.cache_size), name=f"trace-{n}")
                                                for n, path, fmt in traces if selected(f"trace-{n}") or not args.only))
    results: list[Result] = []
    for w in workloads:
        t0 = time.monotonic()
        results.extend(run_workload(w, args.models, policies))
        print(f"  {w.name}: {w.description}; cache sizes {', '.join(f'{s:,}' for s in w.sizes)} "
              f"({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)

    print()
    print("\n".join(table(results, columns)))
    fixed = [c for c in (shm_label(p) for p in ("lru", "s3fifo", "keep")) if c in columns]
    if shm_label("auto") in columns and fixed:
        print()
        print("\n".join(adaptive_lines(results, fixed, shm_label("auto"))))
    print()
    lines = check_lines(results)
    print("\n".join(lines))
    if args.json:
        meta = {"command": command, "seed": args.seed, "quick": args.quick, "shmcache": shmcache.__version__,
                "path": CORE_PATH, "python": platform.python_version(),
                "shm_policies": [p or "lru" for p in policies]}
        with open(args.json, "w") as f:
            json.dump(to_json(results, columns, meta), f, indent=1)
            f.write("\n")
    broken = any(c.failed or c.stats_problem for r in results for c in r.checks)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
