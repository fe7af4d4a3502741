"""Time to live: lazy expiry on every read, expired entries reclaimed before live ones, touch, the default TTL, and
the shared monotonic clock across processes."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from shmcache import POLICIES, SharedCache, prometheus_text
from shmcache.layout import dtypes as d
from shmcache.table import Table
from tests.conftest import policy_of
from tests.workers import entry_of, put_and_die_at, python_path, start_and_collect, switch_word_damage_is_repaired

S = 10**9  # ns per second
JOIN_S = 60
ctx = mp.get_context("fork")


@pytest.fixture
def tcache(name, clock, request):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=8, create=True, clock=clock,
                     policy=policy_of(request)) as c:
        yield c


def test_ttl_entry_is_served_until_it_expires_then_never(tcache, clock):
    tcache.put("k", {"v": 1}, ttl=10)
    clock.advance(9.999)
    assert tcache.get("k") == {"v": 1}
    clock.advance(0.001)  # expires exactly at put time + ttl
    assert tcache.get("k") is None
    s = tcache.stats()
    assert (s.hits, s.misses, s.expired, s.entries) == (1, 1, 1, 0)
    clock.advance(-100)  # even if a clock went back, the dropped entry is gone for good
    assert tcache.get("k") is None and "k" not in tcache
    assert tcache.verify(deep=True).ok


def test_ttl_zero_means_never_and_no_ttl_means_never_without_a_default(tcache, clock):
    tcache.put("zero", 1, ttl=0)
    tcache.put("none", 2)
    clock.advance(10**6)
    assert (tcache.get("zero"), tcache.get("none")) == (1, 2)


@pytest.mark.parametrize("op", ["in", "get_with_version", "pop", "delete", "add", "replace", "cas", "incr", "touch",
                                "put", "view"])
def test_ttl_every_operation_treats_an_expired_key_as_absent(tcache, clock, op):
    tcache.put("k", 5, ttl=1)
    version = tcache.get_with_version("k")[1]
    clock.advance(1)
    outcome = {
        "in": lambda: "k" in tcache,
        "get_with_version": lambda: tcache.get_with_version("k", "d"),
        "pop": lambda: tcache.pop("k", "d"),
        "delete": lambda: tcache.delete("k"),
        "add": lambda: tcache.add("k", 7),
        "replace": lambda: tcache.replace("k", 7),
        "cas": lambda: tcache.cas("k", 7, version),
        "incr": lambda: tcache.incr("k", 1, initial=100),
        "touch": lambda: tcache.touch("k", 60),
        "put": lambda: tcache.put("k", 7),
        "view": lambda: _view_missing(tcache),
    }[op]()
    expected = {"in": False, "get_with_version": ("d", None), "pop": "d", "delete": False, "add": True,
                "replace": False, "cas": False, "incr": 101, "touch": False, "put": True, "view": "KeyError"}[op]
    assert outcome == expected
    s = tcache.stats()
    assert s.expired == 1
    assert s.updates == 0  # a store over an expired entry is a new entry, not an update
    assert tcache.get("k") == {"add": 7, "incr": 101, "put": 7}.get(op)
    assert tcache.verify(deep=True).ok


def _view_missing(c):
    try:
        c.view("k")
    except KeyError:
        return "KeyError"
    return "served"


@pytest.mark.policy("lru")  # whose order says which live entry would go
def test_ttl_expired_entries_are_reclaimed_before_live_ones(tcache, clock):
    # The expired entry is the most recently used: plain LRU would evict "live0" first.
    for i in range(7):
        tcache.put(f"live{i}", i)
    tcache.put("short", "s", ttl=5)
    assert tcache.get("short") == "s"
    clock.advance(5)
    tcache.put("new", "n")  # the 9th entry of 8: room is needed
    s = tcache.stats()
    assert (s.expired, s.evictions, s.entries) == (1, 0, 8)
    assert all(tcache.get(f"live{i}") == i for i in range(7)) and tcache.get("new") == "n"
    tcache.put("newer", 1)  # nothing expired now: plain LRU again
    assert tcache.stats().evictions == 1 and "live0" not in tcache


def test_ttl_reclaim_takes_every_expired_entry_at_once_under_byte_pressure(name, clock):
    with SharedCache(name, capacity_bytes=2000, max_entries=100, create=True, clock=clock) as c:
        for i in range(8):
            c.put(f"t{i}", b"x" * 150, ttl=1 + i % 2)
        c.put("live", b"y" * 150)
        clock.advance(2)
        c.put("big", b"z" * 900)
        s = c.stats()
        assert (s.expired, s.evictions) == (8, 0)
        assert c.get("live") == b"y" * 150 and c.get("big") == b"z" * 900


def test_ttl_touch_extends_shortens_or_removes_the_expiry(tcache, clock):
    tcache.put("k", 1, ttl=2)
    version = tcache.get_with_version("k")[1]
    assert tcache.touch("k", 10) is True
    clock.advance(5)
    assert tcache.get("k") == 1
    assert tcache.touch("k", 0) is True  # never expires now
    clock.advance(10**5)
    assert tcache.get("k") == 1
    assert tcache.get_with_version("k")[1] == version  # touch changes neither the value nor its version
    assert tcache.touch("absent", 5) is False
    tcache.touch("k", 1)
    clock.advance(1)
    assert tcache.get("k") is None


def test_ttl_incr_keeps_the_counters_expiry(tcache, clock):
    tcache.put("n", 1, ttl=10)
    clock.advance(6)
    assert tcache.incr("n") == 2
    clock.advance(4)
    assert tcache.get("n") is None  # expired 10 s after the put, not after the incr


def test_ttl_default_applies_to_stores_without_one(name, clock):
    with SharedCache(name, capacity_bytes=65536, max_entries=16, create=True, default_ttl=30, clock=clock) as c:
        c.put("default", 1)
        c.put("forever", 2, ttl=0)
        c.put("short", 3, ttl=1)
        c.incr("counter")
        c.get_or_compute("computed", lambda: 4)
        with SharedCache(name, clock=clock) as other:  # every handle sees the segment's default
            other.put("other", 5)
        clock.advance(29)
        assert [c.get(k) for k in ("default", "forever", "short", "counter", "computed", "other")] == [
            1, 2, None, 1, 4, 5]
        clock.advance(1)
        assert [c.get(k) for k in ("default", "forever", "counter", "computed", "other")] == [None, 2, None, None,
                                                                                              None]


def test_ttl_default_must_match_when_given_on_attach(name):
    with SharedCache(name, capacity_bytes=65536, max_entries=16, create=True, default_ttl=30):
        with pytest.raises(ValueError, match="default_ttl=30"):
            SharedCache(name, default_ttl=5)
        with SharedCache(name, default_ttl=30), SharedCache(name):
            pass


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "5", True, 1e10])
def test_ttl_refuses_what_is_not_a_duration(tcache, bad):
    with pytest.raises((TypeError, ValueError)):
        tcache.put("k", 1, ttl=bad)
    with pytest.raises((TypeError, ValueError)):
        tcache.touch("k", bad)
    with pytest.raises((TypeError, ValueError)):
        tcache.get_or_compute("k", lambda: 1, ttl=bad)
    assert "k" not in tcache and tcache.stats().recoveries == 0


def test_ttl_expire_drops_every_expired_entry_now(tcache, clock):
    for i in range(5):
        tcache.put(i, i, ttl=1 + i)
    clock.advance(3)
    assert len(tcache) == 2 and tcache.stats().entries == 5  # nothing has read or needed room yet
    assert tcache.expire() == 3
    assert len(tcache) == 2 and tcache.stats().expired == 3
    assert tcache.expire() == 0
    assert tcache.verify(deep=True).ok


@pytest.mark.parametrize("policy", POLICIES)
def test_issue_len_agrees_with_iteration_under_expiry(name, clock, policy):
    """len() counted expired entries that no listing shows: 5 puts with ttl=0.05, 0.1 s later len() was 5 and
    list(keys()) empty. len(), bool(), ``in``, keys(), items() and values() agree (a KindView's too, a view's pinned
    expired entry included); stats().entries counts what is resident, and len() drops nothing."""
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=16, create=True, clock=clock, policy=policy) as c:
        kind = c.kind("k")
        for i in range(5):
            c.put(i, b"v%d" % i, ttl=0.05)
            kind.put(i, b"w%d" % i, ttl=0.05)
        c.put("kept", b"x")
        kind.put("kept", b"y", ttl=60)
        pinned = c.view(0)
        clock.advance(0.1)
        for m, kept in ((c, b"x"), (kind, b"y")):
            assert list(m.keys()) == ["kept"] and list(m.items()) == [("kept", kept)]
            assert list(m.values()) == [kept] and len(m) == 1 and m
            assert [i in m for i in range(5)] == [False] * 5  # each drops the one it finds (not the pinned one)
            assert len(m) == 1
        pinned.close()
        s = c.stats()
        assert (s.entries, s.expired) == (3, 9) and c.expire() == 1 and c.stats().entries == 2
        clock.advance(60)
        assert (len(c), len(kind), bool(kind), list(kind)) == (1, 0, False, [])
        assert c.stats().entries == 2 and c.stats().expired == 10  # len() counted, it dropped nothing


def test_ttl_expired_counter_in_stats_and_prometheus(tcache, clock):
    tcache.put("k", 1, ttl=1)
    clock.advance(1)
    tcache.get("k")
    assert tcache.stats().as_dict()["expired"] == 1
    assert f'shmcache_expired_total{{cache="{tcache.name}"}} 1' in prometheus_text({tcache.name: tcache.stats()})
    tcache.clear()
    assert tcache.stats().expired == 0


def test_ttl_memoize_results_expire(tcache, clock):
    calls = []

    @tcache.memoize(ttl=5)
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9 and square(3) == 9 and calls == [3]
    clock.advance(5)
    assert square(3) == 9 and calls == [3, 3]


def test_ttl_real_clock_expires(name):
    with SharedCache(name, capacity_bytes=65536, max_entries=16, create=True) as c:
        c.put("k", 1, ttl=0.05)
        time.sleep(0.1)
        assert c.get("k") is None and c.stats().expired == 1


# ---------------------------------------------------------------------------------------------------- processes


def _put_short_lived(name, n, queue):
    try:
        now = [0]
        # The real clock, read once per put, so that the expiry stamped in the value is exactly the entry's.
        with SharedCache(name, create=False, clock=lambda: now[0]) as c:
            for i in range(n):
                now[0] = time.monotonic_ns()
                c.put(f"k{i % 16}", {"key": f"k{i % 16}", "expires": now[0] + 2_000_000, "i": i}, ttl=0.002)
        queue.put(("ok", n))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


def _read_never_expired(name, seconds, queue):
    try:
        served = 0
        with SharedCache(name, create=False) as c:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for i in range(16):
                    before = time.monotonic_ns()
                    value = c.get(f"k{i}")
                    if value is not None:
                        assert value["key"] == f"k{i}", value
                        # Served means unexpired when read, and the read came after ``before``.
                        assert before < value["expires"], (before, value)
                        served += 1
        queue.put(("ok", served))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


@pytest.mark.timeout(120)
def test_ttl_processes_share_the_clock_and_never_read_an_expired_entry(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True) as c:
        queue = ctx.Queue()
        procs = [ctx.Process(target=_put_short_lived, args=(name, 4000, queue), daemon=True) for _ in range(2)]
        procs += [ctx.Process(target=_read_never_expired, args=(name, 1.5, queue), daemon=True) for _ in range(2)]
        results = start_and_collect(procs, queue, JOIN_S)
        assert all(kind == "ok" for kind, _ in results), results
        time.sleep(0.01)
        assert all(c.get(f"k{i}") is None for i in range(16))  # everything has expired for this process too
        assert c.verify(deep=True).ok


@pytest.mark.policy("lru")  # whose order says which live entry would go
def test_ttl_an_expired_entry_a_view_pins_goes_first_once_unpinned(tcache, clock):
    tcache.put("pinned", b"p", ttl=1)
    for i in range(6):
        tcache.put(f"live{i}", i)
    with tcache.view("pinned"):
        clock.advance(1)
        tcache.put("x", 1)
        tcache.put("y", 2)  # room needed: the expired entry is pinned, so the oldest live one goes
        assert "live0" not in tcache and tcache.verify().ok
    tcache.put("z", 3)  # unpinned: the expired entry goes before any live one
    assert tcache.stats().expired == 1 and "live1" in tcache and tcache.verify().ok


def test_ttl_a_pin_that_ends_while_a_put_drops_its_expired_key_never_doubles_the_key(tcache, clock, monkeypatch):
    tcache.put("k", b"old", ttl=1)
    with tcache.view("k"):
        clock.advance(1)
        answers = iter([True, False])  # pinned when first asked; the view has ended by a second question
        monkeypatch.setattr(Table, "pinned", lambda self, e: next(answers, False))
        tcache.put("k", b"new")  # the expired entry held aside as it was pinned when asked; the new one stored once
        monkeypatch.undo()
        assert tcache.get("k") == b"new" and len(tcache) == 1 and tcache.verify().ok
    tcache.put("z", b"z")  # the view has ended: the held entry goes back
    assert tcache.get("k") == b"new" and tcache.stats().held_entries == 0 and tcache.verify().ok


@pytest.mark.timeout(120)
def test_ttl_a_store_cut_short_never_leaves_its_entry_without_its_expiry(name):
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        c.put("sess", b"tok1")
        c.delete("sess")  # its slot goes back on the free list, expiry column cleared, version kept
        # Linked into the index and the list, before the expiry and version columns are written.
        p = ctx.Process(target=put_and_die_at, args=(name, "insert", "v = h[H_VERSION_CLOCK] + 1", "sess",
                                                     b"tok2", 1), daemon=True)
        p.start()
        p.join(JOIN_S)
        assert p.exitcode == -9, p.exitcode
        assert c.get("sess") is None  # dropped by the repair, rather than kept with no expiry
        assert c.stats().recoveries == 1 and c.verify().ok


def test_ttl_the_longest_is_decades(tcache, clock):
    tcache.put("k", 1, ttl=2e9)  # 63 years
    clock.advance(1.9e9)
    assert tcache.get("k") == 1
    with pytest.raises(ValueError):
        SharedCache("unused", default_ttl=1e10)


def _occupied(c: SharedCache) -> int:
    return os.fstat(c._seg.fd).st_blocks * 512


@pytest.mark.parametrize("switcher", ["compiled", "python"])
@pytest.mark.parametrize("reader", ["compiled", "python"])
def test_ttl_expires_column_backed_once_an_entry_expires(name, clock, switcher, reader):
    """Layout 18: a cache that has never stored an expiry backs no expires column (8 bytes an entry slot), and its
    stores, deletes and evictions write none of it. The first store with a time to live backs it and switches it on;
    another handle attached before (its own mapping) takes it before its next call, so that it never serves the entry
    past its expiry, and its own stores clear the words its entries' slots kept. The switch counts no resize in
    stats()."""
    a = SharedCache(name, capacity_bytes=2**20, max_entries=4096, create=True, clock=clock)
    b = SharedCache(name, create=False, clock=clock)
    try:
        a, b = (python_path(a) if switcher == "python" else a), (python_path(b) if reader == "python" else b)
        for i in range(3000):
            (a if i % 2 else b)[f"k{i}"] = i
        for i in range(0, 3000, 3):
            del (b if i % 2 else a)[f"k{i}"]
        assert b.get("k1") == 1 and not a._seg.expires_shown and not b._seg.expires_shown
        assert not np.frombuffer(a._seg.expires_words, dtype=np.int64).any()
        g = a._seg.geometry
        # (the column is a hole of the file: what the tables back without it, and at most the page it shares with
        # each neighbour, which a read of the words of its first or last slots backs)
        assert _occupied(a) <= 2 * 4096 + sum(stop - start for start, stop in g.backed(
            a._seg.mask + 1, a._seg.shown[2], a._seg.header_words[d.H_ARENA_EXTENT], a._seg.shown[5]))
        before = _occupied(a)
        a.put("short", b"s", ttl=5)
        assert a._seg.expires_shown and a._seg.idle_words[d.D_EXPIRES_ON] == 1
        assert _occupied(a) - before >= a._seg.slots_shown * 8 - 2 * 4096 > 0  # (the switch backed it)
        assert b.get("short") == b"s" and b._seg.expires_shown
        clock.advance(5)
        assert b.get("short") is None and a.get("short") is None
        a.put("short", b"t", ttl=5)
        b.delete("short")
        b.put("plain", b"p")  # (in the slot "short" had: its expiry word cleared)
        clock.advance(10)
        assert a.get("plain") == b"p" and b.get("k1") == 1
        assert a.stats().resizes == b.stats().resizes == 0 and a._seg.idle_words[d.D_SWITCH_BUMPS] == 1
        assert a.verify(deep=True).ok
    finally:
        b.close()
        a.close()
        SharedCache.unlink_name(name)


@pytest.mark.parametrize("how", ["default_ttl", "default_tti"])
def test_ttl_a_default_expiry_shows_the_expires_column_at_creation(name, how):
    """A cache created with a default time to live or idle backs the expires column at creation: every store will
    write it."""
    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True, **{how: 60}) as c:
        assert c._seg.expires_shown and c._seg.idle_words[d.D_EXPIRES_ON] == 1
        with SharedCache(name, create=False) as other:
            assert other._seg.expires_shown
        c["k"] = 1
        assert c._seg.expires_words[entry_of(c, "k")] > 0 and c.stats().resizes == 0


@pytest.mark.parametrize("op", ["touch", "incr"])
def test_ttl_a_touch_switches_the_expires_column_on(name, clock, op):
    """touch() gives a resident entry an expiry, and incr() keeps one: the column is switched on before either
    writes."""
    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True, clock=clock) as c:
        c["k"] = 1
        assert not c._seg.expires_shown
        assert c.touch("k", ttl=5) is True and c._seg.expires_shown
        if op == "incr":
            assert c.incr("k") == 2
        clock.advance(5)
        assert c.get("k") is None and c.verify(deep=True).ok


def test_ttl_expires_switch_cut_short_is_taken_by_the_next_store(name, clock, monkeypatch):
    """A switch killed after it set D_EXPIRES_ON but before it counted its resize leaves the other mappings without
    the column: the next store in one of them takes it (a store must clear the word of the slot it takes), and its
    reads then judge the expiries stored since. A D_EXPIRES_ON other than 0 and 1 is damage: verify reports it, the
    repair sets it to 1."""
    import shmcache.store

    a = SharedCache(name, capacity_bytes=2**20, max_entries=256, create=True, clock=clock)
    b = SharedCache(name, create=False, clock=clock)
    try:
        a["k"], a["j"] = 1, 2
        assert b.get("k") == 1
        monkeypatch.setattr(shmcache.store, "count_resize", lambda h: None)  # (as if killed before the count)
        a.put("short", 3, ttl=5)
        monkeypatch.undo()
        assert a._seg.expires_shown and not b._seg.expires_shown
        b["other"] = 4  # (b takes the column: its store clears the word of the slot it takes)
        assert b._seg.expires_shown
        clock.advance(5)
        assert b.get("short") is None and b.verify(deep=True).ok
        switch_word_damage_is_repaired(name, d.D_EXPIRES_ON, "j", 2, clock=clock)
    finally:
        b.close()
        a.close()
        SharedCache.unlink_name(name)
