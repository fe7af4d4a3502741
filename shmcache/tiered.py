"""``TieredCache``: one cache for a fleet of hosts -- Redis holds every value once, and each host's
``SharedCache`` holds near copies that its processes read in microseconds.

Reads go local first; a local miss reads Redis and copies the value into the local cache. Writes go to Redis, whose
script assigns the value a version and publishes an invalidation in the same step, then to the local cache. Each
host's listener (``listener.py``) applies the other hosts' invalidations. Staleness is bounded twice over:

- A copy older than the newest invalidation this host was told of is never stored: every cached key has a *mark*
  (the highest version an invalidation named, kept for a few seconds in the local cache's kind
  ``mark:<namespace>``), and every copy carries its Redis version: a copy is stored only if it is not older than
  the copy it replaces and the mark, and an invalidation drops only older copies, each under one lock hold
  (``SharedCache._store_versioned``, ``_invalidate``).
- A copy lives at most ``max_age`` seconds from the moment it was read from Redis, so even an invalidation that was
  lost (a gap in listening: each one also drops every copy of the namespace) cannot keep a stale copy longer.

Failure is contained in ``remote.py``: with Redis slow or down, local hits run at full speed, misses return the
default (or compute, in ``get_or_compute``), writes stay local, all counted and logged; ``strict=True`` raises
``RemoteError`` instead.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref

from . import flight, memo, ofd
from .cache import SharedCache, ttl_ns
from .codec import KindKey, decode_body, encode_key, encode_parts, fingerprint
from .errors import ComputeTimeout, PinnedError, RemoteError, TooLargeError
from .layout import KIND_PREFIX
from .layout.tier import (
    C_COMPUTATIONS, C_INVALIDATIONS, C_LISTENER_STARTS, C_LOCAL_CLEARS, C_LOCAL_HITS, C_LOCAL_MISSES,
    C_LOCAL_ONLY_PUTS, C_LOCK_TAKEOVERS, C_LOCK_WAITS, C_PUTS, C_REMOTE_ERRORS, C_REMOTE_HITS, C_REMOTE_MISSES,
    C_STALE_FILLS, LISTENER_BASE, MESSAGE_HEADER, OP_CLEAR,
)
from .listener import Listener
from .remote import Remote, connect, log, pack_payload, unpack_value
from .tierstats import Rows, TierStats

_MISSING = object()
_NAMESPACE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:")
MAX_NAMESPACE = 32  # so that "mark:" + namespace fits a kind name
_WAIT_FIRST_S, _WAIT_MAX_S = 0.002, 0.05  # a host waiting for another's computation polls Redis, doubling the pause


class TieredCache:
    """A ``SharedCache`` per host in front of one Redis (or Redis Cluster) shared by every host, with the same API.

    :param local: this host's shared-memory cache; the namespace's copies live in its kind ``tier:<namespace>``,
        so one local cache can front several namespaces and still hold entries of its own.
    :param remote: a ``redis://`` URL, or a redis-py client (``Redis`` or ``RedisCluster``) to use as it is.
    :param namespace: the keys' namespace in Redis, 1 to 32 characters among letters, digits and ``_-:``; hosts
        that share it share the cache.
    :param max_age: seconds a local copy is trusted at most, from the moment it was read from Redis: the bound on
        staleness when an invalidation is lost.
    :param timeout: seconds a Redis call may take before it counts as failed.
    :param retry_interval: after a failure, Redis is not asked again for this many seconds.
    :param strict: raise ``RemoteError`` when Redis fails, rather than serving from the local cache.
    :param lock_lease: seconds a computing host's lock lasts unless renewed (it is renewed while the host lives):
        how long other hosts wait before taking over from a computing host that died.
    :param default_ttl: time to live of values stored without ``ttl=`` (0: never expire).
    :param cluster: ``remote`` is a Redis Cluster URL (ignored when ``remote`` is a client).
    """

    def __init__(self, local: SharedCache, remote, *, namespace: str, max_age: float = 60.0, timeout: float = 0.1,
                 retry_interval: float = 1.0, strict: bool = False, lock_lease: float = 10.0,
                 default_ttl: float = 0.0, cluster: bool = False) -> None:
        if not isinstance(local, SharedCache):
            raise TypeError(f"local must be a SharedCache, got {type(local).__name__}")
        if not isinstance(namespace, str) or not 0 < len(namespace) <= MAX_NAMESPACE \
                or not set(namespace) <= _NAMESPACE_CHARS:
            raise ValueError(f"namespace must be 1 to {MAX_NAMESPACE} letters, digits or _-: ; got {namespace!r}")
        for what, v in (("max_age", max_age), ("timeout", timeout), ("retry_interval", retry_interval),
                        ("lock_lease", lock_lease)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ValueError(f"{what} must be a positive number of seconds, got {v!r}")
        ttl_ns(default_ttl)
        self._settings = dict(namespace=namespace, max_age=max_age, timeout=timeout, retry_interval=retry_interval,
                              strict=strict, lock_lease=lock_lease, default_ttl=default_ttl, cluster=cluster)
        self._url = remote if isinstance(remote, str) else None
        self.local = local
        self.namespace = namespace
        self.max_age = float(max_age)
        self.strict = strict
        self.default_ttl = default_ttl
        self._lease_ms = max(1, int(lock_lease * 1000))
        # A mark outlives the longest fill that may still store: reads are bounded by the timeout, and a fill whose
        # read began more than _fill_s ago is not stored.
        self._fill_s = 2 * timeout + 0.5
        self._mark_s = self._fill_s + 1.0
        self._kind = local.kind(f"tier:{namespace}")
        self._marks = local.kind(f"mark:{namespace}")
        self._n = self._kind._n
        self._kprefix = bytes((KIND_PREFIX, self._kind._n))
        self._mprefix = bytes((KIND_PREFIX, self._marks._n))
        self._rows = Rows(local.name, namespace, os.fstat(local._seg.fd).st_mode & 0o777)
        self._row = self._rows.row
        self._owns_client = isinstance(remote, str)
        client = connect(remote, timeout=timeout, cluster=cluster) if self._owns_client else remote
        self._remote = Remote(client, namespace, self._rows, retry_interval=retry_interval)
        self._listener = None
        self._closed = False
        _handles.add(self)
        self._listen()

    # ------------------------------------------------------------------------------------------- reads

    def get(self, key, default=None):
        """The value of ``key``: from the local cache if it has a copy, else from Redis (and copied locally), else
        ``default``. With Redis unavailable, a local miss returns ``default`` (``strict``: raises RemoteError)."""
        if type(key) is str:  # encoded here, inline: a local hit should cost what a SharedCache get does
            try:
                lkb = self._kprefix + key.encode()
            except UnicodeEncodeError:
                lkb = self._kprefix + encode_key(key)  # raises the TypeError
        else:
            lkb = self._kprefix + encode_key(key)
        value = self.local.get(None, _MISSING, _kb=lkb)
        if value is not _MISSING:
            self._row[C_LOCAL_HITS] += 1
            return value
        self._row[C_LOCAL_MISSES] += 1
        try:
            found = self._fetch(lkb[2:])
        except RemoteError:
            if self.strict:
                raise
            return default
        return default if found is _MISSING else found

    def _fetch(self, kb: bytes):
        """The value of ``kb`` from Redis, copied into the local cache, or _MISSING if Redis has none. Counts the
        remote hit or miss; raises RemoteError."""
        self._listen()
        t0 = time.monotonic()
        found = self._remote.read(kb)
        if found is None:
            self._row[C_REMOTE_MISSES] += 1
            return _MISSING
        blob, pttl = found
        try:
            version, tag, body = unpack_value(kb, blob)
            value = decode_body(tag, body)
        except ValueError as exc:
            self._row[C_REMOTE_ERRORS] += 1
            log.warning("shmcache: Redis key %r of namespace %r holds no valid value (%s); treated as absent",
                        self._remote.key(kb), self.namespace, exc)
            return _MISSING
        self._row[C_REMOTE_HITS] += 1
        ttl = self.max_age - (time.monotonic() - t0)  # the age counts from before the read
        if pttl >= 0:
            ttl = min(ttl, pttl / 1000)
        # Crash window: a read stalled for longer than the marks live (a stopped process) might bring back a version
        # whose invalidation's mark is gone: such a copy is not kept.
        if ttl > 0 and time.monotonic() - t0 < self._fill_s:
            self._keep(kb, tag, body, version, ttl)
        return value

    def _keep(self, kb: bytes, tag: int, body, version: int, ttl: float) -> None:
        """Store a copy of Redis version ``version`` for ``ttl`` s, unless it is stale (a newer copy or mark)."""
        lkb, mkb = self._kprefix + kb, self._mprefix + kb
        try:
            if not self.local._store_versioned(lkb, mkb, tag, body, version, ttl):
                self._row[C_STALE_FILLS] += 1
        except TooLargeError:
            pass  # Redis holds it; this host's cache cannot
        except PinnedError:  # a view holds the old copy: it must not outlive this write
            self._drop_older(kb, version)

    def _drop_older(self, kb: bytes, version: int) -> None:
        """Drop this host's copy of ``kb`` if older than ``version``, and keep fills older than it out for a while."""
        self.local._invalidate(self._kprefix + kb, self._mprefix + kb, version, self._mark_s)

    def __contains__(self, key) -> bool:
        """Whether the key has a value, locally or in Redis (neither counts as a lookup)."""
        if KindKey(self._n, key) in self.local:
            return True
        kb = encode_key(key)
        try:
            return bool(self._remote._call("exists", self._remote.client.exists, self._remote.key(kb)))
        except RemoteError:
            if self.strict:
                raise
            return False

    def get_with_version(self, key, default=None) -> tuple:
        """``(value, version)`` as Redis has them, or ``(default, None)``; the version is what ``cas`` compares.
        Always asks Redis. With Redis unavailable the key reads as absent (``strict``: RemoteError)."""
        kb = encode_key(key)
        try:
            found = self._remote.read(kb)
        except RemoteError:
            if self.strict:
                raise
            return default, None
        if found is None:
            return default, None
        version, tag, body = unpack_value(kb, found[0])
        return decode_body(tag, body), version

    # ------------------------------------------------------------------------------------------- writes

    def _ttl(self, ttl) -> float:
        ttl = self.default_ttl if ttl is None else ttl
        ttl_ns(ttl)  # refuses a bad one
        return float(ttl)

    def _write(self, key, value, ttl, mode: str = "set", expected: int = 0, kept_ms: int | None = None):
        """Write through: Redis, then the local copy. True if written; False if ``mode``'s condition failed; None if
        Redis was unavailable (the caller decides what the local cache does). ``kept_ms``: keep the key's time to
        live in Redis, of which this many ms are left (-1: none)."""
        if kept_ms is None:
            ttl = self._ttl(ttl)
            ttl_ms = math.ceil(ttl * 1000)
        else:
            ttl, ttl_ms = max(kept_ms, 0) / 1000, -1
        kb = encode_key(key)
        tag, body = encode_parts(value)
        try:
            version = self._remote.write(kb, pack_payload(kb, tag, body), ttl_ms, mode, expected)
        except RemoteError:
            if self.strict:
                raise
            return None
        self._row[C_PUTS] += 1
        if version is None:
            return False
        self._keep(kb, tag, body, version, min(ttl, self.max_age) if ttl else self.max_age)
        return True

    def _local_only(self, fn, *args):
        self._row[C_LOCAL_ONLY_PUTS] += 1
        return fn(*args)

    def put(self, key, value, ttl: float | None = None) -> None:
        """Store ``value`` under ``key`` in Redis and in the local cache (``ttl``: seconds, 0 never, None the
        default). With Redis unavailable, the value is kept locally only (``strict``: RemoteError)."""
        if self._write(key, value, ttl) is None:
            self._local_only(self._kind.put, key, value, min(self._ttl(ttl) or self.max_age, self.max_age))

    def add(self, key, value, ttl: float | None = None) -> bool:
        """Store only if Redis has no value for ``key``; whether it stored."""
        done = self._write(key, value, ttl, "add")
        if done is None:
            return self._local_only(self._kind.add, key, value, min(self._ttl(ttl) or self.max_age, self.max_age))
        return done

    def replace(self, key, value, ttl: float | None = None) -> bool:
        """Store only if Redis has a value for ``key``; whether it stored."""
        done = self._write(key, value, ttl, "replace")
        if done is None:
            return self._local_only(self._kind.replace, key, value,
                                    min(self._ttl(ttl) or self.max_age, self.max_age))
        return done

    def cas(self, key, value, version: int, ttl: float | None = None) -> bool:
        """Store only if Redis's version of ``key`` is still ``version`` (from ``get_with_version``); whether it
        stored. False with Redis unavailable (``strict``: RemoteError)."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int from get_with_version, got {version!r}")
        return bool(self._write(key, value, ttl, "cas", version))

    def incr(self, key, delta: int = 1, initial: int | None = 0) -> int:
        """Add ``delta`` to the int under ``key`` (absent: start from ``initial``; None: KeyError) and return the
        result; atomic across the fleet (a compare-and-swap loop on Redis), and a counter keeps its time to live.
        With Redis unavailable, the local copy is incremented."""
        if type(delta) is not int or (initial is not None and type(initial) is not int):
            raise TypeError("incr needs int delta and initial")
        kb = encode_key(key)
        while True:
            try:
                found = self._remote.read(kb)
            except RemoteError:
                if self.strict:
                    raise
                return self._local_only(self._kind.incr, key, delta, initial)
            if found is None:
                if initial is None:
                    raise KeyError(key)
                value = initial + delta
                done = self._write(key, value, None, "add")
            else:
                version, tag, body = unpack_value(kb, found[0])
                current = decode_body(tag, body)
                if type(current) is not int:
                    raise TypeError(f"incr on a {type(current).__name__} value: only int values can be incremented")
                value = current + delta
                done = self._write(key, value, None, "cas", version, kept_ms=found[1])
            if done is None:
                return self._local_only(self._kind.incr, key, delta, initial)
            if done:
                return value

    def decr(self, key, delta: int = 1, initial: int | None = 0) -> int:
        """``incr`` by ``-delta``."""
        if type(delta) is not int:
            raise TypeError("decr needs an int delta")
        return self.incr(key, -delta, initial)

    def delete(self, key) -> bool:
        """Remove ``key`` from Redis and from every host's local cache; whether Redis had it."""
        kb = encode_key(key)
        try:
            version = self._remote.delete(kb)
        except RemoteError:
            if self.strict:
                raise
            return self._local_only(self._kind.delete, key)
        self._row[C_PUTS] += 1
        if version is None:
            self._kind.delete(key)
            return False
        self._drop_older(kb, int(version))
        return True

    def pop(self, key, default=None):
        """Remove ``key`` everywhere and return its value, or ``default``."""
        kb = encode_key(key)
        try:
            found = self._remote.delete(kb, want_value=True)
        except RemoteError:
            if self.strict:
                raise
            return self._local_only(self._kind.pop, key, default)
        self._row[C_PUTS] += 1
        if found is None:
            self._kind.delete(key)
            return default
        version, blob = found
        self._drop_older(kb, int(version))
        _, tag, body = unpack_value(kb, blob)
        return decode_body(tag, body)

    def touch(self, key, ttl: float | None = None) -> bool:
        """Give ``key`` a new time to live from now, in Redis; other hosts drop their copies (which carry the old
        one). Whether Redis had the key."""
        ttl = self._ttl(ttl)
        kb = encode_key(key)
        try:
            version = self._remote.touch(kb, math.ceil(ttl * 1000))
        except RemoteError:
            if self.strict:
                raise
            return self._local_only(self._kind.touch, key, min(ttl or self.max_age, self.max_age))
        self._row[C_PUTS] += 1
        if version is not None:
            self._drop_older(kb, version)
        return version is not None

    def clear(self) -> int:
        """Remove every key of the namespace from Redis and every host's copies; how many keys Redis held. Not
        atomic: a write racing the clear may survive it."""
        try:
            n = self._remote.clear()
        except RemoteError:
            if self.strict:
                raise
            n = 0
        self._clear_local()
        return n

    def _delete_prefix(self, prefix: bytes) -> int:
        """Remove the keys whose encoding starts with ``prefix``, everywhere (memoize's ``cache_clear``)."""
        try:
            n = self._remote.clear(prefix)
        except RemoteError:
            if self.strict:
                raise
            n = 0
        self.local._delete_prefix(self._kprefix + prefix)
        return n

    def _clear_local(self) -> None:
        self._kind.clear()
        self._row[C_LOCAL_CLEARS] += 1

    # ------------------------------------------------------------------------------------------- compute

    def get_or_compute(self, key, fn, *, timeout: float | None = None, ttl: float | None = None):
        """The value of ``key``; on a miss everywhere, ``fn()``'s result, stored and returned, with ``fn`` run once
        for the whole fleet: one process per host asks Redis (the host's single-flight), and one host computes
        while the others wait for its result (a Redis lock with an owner token, renewed while the host lives; if
        it dies, its lock expires after ``lock_lease`` and a waiting host takes over). ``timeout`` bounds the wait
        for another computation (ComputeTimeout). With Redis unavailable, the host computes on its own."""
        ttl = self._ttl(ttl)
        lkey = KindKey(self._n, key)
        value = self.local.get(lkey, _MISSING)
        if value is not _MISSING:
            self._row[C_LOCAL_HITS] += 1
            return value
        self._row[C_LOCAL_MISSES] += 1
        kb = encode_key(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        claim, waited = flight.claim(self.local._seg.fd, fingerprint(self._kprefix + kb), timeout)
        with claim:
            if waited:  # another process of this host fetched or computed it meanwhile
                value = self.local.get(lkey, _MISSING)
                if value is not _MISSING:
                    return value
            return self._fleet_compute(key, kb, fn, deadline, ttl)

    def _fleet_compute(self, key, kb: bytes, fn, deadline, ttl: float):
        token = os.urandom(16)
        pause, waited = _WAIT_FIRST_S, False
        while True:
            try:
                value = self._fetch(kb)
                if value is not _MISSING:
                    return value
                if self._remote.try_lock(kb, token, self._lease_ms):
                    break
            except RemoteError:
                if self.strict:
                    raise
                self._row[C_COMPUTATIONS] += 1
                value = fn()
                self._local_only(self._kind.put, key, value, min(ttl or self.max_age, self.max_age))
                return value
            if not waited:
                waited = True
                self._row[C_LOCK_WAITS] += 1
            if deadline is not None and time.monotonic() >= deadline:
                raise ComputeTimeout("another host has been computing this key for too long",
                                     what="get_or_compute", hint="raise timeout=, or look at the computing host")
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, _WAIT_MAX_S)
        if waited:
            self._row[C_LOCK_TAKEOVERS] += 1
        self._row[C_COMPUTATIONS] += 1
        with _Lease(self._remote, kb, token, self._lease_ms):
            value = fn()
            try:
                self.put(key, value, ttl)
            except TooLargeError:
                pass
        return value

    def memoize(self, fn=None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None):
        """``SharedCache.memoize`` over the fleet: each result computed once by the whole fleet
        (``get_or_compute``); ``cache_clear`` clears it on every host and in Redis."""
        def decorate(f):
            return memo.memoized(self, f, name or memo.function_name(f), timeout, ttl)

        return decorate if fn is None else decorate(fn)

    # ------------------------------------------------------------------------------------------- invalidations

    def _listen(self) -> None:
        """Start this process's listener thread (it listens if it wins the host's election) if it has none."""
        if self._listener is None and not self._closed:
            self._listener = Listener(self.local._seg.fd, LISTENER_BASE + self._n, self._subscribe,
                                      self._on_message, self._clear_local, self._on_listening)

    def _subscribe(self):
        pubsub = self._remote.client.pubsub()
        pubsub.subscribe(self._remote.channel)
        return pubsub

    def _on_listening(self) -> None:
        self._row[C_LISTENER_STARTS] += 1

    def _on_message(self, data: bytes) -> None:
        # This host's own writes come back too: they drop nothing (the writer's copy has the version named) but
        # raise the marks that keep out copies of older versions another process of the host is still fetching.
        op, version = MESSAGE_HEADER.unpack_from(data)
        kb = bytes(data[MESSAGE_HEADER.size:])
        if op == OP_CLEAR:
            if kb:
                self.local._delete_prefix(self._kprefix + kb)
            else:
                self._kind.clear()
            self._row[C_LOCAL_CLEARS] += 1
            return
        self.local._invalidate(self._kprefix + kb, self._mprefix + kb, int(version), self._mark_s)
        self._row[C_INVALIDATIONS] += 1

    # ------------------------------------------------------------------------------------------- the rest

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        self.put(key, value)

    def __delitem__(self, key) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def stats(self) -> TierStats:
        """This host's counts for the namespace (every process's), with remote latency percentiles."""
        local = self._kind.stats()
        listening = ofd.held_elsewhere(self.local._seg.fd, LISTENER_BASE + self._n) or bool(
            self._listener and self._listener.leading)
        return self._rows.stats(self.namespace, local.entries, local.retained_bytes, listening)

    @property
    def limits(self):
        """The local cache's limits (Redis's are its own ``maxmemory``)."""
        return self.local.limits

    def set_limits(self, limits) -> None:
        self.local.set_limits(limits)

    def close(self) -> None:
        """Stop this process's listener and release its stats row; the local cache and a client passed in stay
        open (they are the caller's)."""
        if self._closed:
            return
        self._closed = True
        _handles.discard(self)
        if self._listener is not None:
            self._listener.close()
        self._rows.close()
        self._row = self._rows.row
        if self._owns_client:
            self._remote.client.close()

    def unlink(self) -> None:
        """Remove the host's stats segment of this namespace (the local cache and Redis are untouched)."""
        self._rows.unlink()

    def __enter__(self) -> TieredCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TieredCache {self.namespace!r} over {self.local!r}>"

    def __reduce__(self):
        """Pickles as its settings (the local cache by name, Redis by URL), for "spawn" workers: the copy opens its
        own handle, as a SharedCache's does."""
        if self._url is None:
            raise TypeError("a TieredCache made with a redis-py client cannot be pickled: pass a URL instead")
        return _reopen, (self.local, self._url, self._settings)

    def _after_fork_in_child(self) -> None:
        self._rows.after_fork_in_child()
        self._row = self._rows.row
        if self._listener is not None:
            self._listener.after_fork_in_child()
            self._listener = None
            # A standby of the child's own, at once: if the child only ever hits its copies, it must still be
            # able to take over listening when the host's listener dies.
            self._listen()


class _Lease:
    """Holds a host's compute lock for the duration of a ``with``: renews it every third of the lease from a
    thread, and releases it (only if still ours) at the end, so a waiting host takes over at once."""

    def __init__(self, remote: Remote, kb: bytes, token: bytes, lease_ms: int) -> None:
        self._remote, self._kb, self._token, self._lease_ms = remote, kb, token, lease_ms
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="shmcache-lease", daemon=True)

    def _renew(self) -> None:
        while not self._done.wait(self._lease_ms / 3000):
            try:
                if not self._remote.renew(self._kb, self._token, self._lease_ms):
                    return  # lost (expired while Redis was away): another host may compute too, harmlessly
            except RemoteError:
                pass

    def __enter__(self) -> _Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(5)
        try:
            self._remote.unlock(self._kb, self._token)
        except RemoteError:
            pass  # it expires by itself


def _reopen(local: SharedCache, url: str, settings: dict) -> TieredCache:
    return TieredCache(local, url, **settings)


def host_stats(cache_name: str, namespace: str) -> TierStats:
    """The stats of a namespace on this host, read from outside (``shmcache tier``): no Redis, no row claimed.

    :raises FileNotFoundError: if the cache or the namespace's stats segment does not exist.
    """
    rows = Rows(cache_name, namespace, claim=False)
    try:
        with SharedCache(cache_name, create=False) as local:
            kinds = local.stats().kinds
            kind = kinds.get(f"tier:{namespace}")
            number = list(kinds).index(f"tier:{namespace}") + 1 if kind else 0
            listening = bool(number) and ofd.held_elsewhere(local._seg.fd, LISTENER_BASE + number)
            return rows.stats(namespace, kind.entries if kind else 0, kind.retained_bytes if kind else 0, listening)
    finally:
        rows.close()


_handles: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handle in list(_handles):
        handle._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
