"""``TieredCache``: one cache for a fleet of hosts -- Redis holds every value once, and each host's
``SharedCache`` holds near copies that its processes read in microseconds.

Reads go local first; a local miss reads Redis and copies the value into the local cache. Writes go to Redis, whose
script assigns the value a version and publishes an invalidation in the same step, then to the local cache. Each
host's listener (``listener.py``) applies every invalidation. Staleness is bounded twice over:

- A copy older than an invalidation the host has applied is never stored (``copies.py``): copies carry their Redis
  version, and each fill registers a short-lived mark first, which invalidations raise and clears remove.
- A copy lives at most ``max_age`` seconds from the moment it was read from Redis, so even an invalidation that was
  lost cannot keep a stale copy longer (and each gap in listening drops every copy of the namespace).

Failure is contained in ``remote.py``: with Redis slow or down, local hits run at full speed, misses return the
default (or compute, in ``get_or_compute``), writes stay local, all counted and logged; ``strict=True`` raises
``RemoteError`` instead. The atomic operations (add, replace, cas, get_with_version, incr, decr) are the fleet's:
they always need Redis.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .. import aio, flight, memo, ofd
from ..cache import DEFAULT_LOCK_TIMEOUT, SharedCache, parts, seconds, ttl_ns
from ..codec import EncodedKey, KindKey, decode_body, encode_key, encode_parts, fingerprint
from ..errors import ClosedError, PinnedError, ReentrantCallError, RemoteError, SerializerMismatch, TooLargeError
from ..layout import KIND_PREFIX
from ..mapping import MISSING
from ..refresh import Refreshes
from ..trust import Trust
from . import copies, lease
from .layout import (
    C_COMPUTATIONS, C_INVALIDATIONS, C_LISTENER_STARTS, C_LOCAL_CLEARS, C_LOCAL_HITS, C_LOCAL_MISSES,
    C_LOCAL_ONLY_PUTS, C_PUTS, C_REMOTE_HITS, C_REMOTE_MISSES, C_STALE_FILLS, C_STALE_HITS, LISTENER_BASE,
    MESSAGE_HEADER, OP_CLEAR, OP_KEY,
)
from .listener import SILENCE_S, TRACKING_CHANNEL, Calls, Listener, Subscription, log as listener_log
from .mapping import TierMapping
from .remote import (
    UNKNOWN_VERSION, Remote, check_url, connect, pack_payload, redis_py, remote_version, resp2_client, unpack_value,
    version_at,
)
from .steps import CALL, LOCAL, arun, run
from .stats import Rows, TierStats

_log = logging.getLogger("shmcache")

if TYPE_CHECKING:
    from ..memo import Memoized
    from ..stats import CacheLimits

P = ParamSpec("P")
R = TypeVar("R")
_TC = TypeVar("_TC", bound="TieredCache")
_NAMESPACE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
MAX_NAMESPACE = 32  # so that "mark:" + namespace fits a kind name
_READY, _CLOSED, _FORKED = "ready", "closed", "forked"


class _RedisLook:
    """A wait for the host's claim on a key looks in Redis every ``lock_lease``: a value there (another host's)
    ends it, and so does a key whose fleet compute lock nobody holds (``lapsed``: the claim's holder computes
    nothing the fleet can see, and the caller goes on to the fleet's lock, which decides from there). Why: the
    claim's holder may be stopped (SIGSTOP, a debugger, a frozen container) mid-computation, and holds the claim
    while it is stopped; its fleet lock expires after the lease, and another host, or this host's waiter, computes
    in its place. A holder that lives renews its lock, and is waited for. One look per lease and waiter (two reads):
    the host's single flight keeps Redis's load what it was. A Redis that fails tells nothing: the wait goes on."""

    __slots__ = ("_every", "_next", "value", "lapsed")

    def __init__(self, lease_ms: int) -> None:
        self._every = lease_ms / 1000
        self._next = time.monotonic() + self._every
        self.value: Any = MISSING
        self.lapsed = False

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._every
        return True


class TieredCache(TierMapping):
    """A ``SharedCache`` per host in front of one Redis (or Redis Cluster) shared by every host, with the same API.

    :param local: this host's shared-memory cache; the namespace's copies live in its kind ``tier:<namespace>``
        (and short-lived marks in ``mark:<namespace>``), so one local cache can front several namespaces and still
        hold entries of its own. The host's stats segment of the namespace is created and checked with what
        ``local`` was opened with (``mode``, ``trust_owner``, ``group``): OwnershipError if it is refused.
    :param remote: a ``redis://`` URL, or a redis-py client (``Redis`` or ``RedisCluster``) to use as it is.
    :param namespace: the keys' namespace in Redis, 1 to 32 letters, digits, ``_`` or ``-``; hosts that share it
        share the cache.
    :param max_age: seconds a local copy is trusted at most, from the moment it was read from Redis: the bound on
        staleness when an invalidation is lost.
    :param timeout: seconds a Redis call may take before it counts as failed.
    :param retry_interval: after a failure, Redis is not asked again for this many seconds.
    :param strict: raise ``RemoteError`` when Redis fails, rather than serving from the local cache.
    :param lock_lease: seconds a computing host's lock lasts unless renewed (it is renewed while the host lives):
        how long other hosts wait before taking over from a computing host that died.
    :param default_ttl: time to live of values stored without ``ttl=`` (0: never expire).
    :param cluster: ``remote`` is a Redis Cluster URL (ignored when ``remote`` is a client).
    :param async_remote: with ``remote`` a client, the redis-py asyncio client (``redis.asyncio``) the ``a*``
        methods use, in the loop it belongs to; without one they make the Redis calls in a worker thread. With
        ``remote`` a URL, each event loop gets an asyncio client of its own, made on its first call.
    """

    def __init__(self, local: SharedCache, remote: Any, *, namespace: str, max_age: float = 60.0, timeout: float = 0.1,
                 retry_interval: float = 1.0, strict: bool = False, lock_lease: float = 10.0,
                 default_ttl: float = 0.0, cluster: bool = False, async_remote: Any = None) -> None:
        if not isinstance(local, SharedCache):
            raise TypeError(f"local must be a SharedCache, got {type(local).__name__}")
        if not isinstance(namespace, str) or not 0 < len(namespace) <= MAX_NAMESPACE \
                or not set(namespace) <= _NAMESPACE_CHARS:
            raise ValueError(f"namespace must be 1 to {MAX_NAMESPACE} letters, digits, _ or -; got {namespace!r}")
        for what, v in (("max_age", max_age), ("timeout", timeout), ("retry_interval", retry_interval),
                        ("lock_lease", lock_lease)):
            seconds(what, v)
        ttl_ns(default_ttl)
        redis_py()  # redis-py missing: ImportError now, with the extra to install
        self._settings: dict[str, Any] = dict(
            namespace=namespace, max_age=max_age, timeout=timeout, retry_interval=retry_interval, strict=strict,
            lock_lease=lock_lease, default_ttl=default_ttl, cluster=cluster)
        self._url = remote if isinstance(remote, str) else None
        if self._url is not None:
            check_url(self._url)
        self.local = local
        self.namespace = namespace
        self.max_age = float(max_age)
        self.strict = strict
        self.default_ttl = default_ttl
        self._lease_ms = max(1, int(lock_lease * 1000))
        self._refreshes = Refreshes()  # get_or_compute's background refreshes of stale values (refresh.py)
        # A fill's copy is stored only within _fill_s of its start (reads are bounded by the timeout), and its mark
        # lives longer than that.
        self._fill_s = 2 * timeout + 0.5
        self._mark_s = self._fill_s + 1.0
        kind, marks = local.kind(f"tier:{namespace}"), local.kind(f"mark:{namespace}")
        self._kind, self._n, self._marks_n = kind, kind.number, marks.number
        self._kprefix, self._mprefix = bytes((KIND_PREFIX, kind.number)), bytes((KIND_PREFIX, marks.number))
        # The local cache's guard and store, for the locked operations of copies.py.
        self._local = parts(local)
        if self._url is None:
            encoder = getattr(remote, "get_encoder", None)
            if encoder is None or encoder().decode_responses:
                raise TypeError("remote must be a redis:// URL or a redis-py client made without decode_responses")
            client = remote
            factory = lambda: client  # noqa: E731
            afactory = None
            if async_remote is not None:
                if not type(async_remote).__module__.startswith("redis.asyncio") \
                        or async_remote.get_encoder().decode_responses:
                    raise TypeError("async_remote must be a redis.asyncio client made without decode_responses")
                afactory = lambda: async_remote  # noqa: E731
        else:
            if async_remote is not None:
                raise TypeError("async_remote goes with a client as remote; with a URL, each loop makes its own")
            factory = lambda: connect(remote, timeout=timeout, cluster=cluster)  # noqa: E731
            afactory = lambda: connect(remote, timeout=timeout, cluster=cluster, asyncio=True)  # noqa: E731
        # The local cache's trust: the stats segment may be owned by whom the cache may, and is as open as it.
        self._rows = Rows(local.name, namespace, self._local.seg.trust)
        self._row = self._rows.row  # the hot path's copy of it, kept in step by fork and close
        self._remote = Remote(factory, namespace, self._rows, retry_interval=retry_interval, afactory=afactory)
        self._listener_box: list = [None]
        self._owns_local = False  # True when unpickling opened the local handle (closed with this one)
        self._state = _READY
        _handles[id(self)] = self
        # Collected without close(): the same release (the listener holds this object weakly, so this can happen).
        self._finalizer = weakref.finalize(self, _release, self._listener_box, self._rows, self._remote,
                                           self._url is not None)
        self._listen()

    # Each operation below is written once, as steps (``steps.py``): ``_x`` is the generator, ``x`` runs it with
    # blocking calls (``_run``) and ``ax`` awaits it (``_arun``, aio.py's rules: see the asyncio section).

    def _run(self, steps) -> Any:
        return run(steps, self._remote)

    async def _arun(self, steps) -> Any:
        return await arun(steps, self._remote, self.local)

    # ------------------------------------------------------------------------------------------- reads

    def _local_key(self, key: Any) -> bytes:
        if type(key) is str:  # encoded here, inline: a local hit should cost what a SharedCache get does
            try:
                return self._kprefix + key.encode()
            except UnicodeEncodeError:
                pass  # encode_key raises the TypeError
        return self._kprefix + encode_key(key)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``: from the local cache if it has a copy, else from Redis (and copied locally), else
        ``default``. With Redis unavailable, a local miss returns ``default`` (``strict``: raises RemoteError)."""
        if self._state is not _READY:
            self._revive()
        lkb = self._local_key(key)
        value = self.local.get(EncodedKey(lkb), MISSING)
        if value is not MISSING:
            self._row[C_LOCAL_HITS] += 1
            return value
        return self._run(self._get_remote(lkb[2:], default))

    def _get_remote(self, kb: bytes, default: Any):
        """A local miss's rest: counted, then Redis's value, or ``default``."""
        self._row[C_LOCAL_MISSES] += 1
        try:
            value = yield from self._fetch(kb)
        except RemoteError:
            if self.strict:
                raise
            return default
        return default if value is MISSING else value

    def _fetch(self, kb: bytes, count_miss: bool = True, left: list[int] | None = None):
        """The value of ``kb`` from Redis, copied into the local cache, or MISSING if Redis has none (or one that
        is not valid); ``left``: the ms it had to live in Redis (-1: no time to live) is appended to it. Counts the
        remote hit or miss; raises RemoteError."""
        t0 = time.monotonic()  # before the mark: the deadline must fall within the mark's life
        generation = yield from self._begin(kb)
        found = yield from self._remote.read(kb)
        decoded = None if found is None else self._decode(kb, found[0])
        if decoded is None:
            if count_miss:
                self._row[C_REMOTE_MISSES] += 1
            return MISSING
        version, tag, body, value = decoded
        self._row[C_REMOTE_HITS] += 1
        if left is not None:
            left.append(found[1])
        ttl = self.max_age - (time.monotonic() - t0)  # the age counts from before the read
        if found[1] >= 0:
            ttl = min(ttl, found[1] / 1000)
        if ttl > 0:
            yield from self._keep(kb, tag, body, version, ttl, t0 + self._fill_s, generation)
        return value

    def _look(self, kb: bytes, look: _RedisLook):
        """Steps of a look in Redis by a caller waiting for its host's claim (``_RedisLook``, whose ``value`` and
        ``lapsed`` it sets): whether the wait ends. A Redis that fails tells nothing."""
        try:
            value = yield from self._fetch(kb, False)
            lapsed = value is MISSING and not (yield from self._remote.locked(kb))
        except RemoteError:
            value, lapsed = MISSING, False
        look.value, look.lapsed = value, lapsed
        return value is not MISSING or lapsed

    def _begin(self, kb: bytes):
        """Register a fill of ``kb`` (``copies.begin_fill_locked``); its mark's generation, or None when the host
        cannot hold the mark (a key too large for it; a mark not admitted has generation 0, which no store finds):
        then no copy is stored."""
        mkb = self._mprefix + kb
        try:
            return (yield LOCAL, self._local.guard.run, (copies.begin_fill_locked, self._local.store, mkb,
                                                         fingerprint(mkb), ttl_ns(self._mark_s)))
        except TooLargeError:
            return None

    def _decode(self, kb: bytes, blob: bytes):
        """(version, tag, body, value) of a value read from Redis; None, counted and logged, if it is not valid."""
        try:
            version, tag, body = unpack_value(kb, blob)
            return version, tag, body, decode_body(tag, body)
        except ValueError as exc:
            self._remote.refused("value", "Redis key %r of namespace %r holds no valid value (%s); treated as absent",
                                 self._remote.key(kb), self.namespace, exc)
            return None

    def _keep(self, kb: bytes, tag: int, body, version: int, ttl: float, deadline: float, generation):
        """Store a copy of Redis version ``version`` for ``ttl`` s, unless it is stale or late (``copies.py``)."""
        if generation is None or version == UNKNOWN_VERSION:  # no mark, or no version: no copy, and an older one
            yield from self._drop_older(kb, version)  # must not stay
            return
        local = self._local
        mkb = self._mprefix + kb
        try:
            encoded = local.store.encode(None, None, self._kprefix + kb, (tag, body))
            if not (yield LOCAL, local.guard.run, (copies.store_locked, local.store, encoded, mkb, fingerprint(mkb),
                                                   generation, version, ttl_ns(ttl), deadline)):
                self._row[C_STALE_FILLS] += 1
        except (TooLargeError, PinnedError):  # too large, or (version 11) a view pins the old copy: the old must go
            yield from self._drop_older(kb, version)

    def _drop_older(self, kb: bytes, version: int):
        """Apply an invalidation of ``version`` to this host's copy of ``kb`` (a version out of range, such as
        UNKNOWN_VERSION, drops the copy and its mark, whatever their versions: see copies.invalidate_locked)."""
        lkb, mkb = self._kprefix + kb, self._mprefix + kb
        yield LOCAL, self._local.guard.run, (copies.invalidate_locked, self._local.store, lkb, fingerprint(lkb), mkb,
                                             fingerprint(mkb), version)

    def __contains__(self, key: object) -> bool:
        """Whether the key has a value, locally or in Redis (neither counts as a lookup). With Redis unavailable,
        whether this host has a copy (``strict``: RemoteError)."""
        return self._run(self._contains(key))

    def _contains(self, key: object):
        self._check_open()
        if (yield LOCAL, self.local.__contains__, (KindKey(self._n, key),)):
            return True
        try:
            return (yield from self._remote.exists(encode_key(key)))
        except RemoteError:
            if self.strict:
                raise
            return False

    def get_with_version(self, key: Any, default: Any = None) -> tuple[Any, int | None]:
        """``(value, version)`` as Redis has them, or ``(default, None)``; the version is what ``cas`` compares.
        Always asks Redis (RemoteError if it is unavailable, strict or not: a version is the fleet's)."""
        return self._run(self._get_with_version(key, default))

    def _get_with_version(self, key: Any, default: Any):
        self._check_open()
        kb = encode_key(key)
        found = yield from self._remote.read(kb)
        decoded = None if found is None else self._decode(kb, found[0])
        return (default, None) if decoded is None else (decoded[3], decoded[0])

    # ------------------------------------------------------------------------------------------- writes

    def _ttl(self, ttl) -> float:
        ttl = self.default_ttl if ttl is None else ttl
        ttl_ns(ttl)  # refuses a bad one
        return float(ttl)

    def _write(self, key, value, ttl, mode: str = "set", expected: int = 0, kept_ms: int | None = None):
        """Write through: Redis, then the local copy. True if written; False if ``mode``'s condition failed.
        ``kept_ms``: keep the key's time to live in Redis, of which this many ms are left (-1: none). Raises
        RemoteError."""
        self._check_open()
        if kept_ms is None:
            ttl = self._ttl(ttl)
            ttl_ms = math.ceil(ttl * 1000)
        else:
            ttl, ttl_ms = max(kept_ms, 0) / 1000, -1
        kb = encode_key(key)
        tag, body = encode_parts(value)
        t0 = time.monotonic()
        generation = yield from self._begin(kb)
        version = yield from self._remote.write(kb, pack_payload(kb, tag, body), ttl_ms, mode, expected)
        self._row[C_PUTS] += 1
        if version is None:
            return False
        yield from self._keep(kb, tag, body, version, self._bounded(ttl), t0 + self._fill_s, generation)
        return True

    def _bounded(self, ttl: float) -> float:
        """A copy's time to live: the value's (0: none), and never beyond ``max_age``."""
        return min(ttl, self.max_age) if ttl else self.max_age

    def put(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """Store ``value`` under ``key`` in Redis and in the local cache (``ttl``: seconds, 0 never, None the
        default); True (a local copy is kept as the local cache's policy admits it). With Redis unavailable, the
        value is kept locally only, for at most ``max_age`` (``strict``: RemoteError), and put says whether it was."""
        return self._run(self._put(key, value, ttl))

    def _put(self, key, value, ttl):
        try:
            yield from self._write(key, value, ttl)
        except RemoteError:
            if self.strict:
                raise
            self._row[C_LOCAL_ONLY_PUTS] += 1
            return (yield LOCAL, self._kind.put, (key, value, self._bounded(self._ttl(ttl))))
        return True

    def _put_computed(self, key, value, ttl: float):
        try:
            yield from self._put(key, value, ttl)
        except TooLargeError:
            pass  # correct to return, impossible to keep

    def add(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """Store only if Redis has no value for ``key``; whether it stored (RemoteError if Redis is unavailable)."""
        return self._run(self._write(key, value, ttl, "add"))

    def replace(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """Store only if Redis has a value for ``key``; whether it stored (RemoteError if Redis is unavailable)."""
        return self._run(self._write(key, value, ttl, "replace"))

    def cas(self, key: Any, value: Any, version: int, ttl: float | None = None) -> bool:
        """Store only if Redis's version of ``key`` is still ``version`` (from ``get_with_version``); whether it
        stored (RemoteError if Redis is unavailable)."""
        return self._run(self._cas(key, value, version, ttl))

    def _cas(self, key, value, version, ttl):
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int from get_with_version, got {version!r}")
        return (yield from self._write(key, value, ttl, "cas", version))

    def incr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """Add ``delta`` to the int under ``key`` (absent: start from ``initial``; None: KeyError) and return the
        result; atomic across the fleet (a compare-and-swap loop on Redis), and a counter keeps its time to live.
        A counter is the fleet's: RemoteError if Redis is unavailable, strict or not."""
        return self._run(self._incr(key, delta, initial))

    def _incr(self, key, delta, initial):
        if type(delta) is not int or (initial is not None and type(initial) is not int):
            raise TypeError("incr needs int delta and initial")
        self._check_open()
        kb = encode_key(key)
        while True:
            found = yield from self._remote.read(kb)
            if found is None:
                if initial is None:
                    raise KeyError(key)
                value = initial + delta
                done = yield from self._write(key, value, None, "add")
            else:
                decoded = self._decode(kb, found[0])
                current = None if decoded is None else decoded[3]
                if type(current) is not int:
                    what = "an invalid" if decoded is None else f"a {type(current).__name__}"
                    raise TypeError(f"incr on {what} value: only int values can be incremented")
                value = current + delta
                done = yield from self._write(key, value, None, "cas", decoded[0], kept_ms=found[1])
            if done:
                return value

    def decr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``incr`` by ``-delta``."""
        return self._run(self._decr(key, delta, initial))

    def _decr(self, key, delta, initial):
        if type(delta) is not int:
            raise TypeError("decr needs an int delta")
        return (yield from self._incr(key, -delta, initial))

    def delete(self, key: Any) -> bool:
        """Remove ``key`` from Redis and from every host's local cache; whether Redis had it. With Redis
        unavailable, only this host's copy goes (``strict``: RemoteError)."""
        return self._run(self._delete(key))

    def _delete(self, key):
        self._check_open()
        kb = encode_key(key)
        try:
            version = yield from self._remote.delete(kb)
        except RemoteError:
            if self.strict:
                raise
            return (yield from self._drop_copy(kb)) is not None
        self._row[C_PUTS] += 1
        if version is None:
            return False
        yield from self._drop_older(kb, version)
        return True

    def pop(self, key: Any, default: Any = MISSING) -> Any:
        """Remove ``key`` everywhere and return its value, or ``default`` (also when what Redis held was not a
        valid value); without a default, an absent key raises KeyError. With Redis unavailable, this host's copy
        is popped (``strict``: RemoteError)."""
        return self._run(self._pop(key, default))

    def _pop(self, key, default):
        self._check_open()
        kb = encode_key(key)
        try:
            found = yield from self._remote.delete(kb, want_value=True)
        except RemoteError:
            if self.strict:
                raise
            found = yield from self._drop_copy(kb)
            return _absent(key, default) if found is None else decode_body(*found)
        self._row[C_PUTS] += 1
        if found is None:
            return _absent(key, default)
        version, blob = found
        yield from self._drop_older(kb, version)
        decoded = self._decode(kb, blob)
        return _absent(key, default) if decoded is None else decoded[3]

    def touch(self, key: Any, ttl: float | None = None) -> bool:
        """Give ``key`` a new time to live from now, in Redis; every host drops its copy (which carries the old
        one). Whether Redis had the key. With Redis unavailable, only this host's copy is touched."""
        return self._run(self._touch(key, ttl))

    def _touch(self, key, ttl):
        self._check_open()
        ttl = self._ttl(ttl)
        kb = encode_key(key)
        try:
            version = yield from self._remote.touch(kb, math.ceil(ttl * 1000))
        except RemoteError:
            if self.strict:
                raise
            # The time to live is Redis's to change; this host's copy, which carries the old one, goes.
            return (yield from self._drop_copy(kb)) is not None
        self._row[C_PUTS] += 1
        if version is not None:
            yield from self._drop_older(kb, version)
        return version is not None

    def _drop_copy(self, kb: bytes):
        """A write Redis could not take, applied to this host's copy: it goes (expired, if a view pins it)."""
        self._row[C_LOCAL_ONLY_PUTS] += 1
        lkb = self._kprefix + kb
        return (yield LOCAL, self._local.guard.run, (copies.drop_locked, self._local.store, lkb, fingerprint(lkb)))

    def clear(self) -> int:  # type: ignore[override]  # (returns how many it removed; dict.clear returns None)
        """Remove every key of the namespace from Redis and every host's copies; how many keys Redis held. Not
        atomic: a write racing the clear may survive it. With Redis unavailable, this host's copies go."""
        return self._run(self._delete_prefix(b""))

    def _delete_prefix(self, prefix: bytes):
        """Remove the keys whose encoding starts with ``prefix``, everywhere (memoize's ``cache_clear``)."""
        self._check_open()
        try:
            n = yield from self._remote.clear(prefix)
            counted = False  # the clear's message, back at the listener, counts it
        except RemoteError:
            if self.strict:
                raise
            n, counted = 0, True
        yield from self._clear_local(prefix, counted)
        return n

    def _clear_local(self, prefix: bytes = b"", count: bool = True):
        """Drop this host's copies (of keys starting with ``prefix``) and every fill in flight."""
        yield LOCAL, self._local.guard.run, (copies.clear_locked, self._local.store, self._n, self._marks_n,
                                             self._kprefix + prefix if prefix else b"")
        if count:
            self._row[C_LOCAL_CLEARS] += 1

    # ------------------------------------------------------------------------------------------- compute

    def get_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                       ttl: float | None = None, stale_ttl: float | None = None) -> R:
        """The value of ``key``; on a miss everywhere, ``fn()``'s result, stored and returned, with ``fn`` run once
        for the whole fleet: one process per host asks Redis (the host's single-flight), and one host computes
        while the others wait for its result (``lease.py``: a Redis lock with an owner token, renewed while the
        host lives; if it dies, its lock expires after ``lock_lease`` and a waiting host takes over). ``timeout``
        bounds the wait for another computation (ComputeTimeout; None: no bound, else a finite number of
        seconds). With Redis unavailable, the host computes on its own (``strict``: RemoteError).

        ``stale_ttl``: serve stale while one host refreshes, as ``SharedCache.get_or_compute`` does on one host.
        The result is written to live ``ttl + stale_ttl`` in Redis; once no more than ``stale_ttl`` of that is left
        it is stale, and every call on every host gets it at once (the host's copy, or Redis's) while one process
        of one host computes the next value in a background thread: its host's claim taken without waiting, then
        Redis looked at (a value another host refreshed is copied, and nothing computed), then the fleet's compute
        lock taken without waiting (a host that holds it is refreshing). A refresh that raises is logged (logger
        ``shmcache``) and counted; the stale value is served on until its window ends. ``stats()`` counts
        ``stale_hits``, ``refreshes`` and ``refresh_failures``. A host's copy lives at most ``max_age``: with a
        ``max_age`` shorter than ``stale_ttl`` a copy cannot tell a fresh value from a stale one, and each stale-
        looking hit looks in Redis in the background.

        :raises ValueError: for a ``stale_ttl`` that is not a number of seconds from 0, or one given for a value
            that would never expire (no ``ttl``, no ``default_ttl``).
        """
        self._check_open()
        seconds("timeout", timeout, none=True, zero=True)
        stale_ms, ttl = self._stale(ttl, stale_ttl)
        lkey = KindKey(self._n, key)
        value = self.local.get(lkey, MISSING)
        if value is not MISSING:
            self._row[C_LOCAL_HITS] += 1
            if stale_ms:
                self._refresh_if_stale(key, fn, ttl, stale_ms)
            return value
        value = self._get_or_compute_missed(key, lkey, fn, timeout, ttl)
        if stale_ms:
            self._refresh_if_stale(key, fn, ttl, stale_ms)  # (Redis's value may be stale: this host had none)
        return value

    def _get_or_compute_missed(self, key: Any, lkey: KindKey, fn: Callable[[], R], timeout: float | None,
                               ttl: float) -> R:
        """get_or_compute after a local miss: the host's claim, then Redis, or the fleet's computation."""
        self._row[C_LOCAL_MISSES] += 1
        kb = encode_key(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        fp = fingerprint(self._kprefix + kb)
        claim = flight.Claim()  # before anything is taken: ``finally`` always releases it (see flight.py)
        look = _RedisLook(self._lease_ms)

        def stored() -> bool:
            return lkey in self.local or (look.due() and self._run(self._look(kb, look)))

        try:
            describe = partial(self._local.guard.run, flight.open_description, self._local.seg.fd)
            waited = claim.take(describe, fp, timeout, stored)
            if look.value is not MISSING:  # Redis had it (another host's): counted as a remote hit
                return look.value
            if look.lapsed:  # the claim's holder computes nothing the fleet can see: its lock decides from here
                return self._run(self._compute(key, kb, fn, deadline, ttl, True))
            if waited:  # another process of this host fetched or computed it meanwhile
                value = self.local.get(lkey, MISSING)
                if value is not MISSING:
                    self._hit_after_all()
                    return value
                if not claim.held:  # gone again: wait for the claim itself this time
                    claim.take(describe, fp, timeout)
            return self._run(self._compute(key, kb, fn, deadline, ttl, True))
        finally:
            claim.release()

    def _stale(self, ttl: float | None, stale_ttl: float | None) -> tuple[int, float]:
        """(the stale window in ms, 0 for none; the ttl to store a result with: ``ttl + stale_ttl`` where there is
        a window, else ``ttl``), both checked (ValueError: as ``get_or_compute`` says)."""
        ttl = self._ttl(ttl)
        if stale_ttl is None or not seconds("stale_ttl", stale_ttl, zero=True):
            return 0, ttl
        if not ttl:
            raise ValueError("stale_ttl needs a time to live for the value: pass ttl= (or give the TieredCache a "
                             "default_ttl=)")
        ttl_ns(ttl + stale_ttl)  # (refuses a sum beyond the range)
        return max(1, round(stale_ttl * 1000)), ttl + stale_ttl

    def _refresh_if_stale(self, key: Any, fn: Callable[[], Any], ttl: float, stale_ms: int) -> None:
        """If this host's copy of ``key`` has at most the stale window left: counted, and a background refresh
        queued (one at a time per key in this process: ``refresh.Refreshes``)."""
        lkb = self._local_key(key)
        fp = fingerprint(lkb)
        left = self._local.guard.run(self._local.store.time_left, lkb, fp)
        if not left or left > stale_ms * 1_000_000:  # fresh, never expiring, or gone since
            return
        self._row[C_STALE_HITS] += 1
        self._refreshes.start(fp, partial(self._refresh, key, fn, ttl, stale_ms))

    def _refresh(self, key: Any, fn: Callable[[], Any], ttl: float, stale_ms: int) -> None:
        """The background refresh of ``key``'s stale value (a refresh thread's): this host's claim taken without
        waiting (another process of the host that holds it fetches or refreshes instead), the copy looked at again,
        then ``lease.refresh``. Never raises: what fails is logged, and the stale value is served on."""
        lkb = self._local_key(key)
        fp = fingerprint(lkb)
        claim = flight.Claim()
        try:
            describe = partial(self._local.guard.run, flight.open_description, self._local.seg.fd)
            if not claim.try_take(describe, fp):
                return
            left = self._local.guard.run(self._local.store.time_left, lkb, fp)
            if left is not None and (left == 0 or left > stale_ms * 1_000_000):
                return  # refreshed meanwhile (by a process of this host, or a copy of another host's)
            self._run(lease.refresh(self._remote, self._fetch, self._put_computed, self._row, self._lease_ms, key,
                                    lkb[2:], fn, ttl, stale_ms))
        except (ClosedError, ReentrantCallError):
            pass  # closed meanwhile, or the caller's own call computes the key: the next stale call refreshes it
        except Exception as exc:  # the function raised, or Redis or the cache failed: said, never raised in a thread
            _log.warning("shmcache tier %r: the refresh of the stale value of key %r failed; the stale value is "
                         "served until its stale_ttl ends", self.namespace, key, exc_info=exc)
        finally:
            claim.release()

    def _hit_after_all(self) -> None:
        self._row[C_LOCAL_MISSES] -= 1  # counted as a hit after all, as SharedCache does
        self._row[C_LOCAL_HITS] += 1

    def _compute(self, key, kb: bytes, fn, deadline, ttl: float, blocking: bool):
        """get_or_compute's fleet-wide part, with this host's claim held: ``lease.compute``, or, with Redis down,
        ``fn()`` on this host alone (``strict``: RemoteError)."""
        try:
            return (yield from lease.compute(self._remote, self._fetch, self._put_computed, self._row, self._lease_ms,
                                             key, kb, fn, deadline, ttl, blocking))
        except lease.RedisDown as down:  # Redis failed; fn's own exceptions, RemoteError included, pass
            if self.strict:
                raise down.error from None
        self._row[C_COMPUTATIONS] += 1
        value = yield CALL, fn
        yield from self._put_computed(key, value, ttl)
        return value

    @overload
    def memoize(self, fn: Callable[P, R], *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (), stale_ttl: float | None = None) -> Memoized[P, R]: ...

    @overload
    def memoize(self, fn: None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (), stale_ttl: float | None = None,
                ) -> Callable[[Callable[P, R]], Memoized[P, R]]: ...

    def memoize(self, fn: Callable[P, R] | None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (), stale_ttl: float | None = None,
                ) -> Memoized[P, R] | Callable[[Callable[P, R]], Memoized[P, R]]:
        """``SharedCache.memoize`` over the fleet: each result computed once by the whole fleet
        (``get_or_compute``, whose ``stale_ttl`` it takes); ``cache_clear`` clears it on every host and in
        Redis."""
        seconds("timeout", timeout, none=True, zero=True)

        def decorate(f: Callable[P, R]) -> Memoized[P, R]:
            return memo.memoized(self, memo.Family(self._count_prefix, self._clear_prefix, self._maxsize), f,
                                 name, timeout, ttl, key, ignore, stale_ttl)

        return decorate if fn is None else decorate(fn)

    def _clear_prefix(self, prefix: bytes) -> int:
        return self._run(self._delete_prefix(prefix))

    # ------------------------------------------------------------------------------------------- asyncio

    # The same operations, awaited: a local hit as SharedCache.aget (no thread), each Redis call through redis-py's
    # asyncio client of the running loop, each locked call on the local cache through its ``acall`` (in a worker
    # thread only when its lock is busy), a wait for another computation with ``asyncio.sleep``. A handle made with
    # a redis-py client and no ``async_remote`` makes its Redis calls in a worker thread. Cancellation at any await
    # leaves no claim, no compute lock (its renewing thread releases it) and nothing half-stored: a fill cut short
    # leaves only its mark, which expires.

    async def _acheck_open(self) -> None:
        if self._state is not _READY:
            await asyncio.to_thread(self._revive)  # a forked child's first call starts its listener: not on the loop

    async def aget(self, key: Any, default: Any = None) -> Any:
        """``get``, awaitable."""
        if self._state is not _READY:
            await self._acheck_open()
        lkb = self._local_key(key)
        value = await self.local.aget(EncodedKey(lkb), MISSING)
        if value is not MISSING:
            self._row[C_LOCAL_HITS] += 1
            return value
        return await self._arun(self._get_remote(lkb[2:], default))

    async def _a(self, steps) -> Any:
        await self._acheck_open()
        return await self._arun(steps)

    async def aput(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """``put``, awaitable."""
        return await self._a(self._put(key, value, ttl))

    async def aadd(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """``add``, awaitable."""
        return await self._a(self._write(key, value, ttl, "add"))

    async def areplace(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """``replace``, awaitable."""
        return await self._a(self._write(key, value, ttl, "replace"))

    async def acas(self, key: Any, value: Any, version: int, ttl: float | None = None) -> bool:
        """``cas``, awaitable."""
        return await self._a(self._cas(key, value, version, ttl))

    async def aincr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``incr``, awaitable."""
        return await self._a(self._incr(key, delta, initial))

    async def adecr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``decr``, awaitable."""
        return await self._a(self._decr(key, delta, initial))

    async def adelete(self, key: Any) -> bool:
        """``delete``, awaitable."""
        return await self._a(self._delete(key))

    async def apop(self, key: Any, default: Any = MISSING) -> Any:
        """``pop``, awaitable."""
        return await self._a(self._pop(key, default))

    async def atouch(self, key: Any, ttl: float | None = None) -> bool:
        """``touch``, awaitable."""
        return await self._a(self._touch(key, ttl))

    async def acontains(self, key: Any) -> bool:
        """``key in tier``, awaitable."""
        return await self._a(self._contains(key))

    async def aget_with_version(self, key: Any, default: Any = None) -> tuple[Any, int | None]:
        """``get_with_version``, awaitable."""
        return await self._a(self._get_with_version(key, default))

    async def aget_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """``get_many``, awaitable."""
        return await self._a(self._get_many(list(keys), default))

    async def aput_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
                        ttl: float | None = None) -> None:
        """``put_many``, awaitable."""
        await self._a(self._put_many(dict(items) if isinstance(items, Mapping) else list(items), ttl))

    async def aclear(self) -> int:
        """``clear``, awaitable."""
        return await self._a(self._delete_prefix(b""))

    @overload
    async def aget_or_compute(self, key: Any, fn: Callable[[], Awaitable[R]], *,  # type: ignore[overload-overlap]
                              timeout: float | None = None, ttl: float | None = None,
                              stale_ttl: float | None = None) -> R: ...

    @overload
    async def aget_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> R: ...

    async def aget_or_compute(self, key: Any, fn: Callable[[], Any], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> Any:
        """``get_or_compute``, awaitable: ``fn`` may be a coroutine function (or return an awaitable); the waits for
        another process's or host's computation never block the loop, and a stale value's refresh (``stale_ttl``)
        is a task of the running loop. The same stats, timeout and errors."""
        await self._acheck_open()
        seconds("timeout", timeout, none=True, zero=True)
        stale_ms, ttl = self._stale(ttl, stale_ttl)
        lkey = KindKey(self._n, key)
        value = await self.local.aget(lkey, MISSING)
        if value is not MISSING:
            self._row[C_LOCAL_HITS] += 1
            if stale_ms:
                await self._arefresh_if_stale(key, fn, ttl, stale_ms)
            return value
        value = await self._aget_or_compute_missed(key, lkey, fn, timeout, ttl)
        if stale_ms:
            await self._arefresh_if_stale(key, fn, ttl, stale_ms)
        return value

    async def _arefresh_if_stale(self, key: Any, fn: Callable[[], Any], ttl: float, stale_ms: int) -> None:
        """``_refresh_if_stale``, its refresh a task of the running loop (``_arefresh``)."""
        lkb = self._local_key(key)
        fp = fingerprint(lkb)
        left = await self.local.acall(self._local.guard.run, self._local.store.time_left, lkb, fp)
        if not left or left > stale_ms * 1_000_000:
            return
        self._row[C_STALE_HITS] += 1
        self._refreshes.start_task(fp, partial(self._arefresh, key, fn, ttl, stale_ms))

    async def _arefresh(self, key: Any, fn: Callable[[], Any], ttl: float, stale_ms: int) -> None:
        """``_refresh`` as a task of the caller's loop: ``fn`` may be a coroutine function."""
        lkb = self._local_key(key)
        fp = fingerprint(lkb)
        claim = flight.Claim()
        try:
            claim.adopt(await self.local.acall(self._local.guard.run, flight.open_description, self._local.seg.fd))
            claim.refuse_nested(fp)
            if not claim.lock_nowait(fp):
                return
            left = await self.local.acall(self._local.guard.run, self._local.store.time_left, lkb, fp)
            if left is not None and (left == 0 or left > stale_ms * 1_000_000):
                return
            await self._arun(lease.refresh(self._remote, self._fetch, self._put_computed, self._row, self._lease_ms,
                                           key, lkb[2:], fn, ttl, stale_ms, False))
        except (ClosedError, ReentrantCallError):
            pass
        except Exception as exc:
            _log.warning("shmcache tier %r: the refresh of the stale value of key %r failed; the stale value is "
                         "served until its stale_ttl ends", self.namespace, key, exc_info=exc)
        finally:
            claim.release()

    async def _aget_or_compute_missed(self, key: Any, lkey: KindKey, fn: Callable[[], Any], timeout: float | None,
                                      ttl: float) -> Any:
        """aget_or_compute after a local miss: the host's claim, then Redis, or the fleet's computation."""
        self._row[C_LOCAL_MISSES] += 1
        kb = encode_key(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        fp = fingerprint(self._kprefix + kb)
        local = self.local

        async def describe():
            return await local.acall(self._local.guard.run, flight.open_description, self._local.seg.fd)

        look = _RedisLook(self._lease_ms)

        async def stored() -> bool:  # (the cache looked at only when looking cannot wait for the lock)
            if local.lock_free() and lkey in local:
                return True
            return look.due() and await self._arun(self._look(kb, look))

        claim = flight.Claim()  # before anything is taken: ``finally`` always releases it (see flight.py)
        try:
            waited = await aio.take(claim, fp, timeout, describe, stored)
            if look.value is not MISSING:  # Redis had it (another host's): counted as a remote hit
                return look.value
            if look.lapsed:  # the claim's holder computes nothing the fleet can see: its lock decides from here
                return await self._arun(self._compute(key, kb, fn, deadline, ttl, False))
            if waited:  # another process of this host fetched or computed it meanwhile
                value = await local.aget(lkey, MISSING)
                if value is not MISSING:
                    self._hit_after_all()
                    return value
                if not claim.held:  # gone again: wait for the claim itself this time
                    await aio.take(claim, fp, timeout, describe, None)
            return await self._arun(self._compute(key, kb, fn, deadline, ttl, False))
        finally:
            claim.release()

    def amemoize(self, fn: Callable[..., Awaitable[R]] | None = None, *, name: str | None = None,
                 timeout: float | None = None, ttl: float | None = None, key: Callable[..., Any] | None = None,
                 ignore: str | Iterable[str] = (), stale_ttl: float | None = None) -> Any:
        """``memoize`` for a coroutine function, over the fleet (``aget_or_compute``); its results are shared with a
        ``memoize`` of the same ``name``."""
        return aio.amemoize(self, fn, name=name, timeout=timeout, ttl=ttl, key=key, ignore=ignore,
                            stale_ttl=stale_ttl)

    async def aclose(self) -> None:
        """Cancel this handle's stale refreshes running as tasks of the running loop (``aget_or_compute``'s
        ``stale_ttl``) and wait for them, close the loop's asyncio client of Redis, then ``close()``. (A loop's
        client is also dropped when the loop is; closing it here spares its connections the wait for the garbage
        collector.) A refresh cancelled so releases its claims; the next stale call on any host refreshes."""
        await self._refreshes.acancel()
        await self._remote.aclose()
        self.close()

    # ------------------------------------------------------------------------------------------- invalidations

    def _listen(self) -> None:
        """Start this process's listener thread (it listens if it wins the host's election), and wait, briefly, for
        it to settle."""
        if self._listener_box[0] is None and self._state is not _CLOSED:
            listener = Listener(self._local.seg.fd, LISTENER_BASE + self._n, weakref.ref(self), _LISTENER_CALLS)
            self._listener_box[0] = listener
            # Why wait: the first subscription on a host begins with a gap that drops the namespace's copies, so a
            # put made before it would lose its copy, and the get after it would go to Redis. Settling takes one
            # connection and one SUBSCRIBE (or the failure of either, bounded by the Redis timeout), or nothing at
            # all when another process already listens; the wait is capped all the same.
            listener.settled.wait(min(SETTLE_WAIT_S, 2 * self._settings["timeout"] + 1.0))

    def _subscribe(self):
        """The listener's subscription to the namespace's channel, with Redis's tracking of the namespace's keys
        where the server has it (``listener.Subscription``); without (a cluster, a Redis before 6, a server that
        refuses it), the channel's alone, and another client's writes reach the copies only through ``max_age``."""
        client = self._remote.client
        tracked = resp2_client(client, SILENCE_S)
        if tracked is not None:
            try:
                pubsub = tracked.pubsub()
                pubsub.execute_command("CLIENT", "ID")  # (before the subscription: RESP2 allows it only then)
                client_id = pubsub.parse_response(block=True, timeout=self._settings["timeout"] * 10 + 1)
                pubsub.subscribe(self._remote.channel, TRACKING_CHANNEL)
                tracker = redis_py().Redis(connection_pool=tracked.connection_pool, single_connection_client=True)
                tracker.execute_command("CLIENT", "TRACKING", "ON", "REDIRECT", client_id, "BCAST", "PREFIX",
                                        self._remote.prefix)
                return Subscription(pubsub, tracker, tracked.connection_pool)
            except BaseException as exc:
                tracked.connection_pool.disconnect()
                if not isinstance(exc, redis_py().ResponseError):
                    raise  # (the connection failed: the listener subscribes again, after a pause)
                # The server has no tracking: the channel alone.
                listener_log.info("shmcache: Redis refused to track namespace %r (%s): another client's writes reach "
                                  "this host's copies only through max_age", self.namespace, exc)
        pubsub = client.pubsub()
        pubsub.subscribe(self._remote.channel)
        return pubsub

    def _on_gap(self) -> None:
        self._run(self._clear_local())

    def _on_listening(self) -> None:
        self._row[C_LISTENER_STARTS] += 1

    def _on_tracked(self, keys: list) -> None:
        """Apply a tracking invalidation: the Redis keys of the namespace that another client (or this tier, or
        Redis itself: an expiry, an eviction) changed. It names no version, so each key's is read from Redis
        (``remote.version_at``), and the copies older than it go, as a message of the tier's own drops them: a
        host keeps the copy it has just written, and drops one whose key is gone or holds another client's value."""
        prefix, client = self._remote.prefix, self._remote.client  # (version_at: any failure is a dropped copy)
        for key in keys:
            if type(key) is not bytes or not key.startswith(prefix):
                continue
            # (namespace "a" is told of namespace "a:b"'s keys too, "shmcache:a:b:..." as key "b:..." of its own:
            # applied with that key's version, at worst it drops a copy, or refuses a fill, of a key of its own)
            self._run(self._drop_older(key[len(prefix):], version_at(client, key)))
            self._row[C_INVALIDATIONS] += 1

    def _on_message(self, data) -> None:
        """Apply an invalidation message. One that is not valid is refused (counted in remote_errors, logged at most
        every minute) and never adopted: a key's with a version out of range drops that key's copy and mark; one
        whose key cannot be told drops the namespace's copies (a gap)."""
        if type(data) is not bytes or len(data) < MESSAGE_HEADER.size or data[:1] not in (OP_KEY, OP_CLEAR):
            self._remote.refused("message", "an invalidation of namespace %r is not valid (%r); the namespace's "
                                 "copies are dropped", self.namespace, data[:MESSAGE_HEADER.size + 16])
            self._on_gap()
            return
        op, version = MESSAGE_HEADER.unpack_from(data)
        kb = data[MESSAGE_HEADER.size:]
        if op == OP_CLEAR:
            self._run(self._clear_local(kb))
            return
        try:
            version = remote_version(version)
        except ValueError as exc:
            self._remote.refused("message", "an invalidation of key %r of namespace %r is not valid (%s); the key's "
                                 "copy is dropped", kb, self.namespace, exc)
            version = UNKNOWN_VERSION
        # This host's own writes come back too: they drop nothing (the writer's copy has the version named).
        self._run(self._drop_older(kb, version))
        self._row[C_INVALIDATIONS] += 1

    # ------------------------------------------------------------------------------------------- the rest

    def stats(self) -> TierStats:
        """This host's counts for the namespace (every process's), with remote latency percentiles."""
        self._check_open()
        local = self._kind.stats()
        listener = self._listener_box[0]
        listening = ofd.held_elsewhere(self._local.seg.fd, LISTENER_BASE + self._n) or bool(
            listener and listener.leading)
        return self._rows.stats(self.namespace, local.entries, local.retained_bytes, listening)

    def limits(self) -> CacheLimits:
        """The local cache's limits (Redis's are its own ``maxmemory``)."""
        return self.local.limits()

    def set_limits(self, limits: CacheLimits | None = None, **kwargs: int | None) -> None:
        """The local cache's ``set_limits``."""
        self.local.set_limits(limits, **kwargs)

    def _check_open(self) -> None:
        if self._state is not _READY:
            self._revive()

    def _revive(self) -> None:
        """The slow entry: refuse a closed handle; in a forked child, start its standby listener first."""
        if self._state is _CLOSED:
            raise ClosedError("this TieredCache is closed", what="access", hint="open a new one")
        self._state = _READY
        self._listen()

    def close(self) -> None:
        """Stop this process's listener and release its stats row; the local cache and a client passed in stay
        open (they are the caller's). Later calls raise ClosedError."""
        if self._state is _CLOSED:
            return
        self._state = _CLOSED
        _handles.pop(id(self), None)
        self._finalizer()
        self._row = self._rows.row  # the private row close() left: late counts go nowhere
        if self._owns_local:
            self.local.close()

    def unlink(self) -> None:
        """Remove the host's stats segment of this namespace (the local cache and Redis are untouched)."""
        self._rows.unlink()

    def __enter__(self: _TC) -> _TC:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.namespace!r}, local={self.local.name!r})"

    def __reduce__(self) -> tuple[Callable[..., TieredCache], tuple[Any, ...]]:
        """Pickles as its settings (the local cache by name, Redis by URL), for "spawn" workers: the copy opens its
        own handle, as a SharedCache's does."""
        if self._url is None:
            raise TypeError("a TieredCache made with a redis-py client cannot be pickled: pass a URL instead")
        return _reopen, (self.local, self._url, self._settings)

    def _after_fork_in_child(self) -> None:
        # Order: what could leave the child stuck (a lock held at the fork, a listener role it cannot serve) first;
        # the stats row last (its failure leaves a private row: see _after_fork_in_child below).
        self._remote.after_fork_in_child()
        listener = self._listener_box[0]
        self._listener_box[0] = None
        if listener is not None:
            listener.after_fork_in_child()
        self._rows.after_fork_in_child()
        self._row = self._rows.row
        if self._state is _READY:
            # The child's standby listener starts on its first call (get included): not here, where a thread
            # would start in every forked child, those about to exec too.
            self._state = _FORKED


def _absent(key, default):
    """What pop returns for an absent key: ``default``, or KeyError without one (as dict.pop)."""
    if default is MISSING:
        raise KeyError(key)
    return default


def _release(listener_box: list, rows: Rows, remote: Remote, owns_client: bool) -> None:
    if listener_box[0] is not None:
        listener_box[0].close()
        listener_box[0] = None
    rows.close()
    if owns_client:
        remote.close()


_reopened: dict = {}


def _reopen(local: SharedCache, url: str, settings: dict[str, Any]) -> TieredCache:
    """The unpickled TieredCache: one per process for the same settings, however often it is unpickled (a task
    argument is, once per task). Unpickling opened ``local`` anew: the handle kept owns it."""
    key = (os.getpid(), local.name, url, tuple(sorted(settings.items())))
    tier = _reopened.get(key)
    if tier is not None and tier._state is not _CLOSED:
        local.close()
        return tier
    tier = _reopened[key] = TieredCache(local, url, **settings)
    tier._owns_local = True
    return tier


def host_stats(cache_name: str, namespace: str, *, mode: int = 0o600, trust_owner=None,
               timeout: float = DEFAULT_LOCK_TIMEOUT) -> TierStats:
    """The stats of a namespace on this host, read from outside (``shmcache tier``): no Redis, no row claimed.
    ``mode`` and ``trust_owner`` are those of ``SharedCache``, for the cache and the stats segment alike;
    ``timeout`` bounds the waits for the local cache's creation and its lock.

    :raises FileNotFoundError: if the cache or the namespace's stats segment does not exist.
    :raises OwnershipError: if either is refused (see ``SharedCache``).
    :raises LockTimeout: if the local cache's lock did not come within ``timeout``.
    """
    rows = Rows(cache_name, namespace, Trust.of(mode, trust_owner), claim=False, timeout=timeout)
    opening = dict(create=False, mode=mode, trust_owner=trust_owner, lock_timeout=timeout, attach_timeout=timeout)
    try:
        try:
            local = SharedCache(cache_name, **opening)
        except SerializerMismatch as exc:  # a pickle cache, opened as one: nothing here reads a value
            local = SharedCache(cache_name, serializer=exc.found, **opening)
        with local:
            kinds = local.stats().kinds
            kind = kinds.get(f"tier:{namespace}")
            number = list(kinds).index(f"tier:{namespace}") + 1 if kind else 0
            listening = bool(number) and ofd.held_elsewhere(parts(local).seg.fd, LISTENER_BASE + number)
            return rows.stats(namespace, kind.entries if kind else 0, kind.retained_bytes if kind else 0, listening)
    finally:
        rows.close()


# Keyed by id(): a TieredCache is a mapping, so unhashable (mapping.py).
SETTLE_WAIT_S = 5.0  # the most a new handle waits for its listener's first subscription (see TieredCache._listen)

_handles: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _after_fork_in_child() -> None:
    for handle in list(_handles.values()):
        try:
            handle._after_fork_in_child()
        except Exception:  # the child must not count in its parent's row, nor fail its fork
            handle._row = handle._rows.row = memoryview(bytearray(1024)).cast("q")


os.register_at_fork(after_in_child=_after_fork_in_child)


# The listener's calls on its TieredCache (it holds the handle weakly, so that a handle never closed is collected).
_LISTENER_CALLS = Calls(TieredCache._subscribe, TieredCache._on_message, TieredCache._on_gap, TieredCache._on_listening,
                        TieredCache._on_tracked)
