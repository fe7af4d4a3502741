"""The binary layout of a shmcache segment: the one place that says where every byte lives.

A segment is one POSIX shared-memory object, ``/dev/shm/shmcache.<name>`` on Linux, sized once at creation; its
tables are backed with memory (``posix_fallocate``) for the entry limit in force ("Tables", below), its arena as
blocks reach it (``arena_extent``, below). It holds these regions, each starting on a 64-byte boundary (``ALIGN``)
so that no two regions share a cache line::

    offset 0                  header        HEADER_NBYTES bytes, dtype HEADER
    geometry.index_off        index table   index_slots records of dtype INDEX_SLOT_PACKED (8 bytes; before
                                            version 15, INDEX_SLOT: 16 bytes)
    geometry.entries_off      entry table   entry_slots records of dtype ENTRY_NARROW (32 bytes, two a cache
                                            line; Geometry.narrow) or ENTRY (64 bytes: before version 19, and an
                                            arena of 32 GiB or more)
    geometry.expires_off      expires       entry_slots words (EXPIRES): when each entry expires
    geometry.versions_off     versions      entry_slots words (VERSIONS): each entry's compare-and-swap token (16:
                                            backed once a caller asks for a version)
    geometry.kinds_off        kinds         entry_slots bytes (KINDS): each entry's key kind
    geometry.pins_off         pins          entry_slots bytes (PINS): entries a view may hold pinned
    geometry.marks_off        marks         entry_slots bytes (MARKS): the policy's bits of each entry
    geometry.kind_table_off   kind table    MAX_KINDS + 1 records of dtype KIND (64 bytes)
    geometry.ghost_off        ghost         ghost_slots words (GHOST): s3fifo's ghost (0 words otherwise)
    geometry.readers_off      reader slots  READER_SLOTS records of dtype READER (64 bytes): reads without the lock
    geometry.stripes_off      stripes       (version 11) STRIPES_NBYTES: the open mask's line (and, version 12, the
                                            held entries' words), then a word a line
    geometry.idle_off         idle          (version 14) a line (the default time to idle and its checksum, and
                                            from 16 D_IDLE_ON, D_SWITCH_BUMPS, D_VERSIONS_ON, from 18
                                            D_EXPIRES_ON), then the ttis and
                                            deadlines columns, entry_slots words each: idle expiry (16: backed once
                                            in use)
    geometry.arena_off        arena         arena_nbytes bytes of entry blocks

All integers are little-endian, 8-byte words but where a dtype says otherwise (a packed index slot's halves, a narrow
record's 4-byte fields, the byte columns). Nothing stored is an address: entries name each other by slot number and
blocks by byte offset from the start of the arena, so any process may map the segment anywhere.

Header. Line 0 is identity: ``magic`` (``MAGIC``), ``version`` (``LAYOUT_VERSION``), ``features`` (bits of
``FEATURES``), the total size and the creation parameters; the creator writes ``magic`` last, so a segment whose magic
is in place is fully initialised. ``features`` bit 0 (``FEATURE_PICKLE``) says the values may be pickled: the creator
asked for ``serializer="pickle"``, and a handle that did not ask for it is refused (and one that did, on a segment
without it); no other bit is defined, and an attacher refuses a segment with a bit it does not know. Line 1 is the
lock (``shmcache/lock.py``): ``word`` (bytes 0-3, the futex: the holder's thread id and a waiters bit, 0 when free),
``holder`` (4-7: the holder's holder slot + 1) and ``wakes`` (8-11: what sleepers wait on); the rest of the line is
never read, and zero as made. Line 2 holds the hit/miss/put counters and the ``dirty`` word (what every operation
writes), line 3 the occupancy, the limits and the arena ring, line 4 the entry-slot allocator, the creation stamp
and the rarely written counters (``clears``; ``get_or_compute``'s computations, waits and takeovers), line 5 the
version clock, the expiry bound and counter, the default time to live, the number of kinds, the entry a store is
writing, the configuration's checksum and the count of new entries stored, line 6 the configuration's checked copy
(``shmcache/config.py``), the long walks' ``progress``, the time of the last store (``last_put_ns``) and the count
of stores refused as too large (``too_large``) and how much of the arena is backed with memory (``arena_extent``),
line 7 the eviction policy: ``policy`` (``POLICY_*``: 0 lru, 1 s3fifo, 2 keep, 3 auto) and ``ghost_slots``, both
written once at creation, then s3fifo's small queue (auto's window: ``small_first``, ``small``), its ghost clock and
the policy's counters, line 8 what readers without the lock validate against (``seq``), the number of reader slots
(written once at creation) and the slots' sums ``clear()`` last set aside (``base_*``), then the capacity in force
(``capacity``) and the count of resizes (``resizes``). See ``dtypes.HEADER`` for each field.

Capacity. The arena is sized at creation for the most a resize reaches (``capacity_bytes`` of line 0): address
space, and a file that long, sparse. The ring uses its first ``Geometry.ring_nbytes(capacity, limit)`` bytes, what
the capacity in force and the entries need (the bytes, a block header and padding per entry, 1/16 slack), and keeps
its extent within them: room for a header per entry slot the tables reach (version 13), so that only a new capacity
changes the ring's size, or per entry the limit in force allows (versions 10 to 12: a new entry limit moves the
ring's end too). The ring's size is address space: what is backed is its extent, which grows as blocks need, up to
``Geometry.extent_top`` (version 13: what the capacity and the limit in force need, which is 12's ring; a store
that finds the extent there wraps instead of growing it). A resize (``Store.resize``, under the lock) sets the
limits and the capacity word together (``config.write``); where the ring wraps or reaches past the new size (or
the new top), it first slides every live block down to the arena's start in address order (``Arena.compact``: a
pinned block stays, the gap before it dead). A smaller ring (or top) lowers the extent to a step past the last
block; each process hides its pages past it before its next locked call (``Segment.refresh``;
the compiled section hands that over), and their memory is given back (``fallocate(PUNCH_HOLE)``) once the reads
without the lock under way have ended (each counted in its reader slot's ``reading`` word; ``readers.quiesce``),
since a reader that found an offset there before the resize would back a page again by touching it.

Tables (version 10). The index, the entry table, its columns and the ghost are reserved for the most entries a
resize reaches (``entry_slots``), as the arena is: address space and a sparse file. What the entry limit in force
needs is backed with memory and shown: the index's first ``index_slots`` (line 0: ``index_for(max_entries)``), the
ghost's words for them (``Geometry.ghost_for``), and of the entry table and each column the slots up to the limit,
and any handed out before under a larger limit (``unused_next``; ``Geometry.slots_for``). Each process's mapping
shows private zero pages past them
(``Segment.show_tables``), so a slot number only damage can aim there reads zeros, never a hole of the file (which a
full /dev/shm answers with SIGBUS). A resize that changes the limit (``Store.resize``; ``set_limits`` of another
``max_entries`` is one) backs the larger tables first, evicts to the new limit and slides the ring where it must,
then writes the limit and rebuilds the index at its new size from the resident entries (``Table.reindex``), under
the dirty bracket and the readers' odd ``seq``. It counts itself in ``resizes`` before its first write, so a holder
killed part-way leaves every process to take the tables again once the repair has settled them (a repair that
changes them counts too). Each process keeps in its mapping's cell the index, limit and ``resizes`` it last took; a
call that finds any of the three words moved (the count alone could come back, damaged, to the one taken) takes the
new tables first (``Segment.refresh_tables``; the compiled section hands that over, and its reads without the lock
check the count and the index, on lines no put writes), after checking them: an index that is not the one the
checked limit needs is damage, or a resize cut short, and the repair rebuilds the index the limit needs
(``verify._settle_index``). A slot number at or past the slots a mapping shows is out of range there, as one past the
table is, and ``unused_next`` is trusted past them only as far as the entry table's pages hold data in the file
(``Segment.slots_in_use``): a damaged word never backs or shows a page nobody wrote. A smaller limit moves the
entries it keeps below the slots it hands out (``Table.pack``: each copied whole, then its block's header names the
new slot, the commit, then the words that named the old one), lowers ``unused_next`` to past the last one (a pinned
entry is not moved: the slots in use end past it), and gives back the pages of the tables past what it needs
(``Segment.shrink_tables``), once the reads without the lock begun before it have ended, as the arena's are; the
other processes show zero pages of their own there as they take the tables.

The ``dirty`` word is 1 while a lock holder is between the first and the last write of an update. Whoever takes the
lock and finds it set -- the holder died, or an exception cut its update short -- verifies and repairs the segment
before using it; a holder that dies while it is 0 left nothing half-done. A store also names the entry it is
writing (``writing``) until it is done: a store cut short may have left that entry's value, checksum, version and
expiry out of step in ways no check can see (a new value with its old version, say), so the repair drops it.

Index table. Open addressing with linear probing over ``index_slots`` (``index_for``: the fewest that keep the load
at or below 0.7 with the entry limit and one counted; before version 17, the least power of two that keeps it at or
below one half). A slot is one word, ``(entry << 32) | tag`` (``INDEX_SLOT_PACKED``), ``tag`` the low 32 bits of the
63-bit xxh3 fingerprint of the encoded key: it gives the key's home slot, ``(tag * index_slots) >> 32`` (before
version 17: ``fp & mask``), and is what a probe compares before it compares the entry's own ``fp`` (a wide record's)
and key. A probe
goes round from the last slot to the first. Before version 15 a slot is two words, ``(fp, entry)`` (``INDEX_SLOT``),
the whole fingerprint. ``entry == EMPTY`` (0) marks an empty
slot, whatever its other bits, which is also what a fresh, zero-filled page reads as. Deletion shifts the following
cluster back, so there are no tombstones.

Entry table. Slot 0 is the sentinel of a circular doubly linked list (``SENTINEL``) of every resident entry. Under
lru ``sentinel.next`` is the most recently used entry and ``sentinel.prev`` the least; under keep they are the newest
and the oldest admitted; under s3fifo the list is main's entries, newest first, then from ``header.small_first``
small's, newest first (``small_first`` is the sentinel when small is empty). A resident entry records the arena
offset of its block, the lengths of its encoded key and value, the index slot that points at it, and a checksum of
its value (xxh3 of the value's bytes after its tag byte, seeded with the tag; never 0); a wide record (``ENTRY``)
also its key's fingerprint. A narrow record (``ENTRY_NARROW``, version 19 wherever the arena is below 32 GiB and
the index below 2**31 slots: ``Geometry.narrow``) keeps the links, the index slot and the lengths as 32-bit fields
(``HELD_SLOT`` is -1 in both) and the block's offset in units of 8: 32 bytes where a wide one is 64. It keeps no
fingerprint: the index slot it names holds the fingerprint's low 32 bits, which a probe compares, and the policies'
sketch and ghost know its key by those bits alone, spread over 63 (``records.narrow_pfp``). Free
slots are chained through ``next`` from ``header.free_head``; slots at or above ``header.unused_next`` have never
been used and are free without being chained, so creation touches none of them.

Columns. Per-entry data kept beside the entry table rather than in its record, so that a get reads one line of the
record and expiry and kind walks are vectorised scans. ``expires`` is a CLOCK_MONOTONIC time in ns (0: never) and
is 0 for every slot not resident; the header's ``next_expiry`` is a lower bound of the non-zero ones, so expired
entries are looked for only once one can exist. ``versions`` takes the next value of the header's
``version_clock`` at every store, so a version is never reused (every version is from 1 to ``MAX_VERSION``, and
one a Redis tier's copy carries at most ``MAX_REMOTE_VERSION``: see dtypes.py for why). Version 16 backs the
column only once a caller asks for a version (``get_with_version``, ``cas``, a view, a Redis tier's copy): until
then each mapping shows it as its own zero pages and stores only move the clock; the first such call backs and
shows it, gives every entry in a slot the clock's next versions, sets ``D_VERSIONS_ON`` and counts a resize, as the
idle columns' switch does (``Store.show_versions``; the compiled section hands a view over until its mapping shows
the column, ``VERSIONS_SHOWN``). Version 18 does the same with ``expires``, which only an entry that expires needs:
until a store gives an expiry (a time to live, its own or the default, or a time to idle) each mapping shows the
column as its own zero pages (never, for every entry) and no store writes a word of it (a 0 over 0 is skipped); that
store backs and shows it, sets ``D_EXPIRES_ON`` and counts a resize (``Store.show_expires``; a creation with a
default time to live or idle backs it at once; the compiled section hands such a store over until its mapping shows
the column, ``EXPIRES_SHOWN``). ``kinds`` repeats the kind
byte of the key (below), and the kind table counts each kind's entries and bytes. ``pins`` is 1 once a view has
pinned the entry; whether a pin is still held is asked of the kernel (below), since a pin ends with its process
without a word written. ``marks`` is 0 under lru and keep; under s3fifo (and auto) bits 0-1 count the entry's hits
since it entered its queue (saturating at 3) and bit 2 (``MARK_SMALL``) says it is in small (auto's window).

The idle region (version 14): its first line holds the cache's default time to idle (``D_DEFAULT_TTI``, ns, 0:
none) and that word's checksum (``config.tti_checksum``), written once at creation; then two columns of a word per
entry slot, valid while the slot is resident: ``ttis``, the entry's time to idle (0: none), and ``deadlines``, the
expiry its time to live set (0: none). An idle entry's ``expires`` is the earlier of its deadline and the last read
that moved it plus its tti; a hit under the lock moves it forward once it has gained ``1/IDLE_SHARE`` of the tti,
a single word the readers without the lock may read either side of (both are deadlines it had), so an entry read
more often than every ``(1 - 1/IDLE_SHARE)`` tti lives and one left alone for its tti is gone. A read without the
lock that finds such a move due hands the hit to the locked path (``_core_unlocked.c``). Version 16 backs the two
columns only once they are in use: until the first store with a time to idle (or creation with a default one) each
mapping shows them as its own zero pages, read as "no time to idle" and never written. That store backs and shows
them, sets ``D_IDLE_ON`` (word 2 of the line) and counts a resize (also in ``D_SWITCH_BUMPS``, word 3, which
``stats()`` leaves out of ``resizes``), so that every other process takes them with the tables before its next call
(``Segment.refresh_tables``; the compiled section reads the mapping's cell, ``IDLE_SHOWN``, and hands such a store
over). A store in a mapping that does not show them switches again if it has a time to idle or ``D_IDLE_ON`` is
set, so a switch killed before its count is made whole by the next store, and no store leaves a slot's previous
idle words in a column in use.

The ghost region (``ghost_slots`` words under s3fifo and auto, none under lru and keep; ``Geometry.ghost_for``: as
many as the index's slots under s3fifo, half as many under auto from version 16, so that its sketch has 16 counters
an entry of the limit at least, as Caffeine's does; a power of two, so from version 17 those of the power-of-two
index version 16 would have for the limit the slots hold, twice its entries rounded up to a power of two): under
s3fifo, the ghost's tagged fingerprints (policies/s3fifo.py); under auto, a count-min sketch of 4-bit counters in
blocks of 8 words, a key's 4 counters in one block, whose block 0 holds the policy's state instead
(``A_*`` of dtypes.py: the window's target, the climber's step, the last period's hit ratio, the lookups and hits
when the period began, and three counters; policies/auto.py). Only the part the index in force sizes is used. Any
word of the region is valid under both policies, so it is outside the crash protocol.

Reads without the lock (s3fifo, keep and auto). The stripes region (version 11) holds a sequence word for each of
``STRIPES`` runs of the index in force's slots (``seqlock.stripe_of``: 2**STRIPE_MIN_SHIFT slots at least), each
alone on its line, after a line whose word ``S_OPEN`` is the mask of the stripes the hold under way opened (and,
version 12, the held entries' words, below). A
stripe's word is odd from a lock holder's first write to one of its slots or to an entry one of them points at (or
a pin query of such an entry) until its hold ends with ``dirty`` 0; ``seq`` likewise around what writes across the
stripes (a resize, a clear, a repair, an expiry sweep), and, on a segment of version 10, around every write and pin
query. A reader reads ``seq`` and each stripe's word its probe enters before what they cover, and again after, and
an odd word or a change voids the read (docs/design.md, "Reads without the lock"). Any value is valid: an odd word
nobody is writing under is evened by the next hold to end (the stripes the mask names; every stripe after a repair;
a stripe a compiled read found odd, once its fallback holds the lock), and any mask only names stripes to even.
Each reader slot is written by the one handle that holds it (an exclusive kernel lock on byte
``READER_BASE`` + slot, below): plain counts of the lookups it answered without the lock (``hits``, ``misses``),
of the reads it began again (``retries``) and of those it handed to the locked path (``fallbacks``), and the pid
of its last holder; ``reading``, the reads of the arena without the lock its holder has under way (what a resize
waits out before it gives pages back); and 24 pin words, one per entry its holder's open views pin without a
system call, ``(count << 32) | entry slot`` (0: free), which count only while the slot's kernel lock is held. A
slot keeps its counts when its holder dies; ``stats()`` adds every slot's to the header's, less ``base_*``. Any
value of a slot is valid (out of range, it counts as 0, and its next claimer zeroes it).

Held entries (version 12). A put, delete or pop of a key whose entry a view pins takes that entry out of the index,
the list, the policy's queues and the occupancy counts (its ``slot`` word becomes ``HELD_SLOT``, first), and stores
the new value beside it: its slot and block stay as they are for the views reading them. The held entries are listed
from the stripes region's word ``S_HELD_FIRST`` through their ``next`` words and counted in ``S_HELD`` and
``S_HELD_BYTES`` (their keys' and values' bytes), which count against the limits as resident entries do; a store
gives back the slot and block of each whose pins have all ended. A repair rebuilds the list and the counts from the
slot words: it keeps a held entry whose block checks out while a view pins it, and gives back the others. Words
``S_STALE_HITS``, ``S_REFRESHES`` and ``S_REFRESH_FAILED`` of the same line (version 11 and later) count
``get_or_compute``'s stale answers and background refreshes; any value is valid (clamped where read).

Ghost (s3fifo only). ``ghost_slots`` words (the index's slot count, at least ``GHOST_WAYS``), in groups of
``GHOST_WAYS``: a fingerprint's group is its low bits' slot rounded down to a group. A word is 0 (empty) or
``(tag << 32) | stamp``: ``tag`` is the fingerprint shifted right by 33 with bit 30 set, ``stamp`` the low 32 bits of
``header.ghost_clock`` when the key left small unhit. A word is live while ``(ghost_clock - stamp) mod 2**32`` is
below ``max_entries * 9 // 10``. Every value of every ghost word is valid.

Arena. A ring of blocks. Each block is ``[8-byte block header][encoded value][encoded key][padding to 8]``; the block
header packs the block length (low 32 bits) and the owning entry slot (high 32 bits, 0 for a dead block). Blocks are
written at ``head``; ``tail`` is the oldest block and ``fill`` the bytes from ``tail`` to ``head``, live and dead.
When there is no room at ``head``, the allocator walks from ``tail``: dead blocks are absorbed into the gap and live
ones slid down to close it, an incremental compaction that never needs a second buffer; a pinned block is never
moved: the gap before it turns into a dead block and the ring goes on after it. The arena is sized from the
creation parameters with room for one block header and its padding per entry, plus 1/16 slack for the compaction,
so a put that fits the retained-bytes and entry limits always finds room. Only the arena's first ``arena_extent``
bytes are backed with memory: a new segment backs ``Geometry.initial_extent`` of them; the ring keeps below the
extent (wrapping early, a dead block over the rest of the arena of which only the first word is written, while its
live blocks would fit in seven eighths of it), and a store that needs more grows it (``grown_extent``) after
backing the new part. Each process maps the file's arena only as far as it has backed it itself (``posix_fallocate``
of what is already backed costs nothing) and private zero pages after it (``Segment.shown``): a read there, which
only damage can aim, finds zeros, never a page of the file that is not backed, which on a full /dev/shm would be
SIGBUS. A process that finds the extent past what it shows backs and shows the rest before it reads (under the lock,
``Segment.refresh``; the compiled section hands that over). So any value of the word is valid (out of range: the
whole arena); a repair raises it to the end of the last block it keeps.

Kernel locks on the segment's file (open-file-description locks, ``shmcache/ofd.py``; they live in the kernel, not
in the segment's bytes): ``get_or_compute`` claims a key with an exclusive lock on one byte below 2**62, at an
offset taken from the key's fingerprint (``shmcache/flight.py``); every open handle holds a shared lock on byte
2**62 (``LIVE_BYTE``), which ``sweep`` takes exclusively to know that nobody has the segment open; and a view pins
entry slot ``e`` with a shared lock on byte 2**62 + 1 + e (``shmcache/view.py``); a ``TieredCache`` namespace's
invalidation listener holds an exclusive lock on byte 2**62 + 2**40 + its kind number (``LISTENER_BASE``, the
host's election: one listener per host); a handle reading without the lock holds an exclusive lock on byte 2**62 +
2**40 + 2**20 + its reader slot (``READER_BASE``, ``shmcache/readers.py``); every open handle holds an exclusive
lock on byte 2**62 + 2**40 + 2**21 + its holder slot (``HOLDER_BASE``, below 2**20 slots, ``shmcache/lock.py``),
which the lock's waiters test to know whether a holder's process lives; and every open handle holds a shared
lock on byte 2**62 + 2**41 + its process's PID namespace (the inode number of /proc/self/ns/pid, taken modulo
``NS_SPAN``), so that the lock can tell when a holder's thread id may belong to a namespace the reader cannot see
(``shmcache/lock.py``). The ranges are disjoint: claims below 2**62, pins below 2**62 + 2**40 (entry slots are far
fewer), listeners below 2**62 + 2**40 + 2**20, reader slots below 2**62 + 2**40 + 2**21, holder slots below
2**62 + 2**41.

Encoded keys (``shmcache/codec.py``): a ``str`` key is its UTF-8 bytes; any other key is the byte 0xC1 followed by its
canonical msgpack form; a key of kind ``k`` is the byte 0xF5 (``KIND_PREFIX``, never in UTF-8 either), ``k``, then
the key's own encoding. Encoded values: a tag byte (``B``, ``A``, ``T``, ``M``) followed by the body; in a segment
with ``FEATURE_PICKLE`` also ``P``, a pickle stream of protocol 5 (``shmcache/serializers.py``), which a reader of any
other segment refuses as damage, never unpickling it.

    ``B`` -- raw bytes.
    ``A`` -- a numpy array: byte 0 the tag, byte 1 zero, bytes 2-3 the header's length ``h`` (uint16), bytes 4-7
             zero; at 8 the header, msgpack ``[dtype.str, shape]`` (bool, int, uint, float or complex; at most 64
             non-negative dims), zero-padded to a multiple of 8 bytes; then the C-order data, exactly
             prod(shape) * itemsize bytes.
    ``T`` -- a torch tensor, laid out as ``A`` but for byte 1, the tensor's dtype code (``shmcache/tensors.py``):
             0, the tensor's dtype is the header's (one that ``torch.from_numpy`` reads, in the host's byte order);
             1, bfloat16, whose header says ``<u2`` and whose data are the bfloat16 bit patterns. Any other code, or
             a dtype the code does not allow, is malformed. E.g. ``torch.tensor([1.5])`` (float32) is
             ``54 00 07 00 00 00 00 00 | 92 a3 3c 66 34 91 01 00 | 00 00 c0 3f``.
    ``M`` -- msgpack, with ext types 1 (a tuple: its items as a msgpack array), 2 (an array: uint32 header
             length, the ``A`` header, the data), 3 (an int beyond 64 bits: little-endian two's complement), 4
             (a tensor: a ``T`` value without its tag byte), 11 and 12 (a set and a frozenset: their items as a
             msgpack array; in a key, sorted by their encoded bytes), and the standard library's scalars, each
             little-endian and fixed-width or canonical text (``shmcache/stdtypes.py``): 5 ``datetime``
             (``<HBBBBBBI`` year, month, day, hour, minute, second, fold, microsecond; then nothing when naive, or
             ``<q`` the UTC offset in microseconds, strictly within a day, then the zone's name in UTF-8 when it is
             not ``datetime.timezone``'s default name for that offset), 6 ``date`` (``<HBB``), 7 ``time``
             (``<BBBBI`` hour, minute, second, fold, microsecond; then the zone as for 5), 8 ``timedelta``
             (``<iII`` days, seconds below 86400, microseconds below 10**6), 9 ``Decimal`` (the ASCII of
             ``str(d)``, and only that), 10 ``UUID`` (its 16 bytes) and 13 ``complex`` (``<dd`` real, imaginary).
             Every field out of its type's range is malformed. E.g. ``datetime.date(2024, 3, 9)`` is
             ``4d d6 06 e8 07 03 09``.

The value tags and ext types are not covered by ``LAYOUT_VERSION``: a reader meets a tag or ext type it does not know
(``T`` and ext 4 before they were added, ext 5-13 likewise) as a value that does not decode, which it reports and
drops. Keys of ext 5-13 are looked up by their bytes alone, in any version; only iteration decodes a key, and an
older version iterating a cache that holds one meets it as a key that does not decode (``CorruptionError``), so
every process that iterates a cache should run a version that knows the keys stored in it.

Layout versions.
    1 -- str keys as msgpack strings; the value checksum over tag and body together.
    2 -- str keys as UTF-8, the tag-seeded checksum, ``dirty`` moved to line 2.
    3 -- the layout described above: the columns, the kind table and header line 5 (versions, expiry, kinds).
         ``FEATURE_PICKLE`` was added to version 3 without a new version: a default segment is byte for byte what
         it was, and a reader that predates the bit refuses a pickle segment by its ``features`` word alone.
    4 -- the configuration's checksum (``config_check``, line 5) and its checked copy (line 6): a damaged
         ``default_ttl_ns`` or limit is found by verify() and restored by the repair (``shmcache/config.py``).
    5 -- eviction policies: header line 7, ``admitted`` (line 5), the marks column and the ghost region.
    6 -- reads without the lock: header line 8 (``seq``, ``reader_slots``, ``base_*``) and the reader slots.
    7 -- the lock's line holds shmcache's own futex words (``word``, ``holder``, ``wakes``), no pthread mutex;
         line 6: ``last_put_ns``, when the cache was last stored to (for ``shmcache ls``), and ``too_large``, the
         stores refused as too large.
    8 -- the arena backed as it fills: ``arena_extent`` (line 6). A version-7 segment is version 8 with every page
         reserved at creation and the word 0: this version attaches to it and uses it as it is (its whole arena
         shown, never grown, its version word never rewritten, not even by a repair), so an upgrade keeps the
         entries; a version-7 process refuses a version-8 segment, whose blocks past its extent it would write
         without backing them.
    9 -- resizes: line 0's ``capacity_bytes`` is what the arena is sized for (``max_capacity_bytes``, the file
         that long but sparse), and line 8's ``capacity`` the capacity in force, under both configuration
         checksums, which now cover four words; ``resizes`` counts the resizes. A segment of version 8 or 7 is
         version 9 with ``capacity`` 0 (its arena's whole, checksums of three words): attached and used as it is,
         never resized.
    10 -- tables that grow: line 0's ``entry_slots`` are what the tables are reserved for (16 times the
         ``max_entries`` of creation: address space and a sparse file), and ``index_slots`` the index in force,
         the one the entry limit needs (``index_for``), which a resize rewrites; the tables are backed for the
         limit in force alone ("Tables" above), and the ring's room for block headers follows the limit. A segment
         of version 9 is version 10 with its tables reserved for its limit of creation, all backed, its whole index
         in force: attached and used as it is (resized within its tables), never rewritten to version 10.
    11 -- stripes: the stripes region after the reader slots (the arena after it, page aligned), each stripe's
         sequence word opened by a write to its slots or their entries instead of ``seq``, so that a writer stalls
         only the readers of its stripes. A segment of version 10 is version 11 without the region: attached and
         used as it is, its writers opening ``seq`` where version 11's open a stripe (as a version-10 process does),
         never rewritten to version 11.
    12 -- held entries: a pinned entry that a put, delete or expiry of its key replaces is held aside for its
         views (the stripes region's ``S_HELD*`` words) instead of refusing the store (PinnedError).
    13 -- the ring has room for a block header per entry slot the tables reach, so that only a new capacity changes
         its size; its extent grows up to ``Geometry.extent_top`` (12's ring) alone.
    14 -- idle expiry: the idle region after the stripes (the arena after it, page aligned). A segment of version
         13 is version 14 without the region: attached and used as it is, its entries without a time to idle (a
         store that asks for one is refused with a ValueError naming the version), never rewritten to version 14.
    15 -- index slots of one word (``INDEX_SLOT_PACKED``: the entry and a 32-bit tag of the fingerprint) instead of
         two: half the index's bytes, 8 a slot. A segment of version 14 is version 15 with the slots of two words,
         attached and used as it is.
    16 -- auto's sketch has half as many words as the index has slots (a page at least: ``Geometry.ghost_for``), the
         idle columns are backed only once an entry has a time to idle (``D_IDLE_ON``), and the versions column
         once a caller asks for a version (``D_VERSIONS_ON``). A segment of version 15 is version 16 with auto's
         sketch as large as the index and every column backed with the tables, attached and used as it is.
    17 -- an index of any number of slots, at most 0.7 full (``index_for``), a key's home slot its tag scaled to
         them (index.py ``Ranged``): 11 to 12 bytes of index an entry of the limit, where a power of two at most
         half full costs 16 to 32. A segment of version 16 is version 17 with a power-of-two index, the home slot the
         tag's low bits, attached and used as it is.
    18 -- the expires column is backed only once an entry has an expiry (``D_EXPIRES_ON``): 8 bytes an entry slot
         saved where nothing expires. A segment of version 17 is version 18 with the column backed with the tables,
         attached and used as it is.
    19 -- narrow entry records (``ENTRY_NARROW``, 32 bytes) where the arena is below 32 GiB and the index below
         2**31 slots (``Geometry.narrow``); wide ones (``ENTRY``) otherwise. A segment of version 18 is version 19
         with wide records whatever its size, attached and used as it is.
"""

from .dtypes import (
    ALIGN, BLOCK_ALIGN, BLOCK_HEADER_NBYTES, BLOCK_OVERHEAD, EMPTY, ENTRY, FEATURE_PICKLE, FEATURES, HEADER,
    HEADER_NBYTES, INDEX_SLOT, INDEX_SLOT_PACKED, KIND, KIND_PREFIX, LAYOUT_VERSION, LOCK_NBYTES, MAGIC,
    MAX_BLOCK_NBYTES, MAX_COUNTER, MAX_KINDS, MAX_PID, MAX_REMOTE_VERSION, MAX_TTL_NS, MAX_VERSION, NEVER, NIL, PAGE,
    SEGMENT_PREFIX, SENTINEL,
)
from .geometry import Geometry, index_for

__all__ = [
    "ALIGN", "BLOCK_ALIGN", "BLOCK_HEADER_NBYTES", "BLOCK_OVERHEAD", "EMPTY", "ENTRY", "FEATURE_PICKLE", "FEATURES",
    "Geometry", "index_for", "HEADER", "HEADER_NBYTES", "INDEX_SLOT", "INDEX_SLOT_PACKED", "KIND", "KIND_PREFIX",
    "LAYOUT_VERSION",
    "LOCK_NBYTES", "MAGIC", "MAX_BLOCK_NBYTES", "MAX_COUNTER", "MAX_KINDS", "MAX_PID", "MAX_REMOTE_VERSION",
    "MAX_TTL_NS", "MAX_VERSION", "NEVER", "NIL", "PAGE", "SEGMENT_PREFIX", "SENTINEL",
]
