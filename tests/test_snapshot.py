"""Snapshot files: SharedCache.snapshot, restore, restore_from, the command line; a hostile file, kills mid-write,
writers and readers meanwhile. Run on both paths (the compiled section and SHMCACHE_PURE_PYTHON=1)."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import glob
import json
import multiprocessing as mp
import os
import pickle
import random
import signal
import struct
import time
import tracemalloc
import uuid
import warnings

import numpy as np
import pytest
import xxhash

from shmcache import (
    SharedCache, SnapshotError, SnapshotMismatch, SnapshotVersionError, SnapshotWarning,
)
from shmcache import core
from shmcache import snapshot as snapfile
from shmcache.cli import main
from shmcache.layout.dtypes import MARK_SMALL
from tests.conftest import unique_name
from tests.workers import check_value, entry_of, make_value, reap

CTX = mp.get_context("fork")
MIB = 1 << 20


def _values() -> dict:
    """One value of every kind the cache stores."""
    return {
        "str": "héllo", "bytes": b"\x00raw\xff", "int": -(2**62), "bigint": 2**100, "float": 1.5, "none": None,
        "true": True, "list": [1, "a", [2.5, None]], "dict": {"a": 1, "b": [b"x", {"c": ()}]}, "tuple": (1, (2, "x")),
        "set": {1, 2, 3}, "frozenset": frozenset({"a"}), "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "u8": np.frombuffer(b"abc", dtype=np.uint8).copy(), "cplx": np.array([1 + 2j], dtype=np.complex128),
        "datetime": datetime.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=datetime.timezone.utc),
        "date": datetime.date(2020, 1, 2), "time": datetime.time(3, 4, 5), "delta": datetime.timedelta(days=2),
        "decimal": decimal.Decimal("1.25"), "uuid": uuid.UUID(int=7), "complex": 3 - 4j,
        ("tuple", "key", 1): "a key that is not a str", 42: "an int key", b"bk": "a bytes key",
    }


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.fixture
def other():
    """A second cache name, unlinked after the test."""
    n = unique_name("snap")
    yield n
    try:
        SharedCache.unlink_name(n)
    except FileNotFoundError:
        pass


def _items(c: SharedCache) -> dict:
    return dict(c.items())


def test_snapshot_round_trip_every_value_kind(name, other, tmp_path):
    path = tmp_path / "c.snap"
    values = _values()
    with SharedCache(name, capacity_bytes=MIB, max_entries=256, create=True) as c:
        c.put_many(values)
        c.kind("images").put("img", np.ones((2, 2), dtype=np.int16))
        done = c.snapshot(path)
    assert done.entries == len(values) + 1 and done.nbytes == os.path.getsize(path)
    assert not glob.glob(str(tmp_path / ".*.tmp"))
    with SharedCache(other, capacity_bytes=MIB, max_entries=256, create=True) as d:
        d.kind("first")  # the kind's number here is another one: the file's kind is found by its name
        r = d.restore(path)
        assert (r.restored, r.damaged, r.expired, r.no_room, r.complete) == (len(values) + 1, 0, 0, 0, True)
        got = _items(d)
        assert got.keys() == values.keys()
        for k, v in values.items():
            assert _same(v, got[k]), k
        assert _same(d.kind("images").get("img"), np.ones((2, 2), dtype=np.int16))


@pytest.mark.parametrize("path", ["handed over", "python"])
def test_snapshot_restore_through_the_python_paths_batch(name, other, tmp_path, path):
    """The restore's batches when the compiled section hands them over (the dirty word set: the Python path repairs,
    then stores the batch), and on the Python path alone: both read the entries' fields by name."""
    from shmcache.layout.dtypes import H_DIRTY
    from tests.workers import python_path

    snap = tmp_path / "c.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=256, create=True) as c:
        c.put_many({f"k{i}": make_value(f"k{i}", i, 100) for i in range(50)})
        c.snapshot(snap)
    with SharedCache(other, capacity_bytes=MIB, max_entries=256, create=True) as d:
        if path == "python":
            python_path(d)
        else:
            d._seg.header_words[H_DIRTY] = 1
        r = d.restore(snap)
        assert (r.restored, r.damaged, r.complete) == (50, 0, True)
        for i in range(50):
            check_value(f"k{i}", d.get(f"k{i}"))
        assert d.verify().ok


@pytest.mark.parametrize("path", ["compiled", "handed over", "python"])
def test_restore_a_batch_refused_goes_on_one_at_a_time(name, other, tmp_path, monkeypatch, path):
    """A batch the store refuses whole (here: a key an open view pins on a segment of layout version 11, which
    refuses its replacement) is stored one entry at a time: the pinned one is counted as no room, the rest
    stored. The compiled section refuses the one record itself; handed over (the dirty word set), the batch goes
    through the Python code's batch put and then one put at a time."""
    from shmcache.layout.dtypes import H_DIRTY
    from tests.workers import laid_out_as, python_path

    snap = tmp_path / "c.snap"
    values = {f"k{i}": b"%d-" % i + bytes(100) for i in range(20)}
    with SharedCache(name, capacity_bytes=MIB, max_entries=256, create=True) as c:
        c.put_many(values)
        c.snapshot(snap)
    laid_out_as(monkeypatch, 11)
    with SharedCache(other, capacity_bytes=MIB, max_entries=256, create=True) as d:
        monkeypatch.undo()
        if path == "python":
            python_path(d)
        d.put("k7", b"mine")
        with d.view("k7"):
            if path == "handed over":
                d._seg.header_words[H_DIRTY] = 1
            r = d.restore(snap)
        assert (r.restored, r.no_room, r.damaged) == (19, 1, 0)
        assert _items(d) == {**values, "k7": b"mine"} and d.verify().ok


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_restore_store_goes_one_at_a_time_past_an_entry_over_the_limit(name, path):
    """The restore's store of the rows handed back to Python (``snapshot._store``, after a hand-over stopped the
    compiled section's pass): a batch put refused whole for one entry over a byte limit lowered meanwhile is
    stored one entry at a time, through the handle's own path, that one refused and counted."""
    from shmcache.arena import block_nbytes
    from shmcache.codec import body_checksum, fingerprint
    from shmcache.store import Encoded
    from tests.workers import python_path

    def encoded(key: str, nbytes: int):
        kb, tag, body = key.encode(), ord("B"), bytes(nbytes)
        size = len(kb) + len(body) + 1
        return Encoded(kb, tag, body, fingerprint(kb), body_checksum(tag, body), size, block_nbytes(size))

    with SharedCache(name, capacity_bytes=MIB, max_entries=256, create=True) as c:
        if path == "python":
            python_path(c)
        c.set_limits(max_retained_bytes=4096)
        batch = [(encoded("a", 100), 0), (encoded("big", 8000), 0), (encoded("b", 100), 0)]
        assert snapfile._store(batch, c._path, time.monotonic_ns) == (2, 1)
        assert c.get("a") == bytes(100) and c.get("b") == bytes(100) and "big" not in c and c.verify().ok


def test_snapshot_round_trip_pickle_values(name, other, tmp_path):
    path = tmp_path / "p.snap"
    value = {"obj": datetime.timezone(datetime.timedelta(hours=2)), "n": [1, 2]}
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True, serializer="pickle") as c:
        c.put("v", value)
        c.put("arr", np.arange(5))
        c.snapshot(path)
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True, serializer="pickle") as d:
        assert d.restore(path).restored == 2
        assert d.get("v") == value and _same(d.get("arr"), np.arange(5))


def test_snapshot_holds_the_lock_in_short_batches(name, tmp_path, monkeypatch):
    from tests.workers import count_lock_holds

    monkeypatch.setattr(snapfile, "COPY_ENTRIES", 100)
    with SharedCache(name, capacity_bytes=MIB, max_entries=1024, create=True) as c:
        _filled(c, 950)
        holds = count_lock_holds(monkeypatch, c)
        assert c.snapshot(tmp_path / "b.snap").entries == 950
    copies = [fn for fn in holds if getattr(fn, "__name__", "") == "copy_locked"]
    orders = [fn for fn in holds if getattr(fn, "__name__", "") == "order_locked"]
    assert len(copies) == 10 and len(orders) == 1


def test_snapshot_ttl_expired_skipped_live_keeps_its_remaining_lifetime(name, other, tmp_path):
    path = tmp_path / "t.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c:
        c.put("gone", 1, ttl=0.05)
        c.put("soon", 2, ttl=0.6)
        c.put("long", 3, ttl=100)
        c.put("never", 4)
        time.sleep(0.1)
        assert c.snapshot(path).entries == 3  # "gone" expired before the snapshot
    time.sleep(0.7)  # "soon" expires between the snapshot and the restore
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        r = d.restore(path)
        assert (r.restored, r.expired) == (2, 1)
        assert 98 < d.ttl("long") <= 99.3 and d.ttl("never") is None
        assert "soon" not in d and d["long"] == 3


def test_restore_switches_the_expires_column_on_before_the_compiled_pass(name, other, tmp_path, monkeypatch):
    """Layout 18: a file whose entries expire, restored into a cache that has stored no expiry yet, switches the
    expires column on before the compiled pass begins, so that the pass stores every record itself: the first one
    that expires would hand it over, and with it every record of that read to the Python path's slower pass."""
    path = tmp_path / "e.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=512, create=True) as c:
        for i in range(300):
            c.put(f"k{i}", i, ttl=100 if i % 3 == 0 else None)
        c.snapshot(path)
    python_rows = []
    real = snapfile._insert_rows
    monkeypatch.setattr(snapfile, "_insert_rows", lambda chunk, first, rows, *a: python_rows.append(len(rows))
                        or real(chunk, first, rows, *a))
    with SharedCache(other, capacity_bytes=MIB, max_entries=512, create=True) as d:
        assert not d._seg.expires_shown
        assert d.restore(path).restored == 300
        assert d._seg.expires_shown and d.verify(deep=True).ok
        assert [d[f"k{i}"] for i in range(300)] == list(range(300))
        assert 98 < d.ttl("k3") <= 100 and d.ttl("k4") is None
    if core.PATH == "compiled":
        assert python_rows == []


def test_restore_expires_by_the_handles_own_clock(name, other, tmp_path):
    """A restored entry's time to live runs on the clock of the handle that restores it (``clock=``), as a put's
    does, on either path."""
    path = tmp_path / "c.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c:
        c.put("long", 3, ttl=100)
        c.put("never", 4)
        c.snapshot(path)
    now = [10**12]
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True, clock=lambda: now[0]) as d:
        assert d.restore(path).restored == 2
        assert 98 < d.ttl("long") <= 100
        now[0] += 99 * 10**9
        assert d.get("long") == 3
        now[0] += 2 * 10**9
        assert d.get("long") is None and d.get("never") == 4


def test_snapshot_skips_an_entry_whose_expiry_is_damaged(name, other, tmp_path):
    """An expiry word damaged to a time no entry can live to (its wall time would overflow the record) costs that
    entry, as a damaged record does; the snapshot is written, and the others restore."""
    path = tmp_path / "x.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c:
        for i in range(10):
            c.put(i, i, ttl=100)
        e = c._seg.geometry.entry_slots - 1
        e = next(s for s in range(1, e) if c._seg.expires_words[s])
        c._seg.expires_words[e] = 2**63 - 1
        info = c.snapshot(path)
        assert info.entries == 9
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        r = d.restore(path)
        assert r.complete and r.restored == 9 and r.damaged == 0
        assert all(d.get(i) in (None, i) for i in range(10)) and len(d) == 9


def _filled(c: SharedCache, n: int) -> None:
    for i in range(n):
        c.put(i, f"value {i}".encode() * 3)


def test_restore_into_half_the_capacity_keeps_the_most_recently_read_lru(name, other, tmp_path):
    path = tmp_path / "h.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True, policy="lru") as c:
        _filled(c, 40)
        read = [3, 17, 5, 30, 11, 0, 22, 8, 36, 14]
        for k in read:
            assert c.get(k) is not None
        order = list(c)  # most recently used first
        c.snapshot(path)
    assert order[:10] == read[::-1]
    with SharedCache(other, capacity_bytes=MIB, max_entries=20, create=True, policy="lru") as d:
        r = d.restore(path)
        assert (r.restored, r.no_room) == (20, 20)
        assert list(d) == order[:20]  # the same order: the hottest restored last
        assert all(d.get(k) == f"value {k}".encode() * 3 for k in read)


def test_restore_backs_the_pages_ahead_of_its_stores_and_stops(name, other, tmp_path, monkeypatch):
    """A large restore backs the arena it will fill in a thread, ahead of the stores: the pages it needs are backed
    once it ends, the thread is gone, and the cache holds no more memory than its entries' blocks reach (and
    only the pages past the extent that they will need: a restore of nothing backs nothing)."""
    import threading

    snap = tmp_path / "big.snap"
    with SharedCache(name, capacity_bytes=96 * MIB, max_entries=4096, create=True) as c:
        c.put_many({f"k{i}": make_value(f"k{i}", i, 16_000) for i in range(4000)})
        c.snapshot(snap)
    with SharedCache(other, capacity_bytes=96 * MIB, max_entries=4096, create=True) as d:
        held = os.fstat(d._seg.fd).st_blocks * 512
        assert held < 16 * MIB
        backed = []
        real = snapfile._back_ahead

        def watched(seg, nbytes):
            stop = real(seg, nbytes)
            backed.append(nbytes)
            return stop

        monkeypatch.setattr(snapfile, "_back_ahead", watched)
        r = d.restore(snap)
        assert (r.restored, r.damaged, r.complete) == (4000, 0, True)
        assert backed and backed[0] >= 4000 * 16_000
        assert not [t for t in threading.enumerate() if t.name == "shmcache-restore-back"]
        ext = d._seg.extent()
        held = os.fstat(d._seg.fd).st_blocks * 512
        seg = d._seg
        tables = sum(stop - start for start, stop in seg.geometry.backed(seg.mask + 1, seg.shown[2], 0))
        assert tables + 4000 * 16_000 <= held <= tables + ext + 32 * MIB
        for i in range(0, 4000, 97):
            check_value(f"k{i}", d.get(f"k{i}"))
        assert d.verify().ok


def test_restore_into_half_the_bytes_keeps_the_hottest(name, other, tmp_path):
    path = tmp_path / "b.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True, policy="lru") as c:
        for i in range(40):
            c.put(i, b"x" * 1000)
        order = list(c)
        c.snapshot(path)
    with SharedCache(other, capacity_bytes=64 * 1024, max_entries=64, create=True, policy="lru") as d:
        d.set_limits(max_retained_bytes=20 * 1010)
        r = d.restore(path)
        assert r.restored == 20 and r.no_room == 20 and list(d) == order[:20]


def test_restore_s3fifo_keeps_main_then_the_most_hit(name, other, tmp_path):
    """s3fifo: the file holds main's entries, then small's, each queue by its hit counter, then newest first."""
    path = tmp_path / "s.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=20, create=True, policy="s3fifo") as c:
        _filled(c, 20)
        for _ in range(2):
            for k in range(10):
                c.get(k)
        for k in range(20, 30):  # evictions: small's oldest that were hit twice move to main
            c.put(k, b"new")
        c.get(25)
        marks = c._seg.marks_bytes
        main = {k for k in c if not marks[entry_of(c, k)] & MARK_SMALL}
        assert main and len(main) < len(c)
        c.snapshot(path)
    with SharedCache(other, capacity_bytes=MIB, max_entries=len(main), create=True, policy="s3fifo") as d:
        assert d.restore(path).restored == len(main)
        assert set(d) == main
    with SharedCache(unique_name("snap"), capacity_bytes=MIB, max_entries=len(main) + 1, create=True,
                     policy="s3fifo") as e:
        try:
            e.restore(path)
            assert set(e) == main | {25}  # then small's most hit
        finally:
            e.unlink()


@pytest.mark.parametrize("policy", ["s3fifo", "auto"])
def test_restore_gives_each_entry_the_queue_and_counter_it_had(name, other, tmp_path, policy):
    """A snapshot of an s3fifo or auto cache carries each entry's marks (its queue and hit counter), and a restore
    into a cache of either policy places each new entry by them: main's entries in main with their counters, not
    all of them in small with counters at 0, where the next puts would evict them first. (Under auto, a window at
    its target gives its oldest to main as a restore fills it, as any fill does: all but its target's worth of an
    s3fifo cache's small queue.)"""
    path = tmp_path / "m.snap"
    rng = random.Random(5)
    with SharedCache(name, capacity_bytes=4 * MIB, max_entries=1000, create=True, policy=policy) as c:
        for i in range(1600):
            c.put(f"k{i}", make_value(f"k{i}", i, 40))
            for _ in range(rng.randrange(3) if i % 2 else 0):
                c.get(f"k{rng.randrange(i + 1)}")
        before = {k: c._seg.marks_bytes[entry_of(c, k)] for k in c}
        assert {m & MARK_SMALL for m in before.values()} == {0, MARK_SMALL} and any(m & 3 for m in before.values())
        c.snapshot(path)
    for target in ("s3fifo", "auto"):
        with SharedCache(unique_name("marks"), capacity_bytes=4 * MIB, max_entries=1000, create=True,
                         policy=target) as d:
            try:
                assert d.restore(path).restored == len(before)
                after = {k: d._seg.marks_bytes[entry_of(d, k)] for k in d}
                assert after.keys() == before.keys()
                main = [k for k, m in before.items() if not m & MARK_SMALL]
                assert all(after[k] == before[k] for k in main)  # main's, with their counters
                moved = [k for k, m in before.items() if m & MARK_SMALL and after[k] != before[k]]
                assert not any(after[k] & MARK_SMALL for k in moved)  # (its counter reset, as such a move does)
                if target == policy:  # (auto's window is its own: an s3fifo small queue's entries pass to main)
                    assert len(moved) <= (1 if target == "auto" else 0)
                assert d.verify().ok and d.stats().entries == len(before)
                for k in before:
                    check_value(k, d.get(k))
            finally:
                d.unlink()
    with SharedCache(unique_name("marks"), capacity_bytes=4 * MIB, max_entries=1000, create=True,
                     policy="lru") as e:  # another policy takes them as it takes any new key
        try:
            assert e.restore(path).restored == len(before) and not any(e._seg.marks_bytes[entry_of(e, k)] for k in e)
            assert e.verify().ok
        finally:
            e.unlink()


def test_restore_keep_keeps_the_newest(name, other, tmp_path):
    """keep: nothing moves on a hit, so the file's order is the newest first, and so is what a smaller cache
    keeps."""
    path = tmp_path / "k.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True, policy="keep") as c:
        _filled(c, 40)
        for k in range(10):
            c.get(k)
        c.snapshot(path)
    with SharedCache(other, capacity_bytes=MIB, max_entries=20, create=True, policy="keep") as d:
        r = d.restore(path)
        assert (r.restored, r.no_room) == (20, 20) and set(d) == set(range(20, 40))
        _filled(d, 0)
        assert d.restore(path).restored == 20  # into a full keep cache: the keys present are replaced


# ------------------------------------------------------------------------------------------- a hostile file


def _records(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    """(where the records start, each record's (offset, length)), parsed as docs/internals.md describes."""
    _, _, _, meta_nbytes, _ = struct.unpack_from("<8sHHIQ", data)
    p = 24 + meta_nbytes + 8
    out = []
    while data[p : p + 4] == snapfile.SYNC:
        _, klen, blen = struct.unpack_from("<4sII", data, p)
        out.append((p, 32 + klen + blen + 8))
        p += 32 + klen + blen + 8
    assert data[p : p + 4] == snapfile.END and len(data) == p + 32
    return out[0][0], out


@pytest.fixture
def small_snapshot(name, tmp_path):
    values = {f"k{i}": (i, "v" * (i % 13), bytes(range(i % 40))) for i in range(24)}
    values["arr"] = np.arange(20, dtype=np.int64)
    path = tmp_path / "small.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c:
        c.put_many(values)
        c.put("ttl", "t", ttl=300)
        values["ttl"] = "t"
        c.snapshot(path)
    return path, values


def test_restore_every_single_byte_flip_costs_at_most_its_record(other, tmp_path, small_snapshot):
    path, values = small_snapshot
    data = path.read_bytes()
    start, records = _records(data)
    rng = random.Random(5)
    offsets = sorted(set(rng.randrange(len(data)) for _ in range(400)) | set(range(0, start, 7)))
    bad = tmp_path / "bad.snap"
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        for off in offsets:
            flipped = bytearray(data)
            flipped[off] ^= rng.randrange(1, 256)
            bad.write_bytes(flipped)
            d.clear()
            if off < start:
                with pytest.raises(SnapshotError):  # the header: its checksum covers every byte
                    d.restore(bad)
                continue
            r = d.restore(bad)
            got = _items(d)
            for k, v in got.items():
                assert _same(values[k], v), (off, k)  # never a wrong value
            lost = len(values) - len(got)
            touched = sum(p <= off < p + n for p, n in records)
            assert lost == touched <= 1, off
            in_trailer = off >= records[-1][0] + records[-1][1]
            assert r.damaged == lost and r.restored == len(got) and r.complete == (not touched and not in_trailer)


@pytest.mark.parametrize("python", [False, True])
def test_restore_of_a_record_whose_key_reads_as_an_unknown_kind_is_not_complete(other, tmp_path, small_snapshot,
                                                                                  python):
    """A flip that turns a record's first key byte into the kind mark (the head's checksum does not cover the key):
    the first pass finds a kind the file never named, so the record is lost, counted damaged, and the restore is not
    complete, as for a record whose checksum fails."""
    from tests.workers import python_path

    path, values = small_snapshot
    data = bytearray(path.read_bytes())
    _, records = _records(bytes(data))
    p, _ = records[3]
    data[p + 32] = 0xF5  # (the record's key, after its 32-byte head: now the kind mark, of a kind never named)
    bad = tmp_path / "kind.snap"
    bad.write_bytes(bytes(data))
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        if python:
            python_path(d)
        r = d.restore(bad)
        assert (r.damaged, r.restored, r.complete) == (1, len(values) - 1, False)
        assert all(_same(values[k], v) for k, v in _items(d).items())


def _restored(name: str, path, python: bool, capacity: int, entries: int, policy: str, ttl_ms: int = 0):
    """What a restore of ``path`` into a new cache did, on the Python path or the compiled one: its result (less the
    time), every item, the counts that a store moves, and the policy's order (the keys from the next to go)."""
    from tests.workers import python_path

    with SharedCache(name, capacity_bytes=capacity, max_entries=entries, policy=policy, create=True) as d:
        if python:
            python_path(d)
        try:
            d.kind("later")  # another number here than in the file: the kinds are found by name
            r = d.restore(path)
            st = d.stats()
            counts = (st.entries, st.retained_bytes, st.puts, st.evictions, st.too_large, st.kinds)
            items = list(d.items())  # in the policy's order
            marks = [d._seg.marks_bytes[entry_of(d, k)] for k, _ in items]  # (s3fifo, auto: queue and counter)
            return r._replace(seconds=0), dict(items), counts, [k for k, _ in items], d.verify().ok, marks
        finally:
            d.unlink()


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "keep", "auto"])
def test_restore_compiled_and_python_paths_agree_on_damaged_files(name, other, tmp_path, policy):
    """The compiled section's two passes (Core.snapshot_plan, snapshot_restore) are held to the Python ones on the
    same files: whole, with bytes flipped in heads, keys, bodies and checks, cut short, with garbage and copies of
    records spliced in, restored into a cache that takes all or half of it: the same result, the same items, the
    same counts, the same order and the same marks, and a cache that verifies."""
    from shmcache import core

    if core.PATH != "compiled":
        pytest.skip("the compiled section is not built")
    rng = random.Random(31)
    path = tmp_path / "d.snap"
    with SharedCache(name, capacity_bytes=8 * MIB, max_entries=512, create=True, policy=policy) as c:
        for i in range(120):
            n = rng.choice([0, 1, 30, 239, 241, 1000, 1024, 3000, 70_000])
            c.put(f"k{i}", make_value(f"k{i}", i, n), ttl=300 if i % 7 == 0 else None)
        c.kind("images").put("img", np.ones((64, 64), dtype=np.int16))
        c.kind("text").put_many({f"t{i}": "x" * i for i in range(30)})
        c.put("gone", "soon", ttl=0.05)
        for i in range(0, 120, 3):
            c.get(f"k{i}")
        c.snapshot(path)
    time.sleep(0.06)  # "gone" expires: counted expired by the first pass
    data = path.read_bytes()
    start, records = _records(data)
    variants = [data, data[: len(data) - 40], data[: records[len(records) // 2][0] + 50]]
    for _ in range(12):  # flips
        b = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            off = rng.randrange(start, len(b))
            b[off] ^= rng.randrange(1, 256)
        variants.append(bytes(b))
    for p, n in rng.sample(records, 4):  # a head's length fields, a record copied, garbage spliced in
        b = bytearray(data)
        b[p + 4 : p + 8] = rng.randbytes(4)
        variants.append(bytes(b))
        variants.append(data[: p + n] + data[p : p + n] + data[p + n :])
        variants.append(data[:p] + rng.randbytes(rng.randrange(1, 200)) + data[p:])
    bad = tmp_path / "v.snap"
    total = sum(n for _, n in records)
    seen = set()
    for i, v in enumerate(variants):
        bad.write_bytes(v)
        for capacity in (16 * MIB, total // 2):
            a = _restored(unique_name("diffc"), bad, False, capacity, 512, policy)
            b = _restored(unique_name("diffp"), bad, True, capacity, 512, policy)
            assert a[0] == b[0], (i, capacity)
            assert a[1].keys() == b[1].keys() and all(_same(a[1][k], b[1][k]) for k in a[1]), (i, capacity)
            assert a[2:] == b[2:], (i, capacity)
            assert a[4]
            r = a[0]
            seen |= {what for what, n in (("damaged", r.damaged), ("expired", r.expired), ("no_room", r.no_room),
                                          ("incomplete", not r.complete)) if n}
    assert seen == {"damaged", "expired", "no_room", "incomplete"}  # every judgement was made on both paths


def test_restore_truncated_keeps_the_whole_records_before_the_cut(other, tmp_path, small_snapshot):
    path, values = small_snapshot
    data = path.read_bytes()
    start, records = _records(data)
    cut_file = tmp_path / "cut.snap"
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        for cut in sorted(set(random.Random(7).sample(range(start, len(data)), 60)) | {start, len(data) - 1}):
            cut_file.write_bytes(data[:cut])
            d.clear()
            r = d.restore(cut_file)
            whole = sum(p + n <= cut for p, n in records)
            got = _items(d)
            assert len(got) == r.restored == whole and not r.complete
            assert all(_same(values[k], v) for k, v in got.items())


def _forged(records: list[tuple[bytes, int, int, int]], seed: int = 1, major: int = 1,
            meta: dict | None = None) -> bytes:
    """A file with a valid header and the given record headers (key_nbytes, body_nbytes, tag, expires), each with a
    valid header check, and no bodies."""
    import msgpack

    m = msgpack.packb(meta or {"serializer": "msgpack", "kinds": {}})
    head = struct.pack("<8sHHIQ", snapfile.MAGIC, major, 0, len(m), seed) + m
    out = head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
    for sync, klen, blen, tag in records:
        h = struct.pack("<4sIIBBHq", sync, klen, blen, tag, 0, 0, 0)
        out += h + struct.pack("<Q", xxhash.xxh3_64_intdigest(h, seed))
    return out


def test_restore_absurd_lengths_do_not_allocate(other, tmp_path):
    bad = tmp_path / "absurd.snap"
    bad.write_bytes(_forged([(snapfile.SYNC, 2**32 - 1, 2**32 - 1, ord("M")), (snapfile.SYNC, 3, 2**31, ord("B"))])
                    + b"\0" * 100)
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        tracemalloc.start()
        try:
            r = d.restore(bad)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert r.restored == 0 and r.damaged >= 1 and not r.complete and peak < 16 * MIB
        bad.write_bytes(struct.pack("<8sHHIQ", snapfile.MAGIC, 1, 0, 2**32 - 1, 0) + b"\0" * 64)
        with pytest.raises(SnapshotError, match="out of range"):
            d.restore(bad)
        bad.write_bytes(_forged([], major=2))
        with pytest.raises(SnapshotVersionError, match="2.0"):
            d.restore(bad)
        bad.write_bytes(_forged([], meta={"serializer": "marshal", "kinds": {}}))
        with pytest.raises(SnapshotError, match="fields"):
            d.restore(bad)
        bad.write_bytes(b"")
        with pytest.raises(SnapshotError, match="no magic"):
            d.restore(bad)
        with pytest.raises(FileNotFoundError):
            d.restore(tmp_path / "none.snap")
        assert len(d) == 0


# ------------------------------------------------------------------------------------------- processes


def _snapshot_forever(name: str, path: str) -> None:
    with SharedCache(name, create=False) as c:
        while True:
            c.snapshot(path)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_snapshot_killed_at_random_points_leaves_a_whole_file(name, other, tmp_path):
    path = tmp_path / "killed.snap"
    n = 3000
    with SharedCache(name, capacity_bytes=4 * MIB, max_entries=4096, create=True) as c:
        for i in range(0, n, 500):
            c.put_many({i + j: f"{i + j}".encode() * 10 for j in range(500)})
        t = time.perf_counter()
        c.snapshot(path)
        one = time.perf_counter() - t
    rng = random.Random(11)
    with SharedCache(other, capacity_bytes=4 * MIB, max_entries=4096, create=True) as d:
        for _ in range(20):
            p = CTX.Process(target=_snapshot_forever, args=(name, str(path)))
            p.start()
            try:
                time.sleep(0.05 + rng.random() * 3 * one)
                os.kill(p.pid, signal.SIGKILL)
            finally:
                reap([p], 10)
            d.clear()
            r = d.restore(path)
            assert r.complete and r.restored == n and r.damaged == 0
            assert d.get(1234) == b"1234" * 10
    for leftover in glob.glob(str(tmp_path / ".*")):
        assert os.path.basename(leftover).startswith(".killed.snap.snapshot-") and leftover.endswith(".tmp")


def _hold_flock(path: str, ready, done) -> None:
    """A writer still at work: holds the flock of its temporary file until told to stop."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    done.wait(30)
    os.close(fd)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_snapshot_sweeps_what_killed_writers_left_and_nothing_else(name, tmp_path):
    """A snapshot removes the temporary files of its path that killed writers left (old, their flock free), and
    keeps a young one, one whose writer still holds its flock, another path's, and a link (not followed)."""
    path = tmp_path / "s.snap"
    old = time.time() - 2 * snapfile.STALE_TMP_S

    def made(n: str, age: float | None = old) -> str:
        p = tmp_path / n
        p.write_bytes(b"half a snapshot")
        if age is not None:
            os.utime(p, (age, age))
        return str(p)

    orphans = [made(".s.snap.snapshot-123-00aa11bb.tmp"), made(".s.snap.snapshot-9-deadbeef.tmp")]
    young = made(".s.snap.snapshot-77-0badf00d.tmp", None)
    held = made(".s.snap.snapshot-78-c0ffee00.tmp")
    other_path = made(".t.snap.snapshot-5-12345678.tmp")
    target = made("precious")
    link = tmp_path / ".s.snap.snapshot-6-87654321.tmp"
    os.symlink(target, link)
    os.utime(link, (old, old), follow_symlinks=False)
    ready, done = CTX.Event(), CTX.Event()
    writer = CTX.Process(target=_hold_flock, args=(held, ready, done))
    writer.start()
    try:
        assert ready.wait(20)
        with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c:
            c.put("k", b"v")
            c.snapshot(path)
            assert not any(os.path.exists(p) for p in orphans)
            assert all(os.path.exists(p) for p in (young, held, other_path, target)) and os.path.islink(link)
            done.set()
            reap([writer], 20)
            c.snapshot(path)  # its writer gone now
            assert not os.path.exists(held) and os.path.exists(young) and os.path.islink(link)
            assert c.restore(path).restored == 1  # and the snapshots themselves whole
            assert open(target, "rb").read() == b"half a snapshot"
    finally:
        done.set()
        reap([writer], 20)


def _serve(name: str, keys: int, seconds: float, seed: int, q) -> None:
    rng = random.Random(seed)
    wrong = done = 0
    try:
        with SharedCache(name, create=False) as c:
            end = time.monotonic() + seconds
            seq = seed * 1_000_000
            while time.monotonic() < end:
                key = f"k{rng.randrange(keys)}"
                if rng.random() < 0.3:
                    seq += 1
                    c.put(key, make_value(key, seq, rng.randrange(10, 600)))
                else:
                    v = c.get(key)
                    if v is not None:
                        try:
                            check_value(key, v)
                        except AssertionError:
                            wrong += 1
                done += 1
        q.put((wrong, done, None))
    except BaseException as exc:  # reported, so that the parent fails with it
        q.put((wrong, done, repr(exc)))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_snapshot_while_others_read_and_write(name, other, tmp_path):
    keys, seconds = 400, 3.0
    path = tmp_path / "busy.snap"
    with SharedCache(name, capacity_bytes=2 * MIB, max_entries=1024, create=True) as c, \
            SharedCache(other, capacity_bytes=2 * MIB, max_entries=1024, create=True) as d:
        for i in range(keys):
            c.put(f"k{i}", make_value(f"k{i}", i, 100))
        q = CTX.Queue()
        procs = [CTX.Process(target=_serve, args=(name, keys, seconds, s + 1, q)) for s in range(3)]
        for p in procs:
            p.start()
        try:
            snaps = 0
            end = time.monotonic() + seconds
            while time.monotonic() < end or snaps < 3:
                written = c.snapshot(path)
                d.clear()
                r = d.restore(path)
                assert r.complete and r.restored == written.entries > 0
                for k, v in d.items():
                    check_value(k, v)  # each a value some writer wrote for that key
                snaps += 1
            results = [q.get(timeout=60) for _ in procs]
        finally:
            reap(procs, 60)
        assert [err for _, _, err in results] == [None] * 3
        assert sum(w for w, _, _ in results) == 0 and all(n > 0 for _, n, _ in results)
        assert c.verify().ok


def _open_restoring(name: str, path: str, barrier, q) -> None:
    try:
        barrier.wait(30)
        with SharedCache(name, capacity_bytes=MIB, max_entries=256, restore_from=path) as c:
            q.put(None if c.restored is None else c.restored.restored)
    except BaseException as exc:
        q.put(repr(exc))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_restore_from_with_several_processes_opening_at_once_restores_once(name, other, tmp_path):
    path = tmp_path / "once.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=256, create=True) as c:
        _filled(c, 200)
        c.snapshot(path)
    barrier, q = CTX.Barrier(4), CTX.Queue()
    procs = [CTX.Process(target=_open_restoring, args=(other, str(path), barrier, q)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        got = [q.get(timeout=30) for _ in procs]
    finally:
        reap(procs, 30)
    assert sorted(got, key=str) == [200, None, None, None]
    with SharedCache(other, create=False) as d:
        s = d.stats()
        assert s.puts == 200 and s.entries == 200 and d.get(7) == b"value 7" * 3


def test_restore_from_missing_file_is_silent_and_damaged_warns(other, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SharedCache(other, capacity_bytes=MIB, max_entries=64, restore_from=tmp_path / "none.snap") as c:
            assert c.restored is None and len(c) == 0
            c.unlink()
    bad = tmp_path / "bad.snap"
    bad.write_bytes(b"\x89SHMSNAP" + b"\xff" * 40)
    with pytest.warns(SnapshotWarning, match="starts empty"):
        with SharedCache(other, capacity_bytes=MIB, max_entries=64, restore_from=bad) as c:
            assert c.restored is None and len(c) == 0
            with pytest.raises(SnapshotError):
                c.restore(bad)
            c.unlink()


def test_restore_from_only_when_created(name, tmp_path):
    path = tmp_path / "c.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c:
        c.put("a", 1)
        c.snapshot(path)
        c.clear()
        with SharedCache(name, restore_from=path) as again:  # attaches: restores nothing
            assert again.restored is None and len(c) == 0


@pytest.mark.parametrize("serializers", [("pickle", "msgpack"), ("msgpack", "pickle")])
def test_restore_refuses_another_serializer_without_unpickling(name, other, tmp_path, monkeypatch, serializers):
    taken, into = serializers
    path = tmp_path / "ser.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True, serializer=taken) as c:
        c.put("a", {"x": 1})
        c.put("b", b"raw")

        def refuse(*args, **kwargs):
            raise AssertionError("unpickled")

        monkeypatch.setattr(pickle, "loads", refuse)
        c.snapshot(path)
    with SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True, serializer=into) as d:
        with pytest.raises(SnapshotMismatch, match=f"serializer={taken!r}.*serializer={into!r}") as err:
            d.restore(path)
        assert (err.value.snapshot, err.value.cache) == (taken, into) and isinstance(err.value, ValueError)
        assert len(d) == 0


def test_cli_snapshot_and_restore(capsys, name, other, tmp_path):
    path = str(tmp_path / "cli.snap")
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c, \
            SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        _filled(c, 30)
        assert main(["snapshot", name, path, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["entries"] == 30 and out["nbytes"] == os.path.getsize(path)
        assert main(["restore", other, path, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["restored"], out["damaged"], out["complete"]) == (30, 0, True)
        assert dict(d.items()) == dict(c.items())
        assert main(["restore", other, path]) == 0
        assert "restored 30 entries" in capsys.readouterr().out
        assert main(["restore", other, str(tmp_path / "none")]) == 1


def test_asnapshot_and_arestore(name, other, tmp_path):
    path = tmp_path / "a.snap"
    with SharedCache(name, capacity_bytes=MIB, max_entries=64, create=True) as c, \
            SharedCache(other, capacity_bytes=MIB, max_entries=64, create=True) as d:
        _filled(c, 5)

        async def both():
            await c.asnapshot(path)
            return await d.arestore(path)

        assert asyncio.run(both()).restored == 5 and d[4] == b"value 4" * 3
