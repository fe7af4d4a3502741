"""Corruption fuzzer: damage the segment at random and check that the cache never hangs, crashes or returns a lie.

Each round, --workers child processes run OPS_PER_ROUND random operations on the cache at once (the workload of
stress.hammer, with verify calls that may repair). Then the parent damages the segment through its own raw mmap of
/dev/shm/shmcache.<name>: bit flips, random bytes, and words chosen to look plausible (0, -1, the old value +-1, slot
numbers, arena offsets, offsets reaching back before the arena or to the header) in the header counters, ring and expiry
words (lines 2-6, and the policy's queue words of line 7), the index, the entry table, the arena, the per-entry columns
(expires, versions, kinds, pins, marks; the marks also on their own), the kind table and, under s3fifo, the ghost (under
auto, its sketch and state words), half of them aimed at words in use; an entry's key length set to 0 or one off
(KEY_LENGTH_SHARE of the rounds); and up to HEADER_WORDS_MAX header words of lines 2-7 (any of them: counters, limits,
default_ttl, version clock, next_expiry, the configuration's checksums, the policy's state...) set to extremes (0, -1,
2**63 - 1, -2**63, just past the version and counter bounds, random), and a configuration word set to a small value in
its range (CONFIG_SHARE of the rounds), unless --no-header-words. Run as root, the lock damage also names a live process
of another user (nobody) as the owner, with or without the dirty word at "repairing". Line 0 (identity and geometry),
line 1 (the lock's words) and line 7's identity words (policy, ghost_slots: written once at creation and checked on
attach as line 0 is) are left alone: attaching to a segment whose identity is damaged fails by design. With --identity,
each round also damages one of those identity words, checks that attaching then either works or raises LayoutError, and
restores the word. Every REPAIR_EVERY rounds and at the end, a child calls verify(repair_damage=True), then verify()
must be ok, the stats within the limits, and every key must read back.

In the entry table a word is one field of a record, at its own width: a wide record's fields are words, a narrow
one's 4 bytes (its checksum a word, its block offset in 8-byte units, damaged half the time as a byte offset).

Every operation must work or raise a ShmCacheError; none may run past ROUND_SECONDS (children dump their stacks
first, then are SIGKILLed), die, or return a wrong value (a put that returns False is one, but under keep).

--policy chooses the cache's eviction policy (default auto); --policy all runs each of shmcache.POLICIES in turn,
--seconds split equally, and prints one summary line for each.

Reading the summary line:

    fuzz: policy=P ops=N corruptions=C lock_corruptions=L lock_holder_damages=H errors=E refused=R wrong=0
          foreign=0 hangs=0 crashes=0 unverified=0 repairs=P not_admitted=A snapshots=N restores=M unlocked_reads=U
          read_retries=T read_fallbacks=F verify=ok seconds=S workers=W

policy       the cache's eviction policy (lru, s3fifo or keep)
ops          operations run by the children; corruptions: spots damaged (lock_corruptions of them in the lock's words)
lock_holder_damages   rounds in which a child damaged the lock while holding it, then died
errors       ShmCacheError raised (CorruptionError, LockTimeout...): the expected reaction to damage
refused      attaches refused with LayoutError right after --identity damage (any other refusal is a failure)
wrong        gets that returned a value not put under that key; must be 0
foreign      exceptions that are not ShmCacheError (IndexError, ValueError...); must be 0
hangs        children still running after ROUND_SECONDS; must be 0
crashes      children that died (segfault, abort, uncaught error); must be 0
unverified   repair phases after which verify() or the read-back failed; must be 0
repairs      repair phases that found damage (the cache's own stats().recoveries live in the damaged header)
not_admitted puts that returned False: under keep, a new key the full cache did not take; or room views pin
snapshots    snapshots of the damaged cache the workers wrote (each entry copied is checked against its checksum: a
             damaged one is left out, never written); restores: restores of them into it, whose values the reads
             check like any other
unlocked_reads  lookups answered without the lock over the whole run (s3fifo and keep, compiled; summed from the
             reader slots as stats() sums them, but not from the workload's last clear(); the damage reaches the
             slots too); read_retries, read_fallbacks: reads begun again, and those that took the lock
verify       ok when the last repair phase and a final verify() in the parent passed

The exit status is 1 when any "must be" above does not hold. The run stops at the first round that fails (unless
--keep-going) and prints the damage in effect on stderr.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from shmcache import LayoutError, SharedCache, ShmCacheError
from shmcache.layout import Geometry
from shmcache.layout.dtypes import (
    D_WORDS, GHOST_WAYS, H_DEFAULT_TTL, H_DIRTY, H_GHOST_SLOTS, H_INDEX_SLOTS, H_LOCK_OFF, H_MAX_ENTRIES,
    H_MAX_RETAINED, H_POLICY, H_SAVED_MAX_ENTRIES, H_SAVED_TTL, H_SMALL, H_SMALL_FIRST, H_UNUSED_NEXT, HEADER, KIND,
    POLICY_AUTO, SKETCH_BLOCK_WORDS,
)

from .common import (
    ERRORS, FOREIGN, MIX, NF, NOT_ADMITTED, OPS, REFUSED, REPAIRS, RESTORES, SNAPSHOTS, UNVERIFIED, WRONG, Workload,
    exit_on_sigterm, final_check, lifetime_reads, make_parser, raw_map, reap, run_policies, start, total,
    unlink_quietly,
)

DEFAULT_SECONDS = 10.0
DEFAULT_WORKERS = 4
DEFAULT_SEED = 1
DEFAULT_KEYS = 2000
DEFAULT_CAPACITY_BYTES = 256 * 1024
DEFAULT_MAX_ENTRIES = 512
DEFAULT_MAX_VALUE_BYTES = 16 * 1024
OPS_PER_ROUND = 150  # per child
CORRUPT_MAX = 4  # spots damaged after each round: 1 to this many
REPAIR_EVERY = 5  # rounds
IDENTITY_OPS = 20  # operations tried after attaching to a segment with a damaged identity word
ROUND_SECONDS = 10.0  # a child running longer than this is hung
LOCK_SECONDS = 3.0  # children's lock_timeout: a hung holder shows up as LockTimeout in the others
AIMED_SHARE = 0.5
LOCK_SHARE = 0.1  # odds that a spot damaged between rounds is in the lock's words
LOCK_HOLDER_SHARE = 0.25  # odds that a round has a child that damages the lock while holding it, then dies
KEY_LENGTH_SHARE = 0.3  # odds that a round also sets an entry's key length to 0 or one off
CONFIG_SHARE = 0.2  # odds that a round also sets a configuration word to a small value in its range
LOCK_WORDS_NBYTES = 16  # the lock's words (12 bytes) and the first bytes after them
# Odds of damaging each region (the ghost: under s3fifo, and auto, whose sketch and state words it holds).
# The stripes (layout version 11): their open mask and sequence words, any value valid (an odd word sends its
# stripe's reads to the lock until the next repair evens it); and (version 12) the held entries' list head and
# counts on the mask's line, which an aimed damage hits, as it hits an entry's slot word (HELD_SLOT: -1).
# The idle region (version 14): the default time to idle and its checksum (16: and the columns' switch word and its
# count), and an entry's tti and deadline.
REGIONS = {"header": 3, "index": 2, "entries": 3, "arena": 2, "columns": 1, "marks": 0.5, "kinds": 0.5, "ghost": 0.5,
           "stripes": 0.5, "idle": 0.5}
# Header words an aimed damage of the header hits: the occupancy, limit, ring and slot-allocator words of lines 3-4,
# and the small queue's words of line 7 (under lru and keep they must stay SENTINEL and 0).
AIMED_HEADER_OFFS = [192 + 8 * i for i in range(10)] + [8 * H_SMALL_FIRST, 8 * H_SMALL]
# The identity words --identity damages (one a round): line 0's (but index_slots, the index in force since layout
# version 10, which the repair restores) and line 7's (policy, ghost_slots).
IDENTITY_OFFS = [8 * w for w in range(8) if w != H_INDEX_SLOTS] + [8 * H_POLICY, 8 * H_GHOST_SLOTS]
FUZZ_MIX = {**MIX, "verify": 1.0}


def _word(mm, off: int) -> int:
    return int.from_bytes(mm[off : off + 8], "little", signed=True)


def _put_word(mm, off: int, v: int) -> None:
    mm[off : off + 8] = (v & (2**64 - 1)).to_bytes(8, "little")


# An entry record's fields are read and damaged by name, at their own width, through the segment's record dtype
# (g.entry_dtype): a wide record's are words; a narrow one's (ENTRY_NARROW) are 4 bytes (the checksum a word), its
# block offset in 8-byte units, and it keeps no fingerprint.
def _field_at(g: Geometry, e: int, name: str) -> tuple[int, int, bool]:
    """(offset, width, signed) of entry ``e``'s record field ``name``."""
    dt, start = g.entry_dtype.fields[name][:2]
    return g.entries_off + e * g.entry_nbytes + start, dt.itemsize, dt.kind == "i"


def _field_of(g: Geometry, off: int) -> tuple[str, int]:
    """(name, entry slot) of the record field that holds byte ``off`` of the entry table."""
    e, rel = divmod(off - g.entries_off, g.entry_nbytes)
    for name in g.entry_dtype.names:
        dt, start = g.entry_dtype.fields[name][:2]
        if start <= rel < start + dt.itemsize:
            return name, e
    raise AssertionError(f"no record field at {off}")


def _field(mm, spot: tuple[int, int, bool]) -> int:
    off, n, signed = spot
    return int.from_bytes(mm[off : off + n], "little", signed=signed)


def _put_field(mm, spot: tuple[int, int, bool], v: int) -> None:
    """Write the low bytes of ``v`` (two's complement) to the field: any bit pattern its width holds."""
    off, n, _ = spot
    mm[off : off + n] = (v & ((1 << 8 * n) - 1)).to_bytes(n, "little")


def _mutate(old: int, rng: random.Random, g: Geometry, bits: int = 64) -> int:
    """A damaged value for a field of ``bits`` bits holding ``old`` (a bit flipped within them, among others)."""
    return rng.choice((0, -1, 1, old + 1, old - 1, old ^ (1 << rng.randrange(bits)), rng.randrange(g.entry_slots + 2),
                       rng.randrange(g.index_slots), rng.randrange(0, g.arena_nbytes, 8),
                       -rng.randrange(8, g.arena_off, 8), rng.randrange(-g.arena_off, 512 - g.arena_off, 8),
                       rng.getrandbits(64)))


def _bounds(g: Geometry) -> dict[str, tuple[int, int]]:
    return {"header": (128, 424), "index": (g.index_off, g.index_off + g.index_slots * g.index_slot_nbytes),
            "entries": (g.entries_off, g.entries_off + g.entry_slots * g.entry_nbytes),
            "arena": (g.arena_off, g.arena_off + g.arena_nbytes),
            "columns": (g.expires_off, g.kind_table_off),  # expires, versions, kinds, pins, marks
            "marks": (g.marks_off, g.marks_off + g.entry_slots),
            "kinds": (g.kind_table_off, g.kind_table_off + 4 * KIND.itemsize),  # the records in use
            **({"ghost": (g.ghost_off, g.ghost_off + 8 * g.ghost_slots)} if g.ghost_slots else {}),
            **({"stripes": (g.stripes_off, g.stripes_off + g.stripes_nbytes)} if g.stripes_nbytes else {}),
            **({"idle": (g.idle_off, g.idle_end)} if g.version >= 14 else {})}


def _aim(mm, g: Geometry, region: str, rng: random.Random) -> int | None:
    """An offset in ``region`` that a structure in use points at, or None."""
    e = rng.randrange(min(max(_word(mm, H_UNUSED_NEXT * 8), 1), g.entry_slots))
    if region == "entries":  # one of the record's fields (its first byte)
        return _field_at(g, e, rng.choice(g.entry_dtype.names))[0]
    if region == "header":
        return rng.choice(AIMED_HEADER_OFFS)
    if region == "marks":  # the entry's marks byte (s3fifo: its counter and queue bit; else 0)
        return g.marks_off + e
    if region == "ghost":  # a slot in use of a group, if it has one (auto: one of its state words, half the time)
        if g.policy == POLICY_AUTO and rng.random() < 0.5:
            return g.ghost_off + 8 * rng.randrange(SKETCH_BLOCK_WORDS)
        group = g.ghost_off + 8 * GHOST_WAYS * rng.randrange(g.ghost_slots // GHOST_WAYS)
        used = [off for off in range(group, group + 8 * GHOST_WAYS, 8) if _word(mm, off)]
        return rng.choice(used) if used else None
    if region == "stripes":  # the open mask, the held list's head and its two counts
        return g.stripes_off + 8 * rng.randrange(4)
    if region == "idle":  # the default's two words (and 16's switches and D_SWITCH_BUMPS), or the entry's tti,
        #                   deadline or expiry (16, 18: a column not yet in use is damaged in the file, unseen by
        #                   the mappings)
        words = D_WORDS if g.lazy_columns else 2
        return rng.choice((g.idle_off + 8 * rng.randrange(words), g.ttis_off + 8 * e, g.deadlines_off + 8 * e,
                           g.expires_off + 8 * e))
    if region == "index":
        s = _field(mm, _field_at(g, e, "slot"))
        n = g.index_slot_nbytes  # (a slot of one word from layout 15, of two before)
        return g.index_off + n * s + 8 * rng.randrange(n // 8) if 0 <= s < g.index_slots else None
    off = _field(mm, _field_at(g, e, "off")) << (3 if g.narrow else 0)  # the block header, or the start of the value
    return g.arena_off + off + rng.choice((0, 8)) if 0 <= off < g.arena_nbytes - 16 else None


def corrupt(mm, g: Geometry, rng: random.Random) -> str:
    """Damage one spot of the segment; returns what was done, for the log."""
    bounds = _bounds(g)
    regions = [r for r in REGIONS if r in bounds]
    region = rng.choices(regions, weights=[REGIONS[r] for r in regions])[0]
    lo, hi = bounds[region]
    off = _aim(mm, g, region, rng) if rng.random() < AIMED_SHARE else None
    off = rng.randrange(lo, hi) if off is None else off
    if rng.random() < 0.4:
        old = mm[off]
        mm[off] = old ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        return f"{region} byte at {off}: {old} -> {mm[off]}"
    if region == "entries":  # the whole field, at its width; a narrow offset half the time mutated in bytes
        name, e = _field_of(g, off)
        spot = _field_at(g, e, name)
        old = _field(mm, spot)
        if name == "off" and g.narrow and rng.random() < 0.5:
            new = _mutate(old << 3, rng, g, 35) >> 3  # (plausible byte offsets in the arena, as a wide record gets)
        else:
            new = _mutate(old, rng, g, 8 * spot[1])
        _put_field(mm, spot, new)
        return f"entry {e} {name} at {spot[0]}: {old} -> {_field(mm, spot)}"
    off &= ~7
    old, new = _word(mm, off), _mutate(_word(mm, off), rng, g)
    _put_word(mm, off, new)
    return f"{region} word at {off}: {old} -> {_word(mm, off)}"


def _gone_tid() -> int:
    """A thread id that no thread has: the pid of a child that has exited and been reaped."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _judgeable(tid: int) -> bool:
    """Whether this process can tell that ``tid``'s process does not map the cache: it may read its maps. (Where it
    cannot -- PID 1 in some sandboxes, even for root -- shmcache/lock.py must assume that a process of root may hold
    the lock, so a futex word naming it is that documented limit, not damage a repair can find.)"""
    try:
        with open(f"/proc/{tid}/maps", "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


def corrupt_lock(mm, rng: random.Random, stranger: int, foreigner: int | None = None) -> str:
    """Damage the lock's words in ``mm`` (a mapping of the segment, or of its first page); returns what was done.
    The words (shmcache/lock.py): futex 0 (holder tid | WAITERS), holder slot + 1 at 4, wake count at 8, then bytes
    never read. ``stranger``: the pid of a live process that does not map the cache; ``foreigner``: one of another
    user (that could never open the segment), where the fuzzer can make one. (A word naming a live thread of the
    cache, with its holder slot, is the documented limit of shmcache/lock.py: calls time out until it calls.)"""
    lock = H_LOCK_OFF
    kinds = ("random bytes", "random word", "gone owner", "stranger owner", "waiters only", "slot garbage",
             "slot unheld", "own tid", "wakes", "all ff", "all zero", "all zero held")
    what = rng.choice(kinds + (("foreign owner", "foreign owner repairing") if foreigner else ()))
    words: dict[int, int] = {}
    if what == "random bytes":
        off = lock + rng.randrange(LOCK_WORDS_NBYTES)
        n = rng.randint(1, lock + LOCK_WORDS_NBYTES - off)
        mm[off : off + n] = rng.randbytes(n)
        return f"lock: {n} random bytes at +{off - lock}"
    if what == "random word":
        words[rng.choice((0, 4, 8))] = rng.getrandbits(32)
    elif what == "gone owner":
        words[0] = _gone_tid() | rng.choice((0, 0x80000000))
    elif what == "stranger owner":  # a thread id reused by a process that has nothing to do with the cache
        words[0] = stranger
        words[4] = 0
    elif what.startswith("foreign owner"):  # a live thread of another user's process, with the dirty word at
        words[0] = foreigner                # "repairing" too: no progress moves, so waiters wait one timeout
        words[4] = 0
        if what.endswith("repairing"):
            _put_word(mm, H_DIRTY * 8, 2)
    elif what == "waiters only":
        words[0] = 0x80000000
    elif what == "slot garbage":
        words[4] = rng.choice((0xFFFFFFFF, 2**20 + 2, rng.getrandbits(32)))
    elif what == "slot unheld":
        words[4] = 2**20  # the last holder slot, held by no handle of the fuzzer's few processes
    elif what == "own tid":  # the damaging process's own thread: it exits, so the word names a thread gone
        words[0] = threading.get_native_id()
    elif what == "wakes":
        words[8] = rng.getrandbits(32)
    else:
        mm[lock : lock + LOCK_WORDS_NBYTES] = (b"\xff" if what == "all ff" else b"\0") * LOCK_WORDS_NBYTES
        if what == "all zero held":
            words[0] = 1 if _judgeable(1) else _gone_tid()  # thread 1, where judgeable
    for off, v in words.items():
        mm[lock + off : lock + off + 4] = v.to_bytes(4, "little")
    return f"lock: {what} " + " ".join(f"+{off}={v:#x}" for off, v in words.items())


def lock_damage_child(name: str, row: int, seed: int, counts, stranger: int) -> None:
    """Take the lock while the workers run, damage its bytes, and exit without unlocking."""
    _watchdog()
    try:
        cache = SharedCache(name, create=False, lock_timeout=LOCK_SECONDS)
        time.sleep(random.Random(seed).random() * 0.05)  # somewhere in the workers' round
        cache._guard.hold()
    except ShmCacheError:
        counts[row * NF + ERRORS] += 1
        os._exit(0)
    mm = raw_map(name, writable=True)
    what = corrupt_lock(mm, random.Random(seed), stranger)
    print(f"lock damaged by its holder ({os.getpid()}): {what}", file=sys.stderr)
    os._exit(0)  # holding the lock, like a crash: no unlock, no cleanup


# Header words the header-word damage aims at: every word of lines 2-7 (counters, dirty, occupancy, limits, ring,
# slot allocator, display words, version clock, expiry bound, default time to live, kinds, writing, the saved
# configuration, the policy's state and counters) but line 7's identity words. Those and line 0 are the --identity
# test's (attach checks them: damaged, a new handle is refused with LayoutError by design); line 1 is the lock's.
HEADER_WORDS = [n for n in HEADER.names if n != "lock" and (HEADER.fields[n][1] >= 128 or n == "index_slots")
                and HEADER.fields[n][1] not in IDENTITY_OFFS]
HEADER_WORDS_MAX = 2  # header words damaged after each round: 0 to this many


def damage_header_word(mm, rng: random.Random) -> str:
    """Set one header word to a value chosen to be out of its range or at an extreme (0, -1, 2**63 - 1, -2**63,
    just above the version and counter bounds, random), or plausibly off by one; returns what was done."""
    word = rng.choice(HEADER_WORDS)
    off = HEADER.fields[word][1]
    old = _word(mm, off)
    new = rng.choice((0, -1, 1, 2**63 - 1, -(2**63), 2**62, 2**62 + 1, 2**53 + 1, -rng.randrange(1, 2**40),
                      rng.randrange(2**40), rng.getrandbits(64) - 2**63, old + 1, old - 1, old * 2, -old))
    _put_word(mm, off, new)
    return f"header word {word}: {old} -> {_word(mm, off)}"


def damage_key_length(mm, g: Geometry, rng: random.Random) -> str:
    """Set the key length of an entry in use to 0 or one off: the key then read from the arena is a prefix, or runs
    one byte into the next block (the listings must never hand it out); returns what was done."""
    e = rng.randrange(1, min(max(_word(mm, H_UNUSED_NEXT * 8), 2), g.entry_slots))
    spot = _field_at(g, e, "key_nbytes")
    old = _field(mm, spot)
    _put_field(mm, spot, rng.choice((0, old + 1, old - 1)))
    return f"entry {e} key length: {old} -> {_field(mm, spot)}"


CONFIG_WORDS = (H_DEFAULT_TTL, H_MAX_ENTRIES, H_MAX_RETAINED, H_SAVED_TTL, H_SAVED_MAX_ENTRIES)


def damage_config_word(mm, rng: random.Random) -> str:
    """Set a configuration word (or its saved copy) to a small value in its range: a default time to live of a few
    ns that would expire every put at once, a limit of 1 to 3; returns what was done."""
    w = rng.choice(CONFIG_WORDS)
    old = _word(mm, w * 8)
    _put_word(mm, w * 8, rng.randint(1, 3) if w != H_DEFAULT_TTL and w != H_SAVED_TTL else rng.randint(1, 1000))
    return f"config word {w}: {old} -> {_word(mm, w * 8)}"


def _foreigner() -> subprocess.Popen | None:
    """A live sleeping process of another user (nobody), when this one may make it (root); else None."""
    if os.geteuid() != 0:
        return None
    try:
        import pwd

        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None
    return subprocess.Popen(["sleep", "86400"], user=uid, group=uid, extra_groups=[])


def _watchdog() -> None:
    faulthandler.enable()  # a segfault prints the Python stack
    faulthandler.dump_traceback_later(ROUND_SECONDS - 1.0)  # so does a hang, just before the parent kills us


def ops_child(name: str, row: int, seed: int, counts, nops: int, nkeys: int, max_nbytes: int,
              snapshot_dir: str | None = None) -> None:
    """Attach and run ``nops`` random operations, counting into row ``row`` (snapshots of the damaged cache and
    restores of them among them, given ``snapshot_dir``)."""
    _watchdog()
    base = row * NF
    try:
        cache = SharedCache(name, create=False, lock_timeout=LOCK_SECONDS)
    except LayoutError:
        counts[base + REFUSED] += 1
        return
    except ShmCacheError:
        counts[base + ERRORS] += 1
        return
    with cache:
        try:  # it opens a key kind: damage met there raises like any operation's
            w = Workload(cache, random.Random(seed), counts, row, nkeys=nkeys, max_nbytes=max_nbytes,
                         mix=FUZZ_MIX, strict=False, snapshot_dir=snapshot_dir)
        except ShmCacheError:
            counts[base + ERRORS] += 1
            return
        for _ in range(nops):
            w.step()


def repair_child(name: str, row: int, counts, nkeys: int) -> None:
    """verify(repair_damage=True), then verify() and the read-back of every key must pass."""
    _watchdog()
    base = row * NF
    try:
        with SharedCache(name, create=False, lock_timeout=LOCK_SECONDS) as cache:
            counts[base + REPAIRS] += not cache.verify(repair_damage=True).ok
            ok, wrong = final_check(cache, nkeys, counters=False)  # damage sets counters to anything in range
            counts[base + OPS] += nkeys
            counts[base + WRONG] += wrong
            counts[base + UNVERIFIED] += not ok
    except Exception as exc:
        counts[base + (ERRORS if isinstance(exc, ShmCacheError) else FOREIGN)] += 1
        counts[base + UNVERIFIED] += 1
        traceback.print_exc()


def run(ctx, jobs: list) -> tuple[int, int]:
    """Run ``(target, args)`` children at once: (children hung past ROUND_SECONDS, children that died)."""
    procs = [start(ctx, target, args) for target, args in jobs]
    stuck = reap(procs, ROUND_SECONDS)
    crashed = [p for p in procs if p not in stuck and p.exitcode != 0]
    for p in stuck + crashed:
        print(f"child {p.pid} {'hung' if p in stuck else f'died with status {p.exitcode}'}", file=sys.stderr)
    return len(stuck), len(crashed)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(
        __doc__, seconds=DEFAULT_SECONDS, workers=DEFAULT_WORKERS, seed=DEFAULT_SEED, keys=DEFAULT_KEYS,
        capacity_bytes=DEFAULT_CAPACITY_BYTES, max_entries=DEFAULT_MAX_ENTRIES, max_value_bytes=DEFAULT_MAX_VALUE_BYTES,
    )
    parser.add_argument("--identity", action="store_true", help="also damage an identity word (line 0, or line 7's "
                        "policy and ghost_slots) and expect LayoutError on attach")
    parser.add_argument("--keep-going", action="store_true", help="go on after a round that failed")
    parser.add_argument("--lock-share", type=float, default=LOCK_SHARE, metavar="P",
                        help=f"odds that a spot damaged between rounds is in the lock's words (default {LOCK_SHARE})")
    parser.add_argument("--no-header-words", dest="header_words", action="store_false",
                        help="do not also set header words of lines 2-5 to extreme or out-of-range values")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    return run_policies("fuzz", args, _run)


def _run(args) -> tuple[dict, bool]:
    """One run under ``args.policy``: (summary fields, failed)."""
    rng = random.Random(args.seed)
    ctx = mp.get_context(args.start_method)
    name = f"stress-fuzz-{args.policy}-{os.getpid()}"
    counts = ctx.RawArray("q", (args.workers + 1) * NF)
    solo = args.workers  # the counts row of the repair and identity children
    cache = SharedCache(name, capacity_bytes=args.capacity_bytes, max_entries=args.max_entries, create=True,
                        policy=args.policy)
    g = cache._seg.geometry  # the regions damaged are the segment's (under s3fifo the ghost moves the arena)
    hangs = crashes = corruptions = rounds = lock_corruptions = lock_rounds = 0
    ok, elapsed, log = False, 0.0, []
    unlocked = (0, 0, 0)

    def failures() -> int:  # a LayoutError outside the identity test means the cache damaged its identity itself
        return hangs + crashes + sum(total(counts, f) for f in (WRONG, FOREIGN, UNVERIFIED)) + total(
            counts, REFUSED, solo)

    def repair() -> None:
        nonlocal hangs, crashes
        h, c = run(ctx, [(repair_child, (name, solo, counts, args.keys))])
        hangs, crashes = hangs + h, crashes + c

    t0 = time.monotonic()
    stranger = subprocess.Popen(["sleep", "86400"])  # a live process that maps nothing of the cache
    foreigner = _foreigner()  # one of another user, which could never open the segment
    foreign_pid = foreigner.pid if foreigner else None
    snapshots = tempfile.mkdtemp(prefix="shmcache-fuzz-")  # the workers' snapshot files
    try:
        mm = raw_map(name, writable=True)
        while time.monotonic() - t0 < args.seconds:
            rounds += 1
            before = failures()
            jobs = [(ops_child, (name, row, rng.randrange(2**63), counts, OPS_PER_ROUND, args.keys,
                                 args.max_value_bytes, snapshots)) for row in range(args.workers)]
            if rng.random() < LOCK_HOLDER_SHARE:
                jobs.append((lock_damage_child, (name, solo, rng.randrange(2**63), counts, stranger.pid)))
                lock_rounds += 1
            h, c = run(ctx, jobs)
            hangs, crashes = hangs + h, crashes + c
            if args.identity:
                off = rng.choice(IDENTITY_OFFS)
                saved = _word(mm, off)
                _put_word(mm, off, _mutate(saved, rng, g) or 1)  # a zero magic means "being created": attach waits
                log.append(f"identity word at {off}: {saved} -> {_word(mm, off)}")
                try:
                    h, c = run(ctx, [(ops_child, (name, solo, rng.randrange(2**63), counts, IDENTITY_OPS, args.keys,
                                                  args.max_value_bytes))])
                finally:
                    _put_word(mm, off, saved)
                hangs, crashes, corruptions = hangs + h, crashes + c, corruptions + 1
            for _ in range(rng.randint(1, CORRUPT_MAX)):
                lock_spot = rng.random() < args.lock_share
                log.append(corrupt_lock(mm, rng, stranger.pid, foreign_pid) if lock_spot else corrupt(mm, g, rng))
                corruptions += 1
                lock_corruptions += lock_spot
            if rng.random() < KEY_LENGTH_SHARE:
                log.append(damage_key_length(mm, g, rng))
                corruptions += 1
            if args.header_words and rng.random() < CONFIG_SHARE:
                log.append(damage_config_word(mm, rng))
                corruptions += 1
            for _ in range(rng.randint(0, HEADER_WORDS_MAX) if args.header_words else 0):
                log.append(damage_header_word(mm, rng))
                corruptions += 1
            if rounds % REPAIR_EVERY == 0:
                repair()
            if failures() > before:
                print(f"round {rounds} failed; damage in effect:\n  " + "\n  ".join(log), file=sys.stderr)
                if not args.keep_going:
                    break
            if rounds % REPAIR_EVERY == 0:
                log.clear()
        elapsed = time.monotonic() - t0
        before = failures()
        repair()
        mm.close()
        if failures() == before:
            report = cache.verify()
            ok = report.ok
            if not ok:
                print("the final verify() failed after a repair phase that passed:\n  " + "\n  ".join(report.problems),
                      file=sys.stderr)
            unlocked = lifetime_reads(cache)
    finally:
        for p in (stranger, foreigner):
            if p is not None:
                p.kill()
                p.wait()
        cache.close()
        unlink_quietly(name)
        shutil.rmtree(snapshots, ignore_errors=True)
    fields = {"ops": total(counts, OPS), "corruptions": corruptions, "lock_corruptions": lock_corruptions,
              "lock_holder_damages": lock_rounds}
    fields.update({k: total(counts, f) for k, f in (("errors", ERRORS), ("refused", REFUSED), ("wrong", WRONG),
                                                   ("foreign", FOREIGN))})
    fields.update(hangs=hangs, crashes=crashes, unverified=total(counts, UNVERIFIED), repairs=total(counts, REPAIRS),
                  not_admitted=total(counts, NOT_ADMITTED), snapshots=total(counts, SNAPSHOTS),
                  restores=total(counts, RESTORES), unlocked_reads=unlocked[0], read_retries=unlocked[1],
                  read_fallbacks=unlocked[2], verify="ok" if ok else "FAILED",
                  seconds=round(elapsed, 1), workers=args.workers)
    failed = bool(fields["wrong"] or fields["foreign"] or hangs or crashes or fields["unverified"] or not ok
                  or total(counts, REFUSED, solo))
    return fields, failed


if __name__ == "__main__":
    sys.exit(main())
