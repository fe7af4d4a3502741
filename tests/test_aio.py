"""The asyncio API: each a-method answers as its synchronous twin, and what waits (a busy lock, another caller's
computation) waits off the loop, which the tests see as a ticker that keeps ticking; cancellation leaves nothing."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing as mp
import os
import signal
import sys

import pytest

from shmcache import ComputeTimeout, ReentrantCallError, SharedCache

from .workers import hold_lock

ctx = mp.get_context("fork")
pytestmark = pytest.mark.timeout(90)
TICKS = 100  # ticks of 1 ms the loop must make while a call waits: it could make none if the call blocked it


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


class Ticker:
    """A task that sleeps 1 ms at a time and counts its wake-ups."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            self.ticks += 1

    async def reach(self, n: int) -> None:
        start = self.ticks
        while self.ticks < start + n:
            await asyncio.sleep(0.001)

    def stop(self) -> None:
        self.task.cancel()


def test_aio_methods_answer_as_their_sync_twins(cache):
    async def main():
        assert await cache.aput("a", {"v": 1}) is True and await cache.aget("a") == {"v": 1}
        assert await cache.aget("missing", "d") == "d"
        assert await cache.aadd("a", 2) is False and await cache.aadd("b", 2) is True
        assert await cache.aget_many(["a", "b", "c"], 0) == [{"v": 1}, 2, 0]
        await cache.aput_many({"c": 3, "d": 4})
        assert await cache.aincr("n", 5) == 5 and await cache.adecr("n", 2) == 3
        assert await cache.apop("c") == 3 and await cache.apop("c", None) is None
        assert await cache.adelete("d") is True and await cache.adelete("d") is False
        assert await cache.acontains("a") and not await cache.acontains("d")
        k = cache.kind("k")
        assert await k.aput("x", 1) and await k.aget("x") == 1 and cache.get("x") is None
        assert await k.aget_or_compute("y", lambda: 7) == 7 and k.get("y") == 7

    run(main())
    s = cache.stats()
    assert s.entries == 5 and cache.verify().ok  # a, b, n and the kind's x and y


def test_aio_get_or_compute_takes_a_coroutine_function_and_counts_as_the_sync_one(cache):
    calls = []

    async def slow():
        calls.append(1)
        await asyncio.sleep(0.05)
        return "computed"

    async def main():
        # Two tasks of one loop ask at once: one computes, the other waits for it (every task runs on one thread).
        return await asyncio.gather(cache.aget_or_compute("k", slow), cache.aget_or_compute("k", slow))

    assert run(main()) == ["computed", "computed"] and calls == [1]
    s = cache.stats()
    assert (s.computations, s.waits, s.hits, s.misses) == (1, 1, 1, 1)
    assert run(cache.aget_or_compute("k", slow)) == "computed" and calls == [1]


def test_aio_a_computation_asking_for_its_own_key_is_refused(cache):
    async def main():
        async def inner():
            return await cache.aget_or_compute("k", inner)

        with pytest.raises(ReentrantCallError):
            await cache.aget_or_compute("k", inner)

    run(main())
    assert run(cache.aget_or_compute("k", lambda: 1)) == 1  # nothing left claimed


def test_aio_a_busy_lock_is_waited_for_off_the_loop(name):
    # lru: where a get takes the lock, and so waits for it
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, lock_timeout=30, policy="lru") as c:
        ready, release = ctx.Event(), ctx.Event()
        holder = ctx.Process(target=hold_lock, args=(name, ready, release), daemon=True)
        holder.start()
        try:
            assert ready.wait(30)
            os.kill(holder.pid, signal.SIGSTOP)  # the holder stopped with the lock held

            async def main():
                ticker = Ticker()
                put = asyncio.create_task(c.aput("k", "v"))
                get = asyncio.create_task(c.aget("k", "none"))
                await ticker.reach(TICKS)  # the loop runs on while both wait
                assert not put.done() and not get.done()
                os.kill(holder.pid, signal.SIGCONT)
                release.set()
                stored, got = await put, await get
                ticker.stop()
                return stored, got

            stored, got = run(main())
            assert stored is True and got in ("v", "none") and c.get("k") == "v"
        finally:
            os.kill(holder.pid, signal.SIGCONT)
            release.set()
            holder.join(30)
            if holder.is_alive():
                holder.kill()
        c.unlink()


def _compute_slowly(name: str, started, finish) -> None:
    with SharedCache(name, create=False) as c:
        def fn():
            started.set()
            finish.wait(60)
            return "theirs"

        c.get_or_compute("k", fn)


@contextlib.contextmanager
def computing_elsewhere(name: str):
    """Another process computing key "k" of cache ``name`` (its result "theirs") until the event yielded is set;
    reaped however the test ends."""
    started, finish = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_compute_slowly, args=(name, started, finish), daemon=True)
    other.start()
    try:
        assert started.wait(30)
        yield finish
    finally:
        finish.set()
        other.join(30)
        if other.is_alive():
            other.kill()
            other.join(10)


def _fd_count() -> int:
    gc.collect()  # what earlier tests left to the collector closes now, not between the two counts
    return len(os.listdir("/proc/self/fd"))


def test_aio_another_process_computation_is_waited_for_off_the_loop(name):
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as c:
        with computing_elsewhere(name) as finish:
            async def main():
                ticker = Ticker()
                waiting = asyncio.create_task(c.aget_or_compute("k", lambda: "ours"))
                await ticker.reach(TICKS)
                assert not waiting.done()
                finish.set()
                value = await waiting
                ticker.stop()
                return value

            assert run(main()) == "theirs"
            assert c.stats().waits == 1 and c.stats().computations == 1  # the other process's
        c.unlink()


def test_aio_cancelling_a_waiting_get_or_compute_leaves_nothing_behind(name):
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as c:
        with computing_elsewhere(name):
            before = _fd_count()

            async def main():
                ticker = Ticker()
                waiting = asyncio.create_task(c.aget_or_compute("k", lambda: "ours"))
                await ticker.reach(20)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                with pytest.raises(ComputeTimeout):  # and a timeout, the same way
                    await asyncio.wait_for(c.aget_or_compute("k", lambda: "ours", timeout=0.05), 30)
                ticker.stop()

            run(main())
            assert _fd_count() == before  # no claim's description left open
        c.delete("k")  # the other process stored "theirs" as it ended
        assert run(c.aget_or_compute("k", lambda: "ours")) == "ours"  # nothing of ours holds the key
        c.unlink()


def test_aio_amemoize_shares_results_with_memoize_under_one_name(cache):
    calls = []

    @cache.memoize(name="sq")
    def sq(x):
        calls.append(("sync", x))
        return x * x

    @cache.amemoize(name="sq")
    async def asq(x):
        calls.append(("async", x))
        await asyncio.sleep(0)
        return x * x

    assert run(asq(3)) == 9 and sq(3) == 9 and sq(4) == 16 and run(asq(4)) == 16
    assert calls == [("async", 3), ("sync", 4)]
    assert asq.cache_info().hits == 1 and asq.cache_info().misses == 1 and asq.cache_name == "sq"

    class Area:
        @cache.amemoize(name="area", ignore=("self",))  # one result for every instance, asked for
        async def area(self, side):
            calls.append(("area", side))
            return side * side

        @cache.amemoize(name="keyed")
        async def keyed(self, side):
            return side

    assert run(Area().area(5)) == run(Area().area(5)) == 25 and calls[-1] == ("area", 5)
    assert calls.count(("area", 5)) == 1
    with pytest.raises(TypeError, match=r"keyed by the Area it is called on.*ignore=\(\"self\",\)"):
        run(Area().keyed(5))  # keyed by its instance, as memoize's methods are


def test_aio_amemoize_a_method_is_keyed_by_its_instance_or_class(cache):
    class Area(tuple):
        @cache.amemoize
        async def area(self, side):
            return self[0] * side * side

        @classmethod
        @cache.amemoize
        async def name(cls, x):
            return (cls.__name__, x)

    class Sub(Area):
        pass

    assert run(Area((1,)).area(2)) == 4 and run(Area((3,)).area(2)) == 12
    assert run(Area.name(1)) == ("Area", 1) and run(Sub.name(1)) == ("Sub", 1)


# One record of the claims held, sync and async: any nesting of a key's computation in its own is refused at once
# (timeout=None: a wait would be for ever, which the test's timeout turns into a failure).


@pytest.mark.timeout(30)
def test_aio_get_or_compute_inside_aget_or_compute_of_its_key_is_refused(cache):
    async def main():
        async def fn():
            return cache.get_or_compute("k", lambda: "inner")

        with pytest.raises(ReentrantCallError, match="same key"):
            await cache.aget_or_compute("k", fn)
        assert await cache.aget_or_compute("other", lambda: cache.get_or_compute("k", lambda: 3)) == 3

    run(main())
    assert cache.get("k") == 3 and cache.get("other") == 3
    assert cache.get_or_compute("k2", lambda: 1) == 1  # nothing left claimed


@pytest.mark.timeout(30)
def test_aio_aget_or_compute_inside_get_or_compute_of_its_key_is_refused(cache):
    def fn():
        return asyncio.run(cache.aget_or_compute("k", lambda: "inner"))

    with pytest.raises(ReentrantCallError, match="same key"):
        cache.get_or_compute("k", fn)
    assert "k" not in cache
    assert cache.get_or_compute("k", lambda: asyncio.run(cache.aget_or_compute("k2", lambda: 4))) == 4
    assert run(cache.aget_or_compute("k", lambda: 5)) == 4  # stored, and nothing left claimed


@pytest.mark.timeout(30)
def test_aio_get_or_compute_in_a_worker_of_the_computation_of_its_key_is_refused(cache):
    """``asyncio.to_thread`` runs the call in a copy of the task's context, where its claims are."""

    async def main():
        async def fn():
            # (a bounded wait: on failure, a worker thread waiting for ever would keep the loop from closing)
            return await asyncio.to_thread(cache.get_or_compute, "k", lambda: "inner", timeout=5)

        with pytest.raises(ReentrantCallError):
            await cache.aget_or_compute("k", fn)

    run(main())
    assert run(cache.aget_or_compute("k", lambda: 6)) == 6


@pytest.mark.timeout(30)
def test_aio_a_lock_taken_again_by_its_task_is_refused(cache):
    async def main():
        async with cache.lock("k"):
            with pytest.raises(ReentrantCallError, match="already holds the lock"):
                async with cache.lock("k"):
                    pass
            with pytest.raises(ReentrantCallError):
                cache.lock("k").acquire()
        async with cache.lock("k"):  # free again
            pass

    run(main())


@pytest.mark.timeout(30)
def test_aio_a_claim_of_a_coroutine_closed_by_the_collector_goes_quietly(cache, monkeypatch):
    """A task left pending in a closed loop: its coroutine, closed by the garbage collector in whatever context is
    current then, releases its claim and prints nothing ("Token was created in a different Context" before)."""
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    started = []

    async def fn():
        started.append(True)
        await asyncio.Event().wait()  # for ever

    async def until_started():
        while not started:
            await asyncio.sleep(0.001)

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(cache.aget_or_compute("k", fn))
        loop.run_until_complete(asyncio.wait_for(until_started(), 10))
    finally:
        loop.close()
    del task
    gc.collect()
    assert [u.exc_value for u in unraisable] == []
    assert cache.get_or_compute("k", lambda: 7, timeout=5) == 7  # its claim was released
