"""A cache resized while it serves (``SharedCache.resize``): its capacity grows and shrinks within the
``max_capacity_bytes`` it was made for, its entry limit within its entry table; what it keeps reads back whole, what
a shrink gives back leaves /dev/shm, and a resize cut short at any point leaves a cache the next call repairs."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest

from shmcache import CorruptionError, PinnedError, SharedCache
from shmcache.layout.dtypes import H_CAPACITY, H_DIRTY, H_UNUSED_NEXT

from .conftest import unique_name
from .workers import check_value, make_value, reap

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]
KIB, MIB = 2**10, 2**20


def _occupied(c: SharedCache) -> int:
    return os.fstat(c._seg.fd).st_blocks * 512


def _fill(c: SharedCache, keys, seq: int = 0, nbytes: int = 900) -> None:
    for k in keys:
        c.put(k, make_value(k, seq, nbytes))


def _read_back(c: SharedCache, keys) -> int:
    """How many of ``keys`` the cache holds, each checked to be the value made for it."""
    found = 0
    for k in keys:
        v = c.get(k)
        if v is not None:
            check_value(k, v)
            found += 1
    return found


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "keep"])
def test_resize_grows_keeping_every_entry_and_shrinks_by_the_policy(name, policy):
    c = SharedCache(name, capacity_bytes=256 * KIB, max_entries=4096, create=True, policy=policy)
    try:
        assert c.capacity_bytes == 256 * KIB and c.max_capacity_bytes == 16 * 256 * KIB
        keys = [f"k{i}" for i in range(2000)]
        _fill(c, keys[:400])
        held = len(c)
        assert 0 < held < 400
        c.resize(capacity_bytes=3 * MIB)
        assert c.capacity_bytes == 3 * MIB and c.limits().max_retained_bytes == 3 * MIB
        assert _read_back(c, keys[:400]) == held  # no entry lost on the way up
        _fill(c, keys[400:2000])
        s = c.stats()
        assert s.capacity_bytes == 3 * MIB and s.resizes == 1 and s.retained_bytes <= 3 * MIB
        grown = _occupied(c)
        if policy == "lru":  # the most recently read survive a shrink
            recent = keys[1900:2000]
            assert _read_back(c, recent) == len(recent)
        c.resize(capacity_bytes=256 * KIB)
        assert c.stats().resizes == 2 and c.stats().retained_bytes <= 256 * KIB
        assert c.verify().ok
        if policy == "lru":
            assert _read_back(c, recent) == len(recent)
        kept = _read_back(c, keys)
        assert kept == len(c) > 0
        # Its memory given back (one process, so nobody reads without the lock elsewhere): the arena past the
        # smaller ring is a hole again.
        assert _occupied(c) < grown / 2, (_occupied(c), grown)
        _fill(c, keys[:500], seq=1)  # and it serves on, within the smaller ring
        assert c.verify().ok and c.stats().retained_bytes <= 256 * KIB
        _read_back(c, keys)
    finally:
        c.close()


def test_resize_refuses_what_the_cache_was_not_made_for(name):
    with SharedCache(name, capacity_bytes=64 * KIB, max_entries=64, max_capacity_bytes=1 * MIB, create=True) as c:
        with pytest.raises(ValueError, match="max_capacity_bytes"):
            c.resize(capacity_bytes=2 * MIB)
        with pytest.raises(ValueError, match="1024 entries"):
            c.resize(max_entries=16 * 64 + 1)  # the tables are reserved for 16 times the max_entries of creation
        with pytest.raises(ValueError, match="positive"):
            c.resize(capacity_bytes=0)
        with pytest.raises(TypeError):
            c.resize(capacity_bytes=1.5)
        c.resize(capacity_bytes=1 * MIB, max_entries=10)
        assert (c.capacity_bytes, c.limits().max_entries) == (1 * MIB, 10)
    with pytest.raises(ValueError, match="at least capacity_bytes"):
        SharedCache(unique_name(), capacity_bytes=2 * MIB, max_capacity_bytes=1 * MIB, create=True)


def test_an_opener_with_another_size_resizes_the_cache(name):
    with SharedCache(name, capacity_bytes=64 * KIB, max_entries=64, create=True) as first:
        _fill(first, [f"k{i}" for i in range(40)], nbytes=100)
        with SharedCache(name) as plain:  # sizes omitted: the cache as it is
            assert plain.capacity_bytes == 64 * KIB
        with SharedCache(name, capacity_bytes=512 * KIB, max_entries=32) as newest:
            assert newest.capacity_bytes == 512 * KIB and newest.limits().max_entries == 32
        s = first.stats()  # seen identically by every process
        assert (s.capacity_bytes, s.max_entries, s.resizes, s.entries) == (512 * KIB, 32, 1, 32)
        with SharedCache(name, max_entries=65) as more:  # past the creation's limit: the tables grow
            assert more.limits().max_entries == 65 == first.limits().max_entries
        assert first.stats().resizes == 2
        with pytest.raises(ValueError, match="shmcache rm"):
            SharedCache(name, max_entries=16 * 64 + 1)
        with pytest.raises(ValueError, match="shmcache rm"):
            SharedCache(name, policy="s3fifo")
        with pytest.raises(ValueError, match="max_capacity_bytes"):
            SharedCache(name, max_capacity_bytes=first.max_capacity_bytes * 2)
        assert _read_back(first, [f"k{i}" for i in range(40)]) == 32 and first.verify().ok


def test_set_limits_above_the_capacity_grows_it(name):
    with SharedCache(name, capacity_bytes=64 * KIB, max_entries=64, create=True) as c:
        c.set_limits(max_retained_bytes=32 * KIB)
        assert c.capacity_bytes == 64 * KIB and c.stats().resizes == 0
        c.set_limits(max_retained_bytes=256 * KIB)
        assert c.capacity_bytes == 256 * KIB and c.limits().max_retained_bytes == 256 * KIB
        assert c.stats().resizes == 1
        with pytest.raises(ValueError, match="max_capacity_bytes"):
            c.set_limits(max_retained_bytes=c.max_capacity_bytes + 1)


def test_a_shrink_keeps_pinned_blocks_or_refuses(name):
    c = SharedCache(name, capacity_bytes=256 * KIB, max_entries=1024, create=True)
    try:
        c.resize(capacity_bytes=2 * MIB)
        keys = [f"k{i}" for i in range(1500)]
        for k in keys:
            c.put(k, os.urandom(1200))
        last = keys[-1]  # written last: near the end of the ring, far past a small arena
        with c.view(last):
            with pytest.raises(PinnedError):
                c.resize(capacity_bytes=64 * KIB)
            assert c.capacity_bytes == 2 * MIB and c.verify().ok
        c.resize(capacity_bytes=64 * KIB)
        assert c.capacity_bytes == 64 * KIB and c.verify().ok
    finally:
        c.close()


def test_a_damaged_capacity_word_is_repaired_from_the_checksums(name):
    with SharedCache(name, capacity_bytes=64 * KIB, max_entries=64, create=True) as c:
        c.resize(capacity_bytes=200 * KIB)
        _fill(c, [f"k{i}" for i in range(30)], nbytes=100)
        for garbage in (0, 7, 150 * KIB, c.max_capacity_bytes, -1, 2**62):
            recovered = c.stats().recoveries
            c._h[H_CAPACITY] = garbage
            with SharedCache(name, create=False) as attacher:  # a handle that first reads the word damaged
                seg = attacher._seg  # (its ring from the word as it finds it: damaged, or repaired by a call)
                assert seg.ring() in (seg.geometry.ring_nbytes(w, seg.limit) for w in (garbage, 200 * KIB))
            # (an attacher that found the configuration failing its checksums took its tables under the lock, which
            # repaired it: then the handle's verify finds nothing left)
            report = c.verify(repair_damage=True)
            assert not report.ok or garbage == 200 * KIB or c.stats().recoveries > recovered
            assert c.capacity_bytes == 200 * KIB and c.limits().max_retained_bytes == 200 * KIB
            assert c.verify().ok and _read_back(c, [f"k{i}" for i in range(30)]) == 30


def test_a_resize_cut_short_part_way_is_repaired(name):
    """An exception at each point of a shrink's compaction (as a SIGKILL would leave it, with dirty set), the entry
    limit lowered too (the ring's size follows it): the next call repairs, every entry kept reads back as it was
    stored, and another handle, which took the tables before, takes the ones the repair left."""
    keys = [f"k{i}" for i in range(600)]
    for cut in (0, 1, 5, 40, 200):
        c = SharedCache(name, capacity_bytes=128 * KIB, max_entries=1000, create=True)
        other = SharedCache(name)
        try:
            c.resize(capacity_bytes=1 * MIB)
            _fill(c, keys)
            for k in keys[::3]:
                c.delete(k)
            ring = c._table.ring
            real, moves = ring.move, [0]

            def move(*args):
                if moves[0] == cut:
                    raise RuntimeError("cut short")
                moves[0] += 1
                return real(*args)

            ring.move = move
            try:
                c.resize(capacity_bytes=128 * KIB, max_entries=600)  # (the same index: only the ring moves)
            except RuntimeError:
                assert not c._h[H_DIRTY]  # the holder repaired before it let go (Guard.fault)
            else:
                assert cut >= moves[0]  # fewer moves than the cut: it ran whole
            finally:
                ring.move = real
            assert c.capacity_bytes in (128 * KIB, 1 * MIB) and c.limits().max_entries in (600, 1000)
            _read_back(c, keys)  # (the first call repairs)
            assert c.verify().ok
            _fill(other, keys[:100], seq=2)
            assert other.limits() == c.limits() and other._seg.limit == c._seg.limit
            assert _read_back(c, keys[:100]) > 0 and c.verify().ok and other.verify().ok
        finally:
            other.close()
            c.close()
            SharedCache.unlink_name(name)


def _resizer(name: str, seed: int) -> None:
    """Resize for ever between sizes, as fast as it can: SIGKILLed at a random instant by the test."""
    rng = random.Random(seed)
    with SharedCache(name, create=False) as c:
        while True:
            c.resize(capacity_bytes=rng.choice([128 * KIB, 512 * KIB, 2 * MIB]),
                     max_entries=rng.choice([256, 1024, 4096, 16000]))


def test_a_resizer_killed_at_random_instants_leaves_a_cache_that_serves(name):
    """Killed mid-compaction, mid-reindex or between: the next holder repairs to the old or the new size."""
    keys = [f"k{i}" for i in range(400)]
    ctx = mp.get_context("fork")
    with SharedCache(name, capacity_bytes=512 * KIB, max_entries=1024, create=True) as c:
        rng = random.Random(7)
        for round_ in range(8):
            _fill(c, rng.sample(keys, 200), seq=round_)
            p = ctx.Process(target=_resizer, args=(name, round_))
            p.start()
            try:
                time.sleep(rng.uniform(0.01, 0.15))
                os.kill(p.pid, signal.SIGKILL)
            finally:
                reap([p], 10)
            _read_back(c, keys)  # every value found is the one stored for its key
            assert c.verify().ok
            assert c.capacity_bytes in (128 * KIB, 512 * KIB, 2 * MIB)
            assert c.limits().max_entries in (256, 1024, 4096, 16000)


def _serve(name: str, worker: int, seconds: float, queue) -> None:
    rng = random.Random(worker)
    counts = dict(hits=0, misses=0, wrong=0, errors=0, puts=0)
    with SharedCache(name, create=False) as c:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            k = f"k{rng.randrange(3000)}"
            i += 1
            try:
                if rng.random() < 0.6:
                    v = c.get(k)
                    if v is None:
                        counts["misses"] += 1
                    else:
                        counts["hits"] += 1
                        try:
                            check_value(k, v)
                        except AssertionError:
                            counts["wrong"] += 1
                else:
                    c.put(k, make_value(k, worker * 10**7 + i, rng.randrange(64, 4000)))
                    counts["puts"] += 1
            except Exception:  # counted: the test fails on any
                counts["errors"] += 1
    queue.put(counts)


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_resizes_while_processes_read_and_write(name, policy):
    """4 processes get and put values that carry their key and checksum while this one resizes up and down, the
    entry limit too: past the one of creation (the tables grow) and back."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with SharedCache(name, capacity_bytes=1 * MIB, max_entries=8192, create=True, policy=policy) as c:
        procs = [ctx.Process(target=_serve, args=(name, w, 1.6, queue)) for w in range(4)]
        for p in procs:
            p.start()
        try:
            sizes = [1 * MIB, 8 * MIB, 2 * MIB, 16 * MIB, 512 * KIB]
            limits = [8192, 40000, 1000, 131072, 2048, 9000]
            end, n = time.monotonic() + 1.2, 0
            while time.monotonic() < end:
                c.resize(capacity_bytes=sizes[n % len(sizes)], max_entries=limits[n % len(limits)])
                n += 1
                time.sleep(0.05)
            results = [queue.get(timeout=60) for _ in procs]
        finally:
            reap(procs, 30)
        assert n >= 5 and c.stats().resizes >= n - 1
        assert sum(r["wrong"] for r in results) == 0 and sum(r["errors"] for r in results) == 0, results
        assert sum(r["hits"] for r in results) > 0 and sum(r["puts"] for r in results) > 0
        assert c.verify().ok


def test_a_reservation_larger_than_the_machine_costs_nothing_until_used(name):
    """max_capacity_bytes is address space and a sparse file: 256 GiB reserved, a few MiB occupied."""
    with SharedCache(name, capacity_bytes=1 * MIB, max_entries=1024, max_capacity_bytes=256 * 2**30,
                     create=True) as c:
        assert c.max_capacity_bytes == 256 * 2**30 and c.capacity_bytes == 1 * MIB
        _fill(c, [f"k{i}" for i in range(500)])
        c.resize(capacity_bytes=4 * MIB)
        _fill(c, [f"k{i}" for i in range(2000)], seq=1)
        assert _read_back(c, [f"k{i}" for i in range(2000)]) == len(c) > 1000
        assert _occupied(c) < 16 * MIB


def _read_on(name: str, seconds: float, ready, queue) -> None:
    """Get keys without the lock (s3fifo, compiled) for ``seconds``, checking each value: the wrong ones counted."""
    rng = random.Random(os.getpid())
    wrong = reads = 0
    with SharedCache(name, create=False) as c:
        ready.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            k = f"k{rng.randrange(3000)}"
            v = c.get(k)
            reads += 1
            if v is not None:
                try:
                    check_value(k, v)
                except AssertionError:
                    wrong += 1
        queue.put((reads, wrong, c.stats().unlocked_reads))


def test_a_shrink_gives_memory_back_while_other_processes_read_without_the_lock(name):
    """Under s3fifo the other processes read without the lock: the shrink waits out the reads begun before it
    (readers.quiesce) and then gives the pages back, and no reader ever sees a wrong value."""
    ctx = mp.get_context("fork")
    queue, ready = ctx.Queue(), ctx.Event()
    with SharedCache(name, capacity_bytes=512 * KIB, max_entries=8192, create=True, policy="s3fifo") as c:
        procs = [ctx.Process(target=_read_on, args=(name, 1.5, ready, queue)) for _ in range(2)]
        for p in procs:
            p.start()
        try:
            assert ready.wait(30)
            released = 0
            for round_ in range(3):
                c.resize(capacity_bytes=8 * MIB)
                _fill(c, [f"k{i}" for i in range(3000)], seq=round_, nbytes=2000)
                grown = _occupied(c)
                c.resize(capacity_bytes=512 * KIB)
                released += _occupied(c) < grown - 2 * MIB
            results = [queue.get(timeout=60) for _ in procs]
        finally:
            reap(procs, 30)
        assert released >= 2, released  # (one may find a reader stopped by the scheduler: nothing given back)
        if c._core is not None and c._core.unlocked:
            assert all(r[2] > 0 for r in results), results
        assert all(r[1] == 0 and r[0] > 0 for r in results), results
        assert c.verify().ok


def _hold_a_slot(name: str, ready, leave) -> None:
    with SharedCache(name, create=False):
        ready.set()
        leave.wait(30)


def test_a_read_under_way_in_another_process_keeps_the_pages_until_it_ends(name):
    """A live handle's slot that counts a read under way (here: set by hand, as a reader stopped mid-read would
    leave it) keeps a shrink from giving pages back, after a bounded wait; a dead holder's count does not."""
    from shmcache import readers
    from shmcache.layout.dtypes import R_READING, READER_WORDS

    ctx = mp.get_context("fork")
    ready, leave = ctx.Event(), ctx.Event()
    with SharedCache(name, capacity_bytes=512 * KIB, max_entries=4096, create=True, policy="keep") as c:
        if c._core is None or not c._core.unlocked:
            pytest.skip("reads without the lock, and their reader slots, are the compiled section's (x86-64)")
        p = ctx.Process(target=_hold_a_slot, args=(name, ready, leave))
        p.start()
        try:
            assert ready.wait(30)
            words = c._seg.reader_words
            # (R_HOLDER, word 4: its pid; the fork hook claimed one for the handle inherited, the child another)
            held = [r for r in range(256) if words[r * READER_WORDS + 4] == p.pid]
            assert held
            slot = held[-1] * READER_WORDS + R_READING
            words[slot] = 1
            assert not readers.quiesce(c._seg, timeout=0.2)
            c.resize(capacity_bytes=4 * MIB)
            _fill(c, [f"k{i}" for i in range(2000)], nbytes=1500)
            grown = _occupied(c)
            c.resize(capacity_bytes=512 * KIB)
            assert _occupied(c) > grown - MIB  # kept backed: a read may still touch them
            words[slot] = 0
            assert readers.quiesce(c._seg)
        finally:
            leave.set()
            reap([p], 30)
        words[slot] = 1  # its holder gone: the count is stale, and ignored
        assert readers.quiesce(c._seg, timeout=0.2)
        assert c.verify().ok


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_lower_limits_evict_in_short_holds_and_long_walks_move_the_progress_word(name, policy, monkeypatch):
    """A shrink that evicts many entries does it in holds of at most EVICT_STEP evictions, other calls served
    between them, before the hold that lowers the limits; and a walk under one hold over more than TICK_EVERY
    entries (an eviction, the resize's compaction) moves the progress word, so that the lock's waiters wait on
    instead of timing out."""
    from shmcache import cache as cache_mod
    from shmcache.layout.dtypes import H_ENTRIES, H_PROGRESS
    from shmcache.lock import TICK_EVERY

    monkeypatch.setattr(cache_mod, "EVICT_STEP", 1000)
    c = SharedCache(name, capacity_bytes=16 * MIB, max_entries=20_000, create=True, policy=policy)
    try:
        keys = [f"k{i}" for i in range(12_000)]
        c.put_many({k: make_value(k, 0, 40) for k in keys})
        assert len(c) == 12_000
        steps, path, h = [], c._path, c._seg.header_words

        class Counted:  # the handle's path (the Core, or the Python path), each evict_toward's evictions counted
            def __getattr__(self, attr):
                return getattr(path, attr)

            def evict_toward(self, *args):  # (each a hold of its own)
                before = int(h[H_ENTRIES])
                out = path.evict_toward(*args)
                steps.append(before - int(h[H_ENTRIES]))
                return out

        monkeypatch.setattr(c, "_path", Counted())
        c.set_limits(max_entries=2_000)
        assert len(steps) >= 10 and max(steps) <= 1000 and sum(steps) >= 9_000
        assert len(c) <= 2_000 and _read_back(c, keys) == len(c)
        # The walks of one hold: a resize compacting more than TICK_EVERY live blocks, an eviction of as many.
        monkeypatch.setattr(cache_mod, "EVICT_STEP", 10**9)  # no holds ahead: the resize's own walk
        c.set_limits(max_entries=20_000)
        c.put_many({k: make_value(k, 1, 40) for k in keys})
        before = int(h[H_PROGRESS])
        c.resize(capacity_bytes=8 * MIB, max_entries=20_000)  # the ring wraps or reaches past: every block moved
        assert int(h[H_PROGRESS]) != before
        before = int(h[H_PROGRESS])
        c.set_limits(max_entries=TICK_EVERY // 2)
        assert int(h[H_PROGRESS]) != before
        assert _read_back(c, keys) == len(c) and c.verify().ok
    finally:
        c.close()
        c.unlink()


def test_the_entry_limit_grows_past_creation_keeping_every_entry_on_both_paths(name):
    """Version 10: max_entries up to 16 times its creation's, the index rebuilt and the tables backed as the limit
    needs, every entry kept on the way up, the policy's choice on the way down; the other handle (the other path)
    takes the new tables before its next call."""
    from .workers import python_path

    with SharedCache(name, capacity_bytes=4 * MIB, max_entries=500, create=True, policy="s3fifo") as c, \
            SharedCache(name) as other:
        python_path(other)
        keys = [f"k{i}" for i in range(8000)]
        _fill(c, keys[:500], nbytes=64)
        assert len(c) == 500 and c.stats().max_entries == 500
        c.resize(max_entries=8000)
        assert _read_back(other, keys[:500]) == 500  # no entry lost on the way up, seen by the other path
        _fill(other, keys[500:], nbytes=64)
        assert len(c) == 8000 and _read_back(c, keys) == 8000 and c.verify().ok
        other.set_limits(max_entries=300)
        assert len(c) == 300 and _read_back(c, keys) == 300 and c.verify().ok and other.verify().ok
        assert c.stats().resizes == 2 and c._seg.mask + 1 == other._seg.mask + 1 == 430  # (300 / 0.7)
        with pytest.raises(ValueError, match="8000 entries"):
            other.resize(max_entries=8001)


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "auto", "keep"])
def test_a_lower_entry_limit_gives_the_tables_back(name, policy):
    """A resize to a smaller entry limit moves the entries it keeps below the slots the new limit hands out
    (Table.pack) and gives back the pages of the index, the entry table and its columns past them; the other
    handle (the other path) takes the smaller tables, and every value kept reads back as stored, before and after
    the limit grows again."""
    from .workers import python_path

    keys = [f"k{i}" for i in range(20000)]
    with SharedCache(name, capacity_bytes=8 * MIB, max_entries=20000, create=True, policy=policy) as c, \
            SharedCache(name) as other:
        python_path(other)
        _fill(c, keys, nbytes=40)
        assert len(c) == 20000 and _read_back(other, keys[:100]) == 100
        full = _occupied(c)
        c.resize(max_entries=1000)
        assert len(c) == 1000 and c.verify().ok
        # Index 28,573 -> 1,430 slots of 8 bytes; 19,000 entry slots of a record (32 or 64 bytes) and 3 bytes of
        # columns: 0.9 MB (narrow records) at least, pages given back whole.
        freed = (28573 - 1430) * 8 + 19000 * (c._seg.geometry.entry_nbytes + 3)
        assert _occupied(c) < full - 0.9 * freed, (full, _occupied(c), freed)
        assert c._h[H_UNUSED_NEXT] <= 1001 and c._seg.slots_shown == 1001
        assert _read_back(other, keys) == 1000 and other.verify().ok
        assert other._seg.slots_shown == 1001  # (it took the smaller tables: past them, zero pages of its own)
        _fill(other, keys[:5000], seq=1, nbytes=40)  # and both serve on, within the smaller tables
        assert _read_back(c, keys) == len(c) <= 1000
        c.resize(max_entries=20000)
        _fill(other, keys, seq=2, nbytes=40)
        assert len(c) == 20000 and _read_back(c, keys) == 20000 and c.verify().ok and other.verify().ok


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_a_pinned_entry_past_the_new_limit_stays_where_it_is(name, policy):
    """An entry a view pins is not moved: the slots in use end past it, its view reads the bytes it was given, and
    the entries moved around it read back as stored."""
    keys = [f"k{i}" for i in range(3000)]
    with SharedCache(name, capacity_bytes=8 * MIB, max_entries=3000, create=True, policy=policy) as c, \
            SharedCache(name) as other:
        _fill(c, keys[:2999], nbytes=40)
        payload = os.urandom(3000)
        c.put("held", payload)  # (the last slot handed out)
        with other.view("held") as held:
            assert bytes(held) == payload
            c.resize(max_entries=200)
            assert bytes(held) == payload
            assert 200 < c._h[H_UNUSED_NEXT] <= 3001 and c.verify().ok
            assert _read_back(other, keys) == len(c) - 1 <= 199
        assert c.get("held") == payload and c.verify().ok


def test_a_pack_cut_short_part_way_is_repaired(name):
    """An exception at each point of the moves below the new limit (as a SIGKILL would leave it, dirty set): the
    next call repairs, and every entry kept reads back as it was stored, through this handle and another."""
    import shmcache.table as table_module

    keys = [f"k{i}" for i in range(2000)]
    for cut in (0, 1, 7, 150):
        with SharedCache(name, capacity_bytes=4 * MIB, max_entries=2000, create=True) as c, \
                SharedCache(name) as other:
            _fill(c, keys, nbytes=40)
            for k in keys[:1700:2]:
                c.delete(k)  # free slots below the new limit, entries past it to move
            real, moves = table_module.Table._move_entry, [0]

            def move(self, *args):
                if moves[0] == cut:
                    raise RuntimeError("cut short")
                moves[0] += 1
                return real(self, *args)

            table_module.Table._move_entry = move  # type: ignore[method-assign]
            try:
                c.resize(max_entries=1000)
            except RuntimeError:
                assert not c._h[H_DIRTY]  # the holder repaired before it let go (Guard.fault)
            finally:
                table_module.Table._move_entry = real  # type: ignore[method-assign]
            assert moves[0] >= min(cut, 1)
            assert _read_back(other, keys) == len(c) > 0 and c.verify().ok and other.verify().ok
            _fill(other, keys[:300], seq=1, nbytes=40)
            assert _read_back(c, keys) == len(c) and c.verify().ok
        SharedCache.unlink_name(name)


def test_a_reindex_cut_short_is_repaired_to_the_limit_written(name, monkeypatch):
    """An exception at each step of a reindex (as a SIGKILL would leave it, dirty set): the next call rebuilds the
    index the checked limit needs, and every entry kept reads back as it was stored."""
    import shmcache.table as table_module

    keys = [f"k{i}" for i in range(600)]
    for step in (1, 2):
        calls = [0]
        real = table_module.progressed

        def cut(h, _step=step, _calls=calls):
            _calls[0] += 1
            if _calls[0] == _step:
                raise RuntimeError("cut short")
            real(h)

        with SharedCache(unique_name(), capacity_bytes=1 * MIB, max_entries=400, create=True) as c:
            _fill(c, keys[:400])
            monkeypatch.setattr(table_module, "progressed", cut)
            with pytest.raises(RuntimeError):
                c.resize(max_entries=5000)
            monkeypatch.setattr(table_module, "progressed", real)
            assert _read_back(c, keys[:400]) == 400  # repaired first: the limit written, its index rebuilt
            assert c.limits().max_entries == 5000 and c.verify().ok
            _fill(c, keys)
            assert len(c) == 600 and c.verify().ok
            c.close()
            SharedCache.unlink_name(c.name)


def test_a_damaged_index_size_word_is_repaired(name):
    """The index in force's size (header word index_slots, version 10) hit by a stray write: an attacher is not
    misled, verify reports it, the repair restores the one the limit needs, and every value reads back."""
    from shmcache.layout.dtypes import H_INDEX_SLOTS

    keys = [f"k{i}" for i in range(300)]
    with SharedCache(name, capacity_bytes=1 * MIB, max_entries=400, create=True) as c:
        _fill(c, keys)
        for garbage in (0, 3, 16, 4096, c._seg.geometry.index_slots, 2**40, -1):
            c._h[H_INDEX_SLOTS] = garbage
            with SharedCache(name, create=False) as attacher:
                assert _read_back(attacher, keys) == 300
            assert c.verify(repair_damage=True) is not None
            assert c._h[H_INDEX_SLOTS] == 573 and c.verify().ok  # (400 / 0.7)
            assert _read_back(c, keys) == 300


def test_tables_that_cannot_be_backed_refuse_the_resize_and_change_nothing(name, monkeypatch):
    """A larger entry limit on a full /dev/shm: NoSpaceError before anything is written (the tables are backed
    first), the cache as it was and still usable; once there is room, the same resize goes through."""
    from shmcache import NoSpaceError, space

    keys = [f"k{i}" for i in range(200)]
    with SharedCache(name, capacity_bytes=1 * MIB, max_entries=200, create=True) as c:
        _fill(c, keys)
        before = c.stats()
        real = space.back
        monkeypatch.setattr(space, "back", lambda fd, start, stop: "1.0 MiB more shared memory were needed")
        with pytest.raises(NoSpaceError, match="tables"):
            c.resize(max_entries=3000)
        monkeypatch.setattr(space, "back", real)
        s = c.stats()
        assert (s.max_entries, s.entries, s.resizes) == (200, before.entries, before.resizes)
        assert _read_back(c, keys) == before.entries and c.verify().ok
        c.resize(max_entries=3000)
        c.resize(capacity_bytes=4 * MIB)
        _fill(c, [f"more{i}" for i in range(2000)], nbytes=64)
        assert len(c) == 2000 + before.entries and c.verify().ok


def test_a_repair_that_cannot_back_a_raised_limit_lowers_it_to_the_index_shown(name, monkeypatch):
    """A resize that raised the entry limit died before it backed the tables, and /dev/shm is full when the repair
    runs: the repair keeps the index this mapping shows and lowers the limit to the most that index holds under
    the layout's load (0.7 from version 17), the index in force the one that limit needs, so that the cache
    checks out at once, and every value reads back."""
    from shmcache import config, space
    from shmcache.layout.dtypes import H_INDEX_SLOTS, H_MAX_ENTRIES, H_MAX_RETAINED

    keys = [f"k{i}" for i in range(150)]
    with SharedCache(name, capacity_bytes=1 * MIB, max_entries=200, create=True) as c:
        _fill(c, keys)
        g, h = c._seg.geometry, c._h
        assert c._seg.shown_index() == g.index_for(200) == 288 and g.limit_for(288) == 200
        config.set_limits(h, 3000, h[H_MAX_RETAINED])  # (the resize's words, its tables never backed)
        h[H_DIRTY] = 1
        monkeypatch.setattr(space, "back", lambda fd, start, stop: "1.0 MiB more shared memory were needed")
        assert c.verify(repair_damage=True) is not None
        assert (h[H_MAX_ENTRIES], h[H_INDEX_SLOTS], h[H_DIRTY]) == (200, 288, 0)
        assert c.verify().ok and _read_back(c, keys) == 150
        monkeypatch.undo()
        c.resize(max_entries=3000)  # (once there is room)
        assert h[H_INDEX_SLOTS] == g.index_for(3000) and c.verify().ok and _read_back(c, keys) == 150


def test_a_new_limit_keeps_the_ghost_where_its_size_stays(name):
    """Version 17: nearly every new entry limit needs another index (Table.reindex), but the ghost (s3fifo) is a
    power of two and keeps its size, and then what it remembers; a limit that changes its size empties it."""
    with SharedCache(name, capacity_bytes=4 * MIB, max_entries=1000, create=True, policy="s3fifo") as c:
        _fill(c, [f"k{i}" for i in range(3000)], nbytes=32)  # (evictions: keys in the ghost)
        ghost = np.frombuffer(c._seg.ghost_words, dtype=np.int64)
        assert len(ghost) == 2048 and ghost.any()
        before = ghost.copy()
        c.set_limits(max_entries=1010)  # (no eviction: the ghost as it was, or emptied)
        assert c._seg.mask + 1 == c._seg.geometry.index_for(1010) != c._seg.geometry.index_for(1000)
        assert len(c._seg.ghost_words) == 2048
        assert np.array_equal(np.frombuffer(c._seg.ghost_words, dtype=np.int64), before) and c.verify().ok
        c.set_limits(max_entries=1100)  # (a ghost of 4096 words: emptied)
        assert len(c._seg.ghost_words) == 4096 and not np.frombuffer(c._seg.ghost_words, dtype=np.int64).any()
        assert c.verify().ok


@pytest.mark.parametrize("word", ["unused_next", "free_head"])
def test_a_damaged_slot_word_backs_nothing_past_the_slots_shown(name, word):
    """``unused_next`` or ``free_head`` aimed by damage past the entry slots shown (into the 16 times reserved):
    nothing is backed for it (st_blocks), nothing is written where only this process would see it, the repair puts
    the word back, and every value stored reads back, from another handle too."""
    from shmcache.layout.dtypes import H_FREE_HEAD, H_UNUSED_NEXT

    keys = [f"k{i}" for i in range(300)]
    with SharedCache(name, capacity_bytes=1 * MIB, max_entries=400, create=True) as c, SharedCache(name) as other:
        _fill(c, keys, nbytes=64)
        for k in keys[:50]:
            c.delete(k)  # (a free list to aim)
        g = c._seg.geometry
        held = _occupied(c)
        w = {"unused_next": H_UNUSED_NEXT, "free_head": H_FREE_HEAD}[word]
        for bad in (g.entry_slots - 1, g.entry_slots // 2, 0):
            c._h[w] = bad
            for i in range(20):  # (puts that need slots; one that meets the damage raises, repaired: retried)
                k = f"new{bad}-{i}"
                try:
                    c.put(k, make_value(k, 0, 64))
                except CorruptionError:
                    c.put(k, make_value(k, 0, 64))
            c.verify(repair_damage=True)  # (damage the puts did not meet is verify's to find)
            assert c.verify().ok and other.verify().ok
            assert _read_back(other, keys[50:]) == 250 and _read_back(c, [f"new{bad}-{i}" for i in range(20)]) == 20
            assert c._h[H_UNUSED_NEXT] <= c._seg.slots_shown
        assert _occupied(c) < held + 256 * KIB  # (not the 16 times reserved tables: about 1.3 MiB here)


def test_a_process_whose_resize_count_comes_back_still_takes_the_new_tables(name):
    """The ``resizes`` word damaged back to the count another handle took its tables at, after a resize that moved
    the index: that handle still takes the new ones (it compares the index's size and the limit too), finds every
    key and stores none twice."""
    from shmcache.layout.dtypes import H_RESIZES

    keys = [f"k{i}" for i in range(1500)]
    with SharedCache(name, capacity_bytes=4 * MIB, max_entries=500, create=True, policy="s3fifo") as c, \
            SharedCache(name) as other:
        _fill(c, keys[:500], nbytes=64)
        assert _read_back(other, keys[:500]) == 500  # (other takes the tables as they are)
        seen = other._seg.shown[3]
        c.resize(max_entries=1500)
        c._h[H_RESIZES] = seen
        _fill(c, keys[500:], nbytes=64)
        assert _read_back(other, keys) == 1500
        _fill(other, keys, seq=1, nbytes=64)
        assert len(c) == 1500 and c.verify().ok and other.verify().ok


@pytest.mark.parametrize("version", [14, 16, 18, 19])
def test_a_reindex_places_every_entry_as_linear_probing_would(name, monkeypatch, version):
    """A reindex (the entry limit lowered, then raised) lays the index out as inserting the resident entries one by
    one in order of home slot, ties in entry order, would: each entry at the first free slot from its home, those
    whose cluster runs past the last slot round to the first ones. Checked word for word against that insertion, in
    layouts whose index is two words a slot (14), one word of a power-of-two index (16), any size (18) and narrow
    records (19), with keys picked so that a cluster crosses the end; every key reads back."""
    from shmcache import index
    from shmcache.codec import encode_key, fingerprint
    from shmcache.layout import Geometry
    from .workers import entry_of, laid_out_as

    laid_out_as(monkeypatch, version)
    limit = 300
    slots = Geometry.for_capacity(MIB, limit, 0, version).index_for(limit)
    home = index.of(Geometry.for_capacity(MIB, limit, 0, version)).home
    edge = [k for k in (f"w{i}" for i in range(20000))
            if home(fingerprint(encode_key(k)), slots - 1) >= slots - 3][:40]
    keys = edge + [f"k{i}" for i in range(limit - len(edge))]
    with SharedCache(name, capacity_bytes=MIB, max_entries=4 * limit, create=True) as c:
        monkeypatch.undo()
        try:
            assert c._seg.version == version
            for k in keys:
                c[k] = k
            for target in (limit, 3 * limit):
                c.set_limits(max_entries=target)
                n = c._seg.mask + 1
                assert n == c._seg.geometry.index_for(target) and len(c) == len(keys)
                g, rec = c._seg.geometry, c._seg.records
                fps = {entry_of(c, k): fingerprint(encode_key(k)) for k in keys}
                expected = [0] * n
                for h, e in sorted((home(fp, n - 1), e) for e, fp in fps.items()):
                    s = h
                    while expected[s]:
                        s = (s + 1) % n
                    expected[s] = e
                _, ix, _ = c._seg.arrays()
                assert [int(x) for x in ix["entry"][:n]] == expected
                assert all(rec.slot[e] == expected.index(e) for e in fps)
                tags = ix["fp"][:n] if g.packed_index else ix["fp"][:n] & 0xFFFFFFFF
                assert all(int(tags[expected.index(e)]) == fp & 0xFFFFFFFF for e, fp in fps.items())
                if target == limit:
                    assert expected[0] != 0 and expected[n - 1] != 0  # (a cluster crosses the end)
                assert all(c[k] == k for k in keys) and c.verify().ok
        finally:
            c.unlink()
