"""The bytes of the Redis tier (``shmcache/tier/tiered.py``): how a value is stored in Redis, how an invalidation is
published, and the per-host stats segment.

Redis value. ``REMOTE_MAGIC`` (3 bytes, the last one the format number), the entry's version as a little-endian IEEE
double (8 bytes: Redis's Lua numbers are doubles, exact for integers below 2**53), a flags byte (``F_EXPIRES``: the key
has a time to live, so that a reader asks for it only then and a read is one plain GET otherwise), then the payload the
client sends: the value's tag byte, an 8-byte little-endian checksum, and the value's body as in shared memory
(``shmcache/codec.py``). The checksum is xxh3-64 of the body seeded with the encoded key's xxh3-64 plus the tag, so a
value is never accepted for another key, nor when damage changed it. The version is assigned by Redis, inside the script
that writes, as ``max(previous version + 1, server time in µs)``: it grows with every write of a key, and keeps growing
across a delete as long as the server's clock does. A valid version is an integer from 1 to ``MAX_REMOTE_VERSION``
(``layout/dtypes.py``) and valid flags have no bit but ``F_EXPIRES``; a value (or a reply, or a message) with anything
else is refused, never adopted, and a script treats a previous version out of range as none.

Invalidation message, published on the namespace's channel by the same script that wrote (so no write is ever
visible without its message): the op byte (``OP_KEY`` or ``OP_CLEAR``), the new version (8-byte double), then the
encoded key (for ``OP_CLEAR``, the prefix of the encoded keys cleared: empty for all).

Stats segment ``/dev/shm/shmcache-tier.<cache name>.<namespace>``: a 64-byte header (``TIER_MAGIC``,
``TIER_VERSION``, rows, words per row), then ``TIER_ROWS`` rows of ``TIER_ROW_WORDS`` 8-byte
little-endian words. A process claims one row (an exclusive open-file-description lock on byte ``row`` of the
segment's file) and is its only writer, so counting needs no lock; a row outlives its process and the next claimer
adds to it, so the sums over all rows are the host's totals since the segment was created. Word ``C_<name>`` is
a counter; words from ``C_LATENCY`` on are a histogram of remote call latencies, ``LATENCY_PER_OCTAVE`` buckets
per doubling starting at 1 µs (bucket ``i`` counts calls that took less than ``2 ** ((i + 1) / 4)`` µs).
"""

from __future__ import annotations

import struct

REMOTE_MAGIC = b"SC\x01"
REMOTE_HEADER = struct.Struct("<3sdB")  # magic, version, flags
F_EXPIRES = 1  # flags: the key was given a time to live (a reader then asks Redis how much is left)
F_KNOWN = F_EXPIRES  # every flag bit defined: a value with another bit set is refused
PAYLOAD_HEADER = struct.Struct("<BQ")  # tag, checksum
MESSAGE_HEADER = struct.Struct("<cd")  # op, version
OP_KEY, OP_CLEAR = b"k", b"c"

TIER_SEGMENT_PREFIX = "shmcache-tier."
TIER_MAGIC = 0x3172656974_6d6873  # "shmtier1", little-endian
TIER_VERSION = 1
TIER_HEADER_WORDS = 8  # magic, version, rows, row words, 4 spare: one cache line
H_MAGIC, H_VERSION, H_ROWS, H_ROW_WORDS = range(4)
TIER_ROWS = 256  # processes counting at once; a process finding none free counts privately (see tier/stats.py)
TIER_ROW_WORDS = 128  # 1 KiB: the counters (18 so far, room for 32) and a 96-bucket histogram

COUNTERS = (
    "local_hits",       # get served by the host's shared-memory cache
    "local_misses",     # get that went on to Redis (or would have, with Redis unavailable)
    "remote_hits",      # Redis had the key: the value was returned and copied into the local cache
    "remote_misses",    # Redis did not have it either
    "remote_errors",    # remote call failed (connection refused, timeout, error reply, undecodable value)
    "remote_timeouts",  # of those, the calls that timed out
    "remote_skipped",   # remote call not attempted: Redis failed recently and is not retried before its interval
    "remote_calls",     # remote calls that completed, the latency histogram's count
    "remote_ns",        # their total time
    "puts",             # writes (put, add, replace, cas, incr, touch, delete, pop) that reached Redis
    "local_only_puts",  # writes kept in the local cache only, Redis being unavailable
    "invalidations",    # invalidations applied: the tier's messages and each key of Redis's tracking messages (this
    #                     host's own writes' too: they drop no copy of theirs)
    "stale_fills",      # copies refused: a newer version or invalidation was known, or the read took too long
    "local_clears",     # the namespace's copies dropped at once: a clear (counted as it reaches the listener), a gap
    "computations",     # get_or_compute functions run on this host
    "lock_waits",       # get_or_compute calls that waited for another host computing the key
    "lock_takeovers",   # waits that ended with the lock free and no value: this host computed after all
    "listener_starts",  # times this host's listener (re)subscribed
    "stale_hits",       # get_or_compute calls answered with a stale value (stale_ttl) that set off a refresh
    "refreshes",        # background refreshes of a stale value computed on this host (each also a computation)
    "refresh_failures",  # of those, the ones whose function raised: the stale value is served on
)
(C_LOCAL_HITS, C_LOCAL_MISSES, C_REMOTE_HITS, C_REMOTE_MISSES, C_REMOTE_ERRORS, C_REMOTE_TIMEOUTS, C_REMOTE_SKIPPED,
 C_REMOTE_CALLS, C_REMOTE_NS, C_PUTS, C_LOCAL_ONLY_PUTS, C_INVALIDATIONS, C_STALE_FILLS, C_LOCAL_CLEARS,
 C_COMPUTATIONS, C_LOCK_WAITS, C_LOCK_TAKEOVERS, C_LISTENER_STARTS, C_STALE_HITS, C_REFRESHES,
 C_REFRESH_FAILURES) = range(len(COUNTERS))
C_LATENCY = 32
LATENCY_PER_OCTAVE = 4
LATENCY_BUCKETS = 96  # 1 µs to 2**24 µs (16.8 s); slower calls count in the last bucket
assert len(COUNTERS) <= C_LATENCY and C_LATENCY + LATENCY_BUCKETS <= TIER_ROW_WORDS


def tier_nbytes() -> int:
    """The stats segment's size in bytes."""
    return (TIER_HEADER_WORDS + TIER_ROWS * TIER_ROW_WORDS) * 8


# Open-file-description lock byte, on the LOCAL cache segment's file, held by the one process per host that listens
# for a kind's invalidations: LISTENER_BASE + kind number. It lies above every pin byte (2**62 + 1 + entry slot,
# entry slots < 2**32) and so apart from the rest of the map in shmcache/ofd.py.
LISTENER_BASE = 2**62 + 2**40
