"""A value that can never fit: every refusal counted in ``stats().too_large`` (seen by every process), and a
value ``get_or_compute`` computed and could not keep returned, and said once per family of keys with a
``TooLargeWarning`` that gives its size, the limit and the remedy."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import re
import sys
import warnings

import pytest

from shmcache import CapacityWarning, SharedCache, TooLargeError, TooLargeWarning, prometheus_text
from shmcache.oversize import MAX_FAMILIES, Told

BIG = b"x" * 100_000  # over the fixture's 64 KiB capacity


def _recorded(fn) -> list[warnings.WarningMessage]:
    """The TooLargeWarnings ``fn()`` issues, with every warning shown (no filter of Python's own dedupes them)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, TooLargeWarning)]


def test_too_large_each_refusal_counted(cache):
    """Refused before the lock (over the capacity) and under it (over max_retained_bytes), by every store."""
    refusals = [lambda: cache.put("a", BIG), lambda: cache.add("b", BIG), lambda: cache.replace("a", BIG),
                lambda: cache.setdefault("c", BIG), lambda: cache.put_many({"d": b"1", "e": BIG}),
                lambda: cache.kind("k").put("f", BIG)]
    for refuse in refusals:
        with pytest.raises(TooLargeError):
            refuse()
    assert cache.stats().too_large == len(refusals)
    cache.set_limits(max_retained_bytes=1000)
    with pytest.raises(TooLargeError) as info:
        cache.put("a", b"y" * 2000)
    assert (info.value.size, info.value.limit, info.value.limit_name) == (2002, 1000, "max_retained_bytes")
    assert "set_limits" in str(info.value)
    with pytest.raises(TooLargeError):
        cache.cas("a", b"y" * 2000, 1)
    s = cache.stats()
    assert (s.too_large, s.entries, s.puts) == (len(refusals) + 2, 0, 0)
    assert cache.verify().ok
    assert "shmcache_too_large_total" in prometheus_text({"c": s})
    cache.clear()
    assert cache.stats().too_large == 0


def test_too_large_error_says_size_and_limit(cache):
    with pytest.raises(TooLargeError) as info:
        cache.put("a", BIG)
    e = info.value
    assert (e.size, e.limit, e.limit_name) == (100_002, 64 * 1024, "capacity_bytes")
    assert "resize the cache" in e.hint


def _refuse_in_child(name: str, q) -> None:
    try:
        with SharedCache(name, create=False) as c:
            got = c.get_or_compute("child", lambda: BIG)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q.put((len(got), c.stats().too_large))
    except BaseException as exc:  # reported, so that the parent fails with it rather than a timeout
        q.put(repr(exc))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_too_large_counted_for_every_process(cache, method):
    """A refusal in one process is in the stats of every other: the count is a header word."""
    with pytest.raises(TooLargeError):
        cache.put("parent", BIG)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_refuse_in_child, args=(cache.name, q))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TooLargeWarning)
        p.start()
        try:
            got = q.get(timeout=45)
        finally:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert got == (len(BIG), 2), got
    assert p.exitcode == 0
    assert cache.stats().too_large == 2


def _site_a(cache):
    return cache.get_or_compute("a", lambda: BIG)


def _site_b(cache):
    return cache.get_or_compute("b", lambda: BIG)


def test_get_or_compute_too_large_returns_and_warns_once_per_call_site(cache):
    got = []
    caught = _recorded(lambda: got.extend([_site_a(cache), _site_a(cache), _site_b(cache), _site_a(cache)]))
    assert got == [BIG] * 4  # returned every time, never raised
    s = cache.stats()
    assert (s.computations, s.too_large, s.entries) == (4, 4, 0)
    assert len(caught) == 2, [str(w.message) for w in caught]
    first, second = (str(w.message) for w in caught)
    assert first.startswith(f"get_or_compute in {__name__}._site_a: a value of 100,002 bytes")
    assert second.startswith(f"get_or_compute in {__name__}._site_b:")
    for text in (first, second):
        assert "capacity_bytes is 65,536 bytes" in text and "resize the cache" in text
        assert repr(cache.name) in text
    assert {w.filename for w in caught} == {__file__}  # points at the caller, not into the package
    assert issubclass(TooLargeWarning, CapacityWarning) and issubclass(TooLargeWarning, UserWarning)


def test_get_or_compute_too_large_for_the_limit_in_force(cache):
    cache.set_limits(max_retained_bytes=1000)
    caught = _recorded(lambda: [cache.get_or_compute("k", lambda: b"z" * 2000) for _ in range(2)])
    assert len(caught) == 1
    assert "max_retained_bytes is 1,000 bytes" in str(caught[0].message)
    assert "set_limits" in str(caught[0].message)
    assert cache.stats().too_large == 2


def test_memoize_too_large_warns_once_per_function(cache):
    @cache.memoize
    def big(n):
        return b"m" * n

    @cache.memoize(name="other")
    def other(n):
        return b"o" * n

    caught = _recorded(lambda: [big(100_000), big(100_000), big(100_001), other(100_000), other(100_000)])
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2, texts
    assert texts[0].startswith(f"memoized {big.cache_name}: a value of ")
    assert re.search(r"a value of 100,\d{3} bytes", texts[0])
    assert texts[1].startswith("memoized other: ")
    assert big.cache_info().misses == 3 and big.cache_info().currsize == 0
    assert cache.stats().too_large == 5


def test_kind_too_large_warns_once_for_the_kind(cache):
    imgs = cache.kind("images")

    def site_one():
        return imgs.get_or_compute(1, lambda: BIG)

    def site_two():
        return imgs.get_or_compute(2, lambda: BIG)

    caught = _recorded(lambda: [site_one(), site_two(), site_one()])
    assert [str(w.message).split(":")[0] for w in caught] == ["kind 'images'"]


def test_async_too_large_warns_once(cache):
    @cache.amemoize
    async def big(n):
        return b"a" * n

    async def calls():
        for _ in range(2):
            assert await big(100_000) == b"a" * 100_000
            assert await cache.aget_or_compute("k", lambda: BIG) == BIG

    caught = _recorded(lambda: asyncio.run(calls()))
    texts = sorted(str(w.message).split(":")[0] for w in caught)
    # The calling function is named by its code's qualified name, which Python 3.10's code objects lack.
    caller = "test_async_too_large_warns_once.<locals>.calls" if sys.version_info >= (3, 11) else "calls"
    assert texts == [f"get_or_compute in {__name__}.{caller}", f"memoized {big.cache_name}"], texts
    assert cache.stats().too_large == 4


def test_told_remembers_a_bounded_number_of_families():
    told = Told()
    assert all(told.first(f"f{i}") for i in range(MAX_FAMILIES))
    assert not told.first("f0")
    assert not told.first("one more")  # beyond the bound: silent rather than unbounded


def test_too_large_refused_before_the_lock_inside_a_hold_counts_without_waiting(cache):
    """Guard.bump, from a thread that holds the lock already (an encode made inside a locked operation): counted
    at once, not refused as a re-entered call nor waited for."""
    from shmcache.cache import parts
    from shmcache.layout.dtypes import H_TOO_LARGE

    guard = parts(cache).guard
    guard.hold()
    try:
        guard.bump(H_TOO_LARGE)
    finally:
        guard.let_go()
    guard.bump(H_TOO_LARGE)
    assert cache.stats().too_large == 2 and cache.verify().ok


def test_too_large_refusal_stands_when_the_count_cannot_be_made(name):
    """Refused before the lock on a closed handle (a value above max_capacity_bytes, which no resize reaches):
    still the TooLargeError it always was, the count lost."""
    c = SharedCache(name, capacity_bytes=64 * 1024, max_capacity_bytes=64 * 1024, max_entries=64, create=True)
    c.close()
    with pytest.raises(TooLargeError):
        c.put("a", BIG)
    with SharedCache(name, create=False) as again:
        assert again.stats().too_large == 0
