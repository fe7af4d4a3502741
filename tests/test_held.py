"""A view never blocks a writer (layout version 12): a put, delete, pop or clear of an entry a view pins succeeds, the
old entry is held aside for the view, which reads exactly the bytes it was given, and its slot and block come back
once the last pin ends. Every test runs on the path in force (the suite runs on both)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal

import numpy as np
import pytest
import xxhash

from shmcache import POLICIES, CorruptionError, SharedCache
from shmcache import table as table_module
from shmcache.layout.dtypes import H_DIRTY, S_HELD, S_HELD_BYTES
from tests.workers import reap

JOIN_S = 60
ctx = mp.get_context("fork")


def _value(key: str, seq: int, n: int = 64) -> np.ndarray:
    """A value that carries its key and a checksum: n int64 words, the last the xxh64 of the others and the key."""
    body = np.arange(n - 1, dtype=np.int64) * (seq + 1) + len(key)
    check = xxhash.xxh64_intdigest(body.tobytes() + key.encode()) & (2**63 - 1)
    return np.append(body, np.int64(check))


def _intact(key: str, arr) -> bool:
    arr = np.asarray(arr)
    return int(arr[-1]) == xxhash.xxh64_intdigest(arr[:-1].tobytes() + key.encode()) & (2**63 - 1)


def _put_in_child(name: str, key: str, seq: int) -> None:
    """Another process's put of ``key``; exits 0 once it is stored."""
    def run(q) -> None:
        with SharedCache(name) as c:
            c.put(key, _value(key, seq))
            q.put(c.get(key) is not None)

    q = ctx.Queue()
    p = ctx.Process(target=run, args=(q,))
    p.start()
    try:
        assert q.get(timeout=JOIN_S) is True
    finally:
        reap([p], JOIN_S)
    assert p.exitcode == 0


def _held(c: SharedCache) -> tuple[int, int]:
    s = c.stats()
    return s.held_entries, s.held_bytes


@pytest.mark.parametrize("policy", POLICIES)
def test_another_process_replaces_a_viewed_key_and_the_old_block_comes_back(name, policy):
    with SharedCache(name, capacity_bytes=1 << 20, policy=policy, create=True) as c:
        c.put("k", _value("k", 0))
        c.put("other", _value("other", 0))
        alone = c.stats().arena_used_bytes  # two entries of these sizes, nothing held
        with c.view("k") as arr:
            before = bytes(arr.tobytes())
            _put_in_child(name, "k", 1)  # succeeds: the view does not block it
            assert np.array_equal(c.get("k"), _value("k", 1))
            assert arr.tobytes() == before and _intact("k", arr)  # exactly the bytes it was given
            n, nbytes = _held(c)
            assert n == 1 and nbytes > 0 and len(c) == 2 and c.verify().ok
            assert c.stats().arena_used_bytes > alone
        del arr  # the pin ends with the array
        c.put("k", _value("k", 2))  # the next store gives the held block back
        assert _held(c) == (0, 0) and c.stats().arena_used_bytes == alone
        assert np.array_equal(c.get("k"), _value("k", 2)) and _intact("other", c.get("other"))
        assert c.verify().ok
        c.unlink()


@pytest.mark.parametrize("policy", POLICIES)
def test_delete_pop_and_clear_of_viewed_keys_succeed(name, policy):
    with SharedCache(name, capacity_bytes=1 << 20, policy=policy, create=True) as c:
        for k in ("a", "b", "c", "d"):
            c.put(k, _value(k, 0))
        with c.view("a") as a, c.view("b") as b, c.view("c") as cc:
            assert c.delete("a") and "a" not in c
            assert np.array_equal(c.pop("b"), _value("b", 0)) and "b" not in c
            c.clear()
            assert len(c) == 0 and c.stats().entries == 0 and _held(c)[0] == 3
            assert _intact("a", a) and _intact("b", b) and _intact("c", cc)
            assert c.verify().ok
            c.put("c", _value("c", 5))  # the key is free at once
            assert np.array_equal(c.get("c"), _value("c", 5)) and _intact("c", cc)
        del a, b, cc
        c.put("e", _value("e", 0))
        assert _held(c) == (0, 0) and c.verify().ok
        c.unlink()


def test_an_expired_viewed_entry_is_held_when_its_key_is_stored_again(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.put("k", _value("k", 0), ttl=0.05)
        with c.view("k") as arr:
            import time
            time.sleep(0.1)
            assert "k" not in c
            c.put("k", _value("k", 1))
            assert np.array_equal(c.get("k"), _value("k", 1)) and _intact("k", arr) and _held(c)[0] == 1
        del arr
        c.put("x", 1)
        assert _held(c) == (0, 0) and c.verify().ok
        c.unlink()


def _replace_three_while_viewed(c, keys) -> None:
    with c.view(keys[0]) as a0, c.view(keys[1]) as a1, c.view(keys[2]) as a2:
        for k in keys[:3]:
            c.put(k, _value(k, 1))  # each old one held: 3 held and 8 resident would be 11
        s = c.stats()
        assert s.held_entries == 3 and s.entries + s.held_entries <= 8
        assert s.retained_bytes + s.held_bytes <= s.max_retained_bytes
        assert all(_intact(k, a) and np.array_equal(a, _value(k, 0)) for k, a in zip(keys, (a0, a1, a2)))


def test_held_entries_count_against_the_limits(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=8, create=True) as c:
        keys = [f"k{i}" for i in range(8)]
        for k in keys:
            c.put(k, _value(k, 0))
        _replace_three_while_viewed(c, keys)
        for k in keys:
            c.put(k, _value(k, 2))
        s = c.stats()
        assert s.held_entries == 0 and s.entries == 8 and c.verify().ok
        c.unlink()


@pytest.mark.parametrize("policy", POLICIES)
def test_resizes_keep_held_entries_out_of_the_index(name, policy):
    """A resize while entries are held: a new entry limit (another index, rebuilt from the entries), a smaller one
    (the tables packed), a smaller capacity (the ring compacted): the held entries stay where their views read
    them, and never come back into the index beside their key's newer value."""
    keys = [f"k{i}" for i in range(200)]
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=1000, policy=policy, create=True) as c:
        for k in keys:
            c.put(k, _value(k, 0))
        with c.view("k3") as a, c.view("k150") as b:
            c.put("k3", _value("k3", 1))
            c.put("k150", _value("k150", 1))
            assert _held(c)[0] == 2
            for limits in ({"max_entries": 4000}, {"max_entries": 300}, {"capacity_bytes": 512 << 10},
                           {"max_entries": 1000, "capacity_bytes": 1 << 20}):
                c.resize(**limits)
                assert np.array_equal(c.get("k3"), _value("k3", 1)) and np.array_equal(c.get("k150"), _value("k150", 1))
                assert _intact("k3", a) and np.array_equal(a, _value("k3", 0))
                assert _intact("k150", b) and np.array_equal(b, _value("k150", 0))
                assert _held(c)[0] == 2 and c.verify().ok, limits
        del a, b
        c.put("x", 1)
        assert _held(c) == (0, 0) and c.verify().ok
        assert all(_intact(k, v) for k in keys if (v := c.get(k)) is not None)
        c.unlink()


@pytest.mark.parametrize("policy", POLICIES)
def test_limits_lowered_below_what_views_pin_hold_the_excess(name, policy):
    """set_limits and resize below what open views pin succeed: the pinned entries over the new limits leave the
    index, held for their views, which read exactly their bytes; a put that needs their room is not admitted (False,
    counted); once the views end, the cache is within its limits with nothing held."""
    keys = [f"k{i}" for i in range(40)]
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=64, policy=policy, create=True) as c:
        for k in keys:
            c.put(k, _value(k, 0))
        viewed = keys[:6]
        arrs = {}
        with contextlib.ExitStack() as stack:
            for k in viewed:
                arrs[k] = stack.enter_context(c.view(k))
            c.set_limits(max_entries=4)  # (another index and smaller tables: a resize)
            s = c.stats()
            assert (s.max_entries, s.entries, s.held_entries) == (4, 4, 2) and c.verify(deep=True).ok
            assert {k for k in keys if k in c} <= set(viewed)
            one = s.retained_bytes // s.entries
            c.set_limits(max_retained_bytes=2 * one)
            s = c.stats()
            assert (s.entries, s.held_entries) == (2, 4) and s.retained_bytes <= 2 * one and c.verify(deep=True).ok
            assert c.put("new", _value("new", 0)) is False and "new" not in c and c.stats().not_admitted == 1
            c.resize(max_entries=1)
            s = c.stats()
            assert (s.max_entries, s.entries, s.held_entries) == (1, 1, 5) and c.verify(deep=True).ok
            for k, a in arrs.items():
                assert _intact(k, a) and np.array_equal(a, _value(k, 0))
        del arrs, a  # the pins end with the arrays
        c.set_limits(max_entries=64, max_retained_bytes=1 << 20)
        for k in keys:
            assert c.put(k, _value(k, 1)) is True
        s = c.stats()
        assert (s.entries, s.held_entries, s.held_bytes) == (40, 0, 0) and c.verify(deep=True).ok
        assert all(np.array_equal(c.get(k), _value(k, 1)) for k in keys)
        c.unlink()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_restore_into_room_views_pin_counts_what_it_did_not_store(name, policy, tmp_path):
    """A restore whose records find the room all pinned stores none of them and says so: each counted in
    ``no_room`` and ``not_admitted``, none in ``restored``, through the batch put's count of what it passed."""
    keys = [f"k{i}" for i in range(10)]
    path = tmp_path / "snap"
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=64, policy=policy, create=True) as c:
        for k in keys:
            c.put(k, _value(k, 0))
        assert c.snapshot(path).entries == 10
        c.clear()
        c.put("a", _value("a", 0))
        c.put("b", _value("b", 0))
        with c.view("a") as a, c.view("b") as b:
            c.set_limits(max_entries=2)
            got = c.restore(path)
            assert (got.restored, got.no_room) == (0, 10) and c.stats().not_admitted == got.no_room - 8
            assert [k for k in keys if k in c] == [] and _intact("a", a) and _intact("b", b)
            assert c.verify(deep=True).ok
        del a, b
        c.delete("a")
        c.delete("b")  # (keep evicts nothing to admit a key)
        got = c.restore(path)
        assert got.restored == 2 and got.no_room == 8 and c.verify(deep=True).ok
        c.unlink()


def test_a_held_entry_of_a_killed_viewer_comes_back(name):
    """The viewer is SIGKILLed while its old value is held: its pin ends with it, and the next store gives the
    block back."""
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.put("k", _value("k", 0))
        r, w = os.pipe()

        def viewer() -> None:
            os.close(r)
            with SharedCache(name) as mine, mine.view("k"):
                os.write(w, b"v")
                signal.pause()

        p = ctx.Process(target=viewer)
        p.start()
        os.close(w)
        try:
            assert os.read(r, 1) == b"v"
            c.put("k", _value("k", 1))
            assert _held(c)[0] == 1
            os.kill(p.pid, signal.SIGKILL)
        finally:
            os.close(r)
            reap([p], JOIN_S)
        c.put("k", _value("k", 2))
        assert _held(c) == (0, 0) and np.array_equal(c.get("k"), _value("k", 2)) and c.verify().ok
        c.unlink()


def _cut_hold(c, other, cut: str, monkeypatch) -> None:
    """``c``'s put of "a" while it views "a", cut short in ``Table.detach``: after the index slot's word (``cut``
    "slot word") or after the index (``cut`` "index"). The old value is never indexed again; the view reads it."""
    real = c._table.index.remove

    def index_remove(*args, **kw):
        if cut == "index":
            real(*args, **kw)
        raise RuntimeError("cut short")

    with c.view("a") as arr:
        monkeypatch.setattr(c._table.index, "remove", index_remove)
        try:
            with pytest.raises(RuntimeError):
                c.put("a", _value("a", 2))
        finally:
            monkeypatch.undo()
        assert not c._h[H_DIRTY]  # the holder repaired before it let go
        assert other.get("a") is None and _intact("a", arr)  # held (or dropped): never back in the index


def _held_by_a_view(c, other) -> None:
    with c.view("a") as arr:
        other.put("a", _value("a", 1))
        assert _intact("a", arr) and _held(c)[0] == 1


@pytest.mark.parametrize("cut", ["slot word", "index", "block freed"])
def test_a_hold_or_reclaim_cut_short_is_repaired(name, cut, monkeypatch):
    """An exception at each point of ``Table.detach`` and ``Table.reclaim_held`` on the Python path (as a SIGKILL
    would leave it, dirty set): the repair keeps no old value in the index, and every key reads back its newest
    value or nothing. (The compiled twins are held to these by the differential tests.)"""
    from .workers import python_path

    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c, SharedCache(name) as other:
        python_path(c)
        for k in ("a", "b"):
            c.put(k, _value(k, 0))
        if cut == "block freed":
            _held_by_a_view(c, other)  # "a"'s first value held, its view ended
            real = table_module.Arena.free

            def free(self, *args):
                real(self, *args)
                raise RuntimeError("cut short")

            monkeypatch.setattr(table_module.Arena, "free", free)
            try:
                with pytest.raises(RuntimeError):
                    c.put("a", _value("a", 2))
            finally:
                monkeypatch.undo()
            assert not c._h[H_DIRTY]
            assert np.array_equal(other.get("a"), _value("a", 1))  # the store was cut before it wrote
        else:
            _cut_hold(c, other, cut, monkeypatch)
        assert np.array_equal(other.get("b"), _value("b", 0)) and c.verify().ok and other.verify().ok
        c.put("a", _value("a", 3))
        assert np.array_equal(other.get("a"), _value("a", 3)) and _held(c) == (0, 0) and c.verify().ok
        c.unlink()


def test_damaged_held_words_are_found_and_repaired(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.put("k", _value("k", 0))
        with c.view("k") as arr:
            c.put("k", _value("k", 1))
            st = c._seg.stripe_words
            for word, bad in ((S_HELD, 7), (S_HELD_BYTES, -1), (S_HELD, 0)):
                good = st[word]
                st[word] = bad
                report = c.verify()
                assert not report.ok and any("held" in p for p in report.problems)
                st[word] = good
            st[S_HELD] = 5
            try:
                c.put("x", 1)  # the store finds the list shorter than its count: repaired, then stored...
            except CorruptionError:  # ...or (the Python path, which found it) raised once repaired: then again
                c.put("x", 1)
            assert c.get("x") == 1
            assert c.verify().ok and _held(c)[0] == 1 and _intact("k", arr)
            assert np.array_equal(c.get("k"), _value("k", 1))
        del arr
        c.put("y", 2)
        assert _held(c) == (0, 0) and c.verify().ok
        c.unlink()


def _view_at_the_ring_end(c: SharedCache, ring12: int):
    """Put values until one's block ends past ``ring12`` (where a ring that followed the entry limit would end):
    that key, viewed, pins a block in the ring's last bytes."""
    from tests.workers import entry_of

    rec = c._seg.records
    for i in range(20_000):
        k = f"k{i}"
        c.put(k, _value(k, 0, 120))
        e = entry_of(c, k)
        if (rec.off[e] << rec.osh) + rec.klen[e] + rec.vlen[e] > ring12:
            return k
    raise AssertionError("no block reached the ring's end")


@pytest.mark.parametrize("version", [14, 13, 12])
def test_lowering_the_entry_limit_leaves_a_viewed_block_at_the_ring_end(name, version, monkeypatch):
    """Version 13 sizes the ring for the most entries the tables reach, so a new entry limit leaves the ring, and
    every block, where it is: set_limits(max_entries=lower) with a view of a block in the ring's last bytes
    succeeds, the view reads its bytes, and the excess is held. A segment of version 12 (whose ring follows the
    entry limit, shared with processes of the release before) still refuses it (PinnedError), as it did."""
    from dataclasses import replace

    from shmcache import PinnedError
    from .workers import laid_out_as

    laid_out_as(monkeypatch, version)
    with SharedCache(name, capacity_bytes=256 << 10, max_entries=2048, create=True):
        pass
    monkeypatch.undo()
    with SharedCache(name) as c:
        try:
            g = c._seg.geometry
            assert c._seg.version == version and c._seg.ring() == g.ring_nbytes(c.capacity_bytes, 2048)
            ring12 = replace(g, version=12).ring_nbytes(c.capacity_bytes, 64)
            assert (g.ring_nbytes(c.capacity_bytes, 64) == c._seg.ring()) is (version >= 13)  # (13 on: no limit's)
            last = _view_at_the_ring_end(c, ring12)
            with c.view(last) as a:
                if version == 12:
                    with pytest.raises(PinnedError):
                        c.set_limits(max_entries=64)
                    assert c.limits().max_entries == 2048 and c.verify().ok
                    return
                ring = c._seg.ring()
                c.set_limits(max_entries=64)
                s = c.stats()
                assert (s.max_entries, c._seg.ring()) == (64, ring) and s.entries <= 64 and c.verify(deep=True).ok
                assert _intact(last, a) and np.array_equal(a, _value(last, 0, 120))
                c.put(last, _value(last, 1, 120))  # the viewed entry held aside: the view reads on
                assert _intact(last, a) and np.array_equal(a, _value(last, 0, 120))
            del a
            c.put("x", 1)
            s = c.stats()
            assert s.held_entries == 0 and s.entries <= 64 and c.verify(deep=True).ok
            v = c.get(last)  # (or evicted since, as the policy chose)
            assert v is None or np.array_equal(v, _value(last, 1, 120))
        finally:
            c.unlink()
