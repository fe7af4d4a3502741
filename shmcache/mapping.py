"""The dict interface shared by every cache-like class: ``SharedCache``, ``KindView`` and ``TieredCache`` are
``collections.abc.MutableMapping``s, in terms of each class's own get, put, delete, pop and a few hooks.

``ItemAccess`` is the part every class shares (``[]``, ``del``, ``update``, views, equality); ``LocalMapping`` adds
what a SharedCache and a KindView share, over the locked walks of ``entries.py``: iteration, ``popitem``,
``setdefault``, batches and ``ttl``. Iteration is over a snapshot taken under one hold of the lock, never a live
cursor, and reads without counting a lookup or moving anything in the LRU order. Batches go to the handle's hot path
(``core.path``): the compiled section (``Core.get_many`` / ``put_many``), whose fallback finishes what it hands over
part-way (a damaged segment, a key a view pins) in a second hold of the lock, from where the C stopped.

Why unhashable: a mapping with content equality must not hash by identity (two handles on one cache are equal), and
mutable mappings are unhashable in Python (``dict``); so are these. Registries of handles key them by ``id()``.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, MutableMapping, ValuesView
from functools import partial
from typing import TYPE_CHECKING, Any

from . import entries, memo
from .codec import KIND_PREFIXES, MASK63, body_checksum, encode_key, fingerprint
from .codec import xxh3 as fingerprint_of
from .durations import ttl_ns
from .errors import CorruptionError
from .keys import decode_key

# The one "no value" sentinel of the package: an argument not given, or a lookup that found nothing. Compared by
# identity, so every module imports this object rather than making its own.
MISSING = object()


class _Values(ValuesView[Any]):
    """``values()``: over one snapshot of the items, not a lookup per key."""

    __slots__ = ()
    if TYPE_CHECKING:
        _mapping: ItemAccess  # (MappingView's, undeclared in its stubs)

    def __iter__(self) -> Iterator[Any]:
        for _, value in self._mapping._items():
            yield value


class _Items(ItemsView[Any, Any]):
    """``items()``: over one snapshot of the items, not a lookup per key."""

    __slots__ = ()
    if TYPE_CHECKING:
        _mapping: ItemAccess

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._mapping._items())


class ItemAccess(MutableMapping[Any, Any]):
    """``[]`` raises KeyError on a miss (or returns ``__missing__(key)`` where a subclass defines it) and ``del`` on
    an absent key, as a dict does. Subclasses provide get, put, delete, pop, popitem, setdefault, clear, put_many,
    ``__len__``, ``_keys()`` and ``_items()`` (lists: a snapshot)."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # unhashable, as a dict (see the module docstring)

    if TYPE_CHECKING:  # what subclasses provide
        def put(self, key: Any, value: Any, ttl: float | None = None) -> bool: ...
        def delete(self, key: Any) -> bool: ...
        def put_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
                     ttl: float | None = None) -> None: ...
        def _keys(self) -> list: ...
        def _items(self) -> list: ...

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING:
            missing = getattr(type(self), "__missing__", None)
            if missing is not None:
                return missing(self, key)
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys())

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._keys())

    def values(self) -> ValuesView[Any]:
        return _Values(self)

    def items(self) -> ItemsView[Any, Any]:
        return _Items(self)

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """``dict.update``, stored as one batch (``put_many``): every pair is gathered and encoded first."""
        if isinstance(other, Mapping):
            pairs = list(other.items())
        elif hasattr(other, "keys"):
            pairs = [(k, other[k]) for k in other.keys()]
        else:
            pairs = [(k, v) for k, v in other]
        pairs.extend(kwargs.items())
        if pairs:
            self.put_many(pairs)


def pairs_of(items) -> list:
    """``items`` (a mapping, or an iterable of pairs) as a list of (key, value) pairs."""
    return list(items.items()) if isinstance(items, Mapping) else [(k, v) for k, v in items]


class LocalMapping(ItemAccess):
    """The mapping API of a SharedCache (its keys of no kind) and of a KindView (its kind's keys). A class provides
    ``_space()``: (the cache's ``cache.Parts``, the space of ``entries.py``)."""

    __slots__ = ()

    def _space(self) -> tuple:
        """(the cache's ``cache.Parts``, the space of ``entries.py`` this object's keys are in)."""
        raise NotImplementedError

    def _hot(self) -> tuple:
        """(what the handle's hot calls go to, ``core.path``'s; the ``now()`` to pass it, as SharedCache.get does:
        -1, a Core reads CLOCK_MONOTONIC itself, unless the handle has a clock of its own)."""
        raise NotImplementedError

    def _encode_key(self, key) -> bytes:
        _, space = self._space()
        return KIND_PREFIXES[space] + encode_key(key) if space else encode_key(key)

    def _keys(self) -> list:
        """The live keys in the policy's order (lru: most recently used first), as one snapshot. A damaged entry is
        left out, and repaired."""
        parts, space = self._space()
        found, damaged = parts.guard.run(entries.snapshot_locked, parts.store, space, False)
        if damaged:
            parts.guard.run(parts.store.repair, True)  # drops it (counted in recoveries)
        return _decode_keys(parts, found)

    def _items(self) -> list:
        """The live (key, value) pairs in the policy's order (lru: most recently used first), as one snapshot (no
        lookup counted). A damaged entry (its key, or its value's checksum) is left out, and repaired."""
        parts, space = self._space()
        found, damaged = parts.guard.run(entries.snapshot_locked, parts.store, space, True)
        good = [f for f in found if body_checksum(f[1], f[2]) == f[3]]
        if damaged or len(good) != len(found):
            parts.guard.run(parts.store.repair, True)  # drops them (counted in recoveries)
        keys = _decode_keys(parts, [f[0] for f in good])
        return [(k, _decoded(parts, tag, body)) for k, (_, tag, body, _, _) in zip(keys, good)]

    def popitem(self) -> tuple[Any, Any]:
        """Remove the entry at the back of the policy's order (lru: the least recently used; s3fifo: small's oldest;
        keep: the oldest) and return it as (key, value), in one hold of the lock (entries an open view pins are
        passed over); counted as a delete, not a lookup. A damaged entry met is dropped (the
        guard repairs) and the next one taken. :raises KeyError: if there is none."""
        parts, space = self._space()
        for attempt in range(3):
            try:
                found = parts.guard.run(entries.popitem_locked, parts.store, space)
                break
            except CorruptionError:
                if attempt == 2:  # repaired each time, and damaged again: someone is writing over the segment
                    raise
        if found is None:
            raise KeyError("popitem(): the cache is empty") from None
        (key,) = _decode_keys(parts, [found[0]])
        return key, _decoded(parts, found[1], found[2])

    def setdefault(self, key: Any, default: Any = None, ttl: float | None = None) -> Any:
        """The value of ``key`` if it is cached (a hit); else store ``default`` (``ttl`` as in put) and return it (a
        miss). One hold of the lock, so across processes exactly one caller stores and every other gets its value.
        ``default`` is encoded first, so it must be storable even when the key is present."""
        parts, _ = self._space()
        encoded = parts.store.encode(None, default, self._encode_key(key))
        found = parts.guard.run(entries.setdefault_locked, parts.store, _ttl_ns(ttl), encoded)
        return default if found is None else _decoded(parts, *found)

    def get_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """``[get(k, default) for k in keys]`` in one hold of the lock: each key counted as a lookup and a hit made
        the most recent, as get does. A list in the order asked (keys may be unhashable: lists, dicts, arrays)."""
        parts, space = self._space()
        prefix = KIND_PREFIXES[space] if space else b""
        # Why inline: a batch must cost well under its keys' single gets; encode_key's str case and the
        # fingerprint cost a call each otherwise.
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        try:
            kbs = [prefix + (k.encode() if type(k) is str else encode_key(k)) for k in keys]
        except UnicodeEncodeError:  # a str no UTF-8 can hold: encode_key raises the TypeError
            kbs = [prefix + encode_key(k) for k in keys]
        fps = [fingerprint_of(kb) & MASK63 for kb in kbs]
        hot, now = self._hot()
        return hot.get_many(kbs, fps, now(), default)

    def put_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]], ttl: float | None = None) -> None:
        """Store every (key, value) of ``items`` (a mapping, or an iterable of pairs) as put does, in one hold of the
        lock; all are encoded first. An entry too large refuses the batch before anything is stored; an entry not
        admitted (``policy="keep"``, full; or the room it needs all pinned or held by open views: counted in
        ``stats().not_admitted``) is passed, and the batch goes on."""
        parts, space = self._space()
        prefix = KIND_PREFIXES[space] if space else b""
        encode, pairs = parts.store.encode, pairs_of(items)
        try:
            encoded = [encode(None, v, prefix + (k.encode() if type(k) is str else encode_key(k))) for k, v in pairs]
        except UnicodeEncodeError:  # a str no UTF-8 can hold: encode_key raises the TypeError
            encoded = [encode(None, v, prefix + encode_key(k)) for k, v in pairs]
        if not encoded:
            return
        hot, now = self._hot()
        hot.put_many(encoded, now(), -1 if ttl is None else ttl_ns(ttl))

    def ttl(self, key: Any) -> float | None:
        """Seconds ``key`` has left to live, or None if it never expires; neither a lookup nor a move in the LRU
        order. :raises KeyError: if the key is absent (or expired)."""
        parts, _ = self._space()
        kb = self._encode_key(key)
        left = parts.guard.run(parts.store.time_left, kb, fingerprint(kb))
        if left is None:
            raise KeyError(key)
        return left / 1e9 if left else None


def _stored_prefix(m: LocalMapping, prefix: bytes) -> tuple:
    parts, space = m._space()
    return parts, KIND_PREFIXES[space] + prefix if space else prefix


def count_prefix(m: LocalMapping, prefix: bytes) -> int:
    """Live entries of ``m``'s space whose encoded key starts with ``prefix`` (memoize's ``currsize``)."""
    parts, stored = _stored_prefix(m, prefix)
    return parts.guard.run(entries.count_prefix_locked, parts.store, stored)


def delete_prefix(m: LocalMapping, prefix: bytes) -> int:
    """Remove the entries of ``m``'s space whose encoded key starts with ``prefix`` (memoize's ``cache_clear``);
    how many."""
    parts, stored = _stored_prefix(m, prefix)
    return parts.guard.run(parts.store.delete_prefix, stored)


def max_entries(m: LocalMapping) -> int:
    """The cache's entry limit in force (memoize's ``maxsize``)."""
    parts, _ = m._space()
    return parts.guard.run(parts.store.stats).max_entries


def memo_family(m: LocalMapping) -> memo.Family:
    """What memoize needs of ``m`` (a SharedCache or a KindView) for one function's entries."""
    return memo.Family(partial(count_prefix, m), partial(delete_prefix, m), partial(max_entries, m))


def _ttl_ns(ttl):
    return None if ttl is None else ttl_ns(ttl)


def _decoded(parts, tag: int, body):
    """The value of (tag, body) read from the cache; one that does not decode is damage (Guard.undecodable)."""
    try:
        return parts.store.serializer.decode(tag, body)
    except ValueError as exc:
        parts.guard.undecodable(exc)


def _decode_keys(parts, raw: list) -> list:
    try:
        return [decode_key(kb) for kb in raw]
    except ValueError as exc:
        parts.guard.run(parts.store.repair, True)
        raise CorruptionError(f"a stored key failed to decode and the cache was repaired: {exc}", what="iterate",
                              hint="the operation can be retried") from None
