"""The mapping API of a ``TieredCache`` over its namespace in Redis: iteration, ``len``, ``popitem``,
``setdefault``, batches and ``ttl``.

Redis holds the namespace, so these ask Redis: iteration and ``len`` are a SCAN of the namespace's keys (order
arbitrary; each key present for the whole scan is seen once, one written or deleted meanwhile may or may not be),
values are read in one pipeline. Like the atomic operations, they need Redis and raise ``RemoteError`` when it is
unavailable, strict or not: a host's copies are not the namespace. The batch get serves what the host has copies of
in one hold of the local lock and fetches the rest key by key, as get does (each fill must be versioned); a batch put
is a put per key (each write is a Redis script that versions the value and publishes its invalidation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..codec import encode_key
from ..keys import decode_key
from ..mapping import MISSING, ItemAccess, pairs_of
from .layout import C_LOCAL_HITS
from .remote import log
from .steps import LOCAL

if TYPE_CHECKING:
    from ..kinds import KindView
    from .remote import Remote


class TierMapping(ItemAccess):
    """The mapping methods of ``TieredCache`` (which provides get, put, add, pop, the local kind and the remote)."""

    __slots__ = ()
    if TYPE_CHECKING:  # what TieredCache provides
        namespace: str
        strict: bool
        _remote: Remote
        _kind: KindView
        _row: Any

        def _check_open(self) -> None: ...
        def _decode(self, kb: bytes, blob: bytes) -> Any: ...
        def _get_remote(self, kb: bytes, default: Any) -> Any: ...
        def _put(self, key: Any, value: Any, ttl: float | None) -> Any: ...
        def _run(self, steps) -> Any: ...
        def add(self, key: Any, value: Any, ttl: float | None = None) -> bool: ...
        def get_with_version(self, key: Any, default: Any = None) -> tuple[Any, int | None]: ...

    def __len__(self) -> int:
        """The namespace's keys in Redis (a SCAN: costs a pass over the namespace)."""
        self._check_open()
        return len(self._run(self._remote.scan()))

    def _keys(self) -> list:
        self._check_open()
        return [k for _, k in self._scanned(self._run(self._remote.scan()))]

    def _scanned(self, kbs: list) -> list:
        """(encoded key, key) of the keys found; one that is no key's encoding (another writer's) is skipped."""
        out = []
        for kb in kbs:
            try:
                out.append((kb, decode_key(kb)))
            except ValueError:
                log.warning("shmcache: Redis key %r of namespace %r is no shmcache key; skipped",
                            self._remote.key(kb), self.namespace)
        return out

    def _items(self) -> list:
        """The pairs of the keys a scan finds, each value read once (one pipeline); no copy is made locally."""
        self._check_open()
        found = self._scanned(self._run(self._remote.scan()))
        blobs = self._run(self._remote.read_many([kb for kb, _ in found]))
        out = []
        for (kb, key), blob in zip(found, blobs):
            decoded = None if blob is None else self._decode(kb, blob)
            if decoded is not None:
                out.append((key, decoded[3]))
        return out

    def popitem(self) -> tuple[Any, Any]:
        """Remove some key of the namespace and return (key, value): Redis keeps no LRU order, so which is
        arbitrary (the first a scan finds). The pop itself is atomic: if another caller took the key first, the
        next is tried. :raises KeyError: if the namespace is empty."""
        for key in self._keys():
            value = self.pop(key, MISSING)
            if value is not MISSING:
                return key, value
        raise KeyError("popitem(): the cache is empty") from None

    def setdefault(self, key: Any, default: Any = None, ttl: float | None = None) -> Any:
        """The value of ``key`` in Redis, or ``default`` stored (``add``) and returned: across the fleet one caller
        stores and every other gets its value. Needs Redis (RemoteError otherwise)."""
        while True:
            if self.add(key, default, ttl):
                return default
            value, version = self.get_with_version(key, MISSING)
            if version is not None:
                return value
            # Deleted between the add and the read: try again.

    def get_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """``[get(k, default) for k in keys]``: the host's copies in one hold of the local lock, the rest fetched
        from Redis key by key as get does."""
        return self._run(self._get_many(list(keys), default))

    def _get_many(self, keys: list, default: Any):
        self._check_open()
        values = yield LOCAL, self._kind.get_many, (keys, MISSING)
        row = self._row
        for i, value in enumerate(values):
            if value is not MISSING:
                row[C_LOCAL_HITS] += 1
                continue
            values[i] = yield from self._get_remote(encode_key(keys[i]), default)
        return values

    def put_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]], ttl: float | None = None) -> None:
        """``put`` of every (key, value) of ``items`` (a mapping, or an iterable of pairs), in order."""
        self._run(self._put_many(items, ttl))

    def _put_many(self, items, ttl):
        for key, value in pairs_of(items):
            yield from self._put(key, value, ttl)

    def ttl(self, key: Any) -> float | None:
        """Seconds ``key`` has left to live in Redis, or None if it never expires. Needs Redis (RemoteError
        otherwise). :raises KeyError: if Redis does not have the key."""
        self._check_open()
        ms = self._run(self._remote.pttl(encode_key(key)))
        if ms == -2:
            raise KeyError(key)
        return None if ms < 0 else max(ms, 1) / 1000

    def _count_prefix(self, prefix: bytes) -> int:
        """Keys of the namespace in Redis whose encoding starts with ``prefix`` (memoize's ``currsize``)."""
        self._check_open()
        return len(self._run(self._remote.scan(prefix)))

    def _maxsize(self):
        return None  # Redis's own maxmemory bounds the namespace, not a count

