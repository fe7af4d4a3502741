"""Dict-style item access shared by every cache-like class (``SharedCache``, ``KindView``, ``TieredCache``):
``c[key]``, ``c[key] = value`` and ``del c[key]``, in terms of the class's own get, put and delete."""

from __future__ import annotations

_MISSING = object()


class ItemAccess:
    """``[]`` raises KeyError on a miss and ``del`` on an absent key, as a dict does."""

    __slots__ = ()

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
