"""An aiocache backend over SharedCache: one cache in shared memory for every worker process of the host.

    from shmcache.contrib.aiocache import SharedMemoryCache

    cache = SharedMemoryCache(name="api", capacity_bytes=64 * 2**20, max_entries=100_000, namespace="v1")
    await cache.set("k", {"v": 1}, ttl=60)

    @cached(cache=SharedMemoryCache, name="api", ttl=60)   # aiocache's decorator builds it with these keywords
    async def expensive(x): ...

aiocache's memory backend is a dict in each process (aiocache #429): N workers hold N caches, each unbounded. This one
is bounded by ``capacity_bytes`` and ``max_entries`` and shared, with its eviction policy (``policy=``) and global
stats. Its keywords: ``name`` (the cache's; every process that names it shares it; default ``"aiocache"``) and
``SharedCache``'s own (``capacity_bytes``, ``max_entries``, ``policy``, ``lock_timeout``...), then aiocache's
(``serializer``, ``plugins``, ``namespace``, ``key_builder``, ``timeout``, ``ttl``). Values go through aiocache's
serializer first (default ``NullSerializer``, as the memory backend's: the value itself, which shmcache then encodes
as plain data, msgpack; ``serializer_name="pickle"`` makes the cache a pickle one, or pass aiocache's
``PickleSerializer``, for arbitrary objects: only where every process may run what the cache holds). Each call is
SharedCache's asyncio method (aio.py): on the loop's thread when the lock is free.
"""

from __future__ import annotations

from typing import Any

from aiocache.base import BaseCache  # type: ignore[import-untyped,import-not-found,unused-ignore]
from aiocache.serializers import NullSerializer  # type: ignore[import-untyped,import-not-found,unused-ignore]

from shmcache import SharedCache
from shmcache.contrib import backends
from shmcache.contrib.backends import ProcessHandle

__all__ = ["SharedMemoryCache"]
_MISSING = object()
_CACHE_KEYWORDS = ("capacity_bytes", "max_entries", "create", "mode", "lock_timeout", "default_ttl", "trust_owner",
                   "group", "attach_timeout", "serializer_name", "policy")


class SharedMemoryCache(BaseCache):
    """aiocache's ``BaseCache`` over one SharedCache per process (see the module docstring)."""

    NAME = "shmcache"

    def __init__(self, serializer=None, name: str = "aiocache", **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in _CACHE_KEYWORDS}
        # SharedCache's own serializer= (aiocache's keyword takes the name): msgpack, plain data, unless asked.
        stored_as = options.pop("serializer_name", "msgpack")
        super().__init__(serializer=serializer or NullSerializer(), **kwargs)
        self.cache_name = name
        self._handle = ProcessHandle(name, options, stored_as)

    @property
    def _cache(self) -> SharedCache:
        """This process's handle, opened (or re-opened after a fork) on first use."""
        return self._handle.get()

    @classmethod
    def parse_uri_path(cls, path: str) -> dict:
        return {"name": path.strip("/")} if path.strip("/") else {}

    async def _get(self, key, encoding="utf-8", _conn=None):
        return await self._cache.aget(key)

    async def _gets(self, key, encoding="utf-8", _conn=None):
        return await self._get(key, encoding=encoding, _conn=_conn)

    async def _multi_get(self, keys, encoding="utf-8", _conn=None):
        return await self._cache.aget_many(keys)

    async def _set(self, key, value, ttl=None, _cas_token=None, _conn=None):
        cache = self._cache
        if _cas_token is not None:  # aiocache's optimistic lock: stored only if the value is still the token
            current, version = await cache.acall(cache.get_with_version, key, _MISSING)
            if current != _cas_token or version is None:
                return 0
            return await cache.acall(cache.cas, key, value, version, ttl or 0)
        return await cache.aput(key, value, ttl or 0)

    async def _multi_set(self, pairs, ttl=None, _conn=None):
        await self._cache.aput_many(list(pairs), ttl or 0)
        return True

    async def _add(self, key, value, ttl=None, _conn=None):
        if not await self._cache.aadd(key, value, ttl or 0):
            raise ValueError(f"Key {key} already exists, use .set to update the value")
        return True

    async def _exists(self, key, _conn=None):
        return await self._cache.acontains(key)

    async def _increment(self, key, delta, _conn=None):
        return await self._cache.aincr(key, delta, initial=0)

    async def _expire(self, key, ttl, _conn=None):
        cache = self._cache
        return await cache.acall(cache.touch, key, ttl or 0)

    async def _delete(self, key, _conn=None):
        return int(await self._cache.adelete(key))

    async def _clear(self, namespace=None, _conn=None):
        cache = self._cache
        if namespace:
            doomed = [k for k in await cache.acall(cache.keys) if isinstance(k, str) and k.startswith(namespace)]
            for k in doomed:
                await cache.adelete(k)
        else:
            await cache.acall(cache.clear)
        return True

    async def _raw(self, command, *args, encoding="utf-8", _conn=None, **kwargs):
        """A public method of the SharedCache (``get``, ``keys``, ``setdefault``...), as the memory backend's raw
        calls its dict's."""
        cache = self._cache
        if not isinstance(command, str) or command.startswith("_") or not callable(getattr(cache, command, None)):
            raise ValueError(f"raw: {command!r} is no public method of SharedCache")
        return await cache.acall(getattr(cache, command), *args, **kwargs)

    async def _redlock_release(self, key, value):
        # aiocache's RedLock: drop the key only if it still holds this lock's value, atomically: a cas on the version
        # that value had, to an entry that lapses at once (a delete after it could drop another's newer value).
        cache = self._cache
        current, version = await cache.acall(cache.get_with_version, key, _MISSING)
        if current != value or version is None:
            return 0
        return int(await cache.acall(cache.cas, key, None, version, backends.EXPIRED))

    async def _close(self, *args, _conn=None, **kwargs):
        pass  # the process's handle stays open: opening it costs an attach, not a connection

    def __repr__(self) -> str:
        return f"SharedMemoryCache(name={self.cache_name!r}, namespace={self.namespace!r})"
