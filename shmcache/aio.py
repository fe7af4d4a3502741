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
import contextvars
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from . import flight
from .codec import encode_key, fingerprint
from .durations import seconds, ttl_ns
from .errors import ComputeTimeout, ReentrantCallError, TooLargeError
from .guard import H_MUTEX_KIND
from .layout.dtypes import H_COMPUTATIONS, H_DIRTY, H_LOCK_OFF, H_MISSES, H_TAKEOVERS, H_WAITS
from .lock import FUTEX_TID_MASK, MUTEX_KIND_WORD

if TYPE_CHECKING:
    from .cache import SharedCache

R = TypeVar("R")
_MISSING = object()
_FUTEX = H_LOCK_OFF // 8  # the lock page's word holding the mutex's futex (its low 32 bits: the holder's tid)
# The claims the current task (and what it awaits) holds: a coroutine fn that asks for its own key would wait for
# itself. A context variable, not the thread's record: every task of a loop runs on one thread.
_task_claims: contextvars.ContextVar[frozenset] = contextvars.ContextVar("shmcache_task_claims", default=frozenset())


def _idle(w) -> bool:
    """Whether a call would find the lock free and no repair pending, from the lock page's words ``w`` (read
    without the lock: an answer of the instant)."""
    return not w[_FUTEX] & FUTEX_TID_MASK and not w[H_DIRTY] and w[H_MUTEX_KIND] == MUTEX_KIND_WORD


class AsyncMethods:
    """The ``a*`` methods, for a class whose ``_space()`` gives its Parts (SharedCache, KindView) and whose
    synchronous methods they call."""

    __slots__ = ()
    _lockw: Any  # the lock page's words (guard.lockw), set by the class

    async def _call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        if _idle(self._lockw):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aget(self, key: Any, default: Any = None) -> Any:
        """``get``, awaitable."""
        if _idle(self._lockw):  # _call, inlined: a hit's path (a coroutine less costs a fifth of a get)
            return self.get(key, default)  # type: ignore[attr-defined]
        return await asyncio.to_thread(self.get, key, default)  # type: ignore[attr-defined]

    async def aput(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """``put``, awaitable."""
        if _idle(self._lockw):  # _call, inlined
            return self.put(key, value, ttl)  # type: ignore[attr-defined]
        return await asyncio.to_thread(self.put, key, value, ttl)  # type: ignore[attr-defined]

    async def adelete(self, key: Any) -> bool:
        """``delete``, awaitable."""
        return await self._call(self.delete, key)  # type: ignore[attr-defined]

    async def aget_many(self, keys: Iterable[Any], default: Any = None) -> list:
        """``get_many``, awaitable."""
        return await self._call(self.get_many, list(keys), default)  # type: ignore[attr-defined]

    async def aput_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]], ttl: float | None = None) -> None:
        """``put_many``, awaitable."""
        items = dict(items) if isinstance(items, Mapping) else list(items)
        return await self._call(self.put_many, items, ttl)  # type: ignore[attr-defined]

    async def aadd(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """``add``, awaitable."""
        return await self._call(self.add, key, value, ttl)  # type: ignore[attr-defined]

    async def aincr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``incr``, awaitable."""
        return await self._call(self.incr, key, delta, initial)  # type: ignore[attr-defined]

    async def adecr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``decr``, awaitable."""
        return await self._call(self.decr, key, delta, initial)  # type: ignore[attr-defined]

    async def apop(self, key: Any, *default: Any) -> Any:
        """``pop``, awaitable."""
        return await self._call(self.pop, key, *default)  # type: ignore[attr-defined]

    async def acontains(self, key: Any) -> bool:
        """``key in cache``, awaitable."""
        return await self._call(self.__contains__, key)  # type: ignore[attr-defined,operator]

    async def aget_or_compute(self, key: Any, fn: Callable[[], Any], *, timeout: float | None = None,
                              ttl: float | None = None) -> Any:
        """``get_or_compute``, awaitable: ``fn`` may be a coroutine function (or return an awaitable), and a wait for
        another caller's computation of the key never blocks the loop. The same stats, timeout and errors."""
        cache, key = self._compute_target(key)  # type: ignore[attr-defined]
        return await _get_or_compute(cache, key, fn, timeout, ttl)

    def amemoize(self, fn: Callable[..., Awaitable[R]] | None = None, *, name: str | None = None,
                 timeout: float | None = None, ttl: float | None = None, key: Callable[..., Any] | None = None,
                 ignore: str | Iterable[str] = ()) -> Any:
        """``memoize`` for a coroutine function: the wrapper is a coroutine function whose misses go through
        ``aget_or_compute``; the key is the one ``memoize`` would make of the same call, so a sync and an async
        memoization under one ``name`` share their results. ``cache_info`` and ``cache_clear`` as ``memoize``'s."""
        seconds("timeout", timeout, none=True, zero=True)

        def decorate(f: Callable[..., Awaitable[R]]) -> Any:
            sync = self.memoize(f, name=name, timeout=timeout, ttl=ttl, key=key,  # type: ignore[attr-defined]
                                ignore=ignore)
            return _AsyncMemo(self, sync)

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
        if obj is None:
            return self
        return functools.partial(self._bound, obj)

    async def _bound(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._call((obj, *args), kwargs, True)

    async def _call(self, args: tuple, kwargs: dict, method: bool) -> Any:
        sync, fn = self._sync, self._sync.__wrapped__
        computed = False

        async def compute() -> Any:
            nonlocal computed
            computed = True
            return await fn(*args, **kwargs)

        value = await self._cache.aget_or_compute(sync.key_of(args, kwargs, method), compute,
                                                  timeout=sync.timeout, ttl=sync.ttl)
        sync.count(computed)
        return value

    def __reduce__(self) -> str:
        return self.__qualname__  # type: ignore[attr-defined,no-any-return]


async def _get_or_compute(cache: SharedCache, key: Any, fn: Callable[[], Any], timeout: float | None,
                          ttl: float | None) -> Any:
    seconds("timeout", timeout, none=True, zero=True)
    if ttl is not None:
        ttl_ns(ttl)  # refused before anything is looked up, hit or miss
    value = await cache.aget(key, _MISSING)
    if value is not _MISSING:
        return value
    fp = fingerprint(encode_key(key))
    # Why: the claim object exists before anything is taken, so ``finally`` releases whatever an exception at any
    # await (a cancellation) or bytecode left taken (see flight.py).
    claim = flight.Claim()
    token = None
    try:
        waited = await take(cache, claim, fp, timeout, key)
        if claim.held:
            token = _task_claims.set(_task_claims.get() | {claim.tag})
        # Another caller may have stored the value while this one waited, or between its miss and its claim.
        if not claim.held or await cache.acontains(key):
            value = await cache.aget(key, _MISSING)
            if value is not _MISSING:
                # Counted as a hit: the get above counts it, and the first lookup's miss is taken back.
                await cache._call(cache._count, (H_MISSES, -1), (H_WAITS, 1 if waited else 0))
                return value
            if not claim.held:  # gone again: wait for the claim itself this time
                waited = await take(cache, claim, fp, timeout, None) or waited
                token = _task_claims.set(_task_claims.get() | {claim.tag})
        await cache._call(cache._count, (H_COMPUTATIONS, 1), (H_WAITS, 1 if waited else 0),
                          (H_TAKEOVERS, 1 if waited else 0))
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        try:
            await cache.aput(key, value, ttl)
        except TooLargeError:
            pass  # correct to return, impossible to keep; the next caller computes it again
        return value
    finally:
        claim.release()
        if token is not None:
            _task_claims.reset(token)


async def take(cache: SharedCache, claim: flight.Claim, fp: int, timeout: float | None, key: Any) -> bool:
    """``Claim.take`` with its waits awaited (``asyncio.sleep``, never a blocking call on the loop), and the value
    looked for every ``flight._RECHECK_S`` (when ``key`` is not None) only when the lock is free to look."""
    if not claim.opened:
        claim.adopt(await cache._call(cache._guard.run, flight.open_description, cache._seg.fd))
    tag = claim.tag_of(fp)
    if tag in _task_claims.get():
        raise ReentrantCallError("aget_or_compute was called for a key inside the computation of that same key",
                                 what="get_or_compute",
                                 hint="fn must not ask for its own key; it would wait for itself")
    waited = False
    now = time.monotonic()
    deadline = None if timeout is None else now + timeout
    recheck = now + flight.RECHECK_S
    pause = flight.POLL_FIRST_S
    while not claim.lock_untracked(fp):
        waited = True
        now = time.monotonic()
        if key is not None and now >= recheck:
            if _idle(cache._lockw) and key in cache:
                return True
            recheck = now + flight.RECHECK_S
        if deadline is not None:
            left = deadline - now
            if left <= 0:
                raise ComputeTimeout(
                    f"another caller has been computing this key for over {timeout:g} s", what="get_or_compute",
                    hint="raise timeout=, or look at the process computing it (it is alive: a dead one frees the "
                         "key at once)")
            pause = min(pause, left)
        await asyncio.sleep(pause)
        pause = min(pause * 2, flight.POLL_MAX_S)
    return waited
