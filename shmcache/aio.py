"""The asyncio API of SharedCache and KindView: ``aget``, ``aput`` and the rest, awaitable, never blocking the loop.

An operation takes microseconds, so it needs no thread: each ``a*`` method calls its synchronous twin straight through
on the loop's thread when nothing can make that call wait, and only otherwise runs it in a worker thread
(``asyncio.to_thread``) and awaits it there. Two things make a call wait: a busy cache lock (another process's
operation, or one stopped or descheduled while holding it), and a repair pending (the ``dirty`` word: a holder died
mid-update, and the next caller checks the whole segment). Both are read from the segment before the call, without
the lock: a lock taken in the instant between the look and the call is waited for on the loop, as long as its holder
holds it (microseconds, unless that holder is stopped in that very instant). The worker thread's call waits with
the same ``lock_timeout`` and raises the same errors as a synchronous call.

``aget_or_compute`` waits for another caller's computation of the key by polling the claim with ``asyncio.sleep``,
never a blocking lock call, and looks for the stored value as ``get_or_compute`` does; ``fn`` may be a coroutine
function. Cancellation: a ``CancelledError`` at any ``await`` leaves no claim, pin or descriptor behind (the claim is
released in ``finally``, as Ctrl-C does for the synchronous call); a call already running in a worker thread runs to
its end there (a thread cannot be interrupted), so a cancelled ``aput`` may still store its value.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from . import flight
from .durations import seconds
from .oversize import Computation
from .layout.dtypes import H_DIRTY
from .lock import FUTEX_TID_MASK, FUTEX_WORD

R = TypeVar("R")


def _idle(w) -> bool:
    """Whether a call would find the lock free and no repair pending, from the lock page's words ``w`` (read
    without the lock: an answer of the instant)."""
    return not w[FUTEX_WORD] & FUTEX_TID_MASK and not w[H_DIRTY]


class AsyncMethods:
    """The ``a*`` methods, for a class whose ``_space()`` gives its Parts (SharedCache, KindView) and whose
    synchronous methods they call."""

    __slots__ = ()
    _lockw: Any  # the lock page's words (guard.lockw), set by the class

    async def acall(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)``, one of this cache's synchronous calls, awaited as the a-methods are: run on the
        loop's thread when the lock is free and no repair pending, else in a worker thread."""
        if _idle(self._lockw):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aget(self, key: Any, default: Any = None) -> Any:
        """``get``, awaitable."""
        if _idle(self._lockw):  # acall, inlined: a hit's path (a coroutine less costs a fifth of a get)
            return self.get(key, default)  # type: ignore[attr-defined]
        return await asyncio.to_thread(self.get, key, default)  # type: ignore[attr-defined]

    async def aput(self, key: Any, value: Any, ttl: float | None = None, tti: float | None = None) -> bool:
        """``put``, awaitable."""
        if _idle(self._lockw):  # acall, inlined
            return self.put(key, value, ttl, tti=tti)  # type: ignore[attr-defined]
        return await asyncio.to_thread(self.put, key, value, ttl, tti=tti)  # type: ignore[attr-defined]

    async def adelete(self, key: Any) -> bool:
        """``delete``, awaitable."""
        return await self.acall(self.delete, key)  # type: ignore[attr-defined]

    async def aget_many(self, keys: Iterable[Any], default: Any = None) -> list:
        """``get_many``, awaitable."""
        return await self.acall(self.get_many, list(keys), default)  # type: ignore[attr-defined]

    async def aput_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]], ttl: float | None = None) -> None:
        """``put_many``, awaitable."""
        items = dict(items) if isinstance(items, Mapping) else list(items)
        return await self.acall(self.put_many, items, ttl)  # type: ignore[attr-defined]

    async def aadd(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """``add``, awaitable."""
        return await self.acall(self.add, key, value, ttl)  # type: ignore[attr-defined]

    async def aincr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``incr``, awaitable."""
        return await self.acall(self.incr, key, delta, initial)  # type: ignore[attr-defined]

    async def adecr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``decr``, awaitable."""
        return await self.acall(self.decr, key, delta, initial)  # type: ignore[attr-defined]

    async def apop(self, key: Any, *default: Any) -> Any:
        """``pop``, awaitable."""
        return await self.acall(self.pop, key, *default)  # type: ignore[attr-defined]

    def lock_free(self) -> bool:
        """Whether a call made now would find the cache's lock free and no repair pending (an answer of the
        instant, read without the lock)."""
        return _idle(self._lockw)

    async def acontains(self, key: Any) -> bool:
        """``key in cache``, awaitable."""
        return await self.acall(self.__contains__, key)  # type: ignore[attr-defined,operator]

    async def aget_or_compute(self, key: Any, fn: Callable[[], Any], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> Any:
        """``get_or_compute``, awaitable: ``fn`` may be a coroutine function (or return an awaitable), and a wait for
        another caller's computation of the key never blocks the loop. The same stats, timeout and errors."""
        raise NotImplementedError  # SharedCache's (cache.py) and KindView's (kinds.py), over their own words

    def amemoize(self, fn: Callable[..., Awaitable[R]] | None = None, *, name: str | None = None,
                 timeout: float | None = None, ttl: float | None = None, key: Callable[..., Any] | None = None,
                 ignore: str | Iterable[str] = (), stale_ttl: float | None = None) -> Any:
        """``memoize`` for a coroutine function: the wrapper is a coroutine function whose misses go through
        ``aget_or_compute``; the key is the one ``memoize`` would make of the same call, so a sync and an async
        memoization under one ``name`` share their results. ``cache_info`` and ``cache_clear`` as ``memoize``'s."""
        return amemoize(self, fn, name=name, timeout=timeout, ttl=ttl, key=key, ignore=ignore,
                        **({} if stale_ttl is None else {"stale_ttl": stale_ttl}))


def amemoize(cache, fn, **options: Any) -> Any:
    """``cache.amemoize(fn, **options)`` for any cache with ``memoize`` and ``aget_or_compute`` (SharedCache,
    KindView, TieredCache): the decorator, or ``fn`` decorated."""
    seconds("timeout", options["timeout"], none=True, zero=True)

    def decorate(f: Callable[..., Awaitable[R]]) -> Any:
        return _AsyncMemo(cache, cache.memoize(f, **options))

    return decorate if fn is None else decorate(fn)


class _AsyncMemo:
    """``amemoize``'s wrapper: the sync wrapper's key and bookkeeping, its calls awaited."""

    def __init__(self, cache, sync) -> None:
        functools.update_wrapper(self, sync.__wrapped__)
        self._cache, self._sync = cache, sync
        self.cache_name = sync.cache_name
        self.cache_info, self.cache_clear, self.cache_parameters = (sync.cache_info, sync.cache_clear,
                                                                    sync.cache_parameters)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(args, kwargs, False)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        owner = self._sync.owner(obj, objtype)  # bound as the sync wrapper is: to the instance, or the class
        return self if owner is None else functools.partial(self._bound, owner)

    async def _bound(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._call((obj, *args), kwargs, True)

    async def _call(self, args: tuple, kwargs: dict, method: bool) -> Any:
        sync, fn = self._sync, self._sync.__wrapped__
        computed = False

        async def compute() -> Any:
            nonlocal computed
            computed = True
            return await fn(*args, **kwargs)

        value = await self._cache.aget_or_compute(sync.key_of(args, kwargs, method),
                                                  Computation(compute, sync.told_as), timeout=sync.timeout,
                                                  ttl=sync.ttl, **sync.stale)
        sync.count(computed)
        return value

    def __reduce__(self) -> str:
        return self.__qualname__  # type: ignore[attr-defined,no-any-return]


async def take(claim: flight.Claim, fp: int, timeout: float | None,
               describe: Callable[[], Awaitable[Any]],
               stored: Callable[[], bool] | Callable[[], Awaitable[bool]] | None) -> bool:
    """``Claim.take`` with its waits awaited (``asyncio.sleep``, never a blocking call on the loop): the key of
    fingerprint ``fp`` claimed through the description ``describe()`` opens; ``stored()`` (awaited where it is a
    coroutine function's), asked at ``flight.Wait``'s interval, ends the wait (without the claim) when it says the
    value is there. Whether another
    held it first. The claim is recorded as the task's, as ``Claim.take`` records it (flight.py ``_held``): a
    computation asking for its key again, with either API, is refused (ReentrantCallError)."""
    if not claim.opened:
        claim.adopt(await describe())
    claim.refuse_nested(fp)
    waited = False
    wait = flight.Wait(timeout)
    while not claim.lock_nowait(fp):
        waited = True
        if stored is not None and wait.recheck_due():
            there = stored()
            if inspect.isawaitable(there):
                there = await there
            if there:
                return True
        await asyncio.sleep(wait.next_pause())
    return waited
