"""get_or_compute's ``stale_ttl``: a stale value is served at once while one caller on the host refreshes it in the
background; a failed refresh serves on until the window ends; a refresher that dies hands the refresh on. Values
carry their key and a checksum, and every one a call returns is checked."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from shmcache import SharedCache, prometheus_text

from .workers import check_value, make_value, reap

JOIN_S = 60
ctx = mp.get_context("fork")


def _stats(c: SharedCache) -> tuple[int, int, int]:
    s = c.stats()
    return s.stale_hits, s.refreshes, s.refresh_failures


def _until(cond, seconds: float = 10.0) -> bool:
    """Poll ``cond()`` until it is true, for at most ``seconds`` (a bound on a wait, never a measure of speed)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def _no_refresh_thread() -> bool:
    """No refresh thread of this process is alive (an idle one of an earlier test would take a test's job)."""
    from shmcache import refresh

    return refresh.workers().busy == 0 and not any(t.name == "shmcache-refresh" for t in threading.enumerate())


def _caller(name, key, go, until, ttl, stale, count, runs, out) -> None:
    """A worker of the four-process test: calls get_or_compute until ``until`` (monotonic) and checks every value;
    reports (calls, wrong values). Its function counts itself in ``count`` and records in ``runs`` when it began
    and in which thread."""
    def fn():
        with count.get_lock():
            count.value += 1
            n = count.value
        runs.put((time.monotonic(), threading.current_thread().name, os.getpid()))
        time.sleep(0.3)
        return make_value(key, n, 256)

    calls = wrong = 0
    try:
        with SharedCache(name) as c:
            go.wait(JOIN_S)
            while time.monotonic() < until:
                v = c.get_or_compute(key, fn, ttl=ttl, stale_ttl=stale)
                calls += 1
                wrong += check_value(key, v) is not None
                time.sleep(0.01)
    finally:
        out.put((calls, wrong))


@pytest.mark.timeout(120)
def test_stale_four_processes_never_wait_after_the_first_computation(name):
    """4 processes call get_or_compute(k, fn, ttl=0.5, stale_ttl=10) with a 0.3 s fn for 3 s: after the first
    computation no call waits for one (every later computation ran in a refresh thread, and ``waits`` does not move),
    and the refreshes are one per expiry: each starts only once the value it replaces has gone stale, that is, at
    least 0.3 s (the computation) + 0.5 s (the fresh value's ttl) after the one before began."""
    key = "stale-key"
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        count, runs = ctx.Value("i", 0), ctx.Queue()  # the computations in the children, and a record of each
        c.get_or_compute(key, lambda: make_value(key, 0, 256), ttl=0.5, stale_ttl=10)  # the first computation
        waits, computations = c.stats().waits, c.stats().computations
        go, out = ctx.Event(), ctx.Queue()
        until = time.monotonic() + 3.0
        procs = [ctx.Process(target=_caller, args=(name, key, go, until, 0.5, 10, count, runs, out)) for _ in range(4)]
        for p in procs:
            p.start()
        go.set()
        try:
            results = [out.get(timeout=JOIN_S) for _ in procs]
        finally:
            reap(procs, JOIN_S)
        assert all(p.exitcode == 0 for p in procs)
        assert sum(r[1] for r in results) == 0 and all(r[0] > 10 for r in results)
        records = [runs.get(timeout=JOIN_S) for _ in range(count.value)]
        assert records, "no refresh ran in 3 s of a value that goes stale every 0.5 s"
        assert all(thread == "shmcache-refresh" for _, thread, _ in records)  # never in a caller's own call
        starts = sorted(t for t, _, _ in records)
        assert all(b - a >= 0.75 for a, b in zip(starts, starts[1:])), starts  # one per expiry
        s = c.stats()
        assert s.waits == waits  # no call waited for a computation
        assert s.refreshes == len(records) and s.refresh_failures == 0
        assert s.computations == computations + len(records) and s.stale_hits >= len(records)
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_a_failed_refresh_serves_stale_until_the_window_ends(name, caplog):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        good = make_value("k", 1, 128)
        assert check_value("k", c.get_or_compute("k", lambda: good, ttl=0.2, stale_ttl=0.8)) is None
        time.sleep(0.25)  # stale now

        def failing():
            raise RuntimeError("the backend is down")

        with caplog.at_level(logging.WARNING, logger="shmcache"):
            for _ in range(5):
                got = c.get_or_compute("k", failing, ttl=0.2, stale_ttl=0.8)
                assert check_value("k", got) is None and got == good
                assert _until(lambda: c._refreshes.running == 0)
        assert _stats(c)[2] >= 1 and "the stale value is served" in caplog.text
        assert _until(lambda: "k" not in c, 2.0)  # the window ended: gone
        fresh = make_value("k", 2, 128)
        assert c.get_or_compute("k", lambda: fresh, ttl=0.2, stale_ttl=0.8) == fresh  # computed in the call
        c.unlink()


def _refresher(name, started, out) -> None:
    """Finds the value stale, and refreshes it in a function that never returns (the parent SIGKILLs it)."""
    with SharedCache(name) as c:
        def stuck():
            started.set()
            time.sleep(600)

        out.put(c.get_or_compute("k", stuck, ttl=0.2, stale_ttl=30))
        time.sleep(600)


@pytest.mark.timeout(60)
def test_stale_a_refresher_killed_mid_computation_hands_the_refresh_on(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        old = make_value("k", 1, 128)
        c.get_or_compute("k", lambda: old, ttl=0.2, stale_ttl=30)
        time.sleep(0.25)
        started, out = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_refresher, args=(name, started, out))
        p.start()
        try:
            assert out.get(timeout=JOIN_S) == old  # served stale at once
            assert started.wait(JOIN_S)  # its refresh holds the key's claim, computing
            assert c.get_or_compute("k", lambda: make_value("k", 9, 128), ttl=0.2, stale_ttl=30) == old
            assert _until(lambda: c._refreshes.running == 0)
            assert c.get("k") == old  # the claim is the child's: this process left the refresh to it
            os.kill(p.pid, signal.SIGKILL)
        finally:
            reap([p], JOIN_S)
        new = make_value("k", 2, 128)
        assert c.get_or_compute("k", lambda: new, ttl=0.2, stale_ttl=30) == old  # stale: refreshed behind it
        assert _until(lambda: c.get("k") == new)
        assert check_value("k", c.get("k")) is None and c.stats().refresh_failures == 0
        c.unlink()


def test_stale_ttl_arguments_are_checked(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        with pytest.raises(ValueError, match="stale_ttl needs a time to live"):
            c.get_or_compute("k", lambda: 1, stale_ttl=1)
        for bad in (-1, float("nan"), float("inf"), "1"):
            with pytest.raises(ValueError, match="stale_ttl"):
                c.get_or_compute("k", lambda: 1, ttl=1, stale_ttl=bad)
        assert c.get_or_compute("k", lambda: 1, ttl=1, stale_ttl=0) == 1  # 0: no window
        assert c.ttl("k") <= 1
        assert c.get_or_compute("j", lambda: 2, ttl=1, stale_ttl=5) == 2
        assert 5 < c.ttl("j") <= 6  # stored to live ttl + stale_ttl
        c.unlink()
    with SharedCache(name, capacity_bytes=1 << 20, default_ttl=2, create=True) as c:
        assert c.get_or_compute("k", lambda: 1, stale_ttl=3) == 1 and 4 < c.ttl("k") <= 5
        c.unlink()


def test_stale_a_value_put_with_a_short_ttl_is_refreshed_once(name):
    """Freshness is judged by the time left: a value stored by put with a ttl below stale_ttl is stale at once, and
    the first call refreshes it to live ttl + stale_ttl."""
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.put("k", "put", ttl=1)
        assert c.get_or_compute("k", lambda: "computed", ttl=10, stale_ttl=5) == "put"
        assert _until(lambda: c.get("k") == "computed") and c.ttl("k") > 14
        assert _stats(c) == (1, 1, 0)
        assert c.get_or_compute("k", lambda: "again", ttl=10, stale_ttl=5) == "computed"
        assert _stats(c) == (1, 1, 0)  # fresh: no stale hit, no refresh
        c.unlink()


def test_stale_counters_are_in_stats_prometheus_and_reset_by_clear(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.get_or_compute("k", lambda: 1, ttl=0.05, stale_ttl=5)
        time.sleep(0.06)
        c.get_or_compute("k", lambda: 2, ttl=0.05, stale_ttl=5)
        assert _until(lambda: _stats(c) == (1, 1, 0))
        text = prometheus_text({name: c.stats()})
        assert "shmcache_stale_hits_total" in text and "shmcache_refreshes_total" in text
        c.clear()
        assert _stats(c) == (0, 0, 0)
        c.unlink()


def test_stale_kind_view_and_memoize_serve_stale(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        k = c.kind("pages")
        k.get_or_compute("p", lambda: "v1", ttl=0.05, stale_ttl=5)
        time.sleep(0.06)
        assert k.get_or_compute("p", lambda: "v2", ttl=0.05, stale_ttl=5) == "v1"
        assert _until(lambda: k.get("p") == "v2")
        n = []

        @c.memoize(ttl=0.05, stale_ttl=5)
        def square(x):
            n.append(x)
            return x * x * len(n)

        assert square(3) == 9
        time.sleep(0.06)
        assert square(3) == 9  # stale, refreshed behind
        assert _until(lambda: square(3) == 18) and len(n) == 2
        assert square.cache_parameters()["stale_ttl"] == 5
        c.unlink()


def test_stale_async_refreshes_in_a_task_of_the_loop(name):
    async def main(c):
        calls = []

        async def fetch():
            calls.append(1)
            await asyncio.sleep(0.01)
            return len(calls)

        assert await c.aget_or_compute("k", fetch, ttl=0.05, stale_ttl=5) == 1
        await asyncio.sleep(0.06)
        assert await c.aget_or_compute("k", fetch, ttl=0.05, stale_ttl=5) == 1  # stale, at once
        for _ in range(500):
            if c.get("k") == 2:
                break
            await asyncio.sleep(0.01)
        assert c.get("k") == 2 and len(calls) == 2 and _stats(c) == (1, 1, 0)

        @c.amemoize(ttl=0.05, stale_ttl=5)
        async def double(x):
            calls.append(x)
            return 2 * x + len(calls)

        first = await double(1)
        await asyncio.sleep(0.06)
        assert await double(1) == first
        for _ in range(500):
            if await double(1) != first:
                break
            await asyncio.sleep(0.01)
        assert await double(1) == 2 + len(calls)

    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        asyncio.run(main(c))
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_a_forked_child_forgets_the_parents_refreshes_and_never_holds_its_claim(name):
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        old, new = make_value("k", 1, 128), make_value("k", 2, 128)
        c.get_or_compute("k", lambda: old, ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        release, began = threading.Event(), threading.Event()

        def slow():
            began.set()
            release.wait(JOIN_S)
            return new

        assert c.get_or_compute("k", slow, ttl=0.05, stale_ttl=30) == old
        assert c._refreshes.running == 1 and began.wait(JOIN_S)  # (the refresh holds the key's claim)
        pid = os.fork()
        if pid == 0:  # the child: nothing under way here; its refresh finds the parent's claim and leaves it be
            code = 1
            try:
                if c._refreshes.running == 0 and c.get_or_compute("k", lambda: old, ttl=0.05, stale_ttl=30) == old:
                    code = 0 if _until(lambda: c._refreshes.running == 0) and c.get("k") == old else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        release.set()
        assert _until(lambda: c.get("k") == new) and _until(lambda: c._refreshes.running == 0)
        assert c.stats().refreshes == 1
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_refreshes_of_several_keys_run_side_by_side(name):
    """Keys that go stale together are refreshed by several of the process's refresh threads at once (at most
    refresh.WORKERS_MAX), each once, and the threads end once idle. The refreshes wait on a gate opened after the
    last stale call, so that the first thread is busy while the others are queued, whatever the machine's load."""
    from shmcache import refresh

    keys = [f"k{i}" for i in range(6)]
    threads: set[str] = set()
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        for k in keys:
            c.get_or_compute(k, lambda k=k: make_value(k, 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)

        gate = threading.Event()

        def slow(k):
            threads.add(threading.current_thread().name + str(threading.get_ident()))
            gate.wait(JOIN_S)
            return make_value(k, 2, 64)

        for k in keys:
            check_value(k, c.get_or_compute(k, lambda k=k: slow(k), ttl=0.05, stale_ttl=30))
        assert _until(lambda: len(threads) >= 2)  # (the later stale calls found the first thread busy)
        gate.set()
        assert _until(lambda: c._refreshes.running == 0)
        assert 2 <= len(threads) <= refresh.WORKERS_MAX and c.stats().refreshes == len(keys)
        for k in keys:
            v = c.get(k)
            check_value(k, v)
            assert v["seq"] == 2
        assert _until(_no_refresh_thread, refresh.IDLE_S + 10)
        c.unlink()


def _first_refresh_start_interrupted(monkeypatch, after: bool) -> list:
    """Make the next refresh thread's start (``refresh._start_thread``, the one call the caller's thread makes for
    it) raise KeyboardInterrupt once, as a signal handler's exception would: before it starts anything (``after``
    False) or once it has (True); with no idle refresh thread of an earlier test left to take the job, and a lost
    start given up after 0.05 s. The list the interrupted start is put in."""
    from shmcache import refresh

    monkeypatch.setattr(refresh, "START_S", 0.05)
    assert _until(_no_refresh_thread, refresh.IDLE_S + 10)
    real = refresh._start_thread
    cut: list = []

    def start(fn, args):
        if not cut:
            cut.append(fn)
            if after:
                real(fn, args)
            raise KeyboardInterrupt
        return real(fn, args)

    monkeypatch.setattr(refresh, "_start_thread", start)
    return cut


@pytest.mark.timeout(60)
def test_stale_a_refresh_whose_thread_start_was_cut_short_runs_later(name, monkeypatch):
    """An exception from a signal handler just before the refresh thread's start (simulated) reaches the caller,
    as it would from any line; the job stays queued, and a later stale call of the key starts a thread for it,
    once the lost start is old enough."""
    cut = _first_refresh_start_interrupted(monkeypatch, after=False)
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.get_or_compute("k", lambda: make_value("k", 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        with pytest.raises(KeyboardInterrupt):
            c.get_or_compute("k", lambda: make_value("k", 2, 64), ttl=0.05, stale_ttl=30)
        assert cut and c._refreshes.running == 1 and c.get("k")["seq"] == 1
        time.sleep(0.06)
        old = c.get_or_compute("k", lambda: make_value("k", 3, 64), ttl=0.05, stale_ttl=30)  # the key's job: queued
        check_value("k", old)
        assert old["seq"] == 1 and _until(lambda: c._refreshes.running == 0)
        v = c.get("k")
        check_value("k", v)
        assert v["seq"] == 2 and c.stats().refreshes == 1
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_an_interrupt_right_after_the_start_leaves_the_refresh_running(name, monkeypatch):
    """An exception from a signal handler right after the refresh thread's start (simulated) reaches the caller;
    the thread was started, from a thread where no handler runs, and runs the job with no further call. (Started
    from the caller's thread, threading's start could be cut short inside, leaving its own registry lock held and
    every later thread of the process stuck in its bootstrap: CPython 3.14.)"""
    cut = _first_refresh_start_interrupted(monkeypatch, after=True)
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.get_or_compute("k", lambda: make_value("k", 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        with pytest.raises(KeyboardInterrupt):
            c.get_or_compute("k", lambda: make_value("k", 2, 64), ttl=0.05, stale_ttl=30)
        assert cut and _until(lambda: c._refreshes.running == 0)
        v = c.get("k")
        check_value("k", v)
        assert v["seq"] == 2 and c.stats().refreshes == 1
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_a_thread_that_cannot_be_started_is_started_by_the_next_call(name, monkeypatch):
    """No thread to be had when the refresh thread is started (threading's start raises RuntimeError, in the
    thread that starts it): the caller is not disturbed, the job stays queued, and the next stale call starts a
    thread for it at once (the failed start released its hold)."""
    from shmcache import refresh

    assert _until(_no_refresh_thread, refresh.IDLE_S + 10)
    real_start = threading.Thread.start
    cut: list = []

    def start(self):
        if self.name == "shmcache-refresh" and not cut:
            cut.append(self)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.get_or_compute("k", lambda: make_value("k", 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        check_value("k", c.get_or_compute("k", lambda: make_value("k", 2, 64), ttl=0.05, stale_ttl=30))
        assert _until(lambda: bool(cut) and not refresh.workers()._start.locked())
        assert c._refreshes.running == 1 and c.get("k")["seq"] == 1
        check_value("k", c.get_or_compute("k", lambda: make_value("k", 3, 64), ttl=0.05, stale_ttl=30))
        assert _until(lambda: c._refreshes.running == 0) and c.get("k")["seq"] == 2
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_an_interrupt_between_the_record_and_the_queue_holds_the_key_back_for_a_while(name, monkeypatch):
    """An exception from a signal handler that lands after a refresh is recorded and before its job is queued
    (simulated: the queueing raises KeyboardInterrupt) reaches the caller and leaves a record with no job. It holds
    this process's refreshes of the key back for refresh.PENDING_S only (here made short): then a stale call queues
    the refresh again, and it runs. Another key is never held back."""
    from shmcache import refresh

    monkeypatch.setattr(refresh, "PENDING_S", 0.5)
    put = refresh.workers().put
    cut = []

    def first_put_interrupted(job):
        if not cut:
            cut.append(job)
            raise KeyboardInterrupt
        put(job)

    monkeypatch.setattr(refresh.workers(), "put", first_put_interrupted)
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        for key in ("k", "other"):
            c.get_or_compute(key, lambda key=key: make_value(key, 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        with pytest.raises(KeyboardInterrupt):
            c.get_or_compute("k", lambda: make_value("k", 2, 64), ttl=0.05, stale_ttl=30)
        assert cut and c._refreshes.running == 1
        assert c.get_or_compute("k", lambda: make_value("k", 3, 64), ttl=0.05, stale_ttl=30)["seq"] == 1
        check_value("other", c.get_or_compute("other", lambda: make_value("other", 2, 64), ttl=0.05, stale_ttl=30))
        assert _until(lambda: c.get("other")["seq"] == 2) and c.get("k")["seq"] == 1  # (k: held back)
        time.sleep(0.5)  # (the record's hold, made short: a bound, not a measure of speed)
        assert c._refreshes.running == 0
        check_value("k", c.get_or_compute("k", lambda: make_value("k", 4, 64), ttl=0.05, stale_ttl=30))
        assert _until(lambda: c.get("k")["seq"] == 4)
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_a_caller_never_waits_for_the_refresh_threads_lock(name):
    """The thread that calls (the one signal handlers run in) never blocks on the refresh threads' lock: with it
    held, as an interrupt right after a ``with``'s acquisition would leave it (CPython 3.14 delivers one there),
    a stale call still returns the stale value at once, and the refresh runs once the lock is free."""
    from shmcache import refresh

    assert _until(_no_refresh_thread, refresh.IDLE_S + 10)  # (no idle thread of an earlier test to take the job)
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.get_or_compute("k", lambda: make_value("k", 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        with refresh.workers()._lock:  # (this thread's: a call that took it would never return)
            old = c.get_or_compute("k", lambda: make_value("k", 2, 64), ttl=0.05, stale_ttl=30)
            check_value("k", old)
            assert old["seq"] == 1 and c._refreshes.running == 1
        assert _until(lambda: c._refreshes.running == 0)
        v = c.get("k")
        check_value("k", v)
        assert v["seq"] == 2 and c.stats().refreshes == 1
        c.unlink()


@pytest.mark.timeout(60)
def test_stale_a_start_cut_short_before_its_record_is_taken_over(name):
    """An interrupt between the start lock's acquisition and the start's record leaves the lock held with no
    start recorded: the next call that needs a thread takes the start over and the refresh runs."""
    from shmcache import refresh

    assert _until(_no_refresh_thread, refresh.IDLE_S + 10)
    w = refresh.workers()
    assert w._start.acquire(blocking=False)  # (the cut-short start: the lock held, nothing recorded)
    w._starting = 0.0
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        c.get_or_compute("k", lambda: make_value("k", 1, 64), ttl=0.05, stale_ttl=30)
        time.sleep(0.06)
        check_value("k", c.get_or_compute("k", lambda: make_value("k", 2, 64), ttl=0.05, stale_ttl=30))
        assert _until(lambda: c._refreshes.running == 0) and c.get("k")["seq"] == 2
        assert _until(lambda: not w._start.locked())  # (released by the thread that began)
        c.unlink()


def test_stale_a_refresh_task_cancelled_before_it_ran_leaves_no_record():
    """A refresh started as a task and cancelled before its first step (an ``aclose()`` right after the stale call)
    never runs its job's ``finally``: the task's end clears its record all the same, so the key is not held back
    from the next refresh for ``refresh.PENDING_S``."""
    from shmcache import refresh

    ran: list[int] = []

    async def job() -> None:
        ran.append(1)

    async def main() -> None:
        r = refresh.Refreshes()
        assert r.start_task(7, job) and r.running == 1
        await r.acancel()  # (before the loop ran the task's first step)
        assert r.running == 0 and not ran
        assert r.start_task(7, job)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ran == [1] and r.running == 0

    asyncio.run(main())
