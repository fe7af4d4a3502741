"""Reads without the lock (shmcache/_core_unlocked.c): under s3fifo and keep the compiled section's get, get_many
and view take no lock, validate what they read against the header's seq word, and count in a reader slot.

What is held here: a stopped lock holder stalls none of them; they answer and count exactly as the locked Python
path does (segments compared byte for byte, the counters aside); a read under a writer is retried, then handed to
the lock; counts survive a SIGKILL, a fork and clear(); hostile bytes never crash a reader or pass as a value; and
readers racing writers of other processes never return a wrong or torn value."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest

from shmcache import CorruptionError, LockTimeout, SharedCache, index, ofd
from shmcache.layout.dtypes import (
    H_CREATED_NS, H_CREATOR_PID, H_HITS, H_LOCK_OFF, H_MISSES, H_PROGRESS, H_SEQ, R_PINS, READER, READER_PINS,
    READER_SLOTS, S_OPEN, STRIPE_WORDS, STRIPES, H_DIRTY, R_FALLBACKS, R_HITS, R_MISSES, READER_WORDS,
)
from shmcache.codec import encode_key, fingerprint
from shmcache.seqlock import stripe_of
from shmcache.layout import LOCK_NBYTES
from shmcache.readers import READER_BASE

from .workers import (
    check_value, entry_of, hold_lock, make_value, pinned, python_path, reap, stop_mid_put, stripes_at_rest, versioned,
)

UNLOCKED_TRIES = 64  # _core_unlocked.c


def _unlocked(c: SharedCache) -> SharedCache:
    if c._core is None or not c._core.unlocked:
        c.close()
        c.unlink()
        pytest.skip("reads without the lock need the compiled section on x86-64 or aarch64")
    return c


def _cache(name: str, policy: str = "s3fifo", **kw) -> SharedCache:
    kw.setdefault("capacity_bytes", 1 << 20)
    kw.setdefault("max_entries", 256)
    return _unlocked(versioned(SharedCache(name, create=True, policy=policy, **kw)))  # (views in C from the first)


def _stopped_holder(name: str):
    """A process holding the cache lock, SIGSTOPped: (process, its pid)."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=hold_lock, args=(name, ready))
    p.start()
    assert ready.wait(30), "the child never took the lock"
    os.kill(p.pid, signal.SIGSTOP)
    return p


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["s3fifo", "keep"])
def test_unlocked_reads_answer_while_a_stopped_process_holds_the_lock(name, policy):
    # lock_timeout 5 s: a read that took the lock would raise LockTimeout, failing the test
    c = _cache(name, policy, lock_timeout=5)
    try:
        for i in range(20):
            c.put(f"k{i}", make_value(f"k{i}", i, 50 + i))
        c.put("arr", np.arange(1000, dtype=np.int64))
        c.put("raw", b"r" * 150_000)
        with c.view("arr") as a:  # a first look (checksum) before the stop, and one during it below
            assert int(a.sum()) == 499500
        before = c.stats()
        p = _stopped_holder(name)
        try:
            hits = misses = 0
            for i in range(20):
                check_value(f"k{i}", c.get(f"k{i}"))
                hits += 1
            assert c.get("absent", "dflt") == "dflt"
            misses += 1
            got = c.get_many([f"k{i}" for i in range(5)] + ["absent"])
            for i in range(5):
                check_value(f"k{i}", got[i])
            assert got[5] is None
            hits, misses = hits + 5, misses + 1
            with c.view("arr") as a:
                assert int(a.sum()) == 499500
            with c.view("raw") as r:  # first view of this value: checked without the lock too
                assert bytes(r[:3]) == b"rrr" and len(r) == 150_000
            with pytest.raises(KeyError):
                c.view("absent")
            hits, misses = hits + 2, misses + 1
        finally:
            os.kill(p.pid, signal.SIGKILL)  # dies holding the lock: the next locker is told, and repairs if need be
            reap([p], 30)
        s = c.stats()  # takes the lock: the dead holder's
        assert (s.hits - before.hits, s.misses - before.misses) == (hits, misses)
        assert s.read_fallbacks == before.read_fallbacks
        assert c.verify().ok
    finally:
        c.close()
        c.unlink()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["auto", "s3fifo", "keep"])
def test_unlocked_a_writer_stopped_mid_put_stalls_only_its_stripe(name, policy):
    """A writer SIGSTOPped in the middle of a put (its key's stripe odd, ``dirty`` raised, the lock held) stalls no
    read of a key outside that stripe: gets, batches, misses and views of them go on without the lock, every value
    right, none handed to the locked path; a read of a key in the stripe waits for the lock (LockTimeout here, never
    a value the put is writing). Continued, the writer ends its put, and every stripe is at rest."""
    c = _cache(name, policy, capacity_bytes=1 << 22, max_entries=4096, lock_timeout=0.5)
    p = None
    try:
        keys = [f"k{i}" for i in range(1500)]
        for i, k in enumerate(keys):
            c.put(k, make_value(k, i, 40 + i % 60))
        c.put("arr", np.arange(1000, dtype=np.int64))
        raws = [f"raw{i}" for i in range(40)]
        for i, k in enumerate(raws):
            c.put(k, k.encode() * (100 + i))
        seg = c._seg
        mask, words = seg.mask, seg.stripe_words
        # 46 stripes of 128 slots, the last shorter (an index of 4097 / 0.7 slots: stripes of a power of two)
        assert mask + 1 == 5853 and stripe_of(mask, mask) == 45 < STRIPES
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=stop_mid_put, args=(name, "new", make_value("new", 7, 500)))
        p.start()
        _, status = os.waitpid(p.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), "the writer never stopped"
        stopped = [k for k in range(STRIPES) if words[S_OPEN] >> k & 1]
        assert len(stopped) == 1 and words[STRIPE_WORDS * (1 + stopped[0])] & 1 and seg.header_words[H_DIRTY]

        def stripes(key) -> set[int]:  # the stripes its lookup's probe crosses, from its home slot to its own
            n = mask + 1
            home = index.of(seg.geometry).home(fingerprint(encode_key(key)), mask)
            e = entry_of(c, key)
            last = seg.records.slot[e] if e else home
            return {stripe_of(s % n, mask) for s in range(home, home + (last - home) % n + 1)}

        free = [k for k in keys + ["arr"] if stopped[0] not in stripes(k)]
        viewed = [k for k in raws if stopped[0] not in stripes(k)]
        held = [k for k in keys if stopped[0] in stripes(k)]
        absent = [f"none{i}" for i in range(400) if stopped[0] not in stripes(f"none{i}")]
        assert len(free) > 1300 and len(viewed) > 30 and held and absent
        slot = c._core.reader.slot * READER_WORDS  # (stats() would take the lock: this handle's slot is read)

        def counts() -> list[int]:
            return [int(seg.reader_words[slot + w]) for w in (R_HITS, R_MISSES, R_FALLBACKS)]

        before = counts()
        for k in free:
            if k == "arr":
                with c.view(k) as a:
                    assert int(a.sum()) == 499500
            else:
                check_value(k, c.get(k))
        got = c.get_many(free[:50] + absent[:5])
        for k, v in zip(free[:50], got):
            if k != "arr":
                check_value(k, v)
        assert got[50:] == [None] * 5 and all(c.get(k) is None for k in absent)
        for k in viewed:  # pinned without the lock (Dekker's pattern against the stripe's word)
            with c.view(k) as v:
                assert bytes(v) == k.encode() * (100 + int(k[3:]))
        hits, misses, fallbacks = (x - y for x, y in zip(counts(), before))
        assert fallbacks == 0  # not one read took the lock
        assert (hits, misses) == (len(free) + 50 + len(viewed), 5 + len(absent))
        with pytest.raises(LockTimeout):  # its stripe's reads wait for the writer's lock
            c.get(held[0])
        os.kill(p.pid, signal.SIGCONT)
        p.join(30)
        assert p.exitcode == 0
        check_value("new", c.get("new"))
        check_value(held[0], c.get(held[0]))
        assert words[S_OPEN] == 0 and not (np.frombuffer(words, dtype=np.int64)[STRIPE_WORDS::STRIPE_WORDS] & 1).any()
        assert c.verify().ok and len(c) == 1542
    finally:
        if p is not None and p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            os.kill(p.pid, signal.SIGCONT)
            reap([p], 30)
        c.close()
        c.unlink()


@pytest.mark.parametrize("path", ["compiled", "python"])
@pytest.mark.parametrize("policy", ["auto", "s3fifo"])
def test_unlocked_an_evicting_put_opens_only_the_stripes_it_writes(name, policy, path):
    """A put into a full cache whose every entry has hits scans the queues (each passed entry loses a hit and moves
    on, which no reader reads) and opens only the stripes it writes: its own slot's, its victim's, and those of the
    slots the removal shifts back, a handful of the 64, not one per entry passed."""
    kw = dict(capacity_bytes=1 << 22, max_entries=2000, create=True, policy=policy)
    c = SharedCache(name, **kw)
    if path == "python":
        python_path(c)
    try:
        for i in range(2000):
            c.put(f"k{i}", i)
        for _ in range(3):
            for i in range(2000):
                assert c.get(f"k{i}") == i
        words = np.frombuffer(c._seg.stripe_words, dtype=np.int64)
        assert c._seg.mask + 1 == 2859 and len(c) == 2000  # (2001 / 0.7)
        for j in range(5):
            before = words.copy()
            c.put(f"new{j}", j)
            opened = np.flatnonzero(words != before)
            assert 1 <= len(opened) <= 4, (j, opened.tolist())
            assert (words[opened] - before[opened] == 2).all()  # each opened once, and closed
        assert len(c) == 2000 and c.stats().evictions == 5 and c.verify().ok
    finally:
        c.close()
        c.unlink()


@pytest.mark.parametrize("policy", ["auto", "keep"])
def test_unlocked_a_stripe_left_odd_by_a_stray_write_is_healed(name, policy):
    """A stripe's word made odd by a stray write (no hold open, its bit not in the open mask) sends the first read of
    its keys to the lock, which answers it right and evens the word as its hold ends: the next reads go without the
    lock again. A damaged open mask only names stripes to even."""
    c = _cache(name, policy, max_entries=4096)
    try:
        c.put("a", b"v")
        seg = c._seg
        words = seg.stripe_words
        k = stripe_of(seg.records.slot[entry_of(c, "a")], seg.mask)
        w = STRIPE_WORDS * (1 + k)
        words[w] += 1  # odd, nobody writing
        before = c.stats()
        assert c.get("a") == b"v"
        assert words[w] % 2 == 0 and words[S_OPEN] == 0
        assert c.get("a") == b"v"
        s = c.stats()
        assert (s.read_fallbacks - before.read_fallbacks, s.unlocked_reads - before.unlocked_reads) == (1, 1)
        words[S_OPEN] = -1  # every stripe named: the next hold evens what is odd, and clears the mask
        words[STRIPE_WORDS * (1 + (k + 1) % STRIPES)] += 1
        c.put("b", b"w")
        arr = np.frombuffer(words, dtype=np.int64)
        assert words[S_OPEN] == 0 and not (arr[STRIPE_WORDS::STRIPE_WORDS] & 1).any()
        assert c.get("b") == b"w" and c.verify().ok
    finally:
        c.close()
        c.unlink()


@pytest.mark.parametrize("policy", ["s3fifo", "auto"])
def test_unlocked_a_miss_is_taken_back_where_it_was_counted(name, policy):
    """get_or_compute takes back its first lookup's miss when its wait ends in a hit: from the reader slot where a
    read without the lock counted it (the header's count cannot go below 0, so taken from there it would stay)."""
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, policy=policy) as c:
        c.put("there", 1)
        assert c.get("absent") is None and c.get("there") == 1
        assert (c.stats().misses, c.stats().unlocked_reads) == (1, 2 if c._core is not None else 0)
        c._count(*c._miss_taken_back())
        s = c.stats()
        assert (s.hits, s.misses) == (1, 0)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_unlocked_reads_are_not_made_under_lru(name):
    """lru relinks on every hit: its gets take the lock, and a stopped holder stalls them until lock_timeout."""
    c = SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, lock_timeout=0.2, policy="lru")
    try:
        c.put("a", b"v")
        assert c._core is None or not c._core.unlocked
        p = _stopped_holder(name)
        try:
            with pytest.raises(LockTimeout):
                c.get("a")
        finally:
            os.kill(p.pid, signal.SIGKILL)
            reap([p], 30)
        assert c.get("a") == b"v"
    finally:
        c.close()
        c.unlink()


def test_unlocked_read_under_an_odd_seq_retries_then_takes_the_lock(name):
    """An odd seq is a writer mid-hold (here: one that died between its last write and the hold's end): the read is
    retried, then made under the lock, whose end evens the word again."""
    c = _cache(name)
    try:
        c.put("a", b"v")
        h = c._seg.header_words
        h[H_SEQ] = h[H_SEQ] + 1
        assert c.get("a") == b"v"
        s = c.stats()
        assert (s.read_retries, s.read_fallbacks, s.hits) == (UNLOCKED_TRIES - 1, 1, 1)
        assert h[H_SEQ] % 2 == 0  # the locked get's hold ended with nothing half-done
        assert c.get("a") == b"v" and c.stats().read_fallbacks == 1  # and reads go without the lock again
    finally:
        c.close()
        c.unlink()


def test_unlocked_expired_entry_is_dropped_under_the_lock(name):
    now = [10**12]
    c = _cache(name, clock=lambda: now[0])
    try:
        c.put("a", b"v", ttl=1)
        assert c.get("a") == b"v"
        now[0] += 2 * 10**9
        assert c.get("a") is None and "a" not in c
        s = c.stats()
        assert (s.hits, s.misses, s.expired, s.read_fallbacks) == (1, 1, 1, 1)
    finally:
        c.close()
        c.unlink()


# ------------------------------------------------------------------------------------ the same answers and counts

# Bytes that may differ between a segment read without the lock and one read under it: the header's hit and miss
# counters (the reader slots hold the first one's), seq and the stripes' words (generations: a call the compiled
# section hands over is a second hold), the reader slots, and what differs anyway (the mutex, the creation stamp,
# the progress word). Between calls every word is even and no stripe is open, on both.
def _comparable(c: SharedCache) -> np.ndarray:
    x = np.frombuffer(c._seg.mm, dtype=np.uint8).copy()
    g = c._seg.geometry
    assert not c._seg.header_words[H_SEQ] & 1
    lo, hi = stripes_at_rest(c)
    x[lo:hi] = 0
    for lo, n in ((H_LOCK_OFF, LOCK_NBYTES), (H_CREATED_NS * 8, 8), (H_CREATOR_PID * 8, 8), (H_PROGRESS * 8, 8),
                  (H_SEQ * 8, 8), (H_HITS * 8, 8), (H_MISSES * 8, 8), (g.readers_off, READER_SLOTS * READER.itemsize)):
        x[lo : lo + n] = 0
    return x


@pytest.mark.parametrize("policy", ["s3fifo", "keep"])
@pytest.mark.parametrize("seed", range(6))
def test_unlocked_answers_and_counts_as_the_locked_python_path(name, policy, seed):
    rng = random.Random(seed)
    now = [10**12]
    kw = dict(capacity_bytes=8192, max_entries=24, create=True, policy=policy, clock=lambda: now[0])
    a = _unlocked(SharedCache(name, **kw))
    b = python_path(SharedCache(name + "-ref", **kw))
    views: list = []
    try:
        for step in range(600):
            k = f"k{rng.randrange(40)}"
            op = rng.random()
            if op < 0.35:
                got = [x.get(k, "miss") for x in (a, b)]
            elif op < 0.45:
                keys = [f"k{rng.randrange(40)}" for _ in range(rng.randrange(1, 6))]
                got = [x.get_many(keys, "miss") for x in (a, b)]
                got = [[v.tolist() if isinstance(v, np.ndarray) else v for v in g] for g in got]
            elif op < 0.55:
                got = []
                for x in (a, b):
                    try:
                        v = x.view(k)
                        got.append(bytes(v.__enter__()))
                        views.append(v)
                    except (KeyError, TypeError) as exc:
                        got.append(type(exc))
                if len(views) > 6:
                    for v in views[:2]:
                        v.close()
                    del views[:2]
            elif op < 0.85:
                n = rng.randrange(1, 900)
                v = b"x" * n if rng.random() < 0.5 else (np.arange(n // 8 + 1) if rng.random() < 0.5 else [k, n])
                ttl = rng.choice([None, None, 1, 5])
                got = []
                for x in (a, b):
                    try:
                        got.append(x.put(k, v, ttl=ttl))
                    except Exception as exc:  # TooLargeError: the same on both
                        got.append(type(exc))
            elif op < 0.95:
                got = []
                for x in (a, b):
                    try:
                        got.append(x.delete(k))
                    except Exception as exc:
                        got.append(type(exc))
            else:
                now[0] += rng.choice([10**8, 2 * 10**9])
                continue
            if isinstance(got[0], np.ndarray):
                assert isinstance(got[1], np.ndarray) and got[0].tolist() == got[1].tolist(), (step, k)
            else:
                assert got[0] == got[1], (step, k, got)
            assert np.array_equal(_comparable(a), _comparable(b)), f"segments differ after step {step}"
        for v in views:
            v.close()
        sa, sb = a.stats(), b.stats()
        assert (sa.read_retries, sa.read_fallbacks) == (0, sa.read_fallbacks)  # nothing wrote under it here
        assert sa.unlocked_reads > 0 and sb.unlocked_reads == 0
        assert sa.as_dict() | {"read_fallbacks": 0, "unlocked_reads": 0} == sb.as_dict()
        assert list(a.keys()) == list(b.keys()) and a.verify().ok and b.verify().ok
    finally:
        for v in views:
            v.close()
        for x in (a, b):
            x.close()
            x.unlink()


# ------------------------------------------------------------------------------------ the reader slots


def _count_and_die(name: str, hits: int, misses: int) -> None:
    c = SharedCache(name)
    for _ in range(hits):
        assert c.get("a") == b"v"
    for _ in range(misses):
        assert c.get("nope") is None
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_unlocked_counts_survive_a_sigkill_of_their_process(name):
    c = _cache(name)
    try:
        c.put("a", b"v")
        p = mp.get_context("spawn").Process(target=_count_and_die, args=(name, 37, 5))
        p.start()
        reap([p], 30)
        assert p.exitcode == -signal.SIGKILL
        s = c.stats()
        assert (s.hits, s.misses) == (37, 5)
        assert c.get("a") == b"v" and c.stats().hits == 38  # its slot is free again: claimed and added to
    finally:
        c.close()
        c.unlink()


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_unlocked_forked_child_counts_in_a_slot_of_its_own(name):
    c = _cache(name)
    try:
        c.put("a", b"v")
        assert c.get("a") == b"v"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its handle's counts must not go to the parent's slot (plain increments)
            try:
                ok = all(c.get("a") == b"v" for _ in range(100)) and c._core.unlocked
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        for _ in range(50):
            assert c.get("a") == b"v"
        assert os.read(r, 1) == b"1"
        os.close(r)
        os.waitpid(pid, 0)
        assert c.stats().hits == 151
        words = np.frombuffer(c._seg.reader_words, dtype=np.int64).reshape(READER_SLOTS, -1)
        used = words[words[:, 0] > 0]
        assert sorted(used[:, 0].tolist()) == [51, 100]
    finally:
        c.close()
        c.unlink()


def test_unlocked_clear_starts_the_counts_afresh(name):
    c = _cache(name)
    try:
        c.put("a", b"v")
        for _ in range(5):
            c.get("a")
        c.get("b")
        c.clear()
        s = c.stats()
        assert (s.hits, s.misses) == (0, 0)
        c.put("a", b"v")
        c.get("a")
        c.get("b")
        s = c.stats()
        assert (s.hits, s.misses) == (1, 1)
    finally:
        c.close()
        c.unlink()


def test_unlocked_with_every_slot_taken_reads_under_the_lock(name):
    SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, policy="s3fifo").close()
    fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR)
    try:
        assert ofd.lock(fd, READER_BASE, ofd.WRITE, wait=False, length=READER_SLOTS)
        c = SharedCache(name)
        try:
            c.put("a", b"v")
            assert c._core is None or not c._core.unlocked
            assert c.get("a") == b"v" and c.get("b") is None
            s = c.stats()
            assert (s.hits, s.misses, s.read_fallbacks) == (1, 1, 0)
        finally:
            c.close()
    finally:
        os.close(fd)
        SharedCache.unlink_name(name)


# ------------------------------------------------------------------------------------ hostile bytes


@pytest.mark.parametrize("seed", range(4))
def test_unlocked_hostile_bytes_never_crash_a_reader_nor_pass_as_a_value(name, seed):
    rng = random.Random(seed)
    c = _cache(name, capacity_bytes=1 << 16, max_entries=64)
    try:
        mm = np.frombuffer(c._seg.mm, dtype=np.uint8)
        g = c._seg.geometry
        regions = [(g.index_off, g.entries_off + g.entry_slots * g.entry_nbytes), (g.arena_off, g.arena_off + 4096)]
        for round_ in range(60):
            for i in range(30):
                try:
                    c.put(f"k{i}", make_value(f"k{i}", round_ * 100 + i, rng.randrange(1, 200)))
                except (CorruptionError, ValueError):
                    pass
            lo, hi = rng.choice(regions)
            for _ in range(rng.randrange(1, 8)):
                at = rng.randrange(lo, hi)
                mm[at : at + 8] = np.frombuffer(rng.randbytes(8), dtype=np.uint8)
            for i in range(30):
                for read in (lambda k: c.get(k), lambda k: c.get_many([k])[0]):
                    try:
                        v = read(f"k{i}")
                    except CorruptionError:
                        continue
                    if v is not None:
                        check_value(f"k{i}", v)
            c.verify(repair_damage=True)
    finally:
        c.close()
        c.unlink()


# ------------------------------------------------------------------------------------ readers racing writers


def _writer(name: str, seconds: float, seed: int, queue, pure: bool = False) -> None:
    rng = random.Random(seed)
    c = SharedCache(name)
    if pure:  # the Python path's writers open and close seq too (seqlock.py)
        python_path(c)
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        k = f"k{rng.randrange(64)}"
        if rng.random() < 0.9:
            c.put(k, make_value(k, rng.randrange(10**6), rng.choice([10, 300, 3000, 20000])))
        else:
            c.delete(k)  # (a key a reader views is held aside for it)
        n += 1
    c.close()
    queue.put(("writer", n, 0))


def _reader(name: str, seconds: float, seed: int, queue) -> None:
    rng = random.Random(seed)
    c = SharedCache(name)
    end, n, wrong = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        k = f"k{rng.randrange(64)}"
        try:
            r = rng.random()
            if r < 0.6:
                v = c.get(k)
                if v is not None:
                    check_value(k, v)
            elif r < 0.8:
                keys = [f"k{rng.randrange(64)}" for _ in range(4)]
                for kk, v in zip(keys, c.get_many(keys)):
                    if v is not None:
                        check_value(kk, v)
            else:
                try:
                    with c.view(k) as v:
                        pass  # a dict value: not viewable (TypeError), exercised for its pin and count
                except (KeyError, TypeError):
                    pass
        except AssertionError:
            wrong += 1
        n += 1
    c.close()
    queue.put(("reader", n, wrong))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy,writers", [("s3fifo", "compiled"), ("keep", "compiled"), ("s3fifo", "python")])
def test_unlocked_readers_racing_writers_never_read_a_wrong_value(name, policy, writers):
    c = _cache(name, policy, capacity_bytes=256 * 1024, max_entries=48)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(name, 3.0, i, queue, writers == "python")) for i in range(2)]
    procs += [ctx.Process(target=_reader, args=(name, 3.0, 10 + i, queue)) for i in range(2)]
    try:
        for p in procs:
            p.start()
        results = [queue.get(timeout=60) for _ in procs]
        assert all(r[2] == 0 for r in results), results
        assert sum(r[1] for r in results if r[0] == "reader") > 0
        s = c.stats()
        assert s.unlocked_reads > 0 and c.verify().ok
    finally:
        reap(procs, 30)
        c.close()
        c.unlink()


# ------------------------------------------------------------------------------------ pins without a system call


def _pin_words(c: SharedCache) -> list[int]:
    w = np.frombuffer(c._seg.reader_words, dtype=np.int64).reshape(READER_SLOTS, -1)[:, R_PINS : R_PINS + READER_PINS]
    out = sorted(int(x) for x in w[w != 0])
    del w
    return out


def test_unlocked_view_pins_in_its_reader_slot_and_writers_of_both_paths_see_it(name):
    c = _cache(name)
    ref = python_path(SharedCache(name))
    try:
        c.put("a", np.arange(100))
        c.view("a").close()  # (the first view opens a description for the pool, which a word pin gives back)
        fds = len(os.listdir("/proc/self/fd"))
        v1, v2 = c.view("a"), c.view("a")
        v1.__enter__()
        a2 = v2.__enter__()
        assert [w >> 32 for w in _pin_words(c)] == [2]  # one word, two views
        assert len(os.listdir("/proc/self/fd")) == fds  # and no description locked
        for writer in (c, ref):
            assert pinned(writer, "a")
        v1.close()
        assert [w >> 32 for w in _pin_words(c)] == [1] and int(a2.sum()) == 4950
        v2.close()
        assert [w >> 32 for w in _pin_words(c)] == [1]  # a2 still reads the bytes, and holds the pin
        del a2
        assert _pin_words(c) == [] and ref.delete("a")
    finally:
        ref.close()
        c.close()
        c.unlink()


def test_unlocked_views_past_the_slot_words_pin_through_the_kernel(name):
    c = _cache(name)
    try:
        n = READER_PINS + 6
        for i in range(n):
            c.put(f"k{i}", np.full(10, i))
        views = [c.view(f"k{i}") for i in range(n)]
        assert len(_pin_words(c)) == READER_PINS
        for i, v in enumerate(views):
            assert pinned(c, f"k{i}")
            with v as a:
                assert int(a[0]) == i
        # (an array still referenced after its view's end would keep its pin: the documented lifetime of a view)
        assert _pin_words(c) == [] and all(c.delete(f"k{i}") for i in range(n))
    finally:
        c.close()
        c.unlink()


def _view_and_wait(name: str, ready) -> None:
    c = SharedCache(name)
    with c.view("a") as a:
        assert int(a.sum()) == 4950
        ready.set()
        time.sleep(60)  # (to be SIGKILLed: an Event waited on here would be left counting a dead sleeper)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_unlocked_sigkilled_viewer_frees_its_pins_at_once(name):
    c = _cache(name)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_view_and_wait, args=(name, ready))
    try:
        c.put("a", np.arange(100))
        p.start()
        assert ready.wait(30)
        assert len(_pin_words(c)) == 1
        assert pinned(c, "a")
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert c.delete("a")  # its slot's lock went with it: its pin word counts no more
    finally:
        reap([p], 5)
        c.close()
        c.unlink()


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_unlocked_forked_child_keeps_an_inherited_view_pinned(name):
    """A pin word is the parent's alone: before a fork it moves to a description's lock, which the child inherits,
    so the child's view stays pinned after the parent's ends."""
    c = _cache(name)
    try:
        c.put("a", np.arange(100))
        v = c.view("a")
        a = v.__enter__()
        assert len(_pin_words(c)) == 1
        r, w = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.close(w2)
                os.read(r2, 1)  # the parent closed its view and tried to delete
                ok = int(a.sum()) == 4950
                v.close()
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        os.close(r2)
        assert _pin_words(c) == []  # moved to a description before the fork
        v.close()
        assert pinned(c, "a")  # the child's inherited view still pins it
        os.write(w2, b"x")
        assert os.read(r, 1) == b"1"
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w2)
        assert c.delete("a")
    finally:
        c.close()
        c.unlink()


def test_unlocked_python_writers_fence_as_a_weakly_ordered_machine_needs(name, monkeypatch):
    """Where stores are not seen in program order (aarch64), the Python path's writer fences after making a
    stripe's word (or ``seq``) odd and before making it even again, with membarrier's full barrier, which this
    kernel gives (also in a fork's child, which registers again); on x86-64 the even store needs none."""
    from shmcache import seqlock
    from shmcache.layout.dtypes import H_SEQ

    assert seqlock.membarrier_fence()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if seqlock.membarrier_fence() else 1)
    assert os.waitpid(pid, 0)[1] == 0
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, policy="s3fifo") as c:
        python_path(c)
        h, stripes = c._seg.header_words, c._seg.stripe_words

        def odd() -> int:  # whether a word is open: seq, or the stripes the open mask names (all of them odd)
            named = [k for k in range(STRIPES) if stripes[S_OPEN] >> k & 1]
            return int(h[H_SEQ] & 1 or bool(named) and all(stripes[STRIPE_WORDS * (1 + k)] & 1 for k in named))

        seen = []
        monkeypatch.setattr(seqlock, "TSO", False)
        monkeypatch.setattr(seqlock, "_fence", lambda: seen.append(odd()))
        c.put("a", b"x")
        assert seen == [1, 1]  # after the odd store, and before the even one: both while the stripe is odd
        assert not odd() and stripes[S_OPEN] == 0 and c.get("a") == b"x"
        seen.clear()
        monkeypatch.setattr(seqlock, "TSO", True)
        c.put("b", b"y")
        assert seen == [1]  # x86-64: the fence after the odd store alone
