"""Every public call of shmcache, written as typed user code: ``mypy --strict examples/typed_usage.py`` must accept it
(tests/test_typing.py checks that), and ``python examples/typed_usage.py [--redis URL]`` runs it, so the types it
relies on are those the calls return. Each typed assignment below (``n: int = ...``) is a check that a type flows
from the package to the caller; the ``assert isinstance`` beside the key ones checks at run time that it is true.

It makes caches of its own (unique names) and unlinks them before it returns; with ``--redis URL`` it also runs
the TieredCache part against that Redis, in a namespace of its own whose keys it deletes.
"""

from __future__ import annotations

import argparse
import os
import pickle
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

import shmcache
from shmcache import (
    AttachTimeout, CacheLimits, CacheStats, ClosedError, ComputeTimeout, CorruptionError, KindsFullError, KindStats,
    KindView, LayoutError, LayoutVersionError, LockTimeout, OwnershipError, PinnedError, ReentrantCallError,
    RemoteError, SharedCache, ShmCacheError, TieredCache, TierStats, TooLargeError, VerifyReport, View,
    prometheus_text, sweep,
)


def unique(tag: str) -> str:
    return f"typed-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def dict_api(cache: SharedCache) -> None:
    """The dict-like calls, with the types each returns."""
    cache.put("a", 1)
    cache.put("b", [1, 2, 3], ttl=60.0)
    cache["c"] = {"x": 1.5}
    got: object = cache.get("a")
    assert got == 1
    assert cache.get("missing", "dflt") == "dflt"
    assert cache["c"] == {"x": 1.5}
    assert "a" in cache and "missing" not in cache
    added: bool = cache.add("d", b"bytes")
    assert added and not cache.add("d", b"again")
    replaced: bool = cache.replace("d", b"new")
    assert replaced
    value, version = cache.get_with_version("d")
    assert value == b"new"
    assert version is not None
    swapped: bool = cache.cas("d", b"swapped", version)
    assert swapped
    touched: bool = cache.touch("d", ttl=30.0)
    assert touched
    left: float | None = cache.ttl("d")
    assert left is not None and 0 < left <= 30.0
    counter: int = cache.incr("n")
    counter = cache.decr("n", 2, initial=None)
    assert counter == -1
    deleted: bool = cache.delete("n")
    assert deleted
    del cache["c"]
    popped = cache.pop("d")
    assert popped == b"swapped"
    assert cache.pop("d", None) is None
    kept = cache.setdefault("e", "first")
    assert kept == "first" and cache.setdefault("e", "second") == "first"
    cache.put_many({"k1": 1, "k2": 2})
    cache.put_many([("k3", 3)], ttl=60.0)
    cache.update({"k4": 4}, k5=5)
    many: list[object] = cache.get_many(["k1", "k3", "nope"], default=0)
    assert many == [1, 3, 0]
    n: int = len(cache)
    keys: list[object] = list(cache.keys())
    values: list[object] = list(cache.values())
    items: list[tuple[object, object]] = list(cache.items())
    assert n == len(keys) == len(values) == len(items)
    it: Iterator[object] = iter(cache)
    assert next(it) in keys
    key, val = cache.popitem()
    assert key not in cache and val is not None
    expired: int = cache.expire()
    assert expired >= 0
    cleared: int = cache.clear()
    assert isinstance(cleared, int) and cleared == n - 1 and len(cache) == 0


def compute_api(cache: SharedCache) -> None:
    """get_or_compute keeps fn's result type; memoize keeps the function's signature and adds lru_cache's methods."""
    def load() -> list[int]:
        return [1, 2, 3]

    loaded: list[int] = cache.get_or_compute("loaded", load, timeout=5.0, ttl=60.0)
    assert loaded == [1, 2, 3] and cache.get_or_compute("loaded", load) == [1, 2, 3]

    @cache.memoize
    def square(x: int) -> int:
        return x * x

    @cache.memoize(name="typed.cube", timeout=5.0, ttl=60.0)
    def cube(x: int, *, scale: float = 1.0) -> float:
        return x * x * x * scale

    sq: int = square(3)
    assert sq == 9 and square(3) == 9
    cu: float = cube(2, scale=0.5)
    assert cu == 4.0
    info = square.cache_info()
    hits: int = info.hits
    misses: int = info.misses
    maxsize: int | None = info.maxsize
    currsize: int = info.currsize
    assert (hits, misses, currsize) == (1, 1, 1) and maxsize == cache.limits().max_entries
    params: dict[str, object] = cube.cache_parameters()
    assert params["name"] == cube.cache_name == "typed.cube"
    removed: int = square.cache_clear()
    assert isinstance(removed, int) and removed == 1
    call: Callable[[int], int] = square  # the wrapper is still a function of the same signature
    assert call(4) == 16


def view_api(cache: SharedCache) -> None:
    """view() pins an entry; the with-target is a read-only array (or memoryview for bytes)."""
    cache.put("arr", np.arange(6, dtype=np.int64).reshape(2, 3))
    cache.put("raw", b"\x01\x02")
    view: View = cache.view("arr")
    with view as arr:
        assert isinstance(arr, np.ndarray)
        total = int(arr.sum())
        assert total == 15
    with cache.view("raw") as mem:
        assert isinstance(mem, memoryview)
        assert bytes(mem) == b"\x01\x02"
    other = cache.view("arr")
    other.close()
    with cache.view("arr") as pinned:
        assert isinstance(pinned, np.ndarray)
        cache.put("arr", np.zeros(1))  # a view blocks no writer: the bytes it reads are held aside for it
        assert pinned.shape == (2, 3)
    typed: npt.NDArray[np.float64] = np.asarray(cache.get("arr"), dtype=np.float64)
    assert typed.shape == (1,)
    with SharedCache(unique("one"), max_entries=1, create=True) as one:
        one.put("a", b"a")
        try:
            with one.view("a"):
                one.put("b", b"b")  # the one entry the limit allows is pinned: no room
        except PinnedError as exc:
            what: str = exc.what
            hint: str = exc.hint
            assert what and hint
        finally:
            one.unlink()


def kind_api(cache: SharedCache) -> None:
    users: KindView = cache.kind("users")
    users.put(1, "ada")
    users[2] = "grace"
    assert users.get(1) == "ada" and 1 not in cache
    assert users.add(3, "x") and users.replace(3, "y")
    got, version = users.get_with_version(3)
    assert got == "y" and version is not None and users.cas(3, "z", version)
    assert users.touch(3, ttl=10.0) and users.ttl(3) is not None
    assert users.incr("visits") == 1 and users.decr("visits") == 0
    assert users.delete("visits") and users.pop(3) == "z"
    assert users.setdefault(4, "w") == "w"
    assert users.get_many([1, 2]) == ["ada", "grace"]
    users.put_many({5: "e"})
    name: str = users.get_or_compute(6, lambda: "computed")
    assert name == "computed"

    @users.memoize
    def greet(who: str) -> str:
        return f"hello {who}"

    greeting: str = greet("ada")
    assert greeting == "hello ada" and greet.cache_info().misses == 1
    users.put("arr", np.ones(2))
    with users.view("arr") as arr:
        assert isinstance(arr, np.ndarray)
    stats: KindStats = users.stats()
    entries: int = stats.entries
    assert entries == len(users) and stats.retained_bytes > 0
    limits: CacheLimits = users.limits()
    users.set_limits(max_entries=limits.max_entries)
    assert list(users) and users.items() and users.values()
    assert users.popitem()
    cleared: int = users.clear()
    assert isinstance(cleared, int) and cleared > 0 and len(users) == 0


def admin_api(cache: SharedCache, name: str) -> None:
    """stats, limits, verify, sweep, prometheus_text, pickling, lifecycle."""
    cache.put("x", 1)
    stats: CacheStats = cache.stats()
    hits: int = stats.hits
    ratio: float = stats.hit_ratio
    as_dict: dict[str, object] = stats.as_dict()
    kinds: dict[str, KindStats] = stats.kinds
    assert isinstance(hits, int) and isinstance(stats.entries, int) and 0.0 <= ratio <= 1.0
    assert as_dict["entries"] == stats.entries and "users" in kinds
    limits: CacheLimits = cache.limits()
    cache.set_limits(CacheLimits(max_entries=limits.max_entries, max_retained_bytes=limits.max_retained_bytes))
    cache.set_limits(max_entries=limits.max_entries)
    report: VerifyReport = cache.verify(deep=True, repair_damage=False)
    problems: tuple[str, ...] = report.problems
    assert report.ok and bool(report) and not problems and report.entries == stats.entries
    text: str = prometheus_text({name: stats})
    assert f'cache="{name}"' in text
    found: list[dict[str, object]] = sweep(names=[name])
    assert [f["cache"] for f in found] == [name] and found[0]["state"] == "in use"
    copy = pickle.loads(pickle.dumps(cache))
    with copy:
        assert copy.get("x") == 1
    assert repr(cache).startswith("SharedCache(")
    version: str = shmcache.__version__
    assert version


def errors_api(name: str) -> None:
    """Each error a caller may catch, with its stdlib base where it has one."""
    try:
        SharedCache(name, create=True)
    except FileExistsError:
        pass
    with SharedCache(name) as cache:
        try:
            cache.put("big", b"x" * (cache.limits().max_retained_bytes + 1))
        except TooLargeError as exc:
            assert isinstance(exc, ValueError) and exc.hint
    try:
        cache.get("x")
    except ClosedError as exc:
        assert isinstance(exc, ShmCacheError)
    caught: tuple[type[ShmCacheError], ...] = (
        LayoutError, LayoutVersionError, CorruptionError, LockTimeout, ComputeTimeout, OwnershipError, RemoteError,
        AttachTimeout, KindsFullError, ReentrantCallError,
    )
    assert issubclass(LockTimeout, TimeoutError) and issubclass(ComputeTimeout, TimeoutError)
    assert issubclass(AttachTimeout, TimeoutError) and issubclass(KindsFullError, ValueError)
    assert issubclass(ReentrantCallError, RuntimeError)
    assert issubclass(OwnershipError, PermissionError) and issubclass(RemoteError, ConnectionError)
    assert all(issubclass(e, ShmCacheError) for e in caught)


def tiered_usage(url: str, local_name: str) -> None:
    """The Redis tier: the same API, over every host; needs a Redis at ``url``."""
    namespace = f"typed{uuid.uuid4().hex[:10]}"
    try:
        _tiered_calls(url, local_name, namespace)
    finally:
        SharedCache.unlink_name(local_name)


def _tiered_calls(url: str, local_name: str, namespace: str) -> None:
    with SharedCache(local_name, capacity_bytes=1 << 20, max_entries=256, create=True) as local, \
            TieredCache(local, url, namespace=namespace, max_age=30.0, timeout=1.0, strict=True) as tier:
        tier.put("a", 1)
        tier["b"] = 2
        assert tier.get("a") == 1 and "b" in tier
        assert tier.add("c", 3) and tier.replace("c", 4)
        got, version = tier.get_with_version("c")
        assert got == 4 and version is not None and tier.cas("c", 5, version)
        assert tier.touch("c", ttl=60.0) and tier.ttl("c") is not None
        assert tier.incr("n") == 1 and tier.decr("n") == 0
        assert tier.delete("n") and tier.pop("c") == 5
        assert tier.setdefault("d", "x") == "x"
        tier.put_many({"e": 1})
        assert tier.get_many(["a", "e"]) == [1, 1]
        computed: list[str] = tier.get_or_compute("f", lambda: ["fleet"], timeout=5.0)
        assert computed == ["fleet"]

        @tier.memoize
        def double(x: int) -> int:
            return 2 * x

        doubled: int = double(21)
        assert doubled == 42 and double.cache_info().maxsize is None
        stats: TierStats = tier.stats()
        puts: int = stats.puts
        p99: float = stats.remote_p99_us
        assert puts > 0 and p99 >= 0.0 and isinstance(stats.local_hits, int)
        text = prometheus_text({local_name: local.stats()}, {(local_name, namespace): stats})
        assert "shmcache_tier_puts_total" in text
        limits: CacheLimits = tier.limits()
        tier.set_limits(max_entries=limits.max_entries)
        keys: list[object] = list(tier.keys())
        assert len(keys) == len(tier) == 6  # a, b, d, e, f and double's entry
        cleared: int = tier.clear()
        assert isinstance(cleared, int)
        tier.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis", metavar="URL", help="also run the TieredCache part against this Redis")
    args = parser.parse_args(argv)
    name = unique("cache")
    try:
        with SharedCache(name, capacity_bytes=1 << 20, max_entries=256, create=True, mode=0o600, lock_timeout=5.0,
                         attach_timeout=5.0, default_ttl=None, clock=None, trust_owner=None, group=None) as cache:
            dict_api(cache)
            compute_api(cache)
            view_api(cache)
            kind_api(cache)
            admin_api(cache, name)
        errors_api(name)
    finally:
        try:
            SharedCache.unlink_name(name)
        except FileNotFoundError:
            pass
    if args.redis:
        tiered_usage(args.redis, unique("tier"))
    print("typed_usage: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
