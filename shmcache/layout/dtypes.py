"""The structured dtypes of the header, the index table and the entry table.

Every field is a little-endian 8-byte word (the lock excepted), so each region can also be read through one flat
``int64`` memoryview: field ``f`` of record ``i`` is word ``i * WORDS + f``. The ``H_*``, ``I_*`` and ``E_*`` constants
are those word numbers, derived from the dtypes so that the two views can never disagree.
"""

from __future__ import annotations

import struct

import numpy as np

_W = "<i8"
MAGIC = int.from_bytes(b"SHMCACHE", "little")
LAYOUT_VERSION = 19
# The layout versions this one attaches to: 7 is 8 with every page of the arena reserved at creation and no
# ``arena_extent`` (its word is 0, read as the whole arena); 8 is 9 with a capacity fixed at creation (``capacity``
# 0: the arena's whole, under a configuration checksum of three words); 9 is 10 with tables fixed at creation: its
# ``entry_slots`` are the most entries it ever holds, all backed, and ``index_slots`` is the whole index (10 reserves
# tables for the most a resize reaches, backs and uses them for the limit in force, and ``index_slots`` is the index
# in force). Segments of 7 and 8 are used as they are, never rewritten, and never resized; 9 is resized within its
# tables. 10 is 11 without the stripes: its writers open ``seq`` where 11's open a stripe. 11 is 12 without held
# entries: a put or delete of an entry a view pins is refused (PinnedError) where 12 holds the old entry aside. 12 is
# 13 with a ring that follows the entry limit in force (room for a block header for each entry it allows), so that a
# new limit moves every block and refuses a block a view pins past the new ring's end; 13's ring has that room for
# every entry the tables reach (Geometry.ring_entries), and changes size only with the capacity. 13 is 14 without
# idle expiry: no idle region (its entries have no time to idle, and a put that gives one is refused). 14 is 15 with
# index slots of two words (INDEX_SLOT: the fingerprint and the entry) where 15's are one (INDEX_SLOT_PACKED). 15 is
# 16 with auto's sketch as large as the index (16's is half as large: Geometry.ghost_for), and with the idle columns
# and the versions column backed with the tables (16 backs each once in use: D_IDLE_ON, D_VERSIONS_ON). 16 is 17 with
# an index of a power of two of slots, at most half full, a key's home slot its fingerprint's low bits; 17's index
# has any number of slots, at most 0.7 full, the home its tag scaled to them (index_for; index.py Ranged). 17 is 18
# with the expires column backed with the tables (18 backs it once an entry has an expiry: D_EXPIRES_ON). 18 is 19
# with entry records of 64 bytes (ENTRY) where 19's are 32 (ENTRY_NARROW) whenever the arena is below 32 GiB and
# the index below 2**31 slots (Geometry.narrow; records.py).
READ_VERSIONS = (7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)
FEATURE_PICKLE = 1  # bit 0 of ``features``: values may be pickled (tag ``P``); set by serializer="pickle"
FEATURES = FEATURE_PICKLE  # every bit this version knows: a segment with any other is refused (LayoutVersionError)
ALIGN = 64  # cache line: regions never share one
PAGE = 4096  # the arena and the segment's end are page aligned, so arena pages are never shared with tables
BLOCK_ALIGN = 8  # arena blocks start on 8-byte boundaries so their headers are whole words
# The arena is reserved (fallocated) as it fills, not at creation: a new segment backs EXTENT_STEP bytes of it (or
# all of a smaller arena), and each growth adds an eighth of what is backed, EXTENT_STEP at least (arena.py).
EXTENT_STEP = 256 * 1024
BLOCK_HEADER_NBYTES = 8  # packed (entry << 32) | block length
BLOCK_OVERHEAD = BLOCK_HEADER_NBYTES + BLOCK_ALIGN  # per-entry room reserved beyond the payload (header + padding)
MAX_BLOCK_NBYTES = 2**32 - BLOCK_ALIGN  # a block length must fit the 32 low bits of its header
NIL = 0  # "no slot" in the entry free list
EMPTY = 0  # an empty index slot (entry slot 0 is the sentinel, so it can never be a real target)
SENTINEL = 0  # entry slot of the LRU list's sentinel
NEVER = 2**63 - 1  # next_expiry when no resident entry expires
# The valid range of every version, time to live and counter a word of the segment holds (``verify.check`` tests
# each header word against these, and the Redis tier refuses anything from Redis outside them).
MAX_REMOTE_VERSION = 2**53  # a Redis tier version: a double in Redis (Lua numbers are doubles), exact integers end
#                             at 2**53; versions are µs since the epoch, which reach it in the year 2255
MAX_VERSION = 2**62  # version_clock and every entry's version: copies raise the clock to at most
#                      MAX_REMOTE_VERSION and each store adds 1, so 2**62 - 2**53 stores (146 years at 10**9 a
#                      second) stay below it; higher is damage, and the clock's +1 can never overflow the word
MAX_COUNTER = 2**62  # a header counter (hits, puts, clears...): a few per operation stay below it for 146 years at
#                      10**9 operations a second; higher is damage, and its +1 can never overflow the word
MAX_TTL_NS = 2**61  # default_ttl_ns and every time to live: clock + ttl stays below 2**63 for every
#                     CLOCK_MONOTONIC reading below 2**62 ns (146 years of uptime)
MAX_PID = 2**22  # creator_pid: Linux's pid_max is at most 2**22
KIND_PREFIX = 0xF5  # first byte of a key of some kind (never in UTF-8, and not NON_STR_KEY): then the kind number
SEGMENT_PREFIX = "shmcache."  # shm object name is "/" + SEGMENT_PREFIX + cache name
HEADER_NBYTES = 576  # 9 cache lines
LOCK_NBYTES = 64  # the lock's words (futex, holder slot, wake count: 12 bytes), alone on one whole line
# Eviction policies (header word ``policy``, chosen at creation): the names SharedCache takes, by number.
POLICY_LRU, POLICY_S3FIFO, POLICY_KEEP, POLICY_AUTO = 0, 1, 2, 3
POLICY_NAMES = ("lru", "s3fifo", "keep", "auto")
# An entry's marks byte (the MARKS column): under s3fifo (and auto) its access counter and whether it is in the small
# queue (auto's window).
MARK_FREQ = 3  # bits 0-1: hits since it entered its queue, saturating at 3 (S3-FIFO's 2-bit counter)
MARK_SMALL = 4  # bit 2: the entry is in the small queue (else the main one)
MARKS_VALID = MARK_FREQ | MARK_SMALL  # no other bit is ever set
# A ghost slot (s3fifo): (tag << GHOST_STAMP_BITS) | stamp, 0 when empty. The tag is 31 bits of the fingerprint
# (those above the bits that choose the slot's group, with bit 30 set so a used slot is never 0); the stamp is the
# low 32 bits of the ghost clock when the key left the small queue.
GHOST_STAMP_BITS = 32
GHOST_STAMP_MASK = 2**32 - 1
GHOST_WAYS = 16  # a key's ghost slot is one of the 16 of its group (two cache lines), the oldest replaced
# Under auto the ghost region holds a frequency sketch instead (policies/auto.py): 64-byte blocks of 4-bit counters,
# of which the first holds the policy's state, these words (any value valid: each is clamped where it is read).
A_TARGET = 0      # the window's target in entries; 0: the first one (1 % of the entries)
A_STEP = 1        # the climber's next step, in 1/1024 entries, signed (towards a larger window if positive); 0: the
#                   restarting step
A_LAST_PPM = 2    # the hit ratio of the last period, in millionths, in the low 20 bits (PPM_BITS); above them the
#                   header's ``promoted`` when the period began, modulo 2**40 (policies/auto.py)
A_REQUESTS = 3    # lookups (hits and misses, every process) counted when the period began
A_HITS = 4        # hits counted when the period began
A_PERIODS = 5     # periods the climber closed (a counter)
A_PREFERRED = 6   # candidates from the window the sketch found more frequent than main's victim, which they replaced
A_REFUSED = 7     # candidates it did not: they left the cache
SKETCH_BLOCK_WORDS = 8  # a key's 4 counters are in one block (a cache line) of the sketch
SKETCH_MIN_WORDS = 512  # (version 16) auto's sketch in force is a page at least (Geometry.ghost_floor)
# Reader slots: one per handle that reads without the lock, its counts written by that handle alone (see READER).
READER_SLOTS = 256
# Stripes (version 11): the index in force cut into STRIPES runs of slots, each with a sequence word of its own that
# a writer makes odd before it writes a slot of the run or an entry one of them points at, so that a writer stopped
# mid-write stalls only the reads of the keys its stripes hold. A run is 2**STRIPE_MIN_SHIFT slots at least (a small
# index has fewer stripes), so that a probe seldom crosses into a second. The region: a line holding the mask of the
# stripes the hold under way opened (word S_OPEN), then each stripe's word alone on its line.
STRIPE_BITS = 6
STRIPES = 1 << STRIPE_BITS
STRIPE_MIN_SHIFT = 4
STRIPE_WORDS = ALIGN // 8  # words from one stripe's word to the next
S_OPEN = 0  # the region's word 0: bit k set while stripe k is open (the hold's end evens those named)
# Held entries (version 12): an entry a view pins, taken out of the index by a put, delete or expiry of its key, whose
# slot and block stay as they are until its last pin ends. Listed from word S_HELD_FIRST through the entries' ``next``
# words, counted in S_HELD and S_HELD_BYTES (their keys' and values' bytes), which count against the limits as
# resident entries do. Written under the lock; a repair rebuilds all three from the entries' slot words (HELD_SLOT).
# (Why the slot word and not the pins column: a view without the lock writes the pins column.)
S_HELD_FIRST = 1
S_HELD = 2
S_HELD_BYTES = 3
HELD_SLOT = -1  # a held entry's ``slot`` word: it is in no index slot (written first, so a repair never indexes it)
# Stale serving (get_or_compute's ``stale_ttl``; version 11 and later, whose segments have the stripes region): three
# counters on the same line, added to under the lock, reset by clear(); any value is valid, each clamped where it is
# read (stats.read_stats), as auto's counters in the ghost region are.
S_STALE_HITS = 4  # calls answered with a stale value (one whose ttl had run out, within its stale_ttl)
S_REFRESHES = 5  # refreshes of a stale value run in the background (each a call of the function)
S_REFRESH_FAILED = 6  # refreshes whose function raised: the stale value is served on until its stale_ttl ends
STALE_COUNTERS = (S_STALE_HITS, S_REFRESHES, S_REFRESH_FAILED)
STRIPES_NBYTES = (1 + STRIPES) * ALIGN
# Idle expiry (version 14): an entry stored with a time to idle (``tti``) expires once nobody has read it for that
# long. Its ``expires`` word stays the one every expiry test reads: the earlier of its deadline (the time to live's,
# 0: none) and the last read that moved it plus the tti. A hit moves it only when it has gained an eighth of the tti
# since it was last written, so a hot entry's word is written at most eight times a tti, never at every hit (and a
# read without the lock hands such a hit to the locked path: _core_unlocked.c). The region: a line holding the
# cache's default time to idle and its checksum, then two columns beside the entry table, one word per entry slot
# (valid while the slot is resident): TTIS, the entry's time to idle in ns (0: none), and DEADLINES, the expiry its
# time to live set (0: none; the expires word never passes it).
D_DEFAULT_TTI = 0  # the region's word 0: the time to idle of a store that gives none (ns; 0: none), creation only
D_TTI_CHECK = 1    # word 1: config.tti_checksum of word 0 (a damaged pair reads as none: verify repairs it)
# Version 16 backs the two columns only once an entry has a time to idle (a cache that never gives one saves 16 bytes
# an entry slot): until then no process writes them, and each mapping shows them as its own zero pages (no entry
# has a time to idle). The first store with one (or creation, with a default) backs and shows them, sets D_IDLE_ON
# and counts a resize, so that every process takes the tables again, the columns with them, before its next call
# (Store.show_idle). Version 16 does the same with the versions column, which only a caller that asks for a version
# needs (get_with_version, cas, a view, a Redis tier's copy): the first such call backs it, gives every entry a
# version and sets D_VERSIONS_ON (Store.show_versions). Before 16 the columns are backed with the tables and these
# words are not read. Version 18 does the same with the expires column, which only an entry with an expiry needs (a
# time to live, its own or the cache's default, or a time to idle): the first store of one backs it and sets
# D_EXPIRES_ON (Store.show_expires); no entry needs a word written before (a column never written reads 0: never).
# Until then no process writes it, and every reader reads its own zero pages there: no entry expires.
D_IDLE_ON = 2       # word 2 (version 16): non-zero once the idle columns are in use (the switch, or a repair, writes 1)
D_SWITCH_BUMPS = 3  # word 3 (version 16): the resizes the switches counted, which stats() leaves out (any value valid)
D_VERSIONS_ON = 4   # word 4 (version 16): non-zero once the versions column is in use (as D_IDLE_ON)
D_EXPIRES_ON = 5    # word 5 (version 18): non-zero once the expires column is in use (as D_IDLE_ON)
D_WORDS = 6         # the region's words before its columns that a build reads (the compiled section's span)
# The bits of a mapping's cell word 5 (segment.py): the lazy columns it shows. A column of a layout that backs it with
# the tables (Geometry.lazy) is shown whatever its bit.
SHOWN_IDLE = 1      # the idle columns (ttis, deadlines)
SHOWN_VERSIONS = 2  # the versions column
SHOWN_EXPIRES = 4   # the expires column
SHOWN_ALL = SHOWN_IDLE | SHOWN_VERSIONS | SHOWN_EXPIRES
IDLE_HEAD_NBYTES = ALIGN
IDLE_SHARE = 8     # a hit moves an idle entry's expiry once it has gained 1/IDLE_SHARE of its tti


def _record(lines: list[tuple[int, list[tuple[str, str]]]], itemsize: int) -> np.dtype:
    names, formats, offsets = [], [], []
    for line_off, fields in lines:
        off = line_off
        for name, fmt in fields:
            names.append(name)
            formats.append(fmt)
            offsets.append(off)
            off += np.dtype(fmt).itemsize
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


HEADER = _record(
    [
        # Line 0: identity, written once at creation (magic last) and never again (but index_slots: a resize).
        (0, [
            ("magic", _W),           # MAGIC; written last at creation, so a half-built segment never validates
            ("version", _W),         # LAYOUT_VERSION of the creator
            ("features", _W),        # the creator's bits of FEATURES (FEATURE_PICKLE: the pickle serializer)
            ("total_nbytes", _W),    # size of the whole segment in bytes; checked against the object's real size
            ("entry_slots", _W),     # records in the entry table, slot 0 being the LRU sentinel: the most a resize
            #                          reaches, of which the limit's are backed (version 10)
            ("index_slots", _W),     # records of the index table in force, index_for(max_entries) (a power of
            #                          two before version 17), rewritten by a resize that changes it (version 10;
            #                          before: the whole index)
            ("arena_nbytes", _W),    # bytes in the arena
            ("capacity_bytes", _W),  # the largest capacity the arena is sized for (max_capacity_bytes): the most
            #                          a resize reaches (before version 9: the capacity, fixed)
        ]),
        # Line 1: the lock's words (shmcache/lock.py), alone on their line.
        (64, [("lock", f"V{LOCK_NBYTES}")]),
        # Line 2: what every operation writes (under the lock): the counters and the dirty word, on one line so
        # that a get dirties two header lines (this and the lock's), not three.
        (128, [
            ("hits", _W), ("misses", _W), ("puts", _W), ("updates", _W),
            ("deletes", _W), ("evictions", _W), ("recoveries", _W),
            ("dirty", _W),  # non-zero while the lock holder is mid-update (1) or mid-repair (2)
        ]),
        # Line 3: occupancy, limits and the arena ring (written under the lock).
        (192, [
            ("entries", _W),             # resident entries == length of the LRU list
            ("retained_bytes", _W),      # sum of key_nbytes + val_nbytes over resident entries
            ("max_entries", _W),         # current entry limit, <= entry_slots - 1
            ("max_retained_bytes", _W),  # current byte limit, <= capacity_bytes
            ("head", _W),                # arena offset where the next block is written
            ("tail", _W),                # arena offset of the oldest block of the ring
            ("fill", _W),                # bytes from tail to head, live and dead blocks alike
            ("arena_used", _W),          # bytes of live blocks (headers and padding included)
        ]),
        # Line 4: entry-slot allocation and bookkeeping.
        (256, [
            ("free_head", _W),    # first free entry slot (linked through `next`), or NIL
            ("unused_next", _W),  # first entry slot never handed out; slots above it are all free
            ("created_ns", _W),   # wall-clock creation time, ns since the epoch (for display only)
            ("creator_pid", _W),  # pid of the creating process (for display only)
            ("clears", _W),       # clear() calls (a counter, rarely written)
            ("computations", _W),  # times get_or_compute ran the function
            ("waits", _W),         # get_or_compute calls that waited for another caller's computation
            ("takeovers", _W),     # waits that ended with no value (the computer raised or died): computed here
        ]),
        # Line 5: versions, expiry and kinds (written under the lock).
        (320, [
            ("version_clock", _W),   # the last version handed out; every store takes the next one
            ("next_expiry", _W),     # no resident entry expires before this CLOCK_MONOTONIC ns (a lower bound)
            ("expired", _W),         # entries dropped because their time to live ran out
            ("default_ttl_ns", _W),  # time to live of a put that gives none; 0: entries do not expire
            ("kinds_used", _W),      # kind table records handed out (record 0, the default kind, excluded)
            ("writing", _W),         # entry slot a store is writing while dirty is 1 (0: none); see verify.py
            ("config_check", _W),    # checksum of default_ttl_ns, max_entries and max_retained_bytes (config.py)
            ("admitted", _W),        # new entries stored (a put of an absent key, or one replaced by remove and insert)
        ]),
        # Line 6: the configuration's checked copy, written before the words themselves (config.py), so that a
        # repair tells a damaged word from a value that was set.
        (384, [
            ("saved_ttl_ns", _W),        # default_ttl_ns as last set
            ("saved_max_entries", _W),   # max_entries as last set
            ("saved_max_retained", _W),  # max_retained_bytes as last set
            ("saved_check", _W),         # checksum of the three words above
            ("progress", _W),            # moved by a lock holder on a long walk (verify, repair): while it moves,
            #                              waiters wait on (lock.py); wraps at MAX_COUNTER, any value is valid
            ("last_put_ns", _W),         # the writer's CLOCK_MONOTONIC ns at a store (put, incr, a computed value...),
            #                              to the second: a store rewrites it only when it is a second or more
            #                              old, so the line is written once a second at most; 0: no store yet (for
            #                              display only: `shmcache ls`)
            ("too_large", _W),           # stores refused with TooLargeError (an entry over the byte limit in force
            #                              or the capacity): under the lock where refused, or in one short hold
            #                              after a refusal before it (rarely written: a refusal is never hot)
            ("arena_extent", _W),        # bytes from the arena's start backed by memory (fallocated): blocks are
            #                              written below it, and it grows as they need (arena.py); 0 (a segment
            #                              made before the word): the whole arena. A hint: any value is valid,
            #                              since each process reserves what it writes to itself
        ]),
        # Line 7: the eviction policy: its identity (written once at creation) and its state (under the lock).
        (448, [
            ("policy", _W),        # POLICY_* of the creator
            ("ghost_slots", _W),   # slots of the ghost region (s3fifo), 0 for the other policies
            ("small_first", _W),   # s3fifo: the newest entry of the small queue, SENTINEL when it is empty
            ("small", _W),         # s3fifo: entries in the small queue
            ("ghost_clock", _W),   # s3fifo: keys sent to the ghost, modulo 2**32
            ("not_admitted", _W),  # puts of a new key the policy did not store (keep: the cache was full)
            ("promoted", _W),      # s3fifo: entries moved from small to main for their hits; auto: entries that went
            #                        from the window to main with a hit there (its climber reads it)
            ("ghost_hits", _W),    # s3fifo: new keys admitted straight to main, found in the ghost
        ]),
        # Line 8: what readers without the lock read first and last, alone on its line but for creation-time words
        # and words written by clear() only.
        (512, [
            ("seq", _W),            # odd from the first write of a hold that writes across the stripes (a resize,
            #                         clear, repair, expiry sweep; before version 11 every write and pin query)
            #                         until the hold ends with dirty 0; any change between a reader's two reads of
            #                         it voids what it read
            ("reader_slots", _W),   # READER_SLOTS of the creator, written once at creation
            ("base_hits", _W),      # the reader slots' sums of hits, misses, retries and fallbacks when clear()
            ("base_misses", _W),    # last reset the counters: stats() reports the sums less these
            ("base_retries", _W),
            ("base_fallbacks", _W),
            ("capacity", _W),       # the capacity in force (resize), at most capacity_bytes: the ring keeps within
            #                         the arena it needs (Geometry.ring_nbytes); under the configuration's checksums
            #                         (config.py); 0 (a segment of version 8 or 7): capacity_bytes
            ("resizes", _W),        # resizes that changed the capacity or the entry limit (a counter)
        ]),
    ],
    HEADER_NBYTES,
)

INDEX_SLOT = _record([(0, [
    ("fp", _W),     # 63-bit xxh3 fingerprint of the encoded key
    ("entry", _W),  # entry slot holding the key, or EMPTY
])], 16)
# The index slot of version 15: one word, (entry << PACKED_ENTRY_SHIFT) | the fingerprint's low 32 bits, 0 when
# empty (an empty slot is one whose entry is EMPTY, whatever its low bits). The low bits give the key's home slot in
# every index a segment can have (index_for(MAX_ENTRIES_LIMIT) is at most 2**32 slots: the bits under the mask, or
# from version 17 the tag scaled to the slots) and are a tag that a probe compares before the entry's own ``fp``; an
# entry slot is below 2**31, so a slot's word is never negative. Read as one word, a slot's tag and entry can never be
# torn apart.
INDEX_SLOT_PACKED = _record([(0, [
    ("fp", "<u4"),     # the fingerprint's low 32 bits
    ("entry", "<u4"),  # entry slot holding the key, or EMPTY
])], 8)
PACKED_ENTRY_SHIFT = 32
PACKED_TAG_MASK = 2**32 - 1

ENTRY = _record([(0, [
    ("prev", _W),        # LRU neighbour towards the most recent end (slot number)
    ("next", _W),        # LRU neighbour towards the least recent end; the free-slot link when the slot is free
    ("fp", _W),          # fingerprint of the key, equal to the index slot's
    ("off", _W),         # arena offset of the entry's block
    ("key_nbytes", _W),  # length of the encoded key
    ("val_nbytes", _W),  # length of the encoded value
    ("slot", _W),        # index slot that points here (kept current by backward-shift deletion)
    ("check", _W),       # xxh3 checksum of the block's payload, 0 when the slot is free
])], 64)
# The narrow entry record (version 19, where the arena and the index are small enough: Geometry.narrow): the same
# fields in 32 bytes. Links, index slot and lengths are 32-bit (an entry slot is below 2**31, an index slot too in
# a narrow segment, a length below 2**32); the block offset is in units of BLOCK_ALIGN (an arena below 32 GiB); the
# fingerprint is not kept: the index slot the record names holds its low 32 bits, and a lookup compares the key's
# bytes after the tag (records.py).
ENTRY_NARROW = _record([(0, [
    ("prev", "<i4"),
    ("next", "<i4"),
    ("slot", "<i4"),         # HELD_SLOT (-1) for a held entry, as in a wide record
    ("key_nbytes", "<u4"),
    ("val_nbytes", "<u4"),
    ("off", "<u4"),          # the block's arena offset >> 3
    ("check", _W),
])], 32)
NARROW_ARENA_NBYTES = 2**35  # the largest arena a narrow record's offset reaches
NARROW_INDEX_SLOTS = 2**31   # the most index slots a narrow record's slot names (and a signed 32-bit word holds)

# The kind table: one record per key kind (``SharedCache.kind``), record 0 standing for keys of no kind.
MAX_KINDS = 255  # a kind number is one byte of the encoded key and of the kinds column
KIND_NAME_NBYTES = 40
KIND = _record([(0, [
    ("name_nbytes", _W),      # length of the UTF-8 name; 0 for a record not handed out
    ("entries", _W),          # resident entries of this kind
    ("retained_bytes", _W),   # their encoded keys and values
    ("name", f"S{KIND_NAME_NBYTES}"),
])], 64)
# Per-entry columns beside the entry table (one element per entry slot, valid while the slot is resident). Kept out
# of the record (64 bytes, or 32 narrow) so that a get reads one line of it, and so that expiry and kind walks are
# vectorised scans.
EXPIRES = np.dtype(_W)   # CLOCK_MONOTONIC ns after which the entry is expired; 0: never
VERSIONS = np.dtype(_W)  # version_clock when the entry was last stored: the compare-and-swap token
KINDS = np.dtype("u1")   # kind record number (0: no kind); the same as the key's kind byte
PINS = np.dtype("u1")    # 1: a view may hold the entry pinned (a kernel lock says whether one still does)
MARKS = np.dtype("u1")   # the policy's bits of the entry (MARK_*); 0 under lru and keep
GHOST = np.dtype(_W)     # a ghost slot (s3fifo): see GHOST_STAMP_BITS
TTIS = np.dtype(_W)      # (version 14, the idle region) the entry's time to idle, ns; 0: none (D_DEFAULT_TTI...)
DEADLINES = np.dtype(_W)  # (version 14) the expiry its time to live set, CLOCK_MONOTONIC ns; 0: none
# A reader slot: the counts of one handle's reads without the lock, plain words written by that handle alone (it
# holds the slot with an exclusive OFD lock on byte READER_BASE + slot, ofd.py). A slot outlives its holder: the next
# claimer adds to its counts, and stats() sums every slot, so counts survive a SIGKILL.
# Its pin words are the views its holder has open, pinned without a system call: (count << 32) | entry slot, 0 free.
READER_PINS = 24
READER = _record([(0, [
    ("hits", _W),       # lookups answered without the lock that found the key
    ("misses", _W),     # lookups answered without the lock that did not
    ("retries", _W),    # reads begun again because a writer changed the segment under them (torn reads)
    ("fallbacks", _W),  # reads handed to the locked path after all (a writer kept at it, an expired entry...)
    ("holder", _W),     # pid of the handle that last claimed the slot (for display only)
    ("reading", _W),    # non-zero while its holder reads the arena without the lock: what a resize that gives
    #                     pages back waits out (readers.quiesce); any value is valid (a stale one delays it)
]), (64, [("pins", f"({READER_PINS},){_W}")])], 256)
PIN_SLOT_MASK = 2**32 - 1  # a pin word's entry slot; the count of views of it is above

HEADER_WORDS = HEADER_NBYTES // 8
INDEX_WORDS = INDEX_SLOT.itemsize // 8
ENTRY_WORDS = ENTRY.itemsize // 8
# The whole entry record in field order, for writing a new entry with one call instead of a word at a time.
ENTRY_STRUCT = struct.Struct("<8q")


def field_off(dtype: np.dtype, name: str) -> int:
    """The byte offset of field ``name`` in structured ``dtype``."""
    fields = dtype.fields
    if fields is None:
        raise TypeError(f"{dtype} is not a structured dtype")
    return int(fields[name][1])


def _word(dtype: np.dtype, name: str) -> int:
    return field_off(dtype, name) // 8


H_MAGIC = _word(HEADER, "magic")
H_VERSION = _word(HEADER, "version")
H_FEATURES = _word(HEADER, "features")
H_TOTAL_NBYTES = _word(HEADER, "total_nbytes")
H_ENTRY_SLOTS = _word(HEADER, "entry_slots")
H_INDEX_SLOTS = _word(HEADER, "index_slots")
H_ARENA_NBYTES = _word(HEADER, "arena_nbytes")
H_CAPACITY_BYTES = _word(HEADER, "capacity_bytes")
H_LOCK_OFF = field_off(HEADER, "lock")
H_HITS = _word(HEADER, "hits")
H_MISSES = _word(HEADER, "misses")
H_PUTS = _word(HEADER, "puts")
H_UPDATES = _word(HEADER, "updates")
H_DELETES = _word(HEADER, "deletes")
H_EVICTIONS = _word(HEADER, "evictions")
H_CLEARS = _word(HEADER, "clears")
H_RECOVERIES = _word(HEADER, "recoveries")
H_COMPUTATIONS = _word(HEADER, "computations")
H_WAITS = _word(HEADER, "waits")
H_TAKEOVERS = _word(HEADER, "takeovers")
H_ENTRIES = _word(HEADER, "entries")
H_RETAINED = _word(HEADER, "retained_bytes")
H_MAX_ENTRIES = _word(HEADER, "max_entries")
H_MAX_RETAINED = _word(HEADER, "max_retained_bytes")
H_HEAD = _word(HEADER, "head")
H_TAIL = _word(HEADER, "tail")
H_FILL = _word(HEADER, "fill")
H_ARENA_USED = _word(HEADER, "arena_used")
H_FREE_HEAD = _word(HEADER, "free_head")
H_UNUSED_NEXT = _word(HEADER, "unused_next")
H_CREATED_NS = _word(HEADER, "created_ns")
H_CREATOR_PID = _word(HEADER, "creator_pid")
H_DIRTY = _word(HEADER, "dirty")
H_VERSION_CLOCK = _word(HEADER, "version_clock")
H_NEXT_EXPIRY = _word(HEADER, "next_expiry")
H_EXPIRED = _word(HEADER, "expired")
H_DEFAULT_TTL = _word(HEADER, "default_ttl_ns")
H_KINDS_USED = _word(HEADER, "kinds_used")
H_WRITING = _word(HEADER, "writing")
H_CONFIG_CHECK = _word(HEADER, "config_check")
H_SAVED_TTL = _word(HEADER, "saved_ttl_ns")
H_SAVED_MAX_ENTRIES = _word(HEADER, "saved_max_entries")
H_SAVED_MAX_RETAINED = _word(HEADER, "saved_max_retained")
H_SAVED_CHECK = _word(HEADER, "saved_check")
H_PROGRESS = _word(HEADER, "progress")
H_LAST_PUT = _word(HEADER, "last_put_ns")
H_TOO_LARGE = _word(HEADER, "too_large")
H_ARENA_EXTENT = _word(HEADER, "arena_extent")
H_ADMITTED = _word(HEADER, "admitted")
H_POLICY = _word(HEADER, "policy")
H_GHOST_SLOTS = _word(HEADER, "ghost_slots")
H_SMALL_FIRST = _word(HEADER, "small_first")
H_SMALL = _word(HEADER, "small")
H_GHOST_CLOCK = _word(HEADER, "ghost_clock")
H_NOT_ADMITTED = _word(HEADER, "not_admitted")
H_PROMOTED = _word(HEADER, "promoted")
H_GHOST_HITS = _word(HEADER, "ghost_hits")
H_SEQ = _word(HEADER, "seq")
H_READER_SLOTS = _word(HEADER, "reader_slots")
H_BASE_HITS = _word(HEADER, "base_hits")
H_BASE_MISSES = _word(HEADER, "base_misses")
H_BASE_RETRIES = _word(HEADER, "base_retries")
H_BASE_FALLBACKS = _word(HEADER, "base_fallbacks")
H_CAPACITY = _word(HEADER, "capacity")
H_RESIZES = _word(HEADER, "resizes")
R_HITS = _word(READER, "hits")
R_MISSES = _word(READER, "misses")
R_RETRIES = _word(READER, "retries")
R_FALLBACKS = _word(READER, "fallbacks")
R_HOLDER = _word(READER, "holder")
R_READING = _word(READER, "reading")
R_PINS = _word(READER, "pins")
READER_WORDS = READER.itemsize // 8
KIND_WORDS = KIND.itemsize // 8
K_NAME_NBYTES = _word(KIND, "name_nbytes")
K_ENTRIES = _word(KIND, "entries")
K_RETAINED = _word(KIND, "retained_bytes")
K_NAME_OFF = field_off(KIND, "name")

I_FP = _word(INDEX_SLOT, "fp")
I_ENTRY = _word(INDEX_SLOT, "entry")
# Index slot s starts at word s << INDEX_SHIFT (the Python reference and the C address it the same way).
INDEX_SHIFT = INDEX_WORDS.bit_length() - 1
if 1 << INDEX_SHIFT != INDEX_WORDS:
    raise ImportError("layout: an index slot must be a power-of-two number of words")
# A block's header word is (owner slot << BLOCK_OWNER_SHIFT) | block length, the length in the bits below the shift.
BLOCK_LEN_MASK = MAX_BLOCK_NBYTES + BLOCK_ALIGN - 1
BLOCK_OWNER_SHIFT = BLOCK_LEN_MASK.bit_length()
if BLOCK_LEN_MASK & (BLOCK_LEN_MASK + 1):
    raise ImportError("layout: a block length must fill the header's low bits")

E_PREV = _word(ENTRY, "prev")
E_NEXT = _word(ENTRY, "next")
E_FP = _word(ENTRY, "fp")
E_OFF = _word(ENTRY, "off")
E_KEY_NBYTES = _word(ENTRY, "key_nbytes")
E_VAL_NBYTES = _word(ENTRY, "val_nbytes")
E_SLOT = _word(ENTRY, "slot")
E_CHECK = _word(ENTRY, "check")

if ENTRY_STRUCT.size != ENTRY.itemsize or [E_PREV, E_NEXT, E_FP, E_OFF, E_KEY_NBYTES, E_VAL_NBYTES, E_SLOT,
                                           E_CHECK] != list(range(ENTRY_WORDS)):
    raise ImportError("shmcache.layout: ENTRY_STRUCT disagrees with the ENTRY dtype")
