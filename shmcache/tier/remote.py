"""The Redis side of a ``TieredCache``: key names, the value format, the scripts that write and publish, the
fleet-wide compute lock, and containment of a slow or absent Redis.

Every write is one Lua script on the node that owns the key: it assigns the version, writes, and publishes the
invalidation, atomically, so no host can see a new value without its invalidation having been sent. Each script
touches one key, so every command of a namespace goes to the slot of its own key and the same code serves Redis
Cluster (no multi-key command crosses slots; a clear scans each primary). Failures are contained here: a call that
fails or times out is counted, logged once per outage, and turned into ``RemoteError``; after such a failure Redis is
not asked again for ``retry_interval`` seconds (calls are counted as skipped), so a dead Redis costs each process
one timeout per interval, not one per call.

The caller passes the stats row of its process (``stats.py``); nothing here takes the local cache's lock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
import urllib.parse
import weakref
from typing import Any

from ..codec import xxh3 as _xxh
from ..errors import RemoteError
from ..layout.dtypes import MAX_REMOTE_VERSION
from .steps import REDIS
from .layout import (
    C_LATENCY, C_REMOTE_CALLS, C_REMOTE_ERRORS, C_REMOTE_NS, C_REMOTE_SKIPPED, C_REMOTE_TIMEOUTS, LATENCY_BUCKETS,
    F_EXPIRES, F_KNOWN, LATENCY_PER_OCTAVE, MESSAGE_HEADER, OP_CLEAR, PAYLOAD_HEADER, REMOTE_HEADER, REMOTE_MAGIC,
)

log = logging.getLogger("shmcache.tiered")

KEY_PREFIX = b"shmcache:"
LOCK_PREFIX = b"shmcache-lock:"
_MASK64 = (1 << 64) - 1
_HEADER_ROOM = bytes(REMOTE_HEADER.size)
# TCP keepalive: probe after 5 s of silence, every 2 s, give up after 3 unanswered (about 11 s in all).
_KEEPALIVE = {socket.TCP_KEEPIDLE: 5, socket.TCP_KEEPINTVL: 2, socket.TCP_KEEPCNT: 3}
# Error replies that mean Redis cannot serve for now, as a refused connection does: an outage (with the classes of
# _outage_classes, which redis-py raises for some of them with the code stripped from the message).
_OUTAGE_REPLIES = ("READONLY", "OOM", "CLUSTERDOWN", "MASTERDOWN", "LOADING", "TRYAGAIN", "BUSY", "MISCONF",
                   "NOREPLICAS")
LOG_EVERY_S = 60.0  # an error that is not an outage is logged at most this often per kind
CLEAR_BATCH = 500  # keys deleted per command while clearing

_LUA_MAGIC = "".join(f"\\{b:03d}" for b in REMOTE_MAGIC)
# Shared by the scripts that change a key: the key's current version (0 when absent or foreign) and the next one.
_LUA_VERSION = f"""
local head = redis.call('GETRANGE', KEYS[1], 0, {REMOTE_HEADER.size - 1})
local exists = redis.call('EXISTS', KEYS[1]) == 1
local old, oldflags = 0, 0
if #head == {REMOTE_HEADER.size} and string.sub(head, 1, 3) == '{_LUA_MAGIC}' then
  old, oldflags = struct.unpack('<dB', head, 4)
end
-- A version out of range (crafted, damaged: NaN, inf, fractional, huge) is no version: the key starts afresh from
-- the clock, instead of carrying it on. Unknown flag bits: whether it expires is asked of Redis.
if old ~= old or old < 1 or old > {MAX_REMOTE_VERSION} or old % 1 ~= 0 then old = 0 end
if oldflags ~= 0 and oldflags ~= {F_EXPIRES} then oldflags = {F_EXPIRES} end
local t = redis.call('TIME')
local v = math.max(old + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
"""
_LUA_PUBLISH = "redis.call('PUBLISH', ARGV[1], 'k' .. struct.pack('<d', v) .. ARGV[2])"

# KEYS: value key. ARGV: channel, encoded key, the value with room for its header, ttl ms (0: none, -1: keep),
# mode, expected version.
_WRITE = _LUA_VERSION + f"""
local mode = ARGV[5]
if (mode == 'add' and exists) or (mode == 'replace' and not exists)
   or (mode == 'cas' and (not exists or old ~= tonumber(ARGV[6]))) then
  return false
end
local ttl = tonumber(ARGV[4])
local flags = 0
if ttl > 0 then flags = {F_EXPIRES} elseif ttl < 0 then flags = oldflags end
-- Why SET then SETRANGE, not one SET of the header joined to the value: a join copies the value once more inside
-- Lua, which cost 270 us for 150 KB. The client leaves room for the header at the front.
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ttl)
elseif ttl == 0 then
  redis.call('SET', KEYS[1], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
end
redis.call('SETRANGE', KEYS[1], 0, '{_LUA_MAGIC}' .. struct.pack('<dB', v, flags))
{_LUA_PUBLISH}
return v
"""
# KEYS: value key. ARGV: channel, encoded key, '1' to return the value removed.
_DELETE = _LUA_VERSION + f"""
if not exists then return false end
local blob = false
if ARGV[3] == '1' then blob = redis.call('GET', KEYS[1]) end
redis.call('DEL', KEYS[1])
{_LUA_PUBLISH}
if blob then return {{v, blob}} end
return v
"""
# KEYS: value key. ARGV: channel, encoded key, ttl ms (0: none). A touch is a new version: copies read
# before it carry the old time to live.
_TOUCH = _LUA_VERSION + f"""
if not exists then return false end
local flags = 0
if tonumber(ARGV[3]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  flags = {F_EXPIRES}
else
  redis.call('PERSIST', KEYS[1])
end
if old > 0 then redis.call('SETRANGE', KEYS[1], 3, struct.pack('<dB', v, flags)) end
{_LUA_PUBLISH}
return v
"""
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"


def redis_py():
    """The redis module; ImportError, naming the extra to install, without it."""
    try:
        import redis
    except ImportError:
        raise ImportError('the Redis tier needs redis-py: pip install "shmcache[redis]"') from None
    return redis


def check_url(url: str) -> None:
    """Refuse, when a TieredCache is made, a Redis URL that could never connect: an unknown scheme, a port that is
    not a number from 1 to 65535, a database that is not a number, a unix URL without a path, an option that
    redis-py cannot read. Such a URL is a mistake to report at once, not an outage to ride out.

    :raises ValueError: saying what is wrong (the URL is shown without its password).
    """
    parts = urllib.parse.urlsplit(url)
    shown = repr(url) if "@" not in url else repr(f"{parts.scheme}://...@{url.rsplit('@', 1)[1]}")  # no password
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"remote must be a redis://, rediss:// or unix:// URL, got {shown}")
    try:
        port = parts.port  # ValueError for a port out of range or not a number
        redis_py().connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"remote {shown} is not a valid Redis URL: {exc}") from None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"remote {shown} names no socket path")
        return
    if port == 0:
        raise ValueError(f"remote {shown} has port 0: name the port Redis listens on (6379 by default)")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ValueError(f"remote {shown}: the database after the host must be a number, got {db!r}")


def _cancelling() -> bool:
    """Whether the running task has a cancellation pending (Task.cancelling, Python 3.11; before it, never known)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() > 0


def _outage_classes(redis) -> tuple:
    """Error replies redis-py raises as classes of their own that mean Redis cannot serve for now."""
    names = ("ReadOnlyError", "OutOfMemoryError", "ClusterDownError", "TryAgainError", "MasterDownError")
    return tuple(c for c in (getattr(redis.exceptions, n, None) for n in names) if c is not None)


def connect(url: str, *, timeout: float, cluster: bool, asyncio: bool = False):
    """A redis-py client for ``url`` (``asyncio``: of redis-py's asyncio API) whose calls give up after ``timeout``
    seconds and are not retried by redis-py (this module decides when to ask again), except that a cluster client
    follows one redirection (a slot that moved: MOVED, ASK). Connections use TCP keepalive, so a peer that vanished
    without a word is noticed."""
    redis = redis_py()
    from redis.backoff import NoBackoff

    options: dict[str, Any] = dict(socket_timeout=timeout, socket_connect_timeout=timeout, socket_keepalive=True,
                                   socket_keepalive_options=_KEEPALIVE)
    if asyncio:
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry as AsyncRetry

        if cluster:
            return aredis.RedisCluster.from_url(url, retry=AsyncRetry(NoBackoff(), 1), **options)
        return aredis.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 0), **options)
    from redis.retry import Retry

    if cluster:
        return redis.RedisCluster.from_url(url, retry=Retry(NoBackoff(), 1), **options)
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)


def _check(kb: bytes, tag: int, body) -> int:
    """The payload checksum: xxh3 of the body, seeded with the key's hash and the tag, so it binds all three."""
    return _xxh(body, (_xxh(kb) + tag) & _MASK64)


def pack_payload(kb: bytes, tag: int, body) -> bytes:
    """What the client sends with a write: room for the header (the script writes it), tag, checksum, body."""
    return _HEADER_ROOM + PAYLOAD_HEADER.pack(tag, _check(kb, tag, body)) + body


UNKNOWN_VERSION = -1  # what a script replied instead of a valid version: the write happened, its version is unknown


def remote_version(v) -> int:
    """``v``, a version from Redis (a value's header, a script's reply, an invalidation), as an int.

    :raises ValueError: unless it is an integer from 1 to ``MAX_REMOTE_VERSION`` (a float that is one included).
    """
    if type(v) is float and v.is_integer():  # NaN and the infinities are not
        v = int(v)
    if type(v) is not int or not 1 <= v <= MAX_REMOTE_VERSION:
        raise ValueError(f"version {v!r} is not an integer from 1 to {MAX_REMOTE_VERSION}")
    return v


def unpack_value(kb: bytes, blob: bytes) -> tuple[int, int, memoryview]:
    """(version, tag, body) of a value read from Redis for the key ``kb``.

    :raises ValueError: if the blob is not a shmcache value of this format, is not this key's (checksum), or has a
        version or flags out of range.
    """
    start = REMOTE_HEADER.size + PAYLOAD_HEADER.size
    if len(blob) < start or blob[:3] != REMOTE_MAGIC:
        raise ValueError("not a shmcache value of this format (another writer, or another version of shmcache)")
    _, version, flags = REMOTE_HEADER.unpack_from(blob)
    tag, check = PAYLOAD_HEADER.unpack_from(blob, REMOTE_HEADER.size)
    body = memoryview(blob)[start:]
    if _check(kb, tag, body) != check:
        raise ValueError("checksum mismatch: the value was damaged, or written for another key")
    if flags & ~F_KNOWN:
        raise ValueError(f"flags {flags:#x} have bits this format does not define")
    return remote_version(version), tag, body


def resp2_client(client, timeout: float):
    """A redis-py client of the same server as ``client`` (a plain standalone ``redis.Redis``) whose connections
    speak RESP2 and give up after ``timeout`` seconds, at least, for a tracking subscription: a RESP2 connection
    receives a redirected invalidation as a message on ``__redis__:invalidate``, where a RESP3 one gets a push that
    redis-py's pub/sub does not hand out. None for a client of another kind (a cluster client: its tracking would
    have to be enabled on every primary). Why a timeout of its own: the tier's (0.1 s by default) suits a request,
    but a listener that gave up as soon would drop every copy of the host at each of Redis's slow moments."""
    redis = redis_py()
    pool = getattr(client, "connection_pool", None)
    if type(client) is not redis.Redis or pool is None:
        return None
    # (the notifications of a managed service's maintenance need RESP3: redis-py refuses them with RESP2)
    options = {k: v for k, v in pool.connection_kwargs.items() if not k.startswith("maint_notifications")}
    options["protocol"] = 2
    options["socket_timeout"] = max(options.get("socket_timeout") or 0.0, timeout)
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **options))


def version_at(client, key: bytes) -> int:
    """The version of the shmcache value at Redis key ``key``, read from its header alone (``GETRANGE``): what a
    tracking invalidation, which names the key but no version, is applied with. UNKNOWN_VERSION for a key that is
    gone or holds anything else (another client's value), or when Redis does not answer: every copy of it must go."""
    try:
        head = client.getrange(key, 0, REMOTE_HEADER.size - 1)
    except redis_py().RedisError:  # (dropping the copy is always right; a gap, every copy of the host, is not needed)
        return UNKNOWN_VERSION
    if len(head) < REMOTE_HEADER.size or head[:3] != REMOTE_MAGIC:
        return UNKNOWN_VERSION
    try:
        return remote_version(REMOTE_HEADER.unpack_from(head)[1])
    except ValueError:
        return UNKNOWN_VERSION


def _glob_escape(data: bytes) -> bytes:
    out = bytearray()
    for b in data:
        if b in b"*?[]\\":
            out.append(0x5C)
        out.append(b)
    return bytes(out)


_SCRIPTS = (_WRITE, _DELETE, _TOUCH, _UNLOCK, _RENEW)
S_WRITE, S_DELETE, S_TOUCH, S_UNLOCK, S_RENEW = range(len(_SCRIPTS))


class Remote:
    """One namespace of one Redis deployment, as this process talks to it.

    Its operations are written once, as generators of steps (``steps.py``): each Redis call is a ``(REDIS, what,
    fn)`` step, ``fn(client, scripts)`` making the call on a client and the scripts registered with it; the
    synchronous API runs them with redis-py's client (``call``), the asyncio API with its asyncio client
    (``acall``). Both count, time and contain the calls alike, and share one outage state."""

    def __init__(self, factory, namespace: str, rows, *, retry_interval: float, afactory=None) -> None:
        self._factory = factory  # () -> a redis-py client; called on first use, so a Redis down at start is contained
        # () -> a redis-py asyncio client, or None: the asyncio API then runs the synchronous calls in a thread
        self._afactory = afactory
        # "sync": (the client, the scripts registered with it), made on first use (_connection); a dict, so that the
        # first made is kept with one atomic setdefault
        self._made: dict[str, tuple[Any, list[Any]]] = {}
        # One asyncio client per event loop: an asyncio client's connections belong to the loop that made them.
        self._aclients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.ns = namespace.encode()
        self.prefix = KEY_PREFIX + self.ns + b":"
        self.lock_prefix = LOCK_PREFIX + self.ns + b":"
        self.channel = KEY_PREFIX + self.ns
        self.rows = rows  # rows.row is this process's stats row (it changes in a forked child)
        self.retry_interval = retry_interval
        self._down_until = 0.0
        # The outage state: "down" is in it while Redis is judged down (from the failure that opened the circuit to
        # the next call that succeeds). Kept in a dict so that each change is one atomic step (setdefault, pop) and
        # needs no lock: a lock an exception from a signal handler leaves held would stop every thread's calls
        # (memo.Tally says how CPython 3.14's ``with`` lets that happen).
        self._outage: dict[str, object] = {}
        self._logged: dict[str, float] = {}

    @property
    def client(self):
        """The redis-py client, made on first use (raises what making it raises, or RemoteError while Redis is
        in its retry interval)."""
        return self._connection()[0]

    def _connection(self) -> tuple[Any, list[Any]]:
        """(the redis-py client, the scripts registered with it), made on first use. Without a lock: threads that
        find none at once each make one, the first kept serves them all, and the others are closed at once (a
        redis-py client connects when first asked: they cost their objects alone)."""
        got = self._made.get("sync")
        if got is None:
            if self._skipping():
                raise RemoteError("Redis failed moments ago; not asked again yet", what="connect")
            client = self._factory()
            made = (client, [client.register_script(s) for s in _SCRIPTS])
            got = self._made.setdefault("sync", made)
            if got is not made:
                client.close()
        return got

    def _aclient(self, loop) -> tuple:
        """(the asyncio client of ``loop``, its scripts), made on first use in that loop."""
        got = self._aclients.get(loop)
        if got is None:
            if self._skipping():
                raise RemoteError("Redis failed moments ago; not asked again yet", what="connect")
            client = self._afactory()
            got = self._aclients[loop] = (client, [client.register_script(s) for s in _SCRIPTS])
        return got

    def _skipping(self) -> bool:
        return "down" in self._outage and time.monotonic() < self._down_until

    def after_fork_in_child(self) -> None:
        self._aclients = weakref.WeakKeyDictionary()  # the parent's loops do not run here

    def close(self) -> None:
        got = self._made.get("sync")
        if got is not None:
            got[0].close()
        # The asyncio clients' connections go with their loops (a loop not running cannot close them).
        self._aclients = weakref.WeakKeyDictionary()

    async def aclose(self) -> None:
        """Close the running loop's asyncio client, if it made one."""
        got = self._aclients.pop(asyncio.get_running_loop(), None)
        if got is not None:
            await got[0].aclose()

    # --------------------------------------------------------------------------- containment

    def _skipped(self, what: str) -> RemoteError:
        self.rows.row[C_REMOTE_SKIPPED] += 1
        return RemoteError(f"Redis failed less than {self.retry_interval:g} s ago; not asked again yet",
                           what=what, hint="the cache retries by itself; see the log for the failure")

    def call(self, what: str, fn):
        """``fn(client, scripts)``, timed and counted; a failure becomes RemoteError."""
        if self._skipping():
            raise self._skipped(what)
        t0 = time.perf_counter_ns()
        try:
            result = fn(*self._connection())
        except RemoteError:
            self.rows.row[C_REMOTE_SKIPPED] += 1  # from ``client``: the circuit opened while this thread waited
            raise
        except Exception as exc:  # whatever redis-py raises (its own errors, OSError, and its bugs) is contained
            raise self._contained(what, exc) from exc
        self._done(t0)
        return result

    async def acall(self, what: str, fn):
        """``call``, awaited: ``fn`` given this loop's asyncio client, or, without an asyncio client (a client
        passed in), ``call`` in a worker thread. A cancellation passes through, uncounted."""
        if self._afactory is None:
            return await asyncio.to_thread(self.call, what, fn)
        if self._skipping():
            raise self._skipped(what)
        t0 = time.perf_counter_ns()
        try:
            client, scripts = self._aclient(asyncio.get_running_loop())
            result = await fn(client, scripts)
        except RemoteError:
            self.rows.row[C_REMOTE_SKIPPED] += 1
            raise
        except Exception as exc:
            # A client cut short by this task's cancellation may raise an error of its own instead (a connection
            # closed under it, a timeout that took the cancellation for its own): the cancellation, never a Redis
            # failure, else the caller would go on without Redis (a computation of its own) and return.
            if _cancelling():
                raise asyncio.CancelledError() from exc
            raise self._contained(what, exc) from exc
        self._done(t0)
        return result

    def _done(self, t0: int) -> None:
        row = self.rows.row
        ns = time.perf_counter_ns() - t0
        row[C_REMOTE_CALLS] += 1
        row[C_REMOTE_NS] += ns
        row[C_LATENCY + _bucket(ns)] += 1
        if "down" in self._outage:
            self._recovered()

    def _contained(self, what: str, exc: Exception) -> RemoteError:
        self._failed(what, exc)
        return RemoteError(f"Redis {what} failed: {exc!r}", what=what,
                           hint="check that Redis is up and reachable; raise timeout= if it is merely slow")

    def _failed(self, what: str, exc: Exception) -> None:
        redis = redis_py()
        row = self.rows.row
        row[C_REMOTE_ERRORS] += 1
        if isinstance(exc, redis.exceptions.TimeoutError):
            row[C_REMOTE_TIMEOUTS] += 1
        outage = (not isinstance(exc, redis.exceptions.ResponseError) or str(exc).startswith(_OUTAGE_REPLIES)
                  or isinstance(exc, _outage_classes(redis)))  # a bug of redis-py's too: better skipped a while
        if outage:
            self._down_until = time.monotonic() + self.retry_interval
            mine = object()
            first = self._outage.setdefault("down", mine) is mine
            if first:
                log.warning("shmcache: Redis %s failed (%r); serving from the local cache, retrying every %g s",
                            what, exc, self.retry_interval)
            return
        kind = type(exc).__name__ + str(exc).split(" ", 1)[0]
        now = time.monotonic()
        if now >= self._logged.get(kind, 0.0):
            self._logged[kind] = now + LOG_EVERY_S
            log.warning("shmcache: Redis %s failed: %r (logged at most every %g s)", what, exc, LOG_EVERY_S)

    def refused(self, what: str, detail: str, *args) -> None:
        """Count something read from Redis that is refused (a value or an invalidation that is foreign, damaged or
        out of range: ``remote_errors``), and log it at most every ``LOG_EVERY_S`` per ``what``."""
        self.rows.row[C_REMOTE_ERRORS] += 1
        now = time.monotonic()
        if now >= self._logged.get(what, 0.0):
            self._logged[what] = now + LOG_EVERY_S
            log.warning("shmcache: " + detail + " (logged at most every %g s)", *args, LOG_EVERY_S)

    def _version(self, v, what: str) -> int:
        """A version a script replied with, or UNKNOWN_VERSION (counted and logged) if it is out of range."""
        try:
            return remote_version(v)
        except ValueError as exc:
            self.refused("version", "Redis %s replied with %s; the local copy is dropped", what, exc)
            return UNKNOWN_VERSION

    def _recovered(self) -> None:
        if self._outage.pop("down", None) is not None:
            log.warning("shmcache: Redis answers again")

    # --------------------------------------------------------------------------- values (steps: see the class)

    def key(self, kb: bytes) -> bytes:
        return self.prefix + kb

    def read(self, kb: bytes):
        """(blob, ms to live or -1) of the key, or None. One GET, and a PTTL only for a value given a time to live
        (a script returning both would copy the value twice more inside Redis: 3x slower for 150 KB)."""
        key = self.prefix + kb
        blob = yield REDIS, "get", lambda c, s: c.get(key)
        if blob is None:
            return None
        if blob[:3] != REMOTE_MAGIC or len(blob) < REMOTE_HEADER.size or not blob[REMOTE_HEADER.size - 1] & F_EXPIRES:
            return blob, -1
        ms = yield REDIS, "get", lambda c, s: c.pttl(key)
        if type(ms) is not int or ms < -2:
            ms = 0  # a reply out of range: the value is returned, and no copy of it kept
        return None if ms == -2 else (blob, ms)  # -2: gone in between

    def write(self, kb: bytes, payload: bytes, ttl_ms: int, mode: str = "set", expected: int = 0):
        """Write and publish; the new version (UNKNOWN_VERSION if out of range), or None if ``mode``'s condition
        failed (add: present; replace: absent; cas: ``expected`` is not the current version). ``ttl_ms``: 0 none, -1
        keep the key's."""
        keys, args = [self.prefix + kb], [self.channel, kb, payload, ttl_ms, mode, expected]
        v = yield REDIS, "write", lambda c, s: s[S_WRITE](keys=keys, args=args)
        return None if v is None else self._version(v, "write")

    def delete(self, kb: bytes, want_value: bool = False):
        """Delete and publish; None if absent, else the new version, or (``want_value``) the new version and the
        value removed. A version out of range is UNKNOWN_VERSION."""
        keys, args = [self.prefix + kb], [self.channel, kb, "1" if want_value else "0"]
        found = yield REDIS, "delete", lambda c, s: s[S_DELETE](keys=keys, args=args)
        if found is None:
            return None
        if want_value:
            if not isinstance(found, list) or len(found) != 2 or not isinstance(found[1], bytes):
                self.refused("reply", "Redis delete replied with %r; the local copy is dropped", found)
                return UNKNOWN_VERSION, b""
            return self._version(found[0], "delete"), found[1]
        return self._version(found, "delete")

    def touch(self, kb: bytes, ttl_ms: int):
        """Set the time to live (0: none) and publish; the new version (UNKNOWN_VERSION if out of range), or None if
        absent."""
        keys, args = [self.prefix + kb], [self.channel, kb, ttl_ms]
        v = yield REDIS, "touch", lambda c, s: s[S_TOUCH](keys=keys, args=args)
        return None if v is None else self._version(v, "touch")

    def clear(self, match_prefix: bytes = b""):
        """Delete every key of the namespace (whose encoded key starts with ``match_prefix``); how many. One
        OP_CLEAR message tells the hosts to drop their copies. Not atomic: a write racing the scan may survive."""
        pattern = _glob_escape(self.prefix + match_prefix) + b"*"
        message = MESSAGE_HEADER.pack(OP_CLEAR, 0.0) + match_prefix

        def run(client, scripts):
            n = 0
            batch = []
            try:
                for key in client.scan_iter(match=pattern, count=CLEAR_BATCH):
                    batch.append(key)
                    if len(batch) == CLEAR_BATCH:
                        n += _unlink(client, batch)
                        batch = []
                if batch:
                    n += _unlink(client, batch)
            finally:  # also when cut short: what was unlinked must not stay cached on the hosts
                client.publish(self.channel, message)
            return n

        async def arun(client, scripts):  # run's twin for an asyncio client
            n = 0
            batch = []
            try:
                async for key in client.scan_iter(match=pattern, count=CLEAR_BATCH):
                    batch.append(key)
                    if len(batch) == CLEAR_BATCH:
                        n += await _aunlink(client, batch)
                        batch = []
                if batch:
                    n += await _aunlink(client, batch)
            finally:
                await client.publish(self.channel, message)
            return n

        return (yield REDIS, "clear", _twins(run, arun))

    def scan(self, match_prefix: bytes = b""):
        """The encoded keys of the namespace (those starting with ``match_prefix``) that a SCAN finds, each once:
        every key present for the whole scan is there; one written or deleted meanwhile may or may not be."""
        pattern = _glob_escape(self.prefix + match_prefix) + b"*"
        n = len(self.prefix)

        def run(client, scripts):
            return list(dict.fromkeys(k[n:] for k in client.scan_iter(match=pattern, count=CLEAR_BATCH)))

        async def arun(client, scripts):
            return list(dict.fromkeys([k[n:] async for k in client.scan_iter(match=pattern, count=CLEAR_BATCH)]))

        return (yield REDIS, "scan", _twins(run, arun))

    def read_many(self, kbs: list):
        """The stored blob of each key (None if absent), in one pipeline: a round trip per node."""
        if not kbs:
            return []
        keys = [self.prefix + kb for kb in kbs]

        def run(client, scripts):  # the pipeline's execute() is awaitable on an asyncio client
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            return pipe.execute()

        return (yield REDIS, "get", run)

    def pttl(self, kb: bytes):
        """The key's time to live in ms: -1 none, -2 absent (Redis's PTTL)."""
        key = self.prefix + kb
        return (yield REDIS, "ttl", lambda c, s: c.pttl(key))

    def exists(self, kb: bytes):
        key = self.prefix + kb
        return bool((yield REDIS, "exists", lambda c, s: c.exists(key)))

    # --------------------------------------------------------------------------- the fleet-wide compute lock

    def try_lock(self, kb: bytes, token: bytes, lease_ms: int):
        key = self.lock_prefix + kb
        return bool((yield REDIS, "lock", lambda c, s: c.set(key, token, nx=True, px=lease_ms)))

    def locked(self, kb: bytes):
        """Whether some host holds ``kb``'s compute lock now."""
        key = self.lock_prefix + kb
        return bool((yield REDIS, "lock", lambda c, s: c.exists(key)))

    def renew(self, kb: bytes, token: bytes, lease_ms: int):
        keys, args = [self.lock_prefix + kb], [token, lease_ms]
        return bool((yield REDIS, "lock", lambda c, s: s[S_RENEW](keys=keys, args=args)))

    def unlock(self, kb: bytes, token: bytes):
        keys, args = [self.lock_prefix + kb], [token]
        yield REDIS, "unlock", lambda c, s: s[S_UNLOCK](keys=keys, args=args)


def _twins(run, arun):
    """A step's call made by ``run(client, scripts)`` on a client, by ``arun`` on an asyncio client."""
    def call(client, scripts):
        return arun(client, scripts) if _is_async(client) else run(client, scripts)
    return call


def _is_async(client) -> bool:
    return type(client).__module__.startswith("redis.asyncio")


def _unlink(client, keys: list) -> int:
    # One command per key: keys of a namespace lie in many cluster slots, and a multi-key UNLINK must not cross
    # slots. A pipeline keeps it to one round trip per node.
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("UNLINK", k)
    return sum(pipe.execute())


async def _aunlink(client, keys: list) -> int:
    # (execute_command: an asyncio cluster pipeline's unlink() is a coroutine of its own, splitting keys by slot)
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("UNLINK", k)
    return sum(await pipe.execute())


def _bucket(ns: int) -> int:
    """The latency histogram's bucket for a call of ``ns`` nanoseconds."""
    if ns < 1000:
        return 0
    return min(LATENCY_BUCKETS - 1, int(math.log2(ns / 1000) * LATENCY_PER_OCTAVE))
