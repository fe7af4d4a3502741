"""``SharedCache.lock(key)``: a lock named by a key, held across the processes of the host, sync and async.

It is ``get_or_compute``'s claim (flight.py) on a byte of its own: an open-file-description lock taken from the
fingerprint of ``("shmcache.lock", key)``, so a lock never meets the computation of the key it is named by. What
follows from that: the kernel frees it the instant its holder's process dies (no lease to expire, no PID to check), a
forked child never holds its parent's locks, and it is not reentrant (a thread that asks again for a lock it holds
gets ReentrantCallError rather than waiting for itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import aio, flight
from .codec import encode_key, fingerprint
from .errors import ComputeTimeout, ReentrantCallError

if TYPE_CHECKING:
    from .cache import SharedCache

_FAMILY = "shmcache.lock"


class KeyLock:
    """A host-wide lock named by ``key`` in ``cache``: ``with cache.lock(key):``, ``async with cache.lock(key):``, or
    ``acquire``/``release``. ``blocking`` and ``timeout`` (seconds; None: no bound) are the defaults of ``acquire``
    and of the ``with`` blocks."""

    def __init__(self, cache: SharedCache, key: Any, blocking: bool = True, timeout: float | None = None,
                 describe: Callable[[], Any] | None = None) -> None:
        if describe is None:
            raise TypeError("KeyLock is made by SharedCache.lock(key)")
        self.cache, self.key = cache, key
        self._describe = describe  # opens a claim's own description of the segment (flight.open_description)
        self.blocking, self.timeout = blocking, timeout
        self._fp = fingerprint(encode_key([_FAMILY, key]))  # raises TypeError for a key the cache cannot take
        self._claim: flight.Claim | None = None

    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._claim is not None and self._claim.held

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; False if ``blocking`` is False and another holds it, or after ``timeout`` seconds."""
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        claim = self._new()
        try:
            claim.take(self._describe, self._fp, timeout if blocking else 0.0)  # 0: one try, then ComputeTimeout
        except BaseException as exc:  # the claim goes whatever cut the take short (a cancellation, Ctrl-C)
            claim.release()
            if isinstance(exc, ComputeTimeout):
                return False
            if isinstance(exc, ReentrantCallError):
                raise ReentrantCallError(f"this thread (or task) already holds the lock {self.key!r}: it is not "
                                         "reentrant", what="lock", hint="release it before taking it again") from None
            raise
        return True

    async def aacquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """``acquire``, awaitable: a wait for another holder polls with ``asyncio.sleep``."""
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        claim = self._new()
        try:
            await aio.take(claim, self._fp, timeout if blocking else 0.0, self._adescribe, None)
        except BaseException as exc:  # the claim goes whatever cut the take short (a cancellation, Ctrl-C)
            claim.release()
            if isinstance(exc, ComputeTimeout):
                return False
            if isinstance(exc, ReentrantCallError):
                raise ReentrantCallError(f"this thread (or task) already holds the lock {self.key!r}: it is not "
                                         "reentrant", what="lock", hint="release it before taking it again") from None
            raise
        return True

    async def _adescribe(self) -> Any:
        return await self.cache.acall(self._describe)

    def _new(self) -> flight.Claim:
        if self.locked():
            raise RuntimeError(f"this lock object already holds {self.key!r}: make one per holder")
        # Why: the claim exists before anything is taken, so every path out releases whatever was taken.
        self._claim = flight.Claim()
        return self._claim

    def _busy(self) -> TimeoutError:
        after = "" if self.timeout is None else f" after {self.timeout:g} s"
        return TimeoutError(f"lock {self.key!r} is held by another{after}")

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        claim, self._claim = self._claim, None
        if claim is not None:
            claim.release()

    def __enter__(self) -> KeyLock:
        if not self.acquire():
            raise self._busy()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    async def __aenter__(self) -> KeyLock:
        if not await self.aacquire():
            raise self._busy()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<KeyLock {self.key!r} of {self.cache.name!r}{' held' if self.locked() else ''}>"
