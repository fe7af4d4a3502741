"""shmcache.contrib.aiocache: aiocache's BaseCache over SharedCache, shared by processes, and its cached decorator."""

from __future__ import annotations

import asyncio
import multiprocessing as mp

import pytest

aiocache = pytest.importorskip("aiocache", reason="aiocache is in the test extra")

from aiocache import cached  # noqa: E402

from shmcache import SharedCache  # noqa: E402
from shmcache.contrib.aiocache import SharedMemoryCache  # noqa: E402
from shmcache.contrib.backends import close_handles  # noqa: E402

ctx = mp.get_context("fork")
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def acache(name):
    c = SharedMemoryCache(name=name, capacity_bytes=1 << 20, max_entries=256, namespace="t:")
    yield c
    close_handles()
    SharedCache.unlink_name(name)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_aiocache_backend_keeps_aiocache_semantics(acache):
    async def main():
        assert await acache.set("k", {"v": [1, 2]}) is True and await acache.get("k") == {"v": [1, 2]}
        assert await acache.get("absent", default="d") == "d" and not await acache.exists("absent")
        assert await acache.add("new", 1) is True
        with pytest.raises(ValueError, match="already exists"):
            await acache.add("new", 2)
        assert await acache.multi_set([("a", 1), ("b", 2)]) is True
        assert await acache.multi_get(["a", "b", "c"]) == [1, 2, None]
        assert await acache.increment("n", 5) == 5 and await acache.increment("n", -2) == 3
        with pytest.raises(TypeError):
            await acache.increment("k")
        assert await acache.expire("a", 100) is True and await acache.expire("zz", 1) is False
        assert await acache.delete("a") == 1 and await acache.delete("a") == 0
        token = await acache.get("b")
        assert await acache.set("b", 3, _cas_token=token) is True and await acache.set("b", 4, _cas_token=token) == 0
        assert await acache.get("b") == 3
        await acache.set("short", 1, ttl=0.05)
        await asyncio.sleep(0.2)
        assert await acache.get("short") is None
        assert await acache.clear(namespace="t:n") is True and await acache.get("n") is None
        assert await acache.get("b") == 3
        await acache.clear()
        assert await acache.get("b") is None
        await acache.close()

    run(main())


def _set_in_child(name, q):
    async def main():
        c = SharedMemoryCache(name=name, namespace="t:")
        await c.set("from-child", {"pid": 1})
        q.put("done")

    asyncio.run(main())


def test_aiocache_backend_is_shared_by_processes_and_serves_the_cached_decorator(acache, name):
    assert run(acache.exists("made")) is False  # the cache exists (made by this handle) before the child attaches
    q = ctx.Queue()
    p = ctx.Process(target=_set_in_child, args=(name, q), daemon=True)
    p.start()
    assert q.get(timeout=30) == "done"
    p.join(30)
    calls = []

    @cached(cache=SharedMemoryCache, name=name, namespace="deco:", ttl=60)
    async def square(x):
        calls.append(x)
        return x * x

    async def main():
        assert await acache.get("from-child") == {"pid": 1}
        assert [await square(4), await square(4), await square(5)] == [16, 16, 25]

    run(main())
    assert calls == [4, 5]
    with SharedCache(name, create=False) as raw:
        assert raw.stats().entries == 3  # the child's key and the two results: one cache


def test_aiocache_backend_redlock_releases_only_its_own_value_and_raw_only_public_methods(acache):
    from aiocache.lock import RedLock

    async def main():
        async with RedLock(acache, "res", lease=10):
            assert await acache.exists("res-lock")
            held = await acache.get("res-lock")
            assert await acache._redlock_release(acache.build_key("res-lock"), "not this lock's value") == 0
            assert await acache.get("res-lock") == held  # another's value: left alone
        assert not await acache.exists("res-lock")  # released by its holder: its own value matched
        assert await acache.raw("get", "missing") is None
        with pytest.raises(ValueError, match="no public method"):
            await acache.raw("_guard")

    run(main())
