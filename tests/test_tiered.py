"""TieredCache against a real redis-server on loopback: two "hosts" (two local caches sharing one Redis) see each
other's writes, invalidations reach the other host's copies, staleness is bounded by max_age when an invalidation
is lost, stale copies are never stored, and a Redis that stops or restarts is contained."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import shmcache
from shmcache import RemoteError, SharedCache, TieredCache
from shmcache.codec import KindKey, encode_key
from shmcache.tier import host_stats

from .conftest import unique_name
from .tiers import Host, eventually, two_hosts, mark as _mark
from .workers import check_value, make_value

pytestmark = pytest.mark.timeout(60)


def test_tiered_the_tier_is_imported_on_first_use():
    """``import shmcache`` leaves the Redis tier out (a fifth of the import's time); naming it imports it."""
    script = ("import sys, shmcache\n"
              "assert 'shmcache.tier' not in sys.modules, sorted(m for m in sys.modules if 'tier' in m)\n"
              "from shmcache import TieredCache, TierStats\n"
              "assert TieredCache.__module__ == 'shmcache.tier.tiered' and 'TierStats' in dir(shmcache)\n"
              "assert shmcache.TierStats is TierStats\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        shmcache.nope  # noqa: B018


def test_tiered_hosts_see_each_others_puts(hosts):
    a, b = hosts
    for i in range(20):
        a.tier.put(f"k{i}", make_value(f"k{i}", i, 64))
    for i in range(20):
        check_value(f"k{i}", b.tier.get(f"k{i}"))
        assert b.local_copy(f"k{i}") is not None  # copied into b's local cache on the way
    s = b.tier.stats()
    assert (s.remote_hits, s.local_misses) == (20, 20)
    check_value("k3", b.tier.get("k3"))
    assert b.tier.stats().local_hits == 1


@pytest.mark.parametrize("policy", shmcache.POLICIES)
def test_tiered_local_copies_under_every_policy(redis_url, policy):
    """Local caches smaller than what the fleet reads, under each policy: every value read is the one written, the
    copies stay within the local limits (under keep: those admitted while there was room), and some reads are
    served from them."""
    with two_hosts(redis_url, unique_name("pol"), policy=policy, max_entries=24) as (a, b):
        for i in range(60):
            a.tier.put(f"k{i}", make_value(f"k{i}", i, 64))
        for _ in range(3):  # a few hot keys read again and again, then a scan of every key
            for i in [0, 1, 2, 3] * 3 + list(range(60)):
                check_value(f"k{i}", b.tier.get(f"k{i}"))
        s, local = b.tier.stats(), b.local.stats()
        assert s.local_hits > 0 and s.remote_hits > 0 and local.policy == policy
        assert local.entries <= 24 and b.local.verify().ok and a.local.verify().ok
        assert (local.not_admitted > 0) == (policy == "keep")


def test_tiered_values_keep_their_types(hosts):
    a, b = hosts
    values = {"s": "text", "b": b"\x00\xff", "n": None, "i": -2**70, "f": 1.5, "t": (1, [2, {"x": (3,)}]),
              "arr": np.arange(12, dtype=np.float32).reshape(3, 4)}
    for k, v in values.items():
        a.tier.put(k, v)
    for k, v in values.items():
        got = b.tier.get(k, "absent")
        if isinstance(v, np.ndarray):
            assert got.dtype == v.dtype and np.array_equal(got, v) and got.flags.writeable
        else:
            assert got == v and type(got) is type(v)
    assert b.tier.get("n", "absent") is None and b.tier.get("n", "absent") is None  # a stored None is a value


def test_tiered_update_invalidates_the_other_hosts_copy(hosts):
    a, b = hosts
    a.tier.put("k", make_value("k", 1, 32))
    check_value("k", b.tier.get("k"))
    assert b.local_copy("k")["seq"] == 1
    a.tier.put("k", make_value("k", 2, 32))
    eventually(lambda: b.local_copy("k") is None, what="invalidation of b's copy")
    assert b.tier.get("k")["seq"] == 2
    assert b.tier.stats().invalidations >= 1
    # a's own message comes back to a: it leaves a's copy, which has the version the message names.
    eventually(lambda: a.tier.stats().invalidations >= 2, what="a's own messages")
    assert a.local_copy("k")["seq"] == 2
    a.tier.delete("k")
    eventually(lambda: b.local_copy("k") is None, what="invalidation by delete")
    assert b.tier.get("k") is None


def test_tiered_every_write_invalidates(hosts):
    a, b = hosts
    writes = [
        lambda: a.tier.put("k", 2),
        lambda: a.tier.replace("k", 3),
        lambda: a.tier.incr("k"),
        lambda: a.tier.cas("k", 10, a.tier.get_with_version("k")[1]),
        lambda: a.tier.touch("k", 30),
        lambda: a.tier.pop("k"),  # last: afterwards there is nothing left to copy
    ]
    a.tier.put("k", 1)
    for write in writes:
        b.tier.get("k")
        assert b.local_copy("k", "none") != "none"
        write()
        eventually(lambda: b.local_copy("k", "none") == "none", what=f"invalidation after write {write}")
        assert b.tier.get("k") == a.tier.get_with_version("k")[0]


def test_tiered_atomic_operations(hosts):
    a, b = hosts
    assert a.tier.add("k", 1) and not b.tier.add("k", 2)
    assert b.tier.get("k") == 1
    assert not a.tier.replace("absent", 1) and "absent" not in a.tier
    assert b.tier.replace("k", 2) and a.tier.get("k") in (1, 2)  # a's copy may not be invalidated yet
    value, version = a.tier.get_with_version("k")
    assert value == 2 and isinstance(version, int)
    assert b.tier.cas("k", 3, version)
    assert not a.tier.cas("k", 4, version)  # b changed it
    assert a.tier.get_with_version("k")[0] == 3
    assert a.tier.get_with_version("absent") == (None, None)
    assert a.tier.incr("n") == 1 and b.tier.incr("n", 5) == 6 and a.tier.decr("n", 2) == 4
    with pytest.raises(KeyError):
        a.tier.incr("nothing", initial=None)
    a.tier.put("s", "text")
    with pytest.raises(TypeError):
        b.tier.incr("s")
    assert b.tier.pop("n") == 4 and b.tier.pop("n", "gone") == "gone"
    a.tier["d"] = 7
    assert b.tier["d"] == 7 and "d" in b.tier
    del b.tier["d"]
    with pytest.raises(KeyError):
        b.tier["d"]
    with pytest.raises(KeyError):
        del a.tier["d"]


def test_tiered_versions_grow_across_delete(hosts):
    a, _ = hosts
    a.tier.put("k", 1)
    _, v1 = a.tier.get_with_version("k")
    a.tier.delete("k")
    a.tier.put("k", 1)
    _, v2 = a.tier.get_with_version("k")
    assert v2 > v1  # same value, new version: a cas holding v1 must fail
    assert not a.tier.cas("k", 2, v1)


def test_tiered_incr_is_atomic_across_hosts(hosts):
    a, b = hosts
    import threading

    def bump(tier):
        for _ in range(50):
            tier.incr("counter")

    threads = [threading.Thread(target=bump, args=(h.tier,)) for h in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert a.tier.get_with_version("counter")[0] == 200


def test_tiered_ttl_applies_on_every_host(hosts):
    a, b = hosts
    a.tier.put("short", "v", ttl=0.3)
    assert b.tier.get("short") == "v"
    eventually(lambda: a.tier.get_with_version("short")[0] is None, what="Redis expiry")
    # b's copy was stored with Redis's remaining time to live, so it is gone too.
    eventually(lambda: b.local_copy("short") is None, timeout=2, what="local expiry")
    assert b.tier.get("short") is None
    a.tier.put("long", "v", ttl=60)
    assert a.tier.touch("long", 0.2) and b.tier.get("long") == "v"
    eventually(lambda: b.tier.get("long") is None, what="expiry after touch")
    assert not a.tier.touch("long", 1)


def test_tiered_clear_reaches_every_host(hosts):
    a, b = hosts
    for i in range(30):
        a.tier.put(i, i)
    assert all(b.tier.get(i) == i for i in range(30))
    assert a.tier.clear() == 30
    eventually(lambda: b.tier._kind.stats().entries == 0, what="b's copies cleared")
    assert b.tier.get(3) is None and b.tier.stats().local_clears >= 1


def test_tiered_memoize_across_hosts(hosts):
    a, b = hosts
    calls = []

    def square(x):
        calls.append(x)
        return x * x

    fa = a.tier.memoize(square, name="square")
    fb = b.tier.memoize(square, name="square")
    assert [fa(i) for i in range(5)] == [fb(i) for i in range(5)] == [0, 1, 4, 9, 16]
    assert sorted(calls) == list(range(5))  # b's calls were all served by a's results
    assert fb.cache_clear() == 5
    eventually(lambda: a.tier._kind.stats().entries == 0, what="a's memoized copies cleared")
    assert fa(2) == 4 and calls.count(2) == 2


def test_tiered_lost_invalidation_is_bounded_by_max_age(redis_url, namespace):
    """b stops listening (as if its invalidations were lost): its copy stays stale, but never beyond max_age."""
    now = [10**12]
    a = Host(redis_url, namespace)
    b = Host(redis_url, namespace, max_age=5.0, clock=lambda: now[0])
    try:
        for h in (a, b):
            eventually(h.listening, what="listener subscribed")
        a.tier.put("k", 1)
        assert b.tier.get("k") == 1
        b.tier._listener_box[0].close()
        a.tier.put("k", 2)
        time.sleep(0.2)
        assert b.tier.get("k") == 1  # stale: no invalidation came, and 5 s have not passed on b's clock
        now[0] += 5 * 10**9
        assert b.tier.get("k") == 2
    finally:
        a.tier.clear()
        a.close()
        b.close()


def test_tiered_stale_copy_is_never_stored(hosts, monkeypatch):
    """The race the marks close: b reads version 1 from Redis; before b stores its copy, a writes version 2 and
    b's listener applies the invalidation. b's late copy of version 1 must not be stored."""
    a, b = hosts
    a.tier.put("k", make_value("k", 1, 16))
    read = b.tier._remote.read

    def slow_read(kb):  # steps, as Remote.read's (shmcache/tier/steps.py)
        found = yield from read(kb)  # version 1
        a.tier.put("k", make_value("k", 2, 16))
        v2 = a.tier.get_with_version("k")[1]
        eventually(lambda: _mark(b, "k") == v2, what="b applying a's invalidation")
        return found

    monkeypatch.setattr(b.tier._remote, "read", slow_read)
    assert b.tier.get("k")["seq"] == 1  # what Redis held when b asked
    monkeypatch.undo()
    assert b.local_copy("k") is None, "a stale copy was stored after the invalidation of its version"
    assert b.tier.stats().stale_fills == 1
    assert b.tier.get("k")["seq"] == 2 and b.local_copy("k")["seq"] == 2


def test_tiered_foreign_or_damaged_value_reads_absent(hosts, caplog):
    a, b = hosts
    a.tier.put("k", "good")
    client = a.tier._remote.client
    rkey = a.tier._remote.key(encode_key("k"))
    client.set(a.tier._remote.key(encode_key("other")), client.get(rkey))  # a valid value under another key
    client.set(a.tier._remote.key(encode_key("foreign")), b"written by someone else")
    blob = bytearray(client.get(rkey))
    blob[-1] ^= 1
    client.set(rkey, bytes(blob))
    b.tier.local.delete(KindKey(b.tier._n, "k"))
    with caplog.at_level(logging.WARNING, logger="shmcache.tiered"):
        assert b.tier.get("other") is None and b.tier.get("foreign") is None and b.tier.get("k") is None
    assert b.tier.stats().remote_errors == 3
    assert "holds no valid value" in caplog.text


def test_tiered_redis_down_then_back(redis_server, namespace):
    url = redis_server.url
    a = Host(url, namespace, timeout=0.2, retry_interval=0.2)
    b = Host(url, namespace, timeout=0.2, retry_interval=0.2)
    strict = TieredCache(b.local, url, namespace=namespace, strict=True, timeout=0.2, retry_interval=0.2)
    try:
        eventually(a.listening, what="a listening")
        for i in range(10):
            a.tier.put(i, make_value(str(i), i, 16))
        assert all(b.tier.get(i) is not None for i in range(10))
        redis_server.stop()
        # Local hits are served; misses and writes fail softly, counted.
        for _ in range(3):
            for i in range(10):
                check_value(str(i), b.tier.get(i))
        assert b.tier.get("never") is None and b.tier.get("never", 5) == 5
        a.tier.put("during", 1)  # kept locally
        assert a.tier.get("during") == 1 and a.tier.stats().local_only_puts == 1
        assert a.tier.delete(3) is True  # a's own copy
        assert a.tier.get_or_compute("computed", lambda: "here") == "here"
        assert "absent" not in a.tier
        # The atomic operations are the fleet's: they need Redis, strict or not.
        for op in (lambda: a.tier.cas(1, 1, 1), lambda: a.tier.get_with_version(1), lambda: a.tier.incr("c"),
                   lambda: a.tier.add("new", 1), lambda: a.tier.replace(1, 1)):
            with pytest.raises(RemoteError):
                op()
        with pytest.raises(RemoteError):
            strict.get("never")
        with pytest.raises(RemoteError):
            strict.put("x", 1)
        s = b.tier.stats()
        assert s.remote_errors >= 1 and s.local_hits >= 30
        assert s.remote_errors + s.remote_skipped >= 2
        redis_server.start()
        # Reconnects by itself: writes reach Redis again and the other host sees them.
        eventually(lambda: _put_reaches(a.tier, "after", 1), what="a's writes reaching Redis again")
        assert b.tier.get("after") == 1
        # The listeners resubscribed, each emptying its host's copies (invalidations may have been lost).
        eventually(lambda: a.tier.stats().listener_starts >= 2 and b.tier.stats().listener_starts >= 2,
                   what="listeners resubscribed")
        a.tier.put("after", 2)
        eventually(lambda: b.local_copy("after") is None, what="invalidations flowing again")
        assert b.tier.get("after") == 2
    finally:
        strict.close()
        a.tier.clear()
        a.close()
        b.close()


def _put_reaches(tier, key, value) -> bool:
    tier.put(key, value)
    try:
        return tier.get_with_version(key)[1] is not None
    except RemoteError:
        return False


def test_tiered_redis_never_up_is_contained(namespace):
    """A Redis that is not there at all (nothing listens on the port): the tier works as a local cache."""
    h = Host("redis://127.0.0.1:1/0", namespace, timeout=0.05)
    try:
        h.tier.put("k", 1)
        assert h.tier.get("k") == 1 and h.tier.get("j") is None
        s = h.tier.stats()
        assert s.local_only_puts == 1 and s.remote_errors >= 1
        assert s.remote_errors + s.remote_skipped >= 2 and s.remote_calls == 0
    finally:
        h.close()


def test_tiered_stats_and_cli(hosts, capsys):
    a, b = hosts
    for i in range(10):
        a.tier.put(i, i)
        b.tier.get(i)
        b.tier.get(i)
    s = b.tier.stats()
    assert (s.local_hits, s.local_misses, s.remote_hits) == (10, 10, 10)
    assert s.hit_ratio == 1.0 and s.local_entries == 10 and s.listening
    assert 0 < s.remote_p50_us <= s.remote_p90_us <= s.remote_p99_us
    assert s.remote_calls >= 10
    seen = host_stats(b.name, b.tier.namespace)
    assert (seen.local_hits, seen.remote_hits, seen.local_entries) == (10, 10, 10)
    from shmcache.cli import main
    assert main(["tier", b.name, "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["local_hits"] == 10 and out["namespace"] == b.tier.namespace
    assert main(["tier"]) == 0
    assert b.name in capsys.readouterr().out
    assert main(["tier", b.name, b.tier.namespace, "--prometheus"]) == 0
    from prometheus_client.parser import text_string_to_metric_families
    families = {f.name: f for f in text_string_to_metric_families(capsys.readouterr().out)}
    (sample,) = families["shmcache_tier_local_hits"].samples
    assert sample.value == 10 and sample.labels == {"cache": b.name, "namespace": b.tier.namespace}
    quantiles = [x for x in families["shmcache_tier_remote_latency_seconds"].samples if "quantile" in x.labels]
    assert [x.labels["quantile"] for x in quantiles] == ["0.5", "0.9", "0.99"] and quantiles[0].value > 0


def test_tiered_arguments_checked(redis_url, name):
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as local:
        for bad in ("", "a.b", "a:b", "x" * 33, "sp ace", 5):
            with pytest.raises((ValueError, TypeError)):
                TieredCache(local, redis_url, namespace=bad)
        for bad in (0, -1, float("inf"), "1"):
            with pytest.raises(ValueError):
                TieredCache(local, redis_url, namespace="ok", max_age=bad)
        with pytest.raises(TypeError):
            TieredCache("not a cache", redis_url, namespace="ok")
        with TieredCache(local, redis_url, namespace="ok") as t:
            with pytest.raises(ValueError):
                t.put("k", 1, ttl=-1)
            with pytest.raises(TypeError):
                t.put("k", object())
            assert t.limits() == local.limits()
            t.unlink()


def test_tiered_stats_segment_swept_once_nobody_has_it(redis_url, namespace):
    from shmcache import sweep

    h = Host(redis_url, namespace)
    try:
        stats_name = h.tier._rows.name
        (found,) = [f for f in sweep(names=[h.name]) if f["name"] == stats_name]
        assert found["state"] == "in use"
        h.tier.close()
        (found,) = [f for f in sweep(remove=True, names=[h.name]) if f["name"] == stats_name]
        assert found["state"] == "orphan" and found["removed"]
        assert not os.path.exists("/dev/shm/" + stats_name)
    finally:
        h.close()


def test_tiered_unlinking_the_local_cache_removes_its_stats_segments(name):
    # No Redis needed: the client is made on first use, the stats segment at construction.
    local = SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True)
    tiers = [TieredCache(local, "redis://127.0.0.1:1", namespace=ns) for ns in ("a", "b")]
    paths = ["/dev/shm/" + t._rows.name for t in tiers]
    try:
        assert all(os.path.exists(p) for p in paths)
        local.unlink()
        assert not any(os.path.exists(p) for p in paths)
    finally:
        for t in tiers:
            t.close()
        local.close()


def test_tiered_fresh_host_serves_its_first_put_from_its_copy(redis_url, name, namespace):
    # The host's first subscription begins with a gap that drops the namespace's copies: a handle waits for it when
    # it is made, so the put after it keeps its copy and the get is a local hit, not a Redis read.
    local = SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True)
    try:
        with TieredCache(local, redis_url, namespace=namespace) as t:
            t.put("k", make_value("k", 1, 16))
            eventually(lambda: t.stats().listener_starts == 1, what="the listener's first subscription")
            check_value("k", t.get("k"))
            s = t.stats()
            assert (s.local_hits, s.remote_hits, s.remote_misses) == (1, 0, 0)
            t.unlink()
    finally:
        local.close()
        local.unlink()


def test_tiered_host_stats_never_waits_on_a_held_stats_file(name, namespace):
    # A process stopped while it opened the stats segment (it holds the file's flock) must not block `shmcache tier`.
    import fcntl

    from shmcache.errors import AttachTimeout

    local = SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True)
    tier = TieredCache(local, "redis://127.0.0.1:1", namespace=namespace)
    try:
        with open("/dev/shm/" + tier._rows.name, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            with pytest.raises(AttachTimeout):
                host_stats(name, namespace, timeout=0.2)
    finally:
        tier.close()
        local.close()
        local.unlink()


def _copied_everywhere(hosts, key, value) -> None:
    a, b = hosts
    a.tier.put(key, value)
    assert b.tier.get(key) == value and a.local_copy(key) == value and b.local_copy(key) == value


def _gone_everywhere(hosts, key, what: str) -> float:
    """Wait (bounded) until no host holds a copy of ``key``; the seconds it took."""
    t0 = time.monotonic()
    for h in hosts:
        eventually(lambda h=h: h.local_copy(key, "none") == "none", what=f"{what}: the copy dropped")
    return time.monotonic() - t0


@pytest.mark.parametrize("change", ["DEL", "SET", "EXPIRE"])
def test_tiered_another_clients_write_reaches_every_hosts_copy(hosts, redis_url, change):
    """A write that goes around the tier (another service, an operator's redis-cli) is tracked by Redis
    (``CLIENT TRACKING ... BCAST PREFIX``): every host drops its copy, and then reads what Redis holds."""
    import redis

    a, b = hosts
    client = redis.Redis.from_url(redis_url)
    try:
        key = f"k-{change}"
        _copied_everywhere(hosts, key, "old")
        rkey = a.tier._remote.key(encode_key(key))
        before = b.tier.stats().invalidations
        if change == "DEL":
            client.delete(rkey)
        elif change == "SET":
            client.set(rkey, b"another service's value")  # not this format: read as absent
        else:
            client.pexpire(rkey, 50)
        _gone_everywhere(hosts, key, change)
        assert a.tier.get(key) is None and b.tier.get(key) is None
        assert b.tier.stats().invalidations > before
    finally:
        client.close()


def test_tiered_a_flush_reaches_every_hosts_copy(redis_server, namespace):
    """FLUSHDB by another client: a tracking invalidation with no key (nil), a gap: every copy goes."""
    import redis

    with two_hosts(redis_server.url, namespace) as hosts:
        client = redis.Redis.from_url(redis_server.url)
        try:
            _copied_everywhere(hosts, "k1", 1)
            _copied_everywhere(hosts, "k2", 2)
            client.flushdb()
            _gone_everywhere(hosts, "k1", "FLUSHDB")
            _gone_everywhere(hosts, "k2", "FLUSHDB")
        finally:
            client.close()


def test_tiered_a_hosts_own_write_keeps_its_copy_under_tracking(hosts):
    """Redis tracks the tier's own writes too; the version read back names the writer's copy, which stays."""
    a, b = hosts
    for i in range(5):
        a.tier.put("mine", i)
        eventually(lambda: b.local_copy("mine", "none") == "none" or b.local_copy("mine") == i, what="b's copy")
    eventually(lambda: a.tier.stats().invalidations >= 10, what="a's own invalidations, both kinds")
    assert a.local_copy("mine") == 4 and a.tier.get("mine") == 4


def test_tiered_a_maxmemory_eviction_reaches_every_hosts_copy(redis_server, namespace):
    """Redis evicts a key under maxmemory: no host serves its copy afterwards."""
    import redis

    with two_hosts(redis_server.url, namespace) as hosts:
        a, b = hosts
        client = redis.Redis.from_url(redis_server.url)
        try:
            _copied_everywhere(hosts, "evicted", "v" * 1000)
            client.config_set("maxmemory-policy", "allkeys-lru")
            client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 256 * 1024)
            filler = b"x" * 4096
            for i in range(2000):  # others' keys, newer: the tier's key is the least recently used
                client.set(f"filler:{i}", filler)
                if not client.exists(a.tier._remote.key(encode_key("evicted"))):
                    break
            assert not client.exists(a.tier._remote.key(encode_key("evicted")))
            _gone_everywhere(hosts, "evicted", "maxmemory eviction")
        finally:
            client.config_set("maxmemory", 0)
            client.close()


def test_tiered_broken_tracking_is_a_gap_and_comes_back(redis_server, namespace):
    """The connection that holds the tracking dies: the listener notices (CLIENT TRACKINGINFO, at its heartbeat),
    drops the host's copies as after any gap, and tracks again. (A server of its own: the connections it kills are
    every tracking one it finds.)"""

    from shmcache.tier import listener as listener_module

    with two_hosts(redis_server.url, namespace) as hosts:
        _tracking_broken_and_back(hosts, redis_server.url, listener_module.HEARTBEAT_S)


def _tracking_broken_and_back(hosts, url, heartbeat_s) -> None:
    import redis

    a, b = hosts
    client = redis.Redis.from_url(url)
    try:
        _copied_everywhere(hosts, "k", 1)
        starts = b.tier.stats().listener_starts + a.tier.stats().listener_starts
        trackers = [line for line in client.client_list() if "t" in line["flags"] and "B" in line["flags"]]
        assert trackers, "no connection tracks the namespace"
        for t in trackers:
            client.client_kill_filter(_id=t["id"])
        eventually(lambda: b.tier.stats().listener_starts + a.tier.stats().listener_starts > starts,
                   timeout=4 * heartbeat_s, what="a new subscription")
        _gone_everywhere(hosts, "k", "the gap")
        eventually(lambda: any("t" in line["flags"] and "B" in line["flags"] for line in client.client_list()),
                   what="tracking on again")
        _copied_everywhere(hosts, "k2", 2)
        client.delete(a.tier._remote.key(encode_key("k2")))
        _gone_everywhere(hosts, "k2", "DEL after the gap")
    finally:
        client.close()


def test_tiered_a_tracked_key_whose_version_cannot_be_read_is_dropped():
    """The version of a tracked key is read from Redis; a Redis that does not answer makes it unknown, so the copy
    goes (never the whole host's copies, as a gap would): ``remote.version_at``."""
    import redis

    from shmcache.tier.remote import UNKNOWN_VERSION, version_at

    class Down:
        def getrange(self, key, start, end):
            raise redis.ConnectionError("gone")

    class Foreign:
        def getrange(self, key, start, end):
            return b"another service's value"[start : end + 1]

    assert version_at(Down(), b"k") == UNKNOWN_VERSION and version_at(Foreign(), b"k") == UNKNOWN_VERSION
