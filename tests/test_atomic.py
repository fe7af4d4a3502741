"""add, replace, pop, incr and decr: each indivisible, including across processes."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from shmcache import SharedCache, TooLargeError
from shmcache.codec import fingerprint
from tests.workers import put_and_die_at, start_and_collect, switch_word_damage_is_repaired

JOIN_S = 60
ctx = mp.get_context("fork")


def test_atomic_add_only_when_absent(cache):
    assert cache.add("k", {"v": 1}) is True
    assert cache.add("k", {"v": 2}) is False
    assert cache.get("k") == {"v": 1}
    s = cache.stats()
    assert (s.puts, s.updates, s.entries) == (1, 0, 1)


def test_atomic_replace_only_when_present(cache):
    assert cache.replace("k", 1) is False and "k" not in cache
    cache.put("k", 1)
    assert cache.replace("k", "two") is True and cache.get("k") == "two"


def test_atomic_add_too_large_raises_and_changes_nothing(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=4, create=True) as c:
        with pytest.raises(TooLargeError):
            c.add("k", b"x" * 10_000)
        assert "k" not in c and c.stats().recoveries == 0


def test_atomic_pop_returns_and_removes(cache):
    cache.put("k", [1, (2, 3)])
    cache.put("arr", np.arange(6.0).reshape(2, 3))
    assert cache.pop("k") == [1, (2, 3)] and "k" not in cache
    assert cache.pop("k", "gone") == "gone"
    assert np.array_equal(cache.pop("arr"), np.arange(6.0).reshape(2, 3))
    s = cache.stats()
    assert (s.hits, s.misses, s.deletes, s.entries) == (2, 1, 2, 0)
    assert cache.verify(deep=True).ok


def test_atomic_incr_decr(cache):
    assert cache.incr("n") == 1
    assert cache.incr("n", 10) == 11
    assert cache.decr("n", 20) == -9  # Python ints: no floor at zero
    assert cache.incr("big", 2**70, initial=2**70) == 2**71
    assert cache.incr("fresh", 5, initial=100) == 105
    assert cache.get("n") == -9 and cache.get("big") == 2**71


@pytest.mark.parametrize("stored", ["text", 1.5, True, None, [1]])
def test_atomic_incr_of_a_non_int_is_a_type_error_and_changes_nothing(cache, stored):
    cache.put("k", stored)
    with pytest.raises(TypeError, match="only int values"):
        cache.incr("k")
    assert cache.get("k") == stored
    assert cache.stats().recoveries == 0  # a refused incr is not damage: no repair ran


def test_atomic_incr_of_an_absent_key_without_initial_is_a_key_error(cache):
    with pytest.raises(KeyError):
        cache.incr("k", initial=None)
    assert "k" not in cache and cache.stats().recoveries == 0
    with pytest.raises(TypeError):
        cache.incr("k", 1.5)


def _incr_many(name, times, barrier, queue):
    try:
        with SharedCache(name, create=False) as c:
            barrier.wait(JOIN_S)
            last = [c.incr("counter") for _ in range(times)]
        queue.put(("ok", last))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


def _add_race(name, barrier, queue):
    try:
        with SharedCache(name, create=False) as c:
            barrier.wait(JOIN_S)
            won = c.add("winner", {"pid": os.getpid()})
        queue.put(("ok", (os.getpid(), won)))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


def _run(target, n, *args):
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, queue), daemon=True) for _ in range(n)]
    results = start_and_collect(procs, queue, JOIN_S)
    assert all(kind == "ok" for kind, _ in results), results
    return [r for _, r in results]


@pytest.mark.timeout(120)
def test_atomic_incr_from_many_processes_loses_nothing(cache, name):
    n, m = 4, 300
    results = _run(_incr_many, n, name, m)
    assert cache.get("counter") == n * m
    seen = sorted(v for r in results for v in r)
    assert seen == list(range(1, n * m + 1))  # every increment returned a distinct new value


@pytest.mark.timeout(120)
def test_atomic_add_race_has_exactly_one_winner(cache, name):
    results = _run(_add_race, 6, name)
    winners = [pid for pid, won in results if won]
    assert len(winners) == 1
    assert cache.get("winner") == {"pid": winners[0]}


# ---------------------------------------------------------------------------------------------------- compare-and-swap


def test_atomic_versions_change_with_every_store(cache):
    assert cache.get_with_version("k") == (None, None)
    assert cache.get_with_version("k", "d") == ("d", None)
    cache.put("k", 1)
    v1 = cache.get_with_version("k")
    cache.put("k", 1)  # the same value again is still a new store
    v2 = cache.get_with_version("k")
    assert v1[0] == v2[0] == 1 and v2[1] > v1[1] > 0
    cache.incr("k")
    assert cache.get_with_version("k")[1] > v2[1]
    cache.delete("k")
    cache.put("k", 1)  # deleted and stored again: never the old version back
    assert cache.get_with_version("k")[1] > v2[1]


def test_atomic_cas_stores_only_over_the_version_read(cache):
    cache.put("k", {"n": 0})
    value, version = cache.get_with_version("k")
    assert cache.cas("k", {"n": 1}, version) is True
    assert cache.cas("k", {"n": 2}, version) is False  # that version is gone
    assert cache.get("k") == {"n": 1}
    _, newer = cache.get_with_version("k")
    cache.put("k", {"n": 5})
    assert cache.cas("k", {"n": 6}, newer) is False and cache.get("k") == {"n": 5}
    cache.delete("k")
    assert cache.cas("k", {"n": 7}, newer) is False and "k" not in cache
    with pytest.raises(TypeError):
        cache.cas("k", 1, None)
    cache.put("k", 1)
    assert cache.cas("k", 2, 0) is False and cache.cas("k", 2, -1) is False  # no entry ever has them
    assert cache.get("k") == 1
    assert cache.verify(deep=True).ok and cache.stats().recoveries == 0


def test_atomic_repair_gives_a_damaged_version_a_fresh_one(cache):
    cache.put("k", 1)
    _, version = cache.get_with_version("k")
    e = cache._guard.run(cache._store.find_live, b"k", fingerprint(b"k"))
    cache._seg.versions_words[e] = -5
    report = cache.verify(repair_damage=True)
    assert not report.ok and any("version -5" in p for p in report.problems)
    value, repaired = cache.get_with_version("k")
    assert value == 1 and repaired > version and cache.verify().ok
    assert cache.cas("k", 2, version) is False and cache.cas("k", 2, repaired) is True


def test_atomic_get_with_version_counts_and_refreshes_like_get(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=2, create=True) as c:
        c.put("a", 1)
        c.put("b", 2)
        c.get_with_version("a")  # "a" is now the most recent: "b" goes first
        c.put("c", 3)
        assert "a" in c and "b" not in c
        c.get_with_version("zzz")
        s = c.stats()
        assert (s.hits, s.misses) == (1, 1)


def _cas_increment(name, times, barrier, queue):
    """Add 1 ``times`` times through get_with_version/cas retry loops; the value names its key and checksums."""
    try:
        retries = 0
        with SharedCache(name, create=False) as c:
            barrier.wait(JOIN_S)
            for _ in range(times):
                while True:
                    value, version = c.get_with_version("counter")
                    assert value["key"] == "counter" and value["check"] == value["n"] * 7919, value
                    if c.cas("counter", {"key": "counter", "n": value["n"] + 1, "check": (value["n"] + 1) * 7919},
                             version):
                        break
                    retries += 1
        queue.put(("ok", retries))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


@pytest.mark.timeout(120)
def test_atomic_cas_loops_from_many_processes_lose_no_update(cache, name):
    n, m = 4, 250
    cache.put("counter", {"key": "counter", "n": 0, "check": 0})
    retries = _run(_cas_increment, n, name, m)
    assert cache.get("counter") == {"key": "counter", "n": n * m, "check": n * m * 7919}
    assert cache.stats().puts == 1 + n * m  # exactly one successful cas per increment
    print(f"cas retries: {sum(retries)} over {n * m} increments")


def _die_in_store(name, func, marker, key, value, ttl=None):
    p = ctx.Process(target=put_and_die_at, args=(name, func, marker, key, value, ttl), daemon=True)
    p.start()
    p.join(JOIN_S)
    assert p.exitcode == -9, p.exitcode  # killed where asked, not finished and not failed


@pytest.mark.timeout(120)
def test_atomic_an_update_cut_short_never_shows_its_new_value_with_the_old_version(cache, name):
    cache.put("doc", b"v1-aaaa")
    _, v1 = cache.get_with_version("doc")
    # After the new value and its checksum are written, before its version is: the checks all pass there.
    _die_in_store(name, "overwrite", "self.touch(e)", "doc", b"v2-bbbb")
    value, version = cache.get_with_version("doc")
    assert (value, version) == (None, None)  # the entry being written when its writer died is dropped
    assert cache.cas("doc", b"v3", v1) is False and cache.stats().recoveries == 1 and cache.verify().ok


def _occupied(c: SharedCache) -> int:
    return os.fstat(c._seg.fd).st_blocks * 512


@pytest.mark.parametrize("asker", ["compiled", "python"])
@pytest.mark.parametrize("other", ["compiled", "python"])
def test_atomic_versions_column_backed_once_a_version_is_asked_for(name, asker, other):
    """Layout 16: a cache whose callers never ask for a version backs no versions column (8 bytes an entry slot).
    The first get_with_version backs it and gives every entry a version of its own; another handle attached before
    (its own mapping) takes the column before its next call, reads the same versions, and its stores and a cas
    move them as before. The switch counts no resize in stats()."""
    from shmcache.layout import dtypes as d
    from tests.workers import python_path

    a = SharedCache(name, capacity_bytes=2**20, max_entries=4096, create=True)
    b = SharedCache(name, create=False)
    try:
        a, b = (python_path(a) if asker == "python" else a), (python_path(b) if other == "python" else b)
        for i in range(50):
            (a if i % 2 else b)[f"k{i}"] = i
        assert b.get("k1") == 1 and not a._seg.versions_shown and not b._seg.versions_shown
        before = _occupied(a)
        value, version = a.get_with_version("k7")
        assert value == 7 and a._seg.versions_shown and a._seg.idle_words[d.D_VERSIONS_ON] == 1
        assert _occupied(a) - before >= a._seg.slots_shown * 8 - 2 * 4096 > 0
        versions = [b.get_with_version(f"k{i}")[1] for i in range(50)]
        assert b._seg.versions_shown and versions[7] == version
        assert len(set(versions)) == 50 and all(0 < v <= a._seg.header_words[d.H_VERSION_CLOCK] for v in versions)
        b["k7"] = 70
        _, moved = a.get_with_version("k7")
        assert moved > version and a.cas("k7", 71, version) is False and b.cas("k7", 71, moved) is True
        assert a["k7"] == 71 and a.stats().resizes == 0 and a.verify(deep=True).ok
    finally:
        b.close()
        a.close()
        SharedCache.unlink_name(name)


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_atomic_a_view_switches_the_versions_column_on(name, path):
    """A view carries its entry's version: the first one switches the column on (the compiled section hands it to
    the Python path), and the next views are built as before."""
    from tests.workers import python_path

    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True) as c:
        try:
            if path == "python":
                python_path(c)
            c.put("a", np.arange(10))
            assert not c._seg.versions_shown
            for _ in range(3):
                with c.view("a") as arr:
                    assert int(arr.sum()) == 45
            assert c._seg.versions_shown and c.verify().ok
        finally:
            c.unlink()


def test_atomic_versions_switch_cut_short_keeps_the_versions_given(name, monkeypatch):
    """A switch killed after it gave the versions and set D_VERSIONS_ON but before it counted its resize leaves the
    other mappings without the column: the next store in one of them takes it (a store must write its version)
    without giving the versions again, so a version read before stays good for a cas. A D_VERSIONS_ON other than 0
    and 1 is damage: verify reports it, the repair sets it to 1, and every entry keeps a valid version."""
    import shmcache.store
    from shmcache.layout import dtypes as d

    a = SharedCache(name, capacity_bytes=2**20, max_entries=256, create=True)
    b = SharedCache(name, create=False)
    try:
        a["k"], a["j"] = 1, 2
        assert b.get("k") == 1
        monkeypatch.setattr(shmcache.store, "count_resize", lambda h: None)  # (as if killed before the count)
        _, version = a.get_with_version("k")
        monkeypatch.undo()
        assert not b._seg.versions_shown
        b["other"] = 3  # (b takes the column: its store writes a version)
        assert b._seg.versions_shown and b.get_with_version("k")[1] == version
        assert b.cas("k", 10, version) is True and a["k"] == 10
        switch_word_damage_is_repaired(name, d.D_VERSIONS_ON, "j", 2)
    finally:
        b.close()
        a.close()
        SharedCache.unlink_name(name)
