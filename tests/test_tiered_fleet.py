"""TieredCache with several processes on several simulated hosts (one local cache each, one Redis): get_or_compute
runs once for the whole fleet, a computing host killed mid-compute is taken over once its lock expires, and under
concurrent writes every value read is right and every host converges to what Redis holds."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
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
