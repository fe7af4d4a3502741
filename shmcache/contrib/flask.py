"""A Flask-Caching backend over SharedCache: one cache in shared memory for every worker process of the host.

    app.config.update(
        CACHE_TYPE="shmcache.contrib.flask.SharedMemoryCache",
        CACHE_SHMCACHE_NAME="mysite",  # the cache's name: every process that names it shares it
        CACHE_DEFAULT_TIMEOUT=300,  # seconds; 0: never expires
        CACHE_KEY_PREFIX="mysite_",  # Flask-Caching's default is "flask_cache_"
        CACHE_OPTIONS={"capacity_bytes": 256 * 2**20, "max_entries": 100_000},
    )
    cache = Cache(app)

``CACHE_OPTIONS`` are ``SharedCache`` keywords: ``capacity_bytes``, ``max_entries`` and ``mode`` (fixed by whichever
process creates the cache; an attacher that gives them must match), and ``lock_timeout``, ``attach_timeout``,
``trust_owner``, ``group``. ``CACHE_THRESHOLD`` is for the backends that cull by count: this one evicts the least
recently used entries as ``capacity_bytes`` and ``max_entries`` require. ``CACHE_ARGS`` are refused (the name is
``CACHE_SHMCACHE_NAME``); ``CACHE_SERIALIZER`` is not used (Flask-Caching warns so).

The API is cachelib's ``BaseCache``, as Flask-Caching calls it. Timeouts are seconds (or a ``timedelta``), ``None``
for ``CACHE_DEFAULT_TIMEOUT``, 0 for never; a negative one stores the value already expired. Every key is stored as
``CACHE_KEY_PREFIX`` + key (as cachelib's RedisCache does), and ``clear()`` removes the keys of this prefix only, or
the whole cache where the prefix is empty. ``add``, ``inc`` and ``dec`` are atomic across processes; ``inc`` and
``dec`` start a missing key at 0 and keep the expiry of an existing one (Redis's ``INCRBY``). A value too large for
the cache is not stored (``set`` returns False) and the key's old value goes. ``get_many`` and ``set_many`` hold the
lock once for the whole batch.

The cache is created with ``serializer="pickle"`` (Flask-Caching stores arbitrary objects: view responses, memoized
results): every process that can write the segment can run code in every process that reads it; with the default
``mode`` 0o600 that is the same user only.

Flask-Caching's decorators look a key up, call the function on a miss and store its result: each worker that misses
calls it. ``shmcache.contrib.flask.Cache``, a ``flask_caching.Cache`` to use in its place (``cache = Cache(app)``),
makes ``cached`` and ``memoize`` call it once on the whole host: the first worker to miss claims the key (a
``SharedCache.lock`` on it) until it has stored the result, and the others wait for that result meanwhile, with no
lock held; if the function raises (or its result is not stored), the claim goes and a waiter calls it instead. A
memoized function's version keys, made by the first call, are added (the first writer's stand) rather than set, so
that workers calling it for the first time at once agree on its key. With another backend it is Flask-Caching's own.

Invariant: a process uses the handle it opened, on first use, and a forked child opens its own
(``shmcache.contrib.backends``): an app created before gunicorn forks its workers (``--preload``) is safe.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flask_caching
from flask import Flask
from flask_caching.backends.base import BaseCache

from shmcache import SharedCache, TooLargeError
from shmcache.contrib import backends
from shmcache.contrib.backends import OPTIONS, close_handles
from shmcache.durations import MAX_TTL
from shmcache.keylock import KeyLock
from shmcache.mapping import delete_prefix

__all__ = ["Cache", "SharedMemoryCache", "close_handles"]
NAME_CONFIG = "CACHE_SHMCACHE_NAME"
_MISSING = object()
_RECHECK_S = 0.05  # a waiter for another worker's result looks for it at this interval


class _Flight:
    """One call of a decorated function: whether its lookup may still claim the key, and the claim it took."""

    __slots__ = ("armed", "key", "lock")

    def __init__(self) -> None:
        self.armed: bool = True
        self.key: str | None = None
        self.lock: KeyLock | None = None

    def release(self) -> None:
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()


# The call of a decorated function under way in this thread (or task), and whether version keys are being made.
_flight: contextvars.ContextVar[_Flight | None] = contextvars.ContextVar("shmcache_flask_flight", default=None)
_versioning: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar("shmcache_flask_versions",
                                                                                 default=None)


class SharedMemoryCache(BaseCache):
    """Flask-Caching's (cachelib's) cache API over one SharedCache shared by every process of the host (see the
    module docstring).

    :param name: the cache's name (``CACHE_SHMCACHE_NAME``); every process that names it shares it.
    :param key_prefix: put before every key (``CACHE_KEY_PREFIX``).
    :param options: SharedCache's keywords (``CACHE_OPTIONS``), as the module docstring lists.
    :raises ValueError: for a missing name or an unknown option. :raises TypeError: for a key prefix not a str.
    """

    def __init__(self, name: str, *, default_timeout: int | dt.timedelta = 300, key_prefix: str | None = None,
                 ignore_delete_many_errors: bool = False, **options: Any) -> None:
        # Why one argument: Flask-Caching before 2.5 takes no more. (Stored as given: this backend reads a timedelta.)
        super().__init__(default_timeout=default_timeout)  # type: ignore[arg-type]
        self.ignore_delete_many_errors = ignore_delete_many_errors  # recorded only: a delete here cannot fail
        if not name or not isinstance(name, str):
            raise ValueError(f"SharedMemoryCache needs {NAME_CONFIG}: the name of the cache (one for every process "
                             f"that shares it), got {name!r}")
        if key_prefix is not None and not isinstance(key_prefix, str):
            raise TypeError(f"CACHE_KEY_PREFIX must be a str, got {type(key_prefix).__name__}")
        unknown = backends.unknown_options(options)
        if unknown:
            raise ValueError(f"SharedMemoryCache CACHE_OPTIONS {unknown} are unknown; it takes {sorted(OPTIONS)} "
                             f"(SharedCache's keywords)")
        self.key_prefix = key_prefix or ""
        self._handle = backends.ProcessHandle(name, options)

    @classmethod
    def factory(cls, app: Flask, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> SharedMemoryCache:
        """Flask-Caching's constructor: ``kwargs`` holds the default timeout, the delete_many rule and
        ``CACHE_OPTIONS``."""
        if args:
            raise ValueError(f"SharedMemoryCache takes no CACHE_ARGS, got {args!r}: name the cache with "
                             f"{NAME_CONFIG} and give SharedCache's keywords in CACHE_OPTIONS")
        kwargs.setdefault("key_prefix", config.get("CACHE_KEY_PREFIX"))
        return cls(config.get(NAME_CONFIG), **kwargs)  # type: ignore[arg-type]  # (no name: __init__ raises)

    @property
    def _cache(self) -> SharedCache:
        """This process's handle, opened (or re-opened after a fork) on first use."""
        return self._handle.get()

    def _ttl(self, timeout: int | dt.timedelta | None) -> float:
        """SharedCache's ttl for a cachelib timeout: seconds, 0 for never, ``EXPIRED`` below 0."""
        if isinstance(timeout, dt.timedelta):  # whole seconds, rounded up, as cachelib 0.17 does (older: no timedelta)
            timeout = math.ceil(timeout.total_seconds())
        seconds = self._normalize_timeout(timeout)  # cachelib's: None is the default
        if seconds == 0:
            return 0
        if seconds < 0:
            return backends.EXPIRED
        return min(float(seconds), MAX_TTL)  # 73 years: longer is forever in all but name

    def get(self, key: str) -> Any:
        """The value of ``key``, or None. The first lookup of a call that ``Cache``'s decorators made claims the key
        on a miss (here, where every Flask-Caching release looks it up: 2.4 calls the backend, 2.5 the extension)."""
        flight = _flight.get()
        if flight is not None and flight.armed:
            flight.armed = False  # the decorator's own lookup; any other the function makes is plain
            value, flight.lock = self._get_or_claim(key)
            flight.key = key
            return None if value is _MISSING else value  # None: Flask-Caching's miss
        return self._cache.get(self.key_prefix + key)

    def get_many(self, *keys: str) -> list[Any]:
        """The value of each key (None where absent), read under one hold of the lock."""
        prefix = self.key_prefix
        return self._cache.get_many([prefix + k for k in keys])

    def has(self, key: str) -> bool:
        return self.key_prefix + key in self._cache

    def set(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        """Store ``value``; False if it is too large for the cache (then the key's old value goes too).

        Storing the result of a decorated call gives up the claim its lookup took.

        :raises pickle.PickleError, TypeError: if ``value`` cannot be pickled; nothing changes.
        """
        try:
            return backends.put(self._cache, self.key_prefix + key, value, self._ttl(timeout))
        finally:
            flight = _flight.get()
            if flight is not None and flight.lock is not None and key == flight.key:
                flight.release()

    def set_many(self, mapping: dict[str, Any], timeout: int | dt.timedelta | None = None) -> list[Any]:
        """Store every pair under one hold of the lock; the keys stored (not those too large: their old values go)."""
        lost = _versioning.get()
        if lost is not None:  # a memoized function's version keys, made by Cache: the first writer's stand
            added = [k for k in mapping if self.add(k, mapping[k], timeout)]
            lost.append(len(added) < len(mapping))
            return added
        keys = list(mapping)
        prefix = self.key_prefix
        failed = set(backends.put_many(self._cache, [(prefix + k, mapping[k]) for k in keys], self._ttl(timeout)))
        return [k for i, k in enumerate(keys) if i not in failed]

    def add(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent (or expired), atomically across processes; whether it did."""
        try:
            return self._cache.add(self.key_prefix + key, value, self._ttl(timeout))
        except TooLargeError:
            return False

    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it was there."""
        return self._cache.delete(self.key_prefix + key)

    def delete_many(self, *keys: str) -> list[Any]:
        """Remove every key; the keys now absent: all of them (a delete here cannot fail)."""
        cache, prefix = self._cache, self.key_prefix
        for k in keys:
            cache.delete(prefix + k)
        return list(keys)

    def clear(self) -> bool:
        """Remove this prefix's keys, for every process (the whole cache when the prefix is empty)."""
        if self.key_prefix:
            delete_prefix(self._cache, self.key_prefix.encode())
        else:
            self._cache.clear()
        return True

    def inc(self, key: str, delta: int = 1) -> int:
        """Add ``delta`` to the int under ``key`` (a missing key starts at 0), atomically across processes, keeping
        its expiry; the new value.

        :raises TypeError: if the stored value or ``delta`` is not an int; nothing changes.
        """
        return self._cache.incr(self.key_prefix + key, delta, initial=0)

    def dec(self, key: str, delta: int = 1) -> int:
        """``inc`` by ``-delta``."""
        return self._cache.decr(self.key_prefix + key, delta, initial=0)

    def _get_or_claim(self, key: str) -> tuple[Any, KeyLock | None]:
        """(value, None) where ``key`` holds a value; else (_MISSING, a held claim on the key: a ``KeyLock``), taken
        once no other caller holds it. A wait for another's claim ends as soon as its value is stored (looked for
        every _RECHECK_S), with no bound otherwise: a dead claimant's claim goes with its process."""
        cache, made = self._cache, self.key_prefix + key
        value = cache.get(made, _MISSING)
        if value is not _MISSING:
            return value, None
        lock = cache.lock(made)  # (a lock never meets the entry of its key)
        while not lock.acquire(timeout=_RECHECK_S):
            value = cache.get(made, _MISSING)
            if value is not _MISSING:
                return value, None
        value = cache.get(made, _MISSING)  # stored between the first look and the claim
        if value is not _MISSING:
            lock.release()
            return value, None
        return _MISSING, lock


def _single_flight(decorate: Callable[[Callable[..., Any]], Any]) -> Callable[[Callable[..., Any]], Any]:
    """``decorate`` (Flask-Caching's ``cached`` or ``memoize`` decorator), each call of what it makes run as one
    flight: the claim its lookup takes on a miss is given up when the call ends, whatever way it ends."""

    def decorator(f: Callable[..., Any]) -> Any:
        inner = decorate(f)

        @functools.wraps(inner)
        def flight(*args: Any, **kwargs: Any) -> Any:
            this = _Flight()
            token = _flight.set(this)
            try:
                return inner(*args, **kwargs)
            finally:
                _flight.reset(token)
                this.release()

        # One namespace for both: what Flask-Caching sets on the function it made (``cache_timeout``, which a user
        # may change, ``uncached``, ``make_cache_key``) is read and written through either.
        flight.__dict__ = inner.__dict__
        return flight

    return decorator


class Cache(flask_caching.Cache):
    """``flask_caching.Cache`` whose ``cached`` and ``memoize`` call the function once on the whole host when the
    backend is SharedMemoryCache (see the module docstring); otherwise Flask-Caching's own."""

    if not TYPE_CHECKING:  # type checkers read flask_caching.Cache's own, whose types these keep
        def cached(self, *args: Any, **kwargs: Any) -> Any:
            return _single_flight(super().cached(*args, **kwargs))

        def memoize(self, *args: Any, **kwargs: Any) -> Any:
            return _single_flight(super().memoize(*args, **kwargs))

    def _memoize_version(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Flask-Caching's; version keys made for a call are added, not set, so that workers making them at once
        agree: a worker whose keys lost reads the winners' instead."""
        changes = args or any(kwargs.get(k) for k in ("reset", "delete", "refresh", "forced_update"))
        if changes or not isinstance(self.cache, SharedMemoryCache):
            return super()._memoize_version(f, *args, **kwargs)
        lost: list[bool] = []
        token = _versioning.set(lost)
        try:
            made = super()._memoize_version(f, **kwargs)
        finally:
            _versioning.reset(token)
        return super()._memoize_version(f, **kwargs) if any(lost) else made
