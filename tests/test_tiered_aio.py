"""TieredCache's asyncio API against a real redis-server: each a-method answers as its synchronous twin (they are one
generator of steps, shmcache/tier/steps.py), over redis-py's asyncio client with no thread; what waits (a slow
Redis, another host's computation) waits off the loop, which a ticker sees; cancellation leaves no claim, no compute
lock and no descriptor behind."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import redis
import redis.asyncio

from shmcache import ComputeTimeout, RemoteError, TieredCache
from shmcache.codec import encode_key
from shmcache.tier.layout import C_REMOTE_ERRORS
from shmcache.tier.remote import Remote

from .test_aio import TICKS, Ticker, _fd_count, run
from .tiers import Host, eventually, two_hosts
from .workers import check_value, make_value

pytestmark = pytest.mark.timeout(90)


def _file_fds() -> list:
    """The descriptors of this process that are files (a claim's description is one), not sockets or pipes."""
    _fd_count()  # (collects what earlier tests left)
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return sorted(p for p in paths if p.startswith("/"))


async def release(*hosts) -> None:
    """Close the running loop's asyncio clients of ``hosts``' handles, which the fixtures close afterwards (a loop's
    client otherwise lives until the loop is collected, its connections open)."""
    for host in hosts:
        await host.tier._remote.aclose()


@pytest.fixture
def no_threads(monkeypatch):
    """Fail the test if a Redis call goes to a worker thread: they go through the asyncio client. (A call on the
    local cache may: its lock is busy whenever a listener thread applies an invalidation.)"""
    to_thread = asyncio.to_thread

    async def checked(fn, *args, **kwargs):
        if getattr(fn, "__func__", None) is Remote.call:
            raise AssertionError(f"a Redis call went to a worker thread: {args[0]!r}")
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", checked)


def test_tiered_aio_methods_answer_as_their_sync_twins(hosts, no_threads):
    a, b = hosts

    async def main():
        assert await a.tier.aput("k", make_value("k", 1, 64)) is True
        check_value("k", await b.tier.aget("k"))  # from Redis, copied on b
        check_value("k", await b.tier.aget("k"))  # b's copy
        assert await b.tier.aget("missing", "d") == "d"
        assert await a.tier.aadd("k", 2) is False and await a.tier.aadd("n", 1) is True
        assert await a.tier.areplace("absent", 1) is False and await a.tier.areplace("n", 5) is True
        value, version = await b.tier.aget_with_version("n")
        assert value == 5 and await b.tier.acas("n", 6, version) is True and await b.tier.acas("n", 7, version) is False
        assert await a.tier.aincr("n", 4) == 10 and await b.tier.adecr("n") == 9
        await a.tier.aput_many({"x": 1, "y": 2})
        assert await b.tier.aget_many(["x", "y", "z"], 0) == [1, 2, 0]
        assert await b.tier.acontains("x") and not await b.tier.acontains("z")
        assert await a.tier.atouch("x", 100) is True and 99 < a.tier.ttl("x") <= 100
        assert await a.tier.apop("x") == 1 and await a.tier.apop("x", None) is None
        with pytest.raises(KeyError):
            await a.tier.apop("x")
        assert await a.tier.adelete("y") is True and await a.tier.adelete("y") is False
        assert await a.tier.aclear() == 2  # "k" and "n"
        eventually(lambda: b.local_copy("k") is None, what="b applying the clear")
        assert await b.tier.aget("k") is None
        await release(a, b)

    run(main())
    s = b.tier.stats()
    assert s.local_hits >= 1 and s.remote_hits >= 2 and s.remote_errors == 0


def test_tiered_aio_a_copy_is_kept_and_invalidated_as_by_the_sync_api(hosts):
    a, b = hosts

    async def main():
        await a.tier.aput("k", "v1")
        assert await b.tier.aget("k") == "v1" and b.local_copy("k") == "v1"
        await a.tier.aput("k", "v2")
        eventually(lambda: b.local_copy("k") is None, what="b applying a's invalidation")
        assert await b.tier.aget("k") == "v2"
        await release(a, b)

    run(main())


def test_tiered_aio_one_host_computes_while_the_other_waits_off_the_loop(hosts, no_threads):
    """Two hosts ask for one key in one loop: a's coroutine computes it (for a while), b waits for a's result in
    Redis with asyncio.sleep, and the loop ticks on throughout."""
    a, b = hosts
    calls = []

    async def compute(who):
        calls.append(who)
        await asyncio.sleep(0.3)
        return make_value("k", 7, 32)

    async def main():
        ticker = Ticker()
        first = asyncio.create_task(a.tier.aget_or_compute("k", lambda: compute("a")))
        while not calls:
            await asyncio.sleep(0.001)
        second = asyncio.create_task(b.tier.aget_or_compute("k", lambda: compute("b")))
        await ticker.reach(TICKS)
        check_value("k", await first)
        check_value("k", await second)
        ticker.stop()
        await release(a, b)

    run(main())
    assert calls == ["a"]
    assert a.tier.stats().computations == 1 and b.tier.stats().lock_waits == 1
    assert b.local_copy("k") is not None


def test_tiered_aio_cancelling_leaves_no_claim_lock_or_descriptor(hosts):
    """A waiting aget_or_compute cancelled, and a computing one cancelled mid-computation: the host's claim is free
    (the next caller computes at once), the fleet's compute lock is released, no descriptor is left open."""
    a, b = hosts
    lock_key = a.tier._remote.lock_prefix + encode_key("k")
    client = redis.Redis.from_url(a.tier._url)
    started = asyncio.Event

    async def forever(flag):
        flag.set()
        await asyncio.sleep(3600)

    async def main():
        flag = started()
        computing = asyncio.create_task(a.tier.aget_or_compute("k", lambda: forever(flag)))
        await flag.wait()
        assert client.exists(lock_key) == 1  # a holds the fleet's lock
        waiting = asyncio.create_task(b.tier.aget_or_compute("k", lambda: "b's"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        computing.cancel()
        for task in (waiting, computing):
            with pytest.raises(asyncio.CancelledError):
                await task
        eventually(lambda: client.exists(lock_key) == 0, what="the cancelled computation's lock released")
        with pytest.raises(ComputeTimeout):  # a timeout ends a wait the same way (a third host computes)
            other = Host(a.tier._url, a.tier.namespace, timeout=2.0)
            try:
                flag2 = started()
                holder = asyncio.create_task(other.tier.aget_or_compute("t", lambda: forever(flag2)))
                await flag2.wait()
                try:
                    await b.tier.aget_or_compute("t", lambda: "b's", timeout=0.05)
                finally:
                    holder.cancel()
                    await asyncio.gather(holder, return_exceptions=True)
            finally:
                await other.tier.aclose()
                other.close()
        assert await a.tier.aget_or_compute("k", lambda: "a's") == "a's"  # nothing holds the key any more
        await release(a, b)

    before = _file_fds()
    run(main())
    client.close()
    assert _file_fds() == before  # no claim's description left open (connections are the pools' to keep)


def test_tiered_aio_amemoize_shares_results_with_memoize(hosts):
    a, b = hosts
    calls = []

    @a.tier.memoize(name="sq")
    def sq(x):
        calls.append(("sync", x))
        return x * x

    @b.tier.amemoize(name="sq")
    async def asq(x):
        calls.append(("async", x))
        return x * x

    async def main():
        assert await asq(3) == 9 and sq(3) == 9 and sq(4) == 16 and await asq(4) == 16
        await release(b)

    run(main())
    assert calls == [("async", 3), ("sync", 4)]


def test_tiered_aio_a_stopped_redis_is_waited_for_off_the_loop(redis_server, namespace):
    """Redis stopped (SIGSTOP): an aget miss waits for the timeout without blocking the loop, then answers the
    default (non-strict); with the circuit open, a put stays local and strict raises RemoteError."""
    host = Host(redis_server.url, namespace, timeout=2.0, retry_interval=30.0)
    try:
        eventually(host.listening, what="listener subscribed")  # (its first subscription drops the copies before)

        async def main():
            before = host.tier.stats().invalidations
            await host.tier.aput("k", "v")
            # The put's own invalidations come back (the tier's message, and Redis's tracking of the key, which the
            # listener applies by asking Redis the key's version): Redis stopped before the second is applied makes
            # that question fail, and a failed one drops the copy. Both applied first.
            await asyncio.to_thread(eventually, lambda: host.tier.stats().invalidations >= before + 2,
                                    what="the put's invalidations applied")
            os.kill(redis_server.pid, signal.SIGSTOP)
            try:
                ticker = Ticker()
                miss = asyncio.create_task(host.tier.aget("missing", "d"))
                await ticker.reach(TICKS // 5)  # the loop runs on while the call waits for Redis
                assert not miss.done()
                assert await miss == "d"
                ticker.stop()
                assert await host.tier.aget("k") == "v"  # a local hit needs no Redis
                assert await host.tier.aput("local", 1) is True and host.local_copy("local") == 1
                host.tier.strict = True
                with pytest.raises(RemoteError):
                    await host.tier.aget("missing")
                host.tier.strict = False
            finally:
                os.kill(redis_server.pid, signal.SIGCONT)
            await release(host)

        run(main())
        s = host.tier.stats()
        assert s.remote_timeouts == 1 and s.remote_skipped >= 2 and s.local_only_puts == 1
    finally:
        host.close()


def test_tiered_aio_with_a_client_passed_in(redis_url, namespace, no_threads):
    """A handle made with a redis-py client uses the asyncio client given as async_remote; without one, its a-methods
    make the Redis calls in a worker thread (and answer the same)."""
    from .tiers import Host as _Host

    host = _Host(redis_url, namespace)
    sync_client = redis.Redis.from_url(redis_url)
    try:
        async def main():
            aclient = redis.asyncio.Redis.from_url(redis_url)
            tier = TieredCache(host.local, sync_client, namespace=namespace, async_remote=aclient)
            try:
                await tier.aput("k", "v")
                assert await tier.aget("k") == "v" and sync_client.exists(tier._remote.key(encode_key("k")))
            finally:
                tier.close()
                await aclient.aclose()

        run(main())
        with pytest.raises(TypeError, match="async_remote"):
            TieredCache(host.local, sync_client, namespace=namespace, async_remote=sync_client)
        with pytest.raises(TypeError, match="async_remote"):
            TieredCache(host.local, redis_url, namespace=namespace, async_remote=redis.asyncio.Redis())
    finally:
        sync_client.close()
        host.close()


def test_tiered_aio_without_an_asyncio_client_calls_redis_in_a_thread(redis_url, namespace):
    host = Host(redis_url, namespace)
    sync_client = redis.Redis.from_url(redis_url)
    tier = TieredCache(host.local, sync_client, namespace=namespace)
    try:
        assert run(tier.aput("k", [1, 2])) is True and run(tier.aget("k")) == [1, 2]
        assert run(tier.adelete("k")) is True and tier.get("k") is None
    finally:
        tier.close()
        sync_client.close()
        host.close()


def test_tiered_aio_over_a_cluster(redis_cluster_url, namespace, no_threads):
    with two_hosts(redis_cluster_url, namespace, cluster=True) as (a, b):
        async def main():
            await a.tier.aput_many({f"k{i}": make_value(f"k{i}", i, 16) for i in range(30)})
            for i in range(30):
                check_value(f"k{i}", await b.tier.aget(f"k{i}"))
            assert await a.tier.aclear() == 30  # a scan of every primary
            eventually(lambda: b.local_copy("k3") is None, what="b applying the clear")
            assert await b.tier.aget("k3") is None
            await release(a, b)

        run(main())


@pytest.mark.skipif(not hasattr(asyncio.Task, "cancelling"), reason="Task.cancelling is Python 3.11's")
def test_tiered_aio_a_cancelled_redis_call_is_a_cancellation_not_an_outage(hosts):
    """A Redis client cut short by the task's cancellation may raise an error of its own (here, a connection
    closed under it): the call raises the cancellation, so that the caller never takes it for Redis down and goes on
    (computing alone) as if it had not been cancelled; nothing is counted as a Redis error."""
    remote = hosts[0].tier._remote

    async def cut_short(client, scripts):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise redis.ConnectionError("Connection closed by server.") from None

    async def main():
        errors = remote.rows.row[C_REMOTE_ERRORS]
        task = asyncio.create_task(remote.acall("get", cut_short))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert remote.rows.row[C_REMOTE_ERRORS] == errors

        async def fails(client, scripts):
            raise redis.ConnectionError("refused")

        with pytest.raises(RemoteError):  # (not cancelled: a failure, as before)
            await remote.acall("get", fails)
        assert remote.rows.row[C_REMOTE_ERRORS] == errors + 1
        await release(*hosts)

    run(main())
