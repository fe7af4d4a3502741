"""SharedCache.lock: a host-wide lock named by a key, sync and async; a dead holder frees it at once."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os

import pytest

from shmcache import ReentrantCallError, SharedCache

ctx = mp.get_context("fork")
pytestmark = pytest.mark.timeout(60)


def _hold(name: str, key, ready, release, die: bool) -> None:
    c = SharedCache(name, create=False)
    lock = c.lock(key)
    lock.acquire()
    ready.set()
    if die:
        os._exit(0)  # dies holding it: the kernel frees it
    release.wait(30)
    lock.release()
    c.close()


def _holder(name, key, die=False):
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(name, key, ready, release, die), daemon=True)
    p.start()
    assert ready.wait(30)
    return p, release


def test_keylock_excludes_another_process_and_is_freed_by_its_release(cache, name):
    p, release = _holder(name, "job")
    try:
        lock = cache.lock("job")
        assert lock.acquire(blocking=False) is False and not lock.locked()
        assert lock.acquire(timeout=0.05) is False
        with pytest.raises(TimeoutError, match="held by another after 0.05 s"):
            with cache.lock("job", timeout=0.05):
                pass
        assert cache.lock("other").acquire(blocking=False)  # another key's lock is another lock
        release.set()
        with cache.lock("job", timeout=30) as held:
            assert held.locked()
        assert not held.locked()
    finally:
        release.set()
        p.join(30)
    assert "job" not in cache and len(cache) == 0  # no entry is made


def test_keylock_a_dead_holder_frees_it_at_once(cache, name):
    p, _ = _holder(name, ("job", 1), die=True)
    p.join(30)
    lock = cache.lock(("job", 1))
    assert lock.acquire(blocking=False) is True
    lock.release()
    lock.release()  # idempotent


def test_keylock_is_not_reentrant_and_one_object_holds_once(cache):
    lock = cache.lock("k")
    with lock:
        with pytest.raises(ReentrantCallError, match="already holds the lock 'k'"):
            cache.lock("k").acquire()
        with pytest.raises(ReentrantCallError):
            cache.lock("k").acquire(blocking=False)
        with pytest.raises(RuntimeError, match="already holds"):
            lock.acquire()
    with pytest.raises(TypeError):
        cache.lock(object())


def test_keylock_async_waits_off_the_loop(cache, name):
    p, release = _holder(name, "job")
    try:
        async def main():
            ticks = 0

            async def tick():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            lock = cache.lock("job")
            assert await lock.aacquire(blocking=False) is False
            waiting = asyncio.create_task(lock.aacquire())
            while ticks < 50:
                await asyncio.sleep(0.001)
            assert not waiting.done()
            release.set()
            assert await waiting is True and lock.locked()
            lock.release()
            async with cache.lock("job") as held:
                assert held.locked()
            ticker.cancel()

        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        release.set()
        p.join(30)


def test_keylock_a_forked_child_does_not_hold_its_parents_lock(cache, name):
    lock = cache.lock("parent")
    lock.acquire()
    try:
        q = ctx.Queue()

        def child():
            with SharedCache(name, create=False) as c:
                other = c.lock("parent")
                q.put(other.acquire(blocking=False))  # the parent holds it: the child's copy of it is no hold

        p = ctx.Process(target=child, daemon=True)
        p.start()
        assert q.get(timeout=30) is False
        p.join(30)
        assert lock.locked()
    finally:
        lock.release()
