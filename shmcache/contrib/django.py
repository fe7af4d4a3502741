"""A Django cache backend over SharedCache: one cache in shared memory for every worker process of the host.

    CACHES = {
        "default": {
            "BACKEND": "shmcache.contrib.django.SharedMemoryCache",
            "LOCATION": "mysite",  # the cache's name: every process that names it shares it
            "TIMEOUT": 300,
            "OPTIONS": {"capacity_bytes": 256 * 2**20, "max_entries": 100_000},
        }
    }

``OPTIONS`` are ``SharedCache`` keywords: ``capacity_bytes``, ``max_entries`` and ``mode`` (fixed by whichever
process creates the cache; an attacher that gives them must match), and ``lock_timeout``, ``attach_timeout``,
``trust_owner``, ``group`` and ``policy`` (the eviction policy, at creation). Django's own ``MAX_ENTRIES`` and
``CULL_FREQUENCY`` are for the backends that cull by count; this one evicts as its policy chooses (least recently
used, by default) when ``capacity_bytes`` and ``max_entries`` require, and ignores them.

The cache is created with ``serializer="pickle"`` (Django caches model instances, sessions and responses): every
process that can write the segment can run code in every process that reads it; with the default ``mode`` 0o600
that is the same user only. Keys are Django's (``KEY_PREFIX``, ``VERSION``, ``KEY_FUNCTION``), validated with the
warnings Django gives for keys memcached would refuse.

``get_or_set`` and ``aget_or_set`` with a callable default call it once on the whole host: every worker that misses
the key meanwhile waits for that result (``SharedCache.get_or_compute``), where Django's own backends call it in
each worker.

Invariant: a process uses the handle it opened. The handle is opened on first use and shared by every backend
instance (Django makes one per thread and alias) of the same name and options in the process; a forked child sees
another pid and opens its own (``shmcache.contrib.backends``). ``close()``, which Django calls at the end of every
request, keeps it: opening a cache costs an attach (a mapping, file locks), not a connection from a pool.
"""

from __future__ import annotations

import fnmatch
import inspect
import math
from collections.abc import Iterable, Iterator
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation

from shmcache import SharedCache, TooLargeError
from shmcache.keylock import KeyLock
from shmcache.contrib import backends
from shmcache.contrib.backends import OPTIONS, close_handles
from shmcache.durations import MAX_TTL

__all__ = ["SharedMemoryCache", "close_handles"]
_MISSING = object()


class SharedMemoryCache(BaseCache):
    """Django's cache API over one SharedCache shared by every process of the host (see the module docstring)."""

    def __init__(self, location: str, params: dict) -> None:
        super().__init__(params)
        if not location or not isinstance(location, str):
            raise ImproperlyConfigured("SharedMemoryCache needs LOCATION: the name of the cache (one for every "
                                       "process that shares it)")
        options = {k: v for k, v in params.get("OPTIONS", {}).items() if not k.isupper()}
        unknown = backends.unknown_options(options)
        if unknown:
            raise ImproperlyConfigured(f"SharedMemoryCache OPTIONS {unknown} are unknown; it takes "
                                       f"{sorted(OPTIONS)} (SharedCache's keywords)")
        self._handle = backends.ProcessHandle(location, options)

    @property
    def _cache(self) -> SharedCache:
        """This process's handle, opened (or re-opened after a fork) on first use."""
        return self._handle.get()

    def _ttl(self, timeout) -> float:
        """SharedCache's ttl for a Django timeout: seconds, 0 for never (None), ``EXPIRED`` for 0 or below."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            return 0
        if timeout <= 0:
            return backends.EXPIRED
        return min(float(timeout), MAX_TTL)  # 73 years: longer is forever in all but name

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent (or expired), atomically across processes; whether it did."""
        key = self.make_and_validate_key(key, version=version)
        try:
            return self._cache.add(key, value, self._ttl(timeout))
        except TooLargeError:
            return False

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        return self._cache.get(key, default)

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        """Store ``value``. One too large for the cache is not stored and the key's old value goes (what Django's
        memcached backends do with memcached's item size limit)."""
        key = self.make_and_validate_key(key, version=version)
        backends.put(self._cache, key, value, self._ttl(timeout))

    def get_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> Any:
        """The value of ``key``; if absent, ``default`` stored and returned. A callable ``default`` is called once
        on the whole host: callers in other processes (or threads) that miss the key meanwhile wait for its result
        instead of calling it too (``SharedCache.get_or_compute``); if it raises, the exception is the caller's and
        a waiter calls it instead. A result too large for the cache is returned, not stored.

        :raises ReentrantCallError: (a RuntimeError) if ``default`` itself asks for ``key``: it would wait for itself.
        """
        made = self.make_and_validate_key(key, version=version)
        if callable(default):
            return self._cache.get_or_compute(made, default, ttl=self._ttl(timeout))
        # Nothing to compute: BaseCache's steps (the second get answers what a racing caller may have added first).
        value = self._cache.get(made, _MISSING)
        if value is not _MISSING:
            return value
        self.add(key, default, timeout, version)
        return self.get(key, default, version)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._cache.touch(key, self._ttl(timeout))

    def delete(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._cache.delete(key)

    def has_key(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return key in self._cache

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        """Add ``delta`` to the int stored under ``key``, atomically across processes, keeping its expiry.

        :raises ValueError: if the key is absent (Django's contract). :raises TypeError: if its value is not an int.
        """
        made = self.make_and_validate_key(key, version=version)
        try:
            return self._cache.incr(made, delta, initial=None)
        except KeyError:
            raise ValueError(f"Key '{key}' not found") from None

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict:
        """The values of the keys found, read under one hold of the lock."""
        keys = list(keys)
        made = [self.make_and_validate_key(k, version=version) for k in keys]
        values = self._cache.get_many(made, _MISSING)
        return {k: v for k, v in zip(keys, values) if v is not _MISSING}

    def set_many(self, data: dict, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> list:
        """Store every pair under one hold of the lock; the keys not stored (too large: their old values go)."""
        keys = list(data)
        pairs = [(self.make_and_validate_key(k, version=version), data[k]) for k in keys]
        return [keys[i] for i in backends.put_many(self._cache, pairs, self._ttl(timeout))]

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        for made in [self.make_and_validate_key(k, version=version) for k in keys]:
            self._cache.delete(made)

    def clear(self) -> None:
        """Empty the whole cache, for every process and every key prefix (memcached's ``flush_all``)."""
        self._cache.clear()

    def close(self, **kwargs: Any) -> None:
        """Called by Django at the end of every request: the process's handle stays open (see the module docstring)."""

    # django-redis's extras, over what SharedCache does already.

    def ttl(self, key: Any, version: int | None = None) -> int | None:
        """Seconds ``key`` has left (rounded up, as Redis's TTL), None if it never expires, 0 if it is absent."""
        made = self.make_and_validate_key(key, version=version)
        try:
            left = self._cache.ttl(made)
        except KeyError:
            return 0
        return None if left is None else max(1, math.ceil(left))

    def expire(self, key: Any, timeout: Any, version: int | None = None) -> bool:
        """Give ``key`` a new timeout from now (Django's: None forever, 0 or below expired); whether it was there."""
        return self.touch(key, timeout, version)

    def persist(self, key: Any, version: int | None = None) -> bool:
        """Make ``key`` never expire; whether it was there."""
        return self.touch(key, None, version)

    def iter_keys(self, search: str = "*", version: int | None = None) -> Iterator[str]:
        """The keys (as given to ``set``) of this backend's ``KEY_PREFIX`` and ``version`` matching the glob
        ``search`` (``fnmatch``, case-sensitive), from one snapshot of the cache's keys. Keys are found by the
        made key's prefix, so a custom ``KEY_FUNCTION`` must put the key last, as Django's does."""
        prefix = self.make_key("", version=version)
        for made in self._cache.keys():
            if isinstance(made, str) and made.startswith(prefix):
                key = made[len(prefix):]
                if fnmatch.fnmatchcase(key, search):
                    yield key

    def keys(self, search: str = "*", version: int | None = None) -> list[str]:
        """``iter_keys`` as a list."""
        return list(self.iter_keys(search, version))

    def delete_pattern(self, pattern: str, version: int | None = None) -> int:
        """Delete the keys ``iter_keys(pattern)`` finds; how many went."""
        cache = self._cache
        return sum(cache.delete(self.make_key(k, version=version)) for k in self.keys(pattern, version))

    def lock(self, key: Any, version: int | None = None, blocking: bool = True,
             blocking_timeout: float | None = None) -> KeyLock:
        """A lock named by ``key`` across every process of the host (``with``, ``async with``, ``acquire``/
        ``release``: ``SharedCache.lock``). Unlike django-redis's there is no lease timeout: a dead holder's lock is
        freed at once by the kernel, and a live one's is never taken from it."""
        return self._cache.lock(self.make_and_validate_key(key, version=version), blocking=blocking,
                                timeout=blocking_timeout)

    # Django's async API, overridden natively: each runs its sync twin on the loop's thread when the cache's lock is
    # free (microseconds: no thread hop), else in a worker thread (SharedCache's asyncio methods, aio.py). Without
    # these, BaseCache's defaults would hop to a thread (sync_to_async) on every call.

    async def _acall(self, fn, *args: Any) -> Any:
        return await self._cache.acall(fn, *args)

    async def _astore(self, fn, *args: Any) -> Any:
        """``_acall`` for a call that pickles a value. Pickling an unevaluated QuerySet (or a model instance whose
        deferred field it loads) queries the database, which Django refuses on an event loop's thread
        (SynchronousOnlyOperation) and which BaseCache's own async methods allow, running in a thread: so this does
        too, then. The refused attempt stored nothing (a value is pickled before the cache's lock is taken)."""
        try:
            return await self._acall(fn, *args)
        except SynchronousOnlyOperation:
            return await sync_to_async(fn, thread_sensitive=True)(*args)

    async def aadd(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return await self._astore(self.add, key, value, timeout, version)

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return await self._acall(self.get, key, default, version)

    async def aset(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        return await self._astore(self.set, key, value, timeout, version)

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return await self._acall(self.touch, key, timeout, version)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._acall(self.delete, key, version)

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self._acall(self.has_key, key, version)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._acall(self.incr, key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._acall(self.decr, key, delta, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict:
        return await self._acall(self.get_many, list(keys), version)

    async def aset_many(self, data: dict, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> list:
        return await self._astore(self.set_many, dict(data), timeout, version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        return await self._acall(self.delete_many, list(keys), version)

    async def aget_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        """``get_or_set``, awaitable: a callable ``default`` is called on the loop, as Django calls it (a coroutine
        function's result is awaited), once on the whole host (``SharedCache.aget_or_compute``: a wait for another
        caller's result never blocks the loop)."""
        made = self.make_and_validate_key(key, version=version)
        if not callable(default):
            value = await self.aget(key, self._missing_key, version)
            if value is not self._missing_key:
                return value
            await self.aadd(key, default, timeout, version)
            return await self.aget(key, default, version)
        computed = _MISSING

        async def compute() -> Any:
            nonlocal computed
            value = default()
            if inspect.isawaitable(value):
                value = await value
            computed = value
            return value

        try:
            return await self._cache.aget_or_compute(made, compute, ttl=self._ttl(timeout))
        except SynchronousOnlyOperation:
            if computed is _MISSING:
                raise  # raised by ``default`` itself: the caller's, as Django's own aget_or_set gives it
            # Storing it queried the database on the loop (see ``_astore``): stored from a thread instead. Another
            # caller may have taken over the key meanwhile; what it stored first wins, as add decides.
            await self._astore(self.add, key, computed, timeout, version)
            return await self.aget(key, computed, version)

    async def aclear(self) -> None:
        return await self._acall(self.clear)

    async def aclose(self, **kwargs: Any) -> None:
        self.close(**kwargs)
