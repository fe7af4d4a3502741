"""``SharedCache.memoize``: functools.lru_cache's interface over ``get_or_compute``, with one cache for every
process. Kept apart from cache.py, which owns the segment; this module only builds keys and counts calls."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, Protocol, TypeVar, cast

from .codec import encode_key_prefix

if TYPE_CHECKING:
    from .cache import SharedCache
    from .kinds import KindView
    from .tier.tiered import TieredCache

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_FAMILY = "shmcache.memoize"  # first item of every memoized key: [_FAMILY, function name, args, kwargs]
_KEY_ITEMS = 4


class MemoInfo(NamedTuple):
    """``functools.lru_cache``'s ``cache_info()``, field for field. ``hits`` and ``misses`` count this process's
    calls: served from the cache (including values another process computed while this one waited), or run here.
    ``maxsize`` is the entry limit of the cache the results share (None for a TieredCache: Redis bounds it by
    memory), ``currsize`` how many results of this function the cache holds now, for every process."""

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class Memoized(Protocol[P, R_co]):
    """What ``memoize`` returns for a function ``(*P) -> R``: a function of the same signature with
    ``functools.lru_cache``'s ``cache_info()``, ``cache_clear()`` and ``cache_parameters()``."""

    cache_name: str  # the key's function name: ``module.qualname``, or ``name=``

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def cache_info(self) -> MemoInfo: ...

    def cache_clear(self) -> int: ...

    def cache_parameters(self) -> dict[str, Any]: ...


def function_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``, the same in every process: the main script is ``__main__`` everywhere,
    although multiprocessing's spawned children import it as ``__mp_main__``."""
    module = getattr(fn, "__module__", None) or "?"
    if module == "__mp_main__":
        module = "__main__"
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


class _Inside(threading.local):
    busy = False  # whether a memoized call of this thread is inside the cache's own code (not in its fn)


_inside = _Inside()


class Family(NamedTuple):
    """What a cache class gives memoize for one function's entries, all sharing an encoded key prefix."""

    count: Callable[[bytes], int]  # live entries whose key starts with the prefix
    delete: Callable[[bytes], int]  # remove them; how many
    maxsize: Callable[[], int]  # the cache's entry limit in force


def memoized(cache: SharedCache | KindView | TieredCache, family: Family, fn: Callable[P, R], name: str,
             timeout: float | None, ttl: float | None = None) -> Memoized[P, R]:
    """The wrapper ``cache.memoize`` returns for ``fn``."""
    prefix = encode_key_prefix([_FAMILY, name], _KEY_ITEMS)
    counts = [0, 0]  # hits, misses of this process
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if _inside.busy:
            # Called by the cache's own code (encoding the key, the lookup): the wrapper replaced something the
            # package calls (``builtins.len = cache.memoize(len)``), so it runs ``fn`` itself, uncached.
            return fn(*args, **kwargs)
        computed = False

        def compute() -> R:
            nonlocal computed
            computed = True
            busy = _inside.busy
            try:
                _inside.busy = False  # fn's own calls of memoized functions are cached as usual
                return fn(*args, **kwargs)
            finally:
                _inside.busy = busy

        # Crash window: saved first and put back in finally, so an exception at any bytecode leaves it as it was.
        busy = _inside.busy
        try:
            _inside.busy = True
            value = cache.get_or_compute([_FAMILY, name, args, kwargs], compute, timeout=timeout, ttl=ttl)
        finally:
            _inside.busy = busy
        with lock:
            counts[computed] += 1
        return value

    def cache_info() -> MemoInfo:
        """This process's hits and misses; the cache's entry limit and the function's entries in it (a pass over
        the cache's entries, under its lock)."""
        with lock:
            hits, misses = counts
        return MemoInfo(hits, misses, family.maxsize(), family.count(prefix))

    def cache_parameters() -> dict[str, Any]:
        """``functools.lru_cache``'s ``cache_parameters()``: ``maxsize`` and ``typed`` (always True: ``f(1)`` and
        ``f(1.0)`` are two entries), with the key's name, the compute timeout and the results' time to live."""
        return {"maxsize": family.maxsize(), "typed": True, "name": name, "timeout": timeout, "ttl": ttl}

    def cache_clear() -> int:
        """Remove this function's entries from the shared cache (for every process); how many there were."""
        with lock:
            counts[0] = counts[1] = 0
        return family.delete(prefix)

    attrs: Any = wrapper  # a function's attributes cannot be declared; the Protocol (Memoized) does
    attrs.cache_info = cache_info
    attrs.cache_clear = cache_clear
    attrs.cache_parameters = cache_parameters
    attrs.cache_name = name
    return cast("Memoized[P, R]", wrapper)  # Why: a function's attributes cannot be declared; the Protocol does
