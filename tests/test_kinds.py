"""Key kinds: namespaces of one cache with their own clear() and counts, under the global LRU and limits."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from shmcache import KindsFullError, KindStats, SharedCache, ShmCacheError, prometheus_text
from shmcache.codec import encode_key, encode_value

JOIN_S = 60
ctx = mp.get_context("fork")


def _size(key, value) -> int:
    """Bytes a key of some kind retains: its kind prefix (2 bytes), its own encoding, and the value's."""
    return 2 + len(encode_key(key)) + len(encode_value(value))


def test_kinds_keep_equal_keys_apart(cache):
    jvp, img = cache.kind("jvp"), cache.kind("img")
    cache["a"] = "plain"
    jvp["a"] = "jvp"
    img["a"] = np.arange(3)
    assert (cache["a"], jvp["a"]) == ("plain", "jvp") and np.array_equal(img["a"], np.arange(3))
    del jvp["a"]
    assert "a" not in jvp and "a" in cache and "a" in img
    with pytest.raises(KeyError) as exc:
        jvp["a"]
    assert exc.value.args == ("a",)


def test_kinds_have_the_whole_api(cache):
    k = cache.kind("ops")
    assert k.add("n", 1) is True and k.add("n", 2) is False
    assert k.incr("n", 5) == 6 and k.decr("n") == 5
    value, version = k.get_with_version("n")
    assert value == 5 and k.cas("n", 50, version) is True and k.get("n") == 50
    assert k.replace("n", 51) is True and k.pop("n") == 51 and k.pop("n", "d") == "d"
    assert k.get_or_compute("c", lambda: [1, 2]) == [1, 2]
    assert k.touch("c", 60) is True and k.delete("c") is True and k.delete("c") is False
    with pytest.raises(KeyError) as exc:
        k.incr("absent", initial=None)
    assert exc.value.args == ("absent",)
    k.put("b", b"bytes")
    with k.view("b") as mv:
        assert bytes(mv) == b"bytes"
    assert "n" not in cache and "b" not in cache  # none of it leaked into the plain namespace


def test_kinds_count_and_clear_on_their_own(cache):
    jvp, img = cache.kind("jvp"), cache.kind("img")
    for i in range(5):
        jvp.put(i, "x" * i)
        img.put(i, i)
    cache.put("plain", 1)
    # len(cache) counts the entries of no kind (what iterating the cache yields); stats() counts every entry.
    assert len(jvp) == 5 and len(img) == 5 and len(cache) == 1 and cache.stats().entries == 11
    assert jvp.stats() == KindStats(5, sum(_size(i, "x" * i) for i in range(5)))
    jvp.put(0, "longer value")  # an update changes the bytes, not the count
    assert jvp.stats() == KindStats(5, _size(0, "longer value") + sum(_size(i, "x" * i) for i in range(1, 5)))
    assert jvp.clear() == 5
    assert len(jvp) == 0 and jvp.stats() == KindStats(0, 0)
    assert len(img) == 5 and cache.get("plain") == 1 and len(cache) == 1 and cache.stats().entries == 6
    s = cache.stats()
    assert s.kinds == {"jvp": KindStats(0, 0), "img": img.stats()} and s.deletes == 5
    assert cache.verify(deep=True).ok
    cache.clear()
    assert cache.stats().kinds == {"jvp": KindStats(0, 0), "img": KindStats(0, 0)}


def test_kinds_share_the_global_lru_and_limits(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=4, create=True, policy="lru") as c:
        a, b = c.kind("a"), c.kind("b")
        a.put(1, 1)
        b.put(1, 1)
        c.put(1, 1)
        a.put(2, 2)
        b.put(2, 2)  # the fifth entry: the oldest of all ("a" 1) goes
        assert 1 not in a and 1 in b and 1 in c and len(c) == 1 and c.stats().entries == 4
        assert c.stats().evictions == 1 and a.stats().entries == 1


def test_kinds_are_found_by_name_from_every_handle_and_process(cache, name):
    cache.kind("jvp").put("k", "parent")

    def child(q):
        try:
            with SharedCache(name) as c:
                k = c.kind("jvp")
                q.put(("ok", (k.get("k"), c.get("k"))))
                k.put("from-child", 1)
        except BaseException as exc:
            q.put(("error", repr(exc)))

    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,), daemon=True)
    p.start()
    try:
        assert q.get(timeout=JOIN_S) == ("ok", ("parent", None))
    finally:
        p.join(JOIN_S)
    assert cache.kind("jvp").get("from-child") == 1 and len(cache.kind("jvp")) == 2
    assert list(cache.stats().kinds) == ["jvp"]  # one kind, however many handles asked for it


def test_kinds_names_are_checked_and_the_table_is_bounded(cache):
    for bad, exc in (("", ValueError), ("x" * 41, ValueError), (b"jvp", TypeError), (3, TypeError)):
        with pytest.raises(exc):
            cache.kind(bad)
    assert cache.kind("é" * 20).name == "é" * 20  # 40 bytes of UTF-8: the longest name
    for i in range(254):
        cache.kind(f"k{i}")
    with pytest.raises(ShmCacheError, match="255 kinds") as info:
        cache.kind("one too many")
    assert isinstance(info.value, KindsFullError) and isinstance(info.value, ValueError)
    assert info.value.what == "kind" and info.value.hint
    assert cache.kind("k0").get("x") is None  # existing kinds still open
    assert cache.stats().recoveries == 0


def test_kinds_counts_survive_a_repair(cache):
    k = cache.kind("jvp")
    for i in range(4):
        k.put(i, i)
    cache._seg.kind_words[1 * 8 + 1] = 999  # damage the kind's entry count
    report = cache.verify(repair_damage=True)
    assert not report.ok and any("kind 1" in p for p in report.problems)
    assert k.stats().entries == 4 and cache.verify().ok


def test_kinds_in_prometheus_text(cache):
    cache.kind("jvp").put("k", 1)
    text = prometheus_text({"c": cache.stats()})
    assert 'shmcache_kind_entries{cache="c",kind="jvp"} 1' in text
    assert f'shmcache_kind_retained_bytes{{cache="c",kind="jvp"}} {_size("k", 1)}' in text


def test_kinds_memoize_in_their_own_namespace(cache):
    jvp, img = cache.kind("jvp"), cache.kind("img")
    calls = []

    def square(x):
        calls.append(x)
        return x * x

    in_jvp = jvp.memoize(name="square")(square)
    in_img = img.memoize(name="square")(square)
    assert in_jvp(3) == 9 and in_jvp(3) == 9 and in_img(3) == 9 and calls == [3, 3]
    assert len(jvp) == 1 and len(img) == 1
    assert in_jvp.cache_clear() == 1  # only this kind's entries
    assert len(jvp) == 0 and len(img) == 1 and in_img(3) == 9 and calls == [3, 3]
