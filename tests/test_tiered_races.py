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

from .tiers import Host, eventually, mark as _mark, two_hosts
from .workers import make_value

pytestmark = pytest.mark.timeout(60)


def _delay_read(monkeypatch, host, between):
    """Make ``host``'s next Redis read run ``between()`` after reading and before its copy is stored."""
    read = host.tier._remote.read
    done = []

    def slow_read(kb):  # steps, as Remote.read's (shmcache/tier/steps.py)
        found = yield from read(kb)
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


def test_tiered_fill_whose_mark_was_evicted_is_not_kept(redis_url, namespace, monkeypatch):
    """A fill's mark, evicted while the fill is in flight, may have carried an invalidation: the fill is refused.
    The hosts' caches are lru, where 600 new keys evict the mark for certain (auto's filter would keep it)."""
    with two_hosts(redis_url, namespace, policy="lru") as hosts:
        _fill_whose_mark_was_evicted(hosts, monkeypatch)


def _fill_whose_mark_was_evicted(hosts, monkeypatch) -> None:
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

    def late_lock(kb, token, lease_ms):  # steps, as Remote.try_lock's
        if not runs:
            a.tier.get_or_compute("k", lambda: runs.append("a") or "a's")
        return (yield from try_lock(kb, token, lease_ms))

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


def test_tiered_fill_whose_mark_was_made_anew_is_not_kept(hosts, monkeypatch, redis_url):
    """b's first process reads v1; a deletes the key and b raises the mark; b's marks are dropped (a gap) and a
    second process of b makes a new mark by reading the key (absent). The first fill's mark is not that one: its
    v1 must not be stored."""
    a, b = hosts
    b2 = TieredCache(b.local, redis_url, namespace=b.tier.namespace)
    try:
        a.tier.put("k", "v1")
        # (each write reaches b twice: the tier's message, and Redis's tracking of the key)
        eventually(lambda: b.tier.stats().invalidations == 2, what="b applying the put's invalidations")

        def delete_gap_refill():
            a.tier.delete("k")
            eventually(lambda: b.tier.stats().invalidations == 4, what="b applying the delete's")
            assert _mark(b, "k") != 0  # raised by the message, or dropped by the tracking's (a key gone: no version)
            b.tier._on_gap()  # as a resubscription does
            assert b2.get("k") is None  # a new mark, at 0

        _delay_read(monkeypatch, b, delete_gap_refill)
        assert b.tier.get("k") == "v1"
        assert b.local_copy("k") is None and b.tier.get("k") is None
    finally:
        b2.close()


def test_tiered_fill_past_its_deadline_is_not_kept(hosts, monkeypatch):
    a, b = hosts
    a.tier.put("k", 1)
    _delay_read(monkeypatch, b, lambda: __import__("time").sleep(b.tier._fill_s + 0.1))
    stale = b.tier.stats().stale_fills
    assert b.tier.get("k") == 1
    assert b.local_copy("k") is None and b.tier.stats().stale_fills == stale + 1


def test_tiered_fn_raising_remote_error_runs_once(hosts):
    a, _ = hosts
    runs = []

    def fn():
        runs.append(1)
        raise RemoteError("from another cache fn uses", what="test")

    with pytest.raises(RemoteError):
        a.tier.get_or_compute("k", fn)
    assert runs == [1]


class _Failing:
    """A stand-in redis-py client whose every command fails with ``exc``."""

    def __init__(self, exc) -> None:
        self.exc = exc

    def get_encoder(self):
        return type("Encoder", (), {"decode_responses": False})()

    def register_script(self, script):
        return lambda **kw: self.get(None)

    def get(self, key):
        raise self.exc

    def pubsub(self):
        raise self.exc

    def close(self):
        pass


@pytest.mark.parametrize("reply, outage", [("READONLY You can't write against a read only replica.", True),
                                           ("MISCONF Redis is configured to save RDB snapshots", True),
                                           ("ERR unknown command", False)])
def test_tiered_outage_replies_open_the_circuit(name, reply, outage):
    import redis

    parsed = redis.connection.BaseParser.parse_error(reply) if hasattr(redis.connection, "BaseParser") else \
        redis.exceptions.ResponseError(reply)
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as local:
        with TieredCache(local, _Failing(parsed), namespace="circuit", retry_interval=60) as t:
            assert t.get("a") is None and t.get("b") is None
            s = t.stats()
            assert (s.remote_errors, s.remote_skipped) == ((1, 1) if outage else (2, 0))
            t.unlink()


def test_tiered_refuses_what_it_cannot_use(name):
    import redis

    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as local:
        with pytest.raises(ValueError, match="URL"):
            TieredCache(local, "localhost:6379", namespace="x")
        with pytest.raises(TypeError, match="decode_responses"):
            TieredCache(local, redis.Redis(decode_responses=True), namespace="x")


def test_tiered_key_too_large_for_the_host_still_reaches_redis(hosts):
    a, b = hosts
    key = "k" * (2 << 20)  # a key no 1 MiB host can hold, not even as a mark
    a.tier.put(key, "v")
    assert b.tier.get(key) == "v" and a.tier.get(key) == "v"
    assert b.tier.get_or_compute(key, lambda: "other") == "v"


def test_tiered_writes_redis_refuses_drop_the_copy(hosts, redis_server, namespace):
    """With Redis unavailable, delete, pop and touch drop the host's copy (expired if a view pins it): none may
    live on past what Redis would have done."""
    h = Host(redis_server.url, namespace, timeout=0.1, retry_interval=0.1)
    try:
        eventually(h.listening, what="listener subscribed")
        for k in ("d", "p", "t"):
            h.tier.put(k, k.encode() * 3)
        redis_server.stop()
        with h.tier._kind.view("d"):
            assert h.tier.delete("d") is True
        assert h.local_copy("d") is None
        assert h.tier.pop("p") == b"ppp" and h.local_copy("p") is None
        assert h.tier.touch("t", 100) is True and h.local_copy("t") is None
        assert h.tier.stats().local_only_puts == 3
    finally:
        h.close()


@pytest.mark.parametrize("url, what", [
    ("redis://localhost:99999", "Port"), ("redis://localhost:abc", "Port"), ("redis://localhost:0", "port 0"),
    ("redis://localhost:6379/zero", "database"), ("http://localhost:6379", "URL"), ("unix://", "socket path"),
    ("redis://localhost:6379/0?socket_timeout=soon", "socket_timeout"),
    ("redis://user:secret@localhost:99999", "Port"),
])
def test_tiered_malformed_url_refused_when_made(name, url, what):
    # A URL that can never connect is a mistake, reported at once, not an outage to ride out (and no password shown).
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True) as local:
        with pytest.raises(ValueError, match=what) as caught:
            TieredCache(local, url, namespace="x")
        assert "secret" not in str(caught.value)


def test_tiered_a_lease_whose_exit_never_runs_still_ends(hosts):
    """A with block of the compute lock cut short before its exit (an interrupt at __exit__'s first bytecode): as
    the Lease goes, its thread stops renewing and releases the lock, instead of holding the key for ever."""
    import gc

    from shmcache.tier.lease import Lease
    from shmcache.tier.steps import run

    a, _ = hosts
    remote = a.tier._remote
    kb, token = encode_key("k"), b"t" * 16
    assert run(remote.try_lock(kb, token, 10_000), remote)
    lease = Lease(remote, kb, token, 600)  # renewed every 0.2 s while it lives
    lease.__enter__()  # and its __exit__ never called
    thread = lease._thread
    del lease
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    assert remote.client.get(remote.lock_prefix + kb) is None  # released, not left to expire


def test_tiered_clients_made_at_once_keep_one_and_close_the_rest():
    """Threads that find no redis-py client at once each make one (no lock: memo.Tally says why): the first made
    serves every thread after, with the scripts registered with it, and every other one is closed."""
    import time
    import types

    from shmcache.tier.remote import Remote

    made, start = [], threading.Barrier(4)

    class Client:
        def __init__(self) -> None:
            self.closed = False
            made.append(self)

        def register_script(self, script):
            return (self, script)

        def close(self) -> None:
            self.closed = True

    def factory():
        client = Client()
        time.sleep(0.05)  # (every thread is in here before any has kept its client)
        return client

    remote = Remote(factory, "race", types.SimpleNamespace(row=[0] * 64), retry_interval=30.0)
    got: list = []

    def first_use() -> None:
        start.wait(10)
        got.append(remote._connection())

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    kept = got[0][0]
    assert len(made) == 4 and all(g[0] is kept for g in got) and all(s[0] is kept for s in got[0][1])
    assert [c.closed for c in made].count(False) == 1 and not kept.closed
    assert remote.client is kept and len(made) == 4  # (made once: no other thread makes one again)
    remote.close()
    assert kept.closed
