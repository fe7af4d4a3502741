"""The mapping API (mapping.py, entries.py, tier/mapping.py), one behaviour suite bound to SharedCache, KindView and
TieredCache: iteration over a snapshot that counts nothing, pop/popitem/setdefault like a dict's, batches under one
hold of the lock, ttl(), set_limits with one limit, namedtuples, memoize's cache_info, __missing__, repr, equality."""

from __future__ import annotations

import collections
import inspect
from contextlib import contextmanager
import multiprocessing as mp
from collections.abc import MutableMapping

import numpy as np
import pytest

from shmcache import CacheLimits, KindView, SharedCache, TieredCache, TooLargeError
from shmcache.codec import encode_key
from shmcache.layout import BLOCK_HEADER_NBYTES

from .conftest import policy_of
from .workers import CountingCore, check_value, entry_of, make_value, python_path, reap

Point = collections.namedtuple("Point", "x y")
LOCAL = ("shared", "kind")


class Impl:
    """One implementation under test: ``m`` the mapping, ``another()`` a second handle on the same data."""

    def __init__(self, kind: str, m, another, cache: SharedCache | None) -> None:
        self.kind, self.m, self.another, self.cache = kind, m, another, cache


@contextmanager
def _made(kind: str, request, name: str):
    """An Impl of ``kind``: a fresh cache (or a host on a fresh namespace), everything closed after."""
    closing = []
    if kind == "tiered":
        from .tiers import Host

        url, ns = request.getfixturevalue("redis_url"), request.getfixturevalue("namespace")
        host = Host(url, ns, policy=policy_of(request))
        closing.append(host)

        def another():
            h = Host(url, ns)
            closing.append(h)
            return h.tier

        try:
            yield Impl("tiered", host.tier, another, host.local)
        finally:
            host.tier.clear()
            for h in closing:
                h.close()
        return
    cache = SharedCache(name, capacity_bytes=256 * 1024, max_entries=256, create=True, policy=policy_of(request))
    closing.append(cache)

    def another():
        c = SharedCache(name, create=False)
        closing.append(c)
        return c.kind("k") if kind == "kind" else c

    if kind == "kind":
        cache.put("plain", 0)  # entries the view must never show: of no kind, and of another kind
        cache.kind("other").put("o", 0)
    try:
        yield Impl(kind, cache.kind("k") if kind == "kind" else cache, another, cache)
    finally:
        for c in closing:
            c.close()


@pytest.fixture(params=["shared", "kind", "tiered"])
def impl(request, name):
    with _made(request.param, request, name) as made:
        yield made


@pytest.fixture(params=LOCAL)
def local(request, name):
    """SharedCache and KindView only."""
    with _made(request.param, request, name) as made:
        yield made


def _local_only(impl) -> None:
    if impl.kind == "tiered":
        pytest.skip("Redis keeps no LRU order and no per-host snapshot: see the tiered tests of this file")


def test_mapping_is_a_mutable_mapping_and_unhashable(impl):
    assert isinstance(impl.m, MutableMapping)
    with pytest.raises(TypeError):
        hash(impl.m)


def test_mapping_public_signatures_have_no_private_parameter():
    for cls in (SharedCache, KindView, TieredCache):
        for attr, fn in inspect.getmembers(cls, inspect.isfunction):
            if not attr.startswith("_"):
                params = inspect.signature(fn).parameters
                assert not [p for p in params if p.startswith("_")], f"{cls.__name__}.{attr}{inspect.signature(fn)}"


def test_mapping_keys_come_back_as_put(impl):
    """Each key comes back with its type: tuple and list apart, int and bool apart, str and bytes apart; a
    namedtuple as a plain tuple, a numpy scalar as a Python scalar, an array as an equal array."""
    keys = ["s", b"s", 1, True, 1.5, None, (1, "a"), [1, "a"], {"d": (2,)}, 2**70, Point(3, 4), np.int64(7),
            np.arange(4.0)]
    for i, k in enumerate(keys):
        impl.m[k] = i
    want = {encode_key(k): (type(k), k) for k in keys}
    position = {encode_key(k): i for i, k in enumerate(keys)}
    want[encode_key(Point(3, 4))] = (tuple, (3, 4))
    want[encode_key(np.int64(7))] = (int, 7)
    got = list(impl.m)
    assert sorted(encode_key(k) for k in got) == sorted(want)
    for k in got:
        wtype, wkey = want[encode_key(k)]
        assert type(k) is wtype
        if wtype is np.ndarray:
            assert np.array_equal(k, wkey) and k.dtype == wkey.dtype
        else:
            assert k == wkey
        assert impl.m[k] == position[encode_key(k)]  # the key finds its own value


@pytest.mark.policy("lru")
def test_mapping_iteration_counts_nothing_and_keeps_the_lru_order(impl):
    _local_only(impl)
    m, cache = impl.m, impl.cache
    for k in "abc":
        m[k] = k.upper()
    before = cache.stats()
    assert list(m) == ["c", "b", "a"] and list(reversed(m)) == ["a", "b", "c"]  # most recently used first
    assert list(m.keys()) == ["c", "b", "a"] and list(m.values()) == ["C", "B", "A"]
    assert list(m.items()) == [("c", "C"), ("b", "B"), ("a", "A")] and "b" in m.keys() and ("b", "B") in m.items()
    assert dict(m.items()) == {"a": "A", "b": "B", "c": "C"} and m == {"a": "A", "b": "B", "c": "C"}
    after = cache.stats()
    # ("b", "B") in items() is a lookup, as ItemsView's containment is: one hit, and b becomes the most recent.
    assert (after.hits, after.misses, after.deletes, after.expired) == (before.hits + 1, before.misses, 0, 0)
    assert m.popitem() == ("a", "A") and m.popitem() == ("c", "C")


def test_mapping_tiered_iteration_reads_redis_and_counts_nothing(impl):
    if impl.kind != "tiered":
        pytest.skip("TieredCache only")
    m = impl.m
    m.update({"a": 1, "b": [2]})
    other = impl.another()
    before = other.stats()
    assert sorted(other) == ["a", "b"] and len(other) == 2 and sorted(other.items()) == [("a", 1), ("b", [2])]
    after = other.stats()
    assert (after.local_hits, after.remote_hits, after.local_misses) == (before.local_hits, before.remote_hits,
                                                                         before.local_misses)
    assert other.local.kind(f"tier:{other.namespace}").stats().entries == 0  # no copy made by iterating


def test_mapping_len_counts_what_iteration_yields(impl):
    impl.m.update((f"k{i}", i) for i in range(5))
    if impl.cache is not None:
        impl.cache.kind("elsewhere").put("x", 1)
    assert len(impl.m) == len(list(impl.m)) == 5


def test_mapping_iteration_skips_expired_entries(name):
    now = [10**9]
    with SharedCache(name, capacity_bytes=65536, max_entries=64, create=True, clock=lambda: now[0]) as c:
        for m in (c, c.kind("k")):
            m.put("short", 1, ttl=1)
            m.put("long", 2, ttl=100)
            m.put("never", 3)
        now[0] += 2 * 10**9
        for m in (c, c.kind("k")):
            assert sorted(m) == ["long", "never"] and dict(m.items()) == {"never": 3, "long": 2}
            assert m.ttl("never") is None and 97 < m.ttl("long") <= 98
            with pytest.raises(KeyError):
                m.ttl("short")


def test_mapping_pop_without_default_raises_key_error(impl):
    impl.m["k"] = 1
    assert impl.m.pop("k") == 1
    with pytest.raises(KeyError) as raised:
        impl.m.pop("k")
    assert raised.value.args == ("k",)
    assert impl.m.pop("k", None) is None and impl.m.pop("k", "d") == "d"


def test_mapping_popitem_removes_the_least_recently_used(impl):
    _local_only(impl)
    m = impl.m
    m.update([("a", 1), ("b", 2), ("c", 3)])
    assert m["a"] == 1  # a becomes the most recent: b is now the least
    deletes = impl.cache.stats().deletes
    assert [m.popitem(), m.popitem(), m.popitem()] == [("b", 2), ("c", 3), ("a", 1)]
    assert impl.cache.stats().deletes == deletes + 3
    with pytest.raises(KeyError) as raised:
        m.popitem()
    assert raised.value.__suppress_context__


def test_mapping_popitem_passes_over_pinned_entries(local):
    m = local.m
    m["pinned"] = b"x" * 10
    m["free"] = b"y"
    with m.view("pinned"):
        assert m.popitem() == ("free", b"y")
        with pytest.raises(KeyError):
            m.popitem()
    assert m.popitem() == ("pinned", b"x" * 10)


def test_mapping_tiered_popitem_removes_some_item(impl):
    if impl.kind != "tiered":
        pytest.skip("TieredCache only")
    impl.m.update({"a": 1, "b": 2})
    popped = dict([impl.m.popitem(), impl.m.popitem()])
    assert popped == {"a": 1, "b": 2} and len(impl.m) == 0
    with pytest.raises(KeyError):
        impl.m.popitem()


def test_mapping_setdefault_stores_only_when_absent(impl):
    m = impl.m
    assert m.setdefault("k", [1]) == [1] and m["k"] == [1]
    assert m.setdefault("k", [2]) == [1] and m["k"] == [1]
    assert m.setdefault("none") is None and "none" in m and m["none"] is None


def _setdefault_child(name: str, kind: bool, i: int, start, queue) -> None:
    with SharedCache(name, create=False) as c:
        m = c.kind("k") if kind else c
        start.wait(30)
        got = m.setdefault("race", make_value("race", i, 64 + i))
        queue.put((i, got))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", [False, True])
def test_mapping_setdefault_is_atomic_across_processes(name, kind):
    """Processes racing to setdefault one key, each with its own value: one stores, and every one returns that."""
    ctx = mp.get_context("fork")
    with SharedCache(name, capacity_bytes=65536, max_entries=64, create=True) as c:
        start, queue = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_setdefault_child, args=(name, kind, i, start, queue)) for i in range(6)]
        for p in procs:
            p.start()
        try:
            start.set()
            results = [queue.get(timeout=60) for _ in procs]
        finally:
            reap(procs)
        stored = (c.kind("k") if kind else c)["race"]
        check_value("race", stored)
        for _, got in results:
            check_value("race", got)
            assert (got["seq"], got["sum"]) == (stored["seq"], stored["sum"])
        assert [i for i, got in results if got["seq"] == i] == [stored["seq"]]  # exactly one winner
        assert c.stats().puts == 1


def _writer_child(name: str, rounds: int, queue) -> None:
    with SharedCache(name, create=False) as c:
        for r in range(rounds):
            for i in range(20):
                key = f"w{i}"
                if (r + i) % 7 == 0:
                    c.delete(key)
                else:
                    c.put(key, make_value(key, r * 20 + i, (r * 13 + i) % 300))
        queue.put("done")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_mapping_snapshot_is_consistent_under_concurrent_writes(name):
    """items(), values() and keys() while another process writes and deletes: every pair is a whole value of its
    own key, each key once."""
    ctx = mp.get_context("fork")
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True) as c:
        queue = ctx.Queue()
        proc = ctx.Process(target=_writer_child, args=(name, 400, queue))
        proc.start()
        snapshots = 0
        try:
            while proc.is_alive() or snapshots < 3:
                items = list(c.items())
                keys = [k for k, _ in items]
                assert len(set(keys)) == len(keys) <= 20
                for k, v in items:
                    check_value(k, v)
                for v in c.values():
                    check_value(v["key"], v)
                listed = list(c)
                assert len(set(listed)) == len(listed) <= 20 and all(k.startswith("w") for k in listed)
                snapshots += 1
                if snapshots > 10_000:
                    break
            assert queue.get(timeout=60) == "done"
        finally:
            reap([proc])
        assert snapshots >= 3 and c.verify(deep=True).ok


def test_mapping_get_many_and_put_many(impl):
    m = impl.m
    m.put_many({"a": 1, "b": [2]})
    m.put_many([("c", (3,)), ("a", "one")], ttl=50)
    assert m.get_many(["a", "b", "c", "zz"]) == ["one", [2], (3,), None]
    assert m.get_many(["zz", "b"], default="d") == ["d", [2]] and m.get_many([]) == []
    assert 0 < m.ttl("c") <= 50 and m.ttl("b") is None


@pytest.mark.policy("lru")  # where every get takes the lock: a batch takes it once for all
@pytest.mark.parametrize("path", ["compiled", "pure Python"])
def test_mapping_batches_take_the_lock_once(local, path):
    cache, m = local.cache, local.m
    if path == "compiled" and cache._core is None:
        pytest.skip("the compiled section is not built (or SHMCACHE_PURE_PYTHON=1)")
    if path == "pure Python":
        python_path(cache)
    taken = []  # the lock taken by the Python path, and (compiled) by a batch call into C
    guard = cache._guard
    real = guard.enter

    def counting(*args, **kwargs):
        taken.append(1)
        return real(*args, **kwargs)

    guard.enter = counting
    if cache._core is not None:
        cache._path = CountingCore(cache._path, taken)
    try:
        m.put_many({f"k{i}": i for i in range(64)})
        assert len(taken) == 1
        before = cache.stats()
        taken.clear()
        assert m.get_many([f"k{i}" for i in reversed(range(64))] + ["nope"]) == list(reversed(range(64))) + [None]
        assert len(taken) == 1
    finally:
        del guard.enter
        if isinstance(cache._path, CountingCore):
            cache._path = cache._path.core
    after = cache.stats()
    assert (after.hits - before.hits, after.misses - before.misses) == (64, 1)
    assert m.popitem()[0] == "k63"  # each key the batch got became the most recent in turn: k63 is the least


def test_mapping_put_many_refuses_a_too_large_entry_before_storing(local):
    local.cache.set_limits(max_retained_bytes=1000)
    with pytest.raises(TooLargeError):
        local.m.put_many([("small", 1), ("big", b"x" * 2000)])
    assert "small" not in local.m


def test_mapping_ttl(impl):
    m = impl.m
    m.put("t", 1, ttl=100)
    m.put("forever", 1, ttl=0)
    assert 0 < m.ttl("t") <= 100 and m.ttl("forever") is None
    with pytest.raises(KeyError):
        m.ttl("absent")


def test_mapping_set_limits_takes_one_limit(impl):
    m = impl.m
    limits = impl.cache.limits()
    m.set_limits(max_entries=100)
    assert impl.cache.limits() == CacheLimits(100, limits.max_retained_bytes)
    m.set_limits(max_retained_bytes=50_000)
    assert impl.cache.limits() == CacheLimits(100, 50_000)
    m.set_limits(CacheLimits(90, 40_000))
    assert impl.cache.limits() == CacheLimits(90, 40_000)
    for bad in (lambda: m.set_limits(), lambda: m.set_limits(CacheLimits(1, 1), max_entries=2)):
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(ValueError):
        m.set_limits(max_entries=-1)
    assert impl.cache.limits() == CacheLimits(90, 40_000)


def test_mapping_namedtuple_keys_and_values(impl):
    m = impl.m
    m[Point(1, "a")] = Point(2, [3])
    value = m[(1, "a")]  # the same key as the plain tuple
    assert value == (2, [3]) and type(value) is tuple
    assert [type(k) for k in m] == [tuple] and list(m) == [(1, "a")]
    assert m.setdefault(Point(1, "a"), None) == (2, [3])


def test_memoize_cache_info_unpacks_like_functools(impl):
    calls = []

    @impl.m.memoize
    def square(x):
        calls.append(x)
        return x * x

    assert [square(2), square(2), square(3)] == [4, 4, 9] and calls == [2, 3]
    hits, misses, maxsize, currsize = square.cache_info()
    assert (hits, misses, currsize) == (1, 2, 2)
    assert maxsize == (None if impl.kind == "tiered" else impl.cache.limits().max_entries)
    assert square.cache_info()._fields == ("hits", "misses", "maxsize", "currsize")
    assert square.cache_parameters()["maxsize"] == maxsize and square.cache_parameters()["typed"] is True
    square.cache_clear()
    assert square.cache_info() == (0, 0, maxsize, 0)


class _Defaulting(SharedCache):
    def __missing__(self, key):
        return f"missing {key}"


def test_mapping_missing_is_honoured_by_getitem_in_a_subclass(name):
    with _Defaulting(name, capacity_bytes=65536, max_entries=64, create=True) as c:
        c["here"] = 1
        assert c["here"] == 1 and c["absent"] == "missing absent"
        assert c.get("absent") is None and "absent" not in c
    with SharedCache(name, create=False) as plain, pytest.raises(KeyError):
        plain["absent"]


def test_mapping_repr_names_the_class(impl):
    impl.m["k"] = 1
    text = repr(impl.m)
    assert text.startswith(f"{type(impl.m).__name__}(")
    if impl.kind == "shared":
        assert text == f"SharedCache({impl.cache.name!r}, entries=1, capacity_bytes=262144)"


def test_mapping_two_handles_on_one_cache_compare_equal(impl):
    m = impl.m
    m.update({"a": 1, "b": (2, 3)})
    other = impl.another()
    assert other is not m and other == m and m == {"a": 1, "b": (2, 3)}
    other["c"] = 4
    assert m == other and m != {"a": 1, "b": (2, 3)}
    assert m != {"a": 1, "b": [2, 3], "c": 4}  # a tuple is not a list


def test_mapping_update_and_clear_count(impl):
    m = impl.m
    m.update({"a": 1}, b=2)
    m.update([("c", 3)])
    assert dict(m.items()) == {"a": 1, "b": 2, "c": 3}
    with pytest.raises(ValueError):
        m.update([(1, 2, 3)])
    # SharedCache.clear() empties the whole cache, kinds included; a KindView's and a TieredCache's their own keys.
    assert m.clear() == 3
    assert len(m) == 0 and list(m) == []
    if impl.kind == "kind":
        assert impl.cache["plain"] == 0 and impl.cache.kind("other")["o"] == 0


def test_mapping_damaged_key_is_left_out_and_repaired(cache):
    cache["ab"] = 1
    cache["cd"] = 2
    rec, mm, base = cache._seg.records, cache._mm, cache._base
    e = entry_of(cache, "cd")
    k0 = base + (rec.off[e] << rec.osh) + BLOCK_HEADER_NBYTES + rec.vlen[e]
    mm[k0 : k0 + 2] = b"\xff\xfe"  # no UTF-8: no key's encoding (nor does it hash to the entry's fingerprint)
    assert list(cache) == ["ab"] and cache.stats().recoveries == 1
    assert list(cache) == ["ab"] and cache.stats().recoveries == 1 and cache.verify().ok


def test_mapping_iterating_a_closed_cache_raises(name):
    from shmcache import ClosedError

    c = SharedCache(name, capacity_bytes=65536, max_entries=64, create=True)
    c.close()
    with pytest.raises(ClosedError):
        list(c)
    assert repr(c) == f"SharedCache({name!r}, closed)"


def test_mapping_encoded_key_is_taken_by_get_only(cache):
    """TieredCache hands SharedCache.get key bytes already encoded (an EncodedKey), in place of a private
    parameter; anywhere else one must be refused, never taken for a bytes key."""
    from shmcache.codec import EncodedKey

    cache["k"] = 1
    assert cache.get(EncodedKey(encode_key("k"))) == 1 and cache.get(EncodedKey(b"other")) is None
    for op in (lambda: cache.put(EncodedKey(b"k"), 2), lambda: EncodedKey(b"k") in cache,
               lambda: cache.kind("x").get(EncodedKey(b"k"))):
        with pytest.raises(TypeError):
            op()
    assert cache["k"] == 1 and list(cache) == ["k"]
