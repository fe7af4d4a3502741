"""TieredCache with several processes on several simulated hosts (one local cache each, one Redis): get_or_compute
runs once for the whole fleet, a computing host killed mid-compute is taken over once its lock expires, and under
concurrent writes every value read is right and every host converges to what Redis holds."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
import uuid

import pytest

from shmcache import SharedCache, TieredCache
from shmcache.codec import KindKey

from .conftest import unique_name
from .tiers import eventually
from .workers import check_value, make_value, reap, start_and_collect

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ctx = mp.get_context("fork")
JOIN_S = 60


@pytest.fixture
def fleet(redis_url):
    """Two hosts' local caches (names) and a namespace; everything removed after."""
    names = [unique_name("hostA"), unique_name("hostB")]
    locals_ = [SharedCache(n, capacity_bytes=1 << 20, max_entries=1024, create=True) for n in names]
    namespace = f"f{uuid.uuid4().hex[:12]}"
    yield names, namespace
    with TieredCache(locals_[0], redis_url, namespace=namespace) as t:
        t.clear()
    for c, n in zip(locals_, names):
        c.close()
        SharedCache.unlink_name(n)
        try:
            os.unlink(f"/dev/shm/shmcache-tier.{n}.{namespace}")
        except FileNotFoundError:
            pass


def _open(url, local_name, namespace, **kwargs):
    return TieredCache(SharedCache(local_name, create=False), url, namespace=namespace, **kwargs)


def _compute_once(url, local_name, namespace, keys, barrier, queue):
    """get_or_compute every key, with a function that counts its runs in Redis and is slow enough to overlap."""
    tier = _open(url, local_name, namespace)
    client = tier._remote.client
    barrier.wait(JOIN_S)
    got = {}
    for key in keys:
        def compute(key=key):
            client.incr(f"runs:{namespace}:{key}")
            time.sleep(0.3)
            return make_value(key, 7, 100)
        value = tier.get_or_compute(key, compute)
        check_value(key, value)
        got[key] = value["seq"]
    queue.put((os.getpid(), got))
    tier.close()


def test_tiered_single_flight_across_hosts(redis_url, fleet):
    names, namespace = fleet
    keys = [f"key{i}" for i in range(3)]
    procs_per_host = 3
    barrier = ctx.Barrier(2 * procs_per_host)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_compute_once, args=(redis_url, names[i % 2], namespace, keys, barrier, queue))
             for i in range(2 * procs_per_host)]
    results = start_and_collect(procs, queue, JOIN_S)
    assert all(p.exitcode == 0 for p in procs)
    assert all(got == {k: 7 for k in keys} for _, got in results)
    with _open(redis_url, names[0], namespace) as a, _open(redis_url, names[1], namespace) as b:
        runs = [int(a._remote.client.get(f"runs:{namespace}:{k}") or 0) for k in keys]
        assert runs == [1, 1, 1], "each key computed once by the whole fleet"
        sa, sb = a.stats(), b.stats()
        assert sa.computations + sb.computations == 3
        # Each host asked Redis once per key: its other processes waited on the host's own single-flight (or came
        # late), and were served by the host's copy.
        assert sa.local_misses == sb.local_misses == len(keys)
        assert sa.local_hits + sb.local_hits == 2 * (procs_per_host - 1) * len(keys)
        a._remote.client.delete(*[f"runs:{namespace}:{k}" for k in keys])


def _stale_caller(url, local_name, namespace, key, go, until, out):
    """A process of the fleet's stale test: get_or_compute(key, fn, ttl=0.5, stale_ttl=10) until ``until``
    (monotonic), every value checked, and each call's duration kept; its function (0.3 s) records in Redis when it
    began and in which thread. Reports (calls, wrong values, the longest call in s)."""
    tier = _open(url, local_name, namespace)
    client = tier._remote.client

    def fn():
        n = client.incr(f"runs:{namespace}")
        client.rpush(f"starts:{namespace}", f"{time.time()} {threading.current_thread().name}")
        time.sleep(0.3)
        return make_value(key, n, 256)

    calls = wrong = 0
    longest = 0.0
    try:
        go.wait(JOIN_S)
        while time.monotonic() < until:
            t0 = time.monotonic()
            v = tier.get_or_compute(key, fn, ttl=0.5, stale_ttl=10)
            longest = max(longest, time.monotonic() - t0)
            calls += 1
            wrong += check_value(key, v) is not None
            time.sleep(0.01)
    finally:
        out.put((calls, wrong, longest))
        tier.close()


def test_tiered_stale_four_processes_on_two_hosts_never_wait_after_the_first(redis_url, fleet):
    """The fleet's stale_ttl: 2 processes on each of 2 hosts call get_or_compute(k, fn, ttl=0.5, stale_ttl=10)
    with a 0.3 s fn for 3 s. After the first computation no call waits for one: every later computation ran in a
    refresh thread, and no host counted a wait for another host's lock; and the computations are one per expiry
    for the whole fleet: each began at least 0.3 s (the computation) + 0.5 s (the fresh value's ttl) after the one
    before it (judged with a small allowance for the hosts' clocks, which are one machine's here)."""
    names, namespace = fleet
    key = "stale-key"
    with _open(redis_url, names[0], namespace) as first:
        first.get_or_compute(key, lambda: make_value(key, 0, 256), ttl=0.5, stale_ttl=10)
        client = first._remote.client
    go, out = ctx.Event(), ctx.Queue()
    until = time.monotonic() + 3.0
    procs = [ctx.Process(target=_stale_caller, args=(redis_url, names[i % 2], namespace, key, go, until, out))
             for i in range(4)]
    for p in procs:
        p.start()
    go.set()
    try:
        results = [out.get(timeout=JOIN_S) for _ in procs]
    finally:
        reap(procs, JOIN_S)
    assert all(p.exitcode == 0 for p in procs)
    assert sum(r[1] for r in results) == 0 and all(r[0] > 10 for r in results)
    starts = [line.decode().split() for line in client.lrange(f"starts:{namespace}", 0, -1)]
    assert starts, "no refresh ran in 3 s of a value that goes stale every 0.5 s"
    assert all(thread == "shmcache-refresh" for _, thread in starts), starts  # never in a caller's own call
    times = sorted(float(t) for t, _ in starts)
    assert all(b - a >= 0.75 for a, b in zip(times, times[1:])), times  # one per expiry, fleet-wide
    assert int(client.get(f"runs:{namespace}")) == len(starts)
    with _open(redis_url, names[0], namespace) as a, _open(redis_url, names[1], namespace) as b:
        sa, sb = a.stats(), b.stats()
        assert sa.lock_waits == sb.lock_waits == 0  # no call waited for another host's computation
        assert sa.refreshes + sb.refreshes == len(starts) and sa.refresh_failures + sb.refresh_failures == 0
        assert sa.stale_hits + sb.stale_hits >= len(starts)
    client.delete(f"runs:{namespace}", f"starts:{namespace}")


def test_tiered_stale_a_failed_refresh_serves_stale_and_is_counted(redis_url, fleet, caplog):
    """A refresh whose function raises is logged and counted; the stale value is served on, and the next stale call
    refreshes again."""
    names, namespace = fleet
    with _open(redis_url, names[0], namespace) as a:
        assert a.get_or_compute("k", lambda: "old", ttl=0.2, stale_ttl=30) == "old"
        time.sleep(0.25)  # (past the fresh window: a bound the value's ttl sets, not a measure of speed)
        assert a.get_or_compute("k", lambda: 1 / 0, ttl=0.2, stale_ttl=30) == "old"
        eventually(lambda: a.stats().refresh_failures == 1, what="the failed refresh counted")
        assert a.get_or_compute("k", lambda: "new", ttl=0.2, stale_ttl=30) == "old"
        eventually(lambda: a.get_or_compute("k", lambda: "newer", ttl=0.2, stale_ttl=30) != "old",
                   what="the next refresh stored")
        s = a.stats()
        assert s.refreshes >= 2 and s.stale_hits >= 2
    assert any("refresh" in r.getMessage() for r in caplog.records)


def test_tiered_stale_async_refreshes_in_a_task_of_the_loop(redis_url, fleet):
    """aget_or_compute's stale_ttl: a stale value is returned at once and refreshed by a task of the running loop,
    whose coroutine function runs there; the other host copies the refreshed value instead of computing it."""
    import asyncio

    names, namespace = fleet
    runs: list[str] = []

    async def compute(tag: str):
        runs.append(tag)
        await asyncio.sleep(0.05)
        return make_value("k", len(runs), 64)

    async def main():
        with _open(redis_url, names[0], namespace) as a, _open(redis_url, names[1], namespace) as b:
            first = await a.aget_or_compute("k", lambda: compute("first"), ttl=0.2, stale_ttl=30)
            await asyncio.sleep(0.25)  # (past the fresh window: a bound the value's ttl sets)
            assert await a.aget_or_compute("k", lambda: compute("refresh"), ttl=0.2, stale_ttl=30) == first
            for _ in range(400):  # (a bound on the wait for the task)
                if (await a.aget("k"))["seq"] == 2:  # (stored: Redis's value, and a's copy)
                    break
                await asyncio.sleep(0.005)
            fresh = await b.aget_or_compute("k", lambda: compute("b"), ttl=0.2, stale_ttl=30)
            check_value("k", fresh)
            assert fresh["seq"] == 2 and runs == ["first", "refresh"]
            assert b.stats().refreshes == 0 and a.stats().refreshes == 1

    asyncio.run(main())


def test_tiered_stale_aclose_cancels_the_refresh_in_flight_and_frees_its_locks(redis_url, fleet):
    """aclose() with an async refresh still computing cancels it and returns once it ended: no task of the handle
    is left on the loop, and the host's claim and the fleet's compute lock are free at once (a lease of 30 s that a
    cancelled refresh kept would hold the other host's refresh back for all of it)."""
    import asyncio

    names, namespace = fleet

    async def main():
        never = asyncio.Event()
        started = asyncio.Event()

        async def stuck():
            started.set()
            await never.wait()

        async def compute(seq: int):
            return make_value("k", seq, 64)

        a = _open(redis_url, names[0], namespace, lock_lease=30)
        first = await a.aget_or_compute("k", lambda: compute(1), ttl=0.2, stale_ttl=30)
        await asyncio.sleep(0.25)  # (past the fresh window: a bound the value's ttl sets)
        assert await a.aget_or_compute("k", stuck, ttl=0.2, stale_ttl=30) == first
        await asyncio.wait_for(started.wait(), JOIN_S)
        tasks = list(a._refreshes._tasks)
        assert len(tasks) == 1 and a._refreshes.running == 1
        await asyncio.wait_for(a.aclose(), JOIN_S)
        assert tasks[0].cancelled() and not a._refreshes._tasks and a._refreshes.running == 0
        with _open(redis_url, names[0], namespace) as same, _open(redis_url, names[1], namespace) as other:
            for tier, seq in ((same, 2), (other, 3)):
                got = None
                for _ in range(2000):  # (a bound on the wait for the refresh's task: 10 s)
                    got = await tier.aget_or_compute("k", lambda seq=seq: compute(seq), ttl=0.2, stale_ttl=30)
                    check_value("k", got)
                    if got["seq"] == seq:
                        break
                    await asyncio.sleep(0.005)
                assert got["seq"] == seq, got  # (refreshed: neither the claim nor the fleet's lock was held)
                await asyncio.sleep(0.25)  # (stale again, for the other host)
            await same.aclose()
            await other.aclose()

    asyncio.run(main())


def _compute_then_stop(url, local_name, namespace, computing) -> None:
    """Host A's process whose computation of "k" is stopped (the parent SIGSTOPs it once ``computing`` is set)."""
    tier = _open(url, local_name, namespace, lock_lease=1)

    def compute():
        computing.set()
        time.sleep(JOIN_S)
        return make_value("k", 1, 64)

    tier.get_or_compute("k", compute)


def _compute_on_host_b(url, local_name, namespace, queue) -> None:
    with _open(url, local_name, namespace, lock_lease=1) as tier:
        value = tier.get_or_compute("k", lambda: make_value("k", 2, 64), timeout=JOIN_S)
        queue.put(value)


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("other_host", [True, False], ids=["other-host", "one-host"])
def test_tiered_a_stopped_computing_process_stalls_its_host_for_a_lease_at_most(redis_url, fleet, api, other_host):
    """A process of host A stopped in the middle of a computation (SIGSTOP) holds its host's claim on the key for as
    long as it is stopped, but its fleet lock expires after the lease. Host A's other callers, which wait for the
    claim, look in Redis once a lease: they take the value host B computed meanwhile, or find the lock lapsed and
    go on to take it over themselves (with no other host, they compute). No caller waits for the stopped one, and
    the hosts end with one value."""
    import asyncio

    names, namespace = fleet
    computing, queue = ctx.Event(), ctx.Queue()
    stopped = ctx.Process(target=_compute_then_stop, args=(redis_url, names[0], namespace, computing), daemon=True)
    b = ctx.Process(target=_compute_on_host_b, args=(redis_url, names[1], namespace, queue), daemon=True)
    stopped.start()
    try:
        assert computing.wait(JOIN_S)
        os.kill(stopped.pid, signal.SIGSTOP)
        if other_host:
            b.start()
        with _open(redis_url, names[0], namespace, lock_lease=1) as a:
            fn = lambda: make_value("k", 3, 64)  # noqa: E731
            if api == "sync":
                got = a.get_or_compute("k", fn, timeout=JOIN_S)
            else:
                got = asyncio.run(a.aget_or_compute("k", fn, timeout=JOIN_S))
            check_value("k", got)
            if not other_host:
                # (the host's count: the stopped one's computation, then this one's once its lock lapsed)
                assert got["seq"] == 3 and a.stats().computations == 2
        if other_host:  # one of the two hosts took the lapsed lock over and computed; the other took its value
            from_b = queue.get(timeout=JOIN_S)
            check_value("k", from_b)
            assert from_b["seq"] == got["seq"] in (2, 3)
    finally:
        os.kill(stopped.pid, signal.SIGKILL)
        reap([stopped, b] if other_host else [stopped], JOIN_S)


def test_tiered_stale_ttl_is_checked(redis_url, fleet):
    names, namespace = fleet
    with _open(redis_url, names[0], namespace) as a:
        with pytest.raises(ValueError, match="stale_ttl needs a time to live"):
            a.get_or_compute("k", lambda: 1, stale_ttl=5)
        with pytest.raises(ValueError, match="stale_ttl"):
            a.get_or_compute("k", lambda: 1, ttl=1, stale_ttl=-1)
        assert "k" not in a


def _compute_forever(url, local_name, namespace, key, started):
    tier = _open(url, local_name, namespace, lock_lease=0.5)

    def never():
        started.set()
        time.sleep(3600)

    tier.get_or_compute(key, never)


def test_tiered_dead_computing_host_is_taken_over(redis_url, fleet):
    names, namespace = fleet
    started = ctx.Event()
    child = ctx.Process(target=_compute_forever, args=(redis_url, names[0], namespace, "k", started))
    child.start()
    try:
        assert started.wait(JOIN_S), "the computing host never started"
        with _open(redis_url, names[1], namespace, lock_lease=0.5) as b:
            # The child's host holds the lock and renews it: b waits; killing the child stops the renewals, and
            # b takes over once the lease runs out.
            killer = ctx.Process(target=_kill_later, args=(child.pid, 0.5))
            killer.start()
            value = b.get_or_compute("k", lambda: make_value("k", 2, 10), timeout=30)
            reap([killer])
            check_value("k", value)
            s = b.stats()
            assert (s.computations, s.lock_waits, s.lock_takeovers) == (1, 1, 1)
    finally:
        reap([child], timeout=5)
    assert child.exitcode == -signal.SIGKILL


def _kill_later(pid, seconds):
    time.sleep(seconds)
    os.kill(pid, signal.SIGKILL)


def test_tiered_failed_computation_hands_over(redis_url, fleet):
    """A computing host whose function raises releases the lock at once: the other host computes."""
    names, namespace = fleet
    with _open(redis_url, names[0], namespace) as a, _open(redis_url, names[1], namespace) as b:
        with pytest.raises(ZeroDivisionError):
            a.get_or_compute("k", lambda: 1 / 0)
        assert b.get_or_compute("k", lambda: "b's") == "b's"
        assert a.get("k") == "b's"


def _churn(url, local_name, namespace, worker, ops, keys, queue):
    """Random writes and reads of self-checking values; every value read is checked."""
    tier = _open(url, local_name, namespace)
    rng = random.Random(worker)
    wrong = reads = 0
    for i in range(ops):
        key = f"k{rng.randrange(keys)}"
        r = rng.random()
        try:
            if r < 0.5:
                value = tier.get(key)
                reads += 1
                if value is not None:
                    check_value(key, value)
            elif r < 0.8:
                tier.put(key, make_value(key, worker * ops + i, rng.randrange(8, 200)))
            elif r < 0.9:
                tier.delete(key)
            else:
                check_value(key, tier.get_or_compute(key, lambda: make_value(key, worker * ops + i, 16)))
        except AssertionError:
            wrong += 1
    queue.put((worker, wrong, reads))
    tier.close()


def test_tiered_concurrent_writers_converge(redis_url, fleet):
    names, namespace = fleet
    workers, ops, keys = 4, 400, 20
    queue = ctx.Queue()
    procs = [ctx.Process(target=_churn, args=(redis_url, names[w % 2], namespace, w, ops, keys, queue))
             for w in range(workers)]
    results = start_and_collect(procs, queue, JOIN_S)
    assert all(p.exitcode == 0 for p in procs)
    assert sum(r[1] for r in results) == 0, "a wrong or torn value was read"
    # Once the invalidations in flight are applied, no host keeps a copy that differs from Redis.
    with _open(redis_url, names[0], namespace) as a, _open(redis_url, names[1], namespace) as b:
        truth = {f"k{i}": a.get_with_version(f"k{i}")[0] for i in range(keys)}

        def converged():
            for host in (a, b):
                for key, value in truth.items():
                    copy = host.local.get(KindKey(host._n, key), None)
                    if copy is not None and not _same(copy, value):  # values hold arrays: no ==
                        return False
            return True

        eventually(converged, what="every host's copies agree with Redis")


def _same(x, y) -> bool:
    try:
        check_value(x["key"], x)
        return x["seq"] == y["seq"]
    except (TypeError, KeyError, AssertionError):
        return False


def _forked_child_counts(tier, queue):
    for _ in range(5):
        assert tier.get("k") == 1
    tier.put("from child", 2)
    queue.put("done")


def test_tiered_handle_survives_fork(redis_url, fleet):
    names, namespace = fleet
    with _open(redis_url, names[0], namespace) as a:
        # Once subscribed: a (re)subscription drops the copies made before it (invalidations may have been missed).
        eventually(lambda: a.stats().listener_starts == 1, what="listener subscribed")
        a.put("k", 1)
        assert a.get("k") == 1
        before = a.stats().local_hits
        queue = ctx.Queue()
        child = ctx.Process(target=_forked_child_counts, args=(a, queue))
        child.start()
        assert queue.get(timeout=JOIN_S) == "done"
        reap([child])
        assert child.exitcode == 0
        assert a.get("from child") == 2
        # The child counted in a row of its own: its 5 hits add to the parent's, none lost or doubled.
        assert a.stats().local_hits == before + 5 + 1


def _lead_then_wait(url, local_name, namespace, ready):
    tier = _open(url, local_name, namespace)
    deadline = time.monotonic() + JOIN_S
    while not (tier._listener_box[0].leading and tier.stats().listener_starts >= 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    ready.set()
    time.sleep(3600)


def test_tiered_one_listener_per_host_and_takeover(redis_url, fleet):
    """The host's listener is one process; when it is killed, another process of the host takes over, and the
    other hosts' invalidations reach the host again."""
    names, namespace = fleet
    ready = ctx.Event()
    leader = ctx.Process(target=_lead_then_wait, args=(redis_url, names[0], namespace, ready))
    leader.start()
    try:
        assert ready.wait(JOIN_S), "the child never became the host's listener"
        with _open(redis_url, names[0], namespace) as a, _open(redis_url, names[1], namespace) as b:
            time.sleep(0.3)  # a few election rounds: a must stay a standby while the child leads
            assert not a._listener_box[0].leading and a.stats().listening
            b.put("k", 1)
            assert a.get("k") == 1
            b.put("k", 2)
            eventually(lambda: a.local.get(KindKey(a._n, "k")) is None, what="invalidation via the child")
            starts = a.stats().listener_starts
            leader.kill()
            eventually(lambda: a._listener_box[0].leading and a.stats().listener_starts == starts + 1, what="takeover")
            assert a.get("k") == 2
            b.put("k", 3)
            eventually(lambda: a.local.get(KindKey(a._n, "k")) is None, what="invalidation after the takeover")
            assert a.get("k") == 3
    finally:
        leader.kill()
        reap([leader], timeout=5)


def _spawned_reader(tier, queue):
    queue.put((tier.get("k"), tier.stats().local_hits))
    tier.close()


def test_tiered_pickles_for_spawned_workers(redis_url, fleet):
    names, namespace = fleet
    with _open(redis_url, names[0], namespace) as a:
        eventually(lambda: a.stats().listener_starts == 1, what="listener subscribed")
        a.put("k", make_value("k", 1, 10))
        queue = mp.get_context("spawn").Queue()
        child = mp.get_context("spawn").Process(target=_spawned_reader, args=(a, queue))
        child.start()
        value, hits = queue.get(timeout=JOIN_S)
        reap([child])
        check_value("k", value)
        assert hits >= 1  # served from the host's copy
