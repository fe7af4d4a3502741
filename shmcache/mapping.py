"""The dict interface shared by every cache-like class: ``SharedCache``, ``KindView`` and ``TieredCache`` are
``collections.abc.MutableMapping``s, in terms of each class's own get, put, delete, pop and a few hooks.

``ItemAccess`` is the part every class shares (``[]``, ``del``, ``update``, views, equality); ``LocalMapping`` adds
what a SharedCache and a KindView share, over the locked walks of ``entries.py``: iteration, ``popitem``,
``setdefault``, batches and ``ttl``. Iteration is over a snapshot taken under one hold of the lock, never a live
cursor, and reads without counting a lookup or moving anything in the LRU order.

Why unhashable: a mapping with content equality must not hash by identity (two handles on one cache are equal), and
mutable mappings are unhashable in Python (``dict``); so are these. Registries of handles key them by ``id()``.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, MutableMapping, ValuesView
from typing import Any

from . import entries
from .codec import _MASK63, KIND_PREFIXES, _xxh, encode_key, fingerprint
from .errors import CorruptionError
from .keys import decode_key

# The one "no value" sentinel of the package: an argument not given, or a lookup that found nothing. Compared by
# identity, so every module imports this object rather than making its own.
MISSING = object()


class _Values(ValuesView[Any]):
    """``values()``: over one snapshot of the items, not a lookup per key."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        for _, value in self._mapping._items():
            yield value


class _Items(ItemsView[Any, Any]):
    """``items()``: over one snapshot of the items, not a lookup per key."""

    __slots__ = ()

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._mapping._items())


class ItemAccess(MutableMapping[Any, Any]):
    """``[]`` raises KeyError on a miss (or returns ``__missing__(key)`` where a subclass defines it) and ``del`` on
    an absent key, as a dict does. Subclasses provide get, put, delete, pop, popitem, setdefault, clear, put_many,
    ``__len__``, ``_keys()`` and ``_items()`` (lists: a snapshot)."""

    __slots__ = ()
    __hash__ = None  # see the module docstring

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


def _pairs(items) -> list:
    return list(items.items()) if isinstance(items, Mapping) else [(k, v) for k, v in items]


class LocalMapping(ItemAccess):
    """The mapping API of a SharedCache (its keys of no kind) and of a KindView (its kind's keys). A class provides
    ``_space()``: (the SharedCache, the space of ``entries.py``)."""

    __slots__ = ()

    def _encode_key(self, key) -> bytes:
        cache, space = self._space()
        return KIND_PREFIXES[space] + encode_key(key) if space else encode_key(key)

    def _keys(self) -> list:
        """The live keys, most recently used first, as one snapshot."""
        cache, space = self._space()
        return _decode_keys(cache, cache._locked(entries.snapshot_locked, cache, space, False))

    def _items(self) -> list:
        """The live (key, value) pairs, most recently used first, as one snapshot (no lookup counted)."""
        cache, space = self._space()
        found = cache._locked(entries.snapshot_locked, cache, space, True)
        keys = _decode_keys(cache, [f[0] for f in found])
        return [(k, _decoded(cache, *entries.checked(cache, tag, body, check, e, False)))
                for k, (_, tag, body, check, e) in zip(keys, found)]

    def popitem(self) -> tuple[Any, Any]:
        """Remove the least recently used entry and return it as (key, value), in one hold of the lock (entries an
        open view pins are passed over); counted as a delete, not a lookup. :raises KeyError: if there is none."""
        cache, space = self._space()
        found = cache._locked(entries.popitem_locked, cache, space)
        if found is None:
            raise KeyError("popitem(): the cache is empty") from None
        (key,) = _decode_keys(cache, [found[0]])
        return key, _decoded(cache, found[1], found[2])

    def setdefault(self, key: Any, default: Any = None, ttl: float | None = None) -> Any:
        """The value of ``key`` if it is cached (a hit); else store ``default`` (``ttl`` as in put) and return it (a
        miss). One hold of the lock, so across processes exactly one caller stores and every other gets its value.
        ``default`` is encoded first, so it must be storable even when the key is present."""
        cache, _ = self._space()
        encoded = cache._encode(None, default, self._encode_key(key))
        found = cache._locked(entries.setdefault_locked, cache, _ttl_ns(ttl), *encoded)
        return default if found is None else _decoded(cache, *found)

    def get_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """``[get(k, default) for k in keys]`` in one hold of the lock: each key counted as a lookup and a hit made
        the most recent, as get does. A list in the order asked (keys may be unhashable: lists, dicts, arrays)."""
        cache, space = self._space()
        prefix = KIND_PREFIXES[space] if space else b""
        # Why inline: a batch must cost well under its keys' single gets; encode_key's str case and the
        # fingerprint cost a call each otherwise.
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        try:
            kbs = [prefix + (k.encode() if type(k) is str else encode_key(k)) for k in keys]
        except UnicodeEncodeError:  # a str no UTF-8 can hold: encode_key raises the TypeError
            kbs = [prefix + encode_key(k) for k in keys]
        fps = [_xxh(kb) & _MASK63 for kb in kbs]
        found = cache._locked(entries.get_many_locked, cache, kbs, fps)
        decode = cache._serializer.decode
        out = []
        try:
            for f in found:
                if f is None:
                    out.append(default)
                    continue
                tag, body, check, e = f
                if (_xxh(body, tag) & _MASK63) | 1 != check:
                    cache._checksum_failed(e)
                out.append(decode(tag, body))
        except ValueError as exc:
            cache._undecodable(exc)
        return out

    def put_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]], ttl: float | None = None) -> None:
        """Store every (key, value) of ``items`` (a mapping, or an iterable of pairs) as put does, in one hold of the
        lock; all are encoded first. An entry too large refuses the batch before anything is stored; a write that
        meets a pinned entry (PinnedError) stops the batch there, the entries before it stored."""
        cache, space = self._space()
        prefix = KIND_PREFIXES[space] if space else b""
        encode, pairs = cache._encode, _pairs(items)
        try:
            encoded = [encode(None, v, prefix + (k.encode() if type(k) is str else encode_key(k))) for k, v in pairs]
        except UnicodeEncodeError:  # a str no UTF-8 can hold: encode_key raises the TypeError
            encoded = [encode(None, v, prefix + encode_key(k)) for k, v in pairs]
        if encoded:
            cache._locked(entries.put_many_locked, cache, _ttl_ns(ttl), encoded)

    def ttl(self, key: Any) -> float | None:
        """Seconds ``key`` has left to live, or None if it never expires; neither a lookup nor a move in the LRU
        order. :raises KeyError: if the key is absent (or expired)."""
        cache, _ = self._space()
        kb = self._encode_key(key)
        left = cache._locked(entries.ttl_locked, cache, kb, fingerprint(kb))
        if left is None:
            raise KeyError(key)
        return left / 1e9 if left else None

    def _count_prefix(self, prefix: bytes) -> int:
        """Live entries of this space whose encoded key starts with ``prefix`` (memoize's ``currsize``)."""
        cache, space = self._space()
        return cache._locked(entries.count_prefix_locked, cache, KIND_PREFIXES[space] + prefix if space else prefix)


def _ttl_ns(ttl):
    from .cache import ttl_ns  # cache.py imports this module

    return None if ttl is None else ttl_ns(ttl)


def _decoded(cache, tag: int, body):
    """The value of (tag, body) read from ``cache``; one that does not decode is damage (``_undecodable``)."""
    try:
        return cache._serializer.decode(tag, body)
    except ValueError as exc:
        cache._undecodable(exc)


def _decode_keys(cache, raw: list) -> list:
    try:
        return [decode_key(kb) for kb in raw]
    except ValueError as exc:
        cache._locked(cache._repair_locked, True)
        raise CorruptionError(f"a stored key failed to decode and the cache was repaired: {exc}", what="iterate",
                              hint="the operation can be retried") from None
