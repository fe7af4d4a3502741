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

Invariant: a process uses the handle it opened, on first use, and a forked child opens its own
(``shmcache.contrib.backends``): an app created before gunicorn forks its workers (``--preload``) is safe.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from flask import Flask
from flask_caching.backends.base import BaseCache

from shmcache import SharedCache, TooLargeError
from shmcache.contrib import backends
from shmcache.contrib.backends import OPTIONS, close_handles
from shmcache.durations import MAX_TTL
from shmcache.mapping import delete_prefix

__all__ = ["SharedMemoryCache", "close_handles"]
NAME_CONFIG = "CACHE_SHMCACHE_NAME"


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
        """The value of ``key``, or None."""
        return self._cache.get(self.key_prefix + key)

    def get_many(self, *keys: str) -> list[Any]:
        """The value of each key (None where absent), read under one hold of the lock."""
        prefix = self.key_prefix
        return self._cache.get_many([prefix + k for k in keys])

    def has(self, key: str) -> bool:
        return self.key_prefix + key in self._cache

    def set(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        """Store ``value``; False if it is too large for the cache (then the key's old value goes too).

        :raises pickle.PickleError, TypeError: if ``value`` cannot be pickled; nothing changes.
        """
        return backends.put(self._cache, self.key_prefix + key, value, self._ttl(timeout))

    def set_many(self, mapping: dict[str, Any], timeout: int | dt.timedelta | None = None) -> list[Any]:
        """Store every pair under one hold of the lock; the keys stored (not those too large: their old values go)."""
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
