"""TieredCache's races and edges, each forced deterministically: a read of Redis in flight while a write's
invalidation, a clear or an eviction happens must not leave a stale copy; a computation is not repeated when its
value lands just before the lock is taken; failures to apply, handles never closed or closed, values too large for
the host, views over copies."""

from __future__ import annotations

import gc
import logging
import threading

import pytest

from shmcache import ClosedError, RemoteError, SharedCache, TieredCache
from shmcache.codec import encode_key

from .test_tiered import Host, _mark, eventually, hosts, namespace  # noqa: F401 (fixtures)
from .workers import make_value

pytestmark = pytest.mark.timeout(60)


def _delay_read(monkeypatch, host, between):
    """Make ``host``'s next Redis read run ``between()`` after reading and before its copy is stored."""
    read = host.tier._remote.read
    done = []

    def slow_read(kb):
        found = read(kb)
        if not done:
            done.append(1)
            between()
        return found

    monkeypatch.setattr(host.tier._remote, "read", slow_read)


def test_tiered_read_in_flight_across_a_clear_is_not_kept(hosts, monkeypatch):
    a, b = hosts
    a.tier.put("k", "old")
    clears = b.tier.stats().local_clears

    def clear_meanwhile():
        a.tier.clear()
        eventually(lambda: b.tier.stats().local_clears > clears, what="b applying the clear")

    _delay_read(monkeypatch, b, clear_meanwhile)
    assert b.tier.get("k") == "old"  # what Redis held when b asked
    assert b.local_copy("k") is None and b.tier.get("k") is None


def test_tiered_fill_whose_mark_was_evicted_is_not_kept(hosts, monkeypatch):
    """A fill's mark, evicted while the fill is in flight, may have carried an invalidation: the fill is refused."""
    a, b = hosts
    a.tier.put("k", make_value("k", 1, 8))

    def write_then_evict():
        a.tier.put("k", make_value("k", 2, 8))
        v2 = a.tier.get_with_version("k")[1]
        eventually(lambda: _mark(b, "k") == v2, what="b raising the mark")
        for i in range(600):  # more than b's 512 entries: the mark is evicted
            b.local.put(("filler", i), i)
        assert _mark(b, "k") == -1

    _delay_read(monkeypatch, b, write_then_evict)
    assert b.tier.get("k")["seq"] == 1
    assert b.local_copy("k") is None
    assert b.tier.get("k")["seq"] == 2


def test_tiered_old_fill_refused_after_same_host_write_copy_is_gone(hosts, monkeypatch, redis_url):
    """Two processes of one host (two handles on one local cache): one reads v1, the other writes v2 and its copy
    is then evicted; the echo of v2's invalidation raised the reader's mark, so v1 is not stored."""
    a, _ = hosts
    a2 = TieredCache(a.local, redis_url, namespace=a.tier.namespace)
    try:
        a.tier.put("k", make_value("k", 1, 8))

        def other_process_writes():
            a2.put("k", make_value("k", 2, 8))
            v2 = a2.get_with_version("k")[1]
            eventually(lambda: _mark(a, "k") == v2, what="the echo raising the mark")
            a2._kind.delete("k")  # as if evicted

        a.tier._kind.delete("k")
        _delay_read(monkeypatch, a, other_process_writes)
        assert a.tier.get("k")["seq"] == 1
        assert a.local_copy("k") is None and a.tier.get("k")["seq"] == 2
    finally:
        a2.close()


def test_tiered_value_stored_before_the_lock_is_not_computed_again(hosts, monkeypatch):
    """b misses, a computes and stores and releases its lock, then b takes the lock: b reads once more first."""
    a, b = hosts
    runs = []
    try_lock = b.tier._remote.try_lock

    def late_lock(kb, token, lease_ms):
        if not runs:
            a.tier.get_or_compute("k", lambda: runs.append("a") or "a's")
        return try_lock(kb, token, lease_ms)

    monkeypatch.setattr(b.tier._remote, "try_lock", late_lock)
    assert b.tier.get_or_compute("k", lambda: runs.append("b") or "b's") == "a's"
    assert runs == ["a"]
    assert a.tier._remote.client.get(a.tier._remote.lock_prefix + encode_key("k")) is None  # b let go of it


def test_tiered_put_too_large_for_the_host_drops_its_old_copy(hosts):
    a, b = hosts
    a.tier.put("k", "small")
    big = b"x" * (2 << 20)  # more than the host's 1 MiB cache, fine for Redis
    a.tier.put("k", big)
    assert a.local_copy("k") is None and a.tier.get("k") == big
    eventually(lambda: b.local_copy("k") is None, what="b's copy invalidated")


def test_tiered_foreign_values_read_as_absent_everywhere(hosts, caplog):
    a, _ = hosts
    client = a.tier._remote.client
    for k in ("gwv", "pop", "incr"):
        client.set(a.tier._remote.key(encode_key(k)), b"not ours")
    with caplog.at_level(logging.WARNING, logger="shmcache.tiered"):
        assert a.tier.get_with_version("gwv") == (None, None)
        assert a.tier.pop("pop", "default") == "default" and client.exists(a.tier._remote.key(encode_key("pop"))) == 0
        with pytest.raises(TypeError, match="invalid"):
            a.tier.incr("incr")
    assert a.tier.stats().remote_errors == 3


def _listeners() -> int:
    return sum(t.name == "shmcache-listener" and t.is_alive() for t in threading.enumerate())


def test_tiered_handle_never_closed_is_collected(redis_url, namespace):
    h = Host(redis_url, namespace)
    try:
        before = _listeners()
        t = TieredCache(h.local, redis_url, namespace=namespace)
        assert _listeners() == before + 1
        del t
        gc.collect()
        eventually(lambda: _listeners() == before, what="the collected handle's thread ending")
    finally:
        h.close()


def test_tiered_invalidation_that_fails_to_apply_drops_everything(hosts, monkeypatch, caplog):
    a, b = hosts
    a.tier.put("k", 1)
    assert b.tier.get("k") == 1
    clears = b.tier.stats().local_clears

    def broken(kb, version):
        raise OSError("simulated")

    monkeypatch.setattr(b.tier, "_drop_older", broken)
    with caplog.at_level(logging.ERROR, logger="shmcache.tiered"):
        a.tier.put("k", 2)
        eventually(lambda: b.tier.stats().local_clears > clears, what="the failure treated as a gap")
    monkeypatch.undo()
    assert b.local_copy("k") is None and b.tier.get("k") == 2
    assert "failed to apply" in caplog.text


def test_tiered_clear_expires_a_copy_a_view_pins(hosts):
    a, b = hosts
    a.tier.put("k", b"old bytes")
    assert b.tier.get("k") == b"old bytes"
    clears = b.tier.stats().local_clears
    with b.tier._kind.view("k") as v:
        a.tier.clear()
        eventually(lambda: b.tier.stats().local_clears > clears, what="b applying the clear")
        assert bytes(v) == b"old bytes"  # the view reads on
    assert b.local_copy("k") is None and b.tier.get("k") is None


def test_tiered_closed_handle_refuses(hosts):
    a, _ = hosts
    t = TieredCache(a.local, a.tier._url, namespace=a.tier.namespace)
    t.close()
    t.close()  # idempotent
    for op in (lambda: t.get("k"), lambda: t.put("k", 1), lambda: "k" in t, lambda: t.stats(),
               lambda: t.get_or_compute("k", lambda: 1), lambda: t.delete("k"), lambda: t.incr("n")):
        with pytest.raises(ClosedError):
            op()


def test_tiered_cluster_down_at_start_is_contained(name):
    """A cluster client connects when made: it is made on first use, so a cluster down at start fails calls, which
    are contained, and not the constructor."""
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as local:
        with TieredCache(local, "redis://127.0.0.1:1/0", namespace="down", cluster=True, timeout=0.05) as t:
            t.put("k", 1)
            assert t.get("k") == 1 and t.get("j") is None
            with pytest.raises(RemoteError):
                t.incr("n")
            assert t.stats().remote_errors >= 1
            t.unlink()
