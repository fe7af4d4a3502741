"""Invariant walker and repair of a segment: used by SharedCache.verify(), by recovery after a holder died or an
operation failed half-way, by the stress scripts and by the state-machine test.

Every loop is bounded by the table sizes, never by a value read from the segment, so a walk over garbage ends.
``repair`` keeps every entry whose block, key fingerprint and value checksum still agree and whose value decodes,
relinks them, rebuilds the index, the free list and the ring, recomputes the occupancy counters and puts every
header word back in its range (``header_ranges``); whatever does not check out is dropped. A cache may lose entries
this way, never return a wrong value. All functions assume the cache lock is held.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import block, config, index, lru, ofd, policies
from .arena import write_dead
from .lock import TICK_EVERY, progressed
from .errors import NoSpaceError
from .layout.geometry import extent_step
from .codec import TAG_BYTES, check_body, checksum, fingerprint
from .layout import (
    BLOCK_ALIGN, BLOCK_HEADER_NBYTES, EMPTY, FEATURE_PICKLE, HEADER, KIND_PREFIX, LAYOUT_VERSION, MAGIC, MAX_COUNTER,
    MAX_KINDS, MAX_PID, MAX_TTL_NS, MAX_VERSION, NEVER, NIL, PAGE, SENTINEL,
)
from .layout.dtypes import (
    field_off, H_ARENA_EXTENT, PACKED_ENTRY_SHIFT, PACKED_TAG_MASK,
    H_ARENA_NBYTES,
    H_ARENA_USED, H_CAPACITY_BYTES, H_CLEARS, H_COMPUTATIONS, H_CREATED_NS, H_CREATOR_PID, H_DEFAULT_TTL, H_DELETES,
    H_DIRTY, H_ENTRIES, H_ENTRY_SLOTS, H_EVICTIONS, H_EXPIRED, H_FEATURES, H_FILL, H_FREE_HEAD, H_HEAD, H_HITS,
    H_INDEX_SLOTS, H_KINDS_USED, H_MAGIC, H_MAX_ENTRIES, H_MAX_RETAINED, H_MISSES, H_NEXT_EXPIRY, H_PUTS,
    H_RECOVERIES, H_RETAINED, H_TAIL, H_TAKEOVERS, H_TOTAL_NBYTES, H_UNUSED_NEXT, H_UPDATES, H_VERSION,
    H_LAST_PUT, H_VERSION_CLOCK, H_WAITS, H_WRITING, GHOST_STAMP_MASK,
    H_GHOST_CLOCK, H_GHOST_HITS, H_GHOST_SLOTS, H_NOT_ADMITTED, H_POLICY, H_PROMOTED, H_SMALL, H_SMALL_FIRST,
    H_ADMITTED, H_BASE_FALLBACKS, H_BASE_HITS, H_BASE_MISSES, H_BASE_RETRIES, H_READER_SLOTS, H_TOO_LARGE,
    READER_SLOTS, H_CAPACITY, H_RESIZES, HELD_SLOT, S_HELD, S_HELD_BYTES, S_HELD_FIRST,
    K_ENTRIES, K_NAME_NBYTES, K_RETAINED, KIND_NAME_NBYTES,
    KIND_WORDS, D_EXPIRES_ON, D_IDLE_ON, D_VERSIONS_ON, SHOWN_EXPIRES,
)
from .readers import slot_pinned
from .serializers import TAG_PICKLE, check_pickle

_MAX_PROBLEMS = 50  # a report lists this many problems at most; garbage would otherwise produce millions


@dataclass(frozen=True)
class VerifyReport:
    """Result of an integrity walk: ``ok`` is True when every invariant holds; ``problems`` says which did not."""

    ok: bool
    problems: tuple[str, ...]
    entries: int  # entries found on the LRU list
    retained_bytes: int  # payload bytes of those entries
    arena_used_bytes: int  # block bytes of those entries

    def __bool__(self) -> bool:
        return self.ok


class _Problems(list):
    def add(self, msg: str) -> None:
        if len(self) < _MAX_PROBLEMS:
            self.append(msg)


_tick = progressed


def _ticking(h, items):
    """``items``, moving the progress word every ``TICK_EVERY + 1`` of them (a walk over every entry)."""
    for i, item in enumerate(items):
        if not i & TICK_EVERY:
            _tick(h)
        yield item


def _block_ok(seg, e: int, deep: bool, tags: dict | None = None) -> bool:
    """Entry ``e``'s block is in bounds, names ``e``, and (deep) its key and value hash to what the entry says and
    its value decodes."""
    return _block_problem(seg, e, deep, tags) is None


def _block_problem(seg, e: int, deep: bool, tags: dict | None = None) -> str | None:
    """What is wrong with entry ``e``'s block (see ``_block_ok``), or None. ``tags``: a repair's ``_named_tags``
    (narrow records: the key's tag is looked for wherever the index names the entry, not only at its slot)."""
    _tick(seg.header_words)  # one an entry: the deep walk hashes every value
    rec, size = seg.records, seg.ring()
    off, klen, vlen = rec.off[e] << rec.osh, rec.klen[e], rec.vlen[e]
    if off < 0 or off % BLOCK_ALIGN or klen < 0 or vlen < 1 or klen + vlen > size:  # b"" is the key ""
        return "its block is out of bounds"
    nb = block.nbytes(klen + vlen)
    if off + nb > size or seg.arena_words[off >> 3] != block.header(nb, e) or rec.check[e] == 0:
        return "its block is out of bounds, not its own, or it has no checksum"
    if not deep:
        return None
    v0 = block.value_at(rec, 0, e)
    arena = seg.arena
    # (a held entry of a narrow record is in no index slot: no fingerprint is kept for its key, which no lookup
    # finds; its value's checksum is what its views rely on)
    if not (rec.fp is None and rec.slot[e] == HELD_SLOT) and not _keyed(seg, e, fingerprint(
            arena[v0 + vlen : v0 + vlen + klen]), tags):
        return "its key does not hash to its fingerprint"
    if checksum(arena[v0 : v0 + vlen]) != rec.check[e]:
        return "its value fails its checksum"
    # A value stored with a valid checksum may still not decode (written so by a bug, or by hand): a get would
    # fail on it for ever, so it counts as damage too. A pickled value of a pickle segment is never unpickled here
    # (that would run its code under the lock): only its frame is checked. Elsewhere the tag is unknown: damage.
    try:
        if arena[v0] == TAG_PICKLE and seg.features & FEATURE_PICKLE:
            check_pickle(arena[v0 + 1 : v0 + vlen])
        elif arena[v0] != TAG_BYTES:  # bytes need no decoding
            check_body(arena[v0], arena[v0 + 1 : v0 + vlen])
    except ValueError as exc:
        return f"its value does not decode ({exc})"
    return None


def _keyed(seg, e: int, fp: int, tags: dict | None = None) -> bool:
    """Whether entry ``e``'s fingerprint is ``fp``: its record's (wide); a narrow record keeps none, so the index
    slot it names must name it back with ``fp``'s tag (as a lookup finds it; Table.fingerprint_is), or with
    ``tags`` (``_named_tags``) any slot that names it."""
    rec = seg.records
    if tags is not None and rec.fp is None:
        return tags.get(e) == fp & PACKED_TAG_MASK
    return index.keyed(index.of(seg.geometry), seg.index_words, rec, seg.mask, e, fp)


def _named_tags(seg) -> dict | None:
    """Entry slot -> the tag of an index slot that names it, over every index slot this mapping shows (a repair's,
    of narrow records: a reindex or a shift cut short may leave an entry named by a slot other than the one its
    record names, or past the index in force); None for wide records, which keep their fingerprint."""
    if seg.records.fp is not None:
        return None
    words = np.frombuffer(seg.index_words, dtype=np.int64, count=min(seg.shown_index(), len(seg.index_words)))
    named = words >> PACKED_ENTRY_SHIFT
    occupied = np.flatnonzero(named != EMPTY)
    return dict(zip(named[occupied].tolist(), (words[occupied] & PACKED_TAG_MASK).tolist()))


def _walk_lru(h, rec, slots: int, problems: _Problems) -> list[int]:
    order: list[int] = []
    seen = bytearray(slots)
    prev, cur = SENTINEL, rec.next[SENTINEL]
    for _ in _ticking(h, range(slots)):
        if cur == SENTINEL:
            break
        if not 0 < cur < slots:
            problems.add(f"LRU list reaches slot {cur}, outside the entry table")
            return order
        if seen[cur]:
            problems.add(f"LRU list has a cycle at slot {cur}")
            return order
        if rec.prev[cur] != prev:
            problems.add(f"LRU slot {cur}: prev is {rec.prev[cur]}, expected {prev}")
        seen[cur] = 1
        order.append(cur)
        prev, cur = cur, rec.next[cur]
    if rec.prev[SENTINEL] != prev:
        problems.add(f"LRU sentinel's prev is {rec.prev[SENTINEL]}, expected {prev}")
    return order


def _walk_held(seg, live: set[int], deep: bool, problems: _Problems) -> list[int]:
    """The held entries (version 12; none before it), from ``S_HELD_FIRST`` through their ``next`` words: each a
    slot whose ``slot`` word is HELD_SLOT, resident nowhere, its block its own; and the list as long, and as large,
    as ``S_HELD`` and ``S_HELD_BYTES`` say."""
    if not seg.holds:
        return []
    h, rec, st, slots = seg.header_words, seg.records, seg.stripe_words, seg.geometry.entry_slots
    held: list[int] = []
    seen, cur, nbytes = set(), st[S_HELD_FIRST], 0
    for _ in _ticking(h, range(slots)):
        if cur == NIL:
            break
        if not 0 < cur < slots or cur in seen or cur in live or rec.slot[cur] != HELD_SLOT:
            problems.add(f"held list reaches slot {cur}, which is out of range, repeated, resident or not held")
            return held
        seen.add(cur)
        bad = _block_problem(seg, cur, deep)
        if bad:
            problems.add(f"held entry {cur}: {bad}")
        held.append(cur)
        nbytes += rec.klen[cur] + rec.vlen[cur]
        cur = rec.next[cur]
    if (len(held), nbytes) != (st[S_HELD], st[S_HELD_BYTES]):
        problems.add(f"held list has {len(held)} entries of {nbytes} bytes, its words say {st[S_HELD]} of "
                     f"{st[S_HELD_BYTES]}")
    return held


_COUNTERS = (H_HITS, H_MISSES, H_PUTS, H_UPDATES, H_DELETES, H_EVICTIONS, H_RECOVERIES, H_CLEARS, H_COMPUTATIONS,
             H_WAITS, H_TAKEOVERS, H_EXPIRED, H_ADMITTED, H_NOT_ADMITTED, H_PROMOTED, H_GHOST_HITS, H_BASE_HITS,
             H_BASE_MISSES, H_BASE_RETRIES, H_BASE_FALLBACKS, H_TOO_LARGE, H_RESIZES)
# (``seq`` has no range: any value is a generation, and an odd one is evened by the next hold to end.)
_INT64_MAX = 2**63 - 1
_DIRTY_MAX = 2  # 1: an update under way, 2: a repair (cache.py)


def header_ranges(g, features: int = 0, version: int = LAYOUT_VERSION) -> dict[int, tuple[int, int]]:
    """The valid range ``(lowest, highest)`` of every header word but the lock, for a segment of geometry ``g``
    created with ``features``.
    Words that describe the structures (occupancy, ring, free list, expiry bound, version clock) are also checked
    against them by ``check``; a word in range can still be wrong, but one out of range always is."""
    slots, cap, arena = g.entry_slots, g.capacity_bytes, g.arena_nbytes
    ranges = {w: (v, v) for w, v in _identity(g, features, version).items()}
    ranges.update({w: (0, MAX_COUNTER) for w in _COUNTERS})
    ranges.update({
        H_DIRTY: (0, _DIRTY_MAX),
        H_ENTRIES: (0, slots - 1), H_RETAINED: (0, cap), H_MAX_ENTRIES: (1, slots - 1), H_MAX_RETAINED: (1, cap),
        H_HEAD: (0, arena - 1), H_TAIL: (0, arena - 1), H_FILL: (0, arena), H_ARENA_USED: (0, arena),
        H_FREE_HEAD: (NIL, slots - 1), H_UNUSED_NEXT: (1, slots), H_CREATED_NS: (0, _INT64_MAX),
        H_LAST_PUT: (0, _INT64_MAX),
        H_CREATOR_PID: (0, MAX_PID), H_VERSION_CLOCK: (0, MAX_VERSION), H_NEXT_EXPIRY: (0, NEVER),
        H_DEFAULT_TTL: (0, MAX_TTL_NS), H_KINDS_USED: (0, MAX_KINDS), H_WRITING: (0, slots - 1),
        H_SMALL_FIRST: (SENTINEL, slots - 1), H_SMALL: (0, slots - 1), H_GHOST_CLOCK: (0, GHOST_STAMP_MASK),
        H_ARENA_EXTENT: (0, arena), H_CAPACITY: (0, cap),
    })
    if version >= 10:  # the index in force (its size is checked against the limit by check)
        ranges[H_INDEX_SLOTS] = (8, g.index_slots)
    return ranges


def _identity(g, features: int, version: int = LAYOUT_VERSION) -> dict[int, int]:
    """Line 0 as the creator wrote it: what this handle attached to (attach checked it then)."""
    words = {H_MAGIC: MAGIC, H_VERSION: version, H_FEATURES: features, H_TOTAL_NBYTES: g.total_nbytes,
             H_ENTRY_SLOTS: g.entry_slots, H_INDEX_SLOTS: g.index_slots, H_ARENA_NBYTES: g.arena_nbytes,
             H_CAPACITY_BYTES: g.capacity_bytes, H_POLICY: g.policy, H_GHOST_SLOTS: g.ghost_slots,
             H_READER_SLOTS: READER_SLOTS}
    if version >= 10:
        del words[H_INDEX_SLOTS]  # the index in force, which a resize moves (_settle_index)
    return words


_WORD_NAMES = {field_off(HEADER, n) // 8: n for n in HEADER.names or () if n != "lock"}


def header_problems(seg) -> list[str]:
    """The header words out of their range (``header_ranges``), one message each, and a configuration that fails
    its checksum (``config.problems``): O(1), for stats() and len()."""
    h = seg.header_words
    return [f"header word {_WORD_NAMES[w]}={h[w]} is out of range (expected {lo} to {hi})"
            for w, (lo, hi) in header_ranges(seg.geometry, seg.features, seg.version).items()
            if not lo <= h[w] <= hi] + config.problems(h, seg.geometry) + config.tti_problems(
                seg.idle_words, seg.geometry.lazy)


def check(seg, deep: bool = True, now: int | None = None) -> VerifyReport:
    """Walk every structure of the segment and report which invariants fail. ``deep`` also re-hashes every key and
    value and decodes every value (O(bytes stored)); without it the walk is O(entries + index slots + ring
    blocks). ``now``: the cache's clock, for the bounds that depend on the time (None: those are not checked)."""
    h, rec, ix, g = seg.header_words, seg.records, seg.index_words, seg.geometry
    xo = index.of(g)
    problems = _Problems()
    slots, mask = g.entry_slots, seg.mask
    for msg in header_problems(seg):
        problems.add(msg)
    if seg.version >= 10 and not h[H_INDEX_SLOTS] == mask + 1 == g.index_for(h[H_MAX_ENTRIES]):
        problems.add(f"the index in force has {h[H_INDEX_SLOTS]} slots (this mapping's: {mask + 1}); the limit of "
                     f"{h[H_MAX_ENTRIES]} entries needs {g.index_for(h[H_MAX_ENTRIES])}")
    if h[H_WRITING]:
        problems.add(f"a store into entry {h[H_WRITING]} was cut short")
    if not 0 < h[H_MAX_ENTRIES] <= slots - 1 or not 0 < h[H_MAX_RETAINED] <= h[H_CAPACITY_BYTES]:
        problems.add(f"limits out of range: max_entries={h[H_MAX_ENTRIES]}, max_retained={h[H_MAX_RETAINED]}")
    order = _walk_lru(h, rec, slots, problems)
    _check_queues(seg, order, problems)
    live = set(order)
    retained = used = 0
    blocks, good = [], []
    for e in order:
        bad = _block_problem(seg, e, deep)
        if bad:
            problems.add(f"entry {e}: {bad}")
            continue
        good.append(e)
        klen, vlen, off = rec.klen[e], rec.vlen[e], rec.off[e] << rec.osh
        retained += klen + vlen
        nb = block.nbytes(klen + vlen)
        used += nb
        blocks.append((off, nb))
        s = rec.slot[e]
        named = xo.names(ix, s, e, rec.fp[e]) if rec.fp is not None else xo.entry(ix, s) == e  # (narrow: deep's)
        if not 0 <= s <= mask or not named:
            problems.add(f"entry {e}: its index slot {s} does not point back at it")
    held = _walk_held(seg, live, deep, problems)
    for e in held:
        nb = block.nbytes(rec.klen[e] + rec.vlen[e])
        used += nb
        blocks.append((rec.off[e] << rec.osh, nb))
    if len(order) != h[H_ENTRIES]:
        problems.add(f"LRU list has {len(order)} entries, the header says {h[H_ENTRIES]}")
    if len(order) > h[H_MAX_ENTRIES]:
        problems.add(f"{len(order)} entries exceed max_entries={h[H_MAX_ENTRIES]}")
    if retained != h[H_RETAINED] or retained > h[H_MAX_RETAINED]:
        problems.add(f"retained bytes: entries add up to {retained}, header says {h[H_RETAINED]}, "
                     f"limit {h[H_MAX_RETAINED]}")
    if used != h[H_ARENA_USED]:
        problems.add(f"arena used: blocks add up to {used}, header says {h[H_ARENA_USED]}")
    blocks.sort()
    for (o1, n1), (o2, _) in zip(blocks, blocks[1:]):
        if o1 + n1 > o2:
            problems.add(f"arena blocks at {o1} and {o2} overlap")
    _check_index(seg, live, problems)
    _check_ring(seg, live | set(held), problems)
    _check_free_list(seg, live | set(held), problems)
    _check_columns(seg, order, good, problems, now)
    return VerifyReport(not problems, tuple(problems), len(order), retained, used)


def _check_queues(seg, order: list[int], problems: _Problems) -> None:
    """The policy's words and marks (``Policy.check``): under s3fifo, the list is main's entries then small's (from
    ``small_first``), ``small`` counts the latter, and each entry's mark says which queue it is in; under the others
    all are 0."""
    policies.of(seg.geometry.policy).check(seg, order, problems)


def _check_index(seg, live: set[int], problems: _Problems) -> None:
    h = seg.header_words
    homes = index.of(seg.geometry).homes
    _, table, entries = seg.arrays()
    targets = table["entry"]
    empty = targets == EMPTY
    occupied = np.flatnonzero(~empty)
    if len(occupied) != len(live):
        problems.add(f"index holds {len(occupied)} keys, the LRU list {len(live)}")
    _tick(h)  # (between the vectorised steps too: each is tens of ms over millions of slots)
    # Each key must be reachable: no empty slot between its home slot and where it sits (cyclically).
    empty_before = np.tile(empty, 2)
    _tick(h)
    empty_before = np.cumsum(empty_before)
    _tick(h)
    empty_before = np.concatenate(([0], empty_before))
    _tick(h)
    home = homes(table["fp"][occupied], len(table))
    pos = np.where(occupied >= home, occupied, occupied + len(table))
    _tick(h)
    for s in occupied[(empty_before[pos] - empty_before[home]) != 0][:5].tolist():
        problems.add(f"index slot {s} is cut off from its home slot by an empty slot")
    # Each points at a resident entry that points back.
    e = targets[occupied]
    in_range = (e > 0) & (e < len(entries))
    back = np.zeros(len(occupied), dtype=bool)
    back[in_range] = entries["slot"][e[in_range]] == occupied[in_range]
    is_live = np.zeros(len(entries), dtype=bool)
    shown = [e for e in live if e < len(entries)]  # (one past the slots shown: damage, reported by its own check)
    is_live[np.fromiter(shown, dtype=np.int64, count=len(shown))] = True
    resident = np.zeros(len(occupied), dtype=bool)
    resident[in_range] = is_live[e[in_range]]
    _tick(h)
    for s in occupied[~(back & resident)][:5].tolist():
        problems.add(f"index slot {s} points at entry {int(targets[s])}, which is not resident there")


def _check_ring(seg, live: set[int], problems: _Problems) -> None:
    h, aw, rec, size = seg.header_words, seg.arena_words, seg.records, seg.ring()
    head, tail, fill = h[H_HEAD], h[H_TAIL], h[H_FILL]
    if not (0 <= head < size and 0 <= tail < size and 0 <= fill <= size and head % 8 == 0 and tail % 8 == 0) or (
        (head - tail) % size != fill % size
    ):
        problems.add(f"arena ring out of range: head={head} tail={tail} fill={fill}")
        return
    pos, left, found = tail, fill, 0
    for _ in _ticking(h, range(size // BLOCK_ALIGN + 1)):
        if left == 0:
            break
        nb, e = block.split_header(aw[pos >> 3])
        if nb < BLOCK_HEADER_NBYTES or nb % BLOCK_ALIGN or nb > left or pos + nb > size:
            problems.add(f"arena block at {pos} has an impossible length {nb}")
            return
        if e in live and rec.off[e] << rec.osh == pos:
            found += 1
        pos, left = (pos + nb) % size, left - nb
    if found != len(live):
        problems.add(f"arena ring holds {found} live blocks, the LRU and held lists {len(live)} entries")


def _named_kinds(seg) -> int:
    """How many kind records, from record 1 on, have a name of a valid length (records handed out have one)."""
    kw = seg.kind_words
    for k in range(1, MAX_KINDS + 1):
        if not 0 < kw[k * KIND_WORDS + K_NAME_NBYTES] <= KIND_NAME_NBYTES:
            return k - 1
    return MAX_KINDS


def _key_kind(seg, e: int) -> int:
    """The kind number in entry ``e``'s key (0: a key of no kind)."""
    k0 = block.key_at(seg.records, 0, e)
    if seg.records.klen[e] >= 2 and seg.arena[k0] == KIND_PREFIX:
        return seg.arena[k0 + 1]
    return 0


def _kind_counts(seg, entries: list[int]) -> tuple[list[int], list[int]]:
    rec = seg.records
    counts, nbytes = [0] * (MAX_KINDS + 1), [0] * (MAX_KINDS + 1)
    for e in _ticking(seg.header_words, entries):
        k = seg.kinds_bytes[e]
        counts[k] += 1
        nbytes[k] += rec.klen[e] + rec.vlen[e]
    return counts, nbytes


def _check_columns(seg, order: list[int], good: list[int], problems: _Problems, now: int | None) -> None:
    """The per-entry columns and what is derived from them: kinds, per-kind counts, the expiry bound. ``order``:
    the entries on the LRU list; ``good``: those whose block checked out (only their keys are read)."""
    h, kw, exp = seg.header_words, seg.kind_words, seg.expires_words
    if not 0 <= h[H_KINDS_USED] <= MAX_KINDS:
        problems.add(f"kinds_used={h[H_KINDS_USED]} is out of range")
    elif _named_kinds(seg) < h[H_KINDS_USED]:
        problems.add(f"kinds_used={h[H_KINDS_USED]}, but only records 1 to {_named_kinds(seg)} have names")
    clock = h[H_VERSION_CLOCK]
    for e in _ticking(h, good):
        if seg.kinds_bytes[e] != _key_kind(seg, e):
            problems.add(f"entry {e}: kind {seg.kinds_bytes[e]} disagrees with its key's")
        elif seg.kinds_bytes[e] > h[H_KINDS_USED]:
            problems.add(f"entry {e} has kind {seg.kinds_bytes[e]}, beyond kinds_used={h[H_KINDS_USED]}")
        if seg.versions_live is not None and not 0 < seg.versions_words[e] <= clock:
            problems.add(f"entry {e}: version {seg.versions_words[e]} is not between 1 and version_clock={clock}")
        x = exp[e]
        if x < 0 or (x and x < h[H_NEXT_EXPIRY]):
            problems.add(f"entry {e} expires at {x}, before next_expiry={h[H_NEXT_EXPIRY]}")
        if seg.ttis_live is not None and _idle_wrong(seg, e, now):
            problems.add(f"entry {e}: its time to idle ({seg.ttis_words[e]} ns), deadline "
                         f"({seg.deadlines_words[e]}) and expiry ({x}) disagree")
    counts, nbytes = _kind_counts(seg, order)
    for k in range(1, MAX_KINDS + 1):
        if (counts[k], nbytes[k]) != (kw[k * KIND_WORDS + K_ENTRIES], kw[k * KIND_WORDS + K_RETAINED]):
            problems.add(f"kind {k}: entries hold {counts[k]} entries of {nbytes[k]} bytes, its record says "
                         f"{kw[k * KIND_WORDS + K_ENTRIES]} of {kw[k * KIND_WORDS + K_RETAINED]}")
    # The slots handed out that this mapping shows (past them, zeros of its own). A slot past unused_next is read by
    # no scan and written whole when it is handed out: a repair that lowered unused_next leaves what such slots
    # hold, which a mapping that showed more of the table before still sees.
    shown = min(seg.shown[2], block.handed_out(h, seg.slots_shown))
    stale = np.frombuffer(exp, dtype=np.int64, count=shown) != 0
    stale[[e for e in order if e < shown]] = False
    if stale.any():
        problems.add(f"{int(stale.sum())} free entry slots keep an expiry time (first: {int(np.argmax(stale))})")


def _idle_wrong(seg, e: int, now: int | None) -> bool:
    """Whether resident entry ``e``'s idle words (version 14) are out of range or disagree with its expiry: a time
    to idle needs an expiry, the expiry never passes the deadline, nor (``now``: the clock's time, None: not asked)
    the time to idle from now (it is set from a read or a store, none of which is in the future)."""
    t, dl, x = seg.ttis_words[e], seg.deadlines_words[e], seg.expires_words[e]
    return not 0 <= t <= MAX_TTL_NS or dl < 0 or bool(t and (x <= 0 or (dl and x > dl) or (
        now is not None and x > now + t)))


def _mend_idle(seg, e: int, now: int | None) -> None:
    """Make kept entry ``e``'s idle words agree (``_idle_wrong``) with what can do no harm: a time to idle out of
    range or without an expiry goes (the entry keeps its expiry: the deadline, if it has one), a negative deadline
    goes, and an expiry past the deadline or the time to idle from now is brought back to the earlier of them."""
    t, dl, x = seg.ttis_words[e], seg.deadlines_words[e], seg.expires_words[e]
    if dl < 0:
        dl = seg.deadlines_words[e] = 0
    if not 0 <= t <= MAX_TTL_NS or (t and x <= 0):
        seg.ttis_words[e] = 0
        if dl:
            seg.expires_words[e] = dl
        return
    if t and dl and x > dl:
        x = seg.expires_words[e] = dl
    if t and now is not None and x > now + t:
        seg.expires_words[e] = now + t


def _check_free_list(seg, live: set[int], problems: _Problems) -> None:
    h, rec, slots = seg.header_words, seg.records, seg.geometry.entry_slots
    unused = h[H_UNUSED_NEXT]
    if not 1 <= unused <= slots:
        problems.add(f"unused_next={unused} is out of range")
        return
    seen, cur = set(), h[H_FREE_HEAD]
    for _ in _ticking(h, range(slots)):
        if cur == NIL:
            break
        if not 0 < cur < unused or cur in seen or cur in live or rec.check[cur]:
            problems.add(f"free list reaches slot {cur}, which is out of range, repeated, resident or not cleared")
            return
        seen.add(cur)
        cur = rec.next[cur]
    if len(seen) + len(live) != unused - 1:
        problems.add(f"{len(seen)} free and {len(live)} resident or held slots, but {unused - 1} slots were handed "
                     "out")


def repair(seg, now: int | None = None) -> int:
    """Rebuild the segment from the entries that still check out; returns how many entries were dropped. ``now``:
    as ``check``'s."""
    h, rec, g = seg.header_words, seg.records, seg.geometry
    if seg.version >= 10 and (config.problems(h, g) or h[H_INDEX_SLOTS] != g.index_for(h[H_MAX_ENTRIES])
                              or (h[H_INDEX_SLOTS], h[H_MAX_ENTRIES]) != (seg.mask + 1, seg.limit)):
        # The limit or the index may move: counted first, so that a holder killed from here on leaves every process
        # to take the tables again once a repair has settled them.
        count_resize(h)
    _repair_words(seg)  # first: the counters it puts back in range are counted in below
    _settle_index(seg)  # then the index the restored limit needs: the rebuild fills it
    slots = g.entry_slots
    unused = min(block.handed_out(h, slots), seg.slots_shown)  # (past the slots shown: none handed out)
    listed = _walk_lru(h, rec, slots, _Problems())
    rank = {e: i for i, e in enumerate(listed)}
    candidates = []
    cut_short = h[H_WRITING]  # its words may be out of step in ways no check sees: it goes
    # Held entries (version 12) are never taken for resident ones (a newer value of their key may be): kept while
    # a view pins them, as the last to survive an overlap, else given back.
    holds = seg.holds
    held: set[int] = set()
    tags = _named_tags(seg)
    for e in range(1, unused):
        if holds and rec.slot[e] == HELD_SLOT:
            if _pin_held(seg, e) and _block_ok(seg, e, deep=True):
                held.add(e)
                candidates.append((rec.off[e] << rec.osh, block.entry_nbytes(rec, e), e))
        elif (e != cut_short or _pinned(seg, e)) and _block_ok(seg, e, deep=True, tags=tags):
            candidates.append((rec.off[e] << rec.osh, block.entry_nbytes(rec, e), e))
    # Of blocks that overlap, the more recently used survives; strays (off the list) rank last.
    candidates.sort()
    kept: list[tuple[int, int, int]] = []
    for off, nb, e in _ticking(h, candidates):
        if kept and kept[-1][0] + kept[-1][1] > off:
            if rank.get(e, slots) >= rank.get(kept[-1][2], slots):
                continue
            kept.pop()
        kept.append((off, nb, e))
    held_ids = [e for _, _, e in kept if e in held]
    # Entries of a kind whose record lost its name (or lies beyond a record that did) go: no kind() can reach them.
    named = _named_kinds(seg)
    kept_ids = sorted((e for _, _, e in kept if e not in held and _key_kind(seg, e) <= named),
                      key=lambda e: rank.get(e, slots))
    # As the policy links them (s3fifo: main's entries, then small's, each queue in its order, a mark says which).
    kept_ids = policies.of(g.policy).repair_order(seg, kept_ids)
    # The limits hold again: the least recently used entries go first (a holder may have died mid-set_limits).
    max_entries, max_retained = _sane_limits(h, g)
    retained = sum(rec.klen[e] + rec.vlen[e] for e in kept_ids)
    held_bytes = sum(rec.klen[e] + rec.vlen[e] for e in held_ids)
    # Entries pinned by open views are kept whatever the limits say: their bytes must not be reused under them.
    for i in range(len(kept_ids) - 1, -1, -1):
        if not (len(kept_ids) + len(held_ids) > max_entries or retained + held_bytes > max_retained):
            break
        e = kept_ids[i]
        if not _pinned(seg, e):
            del kept_ids[i]
            retained -= rec.klen[e] + rec.vlen[e]
            h[H_EVICTIONS] += 1
    dropped = max(h[H_ENTRIES], len(listed)) - len(kept_ids) if 0 <= h[H_ENTRIES] < slots else 0
    _rebuild(seg, kept_ids, unused, held_ids, now)
    h[H_WRITING] = 0
    return max(dropped, 0)


def _repair_words(seg) -> None:
    """Put back in range the header words that nothing rebuilds: line 0 from this handle's geometry (what it
    attached to, so later attachers are not refused), the configuration from whichever of its copies checks
    (``config.restore``: else no default expiry, and the capacity as the limits), a counter to 0, and the display
    words to 0."""
    h = seg.header_words
    for w, v in _identity(seg.geometry, seg.features, seg.version).items():
        h[w] = v
    # The default time to live and the limits: from whichever copy checks; else the capacity as the byte limit and
    # the entry limit this mapping holds (version 10: not the most its tables reach, which would back all of them).
    config.restore(h, seg.geometry, seg.limit if seg.version >= 10 else None)
    lazy, words = seg.geometry.lazy, seg.idle_words
    switched = any(words[w] not in (0, 1) for w, _ in config.switch_words(lazy))
    config.restore_tti(words, lazy)  # (version 14: the default time to idle, else none; 16 and 18: the switches)
    if switched:  # (version 16: a damaged D_IDLE_ON, D_VERSIONS_ON or D_EXPIRES_ON is now 1, in use: every process
        count_resize(h)  # takes them)
        try:  # (each only where its word says so: a column shown here alone would hold words nobody clears)
            if (lazy & SHOWN_EXPIRES and (words[D_EXPIRES_ON] or words[D_IDLE_ON])) and not seg.expires_shown:
                seg.show_expires()  # (first: an idle entry has an expiry)
            if words[D_IDLE_ON]:
                seg.show_idle()
            if words[D_VERSIONS_ON] and not seg.versions_shown:
                seg.show_versions()
                _version_all(seg)
        except NoSpaceError:
            pass  # (the next store here asks again: Store.expiry; a hit here moves no idle expiry until then)
    ranges = header_ranges(seg.geometry, seg.features, seg.version)
    for w in _COUNTERS + (H_CREATED_NS, H_CREATOR_PID, H_LAST_PUT, H_GHOST_CLOCK):
        lo, hi = ranges[w]
        # A counter at its very top goes too: the repair itself counts (recoveries, evictions) once it is done.
        if not lo <= h[w] <= hi or (w in _COUNTERS and h[w] == hi):
            h[w] = 0


def _version_all(seg) -> None:
    """Give every entry in a slot whose version is out of range one of its own (a versions column just shown by a
    repair: what no store wrote is zeros, or another entry's)."""
    h = seg.header_words
    for e in range(1, block.handed_out(h, seg.slots_shown)):
        if seg.records.check[e] and not 0 < seg.versions_words[e] <= h[H_VERSION_CLOCK]:
            h[H_VERSION_CLOCK] += 1
            seg.versions_words[e] = h[H_VERSION_CLOCK]


def count_resize(h) -> None:
    """One more in ``resizes`` (1 after a value out of range): every process takes the tables again."""
    r = h[H_RESIZES]
    h[H_RESIZES] = r + 1 if 0 <= r < MAX_COUNTER - 1 else 1


def _settle_index(seg) -> None:
    """Version 10: make the index in force the one the entry limit needs (``index_for``), shown in this mapping with
    the entry slots handed out. Where /dev/shm cannot back it (a resize that raised the limit died before it backed
    the tables), the largest index this mapping shows is kept and the limit lowered to what it holds. The words
    only: the caller rebuilds the index (or empties it), and has counted a resize where the words may move (a
    lowered limit here counts itself)."""
    h, g = seg.header_words, seg.geometry
    if seg.version < 10:
        return
    limit = h[H_MAX_ENTRIES]  # (config.restore made it one to trust)
    live = min(g.index_for(limit), g.index_slots)
    unused = seg.slots_in_use()  # (a damaged unused_next backs nothing: the repair puts it back from the entries)
    try:
        seg.show_tables(live, limit, unused)
    except NoSpaceError:
        # What this mapping shows is backed: the index and the limit it holds, nothing more shown.
        shown = seg.shown_index()
        limit = max(1, min(limit, g.limit_for(shown), seg.slots_shown - 1))
        live = min(g.index_for(limit), shown)  # (the index the lowered limit needs: within what is shown)
        count_resize(h)  # (first: the limit moves)
        config.set_limits(h, limit, h[H_MAX_RETAINED])
        seg.show_tables(live, limit, min(unused, seg.slots_shown), backed=True)
    h[H_INDEX_SLOTS] = live
    seg.refresh()  # (the ring follows the limit: what this mapping shows of the arena, judged again)


def settle_tables(seg) -> None:
    """After an emptying (``Table.reset``, when a repair failed part-way): the index in force the limit needs
    (``_settle_index``), counted as a resize whatever it was (the repair may have moved the limit before it failed),
    and this mapping's record of the tables taken from the header as they now are."""
    count_resize(seg.header_words)
    _settle_index(seg)
    seg.shown[3] = seg.header_words[H_RESIZES]


def _pinned(seg, e: int) -> bool:
    """Whether a view still pins entry ``e`` (see ``Table.pinned``)."""
    return bool(seg.pins_bytes[e]) and _pin_held(seg, e)


def _pin_held(seg, e: int) -> bool:
    """Whether a view holds a pin on entry ``e`` now, whatever its flag says (``Table._pin_held``)."""
    # (the words first, then the byte: see Table._pin_held)
    return slot_pinned(seg.reader_words, seg.live_fd, e) or ofd.held_elsewhere(seg.live_fd, ofd.PIN_BASE + e)


def _rebuild(seg, kept: list[int], unused: int, held: list[int] | None, now: int | None) -> None:
    h, rec, g = seg.header_words, seg.records, seg.geometry
    held = held or []
    mask, xo = seg.mask, index.of(g)
    keep = set(kept) | set(held)
    free = NIL
    for e in _ticking(h, range(unused - 1, 0, -1)):
        if e not in keep:
            rec.check[e] = 0
            if rec.slot[e] == HELD_SLOT:
                rec.slot[e] = 0
            rec.next[e] = free
            free = e
    h[H_FREE_HEAD], h[H_UNUSED_NEXT] = free, unused
    if seg.holds:  # the held list, from the held entries kept
        st, first, nbytes = seg.stripe_words, NIL, 0
        for e in held:
            rec.next[e] = first
            first = e
            nbytes += rec.klen[e] + rec.vlen[e]
        st[S_HELD_FIRST], st[S_HELD], st[S_HELD_BYTES] = first, len(held), nbytes
    # A narrow record keeps no fingerprint: its key's, hashed before the index is emptied (_block_ok checked it
    # against the index slot that named the entry).
    fps = [rec.fp[e] if rec.fp is not None else fingerprint(block.key_of(seg.arena, rec, 0, e)) for e in kept]
    lru.relink(rec, kept)  # most recent first (s3fifo: main's entries, then small's)
    _rebuild_queues(seg, kept)
    retained = 0
    # The index is built aside and copied in whole: a repair killed while it builds leaves the index it judged by
    # (a narrow record's key is judged by the tag of a slot that names it: _named_tags), never an emptied one.
    aside = np.zeros((mask + 1) * g.index_slot_nbytes // 8, dtype=np.int64)
    words = aside.data.cast("B").cast("q")
    for e, fp in zip(_ticking(h, kept), fps):
        xo.insert(words, rec, mask, fp, e)
        retained += rec.klen[e] + rec.vlen[e]
    words.release()
    np.frombuffer(seg.index_words, dtype=np.int64, count=len(aside))[:] = aside
    h[H_ENTRIES], h[H_RETAINED] = len(kept), retained
    _rebuild_ring(seg, kept + held)
    _rebuild_columns(seg, kept, now)
    config.set_limits(h, *_sane_limits(h, g))


def _rebuild_queues(seg, kept: list[int]) -> None:
    """The policy's words from the marks of the kept entries, relinked main first (s3fifo); else all 0
    (``Policy.rebuild``)."""
    policies.of(seg.geometry.policy).rebuild(seg, kept)


def _rebuild_columns(seg, kept: list[int], now: int | None) -> None:
    """Kinds from the kept keys themselves, per-kind counts from those, expiry only for kept entries and the expiry
    bound from theirs. (Pin flags are left as they are: a stale one is cleared by whoever tests it.)"""
    h, kw, exp = seg.header_words, seg.kind_words, seg.expires_words
    shown = seg.shown[2]  # (the entry slots this mapping shows: past them, zeros of its own, never written)
    x = np.frombuffer(exp, dtype=np.int64, count=shown)
    dropped = np.ones(len(x), dtype=bool)
    dropped[[e for e in kept if e < shown]] = False
    x[(dropped & (x != 0)) | (x < 0)] = 0  # (never 0 over 0: the column may not be shown here, version 18)
    del x
    # Versions: the clock above every kept one; a damaged version (out of range) is replaced by a fresh one (a cas
    # holding the old one then fails, as it should: the entry cannot be shown unchanged). A clock out of range
    # restarts from the highest kept version. Why not keep it: a clock near 2**63 makes every later store overflow.
    # "In range" leaves room below MAX_VERSION for a fresh version for every entry slot and 2**32 stores after it:
    # a clock (or a version) damaged to just below the top would otherwise take the fresh ones past it.
    top = MAX_VERSION - 2**33
    versions = seg.versions_live  # (version 16: None until a caller asked for a version; no entry has one)
    valid = [v for v in (versions[e] for e in kept) if 0 < v <= top] if versions is not None else []
    clock = max([h[H_VERSION_CLOCK] if 0 <= h[H_VERSION_CLOCK] <= top else 0] + valid)
    for e in _ticking(h, kept):
        seg.kinds_bytes[e] = _key_kind(seg, e)
        if seg.ttis_live is not None and _idle_wrong(seg, e, now):
            _mend_idle(seg, e, now)
        if versions is not None and not 0 < versions[e] <= top:
            clock += 1
            versions[e] = clock
    h[H_VERSION_CLOCK] = clock
    counts, nbytes = _kind_counts(seg, kept)
    for k in range(1, MAX_KINDS + 1):
        kw[k * KIND_WORDS + K_ENTRIES], kw[k * KIND_WORDS + K_RETAINED] = counts[k], nbytes[k]
    # The records handed out are those with a name (records are handed out in order, the name before the count;
    # repair dropped the entries of kinds beyond them): a count beyond them would make kind() find the table full.
    h[H_KINDS_USED] = _named_kinds(seg)
    expiring = [exp[e] for e in kept if exp[e]]
    h[H_NEXT_EXPIRY] = min(expiring) if expiring else NEVER


def _sane_limits(h, g) -> tuple[int, int]:
    """The limits in the header, or the capacity for any that garbage pushed out of range."""
    max_entries = h[H_MAX_ENTRIES] if 0 < h[H_MAX_ENTRIES] <= g.max_entries else g.max_entries
    cap = config.capacity(h, g)
    max_retained = h[H_MAX_RETAINED] if 0 < h[H_MAX_RETAINED] <= cap else cap
    return max_entries, max_retained


def _rebuild_ring(seg, kept: list[int]) -> None:
    """Lay the ring over the kept blocks in address order, with dead blocks filling the gaps between them."""
    h, rec, aw, size = seg.header_words, seg.records, seg.arena_words, seg.ring()
    blocks = sorted((rec.off[e] << rec.osh, block.entry_nbytes(rec, e)) for e in kept)
    # The extent (a hint, arena.py) past the last kept block by a word at least, where the next dead block may go;
    # one out of range, or short of that, becomes just that (pages backed beyond it are backed again, at no cost).
    end = blocks[-1][0] + blocks[-1][1] if blocks else 0
    need = min(size, max(extent_step(size), -(-(end + BLOCK_ALIGN) // PAGE) * PAGE))
    if not need <= h[H_ARENA_EXTENT] <= size and h[H_ARENA_EXTENT] != 0:
        h[H_ARENA_EXTENT] = need
    if not blocks:
        h[H_HEAD] = h[H_TAIL] = h[H_FILL] = h[H_ARENA_USED] = 0
        return
    pos = blocks[0][0]
    used = 0
    for off, nb in _ticking(h, blocks):
        if off > pos:
            write_dead(aw, pos, off - pos)  # dead blocks over the gap
        pos = off + nb
        used += nb
    h[H_TAIL] = blocks[0][0]
    h[H_HEAD] = pos % size
    h[H_FILL] = pos - blocks[0][0]
    h[H_ARENA_USED] = used
