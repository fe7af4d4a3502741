"""The Flask-Caching backend (shmcache.contrib.flask): cachelib's semantics on top of SharedCache, its config keys,
one lock hold per batch, a handle per process (re-opened after fork), add and inc atomic across processes, and
Flask-Caching's decorators on an app, also across processes. Flask-Caching's own tests run in
tests/test_flask_suite.py; real gunicorn workers in tests/test_flask_gunicorn.py."""

from __future__ import annotations

import datetime
import decimal
import hashlib
import multiprocessing as mp
import os
import pickle

import pytest

pytest.importorskip("flask_caching", reason="Flask-Caching is in the test extra (pip install -e '.[test]')")

import flask
from flask_caching import Cache

from shmcache import SerializerMismatch, SharedCache
from shmcache.contrib import flask as contrib_flask
from shmcache.contrib.flask import SharedMemoryCache, close_handles

from .workers import check_backend_reopens_after_fork, count_lock_holds, reap, start_and_collect

BACKEND = "shmcache.contrib.flask.SharedMemoryCache"
OPTIONS = {"capacity_bytes": 4 << 20, "max_entries": 4096}  # room for every key of the races: nothing evicted


def _app(name: str, **config) -> tuple[flask.Flask, Cache]:
    app = flask.Flask(__name__)
    app.config.update({"CACHE_TYPE": BACKEND, "CACHE_SHMCACHE_NAME": name, "CACHE_OPTIONS": dict(OPTIONS), **config})
    return app, Cache(app)


@pytest.fixture
def fcache(name):
    """Flask-Caching's backend of an app whose cache is a SharedMemoryCache named ``name`` (default config)."""
    app, cache = _app(name)
    yield app.extensions["cache"][cache]
    close_handles()


def _own(name: str) -> SharedCache:
    """A handle of our own on the cache, to look at what the backend stored."""
    return SharedCache(name, create=False, serializer="pickle")


def _digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


def test_flask_backend_round_trips_what_flask_caches(fcache):
    values = {"s": "text", "n": None, "d": {"a": [1, (2, 3)], "when": datetime.datetime(2024, 1, 2)},
              "dec": decimal.Decimal("2.50"), "set": {1, 2}, "b": b"\x00raw", "f": False}
    for k, v in values.items():
        assert fcache.set(k, v) is True
    assert {k: fcache.get(k) for k in values} == values
    assert fcache.get("absent") is None and fcache.has("n") and not fcache.has("absent")
    assert fcache.get_dict("s", "absent") == {"s": "text", "absent": None}


def test_flask_backend_config_keys(name):
    app, cache = _app(name, CACHE_DEFAULT_TIMEOUT=40, CACHE_KEY_PREFIX="site1_",
                      CACHE_OPTIONS={"capacity_bytes": 300_000, "max_entries": 77, "lock_timeout": 5})
    backend = app.extensions["cache"][cache]
    with app.app_context():
        cache.set("k", "v")
    with _own(name) as c:
        assert c.get("site1_k") == "v" and 39 < c.ttl("site1_k") <= 40  # the prefix and the default timeout
        limits = c.limits()
    assert (limits.max_entries, limits.max_retained_bytes) == (77, 300_000)
    assert type(backend) is SharedMemoryCache and backend.default_timeout == 40
    close_handles()


def test_flask_backend_timeouts(fcache, name):
    fcache.set("default", 1)
    fcache.set("forever", 1, 0)  # cachelib's 0: never expires
    fcache.set("delta", 1, datetime.timedelta(seconds=90))
    fcache.set("long", 1, 10**12)  # past SharedCache's 73 years: clamped, not refused
    with _own(name) as c:
        assert 299 < c.ttl("flask_cache_default") <= 300  # Flask-Caching's CACHE_DEFAULT_TIMEOUT default
        assert c.ttl("flask_cache_forever") is None
        assert 89 < c.ttl("flask_cache_delta") <= 90
        assert c.ttl("flask_cache_long") > 10**9
    for timeout in (-1, -100):  # below 0: stored already expired
        fcache.set("gone", "old")
        assert fcache.set("gone", "new", timeout) is True
        assert fcache.get("gone") is None and not fcache.has("gone")  # the old value went too
        assert fcache.add("add0", 1, timeout) is True and fcache.get("add0") is None
        fcache.set("live", 1)
        assert fcache.add("live", 2, timeout) is False and fcache.get("live") == 1  # present: add changes nothing
        assert fcache.set_many({"m1": 1, "m2": 2}, timeout) == ["m1", "m2"] and fcache.get_many("m1", "m2") == [None,
                                                                                                               None]


def test_flask_backend_timeout_default_zero_never_expires(name):
    app, cache = _app(name, CACHE_DEFAULT_TIMEOUT=0)
    with app.app_context():
        cache.set("k", 1)
    with _own(name) as c:
        assert c.ttl("flask_cache_k") is None
    close_handles()


def test_flask_backend_add_delete_has(fcache):
    assert fcache.add("k", 1) is True and fcache.add("k", 2) is False and fcache.get("k") == 1
    assert fcache.delete("k") is True and fcache.delete("k") is False and not fcache.has("k")
    fcache.set_many({"a": 1, "b": 2})
    assert fcache.delete_many("a", "b", "absent") == ["a", "b", "absent"]  # absent afterwards: deleted
    assert fcache.get_many("a", "b") == [None, None]


def test_flask_backend_inc_dec(fcache, name):
    assert fcache.inc("new") == 1 and fcache.dec("new2", 3) == -3  # a missing key starts at 0
    fcache.set("n", 41, 50)
    assert fcache.inc("n") == 42 and fcache.dec("n", 10) == 32 and fcache.get("n") == 32
    with _own(name) as c:
        assert 49 < c.ttl("flask_cache_n") <= 50  # inc keeps the expiry, as Redis's INCRBY does
    fcache.set("s", "text")
    with pytest.raises(TypeError):
        fcache.inc("s")
    assert fcache.get("s") == "text"


def test_flask_backend_clear_removes_its_prefix_only(name):
    app1, cache1 = _app(name, CACHE_KEY_PREFIX="one_")
    app2, cache2 = _app(name, CACHE_KEY_PREFIX="two_")
    with app1.app_context():
        cache1.set("k", 1)
    with app2.app_context():
        cache2.set("k", 2)
    with _own(name) as c:
        c.put("plain", 3)
        c.put(("not", "a", "str"), 4)
        assert app1.extensions["cache"][cache1].clear() is True
        assert c.get("one_k") is None and c.get("two_k") == 2 and c.get("plain") == 3
        assert c.get(("not", "a", "str")) == 4
        app3, cache3 = _app(name, CACHE_KEY_PREFIX="")
        assert app3.extensions["cache"][cache3].clear() is True  # no prefix: the whole cache
        assert len(c) == 0
    close_handles()


def test_flask_backend_batches(fcache):
    assert fcache.set_many({"a": 1, "b": [2], "c": None}) == ["a", "b", "c"]
    assert fcache.get_many("a", "b", "c", "x") == [1, [2], None, None]
    assert fcache.set_many({}) == [] and fcache.get_many() == []


def test_flask_backend_batches_hold_the_lock_once(fcache, monkeypatch):
    fcache.set("warm", 0)  # opens the handle
    holds = count_lock_holds(monkeypatch, fcache._cache)
    fcache.set_many({f"k{i}": i for i in range(20)})
    assert len(holds) == 1
    holds.clear()
    assert fcache.get_many(*[f"k{i}" for i in range(25)]) == list(range(20)) + [None] * 5
    assert len(holds) == 1


def test_flask_backend_too_large_values_are_not_stored(fcache):
    big = b"x" * (OPTIONS["capacity_bytes"] + 1)
    fcache.set("k", "old")
    assert fcache.set("k", big) is False
    assert fcache.get("k") is None  # not stored, and the old value went (memcached's rule)
    assert fcache.add("k", big) is False
    fcache.set("k2", "old")
    assert fcache.set_many({"k2": big, "k3": 3}) == ["k3"]
    assert fcache.get("k2") is None and fcache.get("k3") == 3


def test_flask_backend_pickle_errors_propagate(fcache):
    import threading

    fcache.set("lock", "old")
    with pytest.raises((pickle.PickleError, TypeError)):
        fcache.set("lock", threading.Lock())
    assert fcache.get("lock") == "old"


def test_flask_backend_bad_config_is_refused(name):
    for config, error, match in (
            ({"CACHE_SHMCACHE_NAME": None}, ValueError, "CACHE_SHMCACHE_NAME"),
            ({"CACHE_OPTIONS": {"capacity": 1}}, ValueError, "capacity"),
            ({"CACHE_ARGS": [name]}, ValueError, "CACHE_ARGS"),
            ({"CACHE_KEY_PREFIX": 7}, TypeError, "CACHE_KEY_PREFIX")):
        app = flask.Flask(__name__)
        app.config.update({"CACHE_TYPE": BACKEND, "CACHE_SHMCACHE_NAME": name, **config})
        with pytest.raises(error, match=match):
            Cache(app)
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")


def test_flask_backend_refuses_a_default_cache_of_the_same_name(fcache, name):
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True):
        with pytest.raises(SerializerMismatch):
            fcache.get("k")


def test_flask_backend_one_handle_per_process_for_every_instance(fcache, name):
    other = SharedMemoryCache(name, key_prefix="flask_cache_", **OPTIONS)
    fcache.set("k", 1)
    assert other.get("k") == 1 and other._cache is fcache._cache


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_flask_backend_reopens_after_fork(fcache):
    check_backend_reopens_after_fork(fcache)


INCS = 500  # per process


def _race(name: str, who: int, keys: list, barrier, queue) -> None:
    try:
        app, cache = _app(name)
        backend = app.extensions["cache"][cache]
        backend.has("open")  # attached before the start
        barrier.wait(30)
        won = [k for k in keys if backend.add(k, {"key": k, "by": who, "check": _digest(k, str(who))})]
        barrier.wait(30)
        counted = [backend.inc("counter") for _ in range(INCS)]
        queue.put((who, won, {k: backend.get(k) for k in keys}, counted))
    except BaseException as exc:  # reported, not lost
        queue.put((who, repr(exc), {}, []))


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_flask_backend_add_and_inc_are_atomic_across_processes(fcache):
    fcache.set("open", 1)  # created here, so the racers only attach
    keys = [f"k{i}" for i in range(2000)]
    ctx = mp.get_context("fork")
    queue, barrier = ctx.Queue(), ctx.Barrier(4)
    procs = [ctx.Process(target=_race, args=(fcache._handle.name, who, keys, barrier, queue)) for who in range(4)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=60) for _ in procs]
    finally:
        reap(procs, 30)
    winners: dict = {}
    for who, won, _, _ in results:
        assert isinstance(won, list), won
        for k in won:
            assert k not in winners, f"{k} added by {winners[k]} and {who}"
            winners[k] = who
    assert sorted(winners) == sorted(keys)  # every key added exactly once
    for who, _, seen, _ in results:
        for k, v in seen.items():  # every process read the one winner's value, whole
            assert v == {"key": k, "by": winners[k], "check": _digest(k, str(winners[k]))}, (who, k, v)
    counted = sorted(n for *_, c in results for n in c)
    # No increment lost, none seen twice.
    assert counted == list(range(1, 4 * INCS + 1)) and fcache.get("counter") == 4 * INCS


def test_flask_cached_view_and_memoize_on_an_app(name):
    app, cache = _app(name)
    calls = []

    @app.route("/page")
    @cache.cached(60)
    def page():
        calls.append("page")
        return f"rendered {len(calls)}"

    @cache.memoize(60)
    def square(x):
        calls.append(x)
        return {"x": x, "square": x * x}

    client = app.test_client()
    assert client.get("/page").data == client.get("/page").data == b"rendered 1"
    with app.app_context():
        assert square(3) == square(3) == {"x": 3, "square": 9} and square(4)["square"] == 16
        assert calls == ["page", 3, 4]
        cache.delete_memoized(square, 3)
        assert square(3) == {"x": 3, "square": 9} and calls == ["page", 3, 4, 3]
        cache.clear()
        assert square(4)["square"] == 16 and calls[-1] == 4
    assert client.get("/page").data == b"rendered 6"  # cleared: rendered again
    close_handles()


def _memoized_in_child(name: str, queue) -> None:
    try:
        app, cache = _app(name)

        @cache.memoize(60)
        def computed(key):
            return {"key": key, "pid": os.getpid(), "sum": _digest(key, "v")}

        with app.app_context():
            queue.put(computed("shared"))
    except BaseException as exc:  # reported, not lost
        queue.put(repr(exc))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_flask_memoize_result_is_shared_across_processes(name):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    first = ctx.Process(target=_memoized_in_child, args=(name, queue))
    first.start()
    try:
        computed = queue.get(timeout=30)
    finally:
        reap([first], 30)
    second = ctx.Process(target=_memoized_in_child, args=(name, queue))
    second.start()
    try:
        again = queue.get(timeout=30)
    finally:
        reap([second], 30)
    # The second process found the first one's result (its pid, not its own): one computation for the host.
    assert computed == again == {"key": "shared", "pid": first.pid, "sum": _digest("shared", "v")}
    SharedCache.unlink_name(name)


def _race_decorated(name: str, who: int, barrier, calls, queue) -> None:
    """Call a cached view and a memoized function (two arguments) at once with the other workers; each function
    counts its calls (in ``calls``, shared) and takes a while, so that every worker misses."""
    import time

    try:
        app = flask.Flask(__name__)
        app.config.update({"CACHE_TYPE": BACKEND, "CACHE_SHMCACHE_NAME": name, "CACHE_OPTIONS": dict(OPTIONS)})
        cache = contrib_flask.Cache(app)

        def counted(what: str) -> dict:
            with calls.get_lock():
                calls.value += 1
            time.sleep(0.3)
            return {"what": what, "by": who, "check": _digest(what, str(who))}

        @app.route("/page")
        @cache.cached(60)
        def page():
            return counted("page")

        @cache.memoize(60)
        def square(x):
            return counted(f"square{x}")

        client = app.test_client()
        barrier.wait(timeout=30)
        got = {"page": client.get("/page").get_json()}
        with app.app_context():
            got.update({f"square{x}": square(x) for x in (2, 3)})
        queue.put((who, got))
    except BaseException as exc:  # reported, not lost
        queue.put((who, repr(exc)))


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_flask_cached_and_memoize_compute_once_per_host(name):
    with SharedCache(name, serializer="pickle", **OPTIONS):
        pass  # created here, so the workers only attach
    ctx = mp.get_context("fork")
    barrier, calls, queue = ctx.Barrier(4), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_race_decorated, args=(name, who, barrier, calls, queue)) for who in range(4)]
    try:
        results = start_and_collect(procs, queue, 60)
        assert all(isinstance(got, dict) for _, got in results), results
        assert calls.value == 3  # the page and two squares, each computed once, by one of the four
        for what in ("page", "square2", "square3"):
            seen = [got[what] for _, got in results]
            by = seen[0]["by"]
            assert all(v == {"what": what, "by": by, "check": _digest(what, str(by))} for v in seen), seen
    finally:
        SharedCache.unlink_name(name)


def test_flask_single_flight_keeps_flask_cachings_rules(name):
    app = flask.Flask(__name__)
    app.config.update({"CACHE_TYPE": BACKEND, "CACHE_SHMCACHE_NAME": name, "CACHE_OPTIONS": dict(OPTIONS)})
    cache = contrib_flask.Cache(app)
    calls = []

    @cache.memoize(60)
    def fails(x):
        calls.append(x)
        raise ValueError(x)

    @cache.memoize(60, response_filter=lambda rv: rv != "skip")
    def filtered(x):
        calls.append(x)
        return "skip"

    @cache.memoize(60, cache_none=True)
    def nothing():
        calls.append("none")

    @cache.memoize(60)
    def outer(x):
        calls.append(("outer", x))
        return {"inner": inner(x), "other": cache.get("plain")}

    @cache.memoize(60)
    def inner(x):
        calls.append(("inner", x))
        return x * 2

    with app.app_context():
        for _ in range(2):  # the claim goes with the exception, and with a result not stored: no wait the 2nd time
            with pytest.raises(ValueError):
                fails(1)
            assert filtered(2) == "skip"
        assert nothing() is None and nothing() is None
        cache.set("plain", "p")
        assert outer(5) == outer(5) == {"inner": 10, "other": "p"}
        assert calls == [1, 2, 1, 2, "none", ("outer", 5), ("inner", 5)]
        outer.cache_timeout = 5  # Flask-Caching's attributes, on the function it made
        assert outer.uncached(6) == {"inner": 12, "other": "p"} and outer.cache_timeout == 5
        cache.delete_memoized(outer, 5)
        assert outer(5) == {"inner": 10, "other": "p"} and calls[-1] == ("outer", 5)
        assert contrib_flask._flight.get() is None
        with SharedCache(name, create=False, serializer="pickle") as own:  # no claim left behind
            assert all(own.lock(k).acquire(blocking=False) for k in own.keys())
    close_handles()
    SharedCache.unlink_name(name)


def _first_keys(name: str, who: int, barrier, queue) -> None:
    """Make the cache keys of 30 memoized functions, called for the first time by every worker at once."""
    try:
        app = flask.Flask(__name__)
        app.config.update({"CACHE_TYPE": BACKEND, "CACHE_SHMCACHE_NAME": name, "CACHE_OPTIONS": dict(OPTIONS)})
        cache = contrib_flask.Cache(app)
        functions = []
        for i in range(30):
            def f(x, i=i):
                return x + i
            f.__qualname__ = f"first_call_{i}"
            functions.append(cache.memoize(60)(f))
        with app.app_context():
            barrier.wait(timeout=30)
            queue.put((who, [f.make_cache_key(f.uncached, 1) for f in functions]))
    except BaseException as exc:  # reported, not lost
        queue.put((who, repr(exc)))


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_flask_memoize_first_calls_at_once_agree_on_the_key(name):
    with SharedCache(name, serializer="pickle", **OPTIONS):
        pass  # created here, so the workers only attach
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_first_keys, args=(name, who, barrier, queue)) for who in range(4)]
    try:
        results = start_and_collect(procs, queue, 60)
        keys = [got for _, got in results]
        assert all(isinstance(k, list) and len(k) == 30 for k in keys), keys
        assert all(k == keys[0] for k in keys), keys  # one version per function: one key per call, host-wide
    finally:
        SharedCache.unlink_name(name)
