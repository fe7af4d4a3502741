"""The Django cache backend (shmcache.contrib.django): Django's semantics on top of SharedCache, its settings, one
lock hold per batch, a handle per process (re-opened after fork), add atomic across processes, and the two users of
the cache framework that matter most: sessions and the cache middleware. Django's own backend tests run in
tests/test_django_suite.py; real gunicorn workers in tests/test_django_gunicorn.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import warnings

import pytest

from . import djangosite
from .workers import check_backend_reopens_after_fork, count_lock_holds, reap, start_and_collect

from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from shmcache import ReentrantCallError, SerializerMismatch, SharedCache
from shmcache.contrib import django as backend



@pytest.fixture(scope="module", autouse=True)
def _configured():
    # Why not at import: tests/test_django_suite.py, collected after this module, configures Django first with
    # Django's own cache test app (settings are configured once per process); this one needs no more than that.
    djangosite.configure()


@pytest.fixture
def dcache(name):
    """Django's default cache: a SharedMemoryCache named ``name``."""
    with override_settings(CACHES=djangosite.caches_setting(name, OPTIONS={"capacity_bytes": 1 << 20,
                                                                             "max_entries": 256})):
        from django.core.cache import cache

        yield cache
    backend.close_handles()


def _ttl(name: str, key: str):
    """The time to live of ``key`` (Django's made key) read through a handle of our own."""
    with SharedCache(name, create=False, serializer="pickle") as c:
        return c.ttl(key)


def test_django_backend_round_trips_what_django_caches(dcache):
    import datetime
    import decimal

    values = {"s": "text", "n": None, "d": {"a": [1, (2, 3)], "when": datetime.datetime(2024, 1, 2)},
              "dec": decimal.Decimal("2.50"), "set": {1, 2}, "b": b"\x00raw"}
    for k, v in values.items():
        dcache.set(k, v)
    assert {k: dcache.get(k) for k in values} == values
    assert dcache.get("absent", "dflt") == "dflt" and dcache.get("n", "dflt") is None


def test_django_backend_add_delete_has_key_touch_clear(dcache, name):
    assert dcache.add("k", 1) is True and dcache.add("k", 2) is False and dcache.get("k") == 1
    assert dcache.has_key("k") and "k" in dcache and not dcache.has_key("other")
    assert dcache.touch("k", 100) is True and dcache.touch("nope") is False
    assert 99 < _ttl(name, ":1:k") <= 100  # Django's key: KEY_PREFIX:VERSION:key
    assert dcache.delete("k") is True and dcache.delete("k") is False
    dcache.set_many({"a": 1, "b": 2})
    dcache.clear()
    assert dcache.get_many(["a", "b"]) == {}


def test_django_backend_incr_decr(dcache, name):
    dcache.set("n", 41, 50)
    assert dcache.incr("n") == 42 and dcache.decr("n", 10) == 32 and dcache.get("n") == 32
    assert 49 < _ttl(name, ":1:n") <= 50  # incr keeps the expiry, as memcached does
    with pytest.raises(ValueError):
        dcache.incr("absent")
    with pytest.raises(ValueError):
        dcache.decr("absent")
    dcache.set("none", None)
    with pytest.raises(TypeError):
        dcache.incr("none")
    assert dcache.incr_version("n") == 2 and dcache.get("n", version=2) == 32 and dcache.get("n") is None


def test_django_backend_timeouts(dcache, name):
    dcache.set("default", 1)
    assert 299 < _ttl(name, ":1:default") <= 300  # TIMEOUT's default
    dcache.set("forever", 1, None)
    assert _ttl(name, ":1:forever") is None
    dcache.set("float", 1, 2.5)
    assert 2 < _ttl(name, ":1:float") <= 2.5
    dcache.set("long", 1, 10**12)  # past SharedCache's 73 years: clamped, not refused
    assert _ttl(name, ":1:long") > 10**9
    for timeout in (0, -1, -10.5):
        dcache.set("gone", "old")
        dcache.set("gone", "new", timeout)
        assert dcache.get("gone") is None and not dcache.has_key("gone")  # not stored, and the old value went
        assert dcache.add("add0", 1, timeout) is True and dcache.get("add0") is None
        dcache.set("live", 1)
        assert dcache.add("live", 2, timeout) is False and dcache.get("live") == 1  # present: add changes nothing
        assert dcache.touch("live", timeout) is True and dcache.get("live") is None
        dcache.set_many({"m1": 1, "m2": 2}, timeout)
        assert dcache.get_many(["m1", "m2"]) == {}


def test_django_backend_timeout_setting(name):
    with override_settings(CACHES=djangosite.caches_setting(name, TIMEOUT=None)):
        from django.core.cache import cache

        cache.set("k", 1)
        assert _ttl(name, ":1:k") is None
    with override_settings(CACHES=djangosite.caches_setting(name, TIMEOUT=0)):
        from django.core.cache import cache

        cache.set("k", 1)
        assert cache.get("k") is None
    backend.close_handles()


def test_django_backend_keys_are_djangos(dcache, name):
    with override_settings(CACHES={**djangosite.caches_setting(name), "other": {
            "BACKEND": "shmcache.contrib.django.SharedMemoryCache", "LOCATION": name, "KEY_PREFIX": "p",
            "VERSION": 3}}):
        from django.core.cache import caches

        caches["default"].set("k", "plain")
        caches["other"].set("k", "prefixed")
        assert caches["default"].get("k") == "plain" and caches["other"].get("k") == "prefixed"
        with SharedCache(name, create=False, serializer="pickle") as c:
            assert c.get("p:3:k") == "prefixed"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            caches["default"].set("with space", 1)
        from django.core.cache import CacheKeyWarning

        assert [w.category for w in caught] == [CacheKeyWarning]


def test_django_backend_batches(dcache):
    assert dcache.set_many({"a": 1, "b": [2], "c": None}) == []
    assert dcache.get_many(iter(["a", "b", "c", "x"])) == {"a": 1, "b": [2], "c": None}
    assert dcache.delete_many(["a", "b"]) is None and dcache.get_many(["a", "b", "c"]) == {"c": None}
    assert dcache.set_many({}) == []


def test_django_backend_batches_hold_the_lock_once(dcache, monkeypatch):
    dcache.set("warm", 0)  # opens the handle
    holds = count_lock_holds(monkeypatch, dcache._cache)
    dcache.set_many({f"k{i}": i for i in range(20)})
    assert len(holds) == 1
    holds.clear()
    assert dcache.get_many([f"k{i}" for i in range(25)]) == {f"k{i}": i for i in range(20)}
    assert len(holds) == 1


def test_django_backend_too_large_values_are_not_stored(dcache):
    big = b"x" * (2 << 20)  # above capacity_bytes
    dcache.set("k", "old")
    dcache.set("k", big)
    assert dcache.get("k") is None  # not stored, and the old value went (memcached's rule)
    assert dcache.add("k", big) is False
    dcache.set("k2", "old")
    assert dcache.set_many({"k2": big, "k3": 3}) == ["k2"]
    assert dcache.get("k2") is None and dcache.get("k3") == 3


def test_django_backend_pickle_errors_propagate(dcache):
    import threading

    with pytest.raises((pickle.PickleError, TypeError)):
        dcache.set("lock", threading.Lock())


def test_django_backend_options_pass_to_the_cache(name):
    with override_settings(CACHES=djangosite.caches_setting(name, OPTIONS={
            "capacity_bytes": 300_000, "max_entries": 77, "mode": 0o600, "lock_timeout": 5, "MAX_ENTRIES": 9})):
        from django.core.cache import cache

        cache.set("k", 1)
        with SharedCache(name, create=False, serializer="pickle") as c:
            limits = c.limits()
        assert (limits.max_entries, limits.max_retained_bytes) == (77, 300_000)
    backend.close_handles()


def test_django_backend_bad_settings_are_refused(name):
    from django.core.cache import caches

    for params, match in (({"LOCATION": ""}, "LOCATION"), ({"LOCATION": name, "OPTIONS": {"capacity": 1}},
                                                             "capacity")):
        with override_settings(CACHES={"default": {"BACKEND": "shmcache.contrib.django.SharedMemoryCache",
                                                   **params}}):
            with pytest.raises(ImproperlyConfigured, match=match):
                caches["default"]
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")


def test_django_backend_refuses_a_default_cache_of_the_same_name(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True):
        with override_settings(CACHES=djangosite.caches_setting(name)):
            from django.core.cache import cache

            with pytest.raises(SerializerMismatch):
                cache.get("k")
    backend.close_handles()


def test_django_backend_close_keeps_the_handle(dcache):
    from django.core.signals import request_finished

    dcache.set("k", 1)
    handle = dcache._cache
    dcache.close()
    request_finished.send(sender=None)  # Django closes every cache at the end of a request
    assert dcache.get("k") == 1 and dcache._cache is handle


def test_django_backend_one_handle_per_process_for_every_instance(dcache, name):
    other = backend.SharedMemoryCache(name, {"OPTIONS": {"capacity_bytes": 1 << 20, "max_entries": 256}})
    dcache.set("k", 1)
    assert other.get("k") == 1 and other._cache is dcache._cache


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_django_backend_reopens_after_fork(dcache):
    check_backend_reopens_after_fork(dcache)


def _race_add(name: str, who: int, keys: list, queue) -> None:
    with override_settings(CACHES=djangosite.caches_setting(name)):
        from django.core.cache import cache

        won = [k for k in keys if cache.add(k, {"key": k, "by": who, "check": f"{k}/{who}"})]
        seen = {k: cache.get(k) for k in keys}
    queue.put((who, won, seen))


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_django_backend_add_is_atomic_across_processes(dcache, name):
    dcache.set("open", 1)  # created here, so the racers only attach
    keys = [f"k{i}" for i in range(200)]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race_add, args=(name, who, keys, queue)) for who in range(4)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=60) for _ in procs]
    finally:
        reap(procs, 30)
    winners: dict = {}
    for who, won, _ in results:
        for k in won:
            assert k not in winners, f"{k} added by {winners[k]} and {who}"
            winners[k] = who
    assert sorted(winners) == sorted(keys)  # every key added exactly once
    for who, _, seen in results:
        for k, v in seen.items():  # every process read the one winner's value, whole
            assert v == {"key": k, "by": winners[k], "check": f"{k}/{winners[k]}"}, (who, k, v)


def _race_get_or_set(name: str, who: int, keys: list, use_async: bool, barrier, calls, queue) -> None:
    """Ask for every key at once with the other workers, through get_or_set (or aget_or_set) with a callable that
    counts its calls (in ``calls``, shared) and takes a while, so that every worker misses."""
    import asyncio
    import time

    with override_settings(CACHES=djangosite.caches_setting(name)):
        from django.core.cache import cache

        def compute(key: str):
            def fn():
                with calls.get_lock():
                    calls.value += 1
                time.sleep(0.3)
                return {"key": key, "by": who, "check": f"{key}/{who}"}
            return fn

        async def all_async():
            return await asyncio.gather(*(cache.aget_or_set(k, compute(k), 60) for k in keys))

        barrier.wait(timeout=30)
        got = asyncio.run(all_async()) if use_async else [cache.get_or_set(k, compute(k), 60) for k in keys]
    queue.put((who, dict(zip(keys, got))))


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_django_backend_get_or_set_computes_once_per_host(dcache, name, use_async):
    dcache.set("open", 1)  # created here, so the workers only attach
    keys = ["a", "b", "c"]
    ctx = mp.get_context("fork")
    barrier, calls, queue = ctx.Barrier(4), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_race_get_or_set, args=(name, who, keys, use_async, barrier, calls, queue))
             for who in range(4)]
    results = start_and_collect(procs, queue, 60)
    assert calls.value == len(keys)  # each key computed once, by one of the four
    for k in keys:
        seen = {who: got[k] for who, got in results}
        assert len({v["by"] for v in seen.values()}) == 1, seen  # every worker got the one computed value
        by = seen[0]["by"]
        assert all(v == {"key": k, "by": by, "check": f"{k}/{by}"} for v in seen.values()), seen
        assert dcache.get(k) == seen[0]


def test_django_backend_get_or_set_keeps_djangos_rules(dcache, name):
    import asyncio

    assert dcache.get_or_set("none", lambda: None) is None and dcache.get("none", "dflt") is None
    assert dcache.get_or_set("plain", 5) == 5 and dcache.get_or_set("plain", 6) == 5
    assert dcache.get_or_set("v", lambda: "two", version=2) == "two" and dcache.get("v") is None
    assert dcache.get_or_set("gone", lambda: "x", timeout=0) == "x" and dcache.get("gone") is None
    assert dcache.get_or_set("kept", lambda: "y", timeout=None) == "y" and _ttl(name, dcache.make_key("kept")) is None
    with pytest.raises(ReentrantCallError):
        dcache.get_or_set("self", lambda: dcache.get_or_set("self", lambda: 1))

    async def check():
        async def coroutine():
            return "awaited"
        assert await dcache.aget_or_set("co", coroutine) == "awaited"
        assert await dcache.aget_or_set("co", lambda: "again") == "awaited"
        assert await dcache.aget_or_set("aplain", 7) == 7 and await dcache.aget_or_set("aplain", 8) == 7

    asyncio.run(check())
    assert dcache.get("co") == "awaited"


def test_django_sessions_on_the_backend(dcache):
    from django.contrib.sessions.backends.cache import SessionStore

    with override_settings(SESSION_CACHE_ALIAS="default"):
        s = SessionStore()
        s["cart"] = {"items": [1, 2], "total": 3}
        s.save()
        key = s.session_key
        again = SessionStore(session_key=key)
        assert again["cart"] == {"items": [1, 2], "total": 3}
        assert again.exists(key)
        again.flush()
        assert not SessionStore().exists(key) and SessionStore(session_key=key).load() == {}


def test_django_cache_middleware_on_the_backend(dcache):
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django.views.decorators.cache import cache_page

    calls = []

    @cache_page(60)
    def view(request):
        calls.append(1)
        return HttpResponse(f"rendered {len(calls)}")

    with override_settings(ALLOWED_HOSTS=["testserver"]):
        first = view(RequestFactory().get("/page"))
        second = view(RequestFactory().get("/page"))
    assert first.content == second.content == b"rendered 1" and len(calls) == 1


def test_django_async_methods_are_native_and_keep_django_semantics(dcache):
    import asyncio

    from django.core.cache.backends.base import BaseCache

    names = ["aadd", "aget", "aset", "atouch", "adelete", "ahas_key", "aincr", "adecr", "aget_many", "aset_many",
             "adelete_many", "aget_or_set", "aclear", "aclose"]
    from django.core.cache import caches

    backend_class = type(caches["default"])
    assert backend_class is backend.SharedMemoryCache
    assert all(getattr(backend_class, n) is not getattr(BaseCache, n) for n in names)  # none is BaseCache's hop

    async def main():
        await dcache.aset("a", {"v": 1})
        assert await dcache.aget("a") == {"v": 1} and await dcache.aget("zz", "d") == "d"
        assert await dcache.aadd("a", 2) is False and await dcache.aadd("b", 2) is True
        assert await dcache.aget_many(["a", "b", "c"]) == {"a": {"v": 1}, "b": 2}
        assert await dcache.aset_many({"c": 3, "d": 4}) == []
        assert await dcache.aincr("c", 5) == 8 and await dcache.adecr("c") == 7
        with pytest.raises(ValueError, match="not found"):
            await dcache.aincr("missing")
        assert await dcache.ahas_key("d") and await dcache.adelete("d") and not await dcache.ahas_key("d")
        assert await dcache.atouch("a", 60) is True and await dcache.atouch("gone", 60) is False
        assert await dcache.aget_or_set("e", lambda: "made") == "made" and await dcache.aget("e") == "made"
        await dcache.adelete_many(["a", "b"])
        assert await dcache.aget_many(["a", "b"]) == {}
        await dcache.aclear()
        assert await dcache.aget("c") is None
        await dcache.aclose()
        assert dcache.get("c", "still usable") == "still usable"

    asyncio.run(main())


def test_django_redis_extras_map_onto_the_cache(dcache):
    from django.core.cache import caches

    be = caches["default"]
    be.set("session:1", "a", timeout=100)
    be.set("session:2", "b", timeout=None)
    be.set("other", "c")
    assert 99 <= be.ttl("session:1") <= 100 and be.ttl("session:2") is None and be.ttl("absent") == 0
    assert be.expire("session:2", 50) is True and 49 <= be.ttl("session:2") <= 50
    assert be.persist("session:1") is True and be.ttl("session:1") is None
    assert be.expire("absent", 5) is False and be.persist("absent") is False
    assert sorted(be.keys("session:*")) == ["session:1", "session:2"] and sorted(be.iter_keys()) == [
        "other", "session:1", "session:2"]
    assert be.keys("session:*", version=2) == []  # another version's keys are others
    assert be.delete_pattern("session:*") == 2 and be.keys() == ["other"]
    with be.lock("job") as held:
        assert held.locked()
        with pytest.raises(ReentrantCallError, match="already holds the lock"):
            be.lock("job").acquire(blocking=False)
    again = be.lock("job", blocking_timeout=1)
    assert again.acquire() is True
    again.release()


def test_django_options_choose_the_eviction_policy(name):
    with override_settings(CACHES=djangosite.caches_setting(name, OPTIONS={"capacity_bytes": 1 << 20,
                                                                             "max_entries": 4, "policy": "keep"})):
        from django.core.cache import caches

        be = caches["default"]
        for i in range(6):
            be.set(f"k{i}", i)
        assert [be.get(f"k{i}") for i in range(6)] == [0, 1, 2, 3, None, None]  # kept what came first
        assert be._cache.policy == "keep" and be._cache.stats().not_admitted == 2
    backend.close_handles()
