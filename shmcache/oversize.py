"""Saying that a computed value cannot be kept: ``get_or_compute`` returns a value the cache refused as too large
(``TooLargeError``) and warns (``TooLargeWarning``), once per handle for each family of keys, that every call will
compute it again.

A family is what a reader can act on: the memoized function (``memoize``), the dataset (``CachedDataset``), the
kind of the key, or else the function that called ``get_or_compute``. A caller that knows its family better than a
frame does passes ``fn`` as a ``Computation``, which carries it. Nothing here is shared between processes or takes
the lock: each process says it once, and ``stats().too_large`` is the figure every process sees.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .codec import KindKey
from .errors import TooLargeError, TooLargeWarning

R = TypeVar("R")

MAX_FAMILIES = 1024  # families one handle remembers having told; beyond them it tells no more (a bounded set)
_PACKAGE = __name__.rpartition(".")[0] + "."


class Computation(Generic[R]):
    """``fn`` for ``get_or_compute``, with the family its keys belong to (``"memoized module.f"``) for the warning
    when its value cannot be kept; called, it calls ``fn``."""

    __slots__ = ("fn", "family")

    def __init__(self, fn: Callable[[], R], family: str) -> None:
        self.fn = fn
        self.family = family

    def __call__(self) -> R:
        return self.fn()


def _outside(frame: Any) -> tuple[Any, int]:
    """The first frame from ``frame`` outwards whose code is not this package's (None if none), and how many
    frames it is above ``frame``."""
    depth = 0
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_PACKAGE):
        frame, depth = frame.f_back, depth + 1
    return frame, depth


def _function(frame: Any) -> str:
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"


class Told:
    """The families one handle has warned about, so that each is told once."""

    def __init__(self) -> None:
        self._families: dict[str, object] = {}

    def first(self, family: str) -> bool:
        """Whether ``family`` is told now for the first time (then it is remembered). One ``setdefault``, atomic,
        rather than a lock: an exception from a signal handler can leave no lock held (memo.Tally says why)."""
        if len(self._families) >= MAX_FAMILIES:
            return False
        mine = object()
        return self._families.setdefault(family, mine) is mine

    def refused(self, exc: TooLargeError, cache: str, key: Any, fn: Any, kind_name: Callable[[int], str]) -> None:
        """Warn, if its family was not told yet, that ``fn``'s value for ``key`` was refused (``exc``) by the
        cache named ``cache``; ``kind_name``: a kind number's name. The warning points at the first caller outside
        this package."""
        here = inspect.currentframe()
        caller, depth = _outside(here.f_back if here is not None else None)
        if type(fn) is Computation:
            family = fn.family
        elif type(key) is KindKey:
            family = f"kind {kind_name(key.kind)!r}"
        else:
            family = f"get_or_compute in {_function(caller)}" if caller is not None else "get_or_compute"
        if self.first(family):
            warnings.warn(message(exc, cache, family), TooLargeWarning, stacklevel=depth + 2)


def message(exc: TooLargeError, cache: str, family: str) -> str:
    """What the warning says: the value's size, the limit in force and what to do."""
    return (f"{family}: a value of {exc.size:,} bytes (encoded key + value) can never be kept in cache {cache!r}, "
            f"whose {exc.limit_name} is {exc.limit:,} bytes; it is returned but not stored, so every call computes "
            f"it again ({exc.hint}); said once per family of keys, and stats().too_large counts every refusal")
